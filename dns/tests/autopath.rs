//! Autopath through the handler: questions from a `ClusterFirst` pod of this node, by the
//! address they come from, against a local upstream that counts what it is asked. The
//! asked name's own answer wins when it exists; otherwise the first name of the pod's
//! search list that exists comes back behind a CNAME, over the full path, which the fast
//! path leaves such misses to.

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use nodus_dns::autopath::NodeSearch;
use nodus_dns::forward::{ForwardConfig, Forwarder, Policy};
use nodus_dns::handler::ClusterDns;
use nodus_dns::listen;
use nodus_dns::server::{DnsServer, serve_planned};
use nodus_dns::{PodRecords, Zone, fast};
use nodus_view::{Update, View, ViewWriter};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the upstream was asked: name and type, in order.
type Asked = Arc<Mutex<Vec<String>>>;

/// An upstream for the node's search domain `corp.example` and the world: `www.example.org`
/// and `db.corp.example` exist (A only), names under `broken.` fail, the rest is NXDOMAIN.
async fn upstream(asked: Asked) -> SocketAddr {
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = udp.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let Some(question) = query.queries.first().cloned() else {
                continue;
            };
            // nodus's loop probe at start is not a forwarded question.
            if question.query_type() == RecordType::HINFO {
                continue;
            }
            let name = question.name().to_lowercase().to_ascii();
            asked
                .lock()
                .expect("lock")
                .push(format!("{name} {}", question.query_type()));
            let mut reply = Message::new(
                query.metadata.id,
                MessageType::Response,
                query.metadata.op_code,
            );
            reply.metadata.recursion_available = true;
            reply.add_query(question.clone());
            let exists = ["www.example.org.", "db.corp.example."].contains(&name.as_str());
            if name.starts_with("broken.") {
                reply.metadata.response_code = ResponseCode::ServFail;
            } else if exists && question.query_type() == RecordType::A {
                let ip = Ipv4Addr::new(192, 0, 2, 1);
                reply.add_answer(Record::from_rdata(
                    question.name().clone(),
                    60,
                    RData::A(A(ip)),
                ));
            } else {
                if !exists {
                    reply.metadata.response_code = ResponseCode::NXDomain;
                }
                let origin = Name::from_ascii("example.").expect("name");
                let soa = SOA::new(origin.clone(), origin.clone(), 1, 60, 60, 60, 30);
                reply.add_authority(Record::from_rdata(origin, 30, RData::SOA(soa)));
            }
            if let Ok(bytes) = reply.to_vec() {
                let _ = udp.send_to(&bytes, from).await;
            }
        }
    });
    addr
}

struct Setup {
    server: DnsServer,
    asked: Asked,
    rt: tokio::runtime::Runtime,
}

fn update(value: serde_json::Value) -> Update {
    let kind = value["kind"].as_str().expect("kind").to_string();
    match kind.as_str() {
        "Service" => Update::Service(serde_json::from_value(value).expect("service")),
        "Pod" => Update::Pod(serde_json::from_value(value).expect("pod")),
        _ => panic!("{kind}"),
    }
}

fn pod(namespace: &str, name: &str, ip: &str, spec: serde_json::Value) -> Update {
    let mut spec = spec;
    spec["nodeName"] = "node-1".into();
    update(serde_json::json!({"kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec, "status": {"phase": "Running", "podIPs": [{"ip": ip}]}}))
}

fn service(namespace: &str, name: &str, ip: &str) -> Update {
    let spec = serde_json::json!({"clusterIP": ip, "ports": [{"port": 80}]});
    update(nodus_testbed::fixtures::service(namespace, name, spec))
}

/// nodus DNS for node-1 with autopath on, the node's search domain `corp.example`, and
/// pods: `shop/web-0` (10.244.0.5, ClusterFirst) and `shop/plain` (10.244.0.6,
/// `dnsPolicy: Default`); services `web` in `shop` and in `blog`.
fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let asked = Asked::default();
    let server = rt.block_on(async {
        let forwarder = Arc::new(Forwarder::new(ForwardConfig {
            upstreams: vec![upstream(asked.clone()).await],
            policy: Policy::Sequential,
            timeout: Duration::from_millis(500),
            ..ForwardConfig::default()
        }));
        let origin = Name::from_ascii("cluster.local.").expect("name");
        let zone = Zone::new("cluster.local", 5, PodRecords::Insecure)
            .expect("zone")
            .with_autopath(NodeSearch::from_resolv_conf(
                "search corp.example\n",
                &origin,
            ));
        let mut view = View::new("node-1");
        view.apply([
            service("shop", "web", "10.96.0.20"),
            service("blog", "web", "10.96.0.30"),
            pod("shop", "web-0", "10.244.0.5", serde_json::json!({})),
            pod(
                "shop",
                "plain",
                "10.244.0.6",
                serde_json::json!({"dnsPolicy": "Default"}),
            ),
        ]);
        let view = ViewWriter::new(view);
        view.mark_complete();
        let handler = ClusterDns::new(view.reader(), zone, Some(forwarder));
        let listen = listen::plan(&["127.0.0.1:0".parse().expect("addr")]);
        let mut server = serve_planned(handler, &listen, 1, BTreeMap::new(), Default::default())
            .await
            .expect("serve");
        server.allow(nodus_dns::allow::AllowedPrefixes {
            cluster: vec!["10.244.0.0/16".parse().expect("cidr")],
            extra: Vec::new(),
        });
        server
    });
    Setup { server, asked, rt }
}

fn packet(name: &str, qtype: RecordType) -> Vec<u8> {
    let mut message = Message::new(7, MessageType::Query, hickory_proto::op::OpCode::Query);
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).expect("name"), qtype));
    message.to_vec().expect("encode")
}

