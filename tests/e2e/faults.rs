//! The fault-injection suite: what a real node does to an agent, injected for real (network
//! namespaces as nodes, the API stand-in, `wireguard-go` and the embedded device, real
//! packets). Each case injects the fault, checks that it is reported and that nodus
//! recovers on its own, and prints how long recovery took (the table in docs/operations.md
//! quotes these; no test asserts a time beyond the bound it waits for).

use crate::dns::dig;
use crate::mesh::{
    API_PORT, MeshNode, WIREGUARD_GO, node_object, ping, pod_1_reaches_pods_2_and_3, pod_on_each,
    three_nodes,
};
use crate::support::{
    Cluster, EXAMPLE, free_port, get, metric, wait_for, wait_metric, wait_ready, wait_within,
};
use nodus_mesh::plan::ANNOTATION_PUBLIC_KEY;
use nodus_testbed::apiserver::{ApiServerConfig, Store};
use nodus_testbed::fixtures;
use nodus_testbed::netns::Pod;
use nodus_testbed::netns::{self, Underlay};
use nodus_testbed::scale::Shape;
use serde_json::json;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Waits until `from` pings `to` again after a fault injected at `since`; returns how long
/// that took.
fn reconnected(what: &str, from: &Pod, to: &Pod, since: Instant) -> Duration {
    let to = IpAddr::V4(to.v4.expect("v4"));
    wait_within(what, Duration::from_secs(40), || ping(from, to).ok());
    let took = since.elapsed();
    println!("{what}: traffic back after {took:.1?}");
    took
}

/// Whether the log of `node`'s first nodus holds `text`.
fn logged(node: &MeshNode, text: &str) -> bool {
    logged_in(node, 0, text)
}

/// Whether the log of `node`'s nodus number `start` (from 0) holds `text`.
fn logged_in(node: &MeshNode, start: usize, text: &str) -> bool {
    std::fs::read_to_string(node.log(start)).is_ok_and(|log| log.contains(text))
}

/// Deletes `node`'s WireGuard device, as someone on the node might.
fn delete_device(node: &MeshNode) {
    node.node
        .ns
        .ip(&["link", "del", &node.interface])
        .expect("delete the device");
}

