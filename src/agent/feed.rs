//! Feeding the view: watch items in, batches applied, initial sync tracked.
//!
//! Bursts coalesce: every item already waiting in the watch stream joins the same batch,
//! so a subsystem syncs once per burst rather than once per event.

use crate::agent::gate::Claim;
use crate::agent::metrics::Metrics;
use crate::agent::watch::{self, WatchItem, WatchSet};
use crate::cli::ClusterArgs;
use crate::config::Config;
use futures::{Stream, StreamExt};
use nodus_cni::gate::GateRequest;
use nodus_view::policy::store::ClaimError;
use nodus_view::{Applied, Kind, Update, View, ViewReader, ViewWriter};
use std::sync::{Arc, RwLockReadGuard};
use std::time::Instant;

/// The most watch items one batch takes: enough to coalesce any burst, small enough that a
/// relist of a large cluster is applied in steps rather than held in memory at once.
const MAX_BATCH: usize = 512;

pub struct Feed {
    view: ViewWriter,
    pub metrics: Arc<Metrics>,
    /// Kinds whose initial list has not completed yet.
    waiting: Vec<Kind>,
    /// nodus-cni's claims for pods the view does not know yet: taken with a later batch.
    unknown_sandboxes: Vec<Claim>,
    /// Claims taken into the view with the last batch, answered once the subsystems have
    /// synced it ([`Feed::answer_sandboxes`]).
    taken_sandboxes: Vec<Claim>,
    /// The view changed (or its lists completed) since it was last counted.
    counts_due: bool,
}

impl Feed {
    /// A feed of `view` that is complete once every kind of `watched` is listed.
    pub fn new(view: View, metrics: Arc<Metrics>, watched: Vec<Kind>) -> Feed {
        Feed {
            view: ViewWriter::new(view),
            metrics,
            waiting: watched,
            unknown_sandboxes: Vec::new(),
            taken_sandboxes: Vec::new(),
            counts_due: false,
        }
    }

    /// A reader of the view this feed writes.
    pub fn reader(&self) -> ViewReader {
        self.view.reader()
    }

    pub fn read(&self) -> RwLockReadGuard<'_, View> {
        self.view.read()
    }

    /// Every watched kind has delivered its initial list: the view is complete.
    pub fn is_complete(&self) -> bool {
        self.view.is_complete()
    }

    /// The view was restored from disk; it is stale until the lists complete.
    pub fn mark_restored(&self) {
        self.view.mark_restored();
    }

    pub fn is_stale(&self) -> bool {
        self.view.is_stale()
    }

    pub fn apply(&mut self, items: Vec<WatchItem>) -> Applied {
        let was_complete = self.is_complete();
        let mut updates = Vec::with_capacity(items.len());
        for item in items {
            match item {
                WatchItem::Update(update) => {
                    if let Update::RelistDone(kind) = update {
                        self.waiting.retain(|k| *k != kind);
                    }
                    updates.push(update);
                }
                WatchItem::Sandbox(claim) => self.unknown_sandboxes.push(claim),
                WatchItem::Tick => {}
                WatchItem::Restarted(kind, error) => {
                    tracing::warn!(kind = kind.as_str(), %error, "watch failed; retrying");
                    self.metrics.watch_restarted(kind);
                    let error = format!("{} watch failed: {error}", kind.as_str());
                    self.metrics.status.view.error(error);
                }
            }
        }
        let mut view = self.view.write();
        let start = Instant::now();
        let mut report = view.apply(updates);
        for claim in std::mem::take(&mut self.unknown_sandboxes) {
            let GateRequest {
                namespace,
                name,
                ips,
            } = &claim.request;
            match view.claim_sandbox(namespace, name, ips, &mut report.changes) {
                Ok(()) => self.taken_sandboxes.push(claim),
                // Kubelet starts a sandbox for a pod it watched: ours comes soon.
                Err(ClaimError::Unknown) if !claim.abandoned() => {
                    self.unknown_sandboxes.push(claim)
                }
                Err(error) => claim.answer(Err(error.to_string())),
            }
        }
        let took = start.elapsed();
        self.metrics.batch_applied(took);
        // Counting walks the view (about 1 ms at 10,000 services), so only after a change,
        // and not after each page of the first lists, which would make them quadratic:
        // once, with the batch that completes them, whether or not that batch changed
        // anything (it may hold only the last list's end). It waits for [`Feed::count`].
        let completes = !was_complete && self.waiting.is_empty();
        let changed = !report.changes.is_empty() || report.pods;
        self.counts_due |= completes || (was_complete && changed);
        drop(view);
        if completes {
            self.view.mark_complete();
        }
        for invalid in &report.invalid {
            // The whole object, or (when the reason says so) only some of its entries.
            tracing::warn!(kind = invalid.kind, object = %invalid.object, reason = %invalid.reason, "skipping invalid input");
            let error = format!("{} {}: {}", invalid.kind, invalid.object, invalid.reason);
            self.metrics.status.view.error(error);
        }
        for kind in report.skipped {
            self.metrics.object_skipped(kind);
        }
        Applied {
            changes: report.changes,
            initial_sync: !was_complete && self.is_complete(),
            stale: self.is_stale(),
            took,
        }
    }

    /// Answers the claims the last batch took: the pods are isolated when the subsystems
    /// that enforce policy are `synced`.
    pub fn answer_sandboxes(&mut self, synced: bool) {
        for claim in self.taken_sandboxes.drain(..) {
            let outcome = if synced {
                Ok(())
            } else {
                Err(
                    "this node's rules are not programmed yet (the agent is starting, or a \
                     sync failed)"
                        .into(),
                )
            };
            claim.answer(outcome);
        }
    }

    /// The view's counts into the metrics, when a batch changed them since the last time.
    /// After the subsystems, not in [`Feed::apply`]: the walk would otherwise delay every
    /// change on its way to the kernel.
    pub fn count(&mut self) {
        if std::mem::take(&mut self.counts_due) {
            self.metrics.set_counts(&self.view.read().counts());
        }
    }

    /// Applies batches from `items` until it ends or `each` says stop; counts the view
    /// after each.
    pub async fn drive<S, F>(&mut self, items: S, mut each: F)
    where
        S: Stream<Item = WatchItem>,
        F: FnMut(&mut Feed, &Applied) -> std::ops::ControlFlow<()>,
    {
        let batches = items.ready_chunks(MAX_BATCH);
        futures::pin_mut!(batches);
        while let Some(batch) = batches.next().await {
            let applied = self.apply(batch);
            let flow = each(self, &applied);
            self.count();
            if flow.is_break() {
                break;
            }
        }
    }
}

