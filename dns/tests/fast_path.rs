//! The UDP fast path against the full (hickory) path: for a table of questions, the fast
//! path must either leave the query to the full path or give the same reply, field by field
//! with names compared case-sensitively. Cases that must take the fast path are marked, so
//! a fast path that gave up on everything would fail here. And it must not allocate.

#![allow(
    clippy::too_many_lines,
    reason = "a test or bench reads as one story, top to bottom"
)]
#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

mod fixture;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption};
use hickory_proto::rr::{DNSClass, Name, Record, RecordType};
use nodus_dns::server::{DnsServer, serve};
use nodus_dns::{PodRecords, Zone, fast};
use nodus_view::{Update, wire};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};

/// Counts this thread's allocations, to show the fast path makes none.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: delegates to the system allocator; the counter is a const thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Where the questions come from: loopback, as in [`full_path`].
const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

struct Setup {
    server: DnsServer,
    rt: tokio::runtime::Runtime,
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let view = fixture::view();
    // A ClusterIP service whose SRV records fit in 1232 bytes but not in 512.
    let ports: Vec<_> = (0..20)
        .map(|i| serde_json::json!({"name": format!("port-{i}"), "port": 1000 + i}))
        .collect();
    let wide: Box<wire::Service> = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "wide", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.50", "ports": ports}
    }))
    .expect("service");
    view.write().apply([Update::Service(wide)]);
    let zone = Zone::new("cluster.local", 5, PodRecords::Insecure).expect("zone");
    let server = rt
        .block_on(serve(
            view.reader(),
            zone,
            None,
            &["127.0.0.1:0".parse().expect("addr")],
        ))
        .expect("serve");
    Setup { server, rt }
}

/// How a query is asked.
#[derive(Clone, Copy)]
struct Ask {
    edns: Option<u16>,
    rd: bool,
    cd: bool,
    dnssec_ok: bool,
    subnet: bool,
    cookie: bool,
    op_code: OpCode,
    class: DNSClass,
}

const PLAIN: Ask = Ask {
    edns: None,
    rd: true,
    cd: false,
    dnssec_ok: false,
    subnet: false,
    cookie: false,
    op_code: OpCode::Query,
    class: DNSClass::IN,
};

const EDNS: Ask = Ask {
    edns: Some(4096),
    ..PLAIN
};

fn packet(name: &str, qtype: RecordType, ask: Ask) -> Vec<u8> {
    let mut message = Message::new(0x1234, MessageType::Query, ask.op_code);
    message.metadata.recursion_desired = ask.rd;
    message.metadata.checking_disabled = ask.cd;
    let mut query = Query::query(Name::from_ascii(name).expect("name"), qtype);
    query.set_query_class(ask.class);
    message.add_query(query);
    if let Some(payload) = ask.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(payload);
        edns.set_dnssec_ok(ask.dnssec_ok);
        if ask.subnet {
            edns.options_mut()
                .insert(EdnsOption::Subnet(ClientSubnet::new(
                    "192.0.2.0".parse().expect("ip"),
                    24,
                    0,
                )));
        }
        if ask.cookie {
            edns.options_mut()
                .insert(EdnsOption::Unknown(10, vec![1, 2, 3, 4, 5, 6, 7, 8]));
        }
        message.set_edns(edns);
    }
    message.to_vec().expect("encode")
}

/// A reply as text, every name as sent (case kept).
fn render(bytes: &[u8]) -> Vec<String> {
    let message = Message::from_vec(bytes).expect("a reply that parses");
    let record = |section: &str, r: &Record| {
        format!(
            "{section} {} {} {} {} {}",
            r.name.to_ascii(),
            r.ttl,
            r.dns_class,
            r.record_type(),
            r.data
        )
    };
    let mut lines = vec![format!("{:?}", message.metadata)];
    lines.extend(message.queries.iter().map(|q| {
        format!(
            "question {} {} {}",
            q.name().to_ascii(),
            q.query_type(),
            q.query_class()
        )
    }));
    lines.extend(message.answers.iter().map(|r| record("answer", r)));
    lines.extend(message.authorities.iter().map(|r| record("authority", r)));
    lines.extend(message.additionals.iter().map(|r| record("additional", r)));
    lines.push(format!("{:?}", message.edns));
    lines
}

/// The full path's reply, as the UDP listener sends it.
fn full_path(setup: &Setup, packet: &[u8]) -> Option<Vec<u8>> {
    let src: SocketAddr = "127.0.0.1:40000".parse().expect("addr");
    setup
        .rt
        .block_on(setup.server.handler().answer_datagram(packet.to_vec(), src))
}

fn fast_path(setup: &Setup, packet: &[u8]) -> Option<Vec<u8>> {
    let handler = setup.server.handler();
    let view = handler.view().read();
    let mut out = [0u8; 1232];
    let reply = fast::answer(&view, handler.zone(), CLIENT, packet, &mut out)?;
    Some(out[..reply.len].to_vec())
}

