//! NetworkPolicy with real packets: `nodus sandbox --real-api` runs two nodes, served by a
//! real control plane, with five pods in two namespaces, and every pod connects to every
//! other on two ports over TCP and UDP (a probe matrix, as the upstream NetworkPolicy e2e
//! suite and cyclonus do) before and after each policy of a set that covers isolation, pod
//! and namespace selectors, named ports of both protocols, `ipBlock` with `except`,
//! `endPort`, egress, the proxy's DNAT, the mesh and a restart of the agent. The expected
//! matrices are written out per step from the policies' meaning, not from the planner.
//! (SCTP is left out: this kernel has no SCTP sockets to probe with.)

use crate::proxy_packets::{node, service};
use crate::support::{NODUS, Sandbox, WAIT, metric, wait_for};
use nodus_testbed::{netns, runtime};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// `(name, namespace, node, IPv4 address, app label)`; each pod has an IPv6 address too
/// ([`v6_of`]).
const PODS: [(&str, &str, &str, &str, &str); 5] = [
    ("web-a", "shop", "node-a", "10.244.1.11", "web"),
    ("db-a", "shop", "node-a", "10.244.1.12", "db"),
    ("probe-a", "ops", "node-a", "10.244.1.13", "probe"),
    ("api-b", "shop", "node-b", "10.244.2.11", "api"),
    ("probe-b", "ops", "node-b", "10.244.2.12", "probe"),
];
const PORTS: [u16; 2] = [8080, 9090];

fn pod(
    name: &str,
) -> (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
) {
    *PODS
        .iter()
        .find(|p| p.0 == name)
        .unwrap_or_else(|| panic!("no pod {name}"))
}

/// A pod's IPv6 address: `10.244.N.H` has `fd00:244:N::H`.
fn v6_of(v4: &str) -> String {
    let octets: Vec<&str> = v4.split('.').collect();
    format!("fd00:244:{}::{}", octets[2], octets[3])
}

fn cluster() -> String {
    let mut docs = vec![node("node-a", 1), node("node-b", 2)];
    for (name, team) in [("shop", "shop"), ("ops", "ops")] {
        docs.push(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"team": team,
                                                  "kubernetes.io/metadata.name": name}}}));
    }
    let (mut endpoints, mut endpoints_v6) = (Vec::new(), Vec::new());
    for (name, namespace, node, ip, app) in PODS {
        let v6 = v6_of(ip);
        docs.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": "echo", "image": "echo:test", "ports": [
                {"name": "http", "containerPort": 8080},
                {"name": "admin", "containerPort": 9090},
                {"name": "admin-udp", "containerPort": 9090, "protocol": "UDP"}]}]},
            "status": {"phase": "Running", "podIP": ip,
                       "podIPs": [{"ip": ip}, {"ip": v6}]}}));
        endpoints.push(json!({"addresses": [ip], "conditions": {"ready": true},
            "nodeName": node, "targetRef": {"kind": "Pod", "name": name}}));
        endpoints_v6.push(json!({"addresses": [v6], "conditions": {"ready": true},
            "nodeName": node, "targetRef": {"kind": "Pod", "name": name}}));
    }
    // Every pod behind one headless dual-stack service, so that the sandbox starts them
    // with both ports and both families; db-a alone behind `db`, to reach it through the
    // proxy's DNAT.
    for (family, endpoints) in [("IPv4", endpoints), ("IPv6", endpoints_v6)] {
        docs.push(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("all-{}", family.to_lowercase()), "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "all"}},
            "addressType": family, "endpoints": endpoints,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                      {"name": "admin", "port": 9090, "protocol": "TCP"}]}),
        );
    }
    docs.push(service("db", json!({"clusterIP": "10.96.5.1"})));
    let (_, _, node, ip, _) = pod("db-a");
    docs.push(
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "db-1", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true},
                       "nodeName": node, "targetRef": {"kind": "Pod", "name": "db-a"}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    );
    docs.iter().map(|doc| format!("---\n{doc}\n")).collect()
}

/// One probe of the matrix: a connection (TCP) or datagram (UDP) from one pod to
/// another's address of one family, on one port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Probe {
    from: &'static str,
    to: &'static str,
    v6: bool,
    udp: bool,
    port: u16,
}