/// The pid of the `wireguard-go` that serves `node`'s device.
fn daemon_of(node: &MeshNode) -> u32 {
    let output = std::process::Command::new("pgrep")
        .args(["-f", &format!("wireguard-go {}$", node.interface)])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .and_then(|pid| pid.trim().parse().ok())
        .unwrap_or_else(|| panic!("no wireguard-go for {}", node.interface))
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// The local ports of `node`'s established connections to the API server.
fn api_connections(node: &MeshNode) -> Vec<u16> {
    let listing = node
        .node
        .ns
        .exec("ss", &["-Htn", "state", "established"])
        .expect("ss");
    listing
        .lines()
        .filter_map(|line| {
            let mut columns = line.split_whitespace().rev();
            let peer = columns.next()?;
            let local = columns.next()?;
            peer.ends_with(&format!(":{API_PORT}"))
                .then(|| local.rsplit(':').next()?.parse().ok())
                .flatten()
        })
        .collect()
}

/// Three nodes: `wireguard-go` on nodes 1 and 3, the embedded device on node 2, a pod on
/// each. In turn: node 1's device deleted (C1), node 3's daemon killed (C2), node 2's
/// embedded device deleted (C1), then at once node 1's daemon stopped while a Node joins
/// (C3) and node 3's API connections silently dropped (A2, half-open).
#[test]
fn mesh_devices_come_back_and_a_half_open_api_connection_is_replaced() {
    let (cluster, underlay, nodes, _kubeconfig) = three_nodes(
        "fault-mesh",
        209,
        [WIREGUARD_GO, "  backend: embedded\n", WIREGUARD_GO],
    );
    let pods = pod_on_each(&nodes);
    pod_1_reaches_pods_2_and_3(&pods);
    let recreated = "nodus_mesh_device_recreations_total";

    // C1: node 1's device deleted; its wireguard-go goes with it.
    let since = Instant::now();
    delete_device(&nodes[0]);
    reconnected("C1 wireguard-go device deleted", &pods[0], &pods[1], since);
    nodes[0].wait_metric(recreated, 1.0);
    assert!(logged(&nodes[0], "had vanished; created it again"));

    // C2: node 3's daemon killed.
    let since = Instant::now();
    signal(daemon_of(&nodes[2]), "KILL");
    reconnected("C2 wireguard-go killed", &pods[0], &pods[2], since);
    nodes[2].wait_metric(recreated, 1.0);

    // C1 with the embedded device: node 2's link deleted under boringtun.
    let since = Instant::now();
    delete_device(&nodes[1]);
    reconnected("C1 embedded device deleted", &pods[0], &pods[1], since);
    nodes[1].wait_metric(recreated, 1.0);

    // A2: node 3's API connections go silent (no reset) in both directions; new ones work.
    let ports = api_connections(&nodes[2]);
    assert!(!ports.is_empty(), "node 3 watches the API");
    let ports = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let rules = format!(
        "table inet fault {{\n\
         chain out {{ type filter hook output priority 0; tcp dport {API_PORT} tcp sport {{ {ports} }} drop; }}\n\
         chain in {{ type filter hook input priority 0; tcp sport {API_PORT} tcp dport {{ {ports} }} drop; }}\n}}\n"
    );
    let file = std::env::temp_dir().join(format!("nodus-fault-{}.nft", std::process::id()));
    std::fs::write(&file, rules).expect("rules");
    nodes[2]
        .node
        .ns
        .exec("nft", &["-f", &file.to_string_lossy()])
        .expect("silence the API connections");
    let _ = std::fs::remove_file(&file);
    // C3: node 1's daemon stopped, as a wedged process would be.
    let daemon = daemon_of(&nodes[0]);
    signal(daemon, "STOP");

    // A Node joins: every nodus must add it as a peer.
    let since = Instant::now();
    let key = nodus_mesh::key::KeyPair::generate().expect("key");
    let mut joining = node_object("node-4", 4, &underlay);
    joining["metadata"]["annotations"] = json!({ANNOTATION_PUBLIC_KEY: key.public.to_base64()});
    cluster.apply(joining);
    nodes[1].wait_metric("nodus_mesh_peers", 3.0);

    // Node 1 says its device does not answer, and stays live: a restart would not help.
    wait_for("node 1 to report the stopped daemon", || {
        logged(&nodes[0], "no reply within").then_some(())
    });
    let failures = nodes[0]
        .metric("nodus_mesh_sync_failures_total")
        .expect("failures counted");
    assert!(failures >= 1.0, "{failures}");
    let livez = nodes[0].get("/livez").expect("/livez answers");
    assert_eq!(livez.0, 200, "{livez:?}");
    std::thread::sleep(Duration::from_secs(12).saturating_sub(since.elapsed()));
    signal(daemon, "CONT");
    let resumed = Instant::now();
    nodes[0].wait_metric("nodus_mesh_peers", 3.0);
    println!(
        "C3 wireguard-go stopped for 12 s: the new peer programmed {:.1?} after SIGCONT",
        resumed.elapsed()
    );

    // Node 3 sees the join only once its silent watch is replaced.
    wait_within(
        "node 3 to replace its silent watch and add node-4",
        Duration::from_secs(60),
        || (nodes[2].metric("nodus_mesh_peers") == Some(3.0)).then_some(()),
    );
    println!(
        "A2 half-open API connection: the join reached node 3 {:.1?} after it was made",
        since.elapsed()
    );
    nodes[2]
        .node
        .ns
        .exec("nft", &["delete", "table", "inet", "fault"])
        .expect("lift the fault");
    pod_1_reaches_pods_2_and_3(&pods);
}

/// E3: DNS's port is taken when nodus starts (systemd-resolved on a node, say). The view and
/// the other subsystems run; DNS is reported and retried, and answers once the port frees.
/// Then this Node is tainted for removal: `/healthz` drains it, `/livez` stays 200.
#[test]
fn a_dns_port_taken_at_start_is_retried_while_the_rest_runs() {
    let mut cluster = Cluster::new("fault-dns-port", EXAMPLE);
    let held = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let dns = held.local_addr().expect("addr");
    let held_udp = UdpSocket::bind(dns).expect("bind UDP too");
    let http = cluster.run_agent_with_dns_on("node-1", dns);
    wait_metric(http, "nodus_view_objects{kind=\"service\"}", 5.0);
    wait_for("the start failure counted", || {
        get(http, "/metrics")
            .and_then(|(_, body)| {
                metric(
                    &body,
                    "nodus_subsystem_start_failures_total{subsystem=\"dns\"}",
                )
            })
            .filter(|n| *n >= 1.0)
    });
    assert_eq!(get(http, "/readyz").map(|(code, _)| code), Some(503));
    assert_eq!(get(http, "/livez").map(|(code, _)| code), Some(200));
    let (_, status) = get(http, "/status").expect("/status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("json");
    let line = status["subsystems"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == "dns"))
        .expect("a dns line");
    assert_eq!(line["enabled"], true, "{line}");
    assert_eq!(line["detail"], "not started; retrying", "{line}");
    let error = line["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("in use"), "{line}");

    let freed = Instant::now();
    drop((held, held_udp));
    wait_ready(http);
    println!("E3 DNS port freed: ready {:.1?} later", freed.elapsed());
    let (status, answers) = dig(dns, "web.default.svc.cluster.local", "A");
    assert_eq!(status, "NOERROR", "{answers:?}");
    assert!(!answers.is_empty());

    // The cluster autoscaler marks this Node for removal; then changes its mind.
    let node = |taints: serde_json::Value| {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "node-1"},
               "spec": {"podCIDRs": ["10.244.1.0/24"], "taints": taints},
               "status": {"addresses": [{"type": "InternalIP", "address": "172.30.0.11"}]}})
    };
    cluster.apply(node(json!([{"key": "ToBeDeletedByClusterAutoscaler",
                               "value": "1764000000", "effect": "NoSchedule"}])));
    let (_, why) = wait_for("/healthz to drain the node", || {
        get(http, "/healthz").filter(|(code, _)| *code == 503)
    });
    assert!(why.contains("ToBeDeletedByClusterAutoscaler"), "{why}");
    assert_eq!(get(http, "/livez").map(|(code, _)| code), Some(200));
    cluster.apply(node(json!([])));
    wait_for("/healthz back to 200", || {
        get(http, "/healthz").filter(|(code, _)| *code == 200)
    });
    let (_, body) = get(http, "/metrics").expect("metrics");
    assert!(
        metric(&body, "kubeproxy_proxy_healthz_total{code=\"503\"}").is_some_and(|n| n >= 1.0),
        "{body}"
    );
}

