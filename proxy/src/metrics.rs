//! The proxy's series in `/metrics`, and its last sync and error for `/status`: nodus's
//! own, and kube-proxy's under their names (`kubeproxy_*`), so that the dashboards and
//! alerts written for kube-proxy keep working.

use crate::apply::{RefusedPod, SyncKind, SyncReport, UdpCleanup};
use crate::plan::{ClaimLoss, PodDrop};
use nodus_prom::{
    ConstCounter, ConstGauge, Counter, Escaped, Exported, Families, Gauge, Histogram, SecondsGauge,
    Tracker,
};
use nodus_view::ChangeSet;
use nodus_view::policy::resolve::Direction;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Series of `nodus_policy_denied_packets_total` at most: two per policy of a large cluster.
pub const DENIED_SERIES_MAX: usize = 4096;
/// The policy (`namespace/name`) the drops of policies past [`DENIED_SERIES_MAX`] count
/// under: no namespace, and a name no policy can have.
pub const DENIED_OTHERS: &str = "/_other";

/// The metrics' mutexes hold plain data: a panic while one was held leaves nothing
/// half-done, so a poisoned one is used as it is.
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Upper bounds of the sync histograms, in seconds.
const SYNC_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 2.0, 10.0];

/// kube-proxy's sync buckets: 1 ms doubling to 16.4 s.
const KUBE_PROXY_SYNC_BUCKETS: [f64; 15] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
    8.192, 16.384,
];

/// From a change in the cluster to its rules in the kernel, in seconds (kube-proxy's
/// buckets, thinned: they run to 5 minutes).
const PROGRAMMING_BUCKETS: [f64; 17] = [
    0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0,
];

/// kube-proxy's health timeout (twice its default 30 s sync period): a sync owed for longer
/// makes the proxy unhealthy.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);

pub struct ProxyMetrics {
    full: Histogram<{ SYNC_BUCKETS.len() }>,
    partial: Histogram<{ SYNC_BUCKETS.len() }>,
    services: Gauge,
    transactions: Counter,
    conntrack_deletions: Counter,
    conntrack_cleanup: Histogram<{ SYNC_BUCKETS.len() }>,
    failures: Counter,
    cleanup_failures: Counter,
    kube_proxy: KubeProxyMetrics,
    /// Since when a sync is owed: changes queued, or a failed sync to retry. `/healthz`
    /// turns unhealthy when this grows old, as kube-proxy's does.
    owed_since: Mutex<Option<Instant>>,
    /// With NetworkPolicy on, after each sync.
    policy: Mutex<Option<PolicyEnforcement>>,
    /// Packets dropped per isolating policy (`namespace/name`) and direction.
    denied: Mutex<BTreeMap<(String, Direction), u64>>,
    /// External addresses and ports left out of services' plans, by [`ClaimLoss`].
    external_left_out: [Counter; ClaimLoss::ALL.len()],
    /// What the pod source check dropped, as the kernel last counted it.
    pod_drops: Mutex<Vec<(PodDrop, u64)>>,
    /// Whether denied packets are exported per policy (its namespace and name) or per
    /// direction only ([`ProxyMetrics::name_policies`]).
    policy_names: std::sync::atomic::AtomicBool,
    pub status: Tracker,
}

/// What NetworkPolicy enforcement holds after a sync.
#[derive(Clone, Debug, Default)]
pub struct PolicyEnforcement {
    /// This node's pods isolated in some direction.
    pub isolated_pods: usize,
    /// Pods failing closed: the kernel refused their allowances.
    pub refused: Vec<RefusedPod>,
}

/// The series kube-proxy exports, as far as nodus has their meaning.
struct KubeProxyMetrics {
    sync: Histogram<{ KUBE_PROXY_SYNC_BUCKETS.len() }>,
    full: Histogram<{ KUBE_PROXY_SYNC_BUCKETS.len() }>,
    partial: Histogram<{ KUBE_PROXY_SYNC_BUCKETS.len() }>,
    programming: Histogram<{ PROGRAMMING_BUCKETS.len() }>,
    /// Unix seconds of the last successful sync and of the last change queued.
    last_sync: SecondsGauge,
    last_queued: SecondsGauge,
    /// Changes since the last successful sync (a failed sync leaves them pending).
    service_changes_pending: Gauge,
    endpoint_changes_pending: Gauge,
    service_changes: Counter,
    endpoint_changes: Counter,
    no_local_internal: Gauge,
    no_local_external: Gauge,
    /// Unix milliseconds when this process started: older trigger times are not its work.
    started: u64,
}

