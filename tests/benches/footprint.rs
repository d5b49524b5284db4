//! The footprint bench: what one node pays for nodus with all three subsystems on, through
//! the events of a real node, not only at rest.
//!
//! For each shape (services × endpoints per service × nodes) it loads a generated cluster
//! into the API-server stand-in, every Node with a WireGuard key, and runs `nodus run` in a
//! network namespace of its own with the proxy, DNS (on loopback) and the mesh
//! (`wireguard-go`) on, in a memory cgroup of the bench's own. Then, one phase after the
//! other: the cold start; an annotation on an unrelated Node; 1,000 EndpointSlice updates;
//! 1,000 DNS questions (their answers checked); a `410 Gone` relist; commits of another
//! program to a table of its own; a restart that adopts the table. Before each phase the
//! agent's peak (VmHWM) is reset (`/proc/<pid>/clear_refs`), so each row's peak is that
//! phase's. Per phase it prints the
//! time the phase took, nodus's RSS, anonymous memory and peak, the kernel memory charged
//! to the cgroup (the ruleset, the agent's sockets; it stays charged across the restart),
//! the full proxy syncs the phase caused and the seconds they took, and the WireGuard
//! daemon's RSS. It prints figures; it asserts nothing (but that DNS answered right).
//!
//! With `--policy PODSxPOLICIESxNAMESPACES`, each shape runs a second time with
//! NetworkPolicy on and that many Pods (spread over the shape's nodes), NetworkPolicies
//! and Namespaces added (`scale::policy_cluster`), with two more phases: a pod of another
//! node relabelled, and a policy added; the rows of both runs are printed, so that what
//! policy costs is read from one sitting.
//!
//! With `--real-api`, the cluster is served by a real control plane instead
//! (`nodus_testbed::control_plane`, built by `k8s/build.sh`): Nodes, Namespaces, Services
//! and one Pod per endpoint (its IP and readiness written to its status, as a kubelet
//! would) are created through kube-apiserver, and the EndpointSlices are the ones
//! kube-controller-manager's controller makes from them. nodus runs with `deploy/base`'s
//! ServiceAccount. The churn phase then changes 1,000 Pods' readiness, and the `410`
//! phase restarts the API server after a compaction. (`--policy` is not combined with it.)
//!
//! With `--subscribers N`, N programs follow the agent's view through its subscription
//! socket from the cold start on (each reads every line, reconnects and resumes as a
//! backend would), so that the rows show what they cost the agent.
//!
//! `cargo bench --bench footprint -- [--shape 1000x10x100[:PORTS[:READY%]]]…
//! [--policy 10000x200x100] [--real-api] [--subscribers N] [--nodus PATH]`
//! (`10000x10x100:2:100`: two ports per Service, every endpoint ready).

#![allow(
    clippy::too_many_lines,
    reason = "a test or bench reads as one story, top to bottom"
)]

use anyhow::{Context, bail};
use nodus_mesh::key::KeyPair;
use nodus_mesh::plan::ANNOTATION_PUBLIC_KEY;
use nodus_testbed::bench::{Agent, BenchCluster, KernelMemory, free_port, start_agent_in_with};
use nodus_testbed::control_plane::{ControlPlane, ControlPlaneConfig, Relay};
use nodus_testbed::netns::{self, Netns, unique_name};
use nodus_testbed::scale::{self, PolicyShape, ProcMemory, Shape, mib, proc_memory};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Endpoint updates in the churn phase.
const CHURN: usize = 1000;
/// After a phase's last change is applied, how long the agent gets to settle (a full sync
/// it may have started, freed memory returned) before it is measured.
const SETTLE: Duration = Duration::from_secs(3);

struct Options {
    shapes: Vec<Shape>,
    policy: Option<PolicyShape>,
    real_api: bool,
    subscribers: usize,
    nodus: PathBuf,
}

