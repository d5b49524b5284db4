//! The sync engine in the kernel, each test in fresh network namespaces with the
//! `Proxy` opened inside them: full and partial syncs, removal, adoption of an existing
//! table across a restart with an established TCP connection, repair after an outside
//! flush, and a conflicting service reported while the others are programmed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use nodus_proxy::apply::{Proxy, SyncKind, SyncReport, UDP_CLEANUP_PERIOD, cleanup};
use nodus_proxy::nft::Socket;
use nodus_proxy::plan::{EndpointKeys, Planner, ProxySettings, TableScope};
use nodus_testbed::netns::{self, Netns};
use nodus_testbed::scale::{self, Shape};

mod common;
use common::*;
use nodus_view::{ChangeSet, Kind, ServiceName, Update, View};
use serde_json::{Value as Json, json};

fn open_proxy(ns: &Netns) -> Proxy {
    ns.enter(|| Proxy::new(ProxySettings::default()).expect("proxy"))
        .expect("entering the namespace")
}

fn generation(ns: &Netns) -> u32 {
    ns.enter(|| {
        Socket::open()
            .expect("socket")
            .generation()
            .expect("generation")
    })
    .expect("entering the namespace")
}

/// The table's `listing` holds every line of `expected` and none of `gone`.
fn assert_listing(listing: &str, expected: &[&str], gone: &[&str]) {
    for expected in expected {
        assert!(listing.contains(expected), "{expected} in\n{listing}");
    }
    for gone in gone {
        assert!(!listing.contains(gone), "{gone} in\n{listing}");
    }
}

fn changed(services: &[&str]) -> ChangeSet {
    ChangeSet {
        services: services
            .iter()
            .map(|name| ServiceName {
                namespace: "default".into(),
                name: (*name).into(),
            })
            .collect(),
        ..ChangeSet::default()
    }
}

