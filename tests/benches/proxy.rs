//! The proxy's programming cost, in a fresh network namespace: a cold full sync, one
//! endpoint change, one new service and a restart that adopts the table, at 1,000 and
//! 10,000 services × 10 endpoints; the kernel memory of the ruleset (what nf_tables
//! allocates, charged to the memory cgroup of the process that programs it); and, at 1,000
//! services, `nft -f` of the same ruleset as `nodus proxy render` prints it, which is what
//! kube-proxy and knls pay. Latencies here are view update → plan → netlink commit, in
//! process; the API round trip comes on top (see the scale bench). The UDP conntrack
//! cleanup that follows a commit is timed apart, as kube-proxy's network programming
//! latency leaves it out. A counting allocator
//! gives the applier's heap: what it keeps at rest, and the most it held above the view
//! during the cold sync and during the restart's adoption.
//! It prints figures and asserts nothing.
//!
//! `cargo bench --bench proxy -- [--services 1000,10000] [--shape SxExN[:P[:R]]]…
//! [--changes 200]`

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use anyhow::{Context, bail};
use nodus_proxy::apply::Proxy;
use nodus_proxy::plan::{EndpointKeys, Planner, ProxySettings, render};
use nodus_testbed::bench::KernelMemory;
use nodus_testbed::heap::{self, Counting};
use nodus_testbed::netns::Netns;
use nodus_testbed::scale::{self, Shape};
use nodus_view::{Update, View};
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The view of `shape`, applied a page at a time as the watcher does.
fn view_of(shape: &Shape) -> anyhow::Result<View> {
    let mut view = View::new(&scale::node_name(0));
    scale::apply_in_pages(&mut view, scale::cluster(shape))?;
    Ok(view)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

struct Row {
    shape: Shape,
    cold: Duration,
    restart: Duration,
    kernel_mib: f64,
    /// The applier's records after the cold sync: what it keeps per service.
    record_kib: f64,
    /// The applier's heap after the cold sync, and the most it held above the view during
    /// the cold sync and the restart.
    heap_rest: usize,
    heap_cold: usize,
    heap_restart: usize,
    change: (Duration, Duration),
    new_service: (Duration, Duration),
    /// The UDP conntrack cleanups that followed those syncs' commits, median.
    cleanup: Option<Duration>,
    nft_file: Option<Duration>,
}

fn run(shape: Shape, changes: usize, kernel_memory: &KernelMemory) -> anyhow::Result<Row> {
    let services = shape.services;
    let mut view = view_of(&shape)?;
    let ns = Netns::new("pbench")?;
    let view_heap = heap::live();
    heap::reset_peak();
    let (mut proxy, cold, kernel_mib) =
        ns.enter(|| -> anyhow::Result<(Proxy, Duration, f64)> {
            // The thread ends when the closure returns, which takes it out of the cgroup.
            kernel_memory.join()?;
            let before = kernel_memory.bytes()?;
            let mut proxy = Proxy::new(ProxySettings::default())?;
            let start = Instant::now();
            let report = proxy.full_sync(&view)?;
            let cold = start.elapsed();
            anyhow::ensure!(report.refused.is_empty(), "refused: {:?}", report.refused);
            let bytes = kernel_memory.bytes()?.saturating_sub(before);
            Ok((proxy, cold, mib(usize::try_from(bytes)?)))
        })??;
    let heap_cold = heap::peak().saturating_sub(view_heap);
    let heap_rest = heap::live().saturating_sub(view_heap);
    let record_kib = proxy.record_bytes() as f64 / 1024.0;

    // Until the rules are in place: the conntrack cleanup that follows is timed apart.
    let mut cleanups = Vec::new();
    let mut timed = |updates: Vec<Update>, view: &mut View| -> anyhow::Result<Duration> {
        let start = Instant::now();
        let report = view.apply(updates);
        let synced = proxy.sync(view, &report.changes)?;
        let took = start.elapsed();
        let cleanup = synced.udp_cleanup.map(|cleanup| cleanup.took);
        cleanups.extend(cleanup);
        Ok(took.saturating_sub(cleanup.unwrap_or_default()))
    };
    let mut change_times = Vec::with_capacity(changes);
    for k in 0..changes {
        let slice = scale::slice(k % services, &shape, k / services + 1);
        change_times.push(timed(vec![scale::update(slice)?], &mut view)?);
    }
    let mut add_times = Vec::new();
    for k in 0..changes.min(100) {
        let i = services + k;
        let objects = vec![
            scale::update(scale::service(i, &shape))?,
            scale::update(scale::slice(i, &shape, 0))?,
        ];
        add_times.push(timed(objects, &mut view)?);
    }
    change_times.sort();
    add_times.sort();
    cleanups.sort();
    drop(proxy);

    // A restart: a new applier adopts the table (it reads back the key blocks and
    // elements in place and sends only what differs).
    let view_heap = heap::live();
    heap::reset_peak();
    let restart = ns.enter(|| -> anyhow::Result<Duration> {
        let mut proxy = Proxy::new(ProxySettings::default())?;
        let start = Instant::now();
        let report = proxy.full_sync(&view)?;
        anyhow::ensure!(report.refused.is_empty(), "refused: {:?}", report.refused);
        Ok(start.elapsed())
    })??;
    let heap_restart = heap::peak().saturating_sub(view_heap);

    // What the `nft` binary costs for the same ruleset, where that stays affordable.
    let nft_file = if services <= 1000 {
        let planner = Planner::new(&view, &ProxySettings::default());
        let text = render(
            &planner.skeleton(),
            planner.services(&mut EndpointKeys::new()),
        );
        let file =
            std::env::temp_dir().join(format!("nodus-proxy-bench-{}.nft", std::process::id()));
        std::fs::write(&file, text)?;
        let other = Netns::new("pbnft")?;
        let start = Instant::now();
        other.exec("nft", &["-f", &file.to_string_lossy()])?;
        let took = start.elapsed();
        let _ = std::fs::remove_file(&file);
        Some(took)
    } else {
        None
    };
    Ok(Row {
        shape,
        heap_rest,
        heap_cold,
        heap_restart,
        cold,
        restart,
        kernel_mib,
        record_kib,
        change: (
            percentile(&change_times, 0.5),
            percentile(&change_times, 0.99),
        ),
        new_service: (percentile(&add_times, 0.5), percentile(&add_times, 0.99)),
        cleanup: (!cleanups.is_empty()).then(|| percentile(&cleanups, 0.5)),
        nft_file,
    })
}

fn main() -> anyhow::Result<()> {
    let mut shapes: Vec<Shape> = Vec::new();
    let mut changes = 200;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--services" => {
                for services in args.next().context("--services needs a list")?.split(',') {
                    shapes.push(Shape::new(services.parse()?, 10, 100));
                }
            }
            "--shape" => shapes.push(Shape::parse(
                &args.next().context("--shape needs SxExN[:P[:R]]")?,
            )?),
            "--changes" => changes = args.next().context("--changes needs a value")?.parse()?,
            "--bench" => {}
            other => bail!("unknown argument {other:?}"),
        }
    }
    if shapes.is_empty() {
        shapes = vec![Shape::new(1000, 10, 100), Shape::new(10_000, 10, 100)];
    }
    let kernel_memory = KernelMemory::new("proxy-bench");
    println!("proxy bench: in a fresh network namespace; {changes} changes");
    println!("kernel MiB: {}", kernel_memory.method());
    println!(
        "{:<36} | {:>8} | {:>10} | {:>6} | {:>7} | {:>26} | {:>21} | {:>21} | {:>11} | {:>14}",
        "shape S×E×N",
        "cold ms",
        "restart ms",
        "kernel",
        "records",
        "heap rest / cold / restart",
        "endpoint change p50/p99",
        "new service p50/p99",
        "UDP cleanup",
        "nft -f ms (×)"
    );
    println!(
        "{:<36} | {:>8} | {:>10} | {:>6} | {:>7} | {:>26} | {:>21} | {:>21} | {:>11} | {:>14}",
        "",
        "",
        "",
        "MiB",
        "KiB",
        "MiB, peaks above the view",
        "ms, rules in place",
        "ms, rules in place",
        "p50 ms",
        ""
    );
    for shape in shapes {
        let row = run(shape, changes, &kernel_memory)?;
        let nft = row.nft_file.map_or("-".to_string(), |d| {
            format!(
                "{:.0} ({:.1}×)",
                ms(d),
                d.as_secs_f64() / row.cold.as_secs_f64()
            )
        });
        println!(
            "{:<36} | {:>8.1} | {:>10.1} | {:>6.1} | {:>7.0} | {:>8.1} / {:>6.1} / {:>6.1} | {:>10.2} / {:>8.2} | {:>10.2} / {:>8.2} | {:>11} | {:>14}",
            row.shape.to_string(),
            ms(row.cold),
            ms(row.restart),
            row.kernel_mib,
            row.record_kib,
            mib(row.heap_rest),
            mib(row.heap_cold),
            mib(row.heap_restart),
            ms(row.change.0),
            ms(row.change.1),
            ms(row.new_service.0),
            ms(row.new_service.1),
            row.cleanup
                .map_or("-".to_string(), |d| format!("{:.2}", ms(d))),
            nft
        );
    }
    Ok(())
}
