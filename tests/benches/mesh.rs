//! The mesh bench: a real `nodus run` with the mesh on (the wireguard-go backend, or the
//! embedded one), in a node namespace, against the API-server stand-in holding N other
//! Nodes with keys.
//!
//! For each N it reports the cold start (process start → every peer and route in place),
//! the first sync's own time (the kernel programming of N peers and N routes), the latency
//! of a Node join (API write → peer in place, as `/metrics` reports it; median and worst of
//! 20), and memory: nodus's RSS and anonymous memory after the cold sync, per peer against
//! the run with no peer, and wireguard-go's RSS (zero with the embedded backend, whose
//! peers are in nodus's own). It prints figures; it asserts nothing.
//!
//! `cargo bench --bench mesh -- [--peers N]… [--joins N] [--nodus PATH] [--backend B]`

use anyhow::{Context, bail};
use nodus_mesh::key::KeyPair;
use nodus_mesh::plan::{ANNOTATION_PORT, ANNOTATION_PUBLIC_KEY};
use nodus_testbed::bench::BenchCluster;
use nodus_testbed::netns::{self, Node, Underlay, unique_name};
use nodus_testbed::probe::http_get;
use nodus_testbed::scale::{ProcMemory, proc_memory};
use serde_json::{Value, json};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

const API_PORT: u16 = 6443;
const HTTP: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 10256);
const LIMIT: Duration = Duration::from_secs(300);

struct Options {
    peers: Vec<usize>,
    joins: usize,
    nodus: PathBuf,
    /// `mesh.backend`: `wireguard-go` or `embedded`.
    backend: String,
}

fn options() -> anyhow::Result<Options> {
    let mut opts = Options {
        peers: Vec::new(),
        joins: 20,
        nodus: PathBuf::from(env!("CARGO_BIN_EXE_nodus")),
        backend: "wireguard-go".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--peers" => opts.peers.push(value()?.parse()?),
            "--joins" => opts.joins = value()?.parse()?,
            "--nodus" => opts.nodus = value()?.into(),
            "--backend" => opts.backend = value()?,
            "--bench" => {}
            other => bail!("unknown argument {other:?}"),
        }
    }
    if opts.peers.is_empty() {
        opts.peers = vec![1000, 5000];
    }
    Ok(opts)
}

/// Node `i` (1-based) of the generated cluster: pod CIDR 10.x.y.0/24, address 172.16.x.y,
/// a real key (peers' endpoints are never reached: the bench measures programming).
fn node(i: usize) -> Value {
    let (hi, lo) = (i >> 8, i & 0xff);
    let key = KeyPair::generate()
        .map(|k| k.public.to_base64())
        .unwrap_or_default();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("node-{i}"), "annotations": {
            ANNOTATION_PUBLIC_KEY: key, ANNOTATION_PORT: "51820"}},
        "spec": {"podCIDRs": [format!("10.{hi}.{lo}.0/24")]},
        "status": {"addresses": [{"type": "InternalIP", "address": format!("172.16.{hi}.{lo}")}]},
    })
}

struct Row {
    peers: usize,
    cold: Duration,
    first_sync: Duration,
    joins: Vec<Duration>,
    nodus: ProcMemory,
    wireguard_go_rss_kib: u64,
}

