//! The plan in the kernel, each test in fresh network namespaces: a cold start committed
//! in bounded batches, incremental updates, the `render` text loaded by `nft -f`, and
//! real TCP connections through the programmed table.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use nodus_proxy::nft::{Batch, Socket};
use nodus_proxy::plan::{
    EndpointKeys, LocalDns, PlanBatch, Planner, ProxySettings, cold_start, render,
};
use nodus_testbed::netns::{self, Netns};
use serde_json::json;

mod common;
use common::*;

fn commit(ns: &Netns, batches: impl IntoIterator<Item = Batch>) {
    let batches: Vec<Batch> = batches.into_iter().collect();
    ns.enter(|| {
        let mut socket = Socket::open().expect("opening the nf_tables socket");
        for batch in &batches {
            socket
                .commit(batch)
                .unwrap_or_else(|error| panic!("commit: {error}\nbatch:\n{batch}"));
        }
    })
    .expect("entering the namespace");
}

/// Commits everything `planner` plans, as one cold start.
fn program(ns: &Netns, planner: &Planner<'_>) {
    commit(
        ns,
        cold_start(
            &planner.skeleton(),
            planner.services(&mut EndpointKeys::new()),
            1000,
        ),
    );
}

#[test]
fn cold_start_in_small_batches_lists_the_planned_table() {
    netns::require_root();
    let ns = Netns::new("plan").expect("namespace");
    let view = node_view(&TWO_ENDPOINTS);
    let planner = Planner::new(&view, &ProxySettings::default());
    let mut keys = EndpointKeys::new();
    let batches: Vec<Batch> =
        cold_start(&planner.skeleton(), planner.services(&mut keys), 25).collect();
    assert!(batches.len() > 2, "{} batches", batches.len());
    commit(&ns, batches);

    let listing = list_table(&ns);
    for expected in [
        "10.96.0.10 . tcp . 80 : goto dispatch-v4-n2-1f",
        "10.96.0.12 . tcp . 80 : goto reject-chain",
        "tcp . 30080 : goto external-",
        "fd00:96::13 . tcp . 80 : goto service-",
        "198.51.100.1 . tcp . 80 : goto firewall-",
        "meta l4proto tcp dnat ip to numgen random mod 1 map @endpoints-v4-",
        "typeof numgen random mod 2 : ip daddr . th dport",
        "dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @endpoints-v4-n2-1f",
        "dnat ip to ip daddr . meta l4proto . udp dport . numgen random mod 2 map @endpoints-v4-n2-1f",
        "typeof ip daddr . meta l4proto . th dport . numgen random mod 2 : ip daddr . th dport",
        "10.96.0.10 . tcp . 80 . 0 : 10.244.1.5 . 8080",
        "10.96.0.10 . tcp . 80 . 1 : 10.244.2.9 . 8080",
        "dnat ip6 to [fd00:244:1::7]:8080",
        "numgen random mod 1 vmap",
        "ip saddr . ip daddr . ct original ip daddr @hairpin-v4",
        "flags dynamic,timeout",
        "ip daddr @cluster-ips-v4 ip saddr != @pod-cidrs-v4 jump mark-for-masquerade",
        "fib saddr type local goto service-",
        "masquerade fully-random",
    ] {
        assert!(listing.contains(expected), "{expected} in\n{listing}");
    }

    // A sync later: one endpoint left `web`, `empty` was deleted.
    let later = node_view(&TWO_ENDPOINTS[..1]);
    let after = Planner::new(&later, &ProxySettings::default());
    // What the cold start programmed, planned again in the same order.
    let programmed = |name: &str| {
        planner
            .services(&mut EndpointKeys::new())
            .find(|plan| plan.name == name)
            .expect("planned")
    };
    let old_web = programmed("web");
    let new_web = after.service("default", "web", &mut keys.lease(&old_web.blocks));
    let mut update = PlanBatch::new();
    update.update_service(&old_web, &new_web);
    update.remove_service(&programmed("empty"));
    commit(&ns, [update.into_batch()]);
    let listing = list_table(&ns);
    assert!(!listing.contains("10.244.2.9"), "{listing}");
    assert!(!listing.contains("10.96.0.12"), "{listing}");
    // `web` moved to the map and dispatch chain of one endpoint, created in that
    // transaction; the map of two keeps no element of it.
    for expected in [
        "10.96.0.10 . tcp . 80 : goto dispatch-v4-n1-1f",
        "chain dispatch-v4-n1-1f {",
        "10.96.0.10 . tcp . 80 . 0 : 10.244.1.5 . 8080",
    ] {
        assert!(listing.contains(expected), "{expected} in\n{listing}");
    }
    assert!(new_web.blocks.is_empty());
}

#[test]
fn rendered_text_loads_with_nft() {
    netns::require_root();
    let ns = Netns::new("rndr").expect("namespace");
    let view = node_view(&TWO_ENDPOINTS);
    let planner = Planner::new(&view, &ProxySettings::default());
    let text = render(
        &planner.skeleton(),
        planner.services(&mut EndpointKeys::new()),
    );
    let path = std::env::temp_dir().join(format!("{}.nft", ns.name()));
    std::fs::write(&path, &text).expect("writing the ruleset");
    let loaded = ns.exec("nft", &["-f", path.to_str().expect("utf-8 path")]);
    let _ = std::fs::remove_file(&path);
    loaded.unwrap_or_else(|error| panic!("nft -f: {error}\n{text}"));

    // The same plan through netlink lists the same table in another namespace.
    let programmed = Netns::new("prog").expect("namespace");
    program(&programmed, &planner);
    assert_eq!(
        canonical(&list_table(&ns)),
        canonical(&list_table(&programmed))
    );
}

