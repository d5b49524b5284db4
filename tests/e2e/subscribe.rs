//! Backends that subscribe to the running agent (`subscribe.socket`): the worked `all-ip`
//! backend programs real packets beside nodus's own proxy while `nodus view --watch` is
//! attached too, on a sandbox served by a real control plane; and the socket's protocol:
//! resuming, refusals, a subscriber that stops reading.

use crate::proxy_packets::{A1, B1, curl, node, route_via, service, slice};
use crate::support::{KillOnDrop, NODUS, Sandbox, line_reader, wait_for};
use nodus_testbed::netns;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const ALL_IP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/all-ip.py");
const EXTERNAL: &str = "192.0.2.80";

fn cluster() -> String {
    let mut handed = service(
        "handed",
        json!({"clusterIP": "10.96.2.1", "externalIPs": [EXTERNAL]}),
    );
    handed["metadata"]["labels"] = json!({"service.kubernetes.io/service-proxy-name": "all-ip"});
    let docs = [
        node("node-a", 1),
        node("node-b", 2),
        handed,
        slice("handed", &[A1, B1]),
        service("proxied", json!({"clusterIP": "10.96.2.2"})),
        slice("proxied", &[B1]),
    ];
    docs.iter().map(|doc| format!("---\n{doc}\n")).collect()
}

/// One UDP datagram from `ns` to `addr`: the echo's answer (the pod's name), or nothing.
fn udp(ns: &str, host: &str, port: u16) -> String {
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.settimeout(2)\n\
         s.sendto(b'who', ('{host}', {port}))\n\
         print(s.recvfrom(100)[0].decode().strip())\n"
    );
    let output = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", &script])
        .output()
        .expect("python3 runs");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A raw subscriber: the hello sent, the agent's lines read as they come.
struct Subscriber {
    reader: BufReader<UnixStream>,
}

impl Subscriber {
    fn connect(socket: &Path, hello: &str) -> Subscriber {
        let mut stream = UnixStream::connect(socket).expect("the agent's socket answers");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        // Past `max_subscribers` the agent may answer and close before it reads the hello:
        // the write then fails, and its answer is still there to read.
        if let Err(error) = stream.write_all(hello.as_bytes()) {
            assert_eq!(error.kind(), ErrorKind::BrokenPipe, "hello: {error}");
        }
        Subscriber {
            reader: BufReader::new(stream),
        }
    }

