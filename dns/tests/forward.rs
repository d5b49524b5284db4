//! Forwarding through nodus to local upstream test servers: answers, the cache (visible in
//! the upstreams' query counts), negative caching, truncation retried over TCP, dead
//! upstreams skipped then asked last, a lost datagram asked again, SERVFAIL when none
//! answers (remembered a moment), serve-stale, prefetch, DNSSEC bits relayed, stub domains,
//! the policies, loops, and the zone never forwarded.

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, NULL, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use nodus_dns::forward::{ForwardConfig, Forwarder, Policy};
use nodus_dns::handler::ClusterDns;
use nodus_dns::hosts::HostsSource;
use nodus_dns::listen;
use nodus_dns::server::{DnsServer, serve_planned};
use nodus_dns::{PodRecords, Zone};
use nodus_view::{View, ViewWriter};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Queries the upstream saw, by "name transport".
type Seen = Arc<Mutex<HashMap<String, usize>>>;

fn answer(query: &Message, tcp: bool) -> Message {
    let mut reply = Message::new(
        query.metadata.id,
        MessageType::Response,
        query.metadata.op_code,
    );
    reply.metadata.recursion_available = true;
    let Some(question) = query.queries.first() else {
        reply.metadata.response_code = ResponseCode::FormErr;
        return reply;
    };
    reply.add_query(question.clone());
    let name = question.name().to_lowercase().to_ascii();
    let record = |ip: Ipv4Addr| Record::from_rdata(question.name().clone(), 60, RData::A(A(ip)));
    let dnssec_ok = query
        .edns
        .as_ref()
        .is_some_and(|edns| edns.flags().dnssec_ok);
    match name.as_str() {
        // As a validating resolver answers a signed name: the signature to DO, and AD.
        "www.example.org." | "signed.example.org." => {
            reply.add_answer(record(Ipv4Addr::new(192, 0, 2, 1)));
            if name.starts_with("signed") {
                reply.metadata.authentic_data = query.metadata.authentic_data || dnssec_ok;
                if dnssec_ok {
                    reply.add_answer(Record::from_rdata(
                        question.name().clone(),
                        60,
                        RData::Unknown {
                            code: RecordType::RRSIG,
                            rdata: NULL::with(rrsig()),
                        },
                    ));
                }
            }
        }
        // A name whose signatures do not validate: SERVFAIL unless the client checks.
        "bogus.example.org." if !query.metadata.checking_disabled => {
            reply.metadata.response_code = ResponseCode::ServFail;
        }
        "bogus.example.org." => {
            reply.add_answer(record(Ipv4Addr::new(192, 0, 2, 66)));
        }
        "big.example.org." if !tcp => reply.metadata.truncation = true,
        "big.example.org." => {
            for i in 1..=40 {
                reply.add_answer(record(Ipv4Addr::new(192, 0, 2, i)));
            }
        }
        _ => {
            reply.metadata.response_code = ResponseCode::NXDomain;
            let origin = Name::from_ascii("example.org.").expect("name");
            reply.add_authority(Record::from_rdata(
                origin.clone(),
                300,
                RData::SOA(SOA::new(origin.clone(), origin, 1, 7200, 1800, 86400, 30)),
            ));
        }
    }
    reply
}

/// The wire form of an RRSIG over an A record, signed by example.org. (its signature is
/// not checked by anyone here).
fn rrsig() -> Vec<u8> {
    let mut rdata = vec![0, 1, 13, 3, 0, 0, 0, 60];
    rdata.extend_from_slice(&0x7000_0000u32.to_be_bytes());
    rdata.extend_from_slice(&0x6000_0000u32.to_be_bytes());
    rdata.extend_from_slice(&12345u16.to_be_bytes());
    rdata.extend_from_slice(b"\x07example\x03org\x00");
    rdata.extend_from_slice(&[0xab; 64]);
    rdata
}

/// How a test upstream behaves besides answering.
#[derive(Clone, Default)]
struct Behaviour {
    /// While set, it reads questions and answers none.
    mute: Arc<AtomicBool>,
}

