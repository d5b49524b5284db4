//! The request handler: what answers a request, whichever listener it came from.
//!
//! hickory-server parses requests, limits sizes and truncates; this module
//! turns a request into a lookup ([`crate::lookup`]) or a forwarded question
//! ([`crate::forward`]), and that into a response. [`ClusterDns::respond`] decides the
//! reply, and one send encodes it. UDP datagrams the fast path ([`crate::fast`]) does not
//! take come here through [`ClusterDns::answer_datagram`], which runs them as
//! hickory-server's own UDP loop would. The listeners that call it (`server`, `udp`) come
//! after it: nothing here knows them.

use crate::allow::{AllowList, AllowedPrefixes};
use crate::autopath::{self, Walked};
use crate::forward::{Dnssec, Forwarder, Resolution};
use crate::hosts::HostsSource;
use crate::lookup::{Answer, MAX_UDP_PAYLOAD, Outcome, Zone, lookup};
use crate::metrics::{DnsMetrics, Transport};
use crate::querylog::QueryLog;
use crate::rate::{RateLimit, RateLimitSettings};
use hickory_server::net::NetError;
use hickory_server::net::runtime::{Time, TokioTime};
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::Query;
use hickory_server::proto::op::{
    Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::rdata::CNAME;
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_server::proto::serialize::binary::{
    BinDecodable, BinDecoder, BinEncodable, BinEncoder,
};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder};
use nodus_view::{View, ViewReader};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// What the allow-list is built from besides the view: the prefixes allowed whatever it
/// holds, and this host's addresses.
#[derive(Debug, Default)]
struct AllowInputs {
    prefixes: AllowedPrefixes,
    host: Vec<IpAddr>,
}

/// Answers the cluster zone from the view, and forwards the rest. Clones share everything.
#[derive(Clone)]
pub struct ClusterDns {
    /// Until the view is whole (complete, or restored from disk), a name it lacks may only
    /// be missing from it: misses get SERVFAIL (which resolvers retry) rather than an
    /// NXDOMAIN they would cache, as CoreDNS does before it syncs.
    pub(crate) view: ViewReader,
    /// Who may ask ([`crate::allow`]), rebuilt when Nodes or this host's addresses change.
    pub(crate) allow: Arc<RwLock<Arc<AllowList>>>,
    /// What it is built from besides the view.
    allow_inputs: Arc<Mutex<AllowInputs>>,
    pub(crate) zone: Arc<Zone>,
    forwarder: Option<Arc<Forwarder>>,
    /// Host records, asked before the upstreams ([`crate::hosts`]).
    hosts: Option<Arc<HostsSource>>,
    pub(crate) metrics: Arc<DnsMetrics>,
    /// UDP responses per client prefix ([`crate::rate`]).
    pub(crate) rate: Arc<RateLimit>,
    /// Which queries are logged ([`crate::querylog`]).
    pub(crate) query_log: Arc<QueryLog>,
}

/// What a request gets, decided before anything is encoded or sent.
enum Reply {
    /// A response code without records: a request we do not answer, a miss before the
    /// view is whole, or a name to forward without upstreams.
    Code(ResponseCode),
    /// An authoritative answer from the cluster zone (AA).
    Zone(Answer),
    /// The zone's answer from a view restored from disk that the lists have not confirmed
    /// yet: the same records, without AA, since they may be up to a day old.
    Restored(Answer),
    /// What forwarding got (RA).
    Forwarded(Resolution),
}

impl Reply {
    fn rcode(&self) -> ResponseCode {
        match self {
            Reply::Code(code) => *code,
            Reply::Zone(answer) | Reply::Restored(answer) => answer.rcode,
            Reply::Forwarded(Resolution::Answered(upstream)) => upstream.rcode,
            Reply::Forwarded(Resolution::Failed) => ResponseCode::ServFail,
            Reply::Forwarded(Resolution::Refused) => ResponseCode::Refused,
        }
    }

    /// The answer section, when the reply has records.
    fn answers_mut(&mut self) -> Option<&mut Vec<Record>> {
        match self {
            Reply::Zone(answer) | Reply::Restored(answer) => Some(&mut answer.answers),
            Reply::Forwarded(Resolution::Answered(upstream)) => Some(&mut upstream.answers),
            _ => None,
        }
    }

    /// The answer's addresses in a random order, as kubeadm's Corefile ends in
    /// `loadbalance`: clients that take the first address spread over all of them.
    fn shuffle_addresses(&mut self) {
        if let Some(answers) = self.answers_mut() {
            shuffle_addresses(answers);
        }
    }
}

