//! DNS answers follow the API: a service created, scaled and deleted shows up in `dig`
//! within one batch.

use crate::support::{
    Cluster, EXAMPLE, NODUS, free_port, get, metric, wait_for, wait_ready, wait_ready_in,
};
use nodus_testbed::dig::DigReply;
use nodus_testbed::fixtures;
use nodus_testbed::netns::{self, Netns};
use nodus_testbed::probe::http_get;
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

pub(crate) fn dig(dns: SocketAddr, name: &str, qtype: &str) -> (String, Vec<String>) {
    let output = Command::new("dig")
        .arg(format!("@{}", dns.ip()))
        .args([
            "-p",
            &dns.port().to_string(),
            "+tries=1",
            "+time=2",
            "+noall",
            "+answer",
            "+comments",
        ])
        .args([name, qtype])
        .output()
        .expect("dig is installed (dnsutils)");
    status_and_data(&String::from_utf8_lossy(&output.stdout))
}

/// What `dig +noall +answer +comments` printed: the status and each answer's data, sorted.
fn status_and_data(text: &str) -> (String, Vec<String>) {
    let reply = DigReply::parse(text);
    let data = reply.data();
    (reply.status, data)
}

fn slice(ips: &[&str]) -> serde_json::Value {
    let endpoints = ips
        .iter()
        .map(|ip| {
            let host = format!("h{}", ip.rsplit('.').next().unwrap_or("0"));
            json!({"addresses": [ip], "hostname": host})
        })
        .collect();
    let ports = json!([{"name": "redis", "protocol": "TCP", "port": 6379}]);
    let mut slice = fixtures::slice("default", "cache-1", "cache", "IPv4", endpoints, ports);
    slice["metadata"]["labels"]["service.kubernetes.io/headless"] = "".into();
    slice
}

#[test]
fn answers_follow_create_scale_and_delete() {
    let mut cluster = Cluster::new("dns", EXAMPLE);
    let (http, dns) = cluster.run_agent_with_dns("node-1");
    wait_ready(http);
    assert_eq!(
        dig(dns, "web.default.svc.cluster.local", "A").1,
        ["10.96.0.20"]
    );

    cluster.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "cache", "namespace": "default"},
        "spec": {"clusterIP": "None", "ports": [{"name": "redis", "port": 6379}]}
    }));
    cluster.apply(slice(&["10.244.1.50"]));
    wait_for("the new headless service to resolve", || {
        let (_, data) = dig(dns, "cache.default.svc.cluster.local", "A");
        (data == ["10.244.1.50"]).then_some(())
    });

    cluster.apply(slice(&["10.244.1.50", "10.244.2.51", "10.244.3.52"]));
    wait_for("the scaled service to resolve to three pods", || {
        let (_, data) = dig(dns, "cache.default.svc.cluster.local", "A");
        (data.len() == 3).then_some(())
    });
    let (_, srv) = dig(dns, "_redis._tcp.cache.default.svc.cluster.local", "SRV");
    assert_eq!(srv.len(), 3, "{srv:?}");
    assert!(
        srv.iter()
            .any(|r| r.ends_with("h52.cache.default.svc.cluster.local.")),
        "{srv:?}"
    );

    cluster
        .store
        .delete("v1", "Service", Some("default"), "cache")
        .expect("delete");
    wait_for("the deleted service to be NXDOMAIN", || {
        let (status, _) = dig(dns, "cache.default.svc.cluster.local", "A");
        (status == "NXDOMAIN").then_some(())
    });

    let (_, body) = get(http, "/metrics").expect("metrics");
    for series in [
        "nodus_dns_requests_total{qtype=\"A\"}",
        "nodus_dns_requests_total{qtype=\"SRV\"}",
        "nodus_dns_responses_total{rcode=\"NXDOMAIN\"}",
        "nodus_dns_request_duration_seconds_count",
    ] {
        assert!(
            metric(&body, series).is_some_and(|v| v >= 1.0),
            "{series}:\n{body}"
        );
    }
}

/// A stand-in for the node's own resolver (systemd-resolved's stub): UDP and TCP on
/// 127.0.0.53:53 inside `ns`, answering every UDP question with one A record,
/// 192.0.2.53, and counting the questions. Stops when dropped.
struct OtherResolver {
    questions: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    _tcp: std::net::TcpListener,
}