/// A tiny authoritative server for example.org over UDP and TCP, counting what it is asked.
/// The first UDP question for a `lossy.` name is lost.
async fn upstream(seen: Seen, behaviour: Behaviour) -> SocketAddr {
    // The kernel picks a free UDP port; another test may hold the same port for TCP.
    let (udp, tcp) = loop {
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = udp.local_addr().expect("addr");
        match tokio::net::TcpListener::bind(addr).await {
            Ok(tcp) => break (udp, tcp),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => panic!("bind tcp {addr}: {e}"),
        }
    };
    let addr = udp.local_addr().expect("addr");
    // nodus's loop probe at start (HINFO of a random name) is not a forwarded question.
    let count = move |seen: &Seen, query: &Message, transport: &str| {
        if let Some(q) = query
            .queries
            .first()
            .filter(|q| q.query_type() != RecordType::HINFO)
        {
            *seen
                .lock()
                .expect("lock")
                .entry(format!("{} {transport}", q.name().to_lowercase()))
                .or_default() += 1;
        }
    };
    let udp_seen = seen.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            count(&udp_seen, &query, "udp");
            if behaviour.mute.load(Ordering::Relaxed) {
                continue;
            }
            let lossy = query.queries.first().is_some_and(|q| {
                let name = q.name().to_lowercase().to_ascii();
                name.starts_with("lossy.")
                    && udp_seen.lock().expect("lock")[&format!("{name} udp")] == 1
            });
            if lossy {
                continue;
            }
            if let Ok(bytes) = answer(&query, false).to_vec() {
                let _ = udp.send_to(&bytes, from).await;
            }
        }
    });
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = tcp.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut len = [0u8; 2];
                if stream.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
                if stream.read_exact(&mut buf).await.is_err() {
                    return;
                }
                let Ok(query) = Message::from_vec(&buf) else {
                    return;
                };
                count(&seen, &query, "tcp");
                if let Ok(bytes) = answer(&query, true).to_vec() {
                    let _ = stream.write_all(&(bytes.len() as u16).to_be_bytes()).await;
                    let _ = stream.write_all(&bytes).await;
                }
            });
        }
    });
    addr
}

struct Setup {
    dns: SocketAddr,
    /// What each live upstream was asked, in order.
    seen: Vec<Seen>,
    behaviour: Behaviour,
    forwarder: Arc<Forwarder>,
    _server: DnsServer,
    _rt: tokio::runtime::Runtime,
}

/// nodus DNS with `dead` silent upstreams before the working one (or only dead ones),
/// over a view with one ExternalName service pointing outside the zone.
fn setup(dead: usize, with_live: bool) -> Setup {
    setup_with(silent_upstreams(dead), with_live, true, 100)
}

/// Upstreams bound but never read: queries to them time out.
fn silent_upstreams(count: usize) -> Vec<SocketAddr> {
    (0..count)
        .map(|_| {
            let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
            let addr = silent.local_addr().expect("addr");
            std::mem::forget(silent);
            addr
        })
        .collect()
}

/// nodus DNS with the `leading` upstreams before the working one (or only those).
fn setup_with(
    leading: Vec<SocketAddr>,
    with_live: bool,
    synced: bool,
    max_concurrent: usize,
) -> Setup {
    start(synced, usize::from(with_live), |config, live| {
        config.upstreams = leading;
        config.upstreams.extend(live);
        config.max_concurrent = max_concurrent;
    })
}

/// nodus DNS forwarding as `tune` sets it up, given the addresses of `live` working
/// upstreams (sequential, a 300 ms timeout, a 10 s denial cap unless tuned).
fn start(
    synced: bool,
    live: usize,
    tune: impl FnOnce(&mut ForwardConfig, Vec<SocketAddr>),
) -> Setup {
    start_with_hosts(synced, live, tune, None)
}