/// Every probe, all at once: who answered.
fn matrix(sandbox: &Sandbox) -> BTreeMap<Probe, bool> {
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    for (from, ..) in PODS {
        for (to, _, _, v4, _) in PODS {
            if from == to {
                continue;
            }
            for (v6, ip) in [(false, v4.to_string()), (true, v6_of(v4))] {
                for port in PORTS {
                    let probe_of = |udp| Probe {
                        from,
                        to,
                        v6,
                        udp,
                        port,
                    };
                    let host = if v6 { format!("[{ip}]") } else { ip.clone() };
                    let child = probe(sandbox, from, &format!("http://{host}:{port}/"));
                    tcp.push((probe_of(false), child));
                    let (ns, ip) = (sandbox.ns("pods", from), ip.clone());
                    let datagram = std::thread::spawn(move || udp_answered(&ns, &ip, port, to));
                    udp.push((probe_of(true), datagram));
                }
            }
        }
    }
    let tcp = tcp
        .into_iter()
        .map(|(probe, child)| (probe, answered(child, probe.to)));
    let udp = udp
        .into_iter()
        .map(|(probe, datagram)| (probe, datagram.join().expect("UDP probe")));
    tcp.chain(udp).collect()
}

/// Whether a datagram sent from namespace `ns` to `ip:port` gets `expected` back.
fn udp_answered(ns: &str, ip: &str, port: u16, expected: &str) -> bool {
    netns::enter(ns, || {
        let any = if ip.contains(':') {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        };
        let socket = UdpSocket::bind(any).expect("UDP socket");
        socket
            .set_read_timeout(Some(Duration::from_secs(1)))
            .expect("timeout");
        socket.send_to(b"probe", (ip, port)).expect("send");
        let mut buf = [0u8; 64];
        socket
            .recv(&mut buf)
            .is_ok_and(|n| String::from_utf8_lossy(&buf[..n]).trim() == expected)
    })
    .expect("entering the pod's namespace")
}

fn probe(sandbox: &Sandbox, from: &str, url: &str) -> std::process::Child {
    probe_in(&sandbox.ns("pods", from), url)
}