    fn next(&mut self) -> Value {
        let mut line = String::new();
        self.reader
            .read_line(&mut line)
            .expect("a line from the agent");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// Lines up to and including the next `Synced`.
    fn until_synced(&mut self) -> Vec<Value> {
        let mut lines = Vec::new();
        loop {
            let line = self.next();
            let synced = line["kind"] == "Synced";
            lines.push(line);
            if synced {
                return lines;
            }
        }
    }
}

fn names(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            format!(
                "{} {}",
                l["kind"].as_str().unwrap_or(""),
                l["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// The agent's `subscribe` line in `/status`, from inside its node.
fn subscribe_status(ns: &str) -> Option<Value> {
    let output = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-s",
            "-m",
            "2",
            "http://127.0.0.1:10256/status",
        ])
        .output()
        .expect("curl runs");
    let status: Value = serde_json::from_slice(&output.stdout).ok()?;
    status["subsystems"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == "subscribe")
        .cloned()
}

#[test]
fn the_all_ip_backend_and_view_watch_subscribe_beside_the_proxy() {
    let mut sandbox = Sandbox::start_with("subscribe", Some(&cluster()), &["--real-api".as_ref()]);
    let node_a = sandbox.ns("nodes", "node-a");
    let underlay = sandbox.namespaces["underlay"]
        .as_str()
        .expect("underlay namespace")
        .to_string();
    let socket: PathBuf = sandbox.dir.join("node-a/state/view-node-a.sock");
    wait_for("node-a's subscription socket", || {
        socket.exists().then_some(())
    });

    // The backend in node-a's network namespace, and `nodus view --watch` beside it.
    let backend = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{node_a}"))
        .args(["python3", ALL_IP])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("all-ip starts");
    let mut backend = KillOnDrop(backend);
    let backend_lines = line_reader(backend.0.stdout.take().expect("stdout"));
    let watch = Command::new(NODUS)
        .args(["view", "--watch", "--source", "agent", "--socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("view --watch starts");
    let mut watch = KillOnDrop(watch);
    let watch_lines = line_reader(watch.0.stdout.take().expect("stdout"));
    let handed_line = wait_for("view --watch prints the handed service", || {
        let line: Value =
            serde_json::from_str(&watch_lines.recv_timeout(Duration::from_secs(30)).ok()?).ok()?;
        (line["name"] == "handed").then_some(line)
    });
    assert_eq!(handed_line["object"]["spec"]["serviceProxyName"], "all-ip");
    assert!(
        handed_line["seq"].as_u64().is_some_and(|seq| seq >= 1),
        "{handed_line}"
    );
    let programmed = backend_lines
        .recv_timeout(Duration::from_secs(30))
        .expect("all-ip programs its table");
    assert!(
        programmed.contains(&format!("'{EXTERNAL}': '10.244.1.11'")),
        "{programmed}"
    );

    // Everything sent to the external IP lands on node-a's local endpoint, whatever the
    // port and protocol: the echo's TCP and UDP port, which the Service does not list.
    route_via(&underlay, &format!("{EXTERNAL}/32"), "172.30.0.11");
    assert_eq!(
        curl(&underlay, &format!("http://{EXTERNAL}:8080/"), &[]).as_deref(),
        Ok("a-1")
    );
    assert_eq!(udp(&underlay, EXTERNAL, 8080), "a-1");
    // nodus's own proxy runs beside it, and leaves the handed service alone.
    let pod = sandbox.ns("pods", "a-1");
    assert_eq!(curl(&pod, "http://10.96.2.2/", &[]).as_deref(), Ok("b-1"));
    assert!(
        curl(&pod, "http://10.96.2.1/", &[]).is_err(),
        "the handed ClusterIP is not nodus's"
    );

    // Both subscribers show in the agent's status and metrics.
    let subscribers = wait_for("two subscribers in the status", || {
        subscribe_status(&node_a).filter(|line| line["objects"]["subscriber"] == 2)
    });
    assert_eq!(subscribers["objects"]["cut off"], 0, "{subscribers}");
    let metrics = Command::new("ip")
        .args(["netns", "exec", &node_a, "curl", "-s", "-m", "2"])
        .arg("http://127.0.0.1:10256/metrics")
        .output()
        .expect("curl runs");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    for series in ["nodus_subscribers 2", "nodus_subscribers_cut_off_total 0"] {
        assert!(
            metrics.lines().any(|l| l == series),
            "{series} in:\n{metrics}"
        );
    }

    // The agent restarts, as a rollout restarts it: the backend's rules carry traffic
    // meanwhile, and both subscribers reconnect to the new process (which sends them a
    // snapshot: `view --watch` prints the handed service again).
    eprintln!("{}", sandbox.restart_agent("node-a", Path::new(NODUS)));
    assert_eq!(
        curl(&underlay, &format!("http://{EXTERNAL}:8080/"), &[]).as_deref(),
        Ok("a-1")
    );
    wait_for("view --watch after the restart", || {
        let line: Value =
            serde_json::from_str(&watch_lines.recv_timeout(Duration::from_secs(30)).ok()?).ok()?;
        (line["name"] == "handed").then_some(line)
    });
    wait_for("both subscribers on the new agent", || {
        subscribe_status(&node_a).filter(|line| line["objects"]["subscriber"] == 2)
    });

    // Handed back to nodus: the backend (following the new agent) removes its rules, and
    // nodus's proxy takes the external IP on the service's own port.
    let mut unlabelled = service(
        "handed",
        json!({"clusterIP": "10.96.2.1", "externalIPs": [EXTERNAL]}),
    );
    unlabelled["metadata"]["labels"] = json!({});
    sandbox_apply(&sandbox, &unlabelled);
    let cleared = backend_lines
        .recv_timeout(Duration::from_secs(30))
        .expect("all-ip reprograms");
    assert!(cleared.ends_with("{}"), "{cleared}");
    assert!(curl(&underlay, &format!("http://{EXTERNAL}:8080/"), &[]).is_err());
    wait_for("nodus proxies the external IP", || {
        curl(&underlay, &format!("http://{EXTERNAL}/"), &[]).ok()
    });
    let relabelled = wait_for("view --watch prints the change", || {
        let line: Value =
            serde_json::from_str(&watch_lines.recv_timeout(Duration::from_secs(30)).ok()?).ok()?;
        (line["name"] == "handed").then_some(line)
    });
    assert!(
        relabelled["object"]["spec"]
            .get("serviceProxyName")
            .is_none(),
        "{relabelled}"
    );

    protocol(&socket, &sandbox);

    // The backend removes its table when it stops.
    netns::run("kill", &["-TERM", &backend.0.id().to_string()]).expect("kill");
    let _ = backend.0.wait();
    let tables =
        netns::run("ip", &["netns", "exec", &node_a, "nft", "list", "tables"]).expect("nft");
    assert!(!tables.contains("nodus-all-ip"), "{tables}");
    let _ = watch.0.kill();
}

fn sandbox_apply(sandbox: &Sandbox, object: &Value) {
    let file = sandbox.dir.join("apply.json");
    std::fs::write(&file, object.to_string()).expect("object file");
    let kubeconfig = sandbox.dir.join("kubeconfig");
    netns::run(
        "kubectl",
        &[
            "--kubeconfig",
            &kubeconfig.to_string_lossy(),
            "apply",
            "--validate=false",
            "-f",
            &file.to_string_lossy(),
        ],
    )
    .expect("kubectl apply");
}

/// The socket's protocol against the same agent: a resume gets only what changed, a bad
/// hello is refused, and a subscriber that stops reading is cut off.
fn protocol(socket: &Path, sandbox: &Sandbox) {
    let mut first = Subscriber::connect(socket, "{}\n");
    let snapshot = first.next();
    assert_eq!(snapshot["kind"], "Snapshot", "{snapshot}");
    assert_eq!(snapshot["node"], "node-a");
    let lines = first.until_synced();
    let all = names(&lines);
    assert!(
        all.contains(&"Service handed".to_string()) && all.contains(&"Node node-b".to_string()),
        "{all:?}"
    );
    let seq = lines.last().expect("synced")["seq"].as_u64().expect("seq");
    drop(first);

    // Meanwhile one service changes; the resumed subscriber is sent that alone.
    sandbox_apply(sandbox, &slice("proxied", &[A1, B1]));
    let hello = json!({"since": {"epoch": snapshot["epoch"], "seq": seq}});
    let mut resumed = Subscriber::connect(socket, &format!("{hello}\n"));
    let lines = resumed.until_synced();
    assert_eq!(names(&lines), ["Service proxied", "Synced "], "{lines:?}");
    drop(resumed);

    // Another process's numbers, or none it can use, get a snapshot.
    let stale = json!({"since": {"epoch": "another", "seq": seq}});
    assert_eq!(
        Subscriber::connect(socket, &format!("{stale}\n")).next()["kind"],
        "Snapshot"
    );
    // A hello that is not one is refused with the reason.
    let refused = Subscriber::connect(socket, "{\"sinse\": 1}\n").next();
    assert_eq!(refused["kind"], "Error", "{refused}");
    assert!(
        refused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("bad hello")),
        "{refused}"
    );

    // A subscriber that stops reading: large changes fill its socket, and it is cut off
    // after the write timeout without holding the others back.
    let mut stalled = UnixStream::connect(socket).expect("connect");
    stalled.write_all(b"{}\n").expect("hello");
    let mut reader = Subscriber::connect(socket, "{}\n");
    reader.until_synced();
    let pods: Vec<(String, String)> = (0..1000)
        .map(|i| {
            (
                format!("p-{i}"),
                format!("10.245.{}.{}", i / 200, i % 200 + 1),
            )
        })
        .collect();
    sandbox_apply(sandbox, &service("big", json!({"clusterIP": "10.96.2.3"})));
    reader.until_synced();
    for round in 0..6 {
        let endpoints: Vec<Value> = pods
            .iter()
            .map(|(name, ip)| json!({"addresses": [ip], "conditions": {"ready": round % 2 == 0},
                                     "nodeName": "node-a", "targetRef": {"kind": "Pod", "name": name}}))
            .collect();
        let big = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                         "metadata": {"name": "big", "namespace": "default",
                                      "labels": {"kubernetes.io/service-name": "big"}},
                         "addressType": "IPv4", "endpoints": endpoints,
                         "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]});
        sandbox_apply(sandbox, &big);
        let lines = reader.until_synced();
        assert!(
            names(&lines).contains(&"Service big".to_string()),
            "round {round}: {lines:?}"
        );
    }
    let node_a = sandbox.ns("nodes", "node-a");
    let cut = wait_for("the stalled subscriber cut off", || {
        subscribe_status(&node_a).filter(|line| line["objects"]["cut off"] == 1)
    });
    assert!(cut["objects"]["refused"].as_u64() >= Some(1), "{cut}");
    // What it did not read is still there, then the connection ends (a chunk cut short
    // leaves its last line unfinished: a client drops such a line).
    let mut rest = Vec::new();
    stalled
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    stalled
        .read_to_end(&mut rest)
        .expect("the agent closed the stalled connection");
    assert!(rest.len() > 100_000, "{} bytes", rest.len());
    // The others were served all along, and still are.
    sandbox_apply(sandbox, &slice("proxied", &[B1]));
    assert!(names(&reader.until_synced()).contains(&"Service proxied".to_string()));

    // One client cannot take every place: past `max_subscribers` (8, with all-ip,
    // `view --watch` and `reader` among them) a connection is told so and closed, and
    // those already in keep being served.
    let mut taken: Vec<Subscriber> = Vec::new();
    let refused = loop {
        assert!(taken.len() < 8, "no refusal after {} more", taken.len());
        let mut extra = Subscriber::connect(socket, "{}\n");
        let first = extra.next();
        if first["kind"] == "Error" {
            break first;
        }
        assert_eq!(first["kind"], "Snapshot", "{first}");
        taken.push(extra);
    };
    assert_eq!(taken.len(), 5, "three were in before");
    assert!(
        refused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("too many subscribers")),
        "{refused}"
    );
    sandbox_apply(sandbox, &slice("proxied", &[A1, B1]));
    assert!(names(&reader.until_synced()).contains(&"Service proxied".to_string()));
}
