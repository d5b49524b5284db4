//! Metrics for nodus on the Prometheus organisation's client, `prometheus-client`: its
//! counters and gauges, and its OpenMetrics text encoder for `/metrics`.
//!
//! Every subsystem declares each of its families once, with name, help and value, in its
//! [`Exported::export`]; the agent renders them all into the one `/metrics` body with
//! [`render`]. Two things are nodus's own: a lock-free [`Histogram`] that takes a batch's
//! observations at once (the library's takes a write lock per observation, and DNS
//! observes from every UDP thread), and [`Escaped`] label values (the library writes
//! values as they are). Beside the metrics: each subsystem's last sync and error for
//! `/status` in a [`Tracker`], and a [`Heartbeat`] per loop for the liveness check.

#![forbid(unsafe_code)]

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
    MetricEncoder,
};
pub use prometheus_client::metrics::counter::{ConstCounter, Counter};
pub use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use std::fmt::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// A gauge of seconds (a timestamp, an age).
pub type SecondsGauge = Gauge<f64, AtomicU64>;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a part of nodus exports: its families, each declared once.
pub trait Exported: Send + Sync {
    fn export(&self, families: &mut Families<'_>) -> fmt::Result;
}

/// The families of one scrape, as [`Exported::export`] declares them.
pub struct Families<'a>(DescriptorEncoder<'a>);

impl Families<'_> {
    /// A family of one series without labels.
    pub fn one(&mut self, name: &str, help: &str, metric: &impl EncodeMetric) -> fmt::Result {
        let encoder = self
            .0
            .encode_descriptor(name, help, None, metric.metric_type())?;
        metric.encode(encoder)
    }

    /// A family of labelled series of one type. A family whose series are all left out
    /// still has its help and type.
    pub fn labelled<S, M>(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (S, M)>,
    ) -> fmt::Result
    where
        S: EncodeLabelSet,
        M: EncodeMetric + TypedMetric,
    {
        let mut encoder = self.0.encode_descriptor(name, help, None, M::TYPE)?;
        for (labels, metric) in series {
            metric.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Renders `exported` in the OpenMetrics text format ([`CONTENT_TYPE`]), ended by `# EOF`.
pub fn render(exported: Arc<dyn Exported>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Exporter(exported)));
    let mut text = String::with_capacity(8192);
    // A String takes every write; an export fails only on a value the format cannot carry
    // (a gauge over i64::MAX), and the scrape then gets the families before it.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

/// The library's view of an [`Exported`]: a collector asked at every scrape.
struct Exporter(Arc<dyn Exported>);

impl fmt::Debug for Exporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Exporter")
    }
}

impl Collector for Exporter {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> fmt::Result {
        self.0.export(&mut Families(encoder))
    }
}

/// A label value escaped as the text format requires (`\`, `"` and newlines): for values
/// from the cluster, such as a policy's name.
pub struct Escaped<'a>(pub &'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// A histogram of durations with fixed upper bounds, in seconds, on plain atomics.
#[derive(Debug)]
pub struct Histogram<const N: usize> {
    bounds: [f64; N],
    /// Observations per bucket (not cumulative): those over every bound are the count's
    /// remainder.
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
        if let Some(bucket) = self.bounds.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(count, Relaxed);
        }
        self.count.fetch_add(count, Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos
            .fetch_add(nanos.saturating_mul(count), Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }
}

impl<const N: usize> TypedMetric for Histogram<N> {
    const TYPE: MetricType = MetricType::Histogram;
}

impl<const N: usize> TypedMetric for &Histogram<N> {
    const TYPE: MetricType = MetricType::Histogram;
}

impl<const N: usize> EncodeMetric for Histogram<N> {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> fmt::Result {
        let count = self.count();
        let mut buckets: Vec<(f64, u64)> = Vec::with_capacity(N + 1);
        let mut bucketed = 0u64;
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            // Read after the count: a concurrent observation never makes a bucket exceed it.
            let n = bucket.load(Relaxed).min(count - bucketed);
            bucketed += n;
            buckets.push((*bound, n));
        }
        // The library writes f64::MAX as `+Inf`.
        buckets.push((f64::MAX, count - bucketed));
        let sum = self.sum_nanos.load(Relaxed) as f64 / 1e9;
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl<const N: usize> EncodeMetric for &Histogram<N> {
    fn encode(&self, encoder: MetricEncoder<'_>) -> fmt::Result {
        (**self).encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
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
    pub fn failed(&self, error: impl fmt::Display) {
        let mut track = self.lock();
        track.synced = false;
        track.note_error(error);
    }

    /// An error after which the subsystem is still in step (a skipped object, a retried
    /// watch, a backend program that failed).
    pub fn error(&self, error: impl fmt::Display) {
        self.lock().note_error(error);
    }

    pub fn snapshot(&self) -> Track {
        self.lock().clone()
    }
}

impl Track {
    fn note_error(&mut self, error: impl fmt::Display) {
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

    struct Sample {
        histogram: Histogram<2>,
        requests: Counter,
    }

    impl Exported for Sample {
        fn export(&self, families: &mut Families<'_>) -> fmt::Result {
            families.one("x_seconds", "Time.", &self.histogram)?;
            families.one("up", "Up.", &ConstGauge::new(1))?;
            families.labelled(
                "requests",
                "Requests.",
                [([("kind", Escaped("a\"b\\\n"))], self.requests.clone())],
            )
        }
    }

    #[test]
    fn families_are_rendered_in_openmetrics_text() {
        let sample = Arc::new(Sample {
            histogram: Histogram::new([0.001, 0.01]),
            requests: Counter::default(),
        });
        sample.histogram.observe(Duration::from_micros(500));
        sample.histogram.observe_many(Duration::from_millis(5), 2);
        sample.histogram.observe(Duration::from_secs(1));
        sample.requests.inc_by(2);
        let text = render(sample);
        let expected = "# HELP x_seconds Time.\n# TYPE x_seconds histogram\n\
            x_seconds_sum 1.0105\nx_seconds_count 4\n\
            x_seconds_bucket{le=\"0.001\"} 1\n\
            x_seconds_bucket{le=\"0.01\"} 3\n\
            x_seconds_bucket{le=\"+Inf\"} 4\n\
            # HELP up Up.\n# TYPE up gauge\nup 1\n\
            # HELP requests Requests.\n# TYPE requests counter\n\
            requests_total{kind=\"a\\\"b\\\\\\n\"} 2\n\
            # EOF\n";
        assert_eq!(text, expected);
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
