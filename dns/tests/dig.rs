//! The DNS server asked by real clients (`dig` and `kdig`) over UDP and TCP, answering from
//! a view of the example cluster plus a few services made for these rules.

mod fixture;

use fixture::view;
use nodus_dns::server::{DnsServer, serve_with_threads};
use nodus_dns::{PodRecords, Zone};
use nodus_testbed::dig::DigReply;
use nodus_view::{ViewReader, ViewWriter};
use std::net::SocketAddr;
use std::process::Command;

struct Dns {
    addr: SocketAddr,
    _server: DnsServer,
    _rt: tokio::runtime::Runtime,
}

fn start(pods: PodRecords) -> Dns {
    start_with_threads(pods, 1)
}

/// nodus DNS over the fixture view with `udp_threads` UDP threads on its port.
fn start_with_threads(pods: PodRecords, udp_threads: usize) -> Dns {
    start_on(view().reader(), pods, udp_threads)
}

fn start_on(view: ViewReader, pods: PodRecords, udp_threads: usize) -> Dns {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let zone = Zone::new("cluster.local", 5, pods).expect("zone");
    let server = rt
        .block_on(serve_with_threads(
            view,
            zone,
            None,
            &["127.0.0.1:0".parse().expect("addr")],
            udp_threads,
        ))
        .expect("bind");
    Dns {
        addr: server.addrs[0],
        _server: server,
        _rt: rt,
    }
}

fn dig(dns: &Dns, args: &[&str]) -> DigReply {
    nodus_testbed::dig::dig(dns.addr, args)
}

