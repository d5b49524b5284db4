//! The scale bench: nodus against a generated cluster in the API-server stand-in.
//!
//! For each shape (services × endpoints per service × nodes) it loads the cluster, starts
//! a real `nodus run`, and reports the time to ready, memory after the initial sync, and a
//! churn of endpoint updates: the wall time from the first API write until nodus has
//! applied the last one, and the time nodus spent applying batches. With `--proxy` the
//! agent runs in a network namespace of its own with the service proxy on, so the churn
//! is programmed into the kernel too; then, one at a time, EndpointSlice changes and new
//! services are timed from the API write until the kernel announces the nf_tables commit
//! that moved the agent's transaction counter (or its count of programmed services;
//! `nodus_testbed::nft_commits`), beside what the
//! agent's `kubeproxy_network_programming_duration_seconds` observed of them, and an
//! annotation on the agent's own Node is counted in full syncs. It prints
//! figures; it asserts nothing.
//!
//! `cargo bench --bench scale -- [--shape 1000x10x100]… [--churn 1000] [--nodus PATH]
//! [--page-size N] [--settle-ms MS] [--dns] [--proxy]`

use anyhow::{Context, bail};
use nodus_testbed::bench::{Agent, BenchCluster, free_port};
use nodus_testbed::netns::Netns;
use nodus_testbed::nft_commits::CommitWatch;
use nodus_testbed::scale::{self, ProcMemory, Shape, mib, proc_memory};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Options {
    shapes: Vec<Shape>,
    churn: usize,
    nodus: PathBuf,
    settle: Duration,
    page_size: Option<u32>,
    /// Run with the DNS server on (on an ephemeral port) rather than no subsystem at all.
    dns: bool,
    /// Run with the service proxy on, in a network namespace.
    proxy: bool,
}

fn options() -> anyhow::Result<Options> {
    let mut opts = Options {
        shapes: Vec::new(),
        churn: 1000,
        nodus: PathBuf::from(env!("CARGO_BIN_EXE_nodus")),
        settle: Duration::from_secs(2),
        page_size: None,
        dns: false,
        proxy: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--shape" => opts.shapes.push(Shape::parse(&value()?)?),
            "--churn" => opts.churn = value()?.parse()?,
            "--nodus" => opts.nodus = value()?.into(),
            "--settle-ms" => opts.settle = Duration::from_millis(value()?.parse()?),
            "--page-size" => opts.page_size = Some(value()?.parse()?),
            "--dns" => opts.dns = true,
            "--proxy" => opts.proxy = true,
            "--bench" => {}
            other => bail!("unknown argument {other:?}"),
        }
    }
    if opts.shapes.is_empty() {
        opts.shapes = ["100x3x3", "1000x10x100", "10000x10x100"]
            .iter()
            .map(|s| Shape::parse(s))
            .collect::<Result<_, _>>()?;
    }
    Ok(opts)
}

struct Row {
    shape: Shape,
    ready: Duration,
    synced: ProcMemory,
    churn_wall: Duration,
    churn_apply: f64,
    churned: ProcMemory,
    /// With the proxy: one change at a time, API to kernel.
    proxy: Option<ProxyLatencies>,
    /// With the proxy: an annotation on the agent's own Node (as nodus's WireGuard key
    /// is), then the full syncs it caused and the memory after it, peak included.
    annotated: Option<(f64, ProcMemory)>,
}