/// As [`start`], answering `hosts` before the upstreams.
fn start_with_hosts(
    synced: bool,
    live: usize,
    tune: impl FnOnce(&mut ForwardConfig, Vec<SocketAddr>),
    hosts: Option<HostsSource>,
) -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let seen: Vec<Seen> = (0..live).map(|_| Seen::default()).collect();
    let behaviour = Behaviour::default();
    let (server, forwarder) = rt.block_on(async {
        let mut addrs = Vec::new();
        for seen in &seen {
            addrs.push(upstream(seen.clone(), behaviour.clone()).await);
        }
        let mut config = ForwardConfig {
            policy: Policy::Sequential,
            timeout: Duration::from_millis(300),
            cache_entries: 100,
            max_denial_ttl: 10,
            ..ForwardConfig::default()
        };
        tune(&mut config, addrs);
        let forwarder = Arc::new(Forwarder::new(config));
        let zone = Zone::new("cluster.local", 5, PodRecords::Disabled).expect("zone");
        let mut view = View::new("node-1");
        view.apply([nodus_view::Update::Service(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db", "namespace": "default"},
                "spec": {"type": "ExternalName", "externalName": "www.example.org"}
            }))
            .expect("service"),
        )]);
        let view = ViewWriter::new(view);
        if synced {
            view.mark_complete();
        }
        let mut handler = ClusterDns::new(view.reader(), zone, Some(forwarder.clone()));
        if let Some(hosts) = hosts {
            handler = handler.with_hosts(hosts);
        }
        let listen = listen::plan(&["127.0.0.1:0".parse().expect("addr")]);
        let server = serve_planned(handler, &listen, 1, Default::default(), Default::default())
            .await
            .expect("serve");
        (server, forwarder)
    });
    Setup {
        dns: server.addrs[0],
        seen,
        behaviour,
        forwarder,
        _server: server,
        _rt: rt,
    }
}

/// What `dig` printed, as the tests search it.
fn dig(dns: SocketAddr, args: &[&str]) -> String {
    nodus_testbed::dig::dig(dns, args).raw
}

/// How often the first live upstream was asked `key` ("name transport").
fn seen(setup: &Setup, key: &str) -> usize {
    seen_by(&setup.seen[0], key)
}

fn seen_by(seen: &Seen, key: &str) -> usize {
    seen.lock().expect("lock").get(key).copied().unwrap_or(0)
}

#[test]
fn answers_are_forwarded_then_served_from_the_cache() {
    let s = setup(0, true);
    let first = dig(s.dns, &["www.example.org", "A"]);
    assert!(
        first.contains("status: NOERROR") && first.contains("192.0.2.1"),
        "{first}"
    );
    assert!(first.contains(" ra"), "recursion available: {first}");
    assert!(
        !first.contains(" aa"),
        "not authoritative for example.org: {first}"
    );
    // The upstream says 60 s; the cache keeps it 30 s and says so.
    assert!(
        first.contains("www.example.org.\t30\tIN\tA\t192.0.2.1"),
        "{first}"
    );
    let second = dig(s.dns, &["www.example.org", "A"]);
    assert!(second.contains("192.0.2.1"), "{second}");
    assert_eq!(
        seen(&s, "www.example.org. udp"),
        1,
        "the second answer came from the cache"
    );
    assert_eq!(s.forwarder.stats.cache_hits.load(Ordering::Relaxed), 1);
}

#[test]
fn negative_answers_are_cached_too() {
    let s = setup(0, true);
    for _ in 0..3 {
        let reply = dig(s.dns, &["nothing.example.org", "A"]);
        assert!(reply.contains("status: NXDOMAIN"), "{reply}");
        // The SOA says 300 s (minimum 30); the denial cap is 10 s in this setup.
        let soa_ttl: u32 = reply
            .lines()
            .find(|line| line.contains("\tSOA\t"))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|ttl| ttl.parse().ok())
            .expect("the SOA in the authority section");
        assert!(soa_ttl <= 10, "{reply}");
    }
    assert_eq!(seen(&s, "nothing.example.org. udp"), 1);
}

#[test]
fn a_truncated_upstream_answer_is_fetched_again_over_tcp() {
    let s = setup(0, true);
    let reply = dig(s.dns, &["+tcp", "big.example.org", "A"]);
    assert_eq!(reply.matches("192.0.2.").count(), 40, "{reply}");
    assert_eq!(seen(&s, "big.example.org. udp"), 1);
    assert_eq!(seen(&s, "big.example.org. tcp"), 1);
}