/// C7 and C8: node 1's key and CNI directories are full when nodus starts (4 KiB tmpfs
/// mounts, filled, in a mount namespace of nodus's own so that the host sees nothing). The
/// mesh cannot make its key and is retried; the table (its egress masquerade) is programmed
/// meanwhile, and the node is not ready. Once the key's space frees, the mesh starts and
/// the nodes peer, while the conflist fails to be written (reported, no partial file left);
/// once that space frees too, the conflist appears.
#[test]
fn full_key_and_cni_directories_delay_the_mesh_and_nothing_else() {
    netns::require_root();
    let underlay = Underlay::new([10, 211, 0], [0xfd00, 0x211, 0, 0]).expect("underlay");
    let cluster = Cluster::new("fault-key-enospc", "");
    for i in 1..=2 {
        cluster.apply(node_object(&format!("node-{i}"), i, &underlay));
    }
    let kubeconfig = cluster.listen_in(&underlay.ns, SocketAddr::from((underlay.v4(1), API_PORT)));
    let mut nodes: Vec<MeshNode> = (1..=2)
        .map(|i| MeshNode::new(&cluster, &underlay, &format!("node-{i}"), i, WIREGUARD_GO))
        .collect();
    let keys = nodes[0].dir.join("key");
    let cni = nodes[0].dir.join("net.d");
    let mut script = String::new();
    for dir in [&keys, &cni] {
        std::fs::create_dir_all(dir).expect("dir");
        script += &format!(
            "mount -t tmpfs -o size=4k tmpfs {dir} && (head -c 65536 /dev/zero > {dir}/filler; \
             true) && ",
            dir = dir.display()
        );
    }
    nodes[0].launcher = vec![
        "unshare".into(),
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        format!("{script}exec \"$0\" \"$@\""),
    ];
    for node in &mut nodes {
        node.start(&kubeconfig);
    }
    let failed = "nodus_subsystem_start_failures_total{subsystem=\"mesh\"}";
    wait_for("node 1's mesh start to fail", || {
        nodes[0].metric(failed).filter(|n| *n >= 1.0)
    });
    assert!(logged(&nodes[0], "No space left on device"));
    // The proxy's first full sync waits for the lists, which may come after the mesh's
    // failure on a loaded machine: the table comes all the same.
    wait_for("node 1's table to be programmed meanwhile", || {
        let table = ["list", "table", "inet", "nodus"];
        nodes[0].node.ns.exec("nft", &table).ok()
    });
    assert_eq!(nodes[0].metric("nodus_ready"), Some(0.0));
    // Node 2 runs, without node 1, which has published no key.
    nodes[1].wait_metric("nodus_ready", 1.0);
    assert_eq!(nodes[1].metric("nodus_mesh_peers"), Some(0.0));

    assert!(!keys.join("filler").exists(), "the tmpfs is nodus's alone");
    let pid = nodes[0].pid.expect("running").to_string();
    let in_mount_namespace = |program: &str, path: &Path| {
        let output = std::process::Command::new("nsenter")
            .args(["--target", &pid, "--mount", program])
            .arg(path)
            .output()
            .expect("nsenter");
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let freed = Instant::now();
    in_mount_namespace("rm", &keys.join("filler")).expect("key space freed");
    for node in &nodes {
        wait_within("the nodes to peer", Duration::from_secs(40), || {
            (node.metric("nodus_mesh_peers") == Some(1.0)).then_some(())
        });
    }
    nodes[0].wait_metric("nodus_ready", 1.0);
    println!(
        "C7 key directory full: the mesh up {:.1?} after space freed",
        freed.elapsed()
    );

    // The conflist could not be written: said, and no partial file stays behind.
    wait_for("the conflist's failure reported", || {
        logged(&nodes[0], "10-nodus.conflist.tmp").then_some(())
    });
    let listing = in_mount_namespace("ls", &cni).expect("ls");
    assert_eq!(listing.trim(), "filler", "{listing}");
    let freed = Instant::now();
    in_mount_namespace("rm", &cni.join("filler")).expect("CNI space freed");
    let written = wait_within("the conflist written", Duration::from_secs(40), || {
        in_mount_namespace("cat", &cni.join("10-nodus.conflist"))
    });
    assert!(written.contains("\"cniVersion\""), "{written}");
    println!(
        "C8 CNI directory full: the conflist written {:.1?} after space freed",
        freed.elapsed()
    );
}

/// W1: nodus restarted while the API is unreachable, as on an edge node whose uplink is
/// down. Node 2 runs DNS and the embedded device, which ends with the process. Started
/// again with its API connections dropped, it restores the view it saved: DNS answers the
/// cluster's names (misses are NXDOMAIN, not SERVFAIL), the device comes back with its
/// peer, and the pods reach each other again, all reported stale and not ready; once the
/// API is reachable, the lists replace the view.
#[test]
fn a_restart_without_the_api_serves_the_saved_view() {
    netns::require_root();
    let underlay = Underlay::new([10, 212, 0], [0xfd00, 0x212, 0, 0]).expect("underlay");
    let cluster = Cluster::new("fault-warm-start", "");
    for i in 1..=2 {
        cluster.apply(node_object(&format!("node-{i}"), i, &underlay));
    }
    cluster.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}));
    let kubeconfig = cluster.listen_in(&underlay.ns, SocketAddr::from((underlay.v4(1), API_PORT)));
    let mut nodes = vec![
        MeshNode::new(&cluster, &underlay, "node-1", 1, WIREGUARD_GO),
        MeshNode::new(&cluster, &underlay, "node-2", 2, "  backend: embedded\n"),
    ];
    let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, 53));
    nodes[1].serve_dns(dns);
    for node in &mut nodes {
        node.start(&kubeconfig);
    }
    for node in &nodes {
        node.wait_metric("nodus_mesh_peers", 1.0);
    }
    let pods = pod_on_each(&nodes);
    wait_for("pod 1 to reach pod 2", || {
        ping(&pods[0], IpAddr::V4(pods[1].v4.expect("v4"))).ok()
    });
    wait_for("node 2 to save its view", || {
        nodes[1]
            .metric("nodus_view_saves_total")
            .filter(|n| *n >= 1.0)
    });

    let ask = |node: &MeshNode, name: &'static str| {
        node.node
            .ns
            .enter(move || dig(dns, name, "A"))
            .expect("dig in node 2")
    };
    let api = underlay.v4(1).to_string();
    let port = API_PORT.to_string();
    for command in [
        &["add", "table", "inet", "fault"][..],
        &[
            "add",
            "chain",
            "inet",
            "fault",
            "out",
            "{ type filter hook output priority 0 ; }",
        ],
        &[
            "add", "rule", "inet", "fault", "out", "ip", "daddr", &api, "tcp", "dport", &port,
            "drop",
        ],
    ] {
        nodes[1]
            .node
            .ns
            .exec("nft", command)
            .expect("cut node 2 off the API");
    }
    nodes[1].stop();
    let since = Instant::now();
    nodes[1].start(&kubeconfig);
    let answered = wait_within("DNS from the saved view", Duration::from_secs(20), || {
        let (status, answers) = ask(&nodes[1], "web.default.svc.cluster.local");
        (status == "NOERROR" && answers == ["10.96.0.10"]).then(|| since.elapsed())
    });
    assert_eq!(
        ask(&nodes[1], "none.default.svc.cluster.local").0,
        "NXDOMAIN"
    );
    let peered = reconnected("W1 restarted without the API", &pods[0], &pods[1], since);
    println!("W1 restarted without the API: DNS answered {answered:.1?} after the start");
    assert_eq!(nodes[1].metric("nodus_view_stale"), Some(1.0));
    assert_eq!(nodes[1].metric("nodus_ready"), Some(0.0));
    let (_, status) = nodes[1].get("/status").expect("/status");
    assert!(
        status.contains("stale: restored from the view saved at"),
        "{status}"
    );
    assert!(logged_in(&nodes[1], 1, "restored the view saved before"));

    let lifted = Instant::now();
    nodes[1]
        .node
        .ns
        .exec("nft", &["delete", "table", "inet", "fault"])
        .expect("reconnect node 2");
    wait_within(
        "the lists to replace the view",
        Duration::from_secs(60),
        || (nodes[1].metric("nodus_view_stale") == Some(0.0)).then_some(()),
    );
    nodes[1].wait_metric("nodus_ready", 1.0);
    println!(
        "W1 restarted without the API: peers back {peered:.1?} after the start; fresh and \
         ready {:.1?} after the API came back",
        lifted.elapsed()
    );
}

