//! The proxy's series in `/metrics`, and its last sync and error for `/status`.

use crate::apply::{SyncKind, SyncReport};
use nodus_prom::{Histogram, Tracker, single};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the sync histograms, in seconds.
const SYNC_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 2.0, 10.0];

pub struct ProxyMetrics {
    full: Histogram<{ SYNC_BUCKETS.len() }>,
    partial: Histogram<{ SYNC_BUCKETS.len() }>,
    services: AtomicU64,
    transactions: AtomicU64,
    conntrack_deletions: AtomicU64,
    failures: AtomicU64,
    pub status: Tracker,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        ProxyMetrics {
            full: Histogram::new(SYNC_BUCKETS),
            partial: Histogram::new(SYNC_BUCKETS),
            services: AtomicU64::new(0),
            transactions: AtomicU64::new(0),
            conntrack_deletions: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            status: Tracker::default(),
        }
    }
}

impl ProxyMetrics {
    pub fn synced(&self, report: &SyncReport, programmed: usize) {
        match report.kind {
            SyncKind::Full => self.full.observe(report.duration),
            SyncKind::Partial => self.partial.observe(report.duration),
        }
        self.services.store(programmed as u64, Relaxed);
        self.transactions
            .fetch_add(report.transactions as u64, Relaxed);
        self.conntrack_deletions
            .fetch_add(report.conntrack_deletions as u64, Relaxed);
        self.status.synced(report.duration);
    }

    pub fn sync_failed(&self, error: impl std::fmt::Display) {
        self.failures.fetch_add(1, Relaxed);
        self.status.failed(error);
    }

    /// Services whose rules are in the kernel.
    pub fn services_programmed(&self) -> u64 {
        self.services.load(Relaxed)
    }

    /// Appends the proxy's series, once it has synced or failed.
    pub fn render(&self, out: &mut String) {
        if self.full.count() == 0 && self.failures.load(Relaxed) == 0 {
            return;
        }
        self.full.render(
            out,
            "nodus_proxy_full_sync_duration_seconds",
            "Time of a full proxy sync (start-up, repair, after a failure).",
        );
        self.partial.render(
            out,
            "nodus_proxy_partial_sync_duration_seconds",
            "Time of a partial proxy sync: the services one batch changed.",
        );
        single(
            out,
            "nodus_proxy_services_programmed",
            "gauge",
            "Services whose rules are in the kernel.",
            self.services.load(Relaxed),
        );
        single(
            out,
            "nodus_proxy_transactions_total",
            "counter",
            "nf_tables transactions committed.",
            self.transactions.load(Relaxed),
        );
        single(
            out,
            "nodus_proxy_conntrack_deletions_total",
            "counter",
            "UDP conntrack entries deleted because their endpoint no longer serves the address they were sent to.",
            self.conntrack_deletions.load(Relaxed),
        );
        single(
            out,
            "nodus_proxy_sync_failures_total",
            "counter",
            "Proxy syncs that failed (each is followed by a full sync).",
            self.failures.load(Relaxed),
        );
    }
}