/// The text of the chain whose header contains `needle`, with rule handles
/// (`nft -a`), so that a rewritten chain shows new handles.
fn chain_block(ns: &Netns, needle: &str) -> String {
    let listing = ns
        .exec("nft", &["-a", "list", "table", "inet", "nodus"])
        .expect("nft -a list");
    let start = listing
        .lines()
        .position(|line| line.trim_start().starts_with("chain ") && line.contains(needle))
        .unwrap_or_else(|| panic!("no chain {needle} in\n{listing}"));
    listing
        .lines()
        .skip(start)
        .take_while(|line| line.trim() != "}")
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn full_then_partial_syncs_touch_only_what_changed() {
    netns::require_root();
    let ns = Netns::new("apfu").expect("namespace");
    let mut proxy = open_proxy(&ns);
    let view = node_view(&TWO_ENDPOINTS);
    let report = proxy.full_sync(&view).expect("full sync");
    assert_eq!(report.kind, SyncKind::Full);
    assert_eq!(report.added, 5, "{report:?}");
    assert!(report.refused.is_empty(), "{report:?}");
    let listing = list_table(&ns);
    assert_listing(
        &listing,
        &[
            "10.96.0.10 . tcp . 80 : goto dispatch-v4-n2-1f",
            "10.96.0.12 . tcp . 80 : goto reject-chain",
            "tcp . 30080 : goto external-",
            "10.96.0.10 . tcp . 80 . 1 : 10.244.2.9 . 8080",
        ],
        &[],
    );

    // One endpoint of `web` goes away: one transaction, `nodeport` untouched.
    let nodeport_before = chain_block(&ns, "/nodeport/");
    let before = generation(&ns);
    let later = node_view(&TWO_ENDPOINTS[..1]);
    let report = proxy
        .sync(&later, &changed(&["web", "nodeport"]))
        .expect("partial sync");
    assert_eq!(report.kind, SyncKind::Partial, "{report:?}");
    assert_eq!((report.updated, report.unchanged), (1, 1), "{report:?}");
    assert_eq!(report.transactions, 1);
    assert_eq!(generation(&ns), before.wrapping_add(1));
    assert_eq!(chain_block(&ns, "/nodeport/"), nodeport_before);
    let listing = list_table(&ns);
    assert!(
        !listing.contains("10.244.2.9"),
        "stale endpoint:\n{listing}"
    );
    // `web` moved to the map and chain of one endpoint in that transaction, and the map
    // and chain of two endpoints, which no port uses any more, went with it.
    assert_listing(
        &listing,
        &[
            "10.96.0.10 . tcp . 80 . 0 : 10.244.1.5 . 8080",
            "10.96.0.10 . tcp . 80 : goto dispatch-v4-n1-1f",
            "chain dispatch-v4-n1-1f {",
        ],
        &["endpoints-v4-n2-1f", "dispatch-v4-n2-1f"],
    );
    assert!(proxy.check(&later).expect("check").is_none());

    // Back to two endpoints: the map and chain of two are made again, those of one go.
    let report = proxy
        .sync(&view, &changed(&["web"]))
        .expect("partial sync back");
    assert_eq!(report.kind, SyncKind::Partial, "{report:?}");
    assert_eq!(report.transactions, 1, "{report:?}");
    let listing = list_table(&ns);
    assert_listing(
        &listing,
        &[
            "10.96.0.10 . tcp . 80 : goto dispatch-v4-n2-1f",
            "chain dispatch-v4-n2-1f {",
            "10.96.0.10 . tcp . 80 . 1 : 10.244.2.9 . 8080",
        ],
        &["endpoints-v4-n1-1f", "dispatch-v4-n1-1f"],
    );
    assert!(proxy.check(&view).expect("check").is_none());
    let report = proxy
        .sync(&later, &changed(&["web"]))
        .expect("partial sync to one again");
    assert_eq!(report.kind, SyncKind::Partial, "{report:?}");
    assert!(proxy.check(&later).expect("check").is_none());

    // Nothing changed: no transaction at all.
    let report = proxy.sync(&later, &changed(&["web"])).expect("no-op sync");
    assert_eq!((report.transactions, report.unchanged), (0, 1));

    // `empty` is deleted from the view.
    let mut without = node_view(&TWO_ENDPOINTS[..1]);
    let deleted = without.apply([Update::Deleted {
        kind: Kind::Service,
        namespace: "default".into(),
        name: "empty".into(),
    }]);
    assert!(deleted.invalid.is_empty());
    let report = proxy.sync(&without, &changed(&["empty"])).expect("removal");
    assert_eq!(report.removed, 1, "{report:?}");
    assert!(!list_table(&ns).contains("10.96.0.12"));

    assert!(ns.enter(cleanup).expect("enter").expect("cleanup"));
    assert!(ns.exec("nft", &["list", "table", "inet", "nodus"]).is_err());
}

/// The endpoint's listener on port 8080 in `ns`.
fn endpoint_listener(ns: &Netns) -> TcpListener {
    ns.enter(|| TcpListener::bind("0.0.0.0:8080").expect("endpoint listener"))
        .expect("entering the endpoint's namespace")
}

/// An echo server: every connection gets back what it sends, until it closes.
fn echo(listener: TcpListener) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buffer = [0; 64];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

fn connect(client: &Netns, address: &str) -> std::io::Result<TcpStream> {
    let address: SocketAddr = address.parse().expect("address");
    client
        .enter(|| {
            let stream = TcpStream::connect_timeout(&address, Duration::from_secs(3))?;
            stream.set_read_timeout(Some(Duration::from_secs(3)))?;
            Ok(stream)
        })
        .expect("entering the client")
}

fn round_trip(stream: &mut TcpStream, message: &[u8; 4]) -> std::io::Result<[u8; 4]> {
    stream.write_all(message)?;
    let mut reply = [0; 4];
    stream.read_exact(&mut reply)?;
    Ok(reply)
}

#[test]
fn a_restart_adopts_the_table_and_an_outside_flush_is_repaired() {
    netns::require_root();
    let (node, client) = node_and_client();
    echo(endpoint_listener(&node));
    let view = node_view(&[("10.0.0.1", NODE)]);
    let mut first = open_proxy(&node);
    first.full_sync(&view).expect("first full sync");

    let mut established = connect(&client, "10.96.0.10:80").expect("connect through the ClusterIP");
    assert_eq!(
        round_trip(&mut established, b"one!").expect("echo"),
        *b"one!"
    );

    // A new agent process: a second proxy adopts the table. Meanwhile someone flushed
    // the chain that DNATs to the endpoint.
    drop(first);
    let planner = Planner::new(&view, &ProxySettings::default());
    let endpoint_chain = planner
        .services(&mut EndpointKeys::new())
        .flat_map(|plan| plan.chains)
        .find(|chain| chain.name().starts_with("endpoint-"))
        .expect("an endpoint chain");
    node.exec(
        "nft",
        &["flush", "chain", "inet", "nodus", endpoint_chain.name()],
    )
    .expect("nft flush chain");
    let mut second = open_proxy(&node);
    let report = second.full_sync(&view).expect("adopting full sync");
    assert_eq!(report.added, 5, "{report:?}");
    // Every element is in place: each chain gets its key block back from its dispatch
    // rule, so nothing is left over and no element is sent, neither a service's nor one
    // of the skeleton's own sets (NodePort addresses, pod ranges: an interval set, whose
    // ranges the kernel lists as starts and ends). Of the services' chains only the
    // flushed one is written again: the others' rules are in place. The skeleton's
    // chains are rewritten.
    let skeleton = planner.skeleton();
    assert!(
        skeleton
            .own_sets()
            .any(|set| set.set.flags.interval && !set.elements.is_empty())
    );
    assert_eq!(report.leftovers_removed, 0, "{report:?}");
    assert_eq!(
        report.rules,
        skeleton.chains.iter().map(|c| c.rules.len()).sum::<usize>() + endpoint_chain.rules.len(),
        "{report:?}"
    );
    assert_eq!(report.elements, 0, "{report:?}");
    assert_eq!(
        round_trip(&mut established, b"two!").expect("echo after the restart"),
        *b"two!"
    );
    let mut again = connect(&client, "10.96.0.10:80").expect("a new connection");
    assert_eq!(round_trip(&mut again, b"new1").expect("echo"), *b"new1");
    assert!(
        second.check(&view).expect("check").is_none(),
        "nothing changed"
    );

    // Someone flushes our table: new connections fail until `check` repairs it.
    node.exec("nft", &["flush", "table", "inet", "nodus"])
        .expect("nft flush");
    assert!(
        connect(&client, "10.96.0.10:80")
            .and_then(|mut s| round_trip(&mut s, b"lost"))
            .is_err(),
        "a flushed table does not DNAT"
    );
    let repair = second.check(&view).expect("check").expect("a repair");
    assert_eq!(repair.kind, SyncKind::Full);
    let mut fresh = connect(&client, "10.96.0.10:80").expect("connect after the repair");
    assert_eq!(round_trip(&mut fresh, b"new!").expect("echo"), *b"new!");
    // Not asserted: in this test an outside `nft flush table` resets the established
    // connection itself, before any repair; adoption is what must keep it (above).
}

/// A restart that finds every service in place sends nothing for them, and has programmed
/// them all the same: its records are what the next partial sync compares with. (Its
/// transactions are empty: no chain, element or map declaration to send.)
#[test]
fn an_adoption_with_everything_in_place_records_every_service() {
    netns::require_root();
    let ns = Netns::new("apip").expect("namespace");
    // Generated services, without sets of their own (no affinity) for an adoption to
    // refill: nothing of theirs is sent again, also where three ports share a chain
    // and each dispatch rule must get its own key block back.
    for ports in [1, 3] {
        let shape = Shape {
            ports,
            ..Shape::new(40, 3, 3)
        };
        let mut view = View::new(&scale::node_name(0));
        scale::apply_in_pages(&mut view, scale::cluster(&shape)).expect("view");
        let mut first = open_proxy(&ns);
        let cold = first.full_sync(&view).expect("first run");
        assert!(cold.added > 1, "{cold:?}");
        drop(first);
        let mut second = open_proxy(&ns);
        let report = second.full_sync(&view).expect("adoption");
        assert_eq!(report.added, cold.added, "{report:?}");
        assert_eq!(report.elements, 0, "{ports} ports: {report:?}");
        // Only the skeleton's chains are written again.
        let skeleton = Planner::new(&view, &ProxySettings::default()).skeleton();
        let skeleton_rules: usize = skeleton.chains.iter().map(|c| c.rules.len()).sum();
        assert_eq!(report.rules, skeleton_rules, "{ports} ports: {report:?}");
        assert_eq!(second.programmed_services(), cold.added);
        assert!(ns.enter(cleanup).expect("enter").expect("cleanup"));
    }
}

/// The ports that dispatch by endpoint count keep no chain; a restart's adoption finds
/// their elements by run. A run another program cut short is written again whole, one
/// whose count changed meanwhile moves to the map of its new count, and the map and chain
/// of a count no port has any more go.
#[test]
fn port_runs_are_adopted_mended_and_moved_between_counts() {
    netns::require_root();
    let ns = Netns::new("aprn").expect("namespace");
    let mut first = open_proxy(&ns);
    first
        .full_sync(&node_view(&TWO_ENDPOINTS))
        .expect("first run");
    drop(first);
    let listing = list_table(&ns);
    assert!(
        listing.contains("10.96.0.10 . tcp . 80 : goto dispatch-v4-n2-1f"),
        "{listing}"
    );
    assert!(listing.contains("chain dispatch-v4-n2-1f {"), "{listing}");
    assert!(!listing.contains("/web/ipv4/tcp/http {"), "{listing}");

    // Another program deletes one of web's two endpoints from the map of count 2.
    ns.exec(
        "nft",
        &[
            "delete",
            "element",
            "inet",
            "nodus",
            "endpoints-v4-n2-1f",
            "{ 10.96.0.10 . tcp . 80 . 1 }",
        ],
    )
    .expect("an outside delete");
    let mut second = open_proxy(&ns);
    let report = second
        .full_sync(&node_view(&TWO_ENDPOINTS))
        .expect("mending run");
    assert!(report.refused.is_empty(), "{report:?}");
    // The run is deleted (its one element left) and written again whole.
    assert_eq!(report.elements, 1 + 2, "{report:?}");
    let listing = list_table(&ns);
    for endpoint in [
        "10.96.0.10 . tcp . 80 . 0 : 10.244.1.5 . 8080",
        "10.96.0.10 . tcp . 80 . 1 : 10.244.2.9 . 8080",
    ] {
        assert!(listing.contains(endpoint), "{endpoint} in\n{listing}");
    }
    drop(second);

    // Adopted in place: nothing is sent for web.
    let mut third = open_proxy(&ns);
    let report = third
        .full_sync(&node_view(&TWO_ENDPOINTS))
        .expect("adoption");
    assert_eq!(report.elements, 0, "{report:?}");
    drop(third);

    // One endpoint left during a restart: web moves to the map of count 1, and count 2
    // has no port any more.
    let mut fourth = open_proxy(&ns);
    let report = fourth
        .full_sync(&node_view(&TWO_ENDPOINTS[..1]))
        .expect("a run with one endpoint");
    assert!(report.refused.is_empty(), "{report:?}");
    let listing = list_table(&ns);
    assert!(
        listing.contains("10.96.0.10 . tcp . 80 : goto dispatch-v4-n1-1f"),
        "{listing}"
    );
    assert!(
        listing.contains("10.96.0.10 . tcp . 80 . 0 : 10.244.1.5 . 8080"),
        "{listing}"
    );
    assert!(!listing.contains("endpoints-v4-n2-1f"), "{listing}");
    assert!(!listing.contains("dispatch-v4-n2-1f"), "{listing}");
    assert!(!listing.contains("10.244.2.9"), "{listing}");
    assert!(ns.enter(cleanup).expect("enter").expect("cleanup"));
}

#[test]
fn leftovers_of_a_previous_run_are_removed() {
    netns::require_root();
    let ns = Netns::new("aplo").expect("namespace");
    let mut first = open_proxy(&ns);
    first
        .full_sync(&node_view(&TWO_ENDPOINTS))
        .expect("first run");
    drop(first);
    // An older layout kept a map named like each dispatch chain; the chain stays wanted,
    // the map must go.
    let old_chain = list_table(&ns)
        .lines()
        .find_map(|line| {
            let name = line.trim().strip_prefix("chain ")?.trim_end_matches(" {");
            (name.starts_with("service-") && name.ends_with("/nodeport/ipv4/tcp/http"))
                .then(|| name.to_string())
        })
        .expect("nodeport's dispatch chain");
    ns.exec(
        "nft",
        &[
            "add",
            "map",
            "inet",
            "nodus",
            &old_chain,
            "{ typeof numgen random mod 2 : ip daddr . th dport ; }",
        ],
    )
    .expect("an old-layout map");
    // The next run sees `web` with one endpoint left and no `empty`.
    let mut view = node_view(&TWO_ENDPOINTS[..1]);
    view.apply([Update::Deleted {
        kind: Kind::Service,
        namespace: "default".into(),
        name: "empty".into(),
    }]);
    let mut second = open_proxy(&ns);
    let report = second.full_sync(&view).expect("second run");
    assert_eq!(report.added, 4, "{report:?}");
    // The two elements of `empty`; web's two endpoints in the map of count 2, which no
    // port has any more, that map and its dispatch chain; and the old-layout map.
    assert_eq!(report.leftovers_removed, 2 + 2 + 1 + 1 + 1, "{report:?}");
    let listing = list_table(&ns);
    assert!(
        listing.contains(&format!("chain {old_chain} {{")),
        "{listing}"
    );
    assert!(
        !listing.contains(&format!("map {old_chain} {{")),
        "{listing}"
    );
    assert!(!listing.contains("10.244.2.9"), "{listing}");
    assert!(!listing.contains("10.96.0.12"), "{listing}");
    assert!(!listing.contains("dispatch-v4-n2-1f"), "{listing}");
    assert!(
        listing.contains("10.96.0.10 . tcp . 80 . 0 : 10.244.1.5 . 8080"),
        "{listing}"
    );
}

/// A listener on `port` in `ns` that greets every connection with `greeting`, then
/// closes it: which service a connection reached.
fn greeter(ns: &Netns, port: u16, greeting: &'static str) {
    let listener = ns
        .enter(|| TcpListener::bind(("0.0.0.0", port)).expect("greeter"))
        .expect("entering the endpoint's namespace");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(greeting.as_bytes());
        }
    });
}