impl OtherResolver {
    fn start(ns: &Netns) -> OtherResolver {
        OtherResolver::start_on(ns, SocketAddr::from(([127, 0, 0, 53], 53)))
    }

    /// The same resolver on `addr`.
    fn start_on(ns: &Netns, addr: SocketAddr) -> OtherResolver {
        let (udp, tcp) = ns
            .enter(|| {
                (
                    UdpSocket::bind(addr).expect("udp resolver address"),
                    std::net::TcpListener::bind(addr).expect("tcp resolver address"),
                )
            })
            .expect("entering the namespace");
        udp.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let questions = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counted, stopped) = (questions.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stopped.load(Relaxed) {
                let Ok((n, from)) = udp.recv_from(&mut buf) else {
                    continue;
                };
                if n < 12 {
                    continue;
                }
                let question_end =
                    12 + buf[12..n].iter().position(|b| *b == 0).unwrap_or(0) + 1 + 4;
                // nodus's loop probe at start (HINFO) is not a forwarded question.
                if buf.get(question_end - 4..question_end - 2) != Some(&[0, 13]) {
                    counted.fetch_add(1, Relaxed);
                }
                // The question echoed, QR and RA set, one answer pointing at its name.
                let mut reply = buf[..n].to_vec();
                reply[2] |= 0x80;
                reply[3] = 0x80;
                reply[6..8].copy_from_slice(&[0, 1]);
                reply[8..12].copy_from_slice(&[0, 0, 0, 0]);
                // An EDNS OPT record of the question, if any, is dropped with ARCOUNT 0:
                // cut the message after the question.
                reply.truncate(question_end.min(reply.len()));
                reply
                    .extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 53]);
                let _ = udp.send_to(&reply, from);
            }
        });
        OtherResolver {
            questions,
            stop,
            _tcp: tcp,
        }
    }
}

impl Drop for OtherResolver {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

/// `dig +short` from inside `ns`.
fn dig_in(ns: &Netns, server: &str, name: &str) -> String {
    ns.exec(
        "dig",
        &[
            &format!("@{server}"),
            "+short",
            "+tries=1",
            "+time=2",
            name,
            "A",
        ],
    )
    .map(|out| out.trim().to_string())
    .unwrap_or_default()
}

/// `dig` from inside `ns`, from address `source`: the status and the answers' data.
fn dig_from(
    ns: &Netns,
    source: &str,
    server: &str,
    name: &str,
    extra: &[&str],
) -> (String, String) {
    let server = format!("@{server}");
    let mut args = vec![
        "-b",
        source,
        &server,
        "+tries=1",
        "+time=2",
        "+noall",
        "+answer",
        "+comments",
    ];
    args.extend_from_slice(extra);
    args.extend([name, "A"]);
    let (status, data) = status_and_data(&ns.exec("dig", &args).unwrap_or_default());
    (status, data.join(" "))
}

/// `nodus run` as node-1 inside `ns`, DNS on `listen` (YAML) forwarding to the
/// [`OtherResolver`] on 127.0.0.53, HTTP on every address; waits until it is ready and
/// returns the HTTP port.
fn run_node_1_with_dns(cluster: &mut Cluster, ns: &Netns, listen: &str) -> u16 {
    run_node_1_with_dns_config(cluster, ns, listen, "")
}

/// [`run_node_1_with_dns`] with more lines of the `dns:` section.
fn run_node_1_with_dns_config(cluster: &mut Cluster, ns: &Netns, listen: &str, dns: &str) -> u16 {
    let kubeconfig = cluster.listen_in(ns, SocketAddr::from((Ipv4Addr::LOCALHOST, free_port())));
    let resolv_conf = cluster.dir.join("resolv.conf");
    std::fs::write(&resolv_conf, "nameserver 127.0.0.53\n").expect("resolv.conf");
    let config = cluster.dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "dns:\n  listen: {listen}\n  resolv_conf: {}\n{dns}",
            resolv_conf.display()
        ),
    )
    .expect("config");
    let port = free_port();
    let mut cmd = ns.command(NODUS);
    cmd.args([
        "run",
        "--node-name",
        "node-1",
        "--http-addr",
        &SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).to_string(),
    ])
    .arg("--kubeconfig")
    .arg(&kubeconfig)
    .arg("--config")
    .arg(&config)
    .env("NODUS_LOG", "info")
    .env("NODUS_ALLOW_HTTP_API", "true")
    .env("NODUS_STATE_DIR", cluster.dir.join("state"));
    cluster.spawn(cmd);
    wait_ready_in(ns, SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    port
}

