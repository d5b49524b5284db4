//! DNS throughput: `dnsperf` against nodus answering a generated cluster, and against NSD and Knot
//! serving the equivalent zone file, in the same run, on the same query files.
//!
//! Query sets: existing service A names; SRV names; the search-path mix that `ndots:5`
//! produces (four misses per hit); and, for nodus only (NSD's zone has no reverse names),
//! PTR of endpoints of ClusterIP services, which are not indexed and read every slice. Two agents serve the same cluster: one with one UDP
//! thread (as NSD here has one server process) and one with two (`dns.udp_threads`).
//! Besides QPS and latency it prints the CPU time each server spent per query, which does not
//! depend on how loaded the shared machine was.
//!
//! Autopath: a pod of the agent's node (one of its 110) resolves outside names as an
//! application does, through glibc's `getaddrinfo` (A and AAAA) with the resolv.conf kubelet
//! writes (`ndots:5`, the cluster's three search domains and the node's), against two agents
//! that differ only in `dns.autopath`; NSD, in the node's namespace, is the world. It
//! prints the names resolved per second with autopath on and off, every answer checked, and
//! checks names of the pod's own namespace (which the world holds too, with other
//! addresses) and of another namespace once through each agent. It prints figures and
//! asserts nothing.
//!
//! `cargo bench --bench dns -- [--services 10000] [--seconds 10] [--runs 3] [--nodus PATH]
//! [--only dnsperf|autopath]` (needs `dnsperf`, `nsd` and `knot` from Debian, and root for the
//! namespaces).

#![allow(
    clippy::too_many_lines,
    reason = "a test or bench reads as one story, top to bottom"
)]
#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use anyhow::{Context, bail};
use nodus_testbed::bench::{Agent, BenchCluster, free_port};
use nodus_testbed::netns::{self, Netns};
use nodus_testbed::scale::{self, Shape, proc_memory};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

struct Options {
    services: usize,
    seconds: u32,
    /// Alternating runs per server and query set; the medians are reported.
    runs: usize,
    nodus: PathBuf,
    /// Only one part: `dnsperf` or `autopath`.
    only: Option<String>,
}