fn greeting(client: &Netns, address: &str) -> String {
    let mut stream = connect(client, address).unwrap_or_else(|error| panic!("{address}: {error}"));
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("greeting");
    text
}

/// F.40 with two Services claiming one ExternalIP and port: the older one owns that
/// address and port, whatever the names or the view's order; the younger keeps its
/// ClusterIP and everything else, and takes the address over when the older one goes.
#[test]
fn an_external_ip_claimed_twice_goes_to_the_older_service_only() {
    netns::require_root();
    let (node, client) = node_and_client();
    client
        .ip(&["route", "add", "192.0.2.0/24", "via", "10.0.0.1"])
        .expect("route to the external IP");
    greeter(&node, 8080, "older");
    greeter(&node, 8081, "younger");
    let claim = |name: &str, created: &str, cluster_ip: &str| {
        Update::Service(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
                "spec": http(json!({"clusterIP": cluster_ip, "externalIPs": ["192.0.2.10"]})),
            }))
            .expect("test service"),
        )
    };
    let mut view = node_view(&TWO_ENDPOINTS);
    // By name the younger would come first.
    let applied = view.apply([
        claim("claim-b", "2020-01-01T00:00:00Z", "10.96.0.20"),
        slice("claim-b", "IPv4", &[("10.0.0.1", NODE)], 8080),
        claim("claim-a", "2025-01-01T00:00:00Z", "10.96.0.21"),
        slice("claim-a", "IPv4", &[("10.0.0.1", NODE)], 8081),
    ]);
    assert!(applied.invalid.is_empty());
    let mut proxy = open_proxy(&node);
    let report = proxy.full_sync(&view).expect("full sync");
    assert!(report.refused.is_empty(), "{report:?}");
    assert_eq!(greeting(&client, "10.96.0.20:80"), "older");
    assert_eq!(greeting(&client, "10.96.0.21:80"), "younger");
    assert_eq!(greeting(&client, "192.0.2.10:80"), "older");

    // The older one goes: the younger is re-planned with it and takes the address.
    let deleted = view.apply([Update::Deleted {
        kind: Kind::Service,
        namespace: "default".into(),
        name: "claim-b".into(),
    }]);
    let report = proxy.sync(&view, &deleted.changes).expect("sync");
    assert_eq!((report.removed, report.updated), (1, 1), "{report:?}");
    assert_eq!(greeting(&client, "192.0.2.10:80"), "younger");
}

/// The chains, sets and maps of the table, sorted.
fn table_objects(ns: &Netns) -> Vec<String> {
    let mut objects: Vec<String> = list_table(ns)
        .lines()
        .map(str::trim)
        .filter(|line| {
            ["chain ", "set ", "map "]
                .iter()
                .any(|k| line.starts_with(k))
        })
        .map(|line| line.trim_end_matches(" {").to_string())
        .collect();
    objects.sort_unstable();
    objects
}

/// With the proxy off and the mesh on (beside kube-proxy), the table holds only the
/// egress masquerade; restarts adopt it, and a node switched between that and the full
/// proxy, without `nodus cleanup`, keeps only what its scope programs.
#[test]
fn an_egress_only_table_is_adopted_and_switches_with_the_proxy() {
    netns::require_root();
    let ns = Netns::new("apeg").expect("namespace");
    let view = node_view(&TWO_ENDPOINTS);
    let egress_only = ProxySettings {
        scope: TableScope::EgressOnly,
        egress_masquerade: true,
        ..ProxySettings::default()
    };
    let services = ProxySettings {
        egress_masquerade: true,
        ..ProxySettings::default()
    };
    let full_sync = |config: &ProxySettings| {
        let config = config.clone();
        ns.enter(|| Proxy::new(config).expect("proxy").full_sync(&view))
            .expect("entering the namespace")
            .expect("full sync")
    };
    let egress_objects = [
        "chain masquerading",
        "chain nat-postrouting",
        "set cluster-cidrs-v4",
        "set cluster-cidrs-v6",
        "set pod-cidrs-v4",
        "set pod-cidrs-v6",
    ];

    assert_eq!(full_sync(&egress_only).added, 0);
    assert_eq!(table_objects(&ns), egress_objects);
    // A restart adopts it (the service proxy's shared maps are missing, not an error).
    let report = full_sync(&egress_only);
    assert_eq!(
        (report.added, report.leftovers_removed),
        (0, 0),
        "{report:?}"
    );
    assert_eq!(table_objects(&ns), egress_objects);

    // The proxy turned on: services join the masquerade.
    assert_eq!(full_sync(&services).added, 5);
    let listing = list_table(&ns);
    assert!(
        listing.contains("10.96.0.10 . tcp . 80 : goto dispatch-v4-n2-1f"),
        "{listing}"
    );
    assert!(listing.contains("daddr != @cluster-cidrs-v4"), "{listing}");

    // And off again: every service chain, map and filter hook goes.
    let report = full_sync(&egress_only);
    assert!(report.leftovers_removed > 0, "{report:?}");
    assert_eq!(table_objects(&ns), egress_objects);
}