/// The full path's reply to `name` from `client`: rcode, whether authoritative, and the
/// answer section as `name type data` lines.
fn ask(
    setup: &Setup,
    client: &str,
    name: &str,
    qtype: RecordType,
) -> (ResponseCode, bool, Vec<String>) {
    let src = SocketAddr::new(client.parse().expect("ip"), 40000);
    let bytes = setup
        .rt
        .block_on(
            setup
                .server
                .handler()
                .answer_datagram(packet(name, qtype), src),
        )
        .expect("a reply");
    let reply = Message::from_vec(&bytes).expect("parse");
    let answers = reply
        .answers
        .iter()
        .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
        .collect();
    (
        reply.metadata.response_code,
        reply.metadata.authoritative,
        answers,
    )
}

fn asked(setup: &Setup) -> Vec<String> {
    std::mem::take(&mut *setup.asked.lock().expect("lock"))
}

fn walks(server: &DnsServer, result: &str) -> String {
    let text = nodus_prom::render(server.metrics.clone());
    let series = format!("nodus_dns_autopath_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or("absent")
        .to_string()
}

#[test]
fn an_outside_name_comes_back_behind_a_cname_in_one_question() {
    let s = setup();
    let (rcode, aa, answers) = ask(
        &s,
        "10.244.0.5",
        "WWW.example.org.shop.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(rcode, ResponseCode::NoError);
    assert!(!aa, "the records are the upstream's");
    assert_eq!(
        answers,
        [
            "WWW.example.org.shop.svc.cluster.local. CNAME WWW.example.org.",
            "WWW.example.org. A 192.0.2.1",
        ]
    );
    assert_eq!(
        asked(&s),
        ["www.example.org.corp.example. A", "www.example.org. A"],
        "the zone's names answered here, the node's search domain then the name itself upstream"
    );
    // AAAA: the name exists without such records; the walk stops there, as CoreDNS's does.
    let (rcode, _, answers) = ask(
        &s,
        "10.244.0.5",
        "www.example.org.shop.svc.cluster.local.",
        RecordType::AAAA,
    );
    assert_eq!(rcode, ResponseCode::NoError);
    assert_eq!(
        answers,
        ["www.example.org.shop.svc.cluster.local. CNAME www.example.org."]
    );
    // A name of the node's search domain.
    let (_, _, answers) = ask(
        &s,
        "10.244.0.5",
        "db.shop.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(
        answers,
        [
            "db.shop.svc.cluster.local. CNAME db.corp.example.",
            "db.corp.example. A 192.0.2.1"
        ]
    );
    assert_eq!(walks(&s.server, "answered"), "3");
}

#[test]
fn a_name_of_the_pods_own_namespace_still_wins_and_the_cluster_comes_before_the_world() {
    let s = setup();
    let (rcode, aa, answers) = ask(
        &s,
        "10.244.0.5",
        "web.shop.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!((rcode, aa), (ResponseCode::NoError, true));
    assert_eq!(answers, ["web.shop.svc.cluster.local. A 10.96.0.20"]);
    // `web.blog` from a pod of shop: `web.blog.svc.<zone>`, the second name of its list.
    let (rcode, aa, answers) = ask(
        &s,
        "10.244.0.5",
        "web.blog.shop.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!((rcode, aa), (ResponseCode::NoError, true));
    assert_eq!(
        answers,
        [
            "web.blog.shop.svc.cluster.local. CNAME web.blog.svc.cluster.local.",
            "web.blog.svc.cluster.local. A 10.96.0.30",
        ]
    );
    assert!(asked(&s).is_empty(), "nothing went upstream");
}

#[test]
fn a_name_missing_everywhere_is_nxdomain_and_the_pods_own_walk_is_then_cached() {
    let s = setup();
    let (rcode, _, answers) = ask(
        &s,
        "10.244.0.5",
        "nothing.example.org.shop.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(rcode, ResponseCode::NXDomain);
    assert!(answers.is_empty());
    assert_eq!(asked(&s).len(), 2);
    assert_eq!(walks(&s.server, "nxdomain"), "1");
    // The pod goes on down its list: the names asked on the way come from the cache.
    for name in [
        "nothing.example.org.svc.cluster.local.",
        "nothing.example.org.cluster.local.",
        "nothing.example.org.corp.example.",
        "nothing.example.org.",
    ] {
        let (rcode, _, _) = ask(&s, "10.244.0.5", name, RecordType::A);
        assert_eq!(rcode, ResponseCode::NXDomain, "{name}");
    }
    assert!(asked(&s).is_empty(), "nothing asked upstream twice");
}

#[test]
fn an_upstream_failure_on_the_way_leaves_the_walk_to_the_pod() {
    let s = setup();
    let (rcode, _, answers) = ask(
        &s,
        "10.244.0.5",
        "broken.example.org.shop.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(rcode, ResponseCode::NXDomain, "the asked name's own answer");
    assert!(answers.is_empty());
    let mut upstream = asked(&s);
    upstream.dedup();
    // (A single upstream is asked twice before it counts as failed.)
    assert_eq!(
        upstream,
        ["broken.example.org.corp.example. A"],
        "stopped at the failure"
    );
    assert_eq!(walks(&s.server, "gave_up"), "1");
}

#[test]
fn other_clients_and_other_search_lists_are_not_walked_for() {
    let s = setup();
    for (client, name) in [
        // Not a pod of this node.
        ("10.244.0.9", "www.example.org.shop.svc.cluster.local."),
        // dnsPolicy: Default: its list is the node's.
        ("10.244.0.6", "www.example.org.shop.svc.cluster.local."),
        // Not its namespace's name: not the first of its list.
        ("10.244.0.5", "www.example.org.blog.svc.cluster.local."),
        ("10.244.0.5", "www.example.org.svc.cluster.local."),
    ] {
        let (rcode, _, answers) = ask(&s, client, name, RecordType::A);
        assert_eq!(
            (rcode, answers.len()),
            (ResponseCode::NXDomain, 0),
            "{client} {name}"
        );
    }
    assert!(asked(&s).is_empty());
}

#[test]
fn the_fast_path_leaves_only_the_walked_misses_to_the_full_path() {
    let s = setup();
    let handler = s.server.handler();
    let view = handler.view().read();
    let mut out = [0u8; 1232];
    let mut fast = |client: &str, name: &str| {
        let client: IpAddr = client.parse().expect("ip");
        fast::answer(
            &view,
            handler.zone(),
            client,
            &packet(name, RecordType::A),
            &mut out,
        )
        .map(|reply| reply.rcode)
    };
    assert_eq!(
        fast("10.244.0.5", "www.example.org.shop.svc.cluster.local."),
        None
    );
    assert_eq!(
        fast("10.244.0.5", "Www.Example.Org.SHOP.svc.cluster.local."),
        None
    );
    assert_eq!(
        fast("10.244.0.5", "web.shop.svc.cluster.local."),
        Some(ResponseCode::NoError)
    );
    for (client, name) in [
        ("10.244.0.9", "www.example.org.shop.svc.cluster.local."),
        ("10.244.0.6", "www.example.org.shop.svc.cluster.local."),
        ("10.244.0.5", "www.example.org.blog.svc.cluster.local."),
    ] {
        assert_eq!(
            fast(client, name),
            Some(ResponseCode::NXDomain),
            "{client} {name}"
        );
    }
    drop(view);
    // The names of the reply keep the case asked.
    let (_, _, answers) = ask(
        &s,
        "10.244.0.5",
        "web.BLOG.shop.svc.cluster.local.",
        RecordType::A,
    );
    assert_eq!(
        answers[0],
        "web.BLOG.shop.svc.cluster.local. CNAME web.BLOG.svc.cluster.local."
    );
}