/// What [`query_through`] saw.
struct Answers {
    sent: usize,
    /// NOERROR with web's address.
    right: usize,
    /// Anything else: a miss (NXDOMAIN, SERVFAIL) or another address.
    wrong: usize,
}

/// Queries `dns` for `web.default.svc.cluster.local` A, one query every `pause`, until
/// `stop`, counting them in `sent` as they go; then waits 2 s for stragglers.
fn query_through(
    dns: SocketAddr,
    stop: &AtomicBool,
    sent_so_far: &AtomicUsize,
    pause: Duration,
) -> Answers {
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("client");
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let query = |id: u16| {
        let mut packet = id.to_be_bytes().to_vec();
        packet.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        for label in ["web", "default", "svc", "cluster", "local"] {
            packet.push(label.len() as u8);
            packet.extend_from_slice(label.as_bytes());
        }
        packet.extend_from_slice(&[0, 0, 1, 0, 1]);
        packet
    };
    // Per query id: 0 unanswered, 1 right, 2 wrong.
    let mut answers = vec![0u8; 65536];
    let receive = |socket: &UdpSocket, answers: &mut Vec<u8>| {
        let mut buffer = [0u8; 512];
        while let Ok(n) = socket.recv(&mut buffer) {
            let Some(reply) = buffer.get(..n).filter(|r| r.len() >= 12) else {
                continue;
            };
            // NOERROR with one answer, whose last four bytes are the service's address.
            let right =
                reply[3] & 0x0f == 0 && reply[6..8] == [0, 1] && reply.ends_with(&[10, 96, 0, 20]);
            answers[usize::from(u16::from_be_bytes([reply[0], reply[1]]))] = 2 - u8::from(right);
        }
    };
    let mut sent = 0usize;
    while !stop.load(Relaxed) && sent < 65536 {
        socket
            .send_to(&query(sent as u16), dns)
            .expect("send a query");
        sent += 1;
        sent_so_far.store(sent, Relaxed);
        std::thread::sleep(pause);
        if sent.is_multiple_of(25) {
            socket.set_nonblocking(true).expect("nonblocking");
            receive(&socket, &mut answers);
            socket.set_nonblocking(false).expect("blocking");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        receive(&socket, &mut answers);
    }
    Answers {
        sent,
        right: answers.iter().filter(|a| **a == 1).count(),
        wrong: answers.iter().filter(|a| **a == 2).count(),
    }
}

/// E5: DNS never dark across a restart. Queries run throughout; first the next nodus starts
/// beside the running one (a DaemonSet's surge) and takes its sockets over, then the running
/// one gets SIGTERM; then SIGTERM comes first, and the next nodus starts within the
/// lameduck period. Every query is answered, and the first process serves nothing after
/// handing over.
#[test]
fn dns_answers_every_query_through_restarts() {
    let mut cluster = Cluster::new("fault-dns-restart", EXAMPLE);
    let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let config = cluster.dir.join("config.yaml");
    std::fs::write(
        &config,
        format!("dns:\n  listen: [\"{dns}\"]\n  udp_threads: 2\nlameduck_seconds: 10\n"),
    )
    .expect("config");
    let start = |cluster: &mut Cluster| {
        let mut cmd = cluster.nodus(&[
            "run",
            "--node-name",
            "node-1",
            "--http-addr",
            &http.to_string(),
        ]);
        cmd.arg("--config").arg(&config);
        cluster.spawn(cmd).id()
    };
    let first = start(&mut cluster);
    wait_ready(http);
    let until_stopped = |what: &str, restart: &mut dyn FnMut()| {
        let (stop, sent) = (AtomicBool::new(false), AtomicUsize::new(0));
        // At least 250 queries before the restart and 250 after it, however long it takes.
        let at_least =
            |n: usize| wait_for("queries sent", || (sent.load(Relaxed) >= n).then_some(()));
        let answers = std::thread::scope(|scope| {
            let queries =
                scope.spawn(|| query_through(dns, &stop, &sent, Duration::from_millis(2)));
            at_least(250);
            restart();
            at_least(sent.load(Relaxed) + 250);
            stop.store(true, Relaxed);
            queries.join().expect("queries")
        });
        let Answers { sent, right, .. } = answers;
        println!("E5 {what}: {sent} queries, {} unanswered", sent - right);
        assert_eq!(right, sent, "{what}: every query answered");
    };

    // The successor first: it takes the sockets over, then the first nodus is stopped.
    let mut second = 0;
    until_stopped("successor beside the running nodus", &mut || {
        second = start(&mut cluster);
        wait_for("the handover", || {
            std::fs::read_to_string(cluster.dir.join("nodus-0.log"))
                .ok()
                .filter(|log| log.contains("handed the sockets and the dataplane over"))
        });
        wait_ready(http);
        signal(first, "TERM");
        let status = cluster.wait_child(first);
        assert!(status.success(), "{status}");
    });

    // SIGTERM first: the running nodus serves, not ready, until the next one takes over.
    until_stopped(
        "SIGTERM, then the successor within the lameduck period",
        &mut || {
            signal(second, "TERM");
            wait_for("the lameduck's readiness", || {
                get(http, "/readyz").filter(|(code, _)| *code == 503)
            });
            let since = Instant::now();
            start(&mut cluster);
            let status = cluster.wait_child(second);
            assert!(status.success(), "{status}");
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "it left once it handed over"
            );
            wait_ready(http);
        },
    );
}