#[test]
fn a_silent_upstream_is_skipped_after_its_timeout() {
    let s = setup(1, true);
    let reply = dig(s.dns, &["www.example.org", "A"]);
    assert!(reply.contains("192.0.2.1"), "{reply}");
}

#[test]
fn servfail_when_no_upstream_answers() {
    let s = setup(2, false);
    let reply = dig(s.dns, &["www.example.org", "A"]);
    assert!(reply.contains("status: SERVFAIL"), "{reply}");
}

#[test]
fn the_cluster_zone_is_never_forwarded() {
    let s = setup(0, true);
    for name in [
        "missing.default.svc.cluster.local",
        "x.cluster.local",
        "cluster.local",
    ] {
        let reply = dig(s.dns, &[name, "A"]);
        assert!(reply.contains(" aa"), "{reply}");
    }
    assert!(
        s.seen[0].lock().expect("lock").is_empty(),
        "the upstream was asked about the zone"
    );
}

#[test]
fn an_external_name_outside_the_zone_is_chased_upstream() {
    let s = setup(0, true);
    let reply = dig(s.dns, &["db.default.svc.cluster.local", "A"]);
    assert!(
        reply.contains("CNAME") && reply.contains("www.example.org."),
        "{reply}"
    );
    assert!(
        reply.contains("192.0.2.1"),
        "the target's address is appended: {reply}"
    );
    let cname_only = dig(s.dns, &["db.default.svc.cluster.local", "CNAME"]);
    assert!(!cname_only.contains("192.0.2.1"), "{cname_only}");
}

#[test]
fn misses_are_servfail_until_the_view_is_complete() {
    let s = setup_with(Vec::new(), true, false, 100);
    let miss = dig(s.dns, &["missing.default.svc.cluster.local", "A"]);
    assert!(miss.contains("status: SERVFAIL"), "{miss}");
    let hit = dig(s.dns, &["db.default.svc.cluster.local", "CNAME"]);
    assert!(
        hit.contains("status: NOERROR"),
        "known names still answer: {hit}"
    );
}

#[test]
fn the_cache_keeps_classes_apart_and_counts_wire_bytes() {
    let s = setup(0, true);
    let chaos = dig(s.dns, &["-c", "CH", "-t", "A", "www.example.org"]);
    assert!(chaos.contains("status: NOERROR"), "{chaos}");
    let internet = dig(s.dns, &["www.example.org", "A"]);
    assert!(internet.contains("192.0.2.1"), "{internet}");
    assert_eq!(
        seen(&s, "www.example.org. udp"),
        2,
        "a CH answer must not answer an IN question"
    );
    // Both answers are cached at the size the upstream sent them.
    let mut query = Message::new(1, MessageType::Query, hickory_proto::op::OpCode::Query);
    query.add_query(hickory_proto::op::Query::query(
        Name::from_ascii("www.example.org.").expect("name"),
        RecordType::A,
    ));
    let wire = answer(&query, false).to_vec().expect("encode").len();
    assert_eq!(s.forwarder.cache_size(), (2, 2 * wire));
}

#[test]
fn questions_over_max_concurrent_are_refused() {
    // One silent upstream: the first question waits for its timeout.
    let s = setup_with(silent_upstreams(1), false, true, 1);
    let client = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let mut waiting = Message::new(7, MessageType::Query, hickory_proto::op::OpCode::Query);
    waiting.add_query(hickory_proto::op::Query::query(
        Name::from_ascii("slow.example.org.").expect("name"),
        RecordType::A,
    ));
    client
        .send_to(&waiting.to_vec().expect("encode"), s.dns)
        .expect("send");
    std::thread::sleep(Duration::from_millis(50));
    let refused = dig(s.dns, &["other.example.org", "A"]);
    assert!(refused.contains("status: REFUSED"), "{refused}");
    assert_eq!(s.forwarder.stats.refused.load(Ordering::Relaxed), 1);
    // Once it has failed (asked twice, as the only upstream), the next question goes
    // upstream again (and fails).
    std::thread::sleep(Duration::from_millis(800));
    let failed = dig(s.dns, &["other.example.org", "A"]);
    assert!(failed.contains("status: SERVFAIL"), "{failed}");
}