fn options() -> anyhow::Result<Options> {
    let mut opts = Options {
        services: 10_000,
        seconds: 10,
        runs: 3,
        nodus: PathBuf::from(env!("CARGO_BIN_EXE_nodus")),
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--services" => opts.services = value()?.parse()?,
            "--seconds" => opts.seconds = value()?.parse()?,
            "--runs" => opts.runs = value()?.parse::<usize>()?.max(1),
            "--nodus" => opts.nodus = value()?.into(),
            "--only" => opts.only = Some(value()?),
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

/// A reference server (NSD or Knot), killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// NSD's configuration in `dir` (its state and log there too): `zones` (name, file) on
/// 127.0.0.1:`port`, one server process.
fn nsd_conf(dir: &Path, port: u16, zones: &[(&str, PathBuf)]) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let d = dir.display();
    let mut conf = format!(
        "server:\n  ip-address: 127.0.0.1\n  port: {port}\n  server-count: 1\n  username: \"\"\n  \
         chroot: \"\"\n  zonesdir: \"{d}\"\n  database: \"\"\n  pidfile: \"{d}/nsd.pid\"\n  \
         xfrdfile: \"{d}/xfrd.state\"\n  zonelistfile: \"{d}/zone.list\"\n  logfile: \"{d}/nsd.log\"\n  \
         rrl-ratelimit: 0\nremote-control:\n  control-enable: no\n"
    );
    for (name, file) in zones {
        writeln!(
            conf,
            "zone:\n  name: {name}\n  zonefile: \"{}\"",
            file.display()
        )?;
    }
    let path = dir.join("nsd.conf");
    std::fs::write(&path, conf)?;
    Ok(path)
}

/// Waits until `dig` (run by `run`, in whichever namespace) gets an answer for `probe` from
/// 127.0.0.1:`port`.
fn wait_answering(
    run: impl Fn(&[&str]) -> anyhow::Result<String>,
    port: u16,
    probe: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    let port = port.to_string();
    for _ in 0..200 {
        let args = [
            "@127.0.0.1",
            "-p",
            &port,
            "+short",
            "+time=1",
            "+tries=1",
            probe,
        ];
        if run(&args).is_ok_and(|out| !out.trim().is_empty()) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "the server did not answer; see its log in {}",
        dir.display()
    )
}

/// Knot DNS (Debian's `knot`) serving `zone` on 127.0.0.1:`port` with one UDP worker,
/// its state and log in `dir/knot`.
fn start_knot(dir: &Path, zone: &Path, port: u16) -> anyhow::Result<Server> {
    let dir = dir.join("knot");
    std::fs::create_dir_all(&dir)?;
    let d = dir.display();
    let conf = format!(
        "server:\n  listen: 127.0.0.1@{port}\n  rundir: \"{d}\"\n  udp-workers: 1\n  \
         tcp-workers: 1\n  background-workers: 1\nlog:\n  - target: \"{d}/knot.log\"\n    \
         any: warning\ndatabase:\n  storage: \"{d}\"\nzone:\n  - domain: cluster.local\n    \
         file: \"{}\"\n    zonefile-sync: -1\n    journal-content: none\n",
        zone.display()
    );
    let path = dir.join("knot.conf");
    std::fs::write(&path, conf)?;
    let mut knotd = Command::new("knotd");
    knotd.arg("-c").arg(&path);
    serve_until_answering(knotd, "knotd (Debian package knot)", port, &dir)
}

/// Starts a reference server with `command` and waits until it answers on `port` (its
/// log in `dir`).
fn serve_until_answering(
    mut command: Command,
    what: &str,
    port: u16,
    dir: &Path,
) -> anyhow::Result<Server> {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let server = Server(child);
    let dig = |args: &[&str]| {
        let out = Command::new("dig").args(args).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    wait_answering(dig, port, &service_fqdn(0), dir)?;
    Ok(server)
}

fn start_nsd(dir: &Path, zone: &Path, port: u16) -> anyhow::Result<Server> {
    let conf = nsd_conf(dir, port, &[("cluster.local", zone.to_path_buf())])?;
    let mut nsd = Command::new("nsd");
    nsd.args(["-d", "-c"]).arg(&conf);
    serve_until_answering(nsd, "nsd (Debian package nsd)", port, dir)
}

struct Perf {
    qps: f64,
    latency_ms: f64,
    lost: String,
    /// CPU time the server spent per answered query, in microseconds: unlike QPS, it does
    /// not depend on how much of the machine the server got. `user` is its own code,
    /// `system` the kernel's (receiving, routing and sending the datagrams, and on
    /// loopback delivering each reply into the client's socket).
    cpu_us: Cpu,
}

impl Perf {
    /// The count of lost queries, when there were any.
    fn lost_count(&self) -> Option<&str> {
        self.lost.split_whitespace().next().filter(|n| *n != "0")
    }
}

/// CPU time in user space and in the kernel.
#[derive(Clone, Copy)]
struct Cpu {
    user: f64,
    system: f64,
}

impl Cpu {
    fn total(self) -> f64 {
        self.user + self.system
    }
}

/// CPU seconds `pid` and its descendants (NSD answers from forked server processes) have
/// used.
fn cpu_seconds(pid: u32) -> anyhow::Result<Cpu> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // (pid, parent, user ticks, system ticks) of every process.
    let mut processes: Vec<(u32, u32, u64, u64)> = Vec::new();
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
            let user = number(fields.get(11).copied()).unwrap_or(0);
            let system = number(fields.get(12).copied()).unwrap_or(0);
            processes.push((this as u32, parent as u32, user, system));
        }
    }
    let mut tree = vec![pid];
    let (mut user, mut system) = (0, 0);
    while let Some(next) = tree.pop() {
        for (this, parent, in_user, in_system) in &processes {
            if *this == next {
                user += in_user;
                system += in_system;
            } else if *parent == next {
                tree.push(*this);
            }
        }
    }
    Ok(Cpu {
        user: user as f64 / ticks,
        system: system as f64 / ticks,
    })
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
    let cpu_after = cpu_seconds(pid)?;
    let per_query = 1e6 / number("Queries completed:")?.max(1.0);
    Ok(Perf {
        qps: number("Queries per second:")?,
        latency_ms: number("Average Latency (s):")? * 1000.0,
        lost: field("Queries lost:").unwrap_or_default(),
        cpu_us: Cpu {
            user: (cpu_after.user - cpu_before.user) * per_query,
            system: (cpu_after.system - cpu_before.system) * per_query,
        },
    })
}