/// `deploy/`'s listen (`0.0.0.0:53`) on a node whose own resolver holds 127.0.0.53:53, as
/// systemd-resolved does on Ubuntu: Linux refuses the wildcard beside it, so nodus listens
/// on each address of the node instead, replies from the address asked, picks up an
/// address added later, and forwards outside names to that resolver (it is not nodus).
#[test]
fn starts_beside_a_resolver_on_127_0_0_53_and_forwards_to_it() {
    let mut cluster = Cluster::new("beside", EXAMPLE);
    let ns = Netns::new("rslv").expect("netns");
    ns.ip(&["addr", "add", "10.9.0.1/32", "dev", "lo"])
        .expect("a node address");
    let resolver = OtherResolver::start(&ns);
    run_node_1_with_dns(&mut cluster, &ns, "[\"0.0.0.0:53\"]");
    for server in ["127.0.0.1", "10.9.0.1"] {
        assert_eq!(
            dig_in(&ns, server, "web.default.svc.cluster.local"),
            "10.96.0.20",
            "asked at {server}"
        );
    }
    assert_eq!(
        resolver.questions.load(Relaxed),
        0,
        "cluster names stay here"
    );
    assert_eq!(dig_in(&ns, "10.9.0.1", "www.example.org"), "192.0.2.53");
    assert!(
        resolver.questions.load(Relaxed) >= 1,
        "forwarded to 127.0.0.53"
    );
    // The resolver itself still answers on its own address.
    assert_eq!(dig_in(&ns, "127.0.0.53", "anything.example"), "192.0.2.53");

    ns.ip(&["addr", "add", "10.9.0.2/32", "dev", "lo"])
        .expect("a new address");
    wait_for("DNS on the address added after start", || {
        (dig_in(&ns, "10.9.0.2", "web.default.svc.cluster.local") == "10.96.0.20").then_some(())
    });
}

/// A node (10.77.0.1 on its side of a veth) and a client behind it that has two addresses:
/// 10.77.0.2, outside the cluster, and 10.244.1.50, in node-1's pod CIDR.
fn node_and_client(tag: &str) -> (Netns, Netns) {
    let node = Netns::new(&format!("{tag}n")).expect("node netns");
    let client = Netns::new(&format!("{tag}c")).expect("client netns");
    netns::veth(&node, "eth1", &client, "eth0").expect("veth");
    node.ip(&["addr", "add", "10.77.0.1/24", "dev", "eth1"])
        .expect("node address");
    node.ip(&["route", "add", "10.244.1.50/32", "dev", "eth1"])
        .expect("route to the pod address");
    client
        .ip(&["addr", "add", "10.77.0.2/24", "dev", "eth0"])
        .expect("outsider address");
    client
        .ip(&["addr", "add", "10.244.1.50/32", "dev", "eth0"])
        .expect("pod address");
    client
        .ip(&["route", "add", "default", "via", "10.77.0.1"])
        .expect("default route");
    (node, client)
}

/// `deploy/`'s wildcard listen, bound: a pod asking an address the node holds on `lo`
/// (NodeLocal DNSCache's 169.254.20.10, say) gets its reply from that address, over the fast
/// path and the full path, although routing would send it from the node's veth address (and
/// `dig` would drop it as a reply from an unexpected source).
#[test]
fn replies_leave_from_the_address_asked_also_one_held_on_lo() {
    let mut cluster = Cluster::new("source", EXAMPLE);
    let (node, pod) = node_and_client("src");
    node.ip(&["addr", "add", "169.254.20.10/32", "dev", "lo"])
        .expect("an address on lo");
    run_node_1_with_dns(&mut cluster, &node, "[\"0.0.0.0:53\"]");
    for server in ["169.254.20.10", "10.77.0.1"] {
        assert_eq!(
            dig_from(
                &pod,
                "10.244.1.50",
                server,
                "web.default.svc.cluster.local",
                &[]
            ),
            ("NOERROR".to_string(), "10.96.0.20".to_string()),
            "the fast path, asked at {server}"
        );
    }
    // A reverse name is answered by the full path.
    let reverse = pod
        .exec(
            "dig",
            &[
                "-b",
                "10.244.1.50",
                "@169.254.20.10",
                "+tries=1",
                "+time=2",
                "+short",
                "-x",
                "10.96.0.20",
            ],
        )
        .unwrap_or_default();
    assert_eq!(
        reverse.trim(),
        "web.default.svc.cluster.local.",
        "the full path, asked at an address on lo"
    );
}