/// A partial sync the kernel refuses rolls back, so the blocks it released are still in
/// use; the full sync that follows must not hand them to another chain. `twin` is chosen
/// so that its dispatch chain shares `web`'s endpoint map and block size: `web` grows out
/// of its block in the refused transaction, and `twin` must not land on it afterwards.
/// Each service has an ExternalIP, so that its port keeps a dispatch chain and a block.
#[test]
fn a_refused_partial_sync_leaves_every_block_to_its_own_service() {
    netns::require_root();
    let ns = Netns::new("aprf").expect("namespace");
    let config = ProxySettings::default();
    let chained = |name: &str, cluster_ip: &str, external_ip: &str| {
        service(
            name,
            http(json!({"clusterIP": cluster_ip, "externalIPs": [external_ip]})),
            json!({}),
        )
    };
    let web_view = |endpoints: &[(&str, &str)]| {
        let mut view = node_view(endpoints);
        view.apply([chained("web", "10.96.0.10", "192.0.2.10")]);
        view
    };
    let block_map = |view: &View, name: &str| {
        Planner::new(view, &config)
            .service("default", name, &mut EndpointKeys::new().lease(&[]))
            .blocks
            .first()
            .map(|block| block.map)
    };
    let twin_of = |name: &str| {
        [
            chained(name, "10.96.0.30", "192.0.2.30"),
            slice(
                name,
                "IPv4",
                &[("10.244.1.30", NODE), ("10.244.1.31", NODE)],
                8080,
            ),
        ]
    };
    let web_map = block_map(&web_view(&TWO_ENDPOINTS), "web");
    assert!(web_map.is_some());
    let twin = (0..)
        .map(|i| format!("twin-{i}"))
        .find(|name| {
            let mut view = web_view(&TWO_ENDPOINTS);
            view.apply(twin_of(name));
            block_map(&view, name) == web_map
        })
        .expect("a name in web's endpoint map");
    // Two Services with one ClusterIP, which the API server prevents but a view may
    // still hold: the second one's key is refused by the kernel.
    let claim = |name: &str, external_ip: &str, pod: &str| {
        [
            chained(name, "10.96.0.20", external_ip),
            slice(name, "IPv4", &[(pod, NODE)], 8080),
        ]
    };
    let mut before = web_view(&TWO_ENDPOINTS);
    before.apply(twin_of(&twin));
    before.apply(claim("claim-a", "192.0.2.20", "10.244.1.20"));
    let mut proxy = open_proxy(&ns);
    let report = proxy.full_sync(&before).expect("full sync");
    assert!(report.refused.is_empty(), "{report:?}");

    // `web` grows from two endpoints to three; `claim-b` claims claim-a's ClusterIP, which
    // the kernel refuses in the partial transaction.
    let mut after = web_view(&[
        ("10.244.1.5", NODE),
        ("10.244.1.6", NODE),
        ("10.244.2.9", "node-b"),
    ]);
    after.apply(twin_of(&twin));
    after.apply(claim("claim-a", "192.0.2.20", "10.244.1.20"));
    after.apply(claim("claim-b", "192.0.2.21", "10.244.1.21"));
    let report = proxy
        .sync(&after, &changed(&["web", "claim-b"]))
        .expect("sync");
    assert_eq!(report.kind, SyncKind::Full, "{report:?}");
    assert!(report.fell_back.is_some(), "{report:?}");
    let refused: Vec<&str> = report
        .refused
        .iter()
        .map(|r| r.service.name.as_str())
        .collect();
    assert_eq!(refused.len(), 1, "{report:?}");

    let targets = dispatch_targets(&list_table(&ns));
    assert_eq!(
        targets_of(&targets, "default/web/"),
        [
            "10.244.1.5 . 8080",
            "10.244.1.6 . 8080",
            "10.244.2.9 . 8080"
        ]
    );
    assert_eq!(
        targets_of(&targets, &format!("default/{twin}/")),
        ["10.244.1.30 . 8080", "10.244.1.31 . 8080"]
    );
    let winner = if refused[0] == "claim-a" {
        "claim-b"
    } else {
        "claim-a"
    };
    assert_eq!(
        targets_of(&targets, &format!("default/{winner}/")).len(),
        1,
        "{targets:#?}"
    );
}

/// This node's object changes all the time in ways the ruleset ignores (nodus's own
/// WireGuard key annotation, heartbeats, conditions): a partial sync, not a full one. Its
/// zone is a fact the ruleset depends on (topology, B.18): a full sync.
#[test]
fn an_annotation_on_this_node_causes_no_full_sync_but_a_new_zone_does() {
    netns::require_root();
    let ns = Netns::new("apan").expect("namespace");
    let mut proxy = open_proxy(&ns);
    let mut view = node_view(&TWO_ENDPOINTS);
    proxy.full_sync(&view).expect("full sync");
    let this_node = |annotations: Json, labels: Json| {
        Update::Node(
            serde_json::from_value(json!({
                "metadata": {"name": NODE, "annotations": annotations, "labels": labels},
                "spec": {"podCIDRs": ["10.244.1.0/24", "fd00:244:1::/64"]},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                         {"type": "InternalIP", "address": "fd00::1"}]}
            }))
            .expect("this node"),
        )
    };
    let annotated = view.apply([this_node(
        json!({"nodus.dev/wireguard-public-key": "nHhJ7Xb0zWIvzHMM2iqMYMaqfR4gPHSZXvSlPLDbAno="}),
        json!({}),
    )]);
    assert!(annotated.changes.this_node, "the view saw this node change");
    let report = proxy.sync(&view, &annotated.changes).expect("sync");
    assert_eq!(report.kind, SyncKind::Partial, "{report:?}");
    assert_eq!(report.fell_back, None);
    assert_eq!(report.transactions, 0, "nothing to program: {report:?}");

    let moved = view.apply([this_node(
        json!({"nodus.dev/wireguard-public-key": "nHhJ7Xb0zWIvzHMM2iqMYMaqfR4gPHSZXvSlPLDbAno="}),
        json!({"topology.kubernetes.io/zone": "zone-b"}),
    )]);
    let report = proxy.sync(&view, &moved.changes).expect("sync");
    assert_eq!(report.kind, SyncKind::Full, "{report:?}");
}

/// Another program's commits to its own table (firewalld, Docker, a policy engine) cost
/// no full sync: the check reads our table back and finds it intact. An `nft flush` of
/// our table is repaired, also when our own partial syncs committed after it (their
/// generations no longer follow ours directly).
#[test]
fn another_programs_commit_costs_no_repair_but_a_flush_amid_churn_is_repaired() {
    netns::require_root();
    let ns = Netns::new("apoc").expect("namespace");
    let mut proxy = open_proxy(&ns);
    let view = node_view(&TWO_ENDPOINTS);
    proxy.full_sync(&view).expect("full sync");
    assert!(proxy.check(&view).expect("check").is_none());

    ns.exec("nft", &["add", "table", "inet", "other"])
        .expect("another table");
    ns.exec("nft", &["add", "chain", "inet", "other", "input"])
        .expect("another chain");
    assert!(
        proxy.check(&view).expect("check").is_none(),
        "another program's commits are not ours to repair"
    );
    assert!(proxy.check(&view).expect("check").is_none());

    ns.exec("nft", &["flush", "table", "inet", "nodus"])
        .expect("nft flush");
    let churned = node_view(&TWO_ENDPOINTS[..1]);
    let report = proxy
        .sync(&churned, &changed(&["web"]))
        .expect("partial sync");
    assert_eq!(report.kind, SyncKind::Partial, "{report:?}");
    let repair = proxy
        .check(&churned)
        .expect("check")
        .expect("the flush is found and repaired");
    assert_eq!(repair.kind, SyncKind::Full);
    let listing = list_table(&ns);
    assert!(
        listing.contains("10.96.0.10 . tcp . 80 : goto dispatch-v4-n1-1f"),
        "{listing}"
    );
    assert!(proxy.check(&churned).expect("check").is_none());
}

