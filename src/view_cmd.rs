//! `nodus view`: the resolved node view for people and scripts.
//!
//! Without `--watch` it prints the whole view once the initial lists are in. With
//! `--watch` it prints one JSON line per service or node: each one once the view is
//! complete, then each one again whenever a batch touches it (`"object": null` once it is
//! gone). Any program that reads JSON lines can be a specialised backend.

use crate::ViewArgs;
use crate::feed::Feed;
use crate::metrics::Metrics;
use crate::run::load_config;
use crate::watch::{self, WatchSet};
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

fn print_changes(view: &View, changes: &ChangeSet, out: &mut impl Write) -> std::io::Result<()> {
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

fn everything(view: &View) -> ChangeSet {
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

pub async fn view(args: ViewArgs) -> anyhow::Result<()> {
    let config = load_config(&args.cluster)?;
    let client = watch::connect(
        args.cluster.kubeconfig.as_deref(),
        config.api_server.as_deref(),
    )
    .await?;
    let set = WatchSet {
        page_size: config.watch_page_size,
        all_nodes: true,
        node_name: args.cluster.node_name.clone(),
    };
    let (items, kinds) = watch::watch_all(&client, &set);
    let mut feed = Feed::new(
        Arc::new(RwLock::new(View::new(&args.cluster.node_name))),
        Arc::new(Metrics::default()),
        kinds,
    );
    let mut result = Ok(());
    let stdout = std::io::stdout();
    feed.drive(items, |feed, applied| {
        let mut out = stdout.lock();
        let printed = if !feed.synced() {
            return ControlFlow::Continue(());
        } else if !args.watch {
            serde_json::to_writer_pretty(&mut out, &resolve_view(&feed.read()))
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(out))
                .map(|()| ControlFlow::Break(()))
        } else if applied.initial_sync {
            {
                let view = feed.read();
                print_changes(&view, &everything(&view), &mut out)
            }
            .map(|()| ControlFlow::Continue(()))
        } else {
            print_changes(&feed.read(), &applied.changes, &mut out)
                .map(|()| ControlFlow::Continue(()))
        };
        printed.unwrap_or_else(|error| {
            // A closed pipe (`nodus view --watch | head`) ends the stream quietly.
            if error.kind() != std::io::ErrorKind::BrokenPipe {
                result = Err(error.into());
            }
            ControlFlow::Break(())
        })
    })
    .await;
    result
}