/// A cluster before Kubernetes 1.33 has no ServiceCIDR objects: with `service_cidrs`
/// configured, the reverse name of a service address no Service holds is still the zone's
/// authoritative NXDOMAIN, and the node's resolver is never asked it.
#[test]
fn without_service_cidr_objects_the_configured_service_range_is_the_zones() {
    let without: Vec<&str> = EXAMPLE
        .split("\n---\n")
        .filter(|document| !document.contains("kind: ServiceCIDR"))
        .collect();
    let mut cluster = Cluster::new("svcrange", &without.join("\n---\n"));
    let ns = Netns::new("svcr").expect("netns");
    let resolver = OtherResolver::start(&ns);
    run_node_1_with_dns_config(
        &mut cluster,
        &ns,
        "[\"127.0.0.1:53\"]",
        "service_cidrs: [10.96.0.0/16]\n",
    );
    let reverse = ns
        .exec(
            "dig",
            &["@127.0.0.1", "+tries=1", "+time=2", "-x", "10.96.9.9"],
        )
        .unwrap_or_default();
    assert!(reverse.contains("status: NXDOMAIN"), "{reverse}");
    assert!(reverse.contains("flags: qr aa"), "authoritative: {reverse}");
    assert_eq!(resolver.questions.load(Relaxed), 0, "not asked upstream");
}

/// Not an open resolver: a client outside the cluster (not loopback, not this host, no
/// Node's address or pod CIDR) gets REFUSED over UDP and TCP, for cluster names and
/// outside names alike, and nothing is forwarded for it; a pod of this node gets answers
/// and forwarding.
#[test]
fn clients_outside_the_cluster_are_refused_and_nothing_is_forwarded_for_them() {
    let mut cluster = Cluster::new("allow", EXAMPLE);
    let (node, client) = node_and_client("alw");
    let resolver = OtherResolver::start(&node);
    let http = run_node_1_with_dns(&mut cluster, &node, "[\"10.77.0.1:53\", \"127.0.0.1:53\"]");

    for transport in [&[][..], &["+tcp"][..]] {
        for name in ["web.default.svc.cluster.local", "www.example.org"] {
            assert_eq!(
                dig_from(&client, "10.77.0.2", "10.77.0.1", name, transport),
                ("REFUSED".to_string(), String::new()),
                "{name} {transport:?} from outside the cluster"
            );
        }
    }
    assert_eq!(
        resolver.questions.load(Relaxed),
        0,
        "nothing forwarded for an outsider"
    );
    let pod =
        |name, transport: &[&str]| dig_from(&client, "10.244.1.50", "10.77.0.1", name, transport);
    for transport in [&[][..], &["+tcp"][..]] {
        assert_eq!(
            pod("web.default.svc.cluster.local", transport),
            ("NOERROR".to_string(), "10.96.0.20".to_string()),
            "{transport:?} from a pod"
        );
    }
    assert_eq!(
        pod("www.example.org", &[]),
        ("NOERROR".to_string(), "192.0.2.53".to_string())
    );
    assert!(resolver.questions.load(Relaxed) >= 1);
    assert_eq!(
        dig_in(&node, "127.0.0.1", "web.default.svc.cluster.local"),
        "10.96.0.20",
        "the node itself, on loopback"
    );

    // The HTTP server: metrics for a scraper anywhere, /status (error texts) on loopback.
    let get_in = |ns: &Netns, ip: Ipv4Addr, path: &str| {
        ns.enter(|| http_get(SocketAddr::from((ip, http)), path, Duration::from_secs(5)))
            .expect("entering the namespace")
            .expect("the agent answers")
    };
    let node_address = Ipv4Addr::new(10, 77, 0, 1);
    assert_eq!(get_in(&client, node_address, "/metrics").0, 200);
    let (code, body) = get_in(&client, node_address, "/status");
    assert_eq!(code, 403, "{body}");
    assert!(!body.contains("node-1"), "{body}");
    assert_eq!(get_in(&node, Ipv4Addr::LOCALHOST, "/status").0, 200);
}