/// Shuffles the A and AAAA records of `records` among their own positions: a CNAME chain
/// before them stays in front.
fn shuffle_addresses(records: &mut [Record]) {
    let positions: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r.record_type(), RecordType::A | RecordType::AAAA))
        .map(|(i, _)| i)
        .collect();
    // Fisher-Yates over the positions.
    for last in (1..positions.len()).rev() {
        let pick = (crate::forward::random_u64() % (last as u64 + 1)) as usize;
        records.swap(positions[last], positions[pick]);
    }
}

impl ClusterDns {
    pub fn new(view: ViewReader, zone: Zone, forwarder: Option<Arc<Forwarder>>) -> ClusterDns {
        ClusterDns {
            metrics: Arc::new(DnsMetrics::new(forwarder.clone())),
            allow: Arc::new(RwLock::new(Arc::new(AllowList::new(&[])))),
            allow_inputs: Arc::default(),
            view,
            zone: Arc::new(zone),
            forwarder,
            hosts: None,
            rate: Arc::new(RateLimit::new(RateLimitSettings::default())),
            query_log: Arc::default(),
        }
    }

    /// The same, with `settings` for UDP responses instead of the defaults.
    pub fn with_rate_limit(mut self, settings: RateLimitSettings) -> ClusterDns {
        self.rate = Arc::new(RateLimit::new(settings));
        self
    }

    /// The same, logging one query in `every` (none with 0).
    pub fn with_query_log(mut self, every: u32) -> ClusterDns {
        self.query_log = Arc::new(QueryLog::new(every));
        self
    }

    /// The same, answering the names of `hosts` before asking the upstreams.
    pub fn with_hosts(mut self, hosts: HostsSource) -> ClusterDns {
        self.hosts = Some(Arc::new(hosts));
        self
    }

    /// Reads the hosts file again if it changed.
    pub(crate) fn reload_hosts(&self) {
        if let Some(hosts) = &self.hosts {
            hosts.reload();
        }
    }

    pub(crate) fn forwarder(&self) -> Option<&Arc<Forwarder>> {
        self.forwarder.as_ref()
    }

    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    pub fn view(&self) -> &ViewReader {
        &self.view
    }

