//! An upgrade under traffic: `nodus sandbox` runs the old build on both nodes; a pod on
//! node-a keeps a long-lived TCP connection through a ClusterIP to a pod on node-b (one
//! exchange every 50 ms) and opens new connections to another ClusterIP in a loop, while
//! node-a's nodus is stopped with SIGTERM and the new build is started in its place, as a
//! DaemonSet rollout does. Nothing may fail, and the new process must adopt the nftables
//! table and the WireGuard device instead of making them again.

use crate::proxy_packets::{A1, B1, node, service, slice, udp_ask};
use crate::support::{KillOnDrop, NODUS, Sandbox, WAIT, line_reader, wait_for};
use nodus_testbed::netns;
use serde_json::{Value, json};
use std::ffi::OsStr;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The new connections go to a Service of two ports (TCP and UDP to the pods' 8080): a
/// release of before session 36 gave it a dispatch chain per port, which the new build
/// replaces with one chain for both while connections keep coming.
fn cluster() -> String {
    let mut short_slice = slice("short", &[A1, B1]);
    short_slice["ports"] = json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                                  {"name": "dns", "port": 8080, "protocol": "UDP"}]);
    let docs = [
        node("node-a", 1),
        node("node-b", 2),
        service("long", json!({"clusterIP": "10.96.3.1"})),
        slice("long", &[B1]),
        service(
            "short",
            json!({"clusterIP": "10.96.3.2", "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "dns", "port": 53, "targetPort": 8080, "protocol": "UDP"}]}),
        ),
        short_slice,
    ];
    docs.iter().map(|doc| format!("---\n{doc}\n")).collect()
}

/// Exchanges and new connections the client sees succeed after the new process is ready.
const AFTER_READY: u64 = 10;

/// The client, run in pod a-1 with [`AFTER_READY`] as its argument. It prints `ready` once
/// both kinds of traffic flow; on the line `mark` on stdin it starts counting what succeeds
/// from then on, and on `stop` it stops after that many of each (or a failure) and prints
/// its counts as JSON. The long-lived connection is never reopened: its first failure ends
/// it. Retransmissions (SYNs included) are read from `TCP_INFO`.
const CLIENT: &str = r#"
import json, socket, sys, threading, time

LONG, SHORT = ('10.96.3.1', 80), ('10.96.3.2', 80)
AFTER_READY = int(sys.argv[1])
stats = {'exchanges': 0, 'exchangesAfterMark': 0, 'exchangeErrors': [],
         'connections': 0, 'connectionsAfterMark': 0, 'connectionErrors': [],
         'longRetransmits': 0, 'shortRetransmits': 0}
marked, stop = threading.Event(), threading.Event()

def retransmits(s):
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int.from_bytes(info[100:104], 'little')  # tcpi_total_retrans

def long_lived():
    s = socket.create_connection(LONG, timeout=2)
    answers = s.makefile('rb')
    while not stop.is_set():
        try:
            s.sendall(b'ping\n')
            answer = answers.readline().strip()
            if answer != b'b-1':
                raise ValueError(f'answer {answer!r}')
        except Exception as e:
            stats['exchangeErrors'].append(repr(e))
            return
        stats['exchanges'] += 1
        stats['exchangesAfterMark'] += marked.is_set()
        stats['longRetransmits'] = retransmits(s)
        time.sleep(0.05)

def short():
    while not stop.is_set():
        try:
            with socket.create_connection(SHORT, timeout=2) as s:
                s.sendall(b'GET / HTTP/1.0\r\n\r\n')
                reply = b''
                while chunk := s.recv(1000):
                    reply += chunk
                stats['shortRetransmits'] += retransmits(s)
            if not reply.startswith(b'HTTP/1.1 200'):
                raise ValueError(f'reply {reply!r}')
        except Exception as e:
            stats['connectionErrors'].append(repr(e))
            continue
        stats['connections'] += 1
        stats['connectionsAfterMark'] += marked.is_set()

threads = [threading.Thread(target=f) for f in (long_lived, short)]
for t in threads:
    t.start()
while stats['exchanges'] + len(stats['exchangeErrors']) == 0 or \
        stats['connections'] + len(stats['connectionErrors']) == 0:
    time.sleep(0.01)
print('ready', flush=True)
for line in sys.stdin:
    if line.strip() == 'mark':
        marked.set()
    elif line.strip() == 'stop':
        break
# Some traffic after the mark (the new process synced) before stopping, unless it fails.
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not stats['exchangeErrors'] and \
        min(stats['exchangesAfterMark'], stats['connectionsAfterMark']) < AFTER_READY:
    time.sleep(0.01)
stop.set()
for t in threads:
    t.join()
print(json.dumps(stats), flush=True)
"#;

/// The old build and the new one. The new one is this checkout's test build: the code a
/// developer just changed is the side that must adopt what the old one left (the harder
/// side of an upgrade), and `NODUS_UPGRADE_BINARY` may then name a truly older release.
/// CI sets it to the static release build of this commit: another profile, libc linked
/// statically, other codegen, so nothing may depend on the two being the same binary.
fn builds() -> (PathBuf, PathBuf) {
    // Canonical, as `/proc/PID/exe` names a process's binary.
    let new = std::fs::canonicalize(NODUS).expect("the test build");
    match std::env::var_os("NODUS_UPGRADE_BINARY") {
        Some(old) => {
            let old = std::fs::canonicalize(&old)
                .unwrap_or_else(|e| panic!("NODUS_UPGRADE_BINARY={old:?}: {e}"));
            (old, new)
        }
        None => {
            eprintln!(
                "NODUS_UPGRADE_BINARY is unset: the upgrade test restarts {NODUS} with itself"
            );
            (new.clone(), new)
        }
    }
}

/// What the new process must adopt rather than make again, read from node-a.
#[derive(Debug, PartialEq)]
struct Dataplane {
    table_handle: String,
    device_index: String,
    handshakes: String,
}

impl Dataplane {
    fn read(node_ns: &str, device: &str) -> Dataplane {
        let table = exec(node_ns, "nft", &["-a", "list", "table", "inet", "nodus"]);
        let table_handle = table
            .lines()
            .next()
            .and_then(|l| l.split("# handle ").nth(1))
            .unwrap_or_else(|| panic!("no table handle in {table}"))
            .to_string();
        let link = exec(node_ns, "ip", &["-o", "link", "show", "dev", device]);
        let device_index = link.split(':').next().unwrap_or_default().to_string();
        let handshakes = exec(node_ns, "wg", &["show", device, "latest-handshakes"]);
        assert!(
            !handshakes.trim().is_empty() && !handshakes.lines().any(|l| l.ends_with("\t0")),
            "node-a has a session with its peer: {handshakes:?}"
        );
        Dataplane {
            table_handle,
            device_index,
            handshakes,
        }
    }
}

/// The binary of the process serving the node's HTTP port (its nodus).
fn agent_binary(node_ns: &str) -> PathBuf {
    let listener = exec(node_ns, "ss", &["-Hltnp", "sport = :10256"]);
    let pid = listener
        .split("pid=")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no process listens on :10256: {listener:?}"));
    std::fs::read_link(format!("/proc/{pid}/exe")).expect("the agent's binary")
}

fn exec(ns: &str, program: &str, args: &[&str]) -> String {
    let mut full = vec!["netns", "exec", ns, program];
    full.extend_from_slice(args);
    netns::run("ip", &full).unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn an_upgrade_under_traffic_adopts_the_table_and_the_device_and_drops_nothing() {
    let (old, new) = builds();
    let mut sandbox = Sandbox::start_with(
        "upgrade",
        Some(&cluster()),
        &[OsStr::new("--agent-binary"), old.as_os_str()],
    );
    let node_ns = sandbox.ns("nodes", "node-a");
    let device = sandbox.namespaces["meshInterfaces"]["node-a"]
        .as_str()
        .expect("node-a's mesh interface")
        .to_string();
    let before = Dataplane::read(&node_ns, &device);

    let mut client = Command::new("ip")
        .args(["netns", "exec", &sandbox.ns("pods", "a-1"), "python3", "-c"])
        .arg(CLIENT)
        .arg(AFTER_READY.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the client starts");
    let mut commands = client.stdin.take().expect("stdin");
    let output = line_reader(client.stdout.take().expect("stdout"));
    let _client = KillOnDrop(client);
    let next = || output.recv_timeout(WAIT).expect("the client answers");
    assert_eq!(next(), "ready");

    assert_eq!(agent_binary(&node_ns), old, "the old build runs on node-a");
    let restarting = std::time::Instant::now();
    eprintln!("{}", sandbox.restart_agent("node-a", &new));
    // The old process is gone: any answer now is the new one's.
    let readyz = "http://127.0.0.1:10256/readyz";
    wait_for("the new nodus to be ready", || {
        let code = netns::run(
            "ip",
            &[
                "netns",
                "exec",
                &node_ns,
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                readyz,
            ],
        );
        (code.ok()? == "200").then_some(())
    });
    eprintln!(
        "node-a ready again {:?} after the restart began",
        restarting.elapsed()
    );
    assert_eq!(agent_binary(&node_ns), new, "the new build runs on node-a");
    writeln!(commands, "mark").expect("client stdin");
    writeln!(commands, "stop").expect("client stdin");
    let stats: Value = serde_json::from_str(&next()).expect("the client's counts");
    eprintln!("traffic across the upgrade: {stats}");

    assert_eq!(stats["exchangeErrors"], json!([]), "{stats}");
    assert_eq!(stats["connectionErrors"], json!([]), "{stats}");
    assert!(
        stats["exchangesAfterMark"].as_u64() >= Some(AFTER_READY),
        "the long-lived connection survived: {stats}"
    );
    assert!(
        stats["connectionsAfterMark"].as_u64() >= Some(AFTER_READY),
        "{stats}"
    );
    // The two-port Service's other port, through what the new process programmed.
    let answer = udp_ask(&sandbox.ns("pods", "a-1"), "10.96.3.2");
    assert!(
        ["a-1", "b-1"].contains(&answer.as_str()),
        "a pod answers the two-port Service's UDP port: {answer:?}"
    );
    assert_eq!(
        Dataplane::read(&node_ns, &device),
        before,
        "the table, the device and its session are the old ones"
    );
}
