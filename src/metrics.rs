//! The agent's metrics, rendered in the Prometheus text format.
//!
//! A handful of atomics is all nodus needs; a metrics crate would cost more memory and
//! build time than the numbers it carries.

use nodus_view::{Counts, Kind};
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the batch-apply histogram, in seconds.
const APPLY_BUCKETS: [f64; 10] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

#[derive(Default)]
pub struct Metrics {
    pub ready: AtomicBool,
    services: AtomicU64,
    endpoint_slices: AtomicU64,
    endpoints: AtomicU64,
    nodes: AtomicU64,
    strings: AtomicU64,
    watch_restarts: [AtomicU64; 3],
    invalid_objects: [AtomicU64; 3],
    apply_buckets: [AtomicU64; APPLY_BUCKETS.len()],
    apply_count: AtomicU64,
    apply_sum_nanos: AtomicU64,
}

fn kind_index(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

impl Metrics {
    pub fn set_counts(&self, counts: &Counts) {
        self.services.store(counts.services as u64, Relaxed);
        self.endpoint_slices
            .store(counts.endpoint_slices as u64, Relaxed);
        self.endpoints.store(counts.endpoints as u64, Relaxed);
        self.nodes.store(counts.nodes as u64, Relaxed);
        self.strings.store(counts.strings as u64, Relaxed);
    }

    pub fn watch_restarted(&self, kind: Kind) {
        self.watch_restarts[kind_index(kind)].fetch_add(1, Relaxed);
    }

    pub fn object_skipped(&self, kind: Kind) {
        self.invalid_objects[kind_index(kind)].fetch_add(1, Relaxed);
    }

    pub fn batch_applied(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        for (bound, bucket) in APPLY_BUCKETS.iter().zip(&self.apply_buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Relaxed);
            }
        }
        self.apply_count.fetch_add(1, Relaxed);
        self.apply_sum_nanos
            .fetch_add(took.as_nanos().min(u128::from(u64::MAX)) as u64, Relaxed);
    }

    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        let gauge = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        let _ = writeln!(
            out,
            "# HELP nodus_build_info Build information.\n# TYPE nodus_build_info gauge\n\
             nodus_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        gauge(
            &mut out,
            "nodus_ready",
            "1 once every enabled subsystem applied the initial view.",
            u64::from(self.ready.load(Relaxed)),
        );
        let _ = writeln!(
            out,
            "# HELP nodus_view_objects Objects in the node view.\n# TYPE nodus_view_objects gauge"
        );
        for (kind, value) in [
            ("service", &self.services),
            ("endpointslice", &self.endpoint_slices),
            ("endpoint", &self.endpoints),
            ("node", &self.nodes),
        ] {
            let _ = writeln!(
                out,
                "nodus_view_objects{{kind=\"{kind}\"}} {}",
                value.load(Relaxed)
            );
        }
        gauge(
            &mut out,
            "nodus_view_interned_strings",
            "Distinct strings interned by the view.",
            self.strings.load(Relaxed),
        );
        let per_kind = |out: &mut String, name: &str, help: &str, values: &[AtomicU64; 3]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (kind, value) in Kind::ALL.iter().zip(values) {
                let _ = writeln!(
                    out,
                    "{name}{{kind=\"{}\"}} {}",
                    kind.as_str(),
                    value.load(Relaxed)
                );
            }
        };
        per_kind(
            &mut out,
            "nodus_watch_restarts_total",
            "Watch streams that failed and were restarted.",
            &self.watch_restarts,
        );
        per_kind(
            &mut out,
            "nodus_invalid_objects_total",
            "Objects skipped because they failed validation.",
            &self.invalid_objects,
        );
        let name = "nodus_view_apply_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time to apply one batch of watch events to the view.\n# TYPE {name} histogram"
        );
        for (bound, bucket) in APPLY_BUCKETS.iter().zip(&self.apply_buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Relaxed)
            );
        }
        let count = self.apply_count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.apply_sum_nanos.load(Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count {count}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let metrics = Metrics::default();
        metrics.batch_applied(Duration::from_micros(50));
        metrics.batch_applied(Duration::from_millis(3));
        let text = metrics.render();
        assert!(
            text.contains("nodus_view_apply_duration_seconds_bucket{le=\"0.0001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nodus_view_apply_duration_seconds_bucket{le=\"0.005\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("nodus_view_apply_duration_seconds_count 2"),
            "{text}"
        );
    }

    #[test]
    fn counters_are_labelled_by_kind() {
        let metrics = Metrics::default();
        metrics.object_skipped(Kind::EndpointSlice);
        metrics.object_skipped(Kind::EndpointSlice);
        metrics.watch_restarted(Kind::Node);
        let text = metrics.render();
        assert!(
            text.contains("nodus_invalid_objects_total{kind=\"EndpointSlice\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("nodus_watch_restarts_total{kind=\"Node\"} 1"),
            "{text}"
        );
    }
}
