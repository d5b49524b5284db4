//! The agent's metrics, and the one `/metrics` exposition ([`render`]) of the agent's
//! families and every running subsystem's, in the OpenMetrics text format (`nodus-prom`).

use crate::agent::board::Board;
use crate::agent::process::ProcessState;
use crate::agent::subscribe::Hub;
use nodus_dns::metrics::DnsMetrics;
use nodus_mesh::metrics::MeshMetrics;
use nodus_prom::{
    ConstCounter, ConstGauge, Counter, Exported, Families, Gauge, Heartbeat, Histogram,
};
use nodus_proxy::metrics::ProxyMetrics;
use nodus_view::{Counts, Kind};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds of the batch-apply histogram, in seconds.
const APPLY_BUCKETS: [f64; 10] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

pub struct Metrics {
    services: Gauge,
    endpoint_slices: Gauge,
    endpoints: Gauge,
    nodes: Gauge,
    /// This node's pods.
    pods: Gauge,
    /// What NetworkPolicy holds: every pod, namespace and policy.
    policy_pods: Gauge,
    namespaces: Gauge,
    network_policies: Gauge,
    /// Pods and namespaces with more labels than nodus keeps, failing closed.
    over_label_cap: Gauge,
    strings: Gauge,
    watch_restarts: [Counter; Kind::ALL.len()],
    invalid_objects: [Counter; Kind::ALL.len()],
    apply: Histogram<{ APPLY_BUCKETS.len() }>,
    /// Set once nodus's table is programmed (the proxy, or the mesh's egress masquerade).
    pub proxy: Latest<ProxyMetrics>,
    /// Set once the DNS server runs.
    pub dns: Latest<DnsMetrics>,
    /// Last syncs and errors, for `/status`.
    pub status: Board,
    /// Set once the mesh runs.
    pub mesh: Latest<MeshMetrics>,
    /// The view's subscribers, when the socket or `--on-change` is on.
    pub subscribe: Latest<Hub>,
    /// The run loop's last pass, for `/livez`.
    pub run_loop: Heartbeat,
    /// Answers of `/healthz` and `/livez`: 200, then 503.
    healthz: [Counter; 2],
    livez: [Counter; 2],
    view_saves: Counter,
    view_save_failures: Counter,
    view_saved_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            services: Gauge::default(),
            endpoint_slices: Gauge::default(),
            endpoints: Gauge::default(),
            nodes: Gauge::default(),
            pods: Gauge::default(),
            policy_pods: Gauge::default(),
            namespaces: Gauge::default(),
            network_policies: Gauge::default(),
            over_label_cap: Gauge::default(),
            strings: Gauge::default(),
            watch_restarts: Default::default(),
            invalid_objects: Default::default(),
            apply: Histogram::new(APPLY_BUCKETS),
            proxy: Latest::default(),
            dns: Latest::default(),
            status: Default::default(),
            mesh: Latest::default(),
            subscribe: Latest::default(),
            run_loop: Heartbeat::default(),
            healthz: Default::default(),
            livez: Default::default(),
            view_saves: Counter::default(),
            view_save_failures: Counter::default(),
            view_saved_bytes: Gauge::default(),
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
        for (gauge, count) in [
            (&self.services, counts.services),
            (&self.endpoint_slices, counts.endpoint_slices),
            (&self.endpoints, counts.endpoints),
            (&self.nodes, counts.nodes),
            (&self.pods, counts.pods),
            (&self.policy_pods, counts.policy_pods),
            (&self.namespaces, counts.namespaces),
            (&self.network_policies, counts.network_policies),
            (&self.over_label_cap, counts.over_label_cap),
            (&self.strings, counts.strings),
        ] {
            gauge.set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    pub fn watch_restarted(&self, kind: Kind) {
        self.watch_restarts[kind_index(kind)].inc();
    }

    pub fn object_skipped(&self, kind: Kind) {
        self.invalid_objects[kind_index(kind)].inc();
    }

    /// Counts an answer of `/healthz` (or of `/livez`): healthy or not.
    pub fn health_answered(&self, livez: bool, healthy: bool) {
        let counts = if livez { &self.livez } else { &self.healthz };
        counts[usize::from(!healthy)].inc();
    }

    pub fn view_saved(&self, bytes: u64) {
        self.view_saves.inc();
        self.view_saved_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub fn view_save_failed(&self) {
        self.view_save_failures.inc();
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
        .map(|(kind, value)| (kind, value.get().unsigned_abs()))
    }
}

/// The `/metrics` text: the agent's families, then those of each running subsystem.
pub fn render(metrics: &Arc<Metrics>, process: &Arc<ProcessState>) -> String {
    nodus_prom::render(Arc::new(Exposition {
        metrics: metrics.clone(),
        process: process.clone(),
    }))
}

/// What one scrape reads: the agent's metrics and the process state.
struct Exposition {
    metrics: Arc<Metrics>,
    process: Arc<ProcessState>,
}

impl Exported for Exposition {
    fn export(&self, families: &mut Families<'_>) -> fmt::Result {
        let metrics = &self.metrics;
        metrics.export_process(families, &self.process)?;
        metrics.export_view(families)?;
        metrics.export_health(families)?;
        metrics.status.starts.export(families)?;
        if let Some(proxy) = metrics.proxy.get() {
            proxy.export(families)?;
        }
        if let Some(dns) = metrics.dns.get() {
            dns.export(families)?;
        }
        if let Some(mesh) = metrics.mesh.get() {
            mesh.export(families)?;
        }
        if let Some(hub) = metrics.subscribe.get() {
            hub.export(families)?;
        }
        Ok(())
    }
}

impl Metrics {
    fn export_process(&self, families: &mut Families<'_>, process: &ProcessState) -> fmt::Result {
        families.labelled(
            "nodus_build_info",
            "Build information.",
            [([("version", env!("CARGO_PKG_VERSION"))], ConstGauge::new(1))],
        )?;
        families.one(
            "nodus_ready",
            "1 once every enabled subsystem applied the initial view.",
            &ConstGauge::new(i64::from(process.is_ready())),
        )?;
        families.one(
            "nodus_panics",
            "Panics caught anywhere in the process (each logged; the subsystem is started again).",
            &ConstCounter::new(PANICS.load(Relaxed)),
        )?;
        families.labelled(
            "nodus_connections_refused",
            "Connections closed as they were accepted because they were over a cap of their listener (per client, for pods together, or in all): DNS over TCP, HTTP (health, metrics and health-check node ports).",
            nodus_limits::refused()
                .into_iter()
                .map(|(listener, count)| ([("listener", listener)], ConstCounter::new(count))),
        )?;
        families.one(
            "nodus_view_stale",
            "1 while the view is the one saved before the last restart, until the API's lists replace it.",
            &ConstGauge::new(i64::from(process.is_view_stale())),
        )
    }

    fn export_view(&self, families: &mut Families<'_>) -> fmt::Result {
        families.labelled(
            "nodus_view_objects",
            "Objects in the node view.",
            self.view_objects()
                .map(|(kind, count)| ([("kind", kind)], ConstGauge::new(count as i64))),
        )?;
        families.one(
            "nodus_view_saves",
            "Times the view was saved to the state directory.",
            &self.view_saves,
        )?;
        families.one(
            "nodus_view_save_failures",
            "Saves of the view that failed.",
            &self.view_save_failures,
        )?;
        families.one(
            "nodus_view_saved_bytes",
            "Size of the view's last save.",
            &self.view_saved_bytes,
        )?;
        families.one(
            "nodus_view_interned_strings",
            "Distinct strings interned by the view.",
            &self.strings,
        )?;
        for (name, help, counts) in [
            (
                "nodus_watch_restarts",
                "Watch streams that failed and were restarted.",
                &self.watch_restarts,
            ),
            (
                "nodus_invalid_objects",
                "Objects skipped because they failed validation.",
                &self.invalid_objects,
            ),
        ] {
            // Lower case, as in nodus_view_objects.
            families.labelled(
                name,
                help,
                Kind::ALL.iter().zip(counts).map(|(kind, count)| {
                    (
                        [("kind", kind.as_str().to_ascii_lowercase())],
                        count.clone(),
                    )
                }),
            )?;
        }
        families.one(
            "nodus_view_apply_duration_seconds",
            "Time to apply one batch of watch events to the view.",
            &self.apply,
        )
    }

    fn export_health(&self, families: &mut Families<'_>) -> fmt::Result {
        for (name, help, counts) in [
            (
                "kubeproxy_proxy_healthz",
                "Answers of /healthz, by HTTP code.",
                &self.healthz,
            ),
            (
                "kubeproxy_proxy_livez",
                "Answers of /livez, by HTTP code.",
                &self.livez,
            ),
        ] {
            families.labelled(
                name,
                help,
                ["200", "503"]
                    .iter()
                    .zip(counts)
                    .map(|(code, count)| ([("code", *code)], count.clone())),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_histogram_is_exported() {
        let metrics = Arc::new(Metrics::default());
        metrics.batch_applied(Duration::from_micros(50));
        metrics.batch_applied(Duration::from_millis(3));
        let text = render(&metrics, &Arc::default());
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
        let metrics = Arc::new(Metrics::default());
        metrics.object_skipped(Kind::EndpointSlice);
        metrics.object_skipped(Kind::EndpointSlice);
        metrics.watch_restarted(Kind::Node);
        let text = render(&metrics, &Arc::default());
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
        let metrics = Arc::new(Metrics::default());
        let proxy = Arc::new(ProxyMetrics::default());
        metrics.proxy.set(proxy.clone());
        proxy.sync_failed("refused");
        metrics.dns.set(Arc::new(DnsMetrics::new(None)));
        let text = render(&metrics, &Arc::default());
        let mut families = 0;
        let mut family = ("", "");
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                // OpenMetrics: a counter's samples are its family's name with `_total`.
                if family.1 == "counter" && !line.starts_with('#') {
                    let series = line.split(['{', ' ']).next().unwrap_or_default();
                    assert_eq!(series, format!("{}_total", family.0), "{line}");
                }
                continue;
            };
            families += 1;
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            family = (name, kind);
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
                "counter" => assert!(!name.ends_with("_total"), "{name}: _total is the sample's"),
                "histogram" => assert!(name.ends_with("_seconds"), "{name}: unit in the name"),
                _ => assert!(
                    !name.ends_with("_total") || kube_proxy,
                    "{name}: only counters end in _total"
                ),
            }
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(families > 10, "{text}");
        for rendered in [
            "nodus_proxy_sync_failures_total",
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "nodus_dns_requests_total",
            "coredns_dns_request_duration_seconds_bucket{le=\"+Inf\",server=\"dns://:53\",zone=\".\"} 0",
        ] {
            assert!(text.contains(rendered), "{rendered} in\n{text}");
        }
        assert!(
            !text.contains("kind=\"Service\""),
            "label values in lower case"
        );
    }
}