/// Connects to the cluster, watches every kind the view holds (every Node included, but not
/// this node's Pods, which only DNS reads), and
/// returns the feed with the watch streams, before any item is applied: for the commands
/// that print the view.
pub async fn follow_cluster(
    cluster: &ClusterArgs,
) -> anyhow::Result<(Feed, impl Stream<Item = WatchItem> + use<>)> {
    let config = Config::load_or_default(cluster.config.as_deref())?
        .with_api_server(cluster.api_server.as_deref())?;
    // Printing the view programs nothing: a plain http:// server is the user's choice.
    let client = watch::connect(
        cluster.kubeconfig.as_deref(),
        config.api_server.as_deref(),
        watch::PlainHttp::Allowed,
    )
    .await?;
    let set = WatchSet {
        page_size: config.watch_page_size,
        all_nodes: true,
        node_name: cluster.node_name.clone(),
        service_cidrs: true,
        local_pods: false,
        // No DNS answers here: Namespaces matter only to the policy chains, which are
        // planned only with the policies, pods and namespaces.
        namespaces: false,
        policy: config.policy.enabled,
        dns_config_map: None,
    };
    let (items, watched) = watch::watch_all(&client, &set);
    let feed = Feed::new(
        View::new(&cluster.node_name),
        Arc::new(Metrics::default()),
        watched,
    );
    Ok((feed, items))
}

/// The complete view: every watch's initial list applied.
pub async fn complete_view(cluster: &ClusterArgs) -> anyhow::Result<Feed> {
    let (mut feed, items) = follow_cluster(cluster).await?;
    feed.drive(items, |feed, _| {
        if feed.is_complete() {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })
    .await;
    anyhow::ensure!(
        feed.is_complete(),
        "the watch streams ended before the initial lists"
    );
    Ok(feed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_testbed::fixtures;

    fn service(name: &str) -> WatchItem {
        let service = fixtures::service("default", name, fixtures::cluster_ip("10.96.0.10"));
        WatchItem::Update(Update::Service(
            serde_json::from_value(service).expect("test service"),
        ))
    }

    /// The counts wait for the first lists, then come with the batch that completes them
    /// even when it holds nothing but the end of the last list, each once the feed counts.
    #[test]
    fn the_view_is_counted_once_its_lists_complete_then_after_each_change() {
        let metrics = Arc::new(Metrics::default());
        let mut feed = Feed::new(
            View::new("node-1"),
            metrics.clone(),
            vec![Kind::Service, Kind::Node],
        );
        let services = || metrics.view_objects()[0];
        feed.apply(vec![
            WatchItem::Update(Update::RelistStarted(Kind::Service)),
            service("web"),
            WatchItem::Update(Update::RelistDone(Kind::Service)),
        ]);
        feed.count();
        assert_eq!(services(), ("service", 0), "a list is still running");
        let applied = feed.apply(vec![WatchItem::Update(Update::RelistDone(Kind::Node))]);
        assert!(applied.initial_sync && applied.changes.is_empty());
        assert_eq!(services(), ("service", 0), "counted after the subsystems");
        feed.count();
        assert_eq!(services(), ("service", 1));
        feed.apply(vec![service("api")]);
        feed.count();
        assert_eq!(services(), ("service", 2));
    }
}
