//! The one contract between the run loop and each subsystem that consumes the view (the
//! proxy, DNS, the mesh, an external `--on-change` backend).
//!
//! The loop applies a batch of watch events to the view, then hands every subsystem the
//! view and what the batch did. Each subsystem owns how it reacts (a netlink transaction,
//! a poke to a task of its own, nothing at all when it reads the view at query time), its
//! metrics and its readiness; the node is ready when every subsystem is.

use crate::{ChangeSet, View};
use std::time::{Duration, Instant};

/// What one batch did to the view.
#[derive(Debug, Default)]
pub struct Applied {
    pub changes: ChangeSet,
    /// This batch completed the initial list of every watched kind: everything changed.
    /// With `stale`, the view was just restored from disk instead.
    pub initial_sync: bool,
    /// The view is the one restored from disk at start, not yet replaced by the lists:
    /// what serves through an API outage acts on it (DNS, the mesh's peers); what must
    /// not act on old data (the proxy, whose table the kernel keeps across a restart)
    /// waits for the batch that completes the lists.
    pub stale: bool,
    /// Time spent applying it to the view.
    pub took: Duration,
}

pub trait Subsystem {
    /// A short name, for logs and `/status`.
    fn name(&self) -> &'static str;

    /// Brings the subsystem in step with `view` after `applied`; called after every
    /// batch once the view is complete (or restored, see [`Applied::stale`]), and on the
    /// run loop's periodic tick (with an empty change set), so that a subsystem can check
    /// and repair its dataplane.
    fn after_batch(&mut self, view: &View, applied: &Applied);

    /// Whether its dataplane reflects the complete view.
    fn is_ready(&self) -> bool {
        true
    }

    /// Whether what it runs in the background still runs: a task of its own that ended
    /// (it panicked) makes the run loop start the subsystem again.
    fn is_alive(&self) -> bool {
        true
    }

    /// When it wants [`Subsystem::after_batch`] again if no batch comes first (with an
    /// empty change set, as on the periodic tick): work it put off, such as the proxy's
    /// UDP conntrack cleanup of at most one a second.
    fn wake_at(&self) -> Option<Instant> {
        None
    }
}
