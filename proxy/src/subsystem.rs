//! The proxy inside `nodus run`: nodus's nftables table kept in step with the view (the
//! service proxy, or with only the mesh on, its egress masquerade alone). A full sync
//! first, then one transaction per batch, and a periodic check that repairs outside
//! changes; the health-check node ports follow the services.

use crate::apply::{Error, Proxy, SyncReport};
use crate::config::{Config, Neighbours};
use crate::health::{HealthChecks, HealthListen};
use crate::metrics::{PolicyEnforcement, ProxyMetrics};
use crate::sysctls::Sysctls;
use nodus_http::Limits;
use nodus_view::config::Cluster;
use nodus_view::policy::resolve::Direction;
use nodus_view::{Applied, ChangeSet, Subsystem, View, ViewReader};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How often the loop checks that nobody changed the table (and retries a failed sync):
/// the run loop ticks at this period.
pub const CHECK_PERIOD: Duration = Duration::from_secs(10);

/// The proxy's front door: nodus's table kept in step with `view` as `config` and its
/// `neighbours` say. `http_limits`: the caps every HTTP listener of the node has, the
/// health-check node ports' too; `host_addresses` reads this host's interface addresses
/// when `nodePortAddresses` names ranges. Nothing is programmed before the first batch.
pub fn start(
    config: &Config,
    cluster: &Cluster,
    neighbours: &Neighbours,
    http_limits: Limits,
    view: ViewReader,
    host_addresses: fn() -> std::io::Result<Vec<IpAddr>>,
) -> Result<ProxySubsystem, Error> {
    let proxy = Proxy::new(config.settings(cluster, neighbours))?;
    let health = config.enabled.then(|| HealthListen {
        bind: config.health_check_address,
        limits: http_limits,
    });
    Ok(ProxySubsystem::new(
        proxy,
        view,
        health,
        config.sysctls(),
        host_addresses,
    ))
}

pub struct ProxySubsystem {
    proxy: Proxy,
    /// Health-check node ports, served only by the service proxy.
    health: Option<HealthChecks>,
    /// The last sync failed, or none happened yet: the next step is a full sync.
    needs_full: bool,
    last_check: Instant,
    /// Commits may block for seconds (a full sync of a large cluster): on a
    /// multi-threaded runtime the other worker serves DNS and HTTP meanwhile.
    blocking: bool,
    pub metrics: Arc<ProxyMetrics>,
    /// Written after the first full sync, which loads the conntrack module.
    sysctls: Option<Sysctls>,
    /// Reads the host's interface addresses, for NodePorts that follow them.
    host_addresses: fn() -> std::io::Result<Vec<IpAddr>>,
    /// The isolated sets' counters as last read, per pod address and direction.
    denials: HashMap<(IpAddr, Direction), u64>,
}

impl ProxySubsystem {
    /// `health` serves health-check node ports as it says (the service proxy);
    /// `None` for the egress masquerade alone, whose few messages commit at once;
    /// `sysctls`: what the service proxy sets on the host; `host_addresses`: how to read
    /// the host's interface addresses when `nodePortAddresses` names ranges.
    pub fn new(
        proxy: Proxy,
        view: ViewReader,
        health: Option<HealthListen>,
        sysctls: Option<Sysctls>,
        host_addresses: fn() -> std::io::Result<Vec<IpAddr>>,
    ) -> ProxySubsystem {
        let metrics: Arc<ProxyMetrics> = Arc::default();
        ProxySubsystem {
            proxy,
            blocking: health.is_some(),
            health: health.map(|listen| HealthChecks::new(view, metrics.clone(), listen)),
            needs_full: true,
            last_check: Instant::now(),
            metrics,
            sysctls,
            host_addresses,
            denials: HashMap::new(),
        }
    }

    /// Adds the packets the isolated sets dropped since the last reading to the
    /// policies that isolate each pod. A counter that went down was added anew (a full
    /// sync refills the sets): all of it is new.
    fn count_denials(&mut self, view: &View) {
        let denials = match self.proxy.policy_denials() {
            Ok(denials) => denials,
            Err(error) => {
                tracing::warn!(%error, "cannot read the NetworkPolicy drop counters");
                return;
            }
        };
        let mut read = HashMap::with_capacity(denials.len());
        for denial in denials {
            let key = (denial.pod, denial.direction);
            let last = self.denials.get(&key).copied().unwrap_or(0);
            let new = denial.packets.checked_sub(last).unwrap_or(denial.packets);
            if new > 0 {
                let policies = view.isolating_policies(denial.pod, denial.direction);
                self.metrics.policy_denied(&policies, denial.direction, new);
            }
            read.insert(key, denial.packets);
        }
        self.denials = read;
    }