/// A connection to `url` from the namespace `ns`, as [`probe`] makes it.
fn probe_in(ns: &str, url: &str) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(["curl", "-s", "-m", "1", url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("curl runs")
}

fn answered(child: std::process::Child, expected: &str) -> bool {
    let output = child.wait_with_output().expect("curl ends");
    output.status.success() && String::from_utf8_lossy(&output.stdout).trim() == expected
}

/// Waits until the matrix is what `allowed` says, and fails with the differences if it
/// does not become that.
fn expect(sandbox: &Sandbox, step: &str, allowed: impl Fn(&Probe) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        let seen = matrix(sandbox);
        let wrong: Vec<String> = seen
            .iter()
            .filter(|(probe, ok)| allowed(probe) != **ok)
            .map(|(probe, ok)| format!("{probe:?} {}", if *ok { "passed" } else { "blocked" }))
            .collect();
        if wrong.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{step}: {wrong:#?}");
    }
}

fn kubectl(sandbox: &Sandbox, verb: &[&str], doc: Option<&Value>) {
    let mut args = vec![
        "--kubeconfig".to_string(),
        sandbox
            .dir
            .join("kubeconfig")
            .to_string_lossy()
            .into_owned(),
    ];
    args.extend(verb.iter().map(|s| s.to_string()));
    if let Some(doc) = doc {
        let file = sandbox.dir.join("policy.json");
        std::fs::write(&file, doc.to_string()).expect("policy file");
        args.extend(["--validate=false".into(), "-f".into()]);
        args.push(file.to_string_lossy().into_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    netns::run("kubectl", &args).expect("kubectl");
}

/// How many LISTs of Pods the API server has answered since it started (its own
/// `apiserver_request_total`).
fn pod_lists(sandbox: &Sandbox) -> u64 {
    let kubeconfig = sandbox.dir.join("kubeconfig");
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "--raw", "/metrics"])
        .output()
        .expect("kubectl get --raw /metrics");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"pods\"") && l.contains("verb=\"LIST\""))
        .filter(|l| l.contains("subresource=\"\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `nodus proxy trace` of a TCP connection from `from` to `to` on `node`.
fn trace(sandbox: &Sandbox, node: &str, from: &str, to: &str) -> String {
    let kubeconfig = sandbox.dir.join("kubeconfig");
    let config = sandbox.dir.join(node).join("config.yaml");
    let output = Command::new(NODUS)
        .args(["proxy", "trace", "--node-name", node, to, "--from", from])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--config")
        .arg(&config)
        .env("NODUS_ALLOW_HTTP_API", "true")
        .output()
        .expect("nodus proxy trace runs");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A series of node `node`'s agent, which listens on its namespace's loopback.
fn node_metric(sandbox: &Sandbox, node: &str, series: &str) -> Option<f64> {
    let ns = sandbox.ns("nodes", node);
    let url = "http://127.0.0.1:10256/metrics";
    let body = netns::run("ip", &["netns", "exec", &ns, "curl", "-sf", url]).ok()?;
    metric(&body, series)
}

fn policy(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

fn namespace_of(name: &str) -> &'static str {
    pod(name).1
}

/// Restarts node-a's agent while the `denied` connections (to port 9090) are tried over
/// and over: none may pass at any moment, and the matrix is `allowed` again once the new
/// agent is ready.
fn restart_keeps_isolation(
    sandbox: &mut Sandbox,
    denied: &[(&str, &str)],
    allowed: impl Fn(&Probe) -> bool,
) {
    let tries: Vec<(String, String, &str)> = denied
        .iter()
        .map(|(from, to)| {
            let url = format!("http://{}:9090/", pod(to).3);
            (sandbox.ns("pods", from), url, *to)
        })
        .collect();
    let stop = AtomicBool::new(false);
    let leaked = std::thread::scope(|scope| {
        let hammer = scope.spawn(|| {
            let mut leaked = Vec::new();
            while !stop.load(Relaxed) {
                for (ns, url, to) in &tries {
                    if answered(probe_in(ns, url), to) {
                        leaked.push(format!("{ns} -> {url}"));
                    }
                }
            }
            leaked
        });
        eprintln!("{}", sandbox.restart_agent("node-a", Path::new(NODUS)));
        let node = sandbox.ns("nodes", "node-a");
        let readyz = "http://127.0.0.1:10256/readyz";
        wait_for("node-a's new agent to be ready", || {
            let ready = netns::run("ip", &["netns", "exec", &node, "curl", "-sf", readyz]);
            ready.ok().map(|_| ())
        });
        expect(sandbox, "after node-a's restart", &allowed);
        stop.store(true, Relaxed);
        hammer.join().expect("the probes during the restart")
    });
    assert!(leaked.is_empty(), "passed during the restart: {leaked:?}");
}

#[test]
fn policies_allow_and_deny_real_connections_on_one_node_and_across_the_mesh() {
    let mut sandbox = Sandbox::start_with("policy", Some(&cluster()), &["--real-api".as_ref()]);
    let everyone = |_: &Probe| true;
    expect(&sandbox, "no policy", everyone);

    // Isolation: every shop pod takes no ingress at all; its own connections out (and
    // their replies) still pass.
    kubectl(
        &sandbox,
        &["apply"],
        Some(&policy(
            "shop",
            "deny-ingress",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        )),
    );
    let shop_isolated = |p: &Probe| namespace_of(p.to) != "shop";
    expect(&sandbox, "shop denies ingress", shop_isolated);

    // A pod selector (a label key no policy read before: the agents judge every pod on
    // the labels they keep, and list no pod again) with named ports of both protocols,
    // across the mesh: api-b reaches db-a on `http` (TCP 8080) and `admin-udp` (UDP 9090)
    // only.
    let lists_before = pod_lists(&sandbox);
    kubectl(
        &sandbox,
        &["apply"],
        Some(&policy(
            "shop",
            "db-from-api",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "api"}}}],
                                "ports": [{"port": "http"},
                                          {"protocol": "UDP", "port": "admin-udp"}]}]}),
        )),
    );
    // A namespace selector: web-a takes anything from the ops namespace.
    kubectl(
        &sandbox,
        &["apply"],
        Some(&policy(
            "shop",
            "web-from-ops",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]}]}),
        )),
    );
    let shop_opened = |p: &Probe| {
        shop_isolated(p)
            || (p.to == "db-a"
                && p.from == "api-b"
                && matches!((p.udp, p.port), (false, 8080) | (true, 9090)))
            || (p.to == "web-a" && namespace_of(p.from) == "ops")
    };
    expect(&sandbox, "db from api, web from ops", shop_opened);
    assert_eq!(
        pod_lists(&sandbox),
        lists_before,
        "no agent listed the pods again for a policy's new label keys"
    );

    // More labels than nodus keeps fail closed, on a pod and on a namespace: web-a is then
    // allowed nothing (a selector cannot tell whether it matches), and no longer lets in
    // ops, whose labels `web-from-ops` can no longer read.
    let web_shut = |p: &Probe| shop_opened(p) && p.to != "web-a";
    let many_labels: Vec<String> = (1..=1025).map(|i| format!("l{i}=x")).collect();
    let unlabel: Vec<String> = (1..=1025).map(|i| format!("l{i}-")).collect();
    let label = |what: &[&str], labels: &[String]| {
        let mut args: Vec<&str> = [&["label", "--overwrite"], what].concat();
        args.extend(labels.iter().map(String::as_str));
        kubectl(&sandbox, &args, None);
    };
    label(&["pod", "-n", "shop", "web-a"], &many_labels);
    expect(&sandbox, "web-a with 1,025 labels shut", web_shut);
    label(&["pod", "-n", "shop", "web-a"], &unlabel);
    label(&["namespace", "ops"], &many_labels);
    expect(&sandbox, "ops with 1,025 labels kept out", web_shut);
    label(&["namespace", "ops"], &unlabel);

    // The probes the isolation dropped are counted for the policies that isolate; the
    // tracer names the policy that decided.
    let denied = "nodus_policy_denied_packets_total{namespace=\"shop\",policy=\"deny-ingress\",direction=\"ingress\"}";
    wait_for("denied packets counted for shop/deny-ingress", || {
        node_metric(&sandbox, "node-a", denied).filter(|packets| *packets > 0.0)
    });
    let allowed = trace(&sandbox, "node-a", "10.244.2.11", "10.244.1.12:8080");
    assert!(
        allowed.contains("tcp port 8080: allowed by shop/db-from-api"),
        "{allowed}"
    );
    let denied = trace(&sandbox, "node-a", "10.244.2.11", "10.244.1.12:9090");
    assert!(
        denied.contains(
            "tcp port 9090: denied: isolated by shop/db-from-api, shop/deny-ingress, none allows it"
        ),
        "{denied}"
    );
    assert!(denied.ends_with("summary: DROP\n"), "{denied}");

    // A restart of node-a's agent (which restores its view, then lists policies, then
    // pods) never lets a denied connection through: the kernel keeps the sets meanwhile.
    restart_keeps_isolation(
        &mut sandbox,
        &[("probe-a", "db-a"), ("api-b", "db-a"), ("api-b", "web-a")],
        shop_opened,
    );

    // Egress with an ipBlock less an exception, a TCP port range and a UDP port: the
    // probes (one per node) may reach the IPv4 pod network but web-a, on TCP 9000-9100
    // and UDP 8080 only, and nothing over IPv6.
    kubectl(
        &sandbox,
        &["apply"],
        Some(&policy(
            "ops",
            "probes-out",
            json!({"podSelector": {"matchLabels": {"app": "probe"}},
                   "policyTypes": ["Egress"],
                   "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.0/16",
                                                   "except": ["10.244.1.11/32"]}}],
                               "ports": [{"protocol": "TCP", "port": 9000, "endPort": 9100},
                                         {"protocol": "UDP", "port": 8080}]}]}),
        )),
    );
    let probes_limited = |p: &Probe| {
        shop_opened(p)
            && (namespace_of(p.from) != "ops"
                || (!p.v6
                    && p.to != "web-a"
                    && matches!((p.udp, p.port), (false, 9090) | (true, 8080))))
    };
    expect(&sandbox, "probes' egress limited", probes_limited);

    // A new pod is isolated before its containers start. Its Pod object has no address in
    // its status yet (kubelet writes it once the sandbox is up), so only nodus-cni's ADD,
    // which waits until node-a has isolated the address it hands out, makes the very
    // first connection right after ADD judged: to probe-b on TCP 8080 it is dropped, on
    // TCP 9090, which `probes-out` allows, it passes.
    let gap_pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gap", "namespace": "ops", "labels": {"app": "probe"}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "echo:test"}]}});
    kubectl(&sandbox, &["apply"], Some(&gap_pod));
    let node_a = sandbox.dir.join("node-a");
    let gap = runtime::add_pod(
        &sandbox.ns("nodes", "node-a"),
        &node_a.join("net.d/10-nodus.conflist"),
        &netns::unique_name("gap"),
        &node_a.join("ipam"),
        &[],
        &node_a.join("cni-bin"),
        Some(("ops", "gap")),
    )
    .expect("nodus-cni's ADD, confirmed by node-a");
    assert!(
        !answered(
            probe_in(gap.ns.name(), "http://10.244.2.12:8080/"),
            "probe-b"
        ),
        "the new pod's first connection is judged by its policy"
    );
    assert!(answered(
        probe_in(gap.ns.name(), "http://10.244.2.12:9090/"),
        "probe-b"
    ));
    drop(gap);
    let gone = [
        "delete",
        "pod",
        "-n",
        "ops",
        "gap",
        "--grace-period=0",
        "--force",
    ];
    kubectl(&sandbox, &gone, None);

    // After the proxy's DNAT the policy sees the endpoint: api-b reaches db through its
    // ClusterIP, web-a does not, and db-a reaches itself (a pod to itself always passes).
    let via_service = |from: &str| answered(probe(&sandbox, from, "http://10.96.5.1/"), "db-a");
    assert!(via_service("api-b"), "api-b to db through its service");
    assert!(!via_service("web-a"), "web-a to db through its service");
    assert!(via_service("db-a"), "db-a to itself through its service");

    // One policy whose peers × ports (500 disjoint /32 blocks and api-b × 500 disjoint
    // ports and 8080) the kernel would hold as 250,000 elements per pod: web-a's egress
    // fails closed instead (not even api-b:8080 passes), and node-a reports the pod.
    let mut to: Vec<Value> = (0..500)
        .map(|i| json!({"ipBlock": {"cidr": format!("10.99.{}.{}/32", i / 128, (i % 128) * 2)}}))
        .collect();
    to.push(json!({"ipBlock": {"cidr": "10.244.2.11/32"}}));
    let mut ports: Vec<Value> = (0..500).map(|i| json!({"port": 10000 + 2 * i})).collect();
    ports.push(json!({"port": 8080}));
    // web-a's egress allowed by `explode`'s rules alone.
    let explode = |egress: Value| {
        let spec = json!({"podSelector": {"matchLabels": {"app": "web"}},
                          "policyTypes": ["Egress"], "egress": egress});
        kubectl(&sandbox, &["apply"], Some(&policy("shop", "explode", spec)));
    };
    explode(json!([{"to": to, "ports": ports}]));
    let web_out_shut = |p: &Probe| probes_limited(p) && p.from != "web-a";
    expect(&sandbox, "web-a's egress over the cap, shut", web_out_shut);
    wait_for("node-a to report the pod over the cap", || {
        node_metric(&sandbox, "node-a", "nodus_policy_refused_pods").filter(|n| *n == 1.0)
    });
    // The tracer says why: `explode` allows api-b:8080, but the pod fails closed.
    let closed = trace(&sandbox, "node-a", "10.244.1.11", "10.244.2.11:8080");
    assert!(
        closed.contains(
            "tcp port 8080: denied: isolated by shop/explode, which allow it more than 10000 \
             peer and port ranges or 10000 kernel elements: it fails closed"
        ),
        "{closed}"
    );
    assert!(closed.ends_with("summary: DROP\n"), "{closed}");

    // Under the allowance cap, but square in the kernel: 700 rules, each 10.0.0.0/8 less
    // its own /24 on its own port, are 1,400 allowances and would be 490,701 elements
    // (the agent reached 427 MiB in 30 s on them). web-a fails closed the same way, and
    // node-a's agent keeps serving.
    kubectl(
        &sandbox,
        &["delete", "networkpolicy", "-n", "shop", "explode"],
        None,
    );
    wait_for("node-a to report no pod over a cap", || {
        node_metric(&sandbox, "node-a", "nodus_policy_refused_pods").filter(|n| *n == 0.0)
    });
    let stairs: Vec<Value> = (0..700)
        .map(|i| {
            json!({"to": [{"ipBlock": {"cidr": "10.0.0.0/8",
                                       "except": [format!("10.{}.{}.0/24", i / 256, i % 256)]}}],
                   "ports": [{"protocol": "TCP", "port": 1000 + 2 * i}]})
        })
        .collect();
    explode(Value::from(stairs));
    expect(
        &sandbox,
        "web-a's egress over the element cap, shut",
        web_out_shut,
    );
    wait_for("node-a to report the pod over the element cap", || {
        node_metric(&sandbox, "node-a", "nodus_policy_refused_pods").filter(|n| *n == 1.0)
    });

    // Policies gone, everything passes again.
    for (namespace, name) in [
        ("shop", "deny-ingress"),
        ("shop", "db-from-api"),
        ("shop", "web-from-ops"),
        ("ops", "probes-out"),
        ("shop", "explode"),
    ] {
        kubectl(
            &sandbox,
            &["delete", "networkpolicy", "-n", namespace, name],
            None,
        );
    }
    expect(&sandbox, "policies deleted", everyone);
}