/// Two `externalTrafficPolicy: Local` NodePorts backed by one endpoint on this node want
/// the same hairpin pairs (the endpoint, itself, the node's address): both are
/// programmed, the endpoint reaches itself through either, and deleting one leaves the
/// other's pairs in place. The client namespace is the endpoint here, so its connection
/// to a ClusterIP comes back to it and works only if it is masqueraded.
#[test]
fn services_sharing_a_hairpin_endpoint_are_both_programmed_and_keep_their_pairs() {
    netns::require_root();
    let (node, client) = node_and_client();
    node.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])
        .expect("forwarding on the node");
    echo(endpoint_listener(&client));
    let mut view = node_view(&TWO_ENDPOINTS);
    let local_nodeport = |name: &str, cluster_ip: &str, node_port: u16| {
        service(
            name,
            http(json!({
                "type": "NodePort", "clusterIP": cluster_ip, "externalTrafficPolicy": "Local",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": node_port}]
            })),
            json!({}),
        )
    };
    let applied = view.apply([
        local_nodeport("pair-a", "10.96.0.40", 30140),
        slice("pair-a", "IPv4", &[("10.0.0.2", NODE)], 8080),
        local_nodeport("pair-b", "10.96.0.41", 30141),
        slice("pair-b", "IPv4", &[("10.0.0.2", NODE)], 8080),
    ]);
    assert!(applied.invalid.is_empty());
    let mut proxy = open_proxy(&node);
    let report = proxy.full_sync(&view).expect("full sync");
    assert!(report.refused.is_empty(), "{report:?}");
    for address in ["10.96.0.40:80", "10.96.0.41:80"] {
        let mut stream = connect(&client, address)
            .unwrap_or_else(|error| panic!("hairpin through {address}: {error}"));
        assert_eq!(round_trip(&mut stream, b"self").expect("echo"), *b"self");
    }

    // `pair-a` goes: its pairs are `pair-b`'s too, so they stay and `pair-b` hairpins.
    let applied = view.apply([Update::Deleted {
        kind: Kind::Service,
        namespace: "default".into(),
        name: "pair-a".into(),
    }]);
    let report = proxy.sync(&view, &applied.changes).expect("partial sync");
    assert_eq!(report.removed, 1, "{report:?}");
    let listing = list_table(&node);
    assert!(
        listing.contains("10.0.0.2 . 10.0.0.2 . 10.0.0.1"),
        "{listing}"
    );
    assert!(!listing.contains("10.96.0.40"), "{listing}");
    let mut stream = connect(&client, "10.96.0.41:80").expect("hairpin after the delete");
    assert_eq!(round_trip(&mut stream, b"more").expect("echo"), *b"more");

    // The last one goes: so do the pairs.
    let applied = view.apply([Update::Deleted {
        kind: Kind::Service,
        namespace: "default".into(),
        name: "pair-b".into(),
    }]);
    proxy.sync(&view, &applied.changes).expect("partial sync");
    let listing = list_table(&node);
    assert!(!listing.contains("10.0.0.2 . 10.0.0.2"), "{listing}");
}

/// The host (and host-network pods) reach an `externalTrafficPolicy: Local` ExternalIP
/// whose endpoints are all on other nodes: the short-circuit for local sources sends it
/// to a remote endpoint, and no check before DNAT drops it (kubernetes#131765). Traffic
/// from outside to the same address is still dropped, as no endpoint is local.
#[test]
fn the_host_reaches_a_local_policy_external_ip_served_by_other_nodes() {
    netns::require_root();
    let (node, client) = node_and_client();
    node.ip(&["route", "add", "192.0.2.0/24", "dev", "eth0"])
        .expect("route to the external address");
    echo(endpoint_listener(&client));
    let mut view = node_view(&TWO_ENDPOINTS);
    let applied = view.apply([
        service(
            "remote",
            http(
                json!({"clusterIP": "10.96.0.50", "externalIPs": ["192.0.2.50"],
                        "externalTrafficPolicy": "Local"}),
            ),
            json!({}),
        ),
        // The endpoint is the client namespace, on another node.
        slice("remote", "IPv4", &[("10.0.0.2", "node-b")], 8080),
    ]);
    assert!(applied.invalid.is_empty());
    let mut proxy = open_proxy(&node);
    let report = proxy.full_sync(&view).expect("full sync");
    assert!(report.refused.is_empty(), "{report:?}");
    let mut stream = connect(&node, "192.0.2.50:80").expect("the host to the ExternalIP");
    assert_eq!(round_trip(&mut stream, b"host").expect("echo"), *b"host");
    let listing = list_table(&node);
    assert!(
        listing.contains("192.0.2.50 . tcp . 80 : drop"),
        "external clients are still dropped here: {listing}"
    );
}

/// A Service labelled `service.kubernetes.io/service-proxy-name` belongs to another
/// proxy even when the label's value is empty (upstream selects on the key alone), and one
/// labelled `service.kubernetes.io/headless` is left to no proxy (kube-proxy's informers
/// select both out; the upstream e2e spec "Services should implement
/// service.kubernetes.io/headless" checks the second): its ClusterIP is not DNATed, while
/// an unlabelled twin is.
#[test]
fn a_service_for_another_proxy_or_labelled_headless_is_left_alone() {
    netns::require_root();
    for label in [
        "service.kubernetes.io/service-proxy-name",
        "service.kubernetes.io/headless",
    ] {
        let (node, client) = node_and_client();
        echo(endpoint_listener(&node));
        let _decoy = node
            .enter(|| TcpListener::bind("10.96.0.60:80").expect("decoy listener"))
            .expect("entering the node");
        let labelled = Update::Service(
            serde_json::from_value(json!({
                "metadata": {"name": "elsewhere", "namespace": "default",
                             "labels": {label: ""}},
                "spec": http(json!({"clusterIP": "10.96.0.60"})),
            }))
            .expect("test service"),
        );
        let mut view = node_view(&TWO_ENDPOINTS);
        let applied = view.apply([
            labelled,
            slice("elsewhere", "IPv4", &[("10.0.0.1", NODE)], 8080),
            service("here", http(json!({"clusterIP": "10.96.0.61"})), json!({})),
            slice("here", "IPv4", &[("10.0.0.1", NODE)], 8080),
        ]);
        assert!(applied.invalid.is_empty());
        let mut proxy = open_proxy(&node);
        proxy.full_sync(&view).expect("full sync");
        let mut here = connect(&client, "10.96.0.61:80").expect("the unlabelled twin");
        assert_eq!(round_trip(&mut here, b"here").expect("echo"), *b"here");
        // Not DNATed: the connection lands on the decoy, which never answers.
        let mut elsewhere = connect(&client, "10.96.0.60:80").expect("the decoy accepts");
        assert!(round_trip(&mut elsewhere, b"gone").is_err(), "{label}");
        assert!(!list_table(&node).contains("10.96.0.60"), "{label}");
    }
}