/// A ClusterIP Service `name` in `default` at `ip`.
fn service(name: &str, ip: &str) -> serde_json::Value {
    fixtures::service("default", name, fixtures::cluster_ip(ip))
}

/// A3: the API server comes back with another resourceVersion history (restored from a
/// backup whose revisions were not bumped): the revision nodus resumes from is one the
/// server never reached. kube-rs alone would retry that watch forever and keep the old
/// view; nodus lists afresh and follows the new history.
#[test]
fn an_api_server_with_another_history_is_listed_afresh() {
    let mut cluster = Cluster::new("fault-new-history", EXAMPLE);
    let (http, dns) = cluster.run_agent_with_dns("node-1");
    wait_ready(http);
    // The old history moves on: writes the restored one never saw.
    for i in 0..20 {
        cluster.apply(service(&format!("old-{i}"), &format!("10.96.1.{i}")));
    }
    wait_for("the old history's last write", || {
        (dig(dns, "old-19.default.svc.cluster.local", "A").0 == "NOERROR").then_some(())
    });
    let restored = Store::new(ApiServerConfig::default());
    restored.load_yaml_str(EXAMPLE).expect("fixture");
    restored
        .apply_value(service("restored", "10.96.2.1"))
        .expect("a write of the restored history");
    assert!(restored.resource_version() < cluster.store.resource_version());
    cluster.store = restored;
    let since = Instant::now();
    cluster.restart_server();
    wait_within(
        "the view to follow the new history",
        Duration::from_secs(60),
        || {
            let fresh = dig(dns, "restored.default.svc.cluster.local", "A").0 == "NOERROR";
            let gone = dig(dns, "old-0.default.svc.cluster.local", "A").0 == "NXDOMAIN";
            (fresh && gone).then_some(())
        },
    );
    println!(
        "A3 API server with another history: the view followed it {:.1?} after the restart",
        since.elapsed()
    );
    let log = std::fs::read_to_string(cluster.dir.join("nodus-0.log")).expect("log");
    assert!(log.contains("another resourceVersion history"), "{log}");
}