/// A UDP query for `name` (type A, RD set) with id `id`.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut packet = id.to_be_bytes().to_vec();
    packet.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        packet.push(label.len() as u8);
        packet.extend_from_slice(label.as_bytes());
    }
    packet.extend_from_slice(&[0, 0, 1, 0, 1]);
    packet
}

/// Response-rate limiting with real packets: a pod-range client that floods one node gets
/// its rate in answers, then every second reply truncated (TC, no records) and the rest
/// dropped; over TCP it is still answered, as a real resolver retrying after TC would be.
/// A neighbour in the same /24 (another pod of the node) asking right after the flood is
/// answered in full: limits are per client address.
#[test]
fn a_flood_from_one_client_is_rate_limited_with_truncated_slips_and_tcp_still_answers() {
    let mut cluster = Cluster::new("rrl", EXAMPLE);
    let (node, client) = node_and_client("rrl");
    node.ip(&["route", "add", "10.244.1.51/32", "dev", "eth1"])
        .expect("route to the neighbour");
    client
        .ip(&["addr", "add", "10.244.1.51/32", "dev", "eth0"])
        .expect("the neighbour's address");
    let http = run_node_1_with_dns_config(
        &mut cluster,
        &node,
        "[\"10.77.0.1:53\"]",
        "  rate_limit: 20\n  rate_limit_slip: 2\n",
    );
    const SENT: u16 = 200;
    let (answers, truncated, neighbour) = client
        .enter(|| {
            let socket = UdpSocket::bind("10.244.1.50:0").expect("bind the pod address");
            let neighbour = UdpSocket::bind("10.244.1.51:0").expect("bind the neighbour");
            for socket in [&socket, &neighbour] {
                socket
                    .set_read_timeout(Some(Duration::from_millis(500)))
                    .expect("timeout");
            }
            for id in 0..SENT {
                socket
                    .send_to(&query(id, "web.default.svc.cluster.local"), "10.77.0.1:53")
                    .expect("send");
            }
            neighbour
                .send_to(&query(1, "web.default.svc.cluster.local"), "10.77.0.1:53")
                .expect("send");
            let (mut answers, mut truncated) = (0usize, 0usize);
            let mut buffer = [0u8; 512];
            while let Ok(len) = socket.recv(&mut buffer) {
                let answer_count = u16::from_be_bytes([buffer[6], buffer[7]]);
                match (buffer[2] & 0x02 != 0, answer_count) {
                    (true, 0) if len > 12 => truncated += 1,
                    (false, 1) => answers += 1,
                    other => panic!("an unexpected reply: {other:?}"),
                }
            }
            let mut reply = [0u8; 512];
            let neighbour = neighbour.recv(&mut reply).ok().map(|_| {
                let truncated = reply[2] & 0x02 != 0;
                (truncated, u16::from_be_bytes([reply[6], reply[7]]))
            });
            (answers, truncated, neighbour)
        })
        .expect("entering the client");
    assert_eq!(
        neighbour,
        Some((false, 1)),
        "the neighbour is answered in full"
    );
    // The burst is the rate (20); a few more tokens come back while the flood is sent.
    assert!(
        (20..usize::from(SENT) / 2).contains(&answers),
        "{answers} answered of {SENT}"
    );
    assert!(
        truncated >= usize::from(SENT) / 4,
        "{truncated} truncated of {SENT}"
    );
    assert!(answers + truncated < usize::from(SENT), "some are dropped");
    assert_eq!(
        dig_from(
            &client,
            "10.244.1.50",
            "10.77.0.1",
            "web.default.svc.cluster.local",
            &["+tcp"]
        ),
        ("NOERROR".to_string(), "10.96.0.20".to_string()),
        "over TCP"
    );
    let metrics = metrics_in(&node, http);
    let slipped = metric(&metrics, "nodus_dns_rate_limited_total{action=\"slip\"}").unwrap_or(0.0);
    assert_eq!(slipped as usize, truncated, "{metrics}");
}