fn metric(ns: &netns::Netns, series: &str) -> Option<f64> {
    let (_, body) = ns
        .enter(|| http_get(HTTP, "/metrics", Duration::from_secs(5)))
        .ok()?
        .ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

fn wait_metric(
    ns: &netns::Netns,
    series: &str,
    expected: f64,
    since: Instant,
) -> anyhow::Result<Duration> {
    loop {
        if metric(ns, series) == Some(expected) {
            return Ok(since.elapsed());
        }
        if since.elapsed() > LIMIT {
            bail!("{series} never reached {expected}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The `took` of the first "mesh synced" log line, e.g. `took: 812.5ms`.
fn first_sync(log: &str) -> Option<Duration> {
    let line = log.lines().find(|l| l.contains("mesh synced"))?;
    let took = line
        .split("took: ")
        .nth(1)?
        .split(' ')
        .next()?
        .trim_end_matches([',', '}']);
    let (number, scale) = if let Some(ms) = took.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(us) = took.strip_suffix("µs") {
        (us, 1e-6)
    } else {
        (took.strip_suffix('s')?, 1.0)
    };
    number
        .parse::<f64>()
        .ok()
        .map(|v| Duration::from_secs_f64(v * scale))
}

fn run(opts: &Options, peers: usize) -> anyhow::Result<Row> {
    let underlay = Underlay::new([10, 203, 0], [0xfd00, 0x203, 0, 0])?;
    let node_ns = Node::new(&underlay, "node-0", 2)?;
    let own = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-0"},
        "spec": {"podCIDRs": ["10.255.0.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": underlay.v4(2).to_string()}]},
    });
    let cluster = BenchCluster::new(
        10_000 + opts.joins,
        std::iter::once(own).chain((1..=peers).map(node)),
    )?;
    let kubeconfig =
        cluster.listen_in(&underlay.ns, SocketAddr::from((underlay.v4(1), API_PORT)))?;
    let interface = unique_name("wg");
    let dir = cluster.dir.join("node-0");
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "cluster_cidrs: [10.0.0.0/8]\ndns:\n  enabled: false\nmesh:\n  enabled: true\n  backend: {}\n  interface: {interface}\n  \
             key_file: {}\n  cni_conflist: {}\n",
            opts.backend,
            dir.join("key").display(),
            dir.join("10-nodus.conflist").display()
        ),
    )?;
    let log = dir.join("nodus.log");
    let mut cmd = node_ns.ns.command(&opts.nodus.to_string_lossy());
    cmd.args(["run", "--node-name", "node-0", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--config")
        .arg(&config)
        .args(["--http-addr", &HTTP.to_string()])
        .env("NODUS_LOG", "info")
        .env("NODUS_ALLOW_HTTP_API", "true")
        .env("NODUS_STATE_DIR", dir.join("state"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    let started = Instant::now();
    let pid = node_ns.ns.spawn(cmd)?;
    let result: anyhow::Result<Row> = (|| {
        let cold = wait_metric(&node_ns.ns, "nodus_mesh_routes", peers as f64, started)?;
        let first_sync = match peers {
            0 => Duration::ZERO,
            _ => first_sync(&std::fs::read_to_string(&log)?).context("no first sync in the log")?,
        };
        std::thread::sleep(Duration::from_secs(1));
        let nodus = proc_memory(pid)?;
        let wireguard_go_rss_kib = netns::run("ip", &["netns", "pids", node_ns.ns.name()])?
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .filter(|p| *p != pid)
            .filter_map(|p| proc_memory(p).ok())
            .map(|m| m.rss_kib)
            .sum();
        let mut joins = Vec::new();
        for j in 1..=opts.joins {
            let joined = Instant::now();
            cluster.store.apply_value(node(peers + j))?;
            joins.push(wait_metric(
                &node_ns.ns,
                "nodus_mesh_routes",
                (peers + j) as f64,
                joined,
            )?);
        }
        joins.sort();
        Ok(Row {
            peers,
            cold,
            first_sync,
            joins,
            nodus,
            wireguard_go_rss_kib,
        })
    })();
    let _ = std::fs::remove_file(format!("/var/run/wireguard/{interface}.sock"));
    result.with_context(|| format!("see {}", log.display()))
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn print_row(row: &Row, base: &Row) {
    let per_peer = |now: u64, then: u64| match row.peers {
        0 => "-".to_string(),
        n => format!("{:.0}", (now.saturating_sub(then) * 1024) as f64 / n as f64),
    };
    let mib = |kib: u64| format!("{:.1}", kib as f64 / 1024.0);
    let join = |i: usize| row.joins.get(i).map_or("-".to_string(), |d| ms(*d));
    println!(
        "{:>6} {:>9} {:>11} {:>9} {:>9} {:>8} {:>9} {:>11} {:>12} {:>7}",
        row.peers,
        ms(row.cold),
        ms(row.first_sync),
        join(row.joins.len() / 2),
        join(row.joins.len().saturating_sub(1)),
        mib(row.nodus.rss_kib),
        mib(row.nodus.anon_kib),
        per_peer(row.nodus.rss_kib, base.nodus.rss_kib),
        per_peer(row.nodus.anon_kib, base.nodus.anon_kib),
        mib(row.wireguard_go_rss_kib),
    );
}

fn main() -> anyhow::Result<()> {
    let opts = options()?;
    anyhow::ensure!(
        netns::is_root(),
        "the mesh bench needs root (network namespaces)"
    );
    println!(
        "mesh bench: nodus {} ({} backend), {} joins per size",
        opts.nodus.display(),
        opts.backend,
        opts.joins
    );
    println!(
        "{:>6} {:>9} {:>11} {:>9} {:>9} {:>8} {:>9} {:>11} {:>12} {:>7}",
        "PEERS",
        "COLD_MS",
        "1ST_SYNC_MS",
        "JOIN_P50",
        "JOIN_MAX",
        "RSS_MIB",
        "ANON_MIB",
        "RSS_B/PEER",
        "ANON_B/PEER",
        "WG_MIB"
    );
    let base = run(&opts, 0)?;
    print_row(&base, &base);
    for &peers in &opts.peers {
        print_row(&run(&opts, peers)?, &base);
    }
    Ok(())
}