    /// The clients allowed now.
    pub fn allow_list(&self) -> Arc<AllowList> {
        self.allow
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Rebuilds who may ask from `view` (the handler's own), with `prefixes` or this
    /// host's addresses replaced when given.
    pub(crate) fn rebuild_allow_list(
        &self,
        view: &View,
        prefixes: Option<AllowedPrefixes>,
        host: Option<Vec<IpAddr>>,
    ) {
        let mut inputs = self
            .allow_inputs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(prefixes) = prefixes {
            inputs.prefixes = prefixes;
        }
        if let Some(host) = host {
            inputs.host = host;
        }
        let allow = AllowList::from_view(view, &inputs.prefixes, &inputs.host);
        *self
            .allow
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(allow);
    }

    /// This host's addresses as the allow-list has them.
    pub(crate) fn allowed_host(&self) -> Vec<IpAddr> {
        self.allow_inputs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .host
            .clone()
    }

    /// What a client outside the allow-list gets: REFUSED, or SERVFAIL (which resolvers
    /// retry) while the view, and so the list of Nodes, is not whole.
    pub(crate) fn not_allowed(&self) -> ResponseCode {
        match self.view.is_whole() {
            true => ResponseCode::Refused,
            false => ResponseCode::ServFail,
        }
    }

    /// The full path for one UDP datagram, as hickory-server's UDP loop runs it: no reply to
    /// a packet without a header nor to a response, FORMERR to one that does not parse, and
    /// otherwise the handler's answer within the payload size the requester can take
    /// (truncated, with TC, when it does not fit).
    pub async fn answer_datagram(&self, packet: Vec<u8>, src: SocketAddr) -> Option<Vec<u8>> {
        self.answer_message(packet, src, Protocol::Udp).await
    }

    /// One message of `protocol`, as [`ClusterDns::answer_datagram`] answers a datagram;
    /// over TCP the answer is never truncated (up to 65,535 bytes).
    pub(crate) async fn answer_message(
        &self,
        packet: Vec<u8>,
        src: SocketAddr,
        protocol: Protocol,
    ) -> Option<Vec<u8>> {
        let header = Header::read(&mut BinDecoder::new(&packet)).ok()?;
        let Ok(request) = Request::from_bytes(packet, src, protocol) else {
            let mut metadata = Metadata::response_from_request(&header.metadata);
            metadata.response_code = ResponseCode::FormErr;
            let transport = Transport::of(src, protocol == Protocol::Tcp);
            self.metrics
                .answered(None, transport, ResponseCode::FormErr, Duration::ZERO);
            return encode_header(metadata);
        };
        if request.metadata.message_type == MessageType::Response {
            return None;
        }
        let reply = Capture {
            stream: protocol == Protocol::Tcp,
            ..Capture::default()
        };
        self.handle_request::<_, TokioTime>(&request, reply.clone())
            .await;
        reply.reply.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The reply to `request`: FORMERR without a single question, NOTIMP for other opcodes,
    /// BADVERS for an EDNS version after 0 (RFC 6891), REFUSED for zone transfers (as
    /// CoreDNS), then the zone's answer, or the upstreams' for a name outside it.
    async fn respond(&self, request: &Request) -> Reply {
        // Our own loop probe, come back through an upstream (whichever address it comes
        // from, even before the allow-list knows this host): not forwarded again.
        let loop_probe = |forwarder: &Arc<Forwarder>| {
            request
                .request_info()
                .is_ok_and(|info| forwarder.is_loop_probe(info.query.name()))
        };
        if self.forwarder.as_ref().is_some_and(loop_probe) {
            return Reply::Code(ResponseCode::Refused);
        }
        if !self.allow_list().contains(request.src().ip()) {
            return Reply::Code(self.not_allowed());
        }
        let info = match request.request_info() {
            Err(_) => return Reply::Code(ResponseCode::FormErr),
            Ok(_) if request.metadata.op_code != OpCode::Query => {
                return Reply::Code(ResponseCode::NotImp);
            }
            Ok(_) if request.edns.as_ref().is_some_and(|edns| edns.version() > 0) => {
                return Reply::Code(ResponseCode::BADVERS);
            }
            Ok(info) => info,
        };
        let query = info.query.original();
        let dnssec = Dnssec {
            ok: request
                .edns
                .as_ref()
                .is_some_and(|edns| edns.flags().dnssec_ok),
            checking_disabled: request.metadata.checking_disabled,
        };
        if matches!(query.query_type(), RecordType::AXFR | RecordType::IXFR) {
            return Reply::Code(ResponseCode::Refused);
        }
        // The zone and the host records hold class IN only: another class about the zone
        // is refused, about any other name forwarded.
        let internet = query.query_class() == DNSClass::IN;
        if !internet && self.zone.origin().zone_of(&query.name().to_lowercase()) {
            return Reply::Code(ResponseCode::Refused);
        }
        let client = request.src().ip();
        let reply = self.answer(query, dnssec, client).await;
        let missed =
            matches!(&reply, Reply::Zone(answer) if answer.rcode == ResponseCode::NXDomain);
        let path = self
            .zone
            .autopath()
            .filter(|_| missed)
            .and_then(|node_search| {
                let origin = self.zone.origin();
                autopath::search_after(&self.view.read(), node_search, origin, client, query.name())
            });
        match path {
            Some(path) => self
                .walk(query, path, dnssec, client)
                .await
                .unwrap_or(reply),
            None => reply,
        }
    }

    /// The zone's answer to `query`, else the host records', else the upstreams' (asked
    /// for `client`, who may hold only its share of the questions upstream).
    async fn answer(&self, query: &Query, dnssec: Dnssec, client: IpAddr) -> Reply {
        let internet = query.query_class() == DNSClass::IN;
        let outcome = match internet {
            true => lookup(
                &self.view.read(),
                &self.zone,
                query.name(),
                query.query_type(),
            ),
            false => Outcome::NotOurs,
        };
        match outcome {
            Outcome::Authoritative(answer)
                if !self.view.is_whole()
                    && (answer.rcode == ResponseCode::NXDomain || answer.answers.is_empty()) =>
            {
                Reply::Code(ResponseCode::ServFail)
            }
            Outcome::Authoritative(mut answer) => {
                self.chase_outside(&mut answer, query, dnssec, client).await;
                match self.view.is_complete() {
                    true => Reply::Zone(answer),
                    false => Reply::Restored(answer),
                }
            }
            Outcome::NotOurs => {
                let held = self
                    .hosts
                    .as_ref()
                    .filter(|_| internet)
                    .and_then(|hosts| hosts.current().answer(query.name(), query.query_type()));
                if let Some(answer) = held {
                    return Reply::Zone(answer);
                }
                self.forward(query, dnssec, client).await
            }
        }
    }

    /// Autopath ([`crate::autopath`]): the first name of `path` (the asker's search list
    /// after `query`'s name) that is not NXDOMAIN, behind a CNAME from the asked name. None
    /// when every name is NXDOMAIN or an upstream fails on the way: the asked name's own
    /// answer goes out, and the pod walks its list itself.
    async fn walk(
        &self,
        query: &Query,
        path: Vec<Name>,
        dnssec: Dnssec,
        client: IpAddr,
    ) -> Option<Reply> {
        for target in path {
            let mut asked = Query::query(target.clone(), query.query_type());
            asked.set_query_class(query.query_class());
            let mut reply = self.answer(&asked, dnssec, client).await;
            match reply.rcode() {
                ResponseCode::NXDomain => continue,
                ResponseCode::NoError => {
                    if let Reply::Forwarded(Resolution::Answered(upstream)) = &mut reply {
                        // Our CNAME in front is not something the upstream validated.
                        upstream.authentic_data = false;
                    }
                    // As long as the zone's own records: whether the asked name would
                    // lead elsewhere depends on the cluster.
                    let alias = RData::CNAME(CNAME(target));
                    let cname = Record::from_rdata(query.name().clone(), self.zone.ttl(), alias);
                    if let Some(answers) = reply.answers_mut() {
                        answers.insert(0, cname);
                    }
                    self.metrics.walked(Walked::Answered);
                    return Some(reply);
                }
                _ => {
                    self.metrics.walked(Walked::GaveUp);
                    return None;
                }
            }
        }
        self.metrics.walked(Walked::NxDomain);
        None
    }

    /// A name outside the zone and the host records: the upstreams' answer.
    async fn forward(&self, query: &Query, dnssec: Dnssec, client: IpAddr) -> Reply {
        match &self.forwarder {
            // Without upstreams, refuse, as a non-recursive server does.
            None => Reply::Code(ResponseCode::Refused),
            Some(forwarder) => Reply::Forwarded(forwarder.resolve(query, dnssec, client).await),
        }
    }

    /// An ExternalName's CNAME to a name outside the zone: stub resolvers do not follow
    /// it, so the target's records are fetched upstream and appended (spec rule 14).
    async fn chase_outside(
        &self,
        answer: &mut Answer,
        query: &Query,
        dnssec: Dnssec,
        client: IpAddr,
    ) {
        if query.query_type() == RecordType::CNAME {
            return;
        }
        let (Some(forwarder), Some(last)) = (&self.forwarder, answer.answers.last()) else {
            return;
        };
        let RData::CNAME(target) = &last.data else {
            return;
        };
        if self.zone.origin().zone_of(&target.0.to_lowercase()) {
            return;
        }
        let mut chased = Query::query(target.0.clone(), query.query_type());
        chased.set_query_class(query.query_class());
        // Over the forwarding cap, or without an answer, the CNAME stands alone.
        if let Resolution::Answered(upstream) = forwarder.resolve(&chased, dnssec, client).await {
            answer.rcode = upstream.rcode;
            // A denial of the target carries the target zone's SOA (RFC 2308).
            if upstream.answers.is_empty() {
                answer.authority = upstream.authorities;
            }
            answer.answers.extend(upstream.answers);
        }
    }
}

/// Encodes `reply` as the response to `request` and sends it: the only send.
async fn send<R: ResponseHandler>(
    request: &Request,
    reply: &Reply,
    mut response_handle: R,
) -> Result<ResponseInfo, NetError> {
    // Our OPT advertises what we accept, never more than the client does, and copies the
    // DO bit (RFC 3225).
    let edns = request.edns.as_ref().map(|theirs| {
        let mut ours = Edns::new();
        ours.set_max_payload(theirs.max_payload().clamp(512, MAX_UDP_PAYLOAD));
        ours.set_dnssec_ok(theirs.flags().dnssec_ok);
        ours
    });
    let builder = MessageResponseBuilder::new(&request.queries, edns.as_ref());
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.authoritative = matches!(reply, Reply::Zone(_));
    metadata.recursion_available = matches!(reply, Reply::Forwarded(_));
    // The upstream's AD, to a client that understands it (DO or AD set, RFC 6840 §5.8).
    let understands_ad = request.metadata.authentic_data
        || request
            .edns
            .as_ref()
            .is_some_and(|edns| edns.flags().dnssec_ok);
    metadata.authentic_data = understands_ad
        && matches!(reply, Reply::Forwarded(Resolution::Answered(upstream)) if upstream.authentic_data);
    let none: &[Record] = &[];
    let (answers, authority, additionals) = match reply {
        Reply::Zone(answer) | Reply::Restored(answer) => (
            &answer.answers[..],
            &answer.authority[..],
            &answer.additionals[..],
        ),
        Reply::Forwarded(Resolution::Answered(upstream)) => (
            &upstream.answers[..],
            &upstream.authorities[..],
            &upstream.additionals[..],
        ),
        Reply::Code(_) | Reply::Forwarded(_) => (none, none, none),
    };
    metadata.response_code = reply.rcode();
    response_handle
        .send_response(builder.build(metadata, answers, authority, none, additionals))
        .await
}

#[async_trait::async_trait]
impl RequestHandler for ClusterDns {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        response_handle: R,
    ) -> ResponseInfo {
        let started = Instant::now();
        let mut reply = self.respond(request).await;
        reply.shuffle_addresses();
        let info = send(request, &reply, response_handle)
            .await
            .unwrap_or_else(|error| {
                tracing::debug!(%error, "sending a DNS response");
                let mut failed = Metadata::response_from_request(&request.metadata);
                failed.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header {
                    metadata: failed,
                    counts: HeaderCounts::default(),
                })
            });
        let question = request.request_info().ok().map(|i| i.query);
        let tcp = request.protocol() == Protocol::Tcp;
        let took = started.elapsed();
        if let Some(question) = &question
            && self.query_log.sampled()
        {
            let (name, qtype) = (question.name(), question.query_type());
            QueryLog::log(request.src(), name, qtype, tcp, info.response_code, took);
        }
        let transport = Transport::of(request.src(), tcp);
        self.metrics.answered(
            question.map(|q| q.query_type()),
            transport,
            info.response_code,
            took,
        );
        info
    }
}

fn encode_header(metadata: Metadata) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(12);
    let header = Header {
        metadata,
        counts: HeaderCounts::default(),
    };
    header.emit(&mut BinEncoder::new(&mut bytes)).ok()?;
    Some(bytes)
}