/// Pods that hold every connection a tenant may open to the agent's HTTP port (eight
/// pods try sixteen each: the 128 of the cap) leave the node itself its reserved places:
/// the liveness probe from the node's own address, and one through loopback, are
/// answered. Pods (`cluster_cidrs`) hold at most half together, so a load balancer's
/// probe from outside the pod ranges is answered too.
#[test]
fn pods_holding_every_connection_leave_the_nodes_probe_its_places() {
    let mut cluster = Cluster::new("caps", EXAMPLE);
    let (node, client) = node_and_client("caps");
    let pods: Vec<String> = (50..58).map(|host| format!("10.244.1.{host}")).collect();
    for pod in &pods[1..] {
        node.ip(&["route", "add", &format!("{pod}/32"), "dev", "eth1"])
            .expect("route to a pod");
        client
            .ip(&["addr", "add", &format!("{pod}/32"), "dev", "eth0"])
            .expect("a pod's address");
    }
    let http = run_node_1_with_dns_config(
        &mut cluster,
        &node,
        "[\"10.77.0.1:53\"]",
        "cluster_cidrs: [10.244.0.0/16]\n",
    );
    let held = client
        .enter(|| {
            let server = SocketAddr::from(([10, 77, 0, 1], http));
            let mut held = Vec::new();
            for pod in &pods {
                for _ in 0..16 {
                    let socket =
                        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                            .expect("socket");
                    let from: std::net::IpAddr = pod.parse().expect("ip");
                    socket.bind(&SocketAddr::new(from, 0).into()).expect("bind");
                    socket.connect(&server.into()).expect("connect");
                    held.push(std::net::TcpStream::from(socket));
                }
            }
            held
        })
        .expect("entering the client");
    let probe = |url: &str| {
        let args = [
            "-s",
            "-m",
            "2",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            url,
        ];
        node.exec("curl", &args).unwrap_or_default()
    };
    assert_eq!(
        probe(&format!("http://10.77.0.1:{http}/livez")),
        "200",
        "from the node's address"
    );
    assert_eq!(
        probe(&format!("http://127.0.0.1:{http}/livez")),
        "200",
        "through loopback"
    );
    let outside = client
        .exec(
            "curl",
            &[
                "-s",
                "-m",
                "2",
                "--interface",
                "10.77.0.2",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("http://10.77.0.1:{http}/livez"),
            ],
        )
        .unwrap_or_default();
    assert_eq!(
        outside, "200",
        "a load balancer's probe from outside the pods"
    );
    drop(held);
}

/// The `/metrics` of the nodus in `ns` whose HTTP port is `port`.
fn metrics_in(ns: &Netns, port: u16) -> String {
    ns.enter(|| {
        http_get(
            SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            "/metrics",
            Duration::from_secs(5),
        )
    })
    .expect("entering the node")
    .expect("metrics")
    .1
}

/// What operators set in a Corefile, through `nodus run`'s configuration: host records
/// inline and from a file read again when it changes (k3s's NodeHosts), a stub domain to
/// another resolver, the query log, and CoreDNS's metric names beside nodus's own.
#[test]
fn corefile_settings_hosts_stub_domains_query_log_and_coredns_metrics() {
    let mut cluster = Cluster::new("corefile", EXAMPLE);
    let ns = Netns::new("crfl").expect("netns");
    let resolver = OtherResolver::start(&ns);
    let hosts_file = cluster.dir.join("NodeHosts");
    std::fs::write(&hosts_file, "10.0.0.1 node-1\n").expect("hosts file");
    // The stub domain's upstream is the resolv.conf's resolver too: that its setting is
    // read and used is what this shows (the forwarder's tests tell the routes apart).
    let http = run_node_1_with_dns_config(
        &mut cluster,
        &ns,
        "[\"127.0.0.1:53\"]",
        &format!(
            "  hosts: ['10.1.0.1 registry.lan']\n  hosts_file: {}\n  query_log_one_in: 1\n\
             \x20 forward_zones:\n    corp.example: ['127.0.0.53']\n",
            hosts_file.display()
        ),
    );
    assert_eq!(dig_in(&ns, "127.0.0.1", "registry.lan"), "10.1.0.1");
    assert_eq!(dig_in(&ns, "127.0.0.1", "node-1"), "10.0.0.1");
    assert_eq!(
        resolver.questions.load(Relaxed),
        0,
        "host records stay here"
    );
    std::fs::write(&hosts_file, "10.0.0.2 node-2 node-2.lan\n").expect("hosts file");
    wait_for("the changed hosts file to be read", || {
        (dig_in(&ns, "127.0.0.1", "node-2.lan") == "10.0.0.2").then_some(())
    });
    assert_eq!(
        dig_in(&ns, "127.0.0.1", "node-1"),
        "192.0.2.53",
        "gone from the file: forwarded"
    );
    assert_eq!(dig_in(&ns, "127.0.0.1", "db.corp.example"), "192.0.2.53");
    let log = std::fs::read_to_string(cluster.dir.join("nodus-0.log")).expect("log");
    for name in ["registry.lan.", "node-2.lan.", "db.corp.example."] {
        assert!(
            log.lines()
                .any(|l| l.contains("query") && l.contains(name) && l.contains("NOERROR")),
            "{name} logged:\n{log}"
        );
    }
    let metrics = metrics_in(&ns, http);
    for series in [
        "coredns_dns_requests_total{server=\"dns://:53\",zone=\".\",proto=\"udp\",family=\"1\",type=\"A\"}",
        "coredns_dns_responses_total{server=\"dns://:53\",zone=\".\",rcode=\"NOERROR\"}",
        "coredns_dns_request_duration_seconds_count{server=\"dns://:53\",zone=\".\"}",
        "coredns_proxy_request_duration_seconds_count{proxy_name=\"forward\",to=\"127.0.0.53:53\",rcode=\"NOERROR\"}",
    ] {
        assert!(
            metric(&metrics, series).is_some_and(|v| v >= 1.0),
            "{series}:\n{metrics}"
        );
    }
}

