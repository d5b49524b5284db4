//! DNS throughput: `dnsperf` against nodus answering a generated cluster, and against NSD
//! serving the equivalent zone file, in the same run, on the same query files.
//!
//! Query sets: existing service A names; SRV names; the search-path mix that `ndots:5`
//! produces (four misses per hit); and, for nodus only (NSD's zone has no reverse names),
//! PTR of endpoints of ClusterIP services, which are not indexed and read every slice. Two agents serve the same cluster: one with one UDP
//! thread (as NSD here has one server process) and one with two (`dns.udp_threads`).
//! Besides QPS and latency it prints the CPU time each server spent per query, which does not
//! depend on how loaded the shared machine was. It prints figures and asserts nothing.
//!
//! `cargo bench --bench dns -- [--services 10000] [--seconds 10] [--runs 3] [--nodus PATH]`
//! (needs `dnsperf` and `nsd` from Debian).

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use anyhow::{Context, bail};
use nodus_testbed::bench::{BenchCluster, free_port};
use nodus_testbed::scale::{self, Shape, proc_memory};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Options {
    services: usize,
    seconds: u32,
    /// Alternating runs per server and query set; the medians are reported.
    runs: usize,
    nodus: PathBuf,
}

fn options() -> anyhow::Result<Options> {
    let mut opts = Options {
        services: 10_000,
        seconds: 10,
        runs: 3,
        nodus: PathBuf::from(env!("CARGO_BIN_EXE_nodus")),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--services" => opts.services = value()?.parse()?,
            "--seconds" => opts.seconds = value()?.parse()?,
            "--runs" => opts.runs = value()?.parse::<usize>()?.max(1),
            "--nodus" => opts.nodus = value()?.into(),
            "--bench" => {}
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok(opts)
}

fn service_fqdn(i: usize) -> String {
    format!(
        "{}.{}.svc.cluster.local",
        scale::service_name(i),
        scale::namespace(i)
    )
}

/// A query file: its label, its path, and whether NSD is asked it too.
type QueryFile = (&'static str, PathBuf, bool);

/// The query files, as dnsperf reads them (`name type` per line).
fn query_files(dir: &Path, services: usize) -> anyhow::Result<Vec<QueryFile>> {
    let (mut hits, mut srv, mut mix) = (String::new(), String::new(), String::new());
    let mut ptr = String::new();
    for i in 0..services {
        let [a, b, c, d] = scale::pod_ip(i, 0, 0).octets();
        writeln!(ptr, "{d}.{c}.{b}.{a}.in-addr.arpa PTR")?;
        let name = service_fqdn(i);
        writeln!(hits, "{name} A")?;
        writeln!(srv, "_http._tcp.{name} SRV")?;
        // A pod in another namespace looks up `svc.ns` (one miss, then the hit) and an
        // external name (three misses through the search list before it leaves the zone).
        let own_ns = scale::namespace(i + 1);
        let short = format!("{}.{}", scale::service_name(i), scale::namespace(i));
        writeln!(mix, "{short}.{own_ns}.svc.cluster.local A")?;
        writeln!(mix, "{name} A")?;
        for suffix in [
            format!("{own_ns}.svc.cluster.local"),
            "svc.cluster.local".into(),
            "cluster.local".into(),
        ] {
            writeln!(mix, "api-{i}.example.com.{suffix} A")?;
        }
    }
    let mut files = Vec::new();
    for (label, text, nsd) in [
        ("A, existing names", hits, true),
        ("SRV", srv, true),
        ("search-path mix (4 misses per hit)", mix, true),
        ("PTR of endpoints (nodus only)", ptr, false),
    ] {
        let path = dir.join(format!("queries-{}.txt", files.len()));
        std::fs::write(&path, text)?;
        files.push((label, path, nsd));
    }
    Ok(files)
}

/// The same records as a zone file, for NSD.
fn zone_file(dir: &Path, services: usize) -> anyhow::Result<PathBuf> {
    let mut zone = String::from(
        "$ORIGIN cluster.local.\n$TTL 5\n\
         @ IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5\n\
         @ IN NS ns.dns.cluster.local.\nns.dns IN A 10.96.0.10\n\
         dns-version IN TXT \"1.1.0\"\n",
    );
    for i in 0..services {
        let rel = format!("{}.{}.svc", scale::service_name(i), scale::namespace(i));
        writeln!(zone, "{rel} IN A {}", scale::cluster_ip(i))?;
        writeln!(
            zone,
            "_http._tcp.{rel} IN SRV 0 100 80 {rel}.cluster.local."
        )?;
    }
    let path = dir.join("cluster.local.zone");
    std::fs::write(&path, zone)?;
    Ok(path)
}

struct Nsd(Child);

impl Drop for Nsd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_nsd(dir: &Path, zone: &Path, port: u16) -> anyhow::Result<Nsd> {
    let d = dir.display();
    let conf = format!(
        "server:\n  ip-address: 127.0.0.1\n  port: {port}\n  server-count: 1\n  username: \"\"\n  \
         chroot: \"\"\n  zonesdir: \"{d}\"\n  database: \"\"\n  pidfile: \"{d}/nsd.pid\"\n  \
         xfrdfile: \"{d}/xfrd.state\"\n  zonelistfile: \"{d}/zone.list\"\n  logfile: \"{d}/nsd.log\"\n  \
         rrl-ratelimit: 0\nremote-control:\n  control-enable: no\nzone:\n  name: cluster.local\n  \
         zonefile: \"{}\"\n",
        zone.display()
    );
    let path = dir.join("nsd.conf");
    std::fs::write(&path, conf)?;
    let child = Command::new("nsd")
        .args(["-d", "-c"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting nsd (Debian package nsd)")?;
    let nsd = Nsd(child);
    for _ in 0..200 {
        let probe = Command::new("dig")
            .args([
                "@127.0.0.1",
                "-p",
                &port.to_string(),
                "+short",
                "+time=1",
                "+tries=1",
            ])
            .arg(service_fqdn(0))
            .output()?;
        if !probe.stdout.is_empty() {
            return Ok(nsd);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nsd did not answer; see {d}/nsd.log")
}

struct Perf {
    qps: f64,
    latency_ms: f64,
    lost: String,
    /// CPU time (user and system) the server spent per answered query, in microseconds:
    /// unlike QPS, it does not depend on how much of the machine the server got.
    cpu_us: f64,
}

impl Perf {
    /// The count of lost queries, when there were any.
    fn lost_count(&self) -> Option<&str> {
        self.lost.split_whitespace().next().filter(|n| *n != "0")
    }
}

/// CPU seconds `pid` and its descendants (NSD answers from forked server processes) have
/// used.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // (pid, parent, user + system ticks) of every process.
    let mut processes: Vec<(u32, u32, u64)> = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(stat) = std::fs::read_to_string(entry?.path().join("stat")) else {
            continue;
        };
        // After the command's closing parenthesis: state, ppid, … utime (12th), stime.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let number = |s: Option<&str>| s.and_then(|v| v.parse::<u64>().ok());
        if let (Some(this), Some(parent)) = (
            number(head.split_whitespace().next()),
            number(fields.get(1).copied()),
        ) {
            let used = number(fields.get(11).copied()).unwrap_or(0)
                + number(fields.get(12).copied()).unwrap_or(0);
            processes.push((this as u32, parent as u32, used));
        }
    }
    let mut tree = vec![pid];
    let mut total = 0;
    while let Some(next) = tree.pop() {
        for (this, parent, used) in &processes {
            if *this == next {
                total += used;
            } else if *parent == next {
                tree.push(*this);
            }
        }
    }
    Ok(total as f64 / ticks)
}

/// One dnsperf run against the server on `port`, whose process is `pid`.
fn dnsperf(port: u16, pid: u32, queries: &Path, seconds: u32) -> anyhow::Result<Perf> {
    let cpu_before = cpu_seconds(pid)?;
    let output = Command::new("dnsperf")
        .args([
            "-s",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-c",
            "4",
            "-T",
            "1",
            "-q",
            "200",
        ])
        .args(["-l", &seconds.to_string(), "-d"])
        .arg(queries)
        .output()
        .context("running dnsperf (Debian package dnsperf)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |key: &str| -> Option<String> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|v| v.trim().to_string())
    };
    let number = |key: &str| -> anyhow::Result<f64> {
        field(key)
            .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
            .with_context(|| format!("no {key:?} in dnsperf output:\n{text}"))
    };
    let cpu = cpu_seconds(pid)? - cpu_before;
    Ok(Perf {
        qps: number("Queries per second:")?,
        latency_ms: number("Average Latency (s):")? * 1000.0,
        lost: field("Queries lost:").unwrap_or_default(),
        cpu_us: cpu * 1e6 / number("Queries completed:")?.max(1.0),
    })
}

/// The run with the median QPS.
fn median(mut runs: Vec<Perf>) -> Perf {
    runs.sort_by(|a, b| a.qps.total_cmp(&b.qps));
    runs.swap_remove(runs.len() / 2)
}

fn main() -> anyhow::Result<()> {
    let opts = options()?;
    let shape = Shape {
        services: opts.services,
        endpoints_per_service: 10,
        nodes: 100,
    };
    let cluster = BenchCluster::new(10_000, scale::cluster(&shape))?;
    // (UDP threads, port, agent), started one after the other.
    let mut agents = Vec::new();
    for threads in [1, 2] {
        let port = free_port()?;
        let agent = cluster.start_agent(
            &opts.nodus,
            &scale::node_name(0),
            &format!("dns:\n  listen: [\"127.0.0.1:{port}\"]\n  udp_threads: {threads}\n"),
        )?;
        agent.wait_ready(Duration::from_secs(600))?;
        agents.push((threads, port, agent));
    }
    let before: Vec<_> = agents
        .iter()
        .map(|(_, _, agent)| proc_memory(agent.pid()))
        .collect::<Result<_, _>>()?;

    let files = query_files(&cluster.dir, opts.services)?;
    let zone = zone_file(&cluster.dir, opts.services)?;
    let nsd_port = free_port()?;
    let nsd = start_nsd(&cluster.dir, &zone, nsd_port)?;

    println!(
        "DNS bench: {} services × 10 endpoints; dnsperf -c 4 -T 1 -q 200 -l {} on loopback; \
         median of {} alternating runs (nodus with 1 UDP thread, with 2, NSD)",
        opts.services, opts.seconds, opts.runs
    );
    println!(
        "{:<36} | {:>9} {:>6} {:>6} {:>5} | {:>9} {:>6} {:>6} {:>5} | {:>9} {:>6} {:>5}",
        "query set",
        "nodus 1T",
        "avg ms",
        "ratio",
        "µs/q",
        "nodus 2T",
        "avg ms",
        "ratio",
        "µs/q",
        "NSD",
        "avg ms",
        "µs/q"
    );
    for (label, file, ask_nsd) in &files {
        let mut ours: Vec<Vec<Perf>> = agents.iter().map(|_| Vec::new()).collect();
        let mut theirs = Vec::new();
        for _ in 0..opts.runs {
            for ((_, port, agent), runs) in agents.iter().zip(&mut ours) {
                runs.push(dnsperf(*port, agent.pid(), file, opts.seconds)?);
            }
            if *ask_nsd {
                theirs.push(dnsperf(nsd_port, nsd.0.id(), file, opts.seconds)?);
            }
        }
        let theirs = (!theirs.is_empty()).then(|| median(theirs));
        let mut line = format!("{label:<36}");
        for runs in ours {
            let ours = median(runs);
            let ratio = theirs
                .as_ref()
                .map_or_else(|| "—".to_string(), |t| format!("{:.2}×", ours.qps / t.qps));
            let _ = write!(
                line,
                " | {:>9.0} {:>6.2} {:>6} {:>5.1}",
                ours.qps, ours.latency_ms, ratio, ours.cpu_us
            );
            if let Some(lost) = ours.lost_count() {
                let _ = write!(line, " ({lost} lost)");
            }
        }
        match &theirs {
            Some(theirs) => {
                let _ = write!(
                    line,
                    " | {:>9.0} {:>6.2} {:>5.1}",
                    theirs.qps, theirs.latency_ms, theirs.cpu_us
                );
                if let Some(lost) = theirs.lost_count() {
                    let _ = write!(line, " ({lost} lost)");
                }
            }
            None => line.push_str(" | (not asked)"),
        }
        println!("{line}");
    }
    drop(nsd);
    for ((threads, _, agent), before) in agents.iter().zip(before) {
        let after = proc_memory(agent.pid())?;
        println!(
            "nodus with {threads} UDP thread(s): RSS {:.1} MiB before the load, {:.1} MiB after \
             (peak {:.1} MiB)",
            before.rss_kib as f64 / 1024.0,
            after.rss_kib as f64 / 1024.0,
            after.peak_rss_kib as f64 / 1024.0
        );
    }
    Ok(())
}