/// A1 and E4: the API server down for two minutes, then a relist of 2,000 services under a
/// flood of queries. Through the outage DNS answers from the view, `/livez` and `/readyz`
/// stay 200 and the failing watches are counted; a change made meanwhile arrives once the
/// API is back. Then every watch must relist (a compaction, the watches dropped) while
/// queries come as fast as one client sends them: no answer is wrong at any moment (the
/// view never empties during a relist), and the relist completes.
#[test]
fn the_api_down_for_minutes_then_a_relist_under_a_query_flood() {
    let mut cluster = Cluster::new("fault-api-down", EXAMPLE);
    let shape = Shape::new(2000, 5, 10);
    for object in nodus_testbed::scale::cluster(&shape) {
        cluster.apply(object);
    }
    let (http, dns) = cluster.run_agent_with_dns("node-1");
    wait_ready(http);

    cluster.stop_server();
    let down = Instant::now();
    cluster.apply(service("made-meanwhile", "10.96.3.1"));
    while down.elapsed() < Duration::from_secs(120) {
        let (status, answers) = dig(dns, "web.default.svc.cluster.local", "A");
        assert_eq!(
            (status.as_str(), answers.as_slice()),
            ("NOERROR", &["10.96.0.20".to_string()][..])
        );
        assert_eq!(get(http, "/livez").map(|(code, _)| code), Some(200));
        assert_eq!(get(http, "/readyz").map(|(code, _)| code), Some(200));
        std::thread::sleep(Duration::from_secs(10));
    }
    let (_, body) = get(http, "/metrics").expect("metrics");
    let restarts = metric(&body, "nodus_watch_restarts_total{kind=\"service\"}").unwrap_or(0.0);
    assert!(restarts >= 1.0, "the failing watch is counted: {restarts}");
    let back = Instant::now();
    cluster.restart_server();
    wait_within("the change made meanwhile", Duration::from_secs(60), || {
        (dig(dns, "made-meanwhile.default.svc.cluster.local", "A").0 == "NOERROR").then_some(())
    });
    println!(
        "A1 API down for {:.0?}: DNS answered throughout; the change made meanwhile arrived {:.1?} after the API came back",
        back - down,
        back.elapsed()
    );

    let (stop, sent) = (AtomicBool::new(false), AtomicUsize::new(0));
    let answers = std::thread::scope(|scope| {
        let queries = scope.spawn(|| query_through(dns, &stop, &sent, Duration::from_micros(100)));
        std::thread::sleep(Duration::from_millis(300));
        let relist = Instant::now();
        cluster.store.force_compaction();
        cluster.apply(service("after-relist", "10.96.3.2"));
        cluster.drop_watches();
        wait_within("the relist to complete", Duration::from_secs(60), || {
            (dig(dns, "after-relist.default.svc.cluster.local", "A").0 == "NOERROR").then_some(())
        });
        println!(
            "E4 relist of 2,000 services under a query flood: done {:.1?} after the compaction",
            relist.elapsed()
        );
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Relaxed);
        queries.join().expect("queries")
    });
    let Answers { sent, right, wrong } = answers;
    println!(
        "E4 relist under a query flood: {sent} queries, {right} right, {wrong} wrong, {} unanswered",
        sent - right - wrong
    );
    assert_eq!(wrong, 0, "no answer is wrong during a relist");
    assert!(right > 0);
}

/// A4: every watch ends in the middle of an object (its first bytes, then the end of the
/// response, as a connection lost mid-transfer). The fragment is not applied, nothing
/// else is lost, and a change made right after arrives through the resumed watches.
#[test]
fn a_watch_cut_mid_object_resumes_and_loses_nothing() {
    let mut cluster = Cluster::new("fault-watch-cut", EXAMPLE);
    let (http, dns) = cluster.run_agent_with_dns("node-1");
    wait_ready(http);
    let objects = |http| {
        let (_, body) = get(http, "/metrics").expect("metrics");
        metric(&body, "nodus_view_objects{kind=\"service\"}")
    };
    let before = objects(http);
    let watches = |cluster: &Cluster| {
        let counts = cluster.store.request_counts();
        counts.get("watch").copied().unwrap_or(0)
    };
    let watching = watches(&cluster);
    let cut = Instant::now();
    cluster.cut_watches_mid_object();
    // Every watch (Services, EndpointSlices, this Node) read its fragment and resumed.
    wait_for("the watches to resume", || {
        (watches(&cluster) >= watching + 3).then_some(())
    });
    let resumed = cut.elapsed();
    cluster.apply(service("after-the-cut", "10.96.4.1"));
    wait_within("the change after the cut", Duration::from_secs(30), || {
        (dig(dns, "after-the-cut.default.svc.cluster.local", "A").0 == "NOERROR").then_some(())
    });
    println!(
        "A4 watch cut mid-object: the watches resumed {resumed:.1?} after the cut, the next \
         change arrived {:.1?} after it",
        cut.elapsed()
    );
    assert_eq!(
        objects(http),
        before.map(|n| n + 1.0),
        "one service more, none lost"
    );
    let (_, body) = get(http, "/metrics").expect("metrics");
    assert_eq!(
        metric(&body, "nodus_invalid_objects_total{kind=\"service\"}"),
        Some(0.0),
        "the fragment is not an object"
    );
    assert_eq!(get(http, "/livez").map(|(code, _)| code), Some(200));
    assert_eq!(
        dig(dns, "web.default.svc.cluster.local", "A").1,
        ["10.96.0.20"]
    );
}