/// RFC 7766 §6.2.1.1: questions pipelined over one TCP connection are answered
/// concurrently. A forwarded name waiting for a silent upstream does not hold back the
/// zone's answer sent after it on the same connection: that reply comes first.
#[test]
fn pipelined_tcp_questions_are_answered_as_each_is_ready() {
    use std::io::{Read, Write};
    let s = setup_with(silent_upstreams(1), false, true, 100);
    let framed = |id: u16, name: &str| {
        let mut query = Message::new(id, MessageType::Query, hickory_proto::op::OpCode::Query);
        query.add_query(hickory_proto::op::Query::query(
            Name::from_ascii(name).expect("name"),
            RecordType::A,
        ));
        let bytes = query.to_vec().expect("encode");
        let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
        framed.extend(bytes);
        framed
    };
    let mut stream = std::net::TcpStream::connect(s.dns).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut both = framed(1, "slow.example.org.");
    both.extend(framed(2, "nothing.default.svc.cluster.local."));
    stream.write_all(&both).expect("send both at once");
    let mut read_reply = || {
        let mut length = [0u8; 2];
        stream.read_exact(&mut length).expect("length");
        let mut reply = vec![0u8; usize::from(u16::from_be_bytes(length))];
        stream.read_exact(&mut reply).expect("reply");
        let reply = Message::from_vec(&reply).expect("decode");
        (reply.metadata.id, reply.metadata.response_code)
    };
    assert_eq!(
        read_reply(),
        (2, ResponseCode::NXDomain),
        "the zone's answer first"
    );
    assert_eq!(
        read_reply(),
        (1, ResponseCode::ServFail),
        "then the upstream's failure"
    );
}

/// An upstream that leads back to nodus: it relays every UDP question to `target` (once
/// set) and the answer back, as a node resolver forwarding to the cluster DNS would.
fn relay(target: Arc<OnceLock<SocketAddr>>, relayed: Arc<AtomicUsize>) -> SocketAddr {
    let socket = Arc::new(std::net::UdpSocket::bind("127.0.0.1:0").expect("bind"));
    let addr = socket.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        while let Ok((n, from)) = socket.recv_from(&mut buffer) {
            relayed.fetch_add(1, Ordering::Relaxed);
            let (packet, socket, target) = (buffer[..n].to_vec(), socket.clone(), target.clone());
            std::thread::spawn(move || {
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                let target = loop {
                    match target.get() {
                        Some(target) => break *target,
                        None if std::time::Instant::now() > deadline => return,
                        None => std::thread::sleep(Duration::from_millis(10)),
                    }
                };
                let out = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
                out.set_read_timeout(Some(Duration::from_secs(3)))
                    .expect("timeout");
                let mut reply = [0u8; 4096];
                if out.send_to(&packet, target).is_ok()
                    && let Ok(n) = out.recv(&mut reply)
                {
                    let _ = socket.send_to(&reply[..n], from);
                }
            });
        }
    });
    addr
}

/// CoreDNS's loop check: an upstream that sends our questions back to us is found by the
/// probe at start and left out, so that names outside the zone go to the next upstream at
/// once instead of circling until they time out.
#[test]
fn an_upstream_that_leads_back_here_is_found_at_start_and_left_out() {
    let target = Arc::new(OnceLock::new());
    let relayed = Arc::new(AtomicUsize::new(0));
    let looping = relay(target.clone(), relayed.clone());
    let s = setup_with(vec![looping], true, true, 100);
    target.set(s.dns).expect("set once");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.forwarder.looping_upstreams().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.forwarder.looping_upstreams(), [looping]);
    let before = relayed.load(Ordering::Relaxed);
    let reply = dig(s.dns, &["www.example.org", "A"]);
    assert!(reply.contains("status: NOERROR"), "{reply}");
    assert_eq!(
        seen(&s, "www.example.org. udp"),
        1,
        "the live upstream answered"
    );
    assert_eq!(
        relayed.load(Ordering::Relaxed),
        before,
        "the loop is not asked again"
    );
    let metrics = nodus_prom::render(s._server.metrics.clone());
    assert!(
        metrics.contains("nodus_dns_upstreams_looping 1"),
        "{metrics}"
    );
}

