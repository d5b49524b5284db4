//! The agent's metrics, rendered in the Prometheus text format with `nodus-prom`.

use crate::agent::board::Board;
use crate::agent::process::ProcessState;
use nodus_dns::metrics::DnsMetrics;
use nodus_mesh::metrics::MeshMetrics;
use nodus_prom::{Heartbeat, Histogram, family, sample, single};
use nodus_proxy::metrics::ProxyMetrics;
use nodus_view::{Counts, Kind};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds of the batch-apply histogram, in seconds.
const APPLY_BUCKETS: [f64; 10] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

pub struct Metrics {
    services: AtomicU64,
    endpoint_slices: AtomicU64,
    endpoints: AtomicU64,
    nodes: AtomicU64,
    /// This node's pods.
    pods: AtomicU64,
    /// What NetworkPolicy holds: every pod, namespace and policy.
    policy_pods: AtomicU64,
    namespaces: AtomicU64,
    network_policies: AtomicU64,
    /// Pods and namespaces with more labels than nodus keeps, failing closed.
    over_label_cap: AtomicU64,
    strings: AtomicU64,
    watch_restarts: [AtomicU64; Kind::ALL.len()],
    invalid_objects: [AtomicU64; Kind::ALL.len()],
    apply: Histogram<{ APPLY_BUCKETS.len() }>,
    /// Set once nodus's table is programmed (the proxy, or the mesh's egress masquerade).
    pub proxy: Latest<ProxyMetrics>,
    /// Set once the DNS server runs.
    pub dns: Latest<DnsMetrics>,
    /// Last syncs and errors, for `/status`.
    pub status: Board,
    /// Set once the mesh runs.
    pub mesh: Latest<MeshMetrics>,
    /// The run loop's last pass, for `/livez`.
    pub run_loop: Heartbeat,
    /// Answers of `/healthz` and `/livez`: 200, then 503.
    healthz: [AtomicU64; 2],
    livez: [AtomicU64; 2],
    view_saves: AtomicU64,
    view_save_failures: AtomicU64,
    view_saved_bytes: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            services: AtomicU64::new(0),
            endpoint_slices: AtomicU64::new(0),
            endpoints: AtomicU64::new(0),
            nodes: AtomicU64::new(0),
            pods: AtomicU64::new(0),
            policy_pods: AtomicU64::new(0),
            namespaces: AtomicU64::new(0),
            network_policies: AtomicU64::new(0),
            over_label_cap: AtomicU64::new(0),
            strings: AtomicU64::new(0),
            watch_restarts: Default::default(),
            invalid_objects: Default::default(),
            apply: Histogram::new(APPLY_BUCKETS),
            proxy: Latest::default(),
            dns: Latest::default(),
            status: Default::default(),
            mesh: Latest::default(),
            run_loop: Heartbeat::default(),
            healthz: Default::default(),
            livez: Default::default(),
            view_saves: AtomicU64::new(0),
            view_save_failures: AtomicU64::new(0),
            view_saved_bytes: AtomicU64::new(0),
        }
    }
}

/// Panics anywhere in the process, caught or not (counted by the panic hook).
pub static PANICS: AtomicU64 = AtomicU64::new(0);

/// Counts and logs every panic, then lets it unwind: the subsystem it happened in is
/// started again ([`crate::agent::retry`]), a task or a DNS loop goes on.
pub fn count_panics() {
    std::panic::set_hook(Box::new(|info| {
        PANICS.fetch_add(1, Relaxed);
        let thread = std::thread::current();
        tracing::error!(thread = thread.name().unwrap_or("unnamed"), "{info}");
    }));
}

/// The metrics of a subsystem's running instance: one started again after a panic brings
/// its own (its counters start over, which Prometheus reads as a reset).
pub struct Latest<T>(Mutex<Option<Arc<T>>>);

impl<T> Default for Latest<T> {
    fn default() -> Self {
        Latest(Mutex::new(None))
    }
}