    /// Brings the kernel in step with `view`, and every half check period (also while
    /// changes keep coming) checks that nobody changed the table.
    fn step(&mut self, view: &View, applied: &Applied) {
        self.metrics.queued(&applied.changes, SystemTime::now());
        let checking = self.last_check.elapsed() >= CHECK_PERIOD / 2;
        if self.proxy.follows_interface_addresses() && (self.needs_full || checking) {
            match (self.host_addresses)() {
                Ok(addresses) => {
                    if self.proxy.set_interface_addresses(addresses) && !self.needs_full {
                        tracing::info!("the host's addresses changed; NodePorts follow them");
                        self.needs_full = true;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read the host's addresses; NodePorts stay where they are");
                }
            }
        }
        let synced = if self.needs_full {
            self.proxy.full_sync(view).map(Some)
        } else if !applied.changes.is_empty() {
            self.proxy.sync(view, &applied.changes).map(Some)
        } else {
            Ok(None)
        };
        self.record(synced, &applied.changes);
        // Half the tick period: a tick a few milliseconds early must not skip a check.
        if !self.needs_full && checking {
            self.last_check = Instant::now();
            if self.proxy.enforces_policies() {
                self.count_denials(view);
            }
            match self.proxy.pod_drops() {
                Ok(drops) => self.metrics.pod_drops(drops),
                Err(error) => tracing::warn!(%error, "cannot read the pod source check's counters"),
            }
            let checked = self.proxy.check(view);
            self.record(checked, &ChangeSet::default());
        }
        // What syncs less than a second after the last cleanup left for the next one: the
        // run loop wakes the proxy for it ([`Subsystem::wake_at`]).
        if let Some(cleanup) = self.proxy.clean_udp_flows(view) {
            self.metrics.udp_cleaned(&cleanup);
        }
    }

    fn record(&mut self, result: Result<Option<SyncReport>, Error>, changes: &ChangeSet) {
        match result {
            Ok(Some(report)) => {
                self.needs_full = false;
                if let Some(sysctls) = self.sysctls.take() {
                    set_sysctls(&sysctls);
                }
                self.metrics.synced(
                    &report,
                    self.proxy.programmed_services(),
                    self.proxy.no_local_endpoints(),
                    changes,
                    SystemTime::now(),
                );
                if self.proxy.enforces_policies() {
                    self.metrics.policy_enforced(PolicyEnforcement {
                        isolated_pods: self.proxy.isolated_pods(),
                        refused: self.proxy.refused_policy_pods().cloned().collect(),
                    });
                }
                for refused in &report.refused {
                    tracing::warn!(service = %format!("{}/{}", refused.service.namespace, refused.service.name), reason = %refused.reason, "the kernel refused a service");
                }
                tracing::debug!(?report, "proxy synced");
            }
            Ok(None) => {}
            Err(error) => {
                self.needs_full = true;
                self.metrics.sync_failed(&error);
                if error.is_cleanup() {
                    self.metrics.cleanup_failed();
                }
                tracing::error!(error = %error, "proxy sync failed; a full sync follows");
            }
        }
    }
}

/// kube-proxy's conntrack sysctls (I.56) and `route_localnet` (E.35); what cannot be
/// written (a read-only `/proc/sys` in a container, the table size outside the host's
/// network namespace) is logged.
fn set_sysctls(sysctls: &Sysctls) {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    for change in sysctls.apply(Path::new("/proc"), Path::new("/sys"), cpus) {
        let path = change.path.display();
        match change.result {
            Ok(()) => {
                tracing::info!(%path, from = change.from, to = change.to, "sysctl changed")
            }
            Err(error) => {
                tracing::warn!(%path, to = change.to, %error, "cannot change a sysctl; left as it is")
            }
        }
    }
}

impl Subsystem for ProxySubsystem {
    fn name(&self) -> &'static str {
        "proxy"
    }

    /// A restored view is not acted on: the kernel kept the table the last process
    /// programmed, and a plan from old data could only move it further from the cluster.
    fn after_batch(&mut self, view: &View, applied: &Applied) {
        if applied.stale {
            return;
        }
        if self.blocking {
            tokio::task::block_in_place(|| self.step(view, applied))
        } else {
            self.step(view, applied)
        }
        if let Some(health) = &mut self.health {
            health.update(view, (!applied.initial_sync).then_some(&applied.changes));
        }
    }

    /// Programmed: a node whose rules are failing to sync is not ready.
    fn is_ready(&self) -> bool {
        !self.needs_full
    }

    /// When the UDP conntrack cleanup that syncs left waiting is due.
    fn wake_at(&self) -> Option<Instant> {
        self.proxy.udp_cleanup_due()
    }
}
