//! `nodus run`: the agent.
//!
//! The watch streams ([`watch`]) feed the view ([`feed`]); after every batch the run loop
//! hands the view and what the batch did to each subsystem ([`subsystems`]) through one
//! contract ([`nodus_view::Subsystem`]): the proxy, DNS, the mesh and an `--on-change`
//! backend. The node is ready when every subsystem is. [`process`] holds the process's
//! state and [`lifecycle`] how it ends; [`http`] serves `/healthz`, `/readyz`, `/metrics` ([`metrics`])
//! and `/status` ([`status`], [`board`]).

pub mod board;
pub mod feed;
pub mod gate;
pub mod handover;
pub mod health;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod on_change;
pub mod process;
pub mod retry;
pub mod signals;
pub mod state;
pub mod status;
pub mod subscribe;
pub mod subsystems;
pub mod ticks;
pub mod unix_socket;
pub mod watch;

use crate::cli::RunArgs;
use crate::config::{ApiDiscovery, Config};
use feed::Feed;
use futures::{Stream, StreamExt};
use handover::Sockets;
use lifecycle::Handing;
use metrics::Metrics;
use nodus_view::{Applied, View};
use process::ProcessState;
use state::{Saver, StateDir};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use subsystems::Subsystems;
use watch::{WatchItem, WatchSet};

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = configuration(&args)?;
    let node_name = args.cluster.node_name.clone();
    let plain_http = if args.allow_http_api {
        watch::PlainHttp::Allowed
    } else {
        watch::PlainHttp::Refused
    };
    let client = watch::connect(
        args.cluster.kubeconfig.as_deref(),
        config.api_server.as_deref(),
        plain_http,
    )
    .await?;
    let state_dir = args.state_dir.as_deref().or(config.state_dir.as_deref());
    let state = state_dir.and_then(|dir| StateDir::new(dir, &node_name));
    // Before binding anything: a running nodus for this node hands its sockets over.
    let inherited = match &state {
        Some(state) => take_over(state).await,
        None => Sockets::default(),
    };
    for failure in crate::preflight::check_host(&config, !inherited.dns.is_empty()) {
        tracing::error!(
            check = %failure,
            "start-up check failed; what needs it is retried until the host allows it"
        );
    }
    let metrics = Arc::new(Metrics::default());
    let process = Arc::new(ProcessState::default());
    let http_limits = http::limits(&config.cluster_cidrs);
    let http = http::serve(&config, inherited.http, http_limits, &metrics, &process).await?;
    tracing::info!(node = %node_name, http_addr = %http.addr, "nodus starting");

    let (items, watched) = watch::watch_all(&client, &WatchSet::of(&config, &node_name));
    let mut feed = restore_or_start(state.as_ref(), &node_name, &metrics, watched, &process);
    let mut saver = state
        .clone()
        .map(|state| Saver::new(state, feed.reader(), metrics.clone()));
    let mut subsystems = Subsystems::start(
        &config,
        &args,
        feed.reader(),
        client,
        &metrics,
        inherited.dns,
    )
    .await;
    if feed.is_stale() {
        let restored = Applied {
            initial_sync: true,
            stale: true,
            ..Applied::default()
        };
        subsystems.after_batch(&feed.read(), &restored);
    }
    let wakes = Arc::new(ticks::Wakes::default());
    let items = with_ticks_and_claims(items, ticks::ticks(wakes.clone()), &config, &metrics);
    let dns = subsystems.dns_handover.clone();
    let handing = Handing::new(state, feed.reader(), metrics.clone(), dns);
    let mut signals = signals::ShutdownSignals::install()?;
    let drive = feed.drive(items, |feed, applied| {
        after_batch(feed, applied, &mut subsystems, saver.as_mut(), &process);
        wakes.set(subsystems.wake_at());
        ControlFlow::Continue(())
    });
    let lameduck = Duration::from_secs(config.lameduck_seconds);
    let ending = lifecycle::serve(drive, &mut signals, lameduck, &process, &handing, &http).await?;
    let device_ends = metrics.status.device_ends_with_process.load(Relaxed);
    lifecycle::finish(
        ending,
        saver.as_mut(),
        &http,
        subsystems,
        &mut signals,
        device_ends,
    )
    .await;
    Ok(())
}