fn options() -> anyhow::Result<Options> {
    let mut opts = Options {
        shapes: Vec::new(),
        policy: None,
        real_api: false,
        subscribers: 0,
        nodus: PathBuf::from(env!("CARGO_BIN_EXE_nodus")),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--shape" => opts.shapes.push(Shape::parse(&value()?)?),
            "--nodus" => opts.nodus = value()?.into(),
            "--policy" => opts.policy = Some(PolicyShape::parse(&value()?)?),
            "--real-api" => opts.real_api = true,
            "--subscribers" => opts.subscribers = value()?.parse()?,
            "--bench" => {}
            other => bail!("unknown argument {other:?}"),
        }
    }
    if opts.real_api && opts.policy.is_some() {
        bail!("--policy and --real-api are not combined");
    }
    if opts.shapes.is_empty() {
        opts.shapes = ["100x3x3", "1000x10x100", "10000x10x100", "50000x5x1000"]
            .iter()
            .map(|s| Shape::parse(s))
            .collect::<Result<_, _>>()?;
    }
    Ok(opts)
}

/// One measured phase.
struct Phase {
    name: &'static str,
    took: Duration,
    memory: ProcMemory,
    kernel_bytes: u64,
    full_syncs: FullSyncs,
    wireguard_kib: u64,
}

/// The proxy's full syncs: how many, and the seconds they took.
#[derive(Clone, Copy, Default)]
struct FullSyncs {
    count: f64,
    seconds: f64,
}

/// Where the cluster is served from.
enum Api {
    StandIn(BenchCluster),
    Real(RealCluster),
}

impl Api {
    fn dir(&self) -> &Path {
        match self {
            Api::StandIn(cluster) => &cluster.dir,
            Api::Real(cluster) => &cluster.dir,
        }
    }
}

/// The agent under measurement and what it runs beside.
struct Node<'c> {
    api: &'c Api,
    ns: Arc<Netns>,
    kernel: &'c KernelMemory,
    nodus: PathBuf,
    config: String,
    /// `None` between a stop and the next start.
    agent: Option<Agent>,
}