/// The loop check again when the cluster's DNS ConfigMap brings new upstreams: a stub
/// domain's server and an upstream that both lead back here, set while nodus runs, are
/// found and left out as one configured at start is.
#[test]
fn upstreams_and_stub_domains_set_later_are_probed_for_loops_too() {
    let s = setup_with(vec![], true, true, 100);
    let target = Arc::new(OnceLock::new());
    target.set(s.dns).expect("set once");
    let relayed = Arc::new(AtomicUsize::new(0));
    let (looping, stub_looping) = (
        relay(target.clone(), relayed.clone()),
        relay(target, relayed),
    );
    let live = s.forwarder.upstreams()[0].addr;
    s.forwarder.set_upstreams(
        &[looping, live],
        &[(
            Name::from_ascii("corp.example.").expect("name"),
            vec![stub_looping],
        )],
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut found = s.forwarder.looping_upstreams();
    while found.len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        found = s.forwarder.looping_upstreams();
    }
    found.sort();
    let mut expected = vec![looping, stub_looping];
    expected.sort();
    assert_eq!(found, expected);
    let reply = dig(s.dns, &["www.example.org", "A"]);
    assert!(reply.contains("status: NOERROR"), "{reply}");
}

/// The requests a given upstream got from questions (not health checks).
fn requests_to(s: &Setup, upstream: SocketAddr) -> u64 {
    s.forwarder
        .upstreams()
        .iter()
        .find(|u| u.addr == upstream)
        .map(|u| u.stats.requests.load(Ordering::Relaxed))
        .expect("a configured upstream")
}

#[test]
fn a_dead_upstream_is_asked_last_after_two_failures_and_health_checked() {
    let dead = silent_upstreams(1);
    let s = setup_with(dead.clone(), true, true, 100);
    for i in 0..5 {
        let reply = dig(s.dns, &[&format!("www{i}.example.org"), "A"]);
        assert!(reply.contains("status: NXDOMAIN"), "{reply}");
    }
    assert_eq!(
        requests_to(&s, dead[0]),
        2,
        "down after two failures in a row: the live upstream is asked first"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let checks = || {
        s.forwarder.upstreams()[0]
            .stats
            .healthcheck_failures
            .load(Ordering::Relaxed)
    };
    while checks() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(checks() > 0, "the dead upstream is health-checked");
    assert!(s.forwarder.upstreams()[0].is_down());
}

#[test]
fn a_lost_datagram_to_the_only_upstream_is_asked_again() {
    let s = setup(0, true);
    let reply = dig(s.dns, &["lossy.example.org", "A"]);
    assert!(reply.contains("status: NXDOMAIN"), "{reply}");
    assert_eq!(seen(&s, "lossy.example.org. udp"), 2);
}

#[test]
fn a_failure_of_every_upstream_is_remembered_for_a_moment() {
    let dead = silent_upstreams(2);
    let s = setup_with(dead.clone(), false, true, 100);
    for _ in 0..3 {
        let reply = dig(s.dns, &["www.example.org", "A"]);
        assert!(reply.contains("status: SERVFAIL"), "{reply}");
    }
    assert_eq!(
        requests_to(&s, dead[0]) + requests_to(&s, dead[1]),
        2,
        "the retries were answered from the remembered failure"
    );
}

#[test]
fn an_expired_answer_is_served_stale_while_the_upstreams_fail() {
    let s = start(true, 1, |config, live| {
        config.upstreams = live;
        config.max_ttl = 1;
        config.serve_stale = 60;
    });
    let fresh = dig(s.dns, &["www.example.org", "A"]);
    assert!(
        fresh.contains("www.example.org.\t1\tIN\tA\t192.0.2.1"),
        "{fresh}"
    );
    s.behaviour.mute.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(1200));
    for _ in 0..2 {
        // RFC 8767: the stale answer with a TTL of 30 s.
        let stale = dig(s.dns, &["www.example.org", "A"]);
        assert!(
            stale.contains("status: NOERROR")
                && stale.contains("www.example.org.\t30\tIN\tA\t192.0.2.1"),
            "{stale}"
        );
    }
    assert_eq!(s.forwarder.stats.served_stale.load(Ordering::Relaxed), 2);
    assert_eq!(
        seen(&s, "www.example.org. udp"),
        3,
        "asked once, then twice as the only upstream; the second stale answer came at once"
    );
    s.behaviour.mute.store(false, Ordering::Relaxed);
    let without = start(true, 1, |config, live| {
        config.upstreams = live;
        config.max_ttl = 1;
    });
    assert!(dig(without.dns, &["www.example.org", "A"]).contains("192.0.2.1"));
    without.behaviour.mute.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(1200));
    let failed = dig(without.dns, &["www.example.org", "A"]);
    assert!(
        failed.contains("status: SERVFAIL"),
        "serve-stale off: {failed}"
    );
}

