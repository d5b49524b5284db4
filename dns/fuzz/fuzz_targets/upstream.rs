//! Fuzzes the forwarder's reading of what an upstream sends back: any bytes as the reply to
//! our question (its first two bytes are the id, so that the check on the id passes as
//! often as it does for a real reply). Nothing may panic; an answer that is taken gets a
//! cache TTL and is encoded again into a response, as the handler sends it to the client.

#![no_main]

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use libfuzzer_sys::fuzz_target;
use nodus_dns::forward::{Reply, cache_ttl, read_answer};
use std::sync::LazyLock;

static QUESTION: LazyLock<Query> = LazyLock::new(|| {
    Query::query(
        Name::from_ascii("www.example.org.").expect("static name"),
        RecordType::A,
    )
});

fuzz_target!(|data: &[u8]| {
    let Some(id) = data.get(..2).map(|id| u16::from_be_bytes([id[0], id[1]])) else {
        return;
    };
    let Ok(Reply::Answer(answer)) = read_answer(data, id, &QUESTION) else {
        return;
    };
    let _ = cache_ttl(&answer, 30, 30);
    let mut response = Message::new(id, MessageType::Response, OpCode::Query);
    response.metadata.response_code = answer.rcode;
    response.add_query(QUESTION.clone());
    response.add_answers(answer.answers);
    response.add_authorities(answer.authorities);
    response.add_additionals(answer.additionals);
    let _ = response.to_vec();
});