/// `nodus run` for node-0 in `ns`, the API on `ns`'s loopback, with `config`; returns its
/// pid and HTTP address (in `ns`).
fn agent_in(cluster: &mut Cluster, ns: &netns::Netns, config: &str) -> (u32, SocketAddr) {
    let kubeconfig = cluster.listen_in(ns, SocketAddr::from((Ipv4Addr::LOCALHOST, free_port())));
    let path = cluster.dir.join(format!("config-{}.yaml", free_port()));
    std::fs::write(&path, config).expect("config");
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let mut cmd = ns.command(crate::support::NODUS);
    cmd.args([
        "run",
        "--node-name",
        "node-0",
        "--http-addr",
        &http.to_string(),
    ])
    .arg("--kubeconfig")
    .arg(&kubeconfig)
    .arg("--config")
    .arg(&path)
    .env("NODUS_LOG", "info")
    .env("NODUS_ALLOW_HTTP_API", "true")
    .env("NODUS_STATE_DIR", cluster.dir.join("state"));
    (cluster.spawn(cmd).id(), http)
}

/// The addresses in nodus's table in `ns`, as the words of its listing.
fn table_words(ns: &netns::Netns) -> BTreeSet<String> {
    ns.exec("nft", &["list", "table", "inet", "nodus"])
        .unwrap_or_default()
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|word| word.contains('.'))
        .map(str::to_string)
        .collect()
}

/// The slice of scale service `i` with one endpoint, 10.250.`generation`.`i`.
fn churned_slice(i: usize, shape: &Shape, generation: u8) -> serde_json::Value {
    let mut slice = nodus_testbed::scale::slice(i, shape, 0);
    slice["endpoints"] = json!([{"addresses": [format!("10.250.{generation}.{i}")],
                                 "conditions": {"ready": true}, "nodeName": "node-0"}]);
    slice
}

/// A log line without its terminal colours.
fn without_colours(line: &str) -> String {
    let mut plain = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('\x1b') {
        plain.push_str(&rest[..start]);
        rest = rest[start..]
            .find('m')
            .map_or("", |end| &rest[start + end + 1..]);
    }
    plain.push_str(rest);
    plain
}

const PROXY_ONLY: &str = "proxy:\n  enabled: true\ndns:\n  enabled: false\n";

/// A node's namespace (`tag`, loopback up) and a cluster of `shape` for it to serve.
fn node_with_cluster(tag: &str, test: &str, shape: &Shape) -> (netns::Netns, Cluster) {
    netns::require_root();
    let ns = netns::Netns::new(tag).expect("namespace");
    ns.ip(&["link", "set", "lo", "up"]).expect("lo up");
    let cluster = Cluster::new(test, "");
    for object in nodus_testbed::scale::cluster(shape) {
        cluster.apply(object);
    }
    (ns, cluster)
}

