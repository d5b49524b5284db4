//! `nodus run`: the agent.

use crate::config::Config;
use crate::feed::Feed;
use crate::metrics::Metrics;
use crate::watch::{self, WatchSet};
use crate::{ClusterArgs, RunArgs};
use anyhow::Context;
use nodus_view::View;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// The configuration file, if any, with the flags applied over it.
pub fn load_config(cluster: &ClusterArgs) -> anyhow::Result<Config> {
    match &cluster.config {
        Some(path) => Config::load(path),
        None => Ok(Config::default()),
    }
}

/// Resolves on SIGTERM or SIGINT. nodus never tears its dataplane down on exit: a restart
/// must not drop traffic.
pub async fn shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut config = load_config(&args.cluster)?;
    if let Some(addr) = args.http_addr {
        config.http_addr = addr;
    }
    let node_name = args.cluster.node_name.clone();
    anyhow::ensure!(
        !node_name.is_empty(),
        "the node name is required: pass --node-name or set NODE_NAME"
    );
    for name in config.unavailable_subsystems() {
        tracing::warn!(
            subsystem = name,
            "enabled in the configuration but not in this build; ignored"
        );
    }
    let client = watch::connect(
        args.cluster.kubeconfig.as_deref(),
        config.api_server.as_deref(),
    )
    .await?;
    let metrics = Arc::new(Metrics::default());
    let http_addr = crate::http::serve(config.http_addr, metrics.clone()).await?;
    tracing::info!(node = %node_name, %http_addr, "nodus starting");

    let set = WatchSet {
        page_size: config.watch_page_size,
        all_nodes: config.mesh.enabled,
        node_name: node_name.clone(),
    };
    let (items, kinds) = watch::watch_all(&client, &set);
    let mut feed = Feed::new(View::new(&node_name), metrics.clone(), kinds);
    let follow = feed.drive(items, |feed, applied| {
        if applied.initial_sync {
            // No subsystem is in this build yet, so applying the view is all there is.
            feed.metrics.ready.store(true, Relaxed);
            let counts = feed.view.counts();
            tracing::info!(
                services = counts.services,
                endpoint_slices = counts.endpoint_slices,
                endpoints = counts.endpoints,
                nodes = counts.nodes,
                "initial view applied; ready"
            );
        } else if !applied.changes.is_empty() {
            tracing::debug!(
                services = applied.changes.services.len(),
                nodes = applied.changes.nodes.len(),
                "view updated"
            );
        }
        ControlFlow::Continue(())
    });
    tokio::select! {
        () = follow => anyhow::bail!("the watch streams ended"),
        signal = shutdown_signal() => {
            tracing::info!(signal = signal?, "exiting; the dataplane stays in place");
            Ok(())
        }
    }
}