impl Node<'_> {
    fn start(&mut self) -> anyhow::Result<Duration> {
        let node = scale::node_name(0);
        let agent = match self.api {
            Api::StandIn(cluster) => {
                cluster.start_agent_in(self.ns.clone(), &self.nodus, &node, &self.config)?
            }
            Api::Real(cluster) => {
                cluster.start_agent_in(&self.ns, &self.nodus, &node, &self.config)?
            }
        };
        self.kernel.add_process(agent.pid())?;
        let ready = agent.wait_ready(Duration::from_secs(900))?;
        self.agent = Some(agent);
        Ok(ready)
    }

    /// SIGTERM, as a rolling update sends it: the table stays for the next agent.
    fn stop(&mut self) {
        self.agent = None;
    }

    fn pid(&self) -> u32 {
        self.agent.as_ref().map_or(0, Agent::pid)
    }

    fn metric(&self, series: &str) -> f64 {
        self.agent
            .as_ref()
            .and_then(|agent| agent.metric(series).ok())
            .unwrap_or(0.0)
    }

    fn full_syncs(&self) -> FullSyncs {
        FullSyncs {
            count: self.metric("nodus_proxy_full_sync_duration_seconds_count"),
            seconds: self.metric("nodus_proxy_full_sync_duration_seconds_sum"),
        }
    }

    /// The measurement after a phase that took `took`, of the full syncs since `before`.
    fn measure(
        &self,
        name: &'static str,
        took: Duration,
        before: FullSyncs,
    ) -> anyhow::Result<Phase> {
        let now = self.full_syncs();
        Ok(Phase {
            name,
            took,
            memory: proc_memory(self.pid())?,
            kernel_bytes: self.kernel.bytes()?,
            full_syncs: FullSyncs {
                count: now.count - before.count,
                seconds: now.seconds - before.seconds,
            },
            wireguard_kib: self.wireguard_kib(),
        })
    }

    /// Resets the agent's peak RSS, so that the next reading is this phase's.
    fn reset_peak(&self) -> anyhow::Result<()> {
        let path = format!("/proc/{}/clear_refs", self.pid());
        std::fs::write(&path, "5").with_context(|| format!("writing {path}"))
    }

    /// Waits until `series` exceeds `before`.
    fn wait_above(&self, series: &str, before: f64, what: &str) -> anyhow::Result<()> {
        let start = Instant::now();
        while self.metric(series) <= before {
            if start.elapsed() > Duration::from_secs(600) {
                bail!("{what}: {series} did not move within 10 minutes");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Runs `phase`, then measures.
    fn phase(
        &mut self,
        name: &'static str,
        phase: impl FnOnce(&mut Self) -> anyhow::Result<()>,
    ) -> anyhow::Result<Phase> {
        self.reset_peak()?;
        let before = self.full_syncs();
        let start = Instant::now();
        phase(self)?;
        let took = start.elapsed();
        std::thread::sleep(SETTLE);
        self.measure(name, took, before)
    }

    /// RSS of the other processes in the namespace: the `wireguard-go` daemon.
    fn wireguard_kib(&self) -> u64 {
        netns::run("ip", &["netns", "pids", self.ns.name()])
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|pid| pid.parse::<u32>().ok())
            .filter(|pid| *pid != self.pid())
            .filter_map(|pid| proc_memory(pid).ok())
            .map(|memory| memory.rss_kib)
            .sum()
    }
}

/// A `dig -f` batch of questions to the agent's DNS, and the answers it should give.
struct DnsQuestions {
    batch: String,
    found: usize,
    missing: usize,
}

/// Services' A, AAAA (no IPv6 in these clusters: no data, but found), SRV and PTR records,
/// and names that do not exist, 200 of each, over UDP with a tenth over TCP.
fn dns_questions(shape: &Shape, port: u16) -> DnsQuestions {
    const EACH: usize = 200;
    let mut batch = String::new();
    for k in 0..EACH {
        let i = (k * 7919) % shape.services;
        let service = format!(
            "{}.{}.svc.cluster.local",
            scale::service_name(i),
            scale::namespace(i)
        );
        let transport = if k % 10 == 0 { "+tcp" } else { "+notcp" };
        for question in [
            format!("{service} A"),
            format!("{service} AAAA"),
            format!("_http._tcp.{service} SRV"),
            format!("-x {}", scale::cluster_ip(i)),
            format!("missing-{k}.{}.svc.cluster.local A", scale::namespace(i)),
        ] {
            batch.push_str(&format!(
                "@127.0.0.1 -p {port} +tries=1 +time=2 {transport} {question}\n"
            ));
        }
    }
    DnsQuestions {
        batch,
        found: 4 * EACH,
        missing: EACH,
    }
}

/// The generated cluster, every Node with a WireGuard key of its own, as a meshed cluster
/// has them.
fn cluster(shape: &Shape, policy: Option<&PolicyShape>) -> anyhow::Result<Vec<Value>> {
    let policy_objects = policy
        .into_iter()
        .flat_map(|policy| scale::policy_cluster(policy, shape.nodes));
    scale::cluster(shape)
        .chain(policy_objects)
        .map(|mut object| {
            if object["kind"] == "Node" {
                let key = KeyPair::generate().context("a node key")?;
                object["metadata"]["annotations"][ANNOTATION_PUBLIC_KEY] =
                    key.public.to_base64().into();
            }
            Ok(object)
        })
        .collect()
}

fn run_shape(
    opts: &Options,
    shape: Shape,
    policy: Option<PolicyShape>,
    kernel: &KernelMemory,
) -> anyhow::Result<Vec<Phase>> {
    let api = if opts.real_api {
        Api::Real(RealCluster::start(&shape)?)
    } else {
        Api::StandIn(BenchCluster::new(
            CHURN + 20_000,
            cluster(&shape, policy.as_ref())?,
        )?)
    };
    let interface = unique_name("wg");
    let dns_port = free_port()?;
    let config = format!(
        "cluster_cidrs: [10.0.0.0/8]\nproxy:\n  enabled: true\ndns:\n  listen: [\"127.0.0.1:{}\"]\n\
         mesh:\n  enabled: true\n  backend: wireguard-go\n  interface: {interface}\n  \
         key_file: {}\n  cni_conflist: {}\npolicy:\n  enabled: {}\n  cni_socket: {}\n",
        dns_port,
        api.dir().join("key/wireguard.key").display(),
        api.dir().join("10-nodus.conflist").display(),
        policy.is_some(),
        api.dir().join("cni.sock").display(),
    );
    let mut node = Node {
        api: &api,
        ns: Arc::new(Netns::new("foot")?),
        kernel,
        nodus: opts.nodus.clone(),
        config,
        agent: None,
    };
    let mut phases = Vec::new();
    let socket = api
        .dir()
        .join("state")
        .join(format!("view-{}.sock", scale::node_name(0)));
    let subscribers = Subscribers::start(&socket, opts.subscribers);
    // The cold start's peak is the process's own: nothing to reset.
    let ready = node.start()?;
    std::thread::sleep(SETTLE);
    phases.push(node.measure("cold start", ready, FullSyncs::default())?);

    const APPLIED: &str = "nodus_view_apply_duration_seconds_count";
    phases.push(node.phase("another Node annotated", |node| {
        let before = node.metric(APPLIED);
        let mut other = scale::node(1);
        other["metadata"]["annotations"]["example.com/last-heartbeat"] = "1".into();
        match node.api {
            Api::StandIn(cluster) => drop(cluster.store.apply_value(other)?),
            Api::Real(cluster) => cluster.patch(&other, false)?,
        }
        node.wait_above(APPLIED, before, "the annotated Node")
    })?);

    const ENDPOINTS: &str = "nodus_view_objects{kind=\"endpoint\"}";
    phases.push(node.phase("1,000 endpoint updates", |node| {
        let before = node.metric(ENDPOINTS);
        match node.api {
            Api::StandIn(cluster) => cluster.churn_slices(&shape, CHURN)?,
            Api::Real(cluster) => cluster.churn(&shape)?,
        }
        node.wait_above(ENDPOINTS, before, "the churn")
    })?);

    phases.push(node.phase("1,000 DNS questions", |node| {
        let questions = dns_questions(&shape, dns_port);
        let batch = node.api.dir().join("dns-questions");
        std::fs::write(&batch, questions.batch)?;
        let answers = node.ns.exec("dig", &["-f", &batch.to_string_lossy()])?;
        let count = |status: &str| answers.matches(&format!("status: {status},")).count();
        let (found, missing) = (count("NOERROR"), count("NXDOMAIN"));
        if (found, missing) != (questions.found, questions.missing) {
            bail!(
                "DNS answered {found} NOERROR and {missing} NXDOMAIN, expected {} and {}",
                questions.found,
                questions.missing
            );
        }
        Ok(())
    })?);

    const RESTARTS: &str = "nodus_watch_restarts_total{kind=\"endpointslice\"}";
    phases.push(node.phase("410 Gone, relist", |node| {
        let before = node.metric(RESTARTS);
        match node.api {
            Api::StandIn(cluster) => {
                let store = &cluster.store;
                for i in 0..3 {
                    store.force_compaction();
                    store
                        .apply_value(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": format!("compacted-{i}"), "namespace": "default"}}))?;
                }
                cluster.drop_watches();
            }
            // A restart after which the revision nodus resumes from is older than the new
            // watch cache and compacted in etcd.
            Api::Real(cluster) => cluster.restart_compacted()?,
        }
        node.wait_above(RESTARTS, before, "the relist")?;
        // The relist is applied as one batch once every kind has listed again.
        let applied = node.metric(APPLIED);
        node.wait_above(APPLIED, applied, "the relisted view")
    })?);

    phases.push(node.phase("another program's nft commits", |node| {
        for i in 0..20 {
            let table = format!("bench-other-{i}");
            node.ns.exec("nft", &["add", "table", "inet", &table])?;
            node.ns
                .exec("nft", &["add", "chain", "inet", &table, "input"])?;
            node.ns.exec("nft", &["delete", "table", "inet", &table])?;
        }
        // Past the proxy's check period, so that a check has looked.
        std::thread::sleep(Duration::from_secs(12));
        Ok(())
    })?);

    if let Some(policy) = &policy {
        phases.extend(policy_phases(&mut node, policy, &shape)?);
    }

    let cut_off = |node: &Node<'_>| node.metric("nodus_subscribers_cut_off_total");
    let before_restart = cut_off(&node);
    node.stop();
    let ready = node.start()?;
    std::thread::sleep(SETTLE);
    phases.push(node.measure("restart, table adopted", ready, FullSyncs::default())?);
    if opts.subscribers > 0 {
        println!(
            "subscribers cut off: {before_restart} before the restart, {} after",
            cut_off(&node)
        );
    }
    let lines = subscribers.stop();
    if opts.subscribers > 0 {
        println!("{} subscribers read {lines:?} lines", opts.subscribers);
    }
    Ok(phases)
}

/// Programs following the agent's view through its socket, as backends do: each reads
/// every line and, when the connection ends (the restart), reconnects and resumes.
struct Subscribers {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Subscribers {
    fn start(socket: &Path, count: usize) -> Subscribers {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..count)
            .map(|_| {
                let (socket, stop) = (socket.to_path_buf(), stop.clone());
                std::thread::spawn(move || follow(&socket, &stop))
            })
            .collect();
        Subscribers { stop, threads }
    }

    /// Stops them; the lines each one read.
    fn stop(self) -> Vec<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|thread| thread.join().unwrap_or(0))
            .collect()
    }
}