/// P1: someone runs `nft flush ruleset` on the node (every table gone, nodus's with them)
/// while endpoints churn. The table comes back, and holds each churned service's last
/// endpoint and none of the ones before.
#[test]
fn an_outside_ruleset_flush_under_churn_is_repaired() {
    let shape = Shape::new(200, 3, 3);
    let (ns, mut cluster) = node_with_cluster("flush", "fault-flush-ruleset", &shape);
    let (_, http) = agent_in(&mut cluster, &ns, PROXY_ONLY);
    crate::support::wait_ready_in(&ns, http);
    let full_syncs = || {
        ns.enter(move || get(http, "/metrics"))
            .ok()
            .flatten()
            .and_then(|(_, body)| {
                metric(
                    &body,
                    "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
                )
            })
            .unwrap_or(0.0)
    };
    let before = full_syncs();
    const CHURNED: usize = 20;
    let mut generation = 0u8;
    for round in 0..60 {
        generation += 1;
        for i in 0..CHURNED {
            cluster.apply(churned_slice(i, &shape, generation));
        }
        if round == 20 {
            ns.exec("nft", &["flush", "ruleset"])
                .expect("nft flush ruleset");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let churn_ended = Instant::now();
    let last = generation;
    wait_within(
        "the table repaired with the last endpoints",
        Duration::from_secs(40),
        || {
            let words = table_words(&ns);
            let current = (0..CHURNED).all(|i| words.contains(&format!("10.250.{last}.{i}")));
            let stale =
                (1..last).any(|g| (0..CHURNED).any(|i| words.contains(&format!("10.250.{g}.{i}"))));
            (current && !stale).then_some(())
        },
    );
    println!(
        "P1 nft flush ruleset under churn (2 s more of it after the flush): repaired and \
         current {:.1?} after the churn ended",
        churn_ended.elapsed()
    );
    assert!(full_syncs() > before, "the repair is a full sync, counted");
}

/// S1: nodus is killed (SIGKILL) while its first full sync of 3,000 services programs the
/// table, then started again. The new process adopts whatever the killed one left and
/// completes it; a third process then finds the table exactly as planned (nothing added,
/// nothing left over).
#[test]
fn sigkill_during_a_full_sync_then_restart_converges() {
    let shape = Shape::new(3000, 5, 10);
    let (ns, mut cluster) = node_with_cluster("kill", "fault-sigkill-sync", &shape);
    let (first, _) = agent_in(&mut cluster, &ns, PROXY_ONLY);
    // The table appears with the sync's first transaction: kill then.
    wait_for("the first transaction", || {
        ns.exec("nft", &["list", "tables"])
            .ok()
            .filter(|tables| tables.contains("inet nodus"))
    });
    signal(first, "KILL");
    let _ = cluster.wait_child(first);
    let first_log = std::fs::read_to_string(cluster.dir.join("nodus-0.log")).expect("log");
    let mid_sync = !first_log.contains("full proxy sync");
    let left = table_words(&ns).len();
    println!(
        "S1 killed {} its first full sync; the table held {left} addresses",
        if mid_sync { "during" } else { "after" }
    );

    let dir = cluster.dir.clone();
    let full_sync_line = |n: usize| {
        let log = std::fs::read_to_string(dir.join(format!("nodus-{n}.log"))).expect("log");
        log.lines()
            .find(|line| line.contains("full proxy sync"))
            .map(without_colours)
    };
    let since = Instant::now();
    let (second, http) = agent_in(&mut cluster, &ns, PROXY_ONLY);
    crate::support::wait_ready_in(&ns, http);
    println!(
        "S1 restarted: ready {:.1?} after the start; {}",
        since.elapsed(),
        full_sync_line(1).unwrap_or_default()
    );
    let programmed = table_words(&ns);
    signal(second, "TERM");
    let _ = cluster.wait_child(second);

    let (_, http) = agent_in(&mut cluster, &ns, PROXY_ONLY);
    crate::support::wait_ready_in(&ns, http);
    let adopted = full_sync_line(2).expect("the third process's full sync");
    assert!(adopted.contains("services=3000"), "{adopted}");
    assert!(
        adopted.contains("leftovers=0"),
        "nothing was left over: {adopted}"
    );
    assert_eq!(
        table_words(&ns),
        programmed,
        "the table as the second process left it"
    );
    // Every endpoint of every service is in it.
    for i in (0..shape.services).step_by(97) {
        for e in 0..shape.endpoints_per_service {
            if (e % 10) != 9 {
                let ip = nodus_testbed::scale::pod_ip(i, e, 0).to_string();
                assert!(programmed.contains(&ip), "service {i}'s endpoint {ip}");
            }
        }
    }
}

/// C.25 on a cluster that does not let nodus list ServiceCIDRs (RBAC written before them;
/// a cluster before 1.33 answers 404 the same way): the view completes without them and
/// everything else is programmed. Allowed, the range's unallocated addresses are dropped,
/// and a deleted ServiceCIDR takes its rule along.
#[test]
fn service_cidrs_the_api_refuses_are_done_without() {
    let shape = Shape::new(20, 2, 2);
    let (ns, mut cluster) = node_with_cluster("scidr", "fault-service-cidrs", &shape);
    cluster.apply(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
                         "metadata": {"name": "kubernetes"},
                         "spec": {"cidrs": ["10.96.0.0/12"]}}),
    );
    let listing = || {
        ns.exec("nft", &["list", "table", "inet", "nodus"])
            .unwrap_or_default()
    };
    const DROP_RULE: &str = "ip daddr { 10.96.0.0/12 } drop";

    cluster.store.forbid("list", "servicecidrs", true);
    let (first, http) = agent_in(&mut cluster, &ns, PROXY_ONLY);
    crate::support::wait_ready_in(&ns, http);
    wait_for("the services programmed", || {
        listing().contains("10.96.0.10").then_some(())
    });
    assert!(!listing().contains(DROP_RULE), "{}", listing());
    let log = std::fs::read_to_string(cluster.dir.join("nodus-0.log")).expect("log");
    assert!(
        log.contains("nodus may not list it; going on without it"),
        "{log}"
    );
    signal(first, "TERM");
    let _ = cluster.wait_child(first);

    cluster.store.forbid("list", "servicecidrs", false);
    let (_, http) = agent_in(&mut cluster, &ns, PROXY_ONLY);
    crate::support::wait_ready_in(&ns, http);
    wait_for("the unallocated addresses dropped", || {
        listing().contains(DROP_RULE).then_some(())
    });
    cluster
        .store
        .delete("networking.k8s.io/v1", "ServiceCIDR", None, "kubernetes")
        .expect("delete");
    wait_for("the rule gone with its ServiceCIDR", || {
        (!listing().contains(DROP_RULE)).then_some(())
    });
    assert!(listing().contains("10.96.0.10"), "{}", listing());
}
