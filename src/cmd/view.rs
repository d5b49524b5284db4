//! `nodus view`: the resolved node view for people and scripts.
//!
//! Without `--watch` it prints the whole view once the initial lists are in. With
//! `--watch` it prints one JSON line per service or node: each one once the view is
//! complete, then each one again whenever a batch touches it (`"object": null` once it is
//! gone). Any program that reads JSON lines can be a specialised backend.

use crate::feed::Feed;
use crate::metrics::Metrics;
use crate::run::load_config;
use crate::watch::WatchItem;
use crate::watch::{self, WatchSet};
use crate::{ClusterArgs, ViewArgs};
use futures::Stream;
use nodus_view::output::{resolve_node, resolve_service, resolve_view};
use nodus_view::{ChangeSet, View};
use serde::Serialize;
use std::io::Write;
use std::ops::ControlFlow;
use std::sync::{Arc, RwLock};

#[derive(Serialize)]
struct Line<'a, T: Serialize> {
    kind: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    namespace: &'a str,
    name: &'a str,
    object: Option<T>,
}

fn print_line<T: Serialize>(out: &mut impl Write, line: &Line<'_, T>) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")
}

pub fn print_changes(
    view: &View,
    changes: &ChangeSet,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let node = view.node_context();
    for name in &changes.services {
        let object = view
            .service(&name.namespace, &name.name)
            .map(|s| resolve_service(view.strings(), &node, &s));
        print_line(
            out,
            &Line {
                kind: "Service",
                namespace: &name.namespace,
                name: &name.name,
                object,
            },
        )?;
    }
    for name in &changes.nodes {
        let object = view
            .node(name)
            .map(|n| resolve_node(view.strings(), name, n));
        print_line(
            out,
            &Line {
                kind: "Node",
                namespace: "",
                name,
                object,
            },
        )?;
    }
    out.flush()
}

pub fn everything(view: &View) -> ChangeSet {
    let mut all = ChangeSet::default();
    for s in view.services() {
        all.services.insert(nodus_view::ServiceName {
            namespace: s.namespace.to_string(),
            name: s.name.to_string(),
        });
    }
    all.nodes = view.nodes().map(|(name, _)| name.to_string()).collect();
    all
}

/// Connects, watches every kind the view holds (every Node included), and returns the
/// feed with the watch streams, before any item is applied.
async fn follow(
    cluster: &ClusterArgs,
) -> anyhow::Result<(Feed, impl Stream<Item = WatchItem> + use<>)> {
    let config = load_config(cluster)?;
    let client =
        watch::connect(cluster.kubeconfig.as_deref(), config.api_server.as_deref()).await?;
    let set = WatchSet {
        page_size: config.watch_page_size,
        all_nodes: true,
        node_name: cluster.node_name.clone(),
    };
    let (items, kinds) = watch::watch_all(&client, &set);
    let view = Arc::new(RwLock::new(View::new(&cluster.node_name)));
    Ok((Feed::new(view, Arc::new(Metrics::default()), kinds), items))
}

/// The complete view: every watch's initial list applied.
pub async fn synced_view(cluster: &ClusterArgs) -> anyhow::Result<Feed> {
    let (mut feed, items) = follow(cluster).await?;
    feed.drive(items, |feed, _| match feed.synced() {
        true => ControlFlow::Break(()),
        false => ControlFlow::Continue(()),
    })
    .await;
    anyhow::ensure!(
        feed.synced(),
        "the watch streams ended before the initial lists"
    );
    Ok(feed)
}

pub async fn view(args: ViewArgs) -> anyhow::Result<()> {
    if !args.watch {
        let feed = synced_view(&args.cluster).await?;
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &resolve_view(&feed.read()))?;
        writeln!(out)?;
        return Ok(());
    }
    let (mut feed, items) = follow(&args.cluster).await?;
    let mut result = Ok(());
    let stdout = std::io::stdout();
    feed.drive(items, |feed, applied| {
        if !feed.synced() {
            return ControlFlow::Continue(());
        }
        let mut out = stdout.lock();
        let view = feed.read();
        let printed = if applied.initial_sync {
            print_changes(&view, &everything(&view), &mut out)
        } else {
            print_changes(&view, &applied.changes, &mut out)
        };
        match printed {
            Ok(()) => ControlFlow::Continue(()),
            Err(error) => {
                // A closed pipe (`nodus view --watch | head`) ends the stream quietly.
                if error.kind() != std::io::ErrorKind::BrokenPipe {
                    result = Err(error.into());
                }
                ControlFlow::Break(())
            }
        }
    })
    .await;
    result
}
