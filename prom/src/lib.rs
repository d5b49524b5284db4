//! Prometheus text exposition on plain atomics.
//!
//! nodus exports a few dozen series; a metrics library would cost more memory and build time
//! than the numbers it carries. Every subsystem renders its own series with these helpers
//! into the one `/metrics` body, and keeps its last sync and error for `/status` in a
//! [`Tracker`], and a [`Heartbeat`] per loop for the liveness check.

#![forbid(unsafe_code)]

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

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
        self.samples(out, name, "");
    }

    /// The histogram's lines without its family's header, with `labels` (empty or
    /// `key="value",…`) on each: one series of a labelled family.
    pub fn samples(&self, out: &mut String, name: &str, labels: &str) {
        let (before_le, braces) = if labels.is_empty() {
            (String::new(), String::new())
        } else {
            (format!("{labels},"), format!("{{{labels}}}"))
        };
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{{before_le}le=\"{bound}\"}} {}",
                bucket.load(Relaxed)
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{before_le}le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum{braces} {}",
            self.sum_nanos.load(Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// The last sync and the last error of one subsystem: what `/status` shows and Prometheus
/// does not keep.
#[derive(Default)]
pub struct Tracker(std::sync::Mutex<Track>);

/// A [`Tracker`]'s record at one moment.
#[derive(Clone, Debug, Default)]
pub struct Track {
    /// The last sync succeeded and no failure came after it.
    pub synced: bool,
    pub last_sync: Option<std::time::SystemTime>,
    pub last_duration: Option<Duration>,
    pub errors: u64,
    pub last_error: Option<(std::time::SystemTime, String)>,
}

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Track> {
        // A panic elsewhere while holding it leaves plain data behind: use it as it is.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn synced(&self, took: Duration) {
        let mut track = self.lock();
        track.synced = true;
        track.last_sync = Some(std::time::SystemTime::now());
        track.last_duration = Some(took);
    }

    /// An error that leaves the subsystem out of step until its next sync.
    pub fn failed(&self, error: impl std::fmt::Display) {
        let mut track = self.lock();
        track.synced = false;
        track.note_error(error);
    }

    /// An error after which the subsystem is still in step (a skipped object, a retried
    /// watch, a backend program that failed).
    pub fn error(&self, error: impl std::fmt::Display) {
        self.lock().note_error(error);
    }

    pub fn snapshot(&self) -> Track {
        self.lock().clone()
    }
}

impl Track {
    fn note_error(&mut self, error: impl std::fmt::Display) {
        self.errors += 1;
        self.last_error = Some((std::time::SystemTime::now(), error.to_string()));
    }
}

/// When a loop last went round, for a liveness check: monotonic, so a clock step does not
/// look like a stall.
pub struct Heartbeat {
    base: Instant,
    /// Milliseconds after `base` of the last beat.
    last: AtomicU64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat {
            base: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl Heartbeat {
    pub fn beat(&self) {
        let now = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Relaxed);
    }

    /// Time since the last beat (since creation before the first).
    pub fn age(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Relaxed));
        self.base.elapsed().saturating_sub(last)
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

    #[test]
    fn a_failed_sync_shows_until_the_next_one_succeeds() {
        let tracker = Tracker::default();
        tracker.synced(Duration::from_millis(3));
        tracker.failed("netlink: Operation not permitted");
        let track = tracker.snapshot();
        assert!(!track.synced);
        assert_eq!(track.errors, 1);
        assert_eq!(
            track.last_error.map(|(_, error)| error).as_deref(),
            Some("netlink: Operation not permitted")
        );
        tracker.synced(Duration::from_millis(2));
        let track = tracker.snapshot();
        assert!(track.synced);
        assert_eq!(track.errors, 1, "errors count, they are not reset");
        assert_eq!(track.last_duration, Some(Duration::from_millis(2)));
    }
}
