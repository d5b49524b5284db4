//! Prometheus text exposition on plain atomics.
//!
//! nodus exports a few dozen series; a metrics library would cost more memory and build time
//! than the numbers it carries. Every subsystem renders its own series with these helpers
//! into the one `/metrics` body.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Writes the `# HELP` and `# TYPE` lines of a metric family.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Writes one sample line; `labels` is empty or `key="value",…`.
pub fn sample(out: &mut String, name: &str, labels: &str, value: impl std::fmt::Display) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {value}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

/// A family with a single unlabelled sample.
pub fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    family(out, name, kind, help);
    sample(out, name, "", value);
}

/// A histogram of durations with fixed upper bounds, in seconds.
pub struct Histogram<const N: usize> {
    bounds: [f64; N],
    buckets: [AtomicU64; N],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    pub const fn new(bounds: [f64; N]) -> Self {
        Histogram {
            bounds,
            buckets: [const { AtomicU64::new(0) }; N],
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, took: Duration) {
        self.observe_many(took, 1);
    }

    /// `count` observations of the same duration, such as a batch handled together.
    pub fn observe_many(&self, took: Duration, count: u64) {
        if count == 0 {
            return;
        }
        let seconds = took.as_secs_f64();
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(count, Relaxed);
            }
        }
        self.count.fetch_add(count, Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos
            .fetch_add(nanos.saturating_mul(count), Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        family(out, name, "histogram", help);
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Relaxed)
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_nanos.load(Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new([0.001, 0.01]);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(1));
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "help");
        assert!(out.contains("x_seconds_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.01\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_count 3\n"), "{out}");
    }

    #[test]
    fn samples_with_and_without_labels() {
        let mut out = String::new();
        single(&mut out, "up", "gauge", "Up.", 1);
        sample(&mut out, "req_total", "kind=\"a\"", 2);
        assert_eq!(
            out,
            "# HELP up Up.\n# TYPE up gauge\nup 1\nreq_total{kind=\"a\"} 2\n"
        );
    }
}