/// The `kube-system/kube-dns` ConfigMap, as NodeLocal DNSCache reads it: its stub domains
/// and upstream nameservers are followed as they change, a version that does not read is
/// reported and the last good one kept, and deleting it goes back to the configuration.
#[test]
fn the_kube_dns_config_map_stub_domains_and_upstreams_are_followed() {
    let mut cluster = Cluster::new("kubedns", EXAMPLE);
    let ns = Netns::new("kdns").expect("netns");
    let node_resolver = OtherResolver::start(&ns);
    let stub = OtherResolver::start_on(&ns, SocketAddr::from(([127, 0, 0, 54], 53)));
    run_node_1_with_dns(&mut cluster, &ns, "[\"127.0.0.1:53\"]");
    let config_map = |data: serde_json::Value| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kube-dns", "namespace": "kube-system"},
            "data": data
        })
    };
    let asked = |resolver: &OtherResolver| resolver.questions.load(Relaxed);
    cluster.apply(config_map(
        json!({"stubDomains": "{\"acme.local\": [\"127.0.0.54\"]}"}),
    ));
    let mut attempt = 0;
    wait_for("the stub domain to be followed", || {
        attempt += 1;
        dig_in(&ns, "127.0.0.1", &format!("db{attempt}.acme.local"));
        (asked(&stub) > 0).then_some(())
    });
    let before = (asked(&node_resolver), asked(&stub));
    dig_in(&ns, "127.0.0.1", "www.example.org");
    assert_eq!(
        (asked(&node_resolver), asked(&stub)),
        (before.0 + 1, before.1),
        "other names still go to resolv.conf's resolver"
    );
    cluster.apply(config_map(json!({
        "stubDomains": "{\"acme.local\": [\"127.0.0.54\"]}",
        "upstreamNameservers": "[\"127.0.0.54\"]"
    })));
    wait_for("the upstream nameservers to replace resolv.conf's", || {
        attempt += 1;
        let before = asked(&stub);
        dig_in(&ns, "127.0.0.1", &format!("www{attempt}.example.org"));
        (asked(&stub) > before).then_some(())
    });
    cluster.apply(config_map(json!({"upstreamNameservers": "127.0.0.54"})));
    wait_for("the bad version to be reported", || {
        let log = std::fs::read_to_string(cluster.dir.join("nodus-0.log")).unwrap_or_default();
        log.contains("last good version stays").then_some(())
    });
    let before = asked(&stub);
    dig_in(&ns, "127.0.0.1", "kept.example.org");
    assert_eq!(asked(&stub), before + 1, "the last good version is kept");
    cluster
        .store
        .delete("v1", "ConfigMap", Some("kube-system"), "kube-dns")
        .expect("delete");
    wait_for("the configuration's upstreams to come back", || {
        attempt += 1;
        let before = asked(&node_resolver);
        dig_in(&ns, "127.0.0.1", &format!("back{attempt}.acme.local"));
        (asked(&node_resolver) > before).then_some(())
    });
}