fn run_shape(opts: &Options, shape: Shape) -> anyhow::Result<Row> {
    let cluster = BenchCluster::new(opts.churn + 10_000, scale::cluster(&shape))?;
    let mut config = opts
        .page_size
        .map_or(String::new(), |n| format!("watch_page_size: {n}\n"));
    config.push_str(&if opts.dns {
        format!("dns:\n  listen: [\"127.0.0.1:{}\"]\n", free_port()?)
    } else {
        "dns:\n  enabled: false\n".to_string()
    });
    let node = scale::node_name(0);
    let ns = opts
        .proxy
        .then(|| Netns::new("scale").map(Arc::new))
        .transpose()?;
    let agent = if let Some(ns) = &ns {
        config.push_str("proxy:\n  enabled: true\n");
        cluster.start_agent_in(ns.clone(), &opts.nodus, &node, &config)?
    } else {
        cluster.start_agent(&opts.nodus, &node, &config)?
    };
    let ready = agent.wait_ready(Duration::from_secs(600))?;
    std::thread::sleep(opts.settle);
    let synced = proc_memory(agent.pid())?;

    let endpoints = "nodus_view_objects{kind=\"endpoint\"}";
    let apply_sum = "nodus_view_apply_duration_seconds_sum";
    let endpoints_before = agent.metric(endpoints)?;
    let apply_before = agent.metric(apply_sum)?;
    let churn_start = Instant::now();
    cluster.churn_slices(&shape, opts.churn)?;
    while agent.metric(endpoints)? <= endpoints_before {
        if churn_start.elapsed() > Duration::from_secs(300) {
            bail!("churn not applied after 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let churn_wall = churn_start.elapsed();
    let churn_apply = agent.metric(apply_sum)? - apply_before;
    std::thread::sleep(opts.settle);
    let churned = proc_memory(agent.pid())?;
    let proxy = match &ns {
        Some(ns) => Some(proxy_latencies(&cluster, ns, &agent, &shape)?),
        None => None,
    };
    let annotated = if opts.proxy {
        Some(annotate_own_node(&cluster, &agent, opts.settle)?)
    } else {
        None
    };
    Ok(Row {
        shape,
        ready,
        synced,
        churn_wall,
        churn_apply,
        churned,
        proxy,
        annotated,
    })
}

/// Puts a `nodus.dev/wireguard-public-key` annotation on the agent's own Node, waits until the view
/// has it and `settle` more, and returns the full proxy syncs that followed and the
/// agent's memory.
fn annotate_own_node(
    cluster: &BenchCluster,
    agent: &Agent,
    settle: Duration,
) -> anyhow::Result<(f64, ProcMemory)> {
    let full_syncs = "nodus_proxy_full_sync_duration_seconds_count";
    let applied = "nodus_view_apply_duration_seconds_count";
    let (syncs_before, batches_before) = (agent.metric(full_syncs)?, agent.metric(applied)?);
    let mut node = scale::node(0);
    node["metadata"]["annotations"]["nodus.dev/wireguard-public-key"] =
        "nHhJ7Xb0zWIvzHMM2iqMYMaqfR4gPHSZXvSlPLDbAno=".into();
    cluster.store.apply_value(node)?;
    let start = Instant::now();
    while agent.metric(applied)? <= batches_before {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the annotated Node was not applied within 30 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // A full sync at 10,000 services takes seconds: give one time to run and finish.
    std::thread::sleep(settle.max(Duration::from_secs(5)));
    Ok((
        agent.metric(full_syncs)? - syncs_before,
        proc_memory(agent.pid())?,
    ))
}

/// Endpoint changes and new services timed one at a time from the API write until the
/// agent has committed them; p50 and p99 of each.
fn proxy_latencies(
    cluster: &BenchCluster,
    ns: &Netns,
    agent: &Agent,
    shape: &Shape,
) -> anyhow::Result<ProxyLatencies> {
    const CHANGES: usize = 200;
    const NEW_SERVICES: usize = 50;
    // The kernel announces each commit; the agent's counter says whether it was the one
    // awaited. The announcement can reach the bench before the agent has read the
    // kernel's answer and counted it, so the counter gets a moment to move.
    let commits = CommitWatch::open(ns)?;
    let committed = |series: &str, before: f64, start: Instant| -> anyhow::Result<Duration> {
        loop {
            let at = commits.next_commit(Duration::from_secs(30))?;
            while at.elapsed() < Duration::from_millis(200) {
                if agent.metric(series)? > before {
                    return Ok(at - start);
                }
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("{series} did not move within 30 s");
            }
        }
    };
    let transactions = "nodus_proxy_transactions_total";
    let programming = Programming::read(agent)?;
    let mut changes = Vec::with_capacity(CHANGES);
    for k in 0..CHANGES {
        let before = agent.metric(transactions)?;
        commits.drain();
        let start = Instant::now();
        // A generation no churn used: new pod addresses, so the plan changes. Its trigger
        // time is now, as the EndpointSlice controller writes it for a pod's change.
        let mut slice = scale::slice(k % shape.services, shape, 1000 + k);
        slice["metadata"]["annotations"]["endpoints.kubernetes.io/last-change-trigger-time"] =
            k8s_openapi::jiff::Timestamp::now().to_string().into();
        cluster.store.apply_value(slice)?;
        changes.push(committed(transactions, before, start)?);
    }
    let programming = Programming::read(agent)?.since(&programming);
    let programmed = "nodus_proxy_services_programmed";
    let mut new_services = Vec::with_capacity(NEW_SERVICES);
    for k in 0..NEW_SERVICES {
        // Past the churn's marker service; the slice first, so the service arrives with
        // its endpoints.
        let i = shape.services + 1 + k;
        cluster.store.apply_value(scale::slice(i, shape, 0))?;
        let before = agent.metric(programmed)?;
        commits.drain();
        let start = Instant::now();
        cluster.store.apply_value(scale::service(i, shape))?;
        new_services.push(committed(programmed, before, start)?);
    }
    Ok(ProxyLatencies {
        change: percentiles(changes),
        new_service: percentiles(new_services),
        programming,
    })
}

/// What the agent's own `kubeproxy_network_programming_duration_seconds` observed: from
/// each EndpointSlice's trigger time to its rules in the kernel.
#[derive(Clone, Copy)]
struct Programming {
    count: f64,
    sum: f64,
    /// Observations in its first bucket (250 ms, kube-proxy's buckets).
    first_bucket: f64,
}

impl Programming {
    const FAMILY: &str = "kubeproxy_network_programming_duration_seconds";

    fn read(agent: &Agent) -> anyhow::Result<Programming> {
        let series = |suffix: &str| agent.metric(&format!("{}{suffix}", Self::FAMILY));
        Ok(Programming {
            count: series("_count")?,
            sum: series("_sum")?,
            first_bucket: series("_bucket{le=\"0.25\"}")?,
        })
    }

    fn since(self, before: &Programming) -> Programming {
        Programming {
            count: self.count - before.count,
            sum: self.sum - before.sum,
            first_bucket: self.first_bucket - before.first_bucket,
        }
    }
}

/// The proxy's latencies: API write → kernel, p50 and p99, for endpoint changes and new
/// services, and what the agent's metric saw of the endpoint changes.
struct ProxyLatencies {
    change: (Duration, Duration),
    new_service: (Duration, Duration),
    programming: Programming,
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99))
}

fn main() -> anyhow::Result<()> {
    let opts = options()?;
    println!(
        "nodus scale bench: {} (churn {} endpoint-slice updates; DNS {}; proxy {})",
        opts.nodus.display(),
        opts.churn,
        if opts.dns { "on" } else { "off" },
        if opts.proxy { "on" } else { "off" }
    );
    println!(
        "{:<14} {:>9} | {:>8} {:>8} {:>8} | {:>10} {:>10} | {:>8} {:>8} {:>8}",
        "shape S×E×N",
        "ready s",
        "RSS MiB",
        "anon",
        "peak",
        "churn ms",
        "apply ms",
        "RSS MiB",
        "anon",
        "peak"
    );
    println!(
        "{:<14} {:>9} | {:^26} | {:^21} | {:^26}",
        "", "", "after initial sync", "churn", "after churn"
    );
    for shape in &opts.shapes {
        let row = run_shape(&opts, *shape)?;
        println!(
            "{:<14} {:>9.2} | {:>8} {:>8} {:>8} | {:>10.1} {:>10.1} | {:>8} {:>8} {:>8}",
            row.shape.to_string(),
            row.ready.as_secs_f64(),
            mib(row.synced.rss_kib),
            mib(row.synced.anon_kib),
            mib(row.synced.peak_rss_kib),
            row.churn_wall.as_secs_f64() * 1000.0,
            row.churn_apply * 1000.0,
            mib(row.churned.rss_kib),
            mib(row.churned.anon_kib),
            mib(row.churned.peak_rss_kib),
        );
        if let Some(ProxyLatencies {
            change,
            new_service,
            programming,
        }) = &row.proxy
        {
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            println!(
                "{:<14} API → kernel: endpoint change p50/p99 {:.1} / {:.1} ms, \
                 new service p50/p99 {:.1} / {:.1} ms",
                "",
                ms(change.0),
                ms(change.1),
                ms(new_service.0),
                ms(new_service.1)
            );
            println!(
                "{:<14} kubeproxy_network_programming_duration_seconds over the endpoint \
                 changes: {} observed, mean {:.1} ms, {} within its first bucket (250 ms)",
                "",
                programming.count,
                programming.sum / programming.count.max(1.0) * 1000.0,
                programming.first_bucket
            );
        }
        if let Some((full_syncs, memory)) = &row.annotated {
            println!(
                "{:<14} own Node annotated: {full_syncs} full proxy syncs; RSS {} anon {} peak {} MiB",
                "",
                mib(memory.rss_kib),
                mib(memory.anon_kib),
                mib(memory.peak_rss_kib)
            );
        }
    }
    Ok(())
}