/// One subscriber until `stop`: the lines it read.
fn follow(socket: &Path, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::io::{BufRead, Write};
    let mut since: Option<(String, u64)> = None;
    let mut lines = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Ok(mut stream) = std::os::unix::net::UnixStream::connect(socket) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let hello = match &since {
            Some((epoch, seq)) => serde_json::json!({"since": {"epoch": epoch, "seq": seq}}),
            None => serde_json::json!({}),
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        if writeln!(stream, "{hello}").is_err() {
            continue;
        }
        let mut reader = std::io::BufReader::new(stream);
        let mut line = String::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match reader.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) if line.ends_with('\n') => {
                    lines += 1;
                    if let Ok(value) = serde_json::from_str::<Value>(&line) {
                        match value["kind"].as_str() {
                            Some("Snapshot") => {
                                since = Some((value["epoch"].as_str().unwrap_or("").into(), 0));
                            }
                            Some("Synced") => {
                                if let Some((_, seq)) = &mut since {
                                    *seq = value["seq"].as_u64().unwrap_or(0);
                                }
                            }
                            _ => {}
                        }
                    }
                    line.clear();
                }
                // A timeout, or a line not finished yet: read on.
                Ok(_) => {}
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
    }
    lines
}

/// A frontend pod of another node becomes a backend, and back; then a policy is added.
fn policy_phases(
    node: &mut Node<'_>,
    policy: &PolicyShape,
    shape: &Shape,
) -> anyhow::Result<Vec<Phase>> {
    const APPLIED: &str = "nodus_view_apply_duration_seconds_count";
    for (kind, wanted) in [
        ("policy_pod", policy.pods),
        ("networkpolicy", policy.policies),
    ] {
        let held = node.metric(&format!("nodus_view_objects{{kind=\"{kind}\"}}"));
        if held != wanted as f64 {
            bail!("the agent holds {held} objects of kind {kind}, not {wanted}");
        }
    }
    let mut phases = Vec::new();
    phases.push(node.phase("a pod relabelled, twice", |node| {
        // Pod 1 is a backend on node 1 (pods are dealt round the nodes).
        for role in ["frontend", "backend"] {
            let before = node.metric(APPLIED);
            let mut pod = scale::policy_pod(1, policy, shape.nodes);
            pod["metadata"]["labels"]["role"] = role.into();
            stand_in(node.api)?.store.apply_value(pod)?;
            node.wait_above(APPLIED, before, "the relabelled pod")?;
        }
        Ok(())
    })?);
    phases.push(node.phase("a policy added", |node| {
        let before = node.metric(APPLIED);
        let added = scale::network_policy(policy.policies + 1, policy);
        stand_in(node.api)?.store.apply_value(added)?;
        node.wait_above(APPLIED, before, "the added policy")
    })?);
    Ok(phases)
}

