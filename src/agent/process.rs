//! What the process is now (ready, serving a restored view, its node leaving, in
//! lameduck), as `/readyz`, `/healthz`, `/status` and `/metrics` report it; the
//! transitions are logged once each. [`crate::agent::lifecycle`] moves it along.

use nodus_view::View;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// What the process is now, as `/readyz`, `/healthz`, `/status` and `/metrics` report it.
#[derive(Debug, Default)]
pub struct ProcessState {
    /// Every subsystem applied the view.
    ready: AtomicBool,
    /// The view is the one restored from disk, not yet replaced by the lists.
    view_stale: AtomicBool,
    /// This Node is being deleted or tainted for removal.
    node_leaving: AtomicBool,
    /// SIGTERM came: serving out the lameduck period, not ready.
    lameduck: AtomicBool,
}

impl ProcessState {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Relaxed)
    }

    pub fn is_view_stale(&self) -> bool {
        self.view_stale.load(Relaxed)
    }

    pub fn is_node_leaving(&self) -> bool {
        self.node_leaving.load(Relaxed)
    }

    pub fn is_lameduck(&self) -> bool {
        self.lameduck.load(Relaxed)
    }

    /// The view was restored from disk: stale until the lists replace it.
    pub fn restored(&self) {
        self.view_stale.store(true, Relaxed);
    }

    /// The lists completed after a restore.
    pub fn lists_replaced_the_view(&self) {
        if self.view_stale.swap(false, Relaxed) {
            tracing::info!("the API's lists replaced the restored view");
        }
    }

    pub fn set_ready(&self, ready: bool, view: &View) {
        if ready != self.ready.swap(ready, Relaxed) && ready {
            let counts = view.counts();
            tracing::info!(
                services = counts.services,
                endpoint_slices = counts.endpoint_slices,
                endpoints = counts.endpoints,
                nodes = counts.nodes,
                "initial view applied; ready"
            );
        }
    }

    /// SIGTERM came: serving out the lameduck period, not ready.
    pub fn enter_lameduck(&self) {
        self.lameduck.store(true, Relaxed);
    }

    pub fn set_node_leaving(&self, leaving: bool) {
        if leaving == self.node_leaving.swap(leaving, Relaxed) {
            return;
        }
        if leaving {
            tracing::warn!(
                "this Node is being deleted or tainted for removal: /healthz answers 503 so \
                 that load balancers drain it"
            );
        } else {
            tracing::info!("this Node is no longer leaving: /healthz answers 200");
        }
    }
}