/// The run with the median QPS.
fn median(mut runs: Vec<Perf>) -> Perf {
    runs.sort_by(|a, b| a.qps.total_cmp(&b.qps));
    runs.swap_remove(runs.len() / 2)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(CLIENT_FLAG) {
        return resolve_client(&args[2..]);
    }
    let opts = options()?;
    let shape = Shape::new(opts.services, 10, 100);
    // The agents' node runs its 110 pods; the autopath bench's client is the first.
    let pods = (0..scale::PODS_PER_NODE).map(|k| scale::pod(0, k, &scale::namespace(k)));
    let cluster = BenchCluster::new(10_000, scale::cluster(&shape).chain(pods))?;
    if opts.only.as_deref() != Some("autopath") {
        dnsperf_bench(&opts, &cluster)?;
    }
    if opts.only.as_deref() != Some("dnsperf") {
        autopath_bench(&opts, &cluster)?;
    }
    Ok(())
}

/// dnsperf's query sets against two agents (one and two UDP threads) and NSD.
fn dnsperf_bench(opts: &Options, cluster: &BenchCluster) -> anyhow::Result<()> {
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
    let knot_port = free_port()?;
    let knot = start_knot(&cluster.dir, &zone, knot_port)?;

    println!(
        "DNS bench: {} services × 10 endpoints; dnsperf -c 4 -T 1 -q 200 -l {} on loopback; \
         median of {} alternating runs (nodus with 1 UDP thread, with 2, NSD, Knot with one UDP \
         worker); ratios: nodus's QPS over NSD's, and nodus 1T's over Knot's",
        opts.services, opts.seconds, opts.runs
    );
    println!(
        "{:<36} | {:>9} {:>6} {:>6} {:>5} | {:>9} {:>6} {:>6} {:>5} | {:>9} {:>6} {:>5} | {:>9} {:>6} {:>5} {:>7}",
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
        "µs/q",
        "Knot",
        "avg ms",
        "µs/q",
        "1T/Knot"
    );
    // Per query set asked of all three: the CPU per query of nodus 1T, NSD and Knot.
    let mut per_core = Vec::new();
    for (label, file, ask_nsd) in &files {
        let mut ours: Vec<Vec<Perf>> = agents.iter().map(|_| Vec::new()).collect();
        let mut theirs = Vec::new();
        let mut knots = Vec::new();
        for _ in 0..opts.runs {
            for ((_, port, agent), runs) in agents.iter().zip(&mut ours) {
                runs.push(dnsperf(*port, agent.pid(), file, opts.seconds)?);
            }
            if *ask_nsd {
                theirs.push(dnsperf(nsd_port, nsd.0.id(), file, opts.seconds)?);
                knots.push(dnsperf(knot_port, knot.0.id(), file, opts.seconds)?);
            }
        }
        let theirs = (!theirs.is_empty()).then(|| median(theirs));
        let knot = (!knots.is_empty()).then(|| median(knots));
        let mut line = format!("{label:<36}");
        let mut first = None;
        for runs in ours {
            let ours = median(runs);
            first.get_or_insert((ours.qps, ours.cpu_us));
            let ratio = theirs
                .as_ref()
                .map_or_else(|| "—".to_string(), |t| format!("{:.2}×", ours.qps / t.qps));
            let _ = write!(
                line,
                " | {:>9.0} {:>6.2} {:>6} {:>5.1}",
                ours.qps,
                ours.latency_ms,
                ratio,
                ours.cpu_us.total()
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
                    theirs.qps,
                    theirs.latency_ms,
                    theirs.cpu_us.total()
                );
                if let Some(lost) = theirs.lost_count() {
                    let _ = write!(line, " ({lost} lost)");
                }
            }
            None => line.push_str(" | (not asked)"),
        }
        if let (Some(knot), Some((ours, ..))) = (&knot, first) {
            let _ = write!(
                line,
                " | {:>9.0} {:>6.2} {:>5.1} {:>6.2}×",
                knot.qps,
                knot.latency_ms,
                knot.cpu_us.total(),
                ours / knot.qps
            );
        }
        println!("{line}");
        if let (Some(nsd), Some(knot), Some((_, cpu))) = (&theirs, &knot, first) {
            per_core.push((*label, [cpu, nsd.cpu_us, knot.cpu_us]));
        }
    }
    print_per_core(&per_core);
    drop((nsd, knot));
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