/// The configuration file with the command line laid over, checked before anything runs.
fn configuration(args: &RunArgs) -> anyhow::Result<Config> {
    let mut config = Config::load_or_default(args.cluster.config.as_deref())?
        .with_api_server(args.cluster.api_server.as_deref())?;
    config.check_bootstrap(&ApiDiscovery::of_process(args.cluster.kubeconfig.is_some()))?;
    if config.proxy.enabled {
        nodus_proxy::kernel::check_running().map_err(anyhow::Error::msg)?;
    }
    if let Some(addr) = args.http_addr {
        config.http_addr = addr;
    }
    anyhow::ensure!(
        !args.cluster.node_name.is_empty(),
        "the node name is required: pass --node-name or set NODE_NAME"
    );
    Ok(config)
}

/// The feed, from the view saved before when there is one: DNS and the mesh serve from
/// it, stale, until the API's lists replace it.
fn restore_or_start(
    state: Option<&StateDir>,
    node_name: &str,
    metrics: &Arc<Metrics>,
    watched: Vec<nodus_view::Kind>,
    process: &ProcessState,
) -> Feed {
    let Some((view, restored)) = state.and_then(StateDir::restore) else {
        return Feed::new(View::new(node_name), metrics.clone(), watched);
    };
    let counts = view.counts();
    tracing::info!(
        services = counts.services,
        endpoints = counts.endpoints,
        nodes = counts.nodes,
        bytes = restored.bytes,
        took = ?restored.took,
        saved_unix_ms = status::unix_ms(restored.saved),
        "restored the view saved before; DNS and the mesh serve from it, stale, until \
         the API's lists replace it"
    );
    metrics.set_counts(&counts);
    process.restored();
    let _ = metrics.status.restored.set(restored);
    let feed = Feed::new(view, metrics.clone(), watched);
    feed.mark_restored();
    feed
}

/// The watch items with the loop's `ticks` and, with policies on, nodus-cni's requests to
/// isolate new pods, which wait until they are.
fn with_ticks_and_claims(
    items: impl Stream<Item = WatchItem> + Send + 'static,
    ticks: impl Stream<Item = WatchItem> + Send + 'static,
    config: &Config,
    metrics: &Metrics,
) -> impl Stream<Item = WatchItem> + Send + 'static {
    let claims = config.policy.gate().and_then(|path| match unix_socket::listen(path, 0o600) {
        Ok(listener) => Some(gate::claims(listener).map(WatchItem::Sandbox)),
        Err(error) => {
            let error = format!("{error:#}");
            tracing::error!(%error, "no isolation gate: nodus-cni's ADD fails until it is fixed (pods fail closed)");
            metrics.status.view.error(error);
            None
        }
    });
    let items = futures::stream::select(items, ticks);
    futures::stream::select(items, futures::stream::iter(claims).flatten())
}

/// After every batch: the view saved, the process's state, every subsystem, and the
/// pods nodus-cni waits on answered.
fn after_batch(
    feed: &mut Feed,
    applied: &Applied,
    subsystems: &mut Subsystems,
    saver: Option<&mut Saver>,
    process: &ProcessState,
) {
    feed.metrics.run_loop.beat();
    if !feed.is_complete() && !applied.stale {
        feed.answer_sandboxes(false);
        return;
    }
    if let Some(saver) = saver {
        saver.after_batch(applied);
    }
    if !applied.stale {
        if applied.initial_sync {
            process.lists_replaced_the_view();
        }
        if applied.initial_sync || !applied.changes.is_empty() {
            feed.metrics.status.view.synced(applied.took);
        }
    }
    let view = feed.read();
    process.set_node_leaving(view.this_node().is_some_and(|node| node.leaving));
    subsystems.after_batch(&view, applied);
    process.set_ready(subsystems.all_ready(), &view);
    if !applied.changes.is_empty() {
        tracing::debug!(
            services = applied.changes.services.len(),
            nodes = applied.changes.nodes.len(),
            "view updated"
        );
    }
    drop(view);
    // The pods nodus-cni waits on are isolated once the proxy, which enforces policies,
    // is in step.
    feed.answer_sandboxes(subsystems.proxy_ready() && !applied.stale);
}

/// The sockets of a running nodus for this node, which hands them over, if one runs.
async fn take_over(state: &StateDir) -> Sockets {
    let path = state.handover_path();
    let taken = tokio::task::spawn_blocking(move || handover::take_over(&path)).await;
    match taken.map_err(anyhow::Error::from).and_then(|taken| taken) {
        Ok(Some(sockets)) => {
            tracing::info!(
                http = sockets.http.len(),
                dns = sockets.dns.len(),
                "took the sockets over from the running nodus; it stops serving"
            );
            sockets
        }
        Ok(None) => Sockets::default(),
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), "the running nodus did not hand its sockets over; starting without them");
            Sockets::default()
        }
    }
}