/// An IP reused by a new, ready pod on another node while the old pod, on this node, is
/// stuck terminating: two slices list it, and the ready copy is the one served (the local,
/// terminating one would leave the service without endpoints: refused).
#[test]
fn of_two_copies_of_an_endpoint_the_ready_one_is_served() {
    netns::require_root();
    let (node, client) = node_and_client();
    echo(endpoint_listener(&node));
    let copy = |slice: &str, node_name: &str, ready: bool| {
        Update::EndpointSlice(
            serde_json::from_value(json!({
                "metadata": {"name": slice, "namespace": "default",
                             "labels": {"kubernetes.io/service-name": "reused"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": node_name,
                               "conditions": {"ready": ready, "serving": ready,
                                              "terminating": !ready}}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
            }))
            .expect("test slice"),
        )
    };
    let mut view = node_view(&TWO_ENDPOINTS);
    let applied = view.apply([
        service(
            "reused",
            http(json!({"clusterIP": "10.96.0.70"})),
            json!({}),
        ),
        copy("reused-old", NODE, false),
        copy("reused-new", "node-b", true),
    ]);
    assert!(applied.invalid.is_empty());
    let mut proxy = open_proxy(&node);
    proxy.full_sync(&view).expect("full sync");
    let mut stream = connect(&client, "10.96.0.70:80").expect("the ready copy");
    assert_eq!(round_trip(&mut stream, b"live").expect("echo"), *b"live");
}

/// One bad entry in a Service's lists costs that entry, not the Service: an unparsable
/// ExternalIP is left out while the ClusterIP and the LB IP work, and a source range
/// written with leading zeros (as API servers before 1.33 stored them) is read as decimal.
#[test]
fn a_bad_list_entry_leaves_the_rest_of_the_service_working() {
    netns::require_root();
    let (node, client) = node_and_client();
    client
        .ip(&["route", "add", "203.0.113.0/24", "via", "10.0.0.1"])
        .expect("route to the LB IP");
    echo(endpoint_listener(&node));
    let mut view = node_view(&TWO_ENDPOINTS);
    let applied = view.apply([
        service(
            "sloppy",
            http(json!({
                "type": "LoadBalancer", "clusterIP": "10.96.0.80",
                "externalIPs": ["192.0.2.80", "not-an-ip"],
                "loadBalancerSourceRanges": ["010.000.000.000/8"],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30180}]
            })),
            json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.80"}]}}),
        ),
        slice("sloppy", "IPv4", &[("10.0.0.1", NODE)], 8080),
    ]);
    assert_eq!(applied.invalid.len(), 1, "reported: {:?}", applied.invalid);
    assert!(applied.invalid[0].reason.contains("not-an-ip"));
    let mut proxy = open_proxy(&node);
    let report = proxy.full_sync(&view).expect("full sync");
    assert!(report.refused.is_empty(), "{report:?}");
    for address in ["10.96.0.80:80", "203.0.113.80:80"] {
        let mut stream =
            connect(&client, address).unwrap_or_else(|error| panic!("{address}: {error}"));
        assert_eq!(round_trip(&mut stream, b"rest").expect("echo"), *b"rest");
    }
    assert!(list_table(&node).contains("192.0.2.80 . tcp . 80"));
}

/// `internalTrafficPolicy: Local` ClusterIP traffic from outside the pod network is
/// masqueraded as under the Cluster policy (upstream's internal traffic chain), so the
/// local endpoint, in a pod namespace of its own, sees the node's address.
#[test]
fn local_internal_policy_traffic_from_outside_the_pods_is_masqueraded() {
    netns::require_root();
    let (node, client) = node_and_client();
    let pod = pod_on(&node, "appd", "10.244.1.9");
    let listener = endpoint_listener(&pod);
    let mut view = node_view(&TWO_ENDPOINTS);
    let applied = view.apply([
        service(
            "node-local",
            http(json!({"clusterIP": "10.96.0.90", "internalTrafficPolicy": "Local"})),
            json!({}),
        ),
        slice("node-local", "IPv4", &[("10.244.1.9", NODE)], 8080),
    ]);
    assert!(applied.invalid.is_empty());
    let mut proxy = open_proxy(&node);
    proxy.full_sync(&view).expect("full sync");
    std::thread::scope(|scope| {
        let server = scope.spawn(|| listener.accept().map(|(_, peer)| peer.ip()));
        let _stream = connect(&client, "10.96.0.90:80").expect("through the ClusterIP");
        let peer = server.join().expect("server thread").expect("accept");
        assert_eq!(peer.to_string(), "10.244.1.1", "masqueraded to the node");
    });
}

/// A UDP responder at `address` in `ns` that answers every datagram with `name`.
fn udp_responder(ns: &Netns, address: &str, name: &'static str) {
    let socket = ns
        .enter(|| UdpSocket::bind(address).expect("UDP responder"))
        .expect("entering the endpoint's namespace");
    std::thread::spawn(move || {
        let mut buffer = [0; 64];
        while let Ok((_, peer)) = socket.recv_from(&mut buffer) {
            if socket.send_to(name.as_bytes(), peer).is_err() {
                return;
            }
        }
    });
}

/// Who answers a datagram from the client's `source_port` to `service`: the same source
/// port is the same flow, and the same conntrack entry.
fn udp_ask(client: &Netns, source_port: u16, service: &str) -> String {
    client
        .enter(|| {
            let socket = UdpSocket::bind(("10.0.0.2", source_port)).expect("client socket");
            socket
                .set_read_timeout(Some(Duration::from_secs(2)))
                .expect("read timeout");
            socket.send_to(b"who", service).expect("send");
            let mut buffer = [0; 64];
            match socket.recv(&mut buffer) {
                Ok(n) => String::from_utf8_lossy(&buffer[..n]).into_owned(),
                Err(error) => format!("no answer: {error}"),
            }
        })
        .expect("entering the client's namespace")
}