impl<T> Latest<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<T>>> {
        // One pointer: a panic while holding it leaves nothing half done.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn set(&self, metrics: Arc<T>) {
        *self.lock() = Some(metrics);
    }

    pub fn get(&self) -> Option<Arc<T>> {
        self.lock().clone()
    }
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
        self.pods.store(counts.pods as u64, Relaxed);
        self.policy_pods.store(counts.policy_pods as u64, Relaxed);
        self.namespaces.store(counts.namespaces as u64, Relaxed);
        self.network_policies
            .store(counts.network_policies as u64, Relaxed);
        self.over_label_cap
            .store(counts.over_label_cap as u64, Relaxed);
        self.strings.store(counts.strings as u64, Relaxed);
    }

    pub fn watch_restarted(&self, kind: Kind) {
        self.watch_restarts[kind_index(kind)].fetch_add(1, Relaxed);
    }

    pub fn object_skipped(&self, kind: Kind) {
        self.invalid_objects[kind_index(kind)].fetch_add(1, Relaxed);
    }

    /// Counts an answer of `/healthz` (or of `/livez`): healthy or not.
    pub fn health_answered(&self, livez: bool, healthy: bool) {
        let counts = if livez { &self.livez } else { &self.healthz };
        counts[usize::from(!healthy)].fetch_add(1, Relaxed);
    }

    pub fn view_saved(&self, bytes: u64) {
        self.view_saves.fetch_add(1, Relaxed);
        self.view_saved_bytes.store(bytes, Relaxed);
    }

    pub fn view_save_failed(&self) {
        self.view_save_failures.fetch_add(1, Relaxed);
    }

    pub fn batch_applied(&self, took: Duration) {
        self.apply.observe(took);
    }

    /// Objects in the view by kind, as `nodus_view_objects` labels them.
    pub fn view_objects(&self) -> [(&'static str, u64); 9] {
        [
            ("service", &self.services),
            ("endpointslice", &self.endpoint_slices),
            ("endpoint", &self.endpoints),
            ("node", &self.nodes),
            ("pod", &self.pods),
            ("policy_pod", &self.policy_pods),
            ("namespace", &self.namespaces),
            ("networkpolicy", &self.network_policies),
            ("over_label_cap", &self.over_label_cap),
        ]
        .map(|(kind, value)| (kind, value.load(Relaxed)))
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the exposition: one family after another"
    )]
    pub fn render(&self, process: &ProcessState) -> String {
        let mut out = String::with_capacity(4096);
        family(&mut out, "nodus_build_info", "gauge", "Build information.");
        sample(
            &mut out,
            "nodus_build_info",
            &format!("version=\"{}\"", env!("CARGO_PKG_VERSION")),
            1,
        );
        single(
            &mut out,
            "nodus_ready",
            "gauge",
            "1 once every enabled subsystem applied the initial view.",
            u8::from(process.is_ready()),
        );
        family(
            &mut out,
            "nodus_view_objects",
            "gauge",
            "Objects in the node view.",
        );
        for (kind, value) in self.view_objects() {
            sample(
                &mut out,
                "nodus_view_objects",
                &format!("kind=\"{kind}\""),
                value,
            );
        }
        single(
            &mut out,
            "nodus_panics_total",
            "counter",
            "Panics caught anywhere in the process (each logged; the subsystem is started again).",
            PANICS.load(Relaxed),
        );
        single(
            &mut out,
            "nodus_view_stale",
            "gauge",
            "1 while the view is the one saved before the last restart, until the API's lists replace it.",
            u8::from(process.is_view_stale()),
        );
        single(
            &mut out,
            "nodus_view_saves_total",
            "counter",
            "Times the view was saved to the state directory.",
            self.view_saves.load(Relaxed),
        );
        single(
            &mut out,
            "nodus_view_save_failures_total",
            "counter",
            "Saves of the view that failed.",
            self.view_save_failures.load(Relaxed),
        );
        single(
            &mut out,
            "nodus_view_saved_bytes",
            "gauge",
            "Size of the view's last save.",
            self.view_saved_bytes.load(Relaxed),
        );
        single(
            &mut out,
            "nodus_view_interned_strings",
            "gauge",
            "Distinct strings interned by the view.",
            self.strings.load(Relaxed),
        );
        for (name, help, values) in [
            (
                "nodus_watch_restarts_total",
                "Watch streams that failed and were restarted.",
                &self.watch_restarts,
            ),
            (
                "nodus_invalid_objects_total",
                "Objects skipped because they failed validation.",
                &self.invalid_objects,
            ),
        ] {
            family(&mut out, name, "counter", help);
            for (kind, value) in Kind::ALL.iter().zip(values) {
                // Lower case, as in nodus_view_objects.
                sample(
                    &mut out,
                    name,
                    &format!("kind=\"{}\"", kind.as_str().to_ascii_lowercase()),
                    value.load(Relaxed),
                );
            }
        }
        for (name, help, counts) in [
            (
                "kubeproxy_proxy_healthz_total",
                "Answers of /healthz, by HTTP code.",
                &self.healthz,
            ),
            (
                "kubeproxy_proxy_livez_total",
                "Answers of /livez, by HTTP code.",
                &self.livez,
            ),
        ] {
            family(&mut out, name, "counter", help);
            for (code, count) in ["200", "503"].iter().zip(counts) {
                sample(
                    &mut out,
                    name,
                    &format!("code=\"{code}\""),
                    count.load(Relaxed),
                );
            }
        }
        self.apply.render(
            &mut out,
            "nodus_view_apply_duration_seconds",
            "Time to apply one batch of watch events to the view.",
        );
        self.status.starts.render(&mut out);
        if let Some(proxy) = self.proxy.get() {
            proxy.render(&mut out);
        }
        if let Some(dns) = self.dns.get() {
            dns.render(&mut out);
            dns.render_coredns(&mut out);
        }
        if let Some(mesh) = self.mesh.get() {
            mesh.render(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_histogram_is_exported() {
        let metrics = Metrics::default();
        metrics.batch_applied(Duration::from_micros(50));
        metrics.batch_applied(Duration::from_millis(3));
        let text = metrics.render(&ProcessState::default());
        assert!(
            text.contains("nodus_view_apply_duration_seconds_bucket{le=\"0.0001\"} 1"),
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
        let text = metrics.render(&ProcessState::default());
        assert!(
            text.contains("nodus_invalid_objects_total{kind=\"endpointslice\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("nodus_watch_restarts_total{kind=\"node\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn names_follow_the_prometheus_conventions() {
        let metrics = Metrics::default();
        let proxy = Arc::new(ProxyMetrics::default());
        metrics.proxy.set(proxy.clone());
        proxy.sync_failed("refused");
        metrics.dns.set(Arc::new(DnsMetrics::new(None)));
        let text = metrics.render(&ProcessState::default());
        let mut families = 0;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            families += 1;
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            // kube-proxy's series keep kube-proxy's names, for its dashboards: one gauge of
            // them ends in _total.
            let kube_proxy = name.starts_with("kubeproxy_");
            // And CoreDNS's keep CoreDNS's.
            let coredns = name.starts_with("coredns_");
            assert!(
                name.starts_with("nodus_") || kube_proxy || coredns,
                "{name}"
            );
            match kind {
                "counter" => assert!(name.ends_with("_total"), "{name}"),
                "histogram" => assert!(name.ends_with("_seconds"), "{name}: unit in the name"),
                _ => assert!(
                    !name.ends_with("_total") || kube_proxy,
                    "{name}: only counters end in _total"
                ),
            }
        }
        assert!(families > 10, "{text}");
        for rendered in [
            "nodus_proxy_sync_failures_total",
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "nodus_dns_requests_total",
            "coredns_dns_request_duration_seconds_bucket{server=\"dns://:53\",zone=\".\",le=",
        ] {
            assert!(text.contains(rendered), "{rendered} in\n{text}");
        }
        assert!(
            !text.contains("kind=\"Service\""),
            "label values in lower case"
        );
    }
}