/// The listing as a sorted list of words: element order in hash sets, and the order of
/// anonymous set names, depend on the kernel, not on what was written.
fn canonical(listing: &str) -> Vec<String> {
    let mut words: Vec<String> = listing
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|word| !word.is_empty())
        .map(String::from)
        .collect();
    words.sort();
    words
}

/// Accepts `count` connections on `listener`, answering each "ping" with "pong", and
/// returns the peers.
fn serve(listener: &TcpListener, count: usize) -> Vec<SocketAddr> {
    (0..count)
        .map(|_| {
            let (mut stream, peer) = listener.accept().expect("accept");
            let mut request = [0; 4];
            stream.read_exact(&mut request).expect("read");
            stream.write_all(b"pong").expect("write");
            peer
        })
        .collect()
}

fn ping(address: &str) -> std::io::Result<[u8; 4]> {
    let address: SocketAddr = address.parse().expect("address");
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"ping")?;
    let mut reply = [0; 4];
    stream.read_exact(&mut reply)?;
    Ok(reply)
}

/// A client namespace reaches ClusterIPs and a NodePort of a node namespace whose only
/// endpoint is the node itself; a ClusterIP without endpoints is refused even though a
/// socket listens on its port.
#[test]
fn connections_reach_endpoints_and_empty_services_are_refused() {
    netns::require_root();
    let (node, client) = node_and_client();

    let view = node_view(&[("10.0.0.1", NODE)]);
    let planner = Planner::new(&view, &ProxySettings::default());
    program(&node, &planner);

    let (endpoint, decoy) = node
        .enter(|| {
            (
                TcpListener::bind("0.0.0.0:8080").expect("endpoint listener"),
                TcpListener::bind("0.0.0.0:80").expect("decoy listener"),
            )
        })
        .expect("entering the node");
    std::thread::scope(|scope| {
        let server = scope.spawn(|| serve(&endpoint, 2));
        let results = client
            .enter(|| {
                (
                    ping("10.96.0.10:80"),
                    ping("10.0.0.1:30080"),
                    ping("10.96.0.12:80"),
                )
            })
            .expect("entering the client");
        assert_eq!(results.0.expect("ClusterIP"), *b"pong");
        assert_eq!(results.1.expect("NodePort"), *b"pong");
        let refused = results
            .2
            .expect_err("a service without endpoints must refuse");
        assert_eq!(refused.kind(), ErrorKind::ConnectionRefused, "{refused}");
        let peers = server.join().expect("server thread");
        // Off-cluster ClusterIP traffic is marked for masquerade, but local delivery
        // never passes postrouting, so the client's address arrives unchanged.
        assert!(
            peers
                .iter()
                .all(|peer| peer.ip() == Ipv4Addr::new(10, 0, 0, 2))
        );
    });
    drop(decoy);
}

/// `dns.serve_cluster_dns_ip`: the node's own question to the cluster DNS ClusterIP is
/// redirected to its local listener with its source untouched. `services` marks ClusterIP
/// traffic from outside the pods for masquerade; the DNS chain takes the mark off again,
/// or `masquerade fully-random` in postrouting would give the question another source
/// port on its way through `lo`.
#[test]
fn the_hosts_cluster_dns_question_reaches_the_local_listener_unmasqueraded() {
    netns::require_root();
    let (node, _client) = node_and_client();

    let mut view = node_view(&[("10.0.0.1", NODE)]);
    let dns = json!({"clusterIP": "10.96.0.20",
                     "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]});
    let report = view.apply([service("kube-dns", dns, json!({}))]);
    assert!(report.invalid.is_empty(), "{:?}", report.invalid);
    let settings = ProxySettings {
        local_dns: Some(LocalDns {
            namespace: "default".into(),
            name: "kube-dns".into(),
            port: 5354,
        }),
        ..ProxySettings::default()
    };
    let planner = Planner::new(&view, &settings);
    program(&node, &planner);
    let listing = list_table(&node);
    assert!(
        listing.contains(
            "ip daddr @cluster-ips-v4 ip saddr != @pod-cidrs-v4 jump mark-for-masquerade"
        ),
        "the host's question is marked in `services`:\n{listing}"
    );

    let (peer, answer) = node
        .enter(|| {
            // A redirected local packet arrives at 127.0.0.1; the answer must leave from
            // there for conntrack to undo the redirect (nodus's DNS answers from the
            // address it was asked at).
            let listener = UdpSocket::bind("127.0.0.1:5354").expect("local DNS listener");
            listener
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let client = UdpSocket::bind("10.0.0.1:0").expect("client socket");
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            client.connect("10.96.0.20:53").expect("connect");
            client.send(b"question").expect("send");
            let mut buffer = [0; 16];
            let (length, peer) = listener.recv_from(&mut buffer).expect("the question");
            assert_eq!(&buffer[..length], b"question");
            listener.send_to(b"answer", peer).expect("reply");
            // The connected client takes the reply only from 10.96.0.20:53: the
            // redirect is undone on the way back.
            let length = client.recv(&mut buffer).expect("the answer");
            let source = client.local_addr().expect("client address");
            (
                (peer, source),
                String::from_utf8_lossy(&buffer[..length]).into_owned(),
            )
        })
        .expect("entering the node");
    assert_eq!(
        peer.0, peer.1,
        "the listener sees the question's own source"
    );
    assert_eq!(answer, "answer");
}