/// A count as a gauge's value.
fn gauge(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

fn unix_millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        ProxyMetrics {
            full: Histogram::new(SYNC_BUCKETS),
            partial: Histogram::new(SYNC_BUCKETS),
            services: Gauge::default(),
            transactions: Counter::default(),
            conntrack_deletions: Counter::default(),
            conntrack_cleanup: Histogram::new(SYNC_BUCKETS),
            failures: Counter::default(),
            cleanup_failures: Counter::default(),
            kube_proxy: KubeProxyMetrics {
                sync: Histogram::new(KUBE_PROXY_SYNC_BUCKETS),
                full: Histogram::new(KUBE_PROXY_SYNC_BUCKETS),
                partial: Histogram::new(KUBE_PROXY_SYNC_BUCKETS),
                programming: Histogram::new(PROGRAMMING_BUCKETS),
                last_sync: SecondsGauge::default(),
                last_queued: SecondsGauge::default(),
                service_changes_pending: Gauge::default(),
                endpoint_changes_pending: Gauge::default(),
                service_changes: Counter::default(),
                endpoint_changes: Counter::default(),
                no_local_internal: Gauge::default(),
                no_local_external: Gauge::default(),
                started: unix_millis(SystemTime::now()),
            },
            owed_since: Mutex::new(None),
            policy: Mutex::new(None),
            denied: Mutex::new(BTreeMap::new()),
            pod_drops: Mutex::new(Vec::new()),
            policy_names: std::sync::atomic::AtomicBool::new(false),
            external_left_out: Default::default(),
            status: Tracker::default(),
        }
    }
}

impl ProxyMetrics {
    /// A batch of changes arrived at `now`; they are pending until a sync succeeds.
    pub fn queued(&self, changes: &ChangeSet, now: SystemTime) {
        let kube = &self.kube_proxy;
        if changes.is_empty() {
            return;
        }
        self.owe_sync();
        kube.last_queued.set(unix_seconds(now));
        for (pending, total, count) in [
            (
                &kube.service_changes_pending,
                &kube.service_changes,
                changes.service_updates,
            ),
            (
                &kube.endpoint_changes_pending,
                &kube.endpoint_changes,
                changes.slice_updates,
            ),
        ] {
            pending.inc_by(i64::from(count));
            total.inc_by(u64::from(count));
        }
    }

    /// A UDP conntrack cleanup ran: at the end of a sync, or one that syncs left waiting.
    pub fn udp_cleaned(&self, cleanup: &UdpCleanup) {
        self.conntrack_deletions.inc_by(cleanup.deletions as u64);
        self.conntrack_cleanup.observe(cleanup.took);
    }

    /// A sync succeeded at `now`, programming what was pending, `changes` included:
    /// their EndpointSlices' trigger times give the network programming latency.
    pub fn synced(
        &self,
        report: &SyncReport,
        programmed: usize,
        no_local: (usize, usize),
        changes: &ChangeSet,
        now: SystemTime,
    ) {
        match report.kind {
            SyncKind::Full => self.full.observe(report.duration),
            SyncKind::Partial => self.partial.observe(report.duration),
        }
        self.services.set(gauge(programmed));
        self.transactions.inc_by(report.transactions as u64);
        for loss in &report.external_left_out {
            self.external_left_out[*loss as usize].inc();
        }
        if let Some(cleanup) = &report.udp_cleanup {
            self.udp_cleaned(cleanup);
        }
        self.status.synced(report.duration);
        *self.owed() = None;

        let kube = &self.kube_proxy;
        kube.sync.observe(report.duration);
        match report.kind {
            SyncKind::Full => kube.full.observe(report.duration),
            SyncKind::Partial => kube.partial.observe(report.duration),
        }
        kube.last_sync.set(unix_seconds(now));
        // The rules were in place before the conntrack cleanup that ends the sync.
        let now = unix_millis(now).saturating_sub(report.udp_cleanup.map_or(0, |cleanup| {
            u64::try_from(cleanup.took.as_millis()).unwrap_or(u64::MAX)
        }));
        kube.service_changes_pending.set(0);
        kube.endpoint_changes_pending.set(0);
        kube.no_local_internal.set(gauge(no_local.0));
        kube.no_local_external.set(gauge(no_local.1));
        for trigger in &changes.trigger_times {
            // Clocks of the controller and this node may disagree: never negative.
            if let Ok(trigger) = u64::try_from(*trigger)
                && trigger >= kube.started
            {
                kube.programming
                    .observe(Duration::from_millis(now.saturating_sub(trigger)));
            }
        }
    }