/// Keeps the encoded response for [`ClusterDns::answer_message`], sized as hickory-server
/// sizes a UDP response (the OPT's payload, or 512 bytes without EDNS), or a TCP one.
#[derive(Clone, Default)]
struct Capture {
    reply: Arc<Mutex<Option<Vec<u8>>>>,
    stream: bool,
}

#[async_trait::async_trait]
impl ResponseHandler for Capture {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let max = match self.stream {
            true => u16::MAX,
            false => response.edns().map_or(512, Edns::max_payload),
        };
        let id = response.metadata().id;
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(max);
        let emitted = response.destructive_emit(&mut encoder);
        // A record that did not fit is rolled back to the offset, but its bytes stay in
        // the vector: the message ends at the offset.
        let end = encoder.offset();
        bytes.truncate(end);
        let info = match emitted {
            Ok(info) => info,
            Err(error) => {
                // What hickory-server sends when a response cannot be encoded.
                tracing::debug!(%error, "encoding a DNS response");
                let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
                metadata.response_code = ResponseCode::ServFail;
                bytes = encode_header(metadata).unwrap_or_default();
                ResponseInfo::from(Header {
                    metadata,
                    counts: HeaderCounts::default(),
                })
            }
        };
        *self.reply.lock().unwrap_or_else(|p| p.into_inner()) = Some(bytes);
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_server::proto::rr::Name;
    use hickory_server::proto::rr::rdata::{A, CNAME};
    use std::net::Ipv4Addr;

    #[test]
    fn shuffling_moves_addresses_only() {
        let name = Name::from_ascii("db.example.org.").expect("name");
        let target = Name::from_ascii("db.internal.example.org.").expect("name");
        let mut records = vec![Record::from_rdata(
            name.clone(),
            5,
            RData::CNAME(CNAME(target.clone())),
        )];
        records.extend((1..=8).map(|i| {
            Record::from_rdata(target.clone(), 5, RData::A(A(Ipv4Addr::new(192, 0, 2, i))))
        }));
        let mut orders = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let mut shuffled = records.clone();
            shuffle_addresses(&mut shuffled);
            assert_eq!(shuffled[0], records[0], "the CNAME stays in front");
            let mut sorted = shuffled[1..].to_vec();
            sorted.sort_by_key(ToString::to_string);
            assert_eq!(sorted, records[1..], "the same addresses");
            orders.insert(shuffled.iter().map(ToString::to_string).collect::<Vec<_>>());
        }
        assert!(orders.len() > 1, "twenty shuffles, one order");
    }
}