/// RBAC from before nodus read the ConfigMap: the list is refused, which is reported once,
/// and DNS forwards to the configuration's upstreams as before.
#[test]
fn a_kube_dns_config_map_the_api_refuses_is_done_without() {
    let mut cluster = Cluster::new("kubedns-refused", EXAMPLE);
    cluster.store.forbid("list", "configmaps", true);
    let ns = Netns::new("kdnr").expect("netns");
    let node_resolver = OtherResolver::start(&ns);
    run_node_1_with_dns(&mut cluster, &ns, "[\"127.0.0.1:53\"]");
    assert_eq!(dig_in(&ns, "127.0.0.1", "www.example.org"), "192.0.2.53");
    assert!(node_resolver.questions.load(Relaxed) >= 1);
    wait_for("the refusal to be reported", || {
        let log = std::fs::read_to_string(cluster.dir.join("nodus-0.log")).unwrap_or_default();
        let warnings = log
            .lines()
            .filter(|line| line.contains("ConfigMap") && line.contains("going on without it"))
            .count();
        (warnings == 1).then_some(())
    });
}

/// Autopath with glibc's own resolver in a pod: kubelet's resolv.conf for a pod of `shop`
/// (ndots:5), asked through `getent`. Before nodus has the Pod, glibc walks the search
/// list itself, a question per name; once nodus has it, an outside name costs one
/// question, a name of the pod's own namespace still wins, and another namespace's
/// service comes before the world (the upstream here answers every name).
#[test]
fn autopath_resolves_a_pods_outside_name_in_one_question() {
    let mut cluster = Cluster::new("autopath", EXAMPLE);
    let (node, client) = node_and_client("apth");
    // The pod asks from its pod address, as a pod does.
    client
        .ip(&[
            "route",
            "replace",
            "10.77.0.1/32",
            "dev",
            "eth0",
            "src",
            "10.244.1.50",
        ])
        .expect("route from the pod address");
    client
        .set_resolv_conf(
            "nameserver 10.77.0.1\nsearch shop.svc.cluster.local svc.cluster.local \
             cluster.local\noptions ndots:5\n",
        )
        .expect("the pod's resolv.conf");
    let _resolver = OtherResolver::start(&node);
    let http = run_node_1_with_dns(&mut cluster, &node, "[\"10.77.0.1:53\"]");
    let resolve = |name: &str| {
        client
            .exec("getent", &["ahostsv4", name])
            .ok()
            .and_then(|out| out.split_whitespace().next().map(str::to_string))
            .unwrap_or_default()
    };
    // Questions nodus was asked, and search lists it walked.
    let counts = || {
        let metrics = metrics_in(&node, http);
        let questions = "coredns_dns_requests_total{server=\"dns://:53\",zone=\".\",\
                         proto=\"udp\",family=\"1\",type=\"A\"}";
        (
            metric(&metrics, questions).unwrap_or(0.0),
            metric(&metrics, "nodus_dns_autopath_total{result=\"answered\"}").unwrap_or(0.0),
        )
    };

    let before = counts();
    assert_eq!(resolve("www.example.org"), "192.0.2.53");
    let after = counts();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (4.0, 0.0),
        "a pod nodus does not know walks its list itself"
    );

    cluster.apply(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client", "namespace": "shop"},
        "spec": {"nodeName": "node-1", "dnsPolicy": "ClusterFirst"},
        "status": {"phase": "Running", "podIP": "10.244.1.50",
                   "podIPs": [{"ip": "10.244.1.50"}]}}));
    wait_for("node-1's pod in the view", || {
        let metrics = metrics_in(&node, http);
        (metric(&metrics, "nodus_view_objects{kind=\"pod\"}") == Some(1.0)).then_some(())
    });
    for (name, address, walked) in [
        ("mail.example.org", "192.0.2.53", 1.0),
        // `api.shop` exists: the pod's own namespace wins over the world.
        ("api", "10.96.0.30", 0.0),
        // `web.default.shop.svc…` does not; `web.default.svc…` is the next name of the list.
        ("web.default", "10.96.0.20", 1.0),
    ] {
        let before = counts();
        assert_eq!(resolve(name), address, "{name}");
        let after = counts();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (1.0, walked),
            "{name}: one question"
        );
    }
}