    /// NetworkPolicy enforcement as a sync left it.
    pub fn policy_enforced(&self, enforcement: PolicyEnforcement) {
        *locked(&self.policy) = Some(enforcement);
    }

    /// NetworkPolicy enforcement after the last sync; `None` with NetworkPolicy off.
    pub fn policy_enforcement(&self) -> Option<PolicyEnforcement> {
        locked(&self.policy).clone()
    }

    /// `packets` dropped for a pod that `policies` isolate in `direction`: each of them
    /// counts them. At most [`DENIED_SERIES_MAX`] series; later policies count under
    /// [`DENIED_OTHERS`], so that no drop goes uncounted.
    pub fn policy_denied(&self, policies: &[String], direction: Direction, packets: u64) {
        let mut denied = locked(&self.denied);
        for policy in policies {
            let key = (policy.clone(), direction);
            let key = if denied.len() < DENIED_SERIES_MAX || denied.contains_key(&key) {
                key
            } else {
                (DENIED_OTHERS.to_string(), direction)
            };
            *denied.entry(key).or_default() += packets;
        }
    }

    /// Export denied packets per policy, naming it (`policy.metrics_names`), rather than
    /// per direction only: `/metrics` answers every pod of the node.
    pub fn name_policies(&self, yes: bool) {
        self.policy_names
            .store(yes, std::sync::atomic::Ordering::Relaxed);
    }

    /// The pod source check's counters, as just read from the kernel.
    pub fn pod_drops(&self, drops: Vec<(PodDrop, u64)>) {
        *locked(&self.pod_drops) = drops;
    }

    /// A full sync programmed its plans but could not remove a previous run's leftovers
    /// (counted as a sync failure too).
    pub fn cleanup_failed(&self) {
        self.cleanup_failures.inc();
    }

    pub fn sync_failed(&self, error: impl std::fmt::Display) {
        self.failures.inc();
        self.status.failed(error);
        self.owe_sync();
    }

    fn owed(&self) -> MutexGuard<'_, Option<Instant>> {
        locked(&self.owed_since)
    }

    fn owe_sync(&self) {
        self.owe_sync_since(Instant::now());
    }

    /// A sync is owed from `at` on, unless one already was.
    pub fn owe_sync_since(&self, at: Instant) {
        self.owed().get_or_insert(at);
    }

    /// How long a sync has been owed (changes waiting, or a failure to retry); `None` when
    /// the kernel holds everything the proxy was given.
    pub fn sync_owed_for(&self) -> Option<Duration> {
        self.owed().map(|since| since.elapsed())
    }

    /// Healthy as kube-proxy's `/healthz` means it: no sync owed for longer than
    /// [`HEALTH_TIMEOUT`].
    pub fn is_healthy(&self) -> bool {
        self.sync_owed_for()
            .is_none_or(|owed| owed <= HEALTH_TIMEOUT)
    }

    /// Services whose rules are in the kernel.
    pub fn services_programmed(&self) -> u64 {
        self.services.get().unsigned_abs()
    }
}