#[test]
fn a_popular_answer_is_fetched_again_before_it_expires() {
    let s = start(true, 1, |config, live| {
        config.upstreams = live;
        config.max_ttl = 2;
        config.prefetch_hits = 2;
    });
    for _ in 0..3 {
        assert!(dig(s.dns, &["www.example.org", "A"]).contains("192.0.2.1"));
    }
    // In its last second: answered from the cache, and fetched again behind it.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(dig(s.dns, &["www.example.org", "A"]).contains("192.0.2.1"));
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while seen(&s, "www.example.org. udp") < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(seen(&s, "www.example.org. udp"), 2);
    assert_eq!(s.forwarder.stats.prefetches.load(Ordering::Relaxed), 1);
    assert_eq!(s.forwarder.stats.cache_misses.load(Ordering::Relaxed), 1);
    // The prefetched answer is fresh past the first one's end.
    std::thread::sleep(Duration::from_millis(1000));
    let later = dig(s.dns, &["www.example.org", "A"]);
    assert!(later.contains("192.0.2.1"), "{later}");
    assert_eq!(seen(&s, "www.example.org. udp"), 2);
}

#[test]
fn dnssec_bits_go_upstream_and_ad_comes_back() {
    let s = setup(0, true);
    let signed = dig(s.dns, &["+dnssec", "signed.example.org", "A"]);
    assert!(signed.contains("RRSIG"), "the signature: {signed}");
    assert!(signed.contains(" ad"), "AD relayed: {signed}");
    assert!(
        signed.contains("; EDNS: version: 0, flags: do;"),
        "{signed}"
    );
    let plain = dig(s.dns, &["+noadflag", "signed.example.org", "A"]);
    assert!(plain.contains("192.0.2.1"), "{plain}");
    assert!(!plain.contains("RRSIG"), "no DO, no signature: {plain}");
    assert!(
        !plain.contains(" ad"),
        "the client did not ask for AD: {plain}"
    );
    assert_eq!(
        seen(&s, "signed.example.org. udp"),
        2,
        "with and without DO are two questions to the cache"
    );
    let bogus = dig(s.dns, &["bogus.example.org", "A"]);
    assert!(bogus.contains("status: SERVFAIL"), "{bogus}");
    let unchecked = dig(s.dns, &["+cd", "bogus.example.org", "A"]);
    assert!(
        unchecked.contains("status: NOERROR") && unchecked.contains("192.0.2.66"),
        "CD reaches the upstream: {unchecked}"
    );
}

#[test]
fn stub_domains_go_to_their_own_upstreams() {
    let s = start(true, 2, |config, live| {
        config.upstreams = vec![live[0]];
        config.zones = vec![(
            Name::from_ascii("corp.example.").expect("name"),
            vec![live[1]],
        )];
    });
    dig(s.dns, &["www.example.org", "A"]);
    dig(s.dns, &["db.Corp.Example", "A"]);
    assert_eq!(seen_by(&s.seen[0], "www.example.org. udp"), 1);
    assert_eq!(seen_by(&s.seen[0], "db.corp.example. udp"), 0);
    assert_eq!(seen_by(&s.seen[1], "db.corp.example. udp"), 1);
    assert_eq!(seen_by(&s.seen[1], "www.example.org. udp"), 0);
}