/// `kdig`'s output, both streams, for the checks `dig` cannot make.
fn kdig(dns: &Dns, args: &[&str]) -> String {
    let output = Command::new("kdig")
        .arg(format!("@{}", dns.addr.ip()))
        .args(["-p", &dns.addr.port().to_string()])
        .args(args)
        .output()
        .expect("kdig is installed (knot-dnsutils)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn ask(dns: &Dns, name: &str, qtype: &str) -> DigReply {
    dig(dns, &[name, qtype])
}

#[test]
fn spec_1_schema_version() {
    let dns = start(PodRecords::Disabled);
    let r = ask(&dns, "dns-version.cluster.local", "TXT");
    assert_eq!(r.status, "NOERROR", "{}", r.raw);
    assert_eq!(r.typed_data(), ["TXT \"1.1.0\""]);
    assert!(r.answers[0].contains("28800"), "{}", r.raw);
}

/// A view restored from disk at a warm start answers with its records, but without AA
/// (they may be a day old), on the UDP fast path and over TCP alike, until the lists have
/// confirmed it.
#[test]
fn a_restored_view_is_not_authoritative_until_the_lists_complete() {
    let writer = ViewWriter::new(fixture::resolved());
    writer.mark_restored();
    let dns = start_on(writer.reader(), PodRecords::Disabled, 1);
    for transport in ["+notcp", "+tcp"] {
        let r = dig(&dns, &["dual.default.svc.cluster.local", "A", transport]);
        assert_eq!(
            (r.status.as_str(), r.typed_data()),
            ("NOERROR", vec!["A 10.96.0.40".to_string()]),
            "{}",
            r.raw
        );
        assert!(
            !r.flags.split(' ').any(|f| f == "aa"),
            "{transport}: {}",
            r.raw
        );
    }
    writer.mark_complete();
    for transport in ["+notcp", "+tcp"] {
        let r = dig(&dns, &["dual.default.svc.cluster.local", "A", transport]);
        assert!(
            r.flags.split(' ').any(|f| f == "aa"),
            "{transport}: {}",
            r.raw
        );
    }
}

#[test]
fn spec_2_3_4_cluster_ip_a_aaaa_and_dual_stack() {
    let dns = start(PodRecords::Disabled);
    let a = ask(&dns, "dual.default.svc.cluster.local", "A");
    assert_eq!(
        (a.status.as_str(), a.typed_data()),
        ("NOERROR", vec!["A 10.96.0.40".to_string()]),
        "{}",
        a.raw
    );
    assert!(a.flags.contains("aa"), "authoritative: {}", a.flags);
    let aaaa = ask(&dns, "dual.default.svc.cluster.local", "AAAA");
    assert_eq!(aaaa.typed_data(), ["AAAA fd00:96::40"]);
    // Single-stack: the other family is NODATA with the SOA, not NXDOMAIN.
    let nodata = ask(&dns, "api.shop.svc.cluster.local", "AAAA");
    assert_eq!(nodata.status, "NOERROR");
    assert!(nodata.answers.is_empty());
    assert!(nodata.authority[0].contains("SOA"), "{}", nodata.raw);
}

#[test]
fn spec_5_srv_for_named_ports() {
    let dns = start(PodRecords::Disabled);
    let r = ask(&dns, "_http._tcp.dual.default.svc.cluster.local", "SRV");
    assert_eq!(
        r.typed_data(),
        ["SRV 0 100 80 dual.default.svc.cluster.local."],
        "{}",
        r.raw
    );
    assert!(
        r.additional.iter().any(|l| l.contains("10.96.0.40")),
        "{}",
        r.raw
    );
    let wrong_proto = ask(&dns, "_http._udp.dual.default.svc.cluster.local", "SRV");
    assert_eq!(wrong_proto.status, "NXDOMAIN");
    // The bare service name lists every port, the unnamed one too, as CoreDNS does.
    let bare = ask(&dns, "dual.default.svc.cluster.local", "SRV");
    assert_eq!(
        bare.typed_data(),
        [
            "SRV 0 50 80 dual.default.svc.cluster.local.",
            "SRV 0 50 81 dual.default.svc.cluster.local."
        ],
        "{}",
        bare.raw
    );
}

#[test]
fn spec_6_7_13_ptr() {
    let dns = start(PodRecords::Disabled);
    let v4 = dig(&dns, &["-x", "10.96.0.20"]);
    assert_eq!(
        v4.typed_data(),
        ["PTR web.default.svc.cluster.local."],
        "{}",
        v4.raw
    );
    let v6 = dig(&dns, &["-x", "fd00:96::20"]);
    assert_eq!(
        v6.typed_data(),
        ["PTR web.default.svc.cluster.local."],
        "{}",
        v6.raw
    );
    let headless = dig(&dns, &["-x", "10.244.2.30"]);
    assert_eq!(
        headless.typed_data(),
        ["PTR db-0.db.shop.svc.cluster.local."],
        "{}",
        headless.raw
    );
    let generated = dig(&dns, &["-x", "10.244.9.7"]);
    assert_eq!(
        generated.typed_data(),
        ["PTR 10-244-9-7.many.default.svc.cluster.local."],
        "{}",
        generated.raw
    );
    // A dual-stack headless endpoint, by its IPv6 address.
    let v6_endpoint = dig(&dns, &["-x", "fd00:244:1::40"]);
    assert_eq!(
        v6_endpoint.typed_data(),
        ["PTR pair-0.pair.shop.svc.cluster.local."],
        "{}",
        v6_endpoint.raw
    );
    // An endpoint of a ClusterIP service, as CoreDNS names it.
    let behind = dig(&dns, &["-x", "10.244.1.10"]);
    assert_eq!(
        behind.typed_data(),
        ["PTR 10-244-1-10.web.default.svc.cluster.local."],
        "{}",
        behind.raw
    );
    // Addresses of the cluster that nothing holds: NXDOMAIN here, never forwarded.
    for unheld in ["10.96.0.99", "10.244.2.99"] {
        let r = dig(&dns, &["-x", unheld]);
        assert_eq!(r.status, "NXDOMAIN", "{}", r.raw);
        assert!(r.flags.contains("aa"), "{}", r.raw);
    }
}

#[test]
fn spec_8_10_11_12_headless() {
    let dns = start(PodRecords::Disabled);
    let a = ask(&dns, "db.shop.svc.cluster.local", "A");
    assert_eq!(
        a.typed_data(),
        ["A 10.244.2.30", "A 10.244.3.30"],
        "{}",
        a.raw
    );
    let host = ask(&dns, "db-1.db.shop.svc.cluster.local", "A");
    assert_eq!(host.typed_data(), ["A 10.244.3.30"], "{}", host.raw);
    let srv = ask(&dns, "_pg._tcp.db.shop.svc.cluster.local", "SRV");
    assert_eq!(
        srv.typed_data(),
        [
            "SRV 0 50 5432 db-0.db.shop.svc.cluster.local.",
            "SRV 0 50 5432 db-1.db.shop.svc.cluster.local."
        ],
        "{}",
        srv.raw
    );
    let glue = srv
        .additional
        .iter()
        .filter(|l| l.split_whitespace().nth(3) == Some("A"));
    assert_eq!(glue.count(), 2, "{}", srv.raw);
    let empty = ask(&dns, "empty-headless.default.svc.cluster.local", "A");
    assert_eq!(empty.status, "NXDOMAIN", "rule 10: {}", empty.raw);
    let not_ready = ask(&dns, "10-244-9-200.many.default.svc.cluster.local", "A");
    assert_eq!(
        not_ready.status, "NXDOMAIN",
        "not-ready endpoints are not published"
    );
}

#[test]
fn spec_14_external_name_is_a_cname_chased_inside_the_zone() {
    let dns = start(PodRecords::Disabled);
    let outside = ask(&dns, "docs.shop.svc.cluster.local", "A");
    assert_eq!(
        outside.typed_data(),
        ["CNAME docs.example.org."],
        "{}",
        outside.raw
    );
    let inside = ask(&dns, "inner.shop.svc.cluster.local", "A");
    assert_eq!(inside.answers.len(), 2, "{}", inside.raw);
    assert!(
        inside.answers[0].contains("CNAME"),
        "CNAME first: {}",
        inside.raw
    );
    assert!(inside.answers[1].ends_with("10.96.0.20"), "{}", inside.raw);
}

#[test]
fn spec_15_case_is_preserved() {
    let dns = start(PodRecords::Disabled);
    let r = ask(&dns, "WEB.Default.SVC.cluster.LOCAL", "A");
    assert_eq!(r.status, "NOERROR", "{}", r.raw);
    assert!(
        r.answers[0].starts_with("WEB.Default.SVC.cluster.LOCAL."),
        "{}",
        r.raw
    );
}

#[test]
fn nxdomain_and_nodata_carry_the_soa() {
    let dns = start(PodRecords::Disabled);
    for (name, qtype, status) in [
        ("missing.default.svc.cluster.local", "A", "NXDOMAIN"),
        ("web.missing-ns.svc.cluster.local", "A", "NXDOMAIN"),
        ("missing.svc.cluster.local", "A", "NXDOMAIN"),
        ("web.default.svc.cluster.local", "TXT", "NOERROR"),
        ("default.svc.cluster.local", "A", "NOERROR"),
        ("svc.cluster.local", "A", "NOERROR"),
        ("cluster.local", "A", "NOERROR"),
        ("a.b.c.web.default.svc.cluster.local", "A", "NXDOMAIN"),
        ("something.cluster.local", "A", "NXDOMAIN"),
    ] {
        let r = ask(&dns, name, qtype);
        assert_eq!(r.status, status, "{name} {qtype}: {}", r.raw);
        assert!(r.answers.is_empty(), "{name}: {}", r.raw);
        assert!(
            r.authority
                .iter()
                .any(|l| l.contains("SOA") && l.starts_with("cluster.local.")),
            "{name}: {}",
            r.raw
        );
    }
}

#[test]
fn apex_soa_and_ns() {
    let dns = start(PodRecords::Disabled);
    let soa = ask(&dns, "cluster.local", "SOA");
    assert_eq!(soa.answers.len(), 1);
    assert!(
        soa.answers[0].contains("ns.dns.cluster.local. hostmaster.cluster.local."),
        "{}",
        soa.raw
    );
    let ns = ask(&dns, "cluster.local", "NS");
    assert_eq!(ns.typed_data(), ["NS ns.dns.cluster.local."], "{}", ns.raw);
    assert!(
        ns.additional.iter().any(|l| l.contains("10.96.0.10")),
        "glue is kube-dns: {}",
        ns.raw
    );
}

#[test]
fn pod_records_follow_the_option() {
    let disabled = start(PodRecords::Disabled);
    assert_eq!(
        ask(&disabled, "10-244-1-10.default.pod.cluster.local", "A").status,
        "NXDOMAIN"
    );
    let insecure = start(PodRecords::Insecure);
    let r = ask(&insecure, "10-244-1-10.default.pod.cluster.local", "A");
    assert_eq!(r.typed_data(), ["A 10.244.1.10"], "{}", r.raw);
    assert_eq!(
        ask(&insecure, "not-an-ip.default.pod.cluster.local", "A").status,
        "NXDOMAIN"
    );
}

#[test]
fn truncation_over_udp_then_the_full_answer_over_tcp() {
    let dns = start(PodRecords::Disabled);
    let udp = dig(
        &dns,
        &["+noedns", "+ignore", "many.default.svc.cluster.local", "A"],
    );
    assert!(udp.flags.contains("tc"), "{}", udp.raw);
    assert!(!udp.raw.contains("extra bytes"), "{}", udp.raw);
    let tcp = dig(&dns, &["+tcp", "many.default.svc.cluster.local", "A"]);
    assert_eq!(tcp.answers.len(), 60, "{}", tcp.raw);
    assert!(!tcp.flags.contains("tc"));
}

/// kubeadm's Corefile ends in `loadbalance`: address answers come in a random order.
#[test]
fn address_answers_are_shuffled() {
    let dns = start(PodRecords::Disabled);
    let orders: std::collections::BTreeSet<Vec<String>> = (0..4)
        .map(|_| dig(&dns, &["+tcp", "many.default.svc.cluster.local", "A"]).answers)
        .collect();
    assert!(orders.len() > 1, "four answers in one order: {orders:?}");
    let sets: std::collections::BTreeSet<Vec<String>> = orders
        .into_iter()
        .map(|mut answers| {
            answers.sort();
            answers
        })
        .collect();
    assert_eq!(sets.len(), 1, "the same records each time");
}

#[test]
fn edns_is_echoed_with_our_payload_size() {
    let dns = start(PodRecords::Disabled);
    let r = dig(
        &dns,
        &["+bufsize=4096", "web.default.svc.cluster.local", "A"],
    );
    assert!(r.raw.contains("; EDNS: version: 0"), "{}", r.raw);
    assert!(r.raw.contains("udp: 1232"), "{}", r.raw);
}

/// RFC 6891: a later EDNS version is BADVERS; RFC 3225: the DO bit is copied; zone
/// transfers are refused, as CoreDNS refuses them.
#[test]
fn edns_versions_the_do_bit_and_zone_transfers() {
    let dns = start(PodRecords::Disabled);
    let name = "web.default.svc.cluster.local";
    let v1 = dig(&dns, &["+edns=1", "+noednsnegotiation", name, "A"]);
    assert_eq!(v1.status, "BADVERS", "{}", v1.raw);
    assert!(v1.answers.is_empty(), "{}", v1.raw);
    assert!(v1.raw.contains("; EDNS: version: 0"), "{}", v1.raw);
    // DO copied, on the fast path (a service's A) and the full one (the apex SOA).
    for (qname, qtype) in [(name, "A"), ("cluster.local", "SOA")] {
        let with_do = dig(&dns, &["+dnssec", qname, qtype]);
        assert_eq!(with_do.status, "NOERROR", "{}", with_do.raw);
        assert!(with_do.raw.contains("flags: do;"), "{}", with_do.raw);
        let without = dig(&dns, &[qname, qtype]);
        assert!(!without.raw.contains("flags: do;"), "{}", without.raw);
    }
    for transfer in [&["cluster.local", "AXFR"][..], &["cluster.local", "IXFR=1"]] {
        let text = kdig(&dns, transfer);
        assert!(text.contains("REFUSED"), "{transfer:?}: {text}");
    }
    // The zone is class IN: a CHAOS question about it gets no IN records.
    for class in ["CH", "HS"] {
        let other = dig(&dns, &["-c", class, name, "A"]);
        assert_eq!(other.status, "REFUSED", "{class}: {}", other.raw);
        assert!(other.answers.is_empty(), "{}", other.raw);
    }
}

#[test]
fn odd_questions_get_protocol_answers() {
    let dns = start(PodRecords::Disabled);
    // An unknown type is NODATA, not FORMERR.
    let r = ask(&dns, "web.default.svc.cluster.local", "TYPE65000");
    assert_eq!(r.status, "NOERROR", "{}", r.raw);
    // ANY gets a minimal answer (RFC 8482): one RRset, not every type the name has.
    let any = ask(&dns, "web.default.svc.cluster.local", "ANY");
    assert_eq!(any.typed_data(), ["A 10.96.0.20"], "{}", any.raw);
    // Other opcodes are not implemented.
    let status = dig(
        &dns,
        &["+opcode=status", "web.default.svc.cluster.local", "A"],
    );
    assert_eq!(status.status, "NOTIMP", "{}", status.raw);
    // kdig, a second client, over TCP.
    let text = kdig(&dns, &["+tcp", "web.default.svc.cluster.local", "AAAA"]);
    assert!(
        text.contains("NOERROR") && text.contains("fd00:96::20"),
        "{text}"
    );
    // Names outside the zone are refused until forwarding is configured.
    assert_eq!(ask(&dns, "example.org", "A").status, "REFUSED");
}

#[test]
fn malformed_packets_never_take_the_server_down() {
    let dns = start(PodRecords::Disabled);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    for junk in [
        &b""[..],
        b"\x00",
        b"\x12\x34\x01\x00\x00\x01",
        &[0xff; 64],
        &[0u8; 512],
    ] {
        let _ = socket.send_to(junk, dns.addr);
    }
    let r = ask(&dns, "web.default.svc.cluster.local", "A");
    assert_eq!(r.status, "NOERROR", "still answering: {}", r.raw);
}

#[test]
fn pod_records_need_an_existing_namespace() {
    let insecure = start(PodRecords::Insecure);
    // CoreDNS's insecure mode still checks the namespace (`namespaceExposed`).
    let missing = ask(&insecure, "10-244-1-10.missing-ns.pod.cluster.local", "A");
    assert_eq!(missing.status, "NXDOMAIN", "{}", missing.raw);
    let namespace = ask(&insecure, "default.pod.cluster.local", "A");
    assert_eq!(
        (namespace.status.as_str(), namespace.answers.len()),
        ("NOERROR", 0),
        "{}",
        namespace.raw
    );
    let disabled = start(PodRecords::Disabled);
    let r = ask(&disabled, "default.pod.cluster.local", "A");
    assert_eq!(
        r.status, "NXDOMAIN",
        "disabled: nothing below pod: {}",
        r.raw
    );
}

#[test]
fn srv_with_a_bare_underscore_label_matches_any_port_or_protocol() {
    let dns = start(PodRecords::Disabled);
    let named = ["SRV 0 100 80 dual.default.svc.cluster.local."];
    let every = [
        "SRV 0 50 80 dual.default.svc.cluster.local.",
        "SRV 0 50 81 dual.default.svc.cluster.local.",
    ];
    for (name, expected) in [
        ("_._tcp.dual.default.svc.cluster.local", &every[..]),
        ("_http._.dual.default.svc.cluster.local", &named[..]),
        ("_._.dual.default.svc.cluster.local", &every[..]),
    ] {
        let r = ask(&dns, name, "SRV");
        assert_eq!(r.typed_data(), expected, "{name}: {}", r.raw);
    }
    let wrong = ask(&dns, "_._udp.dual.default.svc.cluster.local", "SRV");
    assert_eq!(wrong.status, "NXDOMAIN", "{}", wrong.raw);
    let headless = ask(&dns, "_._tcp.db.shop.svc.cluster.local", "SRV");
    assert_eq!(headless.answers.len(), 2, "{}", headless.raw);
}

#[test]
fn negative_reverse_answers_carry_the_reverse_zone_soa() {
    let dns = start(PodRecords::Disabled);
    for (name, zone) in [
        ("20.0.96.10.in-addr.arpa", "in-addr.arpa."),
        (
            "0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa",
            "ip6.arpa.",
        ),
    ] {
        let r = ask(&dns, name, "A");
        assert_eq!(
            (r.status.as_str(), r.answers.len()),
            ("NOERROR", 0),
            "{}",
            r.raw
        );
        assert!(
            r.authority
                .iter()
                .any(|l| l.starts_with(zone) && l.contains(&format!("SOA\tns.dns.{zone}"))),
            "{name}: {}",
            r.raw
        );
    }
}

#[test]
fn several_udp_threads_share_the_port() {
    let dns = start_with_threads(PodRecords::Disabled, 3);
    // Each dig has its own source port, which the kernel hashes to one of the sockets;
    // misses and hits (fast path) and headless names (full path) answer on all of them.
    for _ in 0..6 {
        assert_eq!(
            ask(&dns, "web.default.svc.cluster.local", "A").typed_data(),
            ["A 10.96.0.20"]
        );
        assert_eq!(
            ask(&dns, "missing.default.svc.cluster.local", "A").status,
            "NXDOMAIN"
        );
        assert_eq!(
            ask(&dns, "db.shop.svc.cluster.local", "A")
                .typed_data()
                .len(),
            2
        );
    }
}

#[test]
fn metrics_count_both_paths() {
    let dns = start(PodRecords::Disabled);
    for _ in 0..3 {
        ask(&dns, "web.default.svc.cluster.local", "A");
    }
    ask(&dns, "missing.default.svc.cluster.local", "A");
    // Headless: the full path.
    ask(&dns, "db.shop.svc.cluster.local", "A");
    let text = nodus_prom::render(dns._server.metrics.clone());
    for line in [
        "nodus_dns_requests_total{qtype=\"A\"} 5",
        "nodus_dns_responses_total{rcode=\"NOERROR\"} 4",
        "nodus_dns_responses_total{rcode=\"NXDOMAIN\"} 1",
        "nodus_dns_request_duration_seconds_count 5",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
}

/// A TCP connection to `dns` from `source` (a loopback address), with half a message sent:
/// a client that holds the connection and never finishes.
fn held_connection(dns: &Dns, source: [u8; 4]) -> std::net::TcpStream {
    use socket2::{Domain, Socket, Type};
    use std::io::Write;
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::from((source, 0)).into())
        .expect("bind the source");
    socket.connect(&dns.addr.into()).expect("connect");
    let mut stream: std::net::TcpStream = socket.into();
    stream.write_all(&[0]).expect("half a length");
    stream
}

/// Whether the server closed `stream` within `wait`.
fn closed(stream: &mut std::net::TcpStream, wait: std::time::Duration) -> bool {
    use std::io::Read;
    stream.set_read_timeout(Some(wait)).expect("timeout");
    let mut buffer = [0; 64];
    match stream.read(&mut buffer) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// RFC 7766 §6.2: one client holds at most its share of TCP connections (over it, a
/// connection is closed as soon as it is accepted), and another client still gets answers
/// over TCP; a connection that stops sending is closed once idle.
#[test]
fn tcp_connections_are_capped_per_client_and_idle_ones_closed() {
    use nodus_dns::tcp::{IDLE, PER_CLIENT};
    use std::time::Duration;
    let dns = start(PodRecords::Disabled);
    let mut held: Vec<std::net::TcpStream> = (0..PER_CLIENT + 4)
        .map(|_| held_connection(&dns, [127, 0, 0, 2]))
        .collect();
    let r = dig(&dns, &["+tcp", "web.default.svc.cluster.local", "A"]);
    assert_eq!(r.status, "NOERROR", "{}", r.raw);
    assert_eq!(r.typed_data(), ["A 10.96.0.20"]);
    let over: Vec<bool> = held[PER_CLIENT..]
        .iter_mut()
        .map(|s| closed(s, Duration::from_secs(5)))
        .collect();
    assert!(over.iter().all(|c| *c), "over the share: {over:?}");
    // Counted for `nodus_connections_refused_total{listener="DNS"}`.
    let refused = nodus_limits::refused();
    assert!(
        refused
            .iter()
            .any(|(what, count)| *what == "DNS" && *count >= 4),
        "{refused:?}"
    );
    let share: Vec<bool> = held[..PER_CLIENT]
        .iter_mut()
        .map(|s| closed(s, Duration::from_millis(200)))
        .collect();
    assert!(share.iter().all(|c| !*c), "within the share: {share:?}");
    // Idle (half a length sent, then nothing): closed after IDLE.
    assert!(closed(&mut held[0], IDLE + Duration::from_secs(10)));
}

/// A client that pipelines thousands of questions over TCP and reads none of the replies
/// (the review's N8: 6 to 8 such pods used to pin megabytes each, for 10 s per stalled
/// write, and exhaust the agent's memory) holds no more than its connection's budget of
/// reply bytes: the server closes the connection once a reply finds no room, or cannot be
/// written, within 2 s, and counts it; another client is answered meanwhile.
#[test]
fn a_tcp_client_that_reads_nothing_is_closed_and_counted() {
    use socket2::{Domain, Socket, Type};
    use std::io::Write;
    use std::time::Duration;
    let dns = start(PodRecords::Disabled);
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket
        .set_recv_buffer_size(4096)
        .expect("a small receive buffer");
    socket.connect(&dns.addr.into()).expect("connect");
    let mut stream: std::net::TcpStream = socket.into();
    // `many` has 60 addresses: about 1 KB a reply.
    let name = "many.default.svc.cluster.local";
    let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        query.push(u8::try_from(label.len()).expect("label"));
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    let mut framed = u16::try_from(query.len())
        .expect("length")
        .to_be_bytes()
        .to_vec();
    framed.extend_from_slice(&query);
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    // About 20 MB of replies: more than loopback's send buffer (about 1.3 MB, from its
    // 64 KiB segments) and the budgets can hold.
    let batch: Vec<u8> = framed.repeat(100);
    for _ in 0..200 {
        if stream.write_all(&batch).is_err() {
            break;
        }
    }
    let r = dig(&dns, &["+tcp", "web.default.svc.cluster.local", "A"]);
    assert_eq!(r.typed_data(), ["A 10.96.0.20"], "{}", r.raw);
    let counted = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("nodus_dns_tcp_connections_closed_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    let mut closed_count = 0;
    for _ in 0..100 {
        closed_count = counted(&nodus_prom::render(dns._server.metrics.clone()));
        if closed_count > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        closed_count,
        1,
        "the stalled connection closed and counted: {}",
        nodus_prom::render(dns._server.metrics.clone())
            .lines()
            .filter(|l| l.contains("tcp"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // What the client did not read is gone with the connection: reading ends.
    assert!(closed(&mut stream, Duration::from_secs(30)) || drained(&mut stream));
}

/// Reads `stream` to its end (or an error): true when the server closed it.
fn drained(stream: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let mut buffer = vec![0; 65536];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) => return error.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}