impl Exported for ProxyMetrics {
    /// The proxy's families, once it has synced or failed.
    fn export(&self, families: &mut Families<'_>) -> std::fmt::Result {
        if self.full.count() == 0 && self.failures.get() == 0 {
            return Ok(());
        }
        families.one(
            "nodus_proxy_full_sync_duration_seconds",
            "Time of a full proxy sync (start-up, repair, after a failure).",
            &self.full,
        )?;
        families.one(
            "nodus_proxy_partial_sync_duration_seconds",
            "Time of a partial proxy sync: the services one batch changed.",
            &self.partial,
        )?;
        families.one(
            "nodus_proxy_services_programmed",
            "Services whose rules are in the kernel.",
            &self.services,
        )?;
        families.one(
            "nodus_proxy_transactions",
            "nf_tables transactions committed.",
            &self.transactions,
        )?;
        families.one(
            "nodus_proxy_conntrack_deletions",
            "UDP conntrack entries deleted because their endpoint no longer serves the address they were sent to.",
            &self.conntrack_deletions,
        )?;
        families.one(
            "nodus_proxy_conntrack_cleanup_duration_seconds",
            "Time of the UDP conntrack cleanup after a sync that changed a UDP service's endpoints: a dump of the whole conntrack table.",
            &self.conntrack_cleanup,
        )?;
        families.one(
            "nodus_proxy_sync_failures",
            "Proxy syncs that failed (each is followed by a full sync).",
            &self.failures,
        )?;
        if let Some(policy) = self.policy_enforcement() {
            self.export_policy(families, &policy)?;
        }
        families.labelled(
            "nodus_proxy_external_addresses_left_out",
            "External addresses and ports (ExternalIPs, LB IPs) that a Service claims and is not given, counted at each sync that plans the Service: an older Service claims them (older-service), they are a ClusterIP or lie in a ServiceCIDR (cluster-ip), or an ExternalIP is outside proxy.external_ips (not-allowed).",
            ClaimLoss::ALL.iter().map(|loss| {
                (
                    [("reason", Escaped(loss.as_str()))],
                    ConstCounter::new(self.external_left_out[*loss as usize].get()),
                )
            }),
        )?;
        let pod_drops = locked(&self.pod_drops);
        if !pod_drops.is_empty() {
            families.labelled(
                "nodus_pod_packets_dropped",
                "Packets from this node's pods dropped before anything else saw them: a source address that is not the pod's own (forged-source), or an IPv6 router advertisement or redirect (router-message).",
                pod_drops.iter().map(|(drop, packets)| {
                    (
                        [
                            ("reason", Escaped(drop.reason())),
                            ("family", Escaped(drop.family_label())),
                        ],
                        ConstCounter::new(*packets),
                    )
                }),
            )?;
        }
        drop(pod_drops);
        self.kube_proxy
            .export(families, &self.failures, &self.cleanup_failures)
    }
}

impl ProxyMetrics {
    fn export_policy(
        &self,
        families: &mut Families<'_>,
        policy: &PolicyEnforcement,
    ) -> std::fmt::Result {
        families.one(
            "nodus_policy_isolated_pods",
            "Pods of this node that NetworkPolicies isolate in some direction.",
            &ConstGauge::new(gauge(policy.isolated_pods)),
        )?;
        families.one(
            "nodus_policy_refused_pods",
            "Pods of this node failing closed: the kernel refused what their NetworkPolicies allow.",
            &ConstGauge::new(gauge(policy.refused.len())),
        )?;
        let denied = locked(&self.denied);
        if !self.policy_names.load(std::sync::atomic::Ordering::Relaxed) {
            let mut by_direction = [0u64; 2];
            for ((_, direction), packets) in denied.iter() {
                by_direction[*direction as usize] += packets;
            }
            return families.labelled(
                "nodus_policy_denied_packets",
                "Packets dropped for a pod of this node that the NetworkPolicy isolates, in a direction in which no policy allows them (counted for each policy isolating the pod; per policy with policy.metrics_names).",
                Direction::ALL.iter().map(|direction| {
                    (
                        [("direction", Escaped(direction.as_str()))],
                        ConstCounter::new(by_direction[*direction as usize]),
                    )
                }),
            );
        }
        families.labelled(
            "nodus_policy_denied_packets",
            "Packets dropped for a pod of this node that the NetworkPolicy isolates, in a direction in which no policy allows them (counted for each policy isolating the pod).",
            denied.iter().map(|((policy, direction), packets)| {
                let (namespace, policy) = policy.split_once('/').unwrap_or(("", policy));
                (
                    [
                        ("namespace", Escaped(namespace)),
                        ("policy", Escaped(policy)),
                        ("direction", Escaped(direction.as_str())),
                    ],
                    ConstCounter::new(*packets),
                )
            }),
        )
    }
}