#[test]
fn round_robin_spreads_questions_over_the_upstreams() {
    let s = start(true, 2, |config, live| {
        config.upstreams = live;
        config.policy = Policy::RoundRobin;
    });
    for i in 0..4 {
        dig(s.dns, &[&format!("rr{i}.example.org"), "A"]);
    }
    let asked = |seen: &Seen| seen.lock().expect("lock").values().sum::<usize>();
    assert_eq!((asked(&s.seen[0]), asked(&s.seen[1])), (2, 2));
}

#[test]
fn host_records_answer_before_the_upstreams() {
    let s = start_with_hosts(
        true,
        1,
        |config, live| config.upstreams = live,
        Some(HostsSource::new(
            vec![
                "10.0.0.1 node-1 registry.lan".into(),
                "fd00::1 node-1".into(),
            ],
            None,
        )),
    );
    let a = dig(s.dns, &["Registry.LAN", "A"]);
    let words = a.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        a.contains("status: NOERROR") && words.contains("Registry.LAN. 60 IN A 10.0.0.1"),
        "{a}"
    );
    let aaaa = dig(s.dns, &["node-1", "AAAA"]);
    assert!(aaaa.contains("fd00::1"), "{aaaa}");
    let none = dig(s.dns, &["registry.lan", "AAAA"]);
    assert!(
        none.contains("status: NOERROR") && none.contains("ANSWER: 0"),
        "a held name, another type: {none}"
    );
    let ptr = dig(s.dns, &["-x", "10.0.0.1"]);
    assert!(
        ptr.contains("PTR\tnode-1."),
        "the first name of its line: {ptr}"
    );
    assert!(
        s.seen[0].lock().expect("lock").is_empty(),
        "no upstream asked"
    );
    let other = dig(s.dns, &["www.example.org", "A"]);
    assert!(other.contains("192.0.2.1"), "{other}");
    assert_eq!(seen(&s, "www.example.org. udp"), 1);
}

/// CoreDNS's series, as its dashboards and kube-prometheus' alerts read them.
#[test]
fn coredns_metric_names_count_what_happened() {
    let s = setup(0, true);
    for _ in 0..2 {
        dig(s.dns, &["www.example.org", "A"]);
    }
    dig(s.dns, &["+tcp", "nothing.example.org", "AAAA"]);
    dig(s.dns, &["nothing.example.org", "AAAA"]);
    let text = nodus_prom::render(s._server.metrics.clone());
    let upstream = s.forwarder.upstreams()[0].addr;
    for line in [
        "coredns_dns_requests_total{server=\"dns://:53\",zone=\".\",proto=\"udp\",family=\"1\",type=\"A\"} 2".to_string(),
        "coredns_dns_requests_total{server=\"dns://:53\",zone=\".\",proto=\"tcp\",family=\"1\",type=\"AAAA\"} 1".into(),
        "coredns_dns_responses_total{server=\"dns://:53\",zone=\".\",rcode=\"NXDOMAIN\"} 2".into(),
        "coredns_dns_request_duration_seconds_count{server=\"dns://:53\",zone=\".\"} 4".into(),
        "coredns_cache_hits_total{server=\"dns://:53\",zones=\".\",type=\"success\"} 1".into(),
        "coredns_cache_hits_total{server=\"dns://:53\",zones=\".\",type=\"denial\"} 1".into(),
        "coredns_cache_misses_total{server=\"dns://:53\",zones=\".\"} 2".into(),
        "coredns_cache_entries{server=\"dns://:53\",zones=\".\",type=\"denial\"} 1".into(),
        format!("coredns_proxy_request_duration_seconds_count{{proxy_name=\"forward\",to=\"{upstream}\",rcode=\"NOERROR\"}} 1"),
        format!("coredns_proxy_request_duration_seconds_count{{proxy_name=\"forward\",to=\"{upstream}\",rcode=\"NXDOMAIN\"}} 1"),
        "coredns_forward_max_concurrent_rejects_total 0".into(),
    ] {
        assert!(text.contains(&line), "{line} in\n{text}");
    }
}