/// The CPU per query of nodus 1T, NSD and Knot split into user space and kernel, and
/// what one core answers: NSD's and Knot's CPU per query over nodus's ("per core"), and
/// the same over nodus's kernel share alone ("floor": what nodus would reach if its own
/// code cost nothing, the kernel's receive and send paths being the same for all three).
fn print_per_core(rows: &[(&str, [Cpu; 3])]) {
    println!(
        "CPU per query in µs, user + kernel; per core: NSD's and Knot's CPU per query over \
         nodus 1T's; floor: the same over nodus 1T's kernel share alone"
    );
    println!(
        "{:<36} | {:>11} | {:>11} | {:>11} | {:>15} | {:>15}",
        "query set", "nodus 1T", "NSD", "Knot", "per core N / K", "floor N / K"
    );
    for (label, [ours, nsd, knot]) in rows {
        let split = |cpu: &Cpu| format!("{:.1} + {:.1}", cpu.user, cpu.system);
        let kernel = ours.system.max(f64::EPSILON);
        println!(
            "{label:<36} | {:>11} | {:>11} | {:>11} | {:>6.2}× / {:.2}× | {:>6.2}× / {:.2}×",
            split(ours),
            split(nsd),
            split(knot),
            nsd.total() / ours.total(),
            knot.total() / ours.total(),
            nsd.total() / kernel,
            knot.total() / kernel,
        );
    }
}

/// The first argument that makes this binary the autopath bench's client.
const CLIENT_FLAG: &str = "--resolve-client";