impl KubeProxyMetrics {
    /// kube-proxy's families; its sync failures are nodus's (`failures`).
    fn export(
        &self,
        families: &mut Families<'_>,
        failures: &Counter,
        cleanup_failures: &Counter,
    ) -> std::fmt::Result {
        families.one(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds (nodus: every proxy sync).",
            &self.sync,
        )?;
        families.one(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs.",
            &self.full,
        )?;
        families.one(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs.",
            &self.partial,
        )?;
        families.one(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds: from an EndpointSlice's last-change-trigger-time to its rules in the kernel.",
            &self.programming,
        )?;
        families.one(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced.",
            &self.last_sync,
        )?;
        families.one(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued.",
            &self.last_queued,
        )?;
        families.one(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes.",
            &self.service_changes_pending,
        )?;
        families.one(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes.",
            &self.endpoint_changes_pending,
        )?;
        families.one(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes.",
            &self.service_changes,
        )?;
        families.one(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes.",
            &self.endpoint_changes,
        )?;
        families.one(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures.",
            failures,
        )?;
        families.one(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
            "Cumulative proxy nftables cleanup failures.",
            cleanup_failures,
        )?;
        families.labelled(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints.",
            [
                (
                    [("traffic_policy", "internal")],
                    self.no_local_internal.clone(),
                ),
                (
                    [("traffic_policy", "external")],
                    self.no_local_external.clone(),
                ),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> String {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .to_string()
    }

    /// Past the series cap, drops still count, under one series per direction.
    #[test]
    fn denied_packets_past_the_series_cap_count_under_others() {
        let metrics = std::sync::Arc::new(ProxyMetrics::default());
        for i in 0..DENIED_SERIES_MAX {
            metrics.policy_denied(&[format!("t/p{i}")], Direction::Ingress, 1);
        }
        metrics.policy_denied(&["late/one".to_string()], Direction::Ingress, 3);
        metrics.policy_denied(&["late/two".to_string()], Direction::Ingress, 4);
        metrics.policy_denied(&["t/p0".to_string()], Direction::Ingress, 5);
        let denied = locked(&metrics.denied);
        assert_eq!(
            denied.get(&(DENIED_OTHERS.to_string(), Direction::Ingress)),
            Some(&7)
        );
        assert_eq!(
            denied.get(&("t/p0".to_string(), Direction::Ingress)),
            Some(&6)
        );
        assert!(!denied.contains_key(&("late/one".to_string(), Direction::Ingress)));
    }

    #[test]
    fn kube_proxy_series_carry_the_sync_the_pending_changes_and_the_programming_latency() {
        let metrics = std::sync::Arc::new(ProxyMetrics::default());
        let started = UNIX_EPOCH + Duration::from_millis(metrics.kube_proxy.started);
        let changes = ChangeSet {
            services: [nodus_view::ServiceName {
                namespace: "default".into(),
                name: "web".into(),
            }]
            .into(),
            service_updates: 1,
            slice_updates: 2,
            // 1.001 s before the sync ends, and one from before this process started.
            trigger_times: vec![
                metrics.kube_proxy.started as i64 + 999,
                metrics.kube_proxy.started as i64 - 60_000,
            ],
            ..ChangeSet::default()
        };
        metrics.queued(&changes, started + Duration::from_secs(1));
        metrics.sync_failed("refused");
        metrics.cleanup_failed();
        let text = nodus_prom::render(metrics.clone());
        assert_eq!(
            value(
                &text,
                "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"
            ),
            "1"
        );
        assert_eq!(
            value(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
            "2"
        );
        assert_eq!(
            value(
                &text,
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
            ),
            "1"
        );

        let mut report = SyncReport::new(SyncKind::Partial);
        report.duration = Duration::from_millis(3);
        // The rules were in place 2 ms before the end: 0.999 s after the change.
        report.udp_cleanup = Some(UdpCleanup {
            deletions: 0,
            took: Duration::from_millis(2),
        });
        let synced_at = started + Duration::from_secs(2);
        metrics.synced(&report, 10, (1, 2), &changes, synced_at);
        let text = nodus_prom::render(metrics.clone());
        for (series, expected) in [
            ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", "0"),
            ("kubeproxy_sync_proxy_rules_endpoint_changes_total", "2"),
            ("kubeproxy_sync_proxy_rules_service_changes_total", "1"),
            ("kubeproxy_sync_proxy_rules_duration_seconds_count", "1"),
            (
                "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
                "1",
            ),
            (
                "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.002\"}",
                "0",
            ),
            (
                "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\"}",
                "1",
            ),
            ("kubeproxy_network_programming_duration_seconds_count", "1"),
            (
                "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.5\"}",
                "0",
            ),
            (
                "kubeproxy_network_programming_duration_seconds_bucket{le=\"1.0\"}",
                "1",
            ),
            ("nodus_proxy_conntrack_cleanup_duration_seconds_count", "1"),
            (
                "nodus_proxy_conntrack_cleanup_duration_seconds_bucket{le=\"0.001\"}",
                "0",
            ),
            (
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"}",
                "2",
            ),
        ] {
            assert_eq!(value(&text, series), expected, "{series}");
        }
        let last = value(&text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds");
        let expected = unix_millis(synced_at) as f64 / 1000.0;
        assert_eq!(last.parse::<f64>().expect("seconds"), expected);
    }
}