/// Whether the fast path must take a case, or must leave it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Fast,
    Full,
}

fn table() -> Vec<(&'static str, RecordType, Ask, Path)> {
    use Path::{Fast, Full};
    use RecordType::*;
    vec![
        // Hits, with and without EDNS.
        ("web.default.svc.cluster.local", A, PLAIN, Fast),
        ("web.default.svc.cluster.local", A, EDNS, Fast),
        ("web.default.svc.cluster.local", AAAA, EDNS, Fast),
        ("dual.default.svc.cluster.local", ANY, PLAIN, Fast),
        // NODATA: the other family, a type a service lacks, a name without records.
        ("api.shop.svc.cluster.local", AAAA, PLAIN, Fast),
        ("web.default.svc.cluster.local", TXT, EDNS, Fast),
        ("web.default.svc.cluster.local", Unknown(65000), PLAIN, Fast),
        ("default.svc.cluster.local", A, PLAIN, Fast),
        ("svc.cluster.local", AAAA, EDNS, Fast),
        ("_http._tcp.dual.default.svc.cluster.local", A, PLAIN, Fast),
        // NXDOMAIN: what an ndots:5 search path asks.
        ("missing.default.svc.cluster.local", A, PLAIN, Fast),
        ("api-1.example.com.default.svc.cluster.local", A, EDNS, Fast),
        ("api-1.example.com.svc.cluster.local", AAAA, PLAIN, Fast),
        ("api-1.example.com.cluster.local", A, PLAIN, Fast),
        ("web.missing-ns.svc.cluster.local", A, PLAIN, Fast),
        ("x.web.missing-ns.svc.cluster.local", A, PLAIN, Fast),
        ("a.b.c.web.default.svc.cluster.local", A, PLAIN, Fast),
        (
            "_http._udp.dual.default.svc.cluster.local",
            SRV,
            PLAIN,
            Fast,
        ),
        ("_http._tcp.docs.shop.svc.cluster.local", SRV, PLAIN, Fast),
        // SRV: `_port._proto`, the bare name, and `_` for any port or protocol.
        (
            "_http._tcp.dual.default.svc.cluster.local",
            SRV,
            PLAIN,
            Fast,
        ),
        ("_http._tcp.dual.default.svc.cluster.local", SRV, EDNS, Fast),
        ("dual.default.svc.cluster.local", SRV, PLAIN, Fast),
        ("_._tcp.dual.default.svc.cluster.local", SRV, PLAIN, Fast),
        ("_http._.dual.default.svc.cluster.local", SRV, PLAIN, Fast),
        ("_._.web.default.svc.cluster.local", SRV, EDNS, Fast),
        // Case (0x20): kept in the answer, never borrowed by the SOA or SRV targets.
        ("WEB.Default.SVC.cluster.LOCAL", A, PLAIN, Fast),
        ("Missing.default.svc.CLUSTER.local", A, EDNS, Fast),
        (
            "_HTTP._Tcp.Dual.Default.Svc.Cluster.Local",
            SRV,
            PLAIN,
            Fast,
        ),
        ("web.default.svc.Cluster.Local", TXT, PLAIN, Fast),
        // Flags: RD clear, CD set, DO set, and EDNS payloads below, at and over ours.
        (
            "web.default.svc.cluster.local",
            A,
            Ask { rd: false, ..PLAIN },
            Fast,
        ),
        (
            "web.default.svc.cluster.local",
            A,
            Ask { cd: true, ..EDNS },
            Fast,
        ),
        (
            "missing.default.svc.cluster.local",
            A,
            Ask {
                dnssec_ok: true,
                ..EDNS
            },
            Fast,
        ),
        (
            "web.default.svc.cluster.local",
            A,
            Ask {
                edns: Some(256),
                ..EDNS
            },
            Fast,
        ),
        (
            "web.default.svc.cluster.local",
            A,
            Ask {
                edns: Some(1232),
                ..EDNS
            },
            Fast,
        ),
        (
            "web.default.svc.cluster.local",
            A,
            Ask {
                cookie: true,
                ..EDNS
            },
            Fast,
        ),
        // Too large for 512 bytes: hickory truncates it (TC), so the full path answers.
        ("wide.default.svc.cluster.local", SRV, PLAIN, Full),
        ("wide.default.svc.cluster.local", SRV, EDNS, Fast),
        // Headless, endpoints, ExternalName, pods, the apex and the fixed names.
        ("db.shop.svc.cluster.local", A, PLAIN, Full),
        ("many.default.svc.cluster.local", A, PLAIN, Full),
        ("db-0.db.shop.svc.cluster.local", A, PLAIN, Full),
        ("_pg._tcp.db.shop.svc.cluster.local", SRV, PLAIN, Full),
        ("docs.shop.svc.cluster.local", A, PLAIN, Full),
        ("inner.shop.svc.cluster.local", A, EDNS, Full),
        ("10-244-1-10.default.pod.cluster.local", A, PLAIN, Full),
        ("cluster.local", SOA, PLAIN, Full),
        ("cluster.local", NS, PLAIN, Full),
        ("dns-version.cluster.local", TXT, PLAIN, Full),
        ("ns.dns.cluster.local", A, PLAIN, Full),
        // Reverse names and names outside the zone.
        ("20.0.96.10.in-addr.arpa", PTR, PLAIN, Full),
        ("20.0.96.10.in-addr.arpa", A, EDNS, Full),
        ("example.org", A, PLAIN, Full),
        // What the fast path leaves to hickory to judge.
        (
            "web.default.svc.cluster.local",
            A,
            Ask {
                subnet: true,
                ..EDNS
            },
            Full,
        ),
        (
            "web.default.svc.cluster.local",
            A,
            Ask {
                op_code: OpCode::Status,
                ..PLAIN
            },
            Full,
        ),
        (
            "web.default.svc.cluster.local",
            A,
            Ask {
                class: DNSClass::CH,
                ..PLAIN
            },
            Full,
        ),
        ("web.default.svc.cluster.local", AXFR, PLAIN, Full),
    ]
}