/// The stand-in of a run with `--policy`, which `--real-api` excludes.
fn stand_in(api: &Api) -> anyhow::Result<&BenchCluster> {
    match api {
        Api::StandIn(cluster) => Ok(cluster),
        Api::Real(_) => bail!("the policy phases run against the stand-in only"),
    }
}

/// The generated cluster served by a real control plane: what kubelets and controllers
/// would have written, created through the API server.
struct RealCluster {
    /// Locked to be restarted.
    plane: Mutex<ControlPlane>,
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    dir: PathBuf,
    /// The relays into the agent's namespace, kept while the agent runs.
    relays: Mutex<Vec<Relay>>,
}

/// Requests in flight while the cluster is created.
const CREATORS: usize = 64;

impl RealCluster {
    fn start(shape: &Shape) -> anyhow::Result<RealCluster> {
        let dir = std::env::temp_dir().join(format!("nodus-bench-real-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let started = Instant::now();
        let plane =
            ControlPlane::start(&dir.join("control-plane"), &ControlPlaneConfig::default())?;
        plane.apply_deploy_base()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let client = rt.block_on(async {
            let kubeconfig = kube::config::Kubeconfig::read_from(&plane.admin_kubeconfig)?;
            let config = kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            anyhow::Ok(kube::Client::try_from(config)?)
        })?;
        let cluster = RealCluster {
            plane: Mutex::new(plane),
            rt,
            client,
            dir,
            relays: Mutex::default(),
        };
        let up = started.elapsed();
        let created = Instant::now();
        let objects = cluster_objects(shape)?;
        let count = objects.len();
        // Namespaces and Nodes first: Services and Pods name them.
        let (first, rest): (Vec<Value>, Vec<Value>) = objects
            .into_iter()
            .partition(|o| o["kind"] == "Namespace" || o["kind"] == "Node");
        cluster.create_all(first)?;
        cluster.create_all(rest)?;
        let create_took = created.elapsed();
        // The controller has caught up once its slices hold every Pod's endpoint.
        let sliced = Instant::now();
        let wanted = shape.services * shape.endpoints_per_service;
        loop {
            let endpoints = cluster.rt.block_on(count_endpoints(&cluster.client))?;
            if endpoints >= wanted {
                break;
            }
            if sliced.elapsed() > Duration::from_secs(1800) {
                bail!(
                    "the EndpointSlice controller wrote {endpoints} of {wanted} endpoints in 30 minutes"
                );
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        eprintln!(
            "real control plane: up in {:.1?}; {count} objects created in {:.1?}; the \
             controller's EndpointSlices held every endpoint {:.1?} later",
            up,
            create_took,
            sliced.elapsed()
        );
        Ok(cluster)
    }

    fn plane(&self) -> std::sync::MutexGuard<'_, ControlPlane> {
        self.plane.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates every object (and writes the status of Pods and Nodes, which a create
    /// drops or a kubelet writes), `CREATORS` at a time.
    fn create_all(&self, objects: Vec<Value>) -> anyhow::Result<()> {
        use futures::StreamExt as _;
        self.rt.block_on(async {
            let mut results = futures::stream::iter(objects)
                .map(|object| create(&self.client, object))
                .buffer_unordered(CREATORS);
            while let Some(result) = results.next().await {
                result?;
            }
            anyhow::Ok(())
        })
    }

    /// A merge patch of `object`'s metadata, or of its status.
    fn patch(&self, object: &Value, status: bool) -> anyhow::Result<()> {
        self.rt.block_on(patch(&self.client, object, status))
    }

    /// 1,000 Pods' readiness changed (the first endpoint of each of 1,000 Services becomes
    /// ready when it was not and the other way round), then one Pod more for Service 0:
    /// its endpoint is counted once the controller reached it.
    fn churn(&self, shape: &Shape) -> anyhow::Result<()> {
        use futures::StreamExt as _;
        let flips: Vec<Value> = (0..CHURN)
            .map(|k| {
                let mut pod = endpoint_pods(k % shape.services, shape, 0).swap_remove(0);
                let ready = pod["status"]["conditions"][0]["status"] == "True";
                pod["status"]["conditions"][0]["status"] =
                    if ready { "False" } else { "True" }.into();
                pod
            })
            .collect();
        self.rt.block_on(async {
            let mut results = futures::stream::iter(flips)
                .map(|pod| async move { patch(&self.client, &pod, true).await })
                .buffer_unordered(CREATORS);
            while let Some(result) = results.next().await {
                result?;
            }
            anyhow::Ok(())
        })?;
        let mut marker = endpoint_pods(0, shape, 0).swap_remove(0);
        marker["metadata"]["name"] = format!("{}-marker", scale::service_name(0)).into();
        marker["status"]["podIP"] = "10.255.255.1".into();
        marker["status"]["podIPs"] = serde_json::json!([{"ip": "10.255.255.1"}]);
        marker["status"]["conditions"][0]["status"] = "True".into();
        self.rt.block_on(create(&self.client, marker))
    }

    /// Stops the API server, moves etcd's revision on and compacts it, and starts the API
    /// server again: every watch that resumes gets `410 Gone`.
    fn restart_compacted(&self) -> anyhow::Result<()> {
        let mut plane = self.plane.lock().unwrap_or_else(PoisonError::into_inner);
        plane.stop_api_server();
        plane.bump_etcd_revision()?;
        plane.compact_etcd()?;
        plane.start_api_server()
    }

    fn start_agent_in(
        &self,
        ns: &Arc<Netns>,
        nodus: &Path,
        node: &str,
        config: &str,
    ) -> anyhow::Result<Agent> {
        let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, free_port()?));
        let plane = self.plane();
        let relay = Relay::in_namespace(ns, addr, plane.api_addr())?;
        let kubeconfig = plane.nodus_kubeconfig(node, &format!("https://{addr}"))?;
        self.relays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(relay);
        start_agent_in_with(ns.clone(), nodus, &self.dir, &kubeconfig, node, config)
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The generated cluster as kubelets and users would have written it to a real API
/// server: Namespaces, Nodes with WireGuard keys, Services, and the Pods behind each
/// Service's endpoints (the stand-in's EndpointSlices are made by the controller here).
fn cluster_objects(shape: &Shape) -> anyhow::Result<Vec<Value>> {
    let namespaces = (0..scale::NAMESPACES.min(shape.services.max(1))).map(|i| {
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": scale::namespace(i)}})
    });
    let mut objects: Vec<Value> = namespaces.collect();
    for object in cluster(shape, None)? {
        match object["kind"].as_str() {
            Some("EndpointSlice") => {}
            Some("Service") => {
                let mut service = object;
                if let Some(meta) = service["metadata"].as_object_mut() {
                    meta.remove("managedFields");
                }
                objects.push(service);
            }
            _ => objects.push(object),
        }
    }
    objects.extend((0..shape.services).flat_map(|i| endpoint_pods(i, shape, 0)));
    Ok(objects)
}

/// The Pods behind the endpoints of `scale::slice(i, shape, generation)`: its addresses,
/// nodes and readiness, as their kubelets report them.
fn endpoint_pods(i: usize, shape: &Shape, generation: usize) -> Vec<Value> {
    let slice = scale::slice(i, shape, generation);
    let (namespace, service) = (scale::namespace(i), scale::service_name(i));
    slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|endpoint| {
            let ip = endpoint["addresses"][0].clone();
            let ready = if endpoint["conditions"]["ready"] == true {
                "True"
            } else {
                "False"
            };
            serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": endpoint["targetRef"]["name"], "namespace": namespace,
                             "labels": {"app": service}},
                "spec": {"nodeName": endpoint["nodeName"],
                         "containers": [{"name": "app", "image": "registry.example/app:1.4.2",
                                         "ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                           "conditions": [{"type": "Ready", "status": ready}]}})
        })
        .collect()
}

/// The endpoints of every EndpointSlice but the `kubernetes` Service's, listed in pages.
async fn count_endpoints(client: &kube::Client) -> anyhow::Result<usize> {
    let slices: kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        kube::Api::all(client.clone());
    let mut params = kube::api::ListParams::default().limit(500);
    let mut count = 0;
    loop {
        let page = slices.list(&params).await?;
        count += page
            .items
            .iter()
            .filter(|slice| slice.metadata.namespace.as_deref() != Some("default"))
            .map(|slice| slice.endpoints.len())
            .sum::<usize>();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(count),
        }
    }
}

/// The dynamic API of `object`'s kind (the plural is the kind's lowercase name plus "s",
/// true of every kind created here) and its name.
fn dynamic_api(
    client: &kube::Client,
    object: &Value,
) -> anyhow::Result<(kube::Api<kube::api::DynamicObject>, String)> {
    let api_version = object["apiVersion"].as_str().context("apiVersion")?;
    let kind = object["kind"].as_str().context("kind")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let resource =
        kube::api::ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_lowercase()));
    let name = object["metadata"]["name"]
        .as_str()
        .context("name")?
        .to_string();
    let api = match object["metadata"]["namespace"].as_str() {
        Some(namespace) => kube::Api::namespaced_with(client.clone(), namespace, &resource),
        None => kube::Api::all_with(client.clone(), &resource),
    };
    Ok((api, name))
}

async fn create(client: &kube::Client, object: Value) -> anyhow::Result<()> {
    let (api, name) = dynamic_api(client, &object)?;
    let dynamic: kube::api::DynamicObject = serde_json::from_value(object.clone())?;
    match api
        .create(&kube::api::PostParams::default(), &dynamic)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(error).with_context(|| format!("creating {name}")),
    }
    if matches!(object["kind"].as_str(), Some("Pod" | "Node")) {
        patch(client, &object, true).await?;
    }
    Ok(())
}

async fn patch(client: &kube::Client, object: &Value, status: bool) -> anyhow::Result<()> {
    let (api, name) = dynamic_api(client, object)?;
    let params = kube::api::PatchParams::default();
    if status {
        let change = serde_json::json!({"status": object["status"]});
        api.patch_status(&name, &params, &kube::api::Patch::Merge(&change))
            .await
    } else {
        let change =
            serde_json::json!({"metadata": {"annotations": object["metadata"]["annotations"]}});
        api.patch(&name, &params, &kube::api::Patch::Merge(&change))
            .await
    }
    .with_context(|| format!("patching {name}"))?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let opts = options()?;
    netns::require_root();
    let kernel = KernelMemory::new("footprint-bench");
    println!(
        "nodus footprint bench: {} with the proxy, DNS and the mesh (wireguard-go) on; \
         kernel: {}",
        opts.nodus.display(),
        kernel.method()
    );
    println!(
        "{:<36} {:<28} {:>7} | {:>7} {:>7} {:>7} | {:>7} | {:>6} | {:>4} {:>6}",
        "shape S×E×N [+policy P×Q×NS]",
        "phase",
        "took s",
        "RSS MiB",
        "anon",
        "peak",
        "kernel",
        "wg-go",
        "full",
        "sync s"
    );
    let runs: Vec<(Shape, Option<PolicyShape>)> = opts
        .shapes
        .iter()
        .flat_map(|shape| {
            let with_policy = opts.policy.map(|policy| (*shape, Some(policy)));
            [(*shape, None)].into_iter().chain(with_policy)
        })
        .collect();
    for (shape, policy) in runs {
        let label = match &policy {
            Some(policy) => format!("{shape} +policy {policy}"),
            None => shape.to_string(),
        };
        for phase in run_shape(&opts, shape, policy, &kernel)? {
            println!(
                "{:<36} {:<28} {:>7.2} | {:>7} {:>7} {:>7} | {:>7.1} | {:>6} | {:>4} {:>6.2}",
                label,
                phase.name,
                phase.took.as_secs_f64(),
                mib(phase.memory.rss_kib),
                mib(phase.memory.anon_kib),
                mib(phase.memory.peak_rss_kib),
                phase.kernel_bytes as f64 / (1024.0 * 1024.0),
                mib(phase.wireguard_kib),
                phase.full_syncs.count,
                phase.full_syncs.seconds
            );
        }
    }
    Ok(())
}