/// The pod's side of the autopath bench, run in the pod's namespace as
/// `--resolve-client FILE SECONDS THREADS`: resolves the names of FILE (`name address` per
/// line) with `getaddrinfo`, as an application does (A and AAAA, through the search list of
/// the namespace's resolv.conf), from THREADS threads, each starting at its own place in
/// the list, for SECONDS (0: each name once). Prints `resolved wrong failed seconds`.
fn resolve_client(args: &[String]) -> anyhow::Result<()> {
    let [file, seconds, threads] = args else {
        bail!("{CLIENT_FLAG} FILE SECONDS THREADS");
    };
    let names: Vec<(String, Ipv4Addr)> = std::fs::read_to_string(file)?
        .lines()
        .filter_map(|line| {
            let (name, address) = line.split_once(' ')?;
            Some((name.to_string(), address.parse().ok()?))
        })
        .collect();
    let (seconds, threads): (f64, usize) = (seconds.parse()?, threads.parse::<usize>()?.max(1));
    let names = Arc::new(names);
    let stop = Arc::new(AtomicBool::new(false));
    // Resolved with the right address, with another, and not at all.
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (names, stop, counts) = (names.clone(), stop.clone(), counts.clone());
            std::thread::spawn(move || {
                let first = t * names.len() / threads;
                let share = if seconds > 0.0 {
                    usize::MAX
                } else {
                    (t + 1) * names.len() / threads - first
                };
                for (name, expected) in names.iter().cycle().skip(first).take(share) {
                    if stop.load(Relaxed) {
                        break;
                    }
                    let outcome = match (name.as_str(), 0).to_socket_addrs() {
                        Ok(mut found) => usize::from(!found.any(|a| a.ip() == *expected)),
                        Err(_) => 2,
                    };
                    counts[outcome].fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    if seconds > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Relaxed);
    }
    for worker in workers {
        let _ = worker.join();
    }
    let [right, wrong, failed] = &*counts;
    println!(
        "{} {} {} {}",
        right.load(Relaxed),
        wrong.load(Relaxed),
        failed.load(Relaxed),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What one client run resolved.
struct Resolved {
    right: u64,
    wrong: u64,
    failed: u64,
    per_second: f64,
}

/// Runs the client in `pod` on `file`, with `nameserver` in its resolv.conf.
fn resolve_in(
    pod: &Netns,
    resolv_conf: &str,
    file: &Path,
    seconds: f64,
    threads: usize,
) -> anyhow::Result<Resolved> {
    pod.set_resolv_conf(resolv_conf)?;
    let output = pod
        .command(&std::env::current_exe()?.to_string_lossy())
        .arg(CLIENT_FLAG)
        .arg(file)
        .args([seconds.to_string(), threads.to_string()])
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let fields: Vec<f64> = text
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let [right, wrong, failed, took] = fields[..] else {
        bail!(
            "the client printed {text:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    Ok(Resolved {
        right: right as u64,
        wrong: wrong as u64,
        failed: failed as u64,
        per_second: right / took.max(1e-9),
    })
}

/// Autopath on and off: names resolved per second by a pod through its search list.
fn autopath_bench(opts: &Options, cluster: &BenchCluster) -> anyhow::Result<()> {
    const OUTSIDE: usize = 1000;
    const THREADS: usize = 4;
    let dir = cluster.dir.join("autopath");
    std::fs::create_dir_all(&dir)?;
    let node = Arc::new(Netns::new("apn")?);
    let pod = Netns::new("app")?;
    netns::veth(&node, "eth1", &pod, "eth0")?;
    let pod_ip = scale::local_pod_ip(0, 0);
    let namespace = scale::namespace(0);
    let servers = ["10.78.0.1", "10.78.0.2"];
    for server in servers {
        node.ip(&["addr", "add", &format!("{server}/32"), "dev", "eth1"])?;
    }
    node.ip(&["route", "add", &format!("{pod_ip}/32"), "dev", "eth1"])?;
    pod.ip(&["addr", "add", &format!("{pod_ip}/32"), "dev", "eth0"])?;
    pod.ip(&["route", "add", "10.78.0.0/24", "dev", "eth0"])?;

    // The world, in the node's namespace: `api-<i>.example.com`, and the node's search
    // domain, which also holds the short names of the pod's own namespace (to other
    // addresses: the namespace's must win).
    let outside_ip = |i: usize| Ipv4Addr::new(10, 200, (i / 250) as u8, (i % 250 + 1) as u8);
    let soa = |zone: &str| {
        format!(
            "$ORIGIN {zone}.\n$TTL 30\n@ IN SOA ns.{zone}. hostmaster.{zone}. 1 7200 1800 86400 30\n@ IN NS ns.{zone}.\nns IN A 127.0.0.1\n"
        )
    };
    let (mut world, mut internal) = (soa("example.com"), soa("example.internal"));
    let (mut outside, mut own, mut other) = (String::new(), String::new(), String::new());
    for i in 0..OUTSIDE {
        writeln!(world, "api-{i} IN A {}", outside_ip(i))?;
        writeln!(outside, "api-{i}.example.com {}", outside_ip(i))?;
    }
    for i in 0..opts.services.min(2000) {
        let (name, ip) = (scale::service_name(i), scale::cluster_ip(i));
        if scale::namespace(i) == namespace {
            writeln!(internal, "{name} IN A {}", outside_ip(i + OUTSIDE))?;
            writeln!(own, "{name} {ip}")?;
        } else {
            writeln!(other, "{name}.{} {ip}", scale::namespace(i))?;
        }
    }
    let mut zones = Vec::new();
    for (zone, text) in [("example.com", world), ("example.internal", internal)] {
        let path = dir.join(format!("{zone}.zone"));
        std::fs::write(&path, text)?;
        zones.push((zone, path));
    }
    let mut files = Vec::new();
    for (label, text) in [("outside", outside), ("own", own), ("other", other)] {
        let path = dir.join(format!("{label}.txt"));
        std::fs::write(&path, text)?;
        files.push(path);
    }
    let conf = nsd_conf(&dir.join("nsd"), 53, &zones)?;
    let mut nsd = node.command("nsd");
    nsd.args(["-d", "-c"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    node.spawn(nsd)
        .context("starting nsd (Debian package nsd)")?;
    let dig = |args: &[&str]| node.exec("dig", args);
    wait_answering(dig, 53, "api-0.example.com", &dir.join("nsd"))?;

    let node_resolv_conf = dir.join("node-resolv.conf");
    std::fs::write(
        &node_resolv_conf,
        "nameserver 127.0.0.1\nsearch example.internal\n",
    )?;
    let mut agents: Vec<(bool, &str, Agent)> = Vec::new();
    for (autopath, server) in [(true, servers[0]), (false, servers[1])] {
        let config = format!(
            "dns:\n  listen: [\"{server}:53\"]\n  resolv_conf: {}\n  autopath: {autopath}\n",
            node_resolv_conf.display()
        );
        let agent = cluster.start_agent_in_alone(
            node.clone(),
            &opts.nodus,
            &scale::node_name(0),
            &config,
        )?;
        agent.wait_ready(Duration::from_secs(600))?;
        agents.push((autopath, server, agent));
    }
    let pods = r#"nodus_view_objects{kind="pod"}"#;
    for _ in 0..200 {
        if agents[0]
            .2
            .metric(pods)
            .is_ok_and(|n| n == scale::PODS_PER_NODE as f64)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let resolv_conf = |server: &str| {
        format!(
            "nameserver {server}\nsearch {namespace}.svc.cluster.local svc.cluster.local \
             cluster.local example.internal\noptions ndots:5\n"
        )
    };

    println!(
        "\nDNS autopath: a pod of the agent's node ({} pods in the view) resolves names with \
         getaddrinfo (A and AAAA), ndots:5 and kubelet's search list plus one node domain; \
         {THREADS} threads, {} s runs, median of {} alternating runs",
        agents[0].2.metric(pods).unwrap_or(0.0),
        opts.seconds,
        opts.runs
    );
    for (autopath, server, _) in &agents {
        let mut line = format!(
            "autopath {:<3} checked once:",
            if *autopath { "on" } else { "off" }
        );
        for (label, file) in ["outside names", "own namespace", "other namespace"]
            .iter()
            .zip(&files)
        {
            let once = resolve_in(&pod, &resolv_conf(server), file, 0.0, THREADS)?;
            let _ = write!(
                line,
                " {label} {} right, {} wrong, {} failed;",
                once.right, once.wrong, once.failed
            );
        }
        println!("{line}");
    }
    let mut runs: Vec<Vec<Resolved>> = vec![Vec::new(), Vec::new()];
    for _ in 0..opts.runs {
        for ((_, server, _), runs) in agents.iter().zip(&mut runs) {
            runs.push(resolve_in(
                &pod,
                &resolv_conf(server),
                &files[0],
                f64::from(opts.seconds),
                THREADS,
            )?);
        }
    }
    let medians: Vec<Resolved> = runs
        .into_iter()
        .map(|mut runs| {
            runs.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
            runs.swap_remove(runs.len() / 2)
        })
        .collect();
    for ((autopath, _, agent), median) in agents.iter().zip(&medians) {
        let memory = proc_memory(agent.pid())?;
        println!(
            "autopath {:<3} {:>8.0} outside names/s ({} wrong, {} failed in that run) | RSS {:.1} MiB, anon {:.1} MiB, peak {:.1} MiB",
            if *autopath { "on" } else { "off" },
            median.per_second,
            median.wrong,
            median.failed,
            memory.rss_kib as f64 / 1024.0,
            memory.anon_kib as f64 / 1024.0,
            memory.peak_rss_kib as f64 / 1024.0,
        );
    }
    println!(
        "autopath on / off: {:.2}×",
        medians[0].per_second / medians[1].per_second.max(1e-9)
    );
    Ok(())
}