/// I.53 as upstream's conntrack cleanup: a UDP flow stays on an endpoint that is
/// terminating but still serving (new flows go to the ready one), and a restarted proxy
/// deletes the entries that the previous process left pinned to an endpoint that is gone.
/// The cleanup dumps the table and deletes entries by their exact tuple, which every
/// kernel supports (the filtered delete it replaced needs Linux 6.3). A sync less than a
/// second after the last cleanup leaves its own for later, when the proxy says it is due.
#[test]
#[allow(clippy::too_many_lines, reason = "one story, in the order it happens")]
fn udp_flows_stay_on_serving_endpoints_and_a_restart_unpins_the_others() {
    netns::require_root();
    let (node, client) = node_and_client();
    for address in ["10.244.1.5/32", "10.244.1.6/32"] {
        node.ip(&["addr", "add", address, "dev", "lo"])
            .expect("endpoint address");
    }
    udp_responder(&node, "10.244.1.5:5353", "a");
    udp_responder(&node, "10.244.1.6:5353", "b");
    let dns_slice = |endpoints: Json| {
        Update::EndpointSlice(
            serde_json::from_value(json!({
                "metadata": {"name": "dns-1", "namespace": "default",
                             "labels": {"kubernetes.io/service-name": "dns"}},
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}]
            }))
            .expect("test slice"),
        )
    };
    let endpoint = |ip: &str, ready: bool| {
        json!({"addresses": [ip], "nodeName": NODE,
               "conditions": {"ready": ready, "serving": true, "terminating": !ready}})
    };
    let mut view = node_view(&TWO_ENDPOINTS);
    let applied = view.apply([
        service(
            "dns",
            json!({"clusterIP": "10.96.0.100",
                   "ports": [{"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]}),
            json!({}),
        ),
        dns_slice(json!([endpoint("10.244.1.5", true)])),
    ]);
    assert!(applied.invalid.is_empty());
    let mut proxy = open_proxy(&node);
    let cleaned = Instant::now();
    proxy.full_sync(&view).expect("full sync");
    assert_eq!(udp_ask(&client, 40000, "10.96.0.100:53"), "a");

    // The cleanup a UDP change owes: at once when the last was a second ago or more, else
    // when the proxy says it is due (the run loop wakes it then), against the view then.
    let cleanup_of = |proxy: &mut Proxy, report: &SyncReport, view: &View, since: Instant| {
        if let Some(cleanup) = report.udp_cleanup {
            assert!(since.elapsed() >= UDP_CLEANUP_PERIOD, "{report:?}");
            assert!(cleanup.took <= report.duration, "{report:?}");
            return cleanup;
        }
        let due = proxy.udp_cleanup_due().expect("a cleanup left for later");
        assert!(due <= since + UDP_CLEANUP_PERIOD + Duration::from_millis(100));
        assert_eq!(proxy.clean_udp_flows(view), None, "not yet due");
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let cleanup = proxy.clean_udp_flows(view).expect("due now");
        assert_eq!(proxy.udp_cleanup_due(), None, "{cleanup:?}");
        cleanup
    };

    // `a` terminates while still serving, `b` is ready: the flow stays, new ones move.
    view.apply([dns_slice(json!([
        endpoint("10.244.1.5", false),
        endpoint("10.244.1.6", true)
    ]))]);
    let report = proxy.sync(&view, &changed(&["dns"])).expect("sync");
    let cleanup = cleanup_of(&mut proxy, &report, &view, cleaned);
    assert_eq!(cleanup.deletions, 0, "{cleanup:?}");
    assert_eq!(udp_ask(&client, 40000, "10.96.0.100:53"), "a", "kept");
    // A change of TCP services only has no UDP flow to clean up.
    view.apply([slice("web", "IPv4", &TWO_ENDPOINTS[..1], 8080)]);
    let report = proxy.sync(&view, &changed(&["web"])).expect("sync");
    assert!(
        report.updated == 1 && report.udp_cleanup.is_none(),
        "{report:?}"
    );
    assert_eq!(proxy.udp_cleanup_due(), None);
    assert_eq!(udp_ask(&client, 40001, "10.96.0.100:53"), "b", "a new flow");

    // nodus restarts while `a` goes: the new process deletes the flow it cannot know of.
    drop(proxy);
    view.apply([dns_slice(json!([endpoint("10.244.1.6", true)]))]);
    let mut proxy = open_proxy(&node);
    let cleaned = Instant::now();
    let report = proxy.full_sync(&view).expect("adoption");
    let cleanup = report.udp_cleanup.expect("a full sync cleans up at once");
    assert_eq!(cleanup.deletions, 1, "{report:?}");
    assert_eq!(udp_ask(&client, 40000, "10.96.0.100:53"), "b", "unpinned");

    // Then `b` goes and `a` is back: until its cleanup the flows stay pinned to `b`, and
    // it deletes both (40000's and 40001's).
    view.apply([dns_slice(json!([endpoint("10.244.1.5", true)]))]);
    let report = proxy.sync(&view, &changed(&["dns"])).expect("sync");
    if report.udp_cleanup.is_none() {
        assert_eq!(udp_ask(&client, 40000, "10.96.0.100:53"), "b", "not yet");
    }
    let cleanup = cleanup_of(&mut proxy, &report, &view, cleaned);
    assert_eq!(cleanup.deletions, 2, "{cleanup:?}");
    assert_eq!(udp_ask(&client, 40000, "10.96.0.100:53"), "a", "unpinned");
}

/// A pod namespace `name` on `node` at `address` in 10.244.1.0/24, routed through the
/// node (10.244.1.1), which forwards.
fn pod_on(node: &Netns, name: &str, address: &str) -> Netns {
    let pod = Netns::new(name).expect("pod namespace");
    netns::veth(node, "pod0", &pod, "eth0").expect("pod veth");
    node.ip(&["addr", "add", "10.244.1.1/24", "dev", "pod0"])
        .expect("node's pod-side address");
    pod.ip(&["addr", "add", &format!("{address}/24"), "dev", "eth0"])
        .expect("pod address");
    pod.ip(&["route", "add", "default", "via", "10.244.1.1"])
        .expect("pod route");
    node.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])
        .expect("forwarding on the node");
    pod
}

/// D.27 for an endpoint whose slice names no node (a hand-made slice of a selector-less
/// Service): its address is one of this node's pods', so a connection of the pod to
/// itself through the ClusterIP is masqueraded and completes.
#[test]
fn a_pod_reaches_itself_through_a_service_whose_slice_names_no_node() {
    netns::require_root();
    let (node, _client) = node_and_client();
    let pod = pod_on(&node, "aphp", "10.244.1.9");
    echo(endpoint_listener(&pod));
    let mut view = node_view(&TWO_ENDPOINTS);
    let applied = view.apply([
        service(
            "handmade",
            http(json!({"clusterIP": "10.96.0.95"})),
            json!({}),
        ),
        slice("handmade", "IPv4", &[("10.244.1.9", "")], 8080),
    ]);
    assert!(applied.invalid.is_empty());
    let mut proxy = open_proxy(&node);
    proxy.full_sync(&view).expect("full sync");
    let mut stream = connect(&pod, "10.96.0.95:80").expect("the pod reaches itself");
    assert_eq!(round_trip(&mut stream, b"self").expect("echo"), *b"self");
}

/// D.28 with packets: a pod's connection to a ClusterIP whose endpoint is on another host
/// keeps the pod's address, and with `masquerade_all` takes the node's.
#[test]
fn masquerade_all_masquerades_pod_traffic_to_cluster_ips() {
    netns::require_root();
    let (node, client) = node_and_client();
    let pod = pod_on(&node, "apma", "10.244.1.9");
    client
        .ip(&["route", "add", "10.244.1.0/24", "via", "10.0.0.1"])
        .expect("route back to the pods");
    let listener = endpoint_listener(&client);
    let mut view = node_view(&TWO_ENDPOINTS);
    let applied = view.apply([
        service(
            "remote",
            http(json!({"clusterIP": "10.96.0.97"})),
            json!({}),
        ),
        slice("remote", "IPv4", &[("10.0.0.2", "node-b")], 8080),
    ]);
    assert!(applied.invalid.is_empty());
    for (masquerade_all, expected) in [(false, "10.244.1.9"), (true, "10.0.0.1")] {
        let config = ProxySettings {
            masquerade_all,
            ..ProxySettings::default()
        };
        let mut proxy = node
            .enter(|| Proxy::new(config).expect("proxy"))
            .expect("entering the namespace");
        proxy.full_sync(&view).expect("full sync");
        std::thread::scope(|scope| {
            let server = scope.spawn(|| listener.accept().map(|(_, peer)| peer.ip()));
            let _stream = connect(&pod, "10.96.0.97:80").expect("through the ClusterIP");
            let peer = server.join().expect("server thread").expect("accept");
            assert_eq!(
                peer.to_string(),
                expected,
                "masquerade_all: {masquerade_all}"
            );
        });
    }
}

/// I.56: the conntrack timeouts are set in the agent's network namespace; the table size,
/// global to the host, cannot be written from a namespace of its own, which is reported,
/// and then the host's hash size is not touched either.
#[test]
fn conntrack_timeouts_are_set_and_the_hosts_table_is_left_alone_from_a_namespace() {
    use nodus_proxy::sysctls::ConntrackSettings;
    netns::require_root();
    let (node, _client) = node_and_client();
    let mut proxy = open_proxy(&node);
    proxy
        .full_sync(&node_view(&TWO_ENDPOINTS))
        .expect("full sync loads conntrack");
    let hash_size = "/sys/module/nf_conntrack/parameters/hashsize";
    let host_hash_size = std::fs::read_to_string(hash_size).expect("hash size");
    let settings = ConntrackSettings {
        // More than any host here has, so that a write is needed.
        max_per_core: 1 << 24,
        min: 0,
        tcp_established_timeout_seconds: 7_200,
        tcp_close_wait_timeout_seconds: 120,
    };
    let changes = node
        .enter(|| {
            settings.apply(
                std::path::Path::new("/proc"),
                std::path::Path::new("/sys"),
                2,
            )
        })
        .expect("entering the node");
    let describe = format!("{changes:?}");
    assert_eq!(changes.len(), 3, "{describe}");
    assert!(changes[0].path.ends_with("nf_conntrack_max"), "{describe}");
    assert!(changes[0].result.is_err(), "{describe}");
    assert!(
        changes[1..].iter().all(|change| change.result.is_ok()),
        "{describe}"
    );
    let read = |key: &str| {
        node.exec("sysctl", &["-n", key])
            .expect("sysctl")
            .trim()
            .to_string()
    };
    assert_eq!(
        read("net.netfilter.nf_conntrack_tcp_timeout_established"),
        "7200"
    );
    assert_eq!(
        read("net.netfilter.nf_conntrack_tcp_timeout_close_wait"),
        "120"
    );
    assert_eq!(
        std::fs::read_to_string(hash_size).expect("hash size"),
        host_hash_size
    );
}

/// D.29 by interface (kube-proxy's `InterfaceNamePrefix` and `BridgeInterface`): a pod
/// whose address lies outside every pod range keeps its address to a ClusterIP when it
/// comes in through a pod interface, and is masqueraded when pods are told by CIDR.
#[test]
fn pods_told_by_their_interface_keep_their_address() {
    use nodus_proxy::plan::LocalDetector;
    netns::require_root();
    for (detector, bridge) in [
        (LocalDetector::InterfaceNamePrefix("vethp".into()), false),
        (LocalDetector::BridgeInterface("podbr".into()), true),
        (LocalDetector::ClusterCidr, false),
    ] {
        let (node, client) = node_and_client();
        let pod = Netns::new("apif").expect("pod namespace");
        netns::veth(&node, "vethpod", &pod, "eth0").expect("pod veth");
        let gateway_device = if bridge {
            node.ip(&["link", "add", "podbr", "type", "bridge"])
                .expect("bridge");
            node.ip(&["link", "set", "vethpod", "master", "podbr"])
                .expect("enslave");
            node.ip(&["link", "set", "podbr", "up"]).expect("bridge up");
            "podbr"
        } else {
            "vethpod"
        };
        node.ip(&["addr", "add", "10.50.0.1/24", "dev", gateway_device])
            .expect("gateway");
        pod.ip(&["addr", "add", "10.50.0.9/24", "dev", "eth0"])
            .expect("pod address");
        pod.ip(&["route", "add", "default", "via", "10.50.0.1"])
            .expect("pod route");
        node.sysctl("net.ipv4.ip_forward", "1").expect("forwarding");
        client
            .ip(&["route", "add", "10.50.0.0/24", "via", "10.0.0.1"])
            .expect("route back to the pod");
        let listener = endpoint_listener(&client);
        let mut view = node_view(&TWO_ENDPOINTS);
        let applied = view.apply([
            service(
                "remote",
                http(json!({"clusterIP": "10.96.0.98"})),
                json!({}),
            ),
            slice("remote", "IPv4", &[("10.0.0.2", "node-b")], 8080),
        ]);
        assert!(applied.invalid.is_empty());
        let config = ProxySettings {
            local_detector: detector.clone(),
            ..ProxySettings::default()
        };
        let mut proxy = node
            .enter(|| Proxy::new(config).expect("proxy"))
            .expect("entering the namespace");
        proxy.full_sync(&view).expect("full sync");
        let expected = match detector {
            LocalDetector::ClusterCidr => "10.0.0.1",
            _ => "10.50.0.9",
        };
        std::thread::scope(|scope| {
            let server = scope.spawn(|| listener.accept().map(|(_, peer)| peer.ip()));
            let _stream = connect(&pod, "10.96.0.98:80").expect("through the ClusterIP");
            let peer = server.join().expect("server thread").expect("accept");
            assert_eq!(peer.to_string(), expected, "{detector:?}");
        });
    }
}

/// E.34 with `nodePortAddresses` ranges: NodePorts are served on the host's addresses
/// inside them and nowhere else (not on the primary address), and a new address in a
/// range serves them after the next sync.
#[test]
fn node_ports_follow_the_hosts_addresses_in_the_configured_ranges() {
    use nodus_proxy::plan::NodePortAddresses;
    netns::require_root();
    let (node, client) = node_and_client();
    node.ip(&["link", "add", "dum0", "type", "bridge"])
        .expect("a device for addresses");
    node.ip(&["link", "set", "dum0", "up"]).expect("up");
    node.ip(&["addr", "add", "10.0.5.1/24", "dev", "dum0"])
        .expect("address");
    client
        .ip(&["route", "add", "10.0.5.0/24", "via", "10.0.0.1"])
        .expect("route to the range");
    // The `nodeport` service's endpoint is the node itself, on 8080; a listener on the
    // NodePort's own number shows a connection the rules left alone.
    greeter(&node, 8080, "endpoint");
    greeter(&node, 30080, "not a NodePort");
    let view = node_view(&TWO_ENDPOINTS);
    let config = ProxySettings {
        node_port_addresses: NodePortAddresses::Cidrs(vec!["10.0.5.0/24".parse().expect("cidr")]),
        ..ProxySettings::default()
    };
    let mut proxy = node
        .enter(|| Proxy::new(config).expect("proxy"))
        .expect("entering the namespace");
    let host = |extra: &[&str]| {
        let mut addresses: Vec<std::net::IpAddr> = ["127.0.0.1", "10.0.0.1", "10.0.5.1"]
            .iter()
            .chain(extra)
            .map(|ip| ip.parse().expect("ip"))
            .collect();
        addresses.reverse();
        addresses
    };
    assert!(proxy.follows_interface_addresses());
    assert!(proxy.set_interface_addresses(host(&[])));
    proxy.full_sync(&view).expect("full sync");
    assert_eq!(greeting(&client, "10.0.5.1:30080"), "endpoint");
    assert_eq!(greeting(&client, "10.0.0.1:30080"), "not a NodePort");

    node.ip(&["addr", "add", "10.0.5.2/24", "dev", "dum0"])
        .expect("new address");
    assert!(
        !proxy.set_interface_addresses(host(&[])),
        "the same, in another order"
    );
    assert!(proxy.set_interface_addresses(host(&["10.0.5.2"])));
    let report = proxy.sync(&view, &ChangeSet::default()).expect("sync");
    assert_eq!(report.kind, SyncKind::Full, "{report:?}");
    assert_eq!(greeting(&client, "10.0.5.2:30080"), "endpoint");
}

/// E.35: with localhost NodePorts (and `route_localnet`, which the agent sets with them)
/// the host reaches a NodePort on 127.0.0.1 whose endpoint is on another host, and the
/// endpoint sees the node's address; without them 127.0.0.1 is no NodePort address.
#[test]
fn localhost_node_ports_reach_a_remote_endpoint_when_asked() {
    use nodus_proxy::sysctls::{ConntrackSettings, Sysctls};
    netns::require_root();
    for enabled in [false, true] {
        let (node, client) = node_and_client();
        let listener = endpoint_listener(&client);
        let mut view = node_view(&TWO_ENDPOINTS);
        let applied = view.apply([
            service(
                "np-remote",
                http(json!({
                    "type": "NodePort", "clusterIP": "10.96.0.99",
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30199}]
                })),
                json!({}),
            ),
            slice("np-remote", "IPv4", &[("10.0.0.2", "node-b")], 8080),
        ]);
        assert!(applied.invalid.is_empty());
        let config = ProxySettings {
            localhost_node_ports: enabled,
            ..ProxySettings::default()
        };
        let mut proxy = node
            .enter(|| Proxy::new(config).expect("proxy"))
            .expect("entering the namespace");
        proxy.full_sync(&view).expect("full sync");
        let sysctls = Sysctls {
            conntrack: ConntrackSettings {
                max_per_core: 0,
                min: 0,
                tcp_established_timeout_seconds: 0,
                tcp_close_wait_timeout_seconds: 0,
            },
            route_localnet: enabled,
        };
        let changes = node
            .enter(|| {
                sysctls.apply(
                    std::path::Path::new("/proc"),
                    std::path::Path::new("/sys"),
                    1,
                )
            })
            .expect("entering the node");
        assert!(
            changes.iter().all(|change| change.result.is_ok()),
            "{changes:?}"
        );
        if !enabled {
            let refused = connect(&node, "127.0.0.1:30199").expect_err("no NodePort on loopback");
            assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
            continue;
        }
        std::thread::scope(|scope| {
            let server = scope.spawn(|| listener.accept().map(|(_, peer)| peer.ip()));
            let _stream = connect(&node, "127.0.0.1:30199").expect("through localhost");
            let peer = server.join().expect("server thread").expect("accept");
            assert_eq!(peer.to_string(), "10.0.0.1");
        });
        assert!(
            list_table(&node).contains("iifname != \"lo\" ip daddr { 127.0.0.0/8 } drop"),
            "{}",
            list_table(&node)
        );
    }
}
