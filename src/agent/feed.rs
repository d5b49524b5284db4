//! Feeding the view: watch items in, batches applied, initial sync tracked.
//!
//! Bursts coalesce: every item already waiting in the watch stream joins the same batch,
//! so a subsystem syncs once per burst rather than once per event.

use crate::metrics::Metrics;
use crate::watch::WatchItem;
use futures::{Stream, StreamExt};
use nodus_view::SharedView;
use nodus_view::{ChangeSet, Kind, Update, View};
use std::sync::Arc;
use std::sync::{RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

/// The most watch items one batch takes: enough to coalesce any burst, small enough that a
/// relist of a large cluster is applied in steps rather than held in memory at once.
const MAX_BATCH: usize = 512;

/// What one batch did.
#[derive(Debug, Default)]
pub struct Applied {
    pub changes: ChangeSet,
    /// This batch completed the initial list of every watched kind.
    pub initial_sync: bool,
    /// Time spent applying it to the view.
    pub took: std::time::Duration,
}

pub struct Feed {
    /// Shared with the DNS server, which reads it while the feed is between batches.
    pub view: SharedView,
    pub metrics: Arc<Metrics>,
    /// Kinds whose initial list has not completed yet.
    waiting: Vec<Kind>,
}

impl Feed {
    pub fn new(view: SharedView, metrics: Arc<Metrics>, kinds: Vec<Kind>) -> Feed {
        Feed {
            view,
            metrics,
            waiting: kinds,
        }
    }

    /// The view, for reading. A panic while the lock was held cannot leave the view half
    /// applied in a way readers must avoid (each update is applied whole), so a poisoned
    /// lock is used as it is.
    pub fn read(&self) -> RwLockReadGuard<'_, View> {
        self.view
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn read_write(&self) -> RwLockWriteGuard<'_, View> {
        self.view
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every watched kind has delivered its initial list: the view is complete.
    pub fn synced(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn apply(&mut self, items: Vec<WatchItem>) -> Applied {
        let was_synced = self.synced();
        let mut updates = Vec::with_capacity(items.len());
        for item in items {
            match item {
                WatchItem::Update(update) => {
                    if let Update::RelistDone(kind) = update {
                        self.waiting.retain(|k| *k != kind);
                    }
                    updates.push(update);
                }
                WatchItem::Tick => {}
                WatchItem::Restarted(kind, error) => {
                    tracing::warn!(kind = kind.as_str(), %error, "watch failed; retrying");
                    self.metrics.watch_restarted(kind);
                    let error = format!("{} watch failed: {error}", kind.as_str());
                    self.metrics.status.view.error(error);
                }
            }
        }
        let mut view = self.read_write();
        let start = Instant::now();
        let report = view.apply(updates);
        let took = start.elapsed();
        self.metrics.batch_applied(took);
        // Counting walks the view (about 1 ms at 10,000 services), so only after a change.
        if !report.changes.is_empty() {
            self.metrics.set_counts(&view.counts());
        }
        drop(view);
        for invalid in &report.invalid {
            tracing::warn!(kind = invalid.kind, object = %invalid.object, reason = %invalid.reason, "skipping invalid object");
            let error = format!(
                "{} {} skipped: {}",
                invalid.kind, invalid.object, invalid.reason
            );
            self.metrics.status.view.error(error);
        }
        for kind in report.skipped {
            self.metrics.object_skipped(kind);
        }
        Applied {
            changes: report.changes,
            initial_sync: !was_synced && self.synced(),
            took,
        }
    }

    /// Applies batches from `items` until it ends or `each` says stop.
    pub async fn drive<S, F>(&mut self, items: S, mut each: F)
    where
        S: Stream<Item = WatchItem>,
        F: FnMut(&Feed, &Applied) -> std::ops::ControlFlow<()>,
    {
        let batches = items.ready_chunks(MAX_BATCH);
        futures::pin_mut!(batches);
        while let Some(batch) = batches.next().await {
            let applied = self.apply(batch);
            if each(self, &applied).is_break() {
                break;
            }
        }
    }
}