#[test]
fn the_fast_path_answers_as_the_full_path_does() {
    let setup = setup();
    for (name, qtype, ask, path) in table() {
        let query = packet(name, qtype, ask);
        let full = full_path(&setup, &query).expect("the full path answers");
        let fast = fast_path(&setup, &query);
        let case = format!("{name} {qtype} ({path:?})");
        match (path, fast) {
            (Path::Fast, Some(fast)) => assert_eq!(render(&fast), render(&full), "{case}"),
            (Path::Full, None) => {}
            (_, fast) => panic!("{case}: fast path took it: {}", fast.is_some()),
        }
    }
}

#[test]
fn oversized_answers_are_truncated_by_the_full_path() {
    let setup = setup();
    let full = full_path(
        &setup,
        &packet("wide.default.svc.cluster.local", RecordType::SRV, PLAIN),
    )
    .expect("reply");
    let message = Message::from_vec(&full).expect("parse");
    assert!(message.metadata.truncation, "{message:?}");
    assert!(full.len() <= 512);
}

#[test]
fn odd_packets_are_left_to_the_full_path() {
    let setup = setup();
    let good = packet("web.default.svc.cluster.local", RecordType::A, EDNS);
    let mut response = good.clone();
    response[2] |= 0x80;
    let mut trailing = good.clone();
    trailing.push(0);
    let mut z_bit = good.clone();
    z_bit[3] |= 0x40;
    let mut pointer = good.clone();
    pointer[12] = 0xC0;
    // The OPT ends the packet (11 bytes, no options); its version is its seventh byte.
    let mut version_1 = good.clone();
    let version_at = good.len() - 5;
    version_1[version_at] = 1;
    for odd in [
        &good[..11],
        &good[..20],
        &good[..good.len() - 1],
        &response[..],
        &trailing[..],
        &z_bit[..],
        &pointer[..],
        &version_1[..],
    ] {
        assert_eq!(fast_path(&setup, odd), None, "{odd:?}");
    }
    // The full path still answers what parses, as hickory-server would.
    assert_eq!(full_path(&setup, &good[..11]), None, "no header, no reply");
    assert_eq!(
        full_path(&setup, &response),
        None,
        "responses are not answered"
    );
    let formerr =
        Message::from_vec(&full_path(&setup, &good[..20]).expect("FORMERR")).expect("parse");
    assert_eq!(
        formerr.metadata.response_code,
        hickory_proto::op::ResponseCode::FormErr
    );
    let badvers =
        Message::from_vec(&full_path(&setup, &version_1).expect("BADVERS")).expect("parse");
    assert_eq!(u16::from(badvers.metadata.response_code), 16, "BADVERS");
}

#[test]
fn the_fast_path_does_not_allocate() {
    let setup = setup();
    let handler = setup.server.handler();
    let queries: Vec<Vec<u8>> = table()
        .into_iter()
        .filter(|(_, _, _, path)| *path == Path::Fast)
        .map(|(name, qtype, ask, _)| packet(name, qtype, ask))
        .collect();
    let view = handler.view().read();
    let mut out = [0u8; 1232];
    let before = ALLOCATIONS.with(Cell::get);
    let mut answered = 0;
    for query in &queries {
        answered +=
            usize::from(fast::answer(&view, handler.zone(), CLIENT, query, &mut out).is_some());
    }
    assert_eq!(ALLOCATIONS.with(Cell::get) - before, 0);
    assert_eq!(answered, queries.len());
}
