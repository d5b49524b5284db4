//! The sync engine: programs the planner's output into the kernel and keeps it there.
//!
//! A [`Proxy`] owns the nf_tables socket of the namespace it was opened in and, per
//! service, only a digest of its last committed plan and a compact [`Footprint`] of
//! names and keys, never the ruleset itself. Syncs come in two kinds:
//!
//! - **Full** ([`Proxy::full_sync`]) at start, after any failure, when this node or the
//!   skeleton's inputs change, and to repair outside changes. It adopts an existing
//!   `nodus` table instead of deleting it, programs every service in bounded
//!   transactions, and removes what a previous run left behind (see `full.rs`).
//! - **Partial** ([`Proxy::sync`]) for a `ChangeSet`: only the changed services are
//!   re-planned, and those whose digest changed are updated in one atomic transaction.

mod footprint;
mod full;
mod pod_source;
mod policy;
mod records;
mod sets;
mod udp;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use nodus_view::{ChangeSet, ServiceName, View};
use tracing::{debug, error, info, warn};

pub use footprint::Footprint;
pub use policy::RefusedPod;
use records::Footprints;

use crate::nft::{self, Batch, Socket, Table};
use crate::plan::{
    ClaimLoss, ElementPlan, EndpointKeys, NoLocalEndpoints, NodeFacts, NodePortAddresses,
    PlanBatch, Planner, ProxySettings, ServicePlan, SharedKind, SharedSet, Skeleton, TABLE,
};
use footprint::service_key;
use udp::{StaleFlows, UdpCheck};

/// Messages per transaction of a full sync of `services` services: a tenth of them,
/// between 1,000 and 8,000.
///
/// Every commit that adds a `goto` re-validates the whole table (it walks the verdict
/// maps), so fewer, larger commits load faster, the more so the larger the table; but a
/// transaction's messages and plans are held until it commits, and that is most of a full
/// sync's peak. Measured with the proxy, DNS and the mesh on (`cargo bench --bench
/// footprint`, and `--bench proxy` for the program time alone), release, one sitting. At
/// 10,000 services × 10 endpoints, 4,000 messages gave a 27.2 MiB agent peak at the cold
/// start and 30.8 MiB at a restart's adoption, programmed in 1,037 / 1,291 ms; 2,000 gave
/// 24.0 / 28.1 MiB and 1,233 / 1,564 ms; 1,000 23.0 / 26.5 MiB and 1,349 / 1,736 ms. At
/// 50,000 × 5, 1,000 messages made the cold start 23.2 s against 11.5 s with 4,000, for a
/// peak of 55.5 MiB against 61.7. The kernel's commit lock (which stalls every other
/// nf_tables writer, but packet processing only for set resizes) is held for a fraction of
/// a second.
pub fn full_sync_batch_messages(services: usize) -> usize {
    (services / 10).clamp(1_000, 8_000)
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening the nf_tables socket: {0}")]
    Open(#[source] nft::Error),
    /// A netlink exchange failed during `step`; the next sync is a full one.
    #[error("{step}: {source}")]
    Netlink {
        step: Cow<'static, str>,
        #[source]
        source: nft::Error,
    },
    /// Everything planned was programmed, but what a previous run left (chains, sets,
    /// elements no plan claims) could not all be removed; the next full sync tries again.
    #[error("removing leftovers of a previous run: {0}")]
    Leftovers(#[source] Box<Error>),
    /// The kernel refused the last transactions of a cold start, which fill its endpoint
    /// maps and make its services reachable; [`Proxy::full_sync`] then adopts what the
    /// first ones programmed, service by service, so that only a service at fault is
    /// refused.
    #[error("making the programmed services reachable: {0}")]
    Unentered(#[source] nft::Error),
}

impl Error {
    /// Whether only the removal of leftovers failed (kube-proxy's cleanup failures).
    pub fn is_cleanup(&self) -> bool {
        matches!(self, Error::Leftovers(_))
    }

    pub(crate) fn netlink(step: impl Into<Cow<'static, str>>) -> impl FnOnce(nft::Error) -> Error {
        let step = step.into();
        move |source| Error::Netlink { step, source }
    }
}

/// Full or partial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    Full,
    Partial,
}

/// A service the kernel (or the conflict check) refused; the others were programmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedService {
    pub service: ServiceName,
    /// The refused object as the nft layer describes it, or the conflicting key.
    pub reason: String,
}

/// What one sync did, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    pub kind: SyncKind,
    /// Services newly programmed (in a full sync: every programmed service).
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
    /// Services in the change set whose plan did not change.
    pub unchanged: usize,
    /// Chains, sets and elements of a previous run that are no longer wanted.
    pub leftovers_removed: usize,
    pub refused: Vec<RefusedService>,
    /// Committed transactions, refused ones included.
    pub transactions: usize,
    /// Set and map elements those transactions added or deleted.
    pub elements: usize,
    /// Rules those transactions wrote.
    pub rules: usize,
    pub duration: Duration,
    /// The UDP conntrack cleanup after the commits, when one ran (its time is part of
    /// `duration`). The rules were in place that much earlier: the network programming
    /// latency ends there, as kube-proxy's does.
    pub udp_cleanup: Option<UdpCleanup>,
    /// Why a requested partial sync became a full one.
    pub fell_back: Option<String>,
    /// Pods of this node whose NetworkPolicy allowances the kernel refused in this sync:
    /// they fail closed.
    pub policy_refused: Vec<RefusedPod>,
    /// External addresses and ports the planned services claim and were not given, one
    /// entry each.
    pub external_left_out: Vec<ClaimLoss>,
}

impl SyncReport {
    pub(crate) fn new(kind: SyncKind) -> SyncReport {
        SyncReport {
            kind,
            added: 0,
            updated: 0,
            removed: 0,
            unchanged: 0,
            leftovers_removed: 0,
            refused: Vec::new(),
            transactions: 0,
            elements: 0,
            rules: 0,
            duration: Duration::ZERO,
            udp_cleanup: None,
            fell_back: None,
            policy_refused: Vec::new(),
            external_left_out: Vec::new(),
        }
    }

    /// Counts a transaction about to be committed.
    fn count(&mut self, batch: &Batch) {
        self.transactions += 1;
        self.elements += batch.element_count();
        self.rules += batch.rule_count();
    }
}

/// One UDP conntrack cleanup (I.53): it dumps the whole conntrack table, whose every hash
/// bucket the kernel walks under its lock (about 10 ms at 262,144 buckets here) however
/// few entries it holds, so the applier runs at most one per [`UDP_CLEANUP_PERIOD`]: the
/// checks of the syncs in between wait for it ([`Proxy::udp_cleanup_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpCleanup {
    /// Entries deleted: flows answered by an endpoint that no longer serves the address
    /// they were sent to.
    pub deletions: usize,
    pub took: Duration,
}

/// The least time between two UDP conntrack cleanups, as kube-proxy's `minSyncPeriod`
/// between its syncs (each of which ends with one).
pub const UDP_CLEANUP_PERIOD: Duration = Duration::from_secs(1);

/// What our table must hold whatever the services: checked when another program
/// committed, to tell a commit to its own tables (which costs us nothing) from one that
/// touched ours.
#[derive(Debug, Default)]
struct Expected {
    /// The skeleton's chains.
    skeleton_chains: usize,
    /// A skeleton chain with rules, and how many: `nft flush table` empties it.
    canary: Option<(String, usize)>,
}

/// The applier of the service proxy for one network namespace.
pub struct Proxy {
    config: ProxySettings,
    socket: Socket,
    /// What was last committed per service, by [`service_key`]: a hash, so that the map
    /// holds no strings.
    applied: Footprints,
    /// The services of `applied` that have Local-policy ports without a local endpoint.
    no_local: HashMap<u64, NoLocalEndpoints>,
    /// Claims of the programmed services on shared elements.
    shared: SharedClaims,
    /// Where the endpoints of `applied` live in the endpoint maps.
    keys: EndpointKeys,
    /// The endpoint maps the table holds, with the dispatch chains of those that have one:
    /// a partial sync does not declare them again.
    endpoint_maps: HashSet<SharedSet>,
    /// The elements of each port endpoint map in the table, counted by the last full sync
    /// and kept by the partial ones, which delete a map and its dispatch chain when they
    /// empty it: one small entry per map, not per element.
    port_map_elements: HashMap<SharedSet, u32>,
    /// The node facts of the last full sync; a change means a full sync.
    facts: Option<NodeFacts>,
    /// The ruleset generation after our last commit.
    generation: Option<u32>,
    /// Another program committed since our table was last known intact: a commit of
    /// ours did not follow our previous one directly.
    outside_commits: bool,
    expected: Expected,
    /// Set after a failure: the kernel may not hold what `applied` says.
    needs_full_sync: bool,
    /// What the NetworkPolicy sets hold, per pod of this node.
    policy: policy::PolicyRecords,
    /// What the syncs since the last UDP conntrack cleanup checked, for the next one.
    udp_pending: StaleFlows,
    /// When the last UDP conntrack cleanup ran.
    udp_cleaned: Option<Instant>,
}

impl Proxy {
    /// Opens the nf_tables socket in the calling thread's network namespace; nothing is
    /// programmed until the first [`Proxy::full_sync`].
    pub fn new(config: ProxySettings) -> Result<Proxy, Error> {
        Ok(Proxy {
            config,
            socket: Socket::open().map_err(Error::Open)?,
            applied: Footprints::default(),
            no_local: HashMap::new(),
            shared: SharedClaims::default(),
            keys: EndpointKeys::new(),
            endpoint_maps: HashSet::new(),
            port_map_elements: HashMap::new(),
            facts: None,
            generation: None,
            outside_commits: false,
            expected: Expected::default(),
            needs_full_sync: true,
            policy: policy::PolicyRecords::default(),
            udp_pending: StaleFlows::default(),
            udp_cleaned: None,
        })
    }

    /// Whether NodePorts follow the host's interface addresses (`nodePortAddresses` with
    /// ranges), which the caller then passes to [`Proxy::set_interface_addresses`].
    pub fn follows_interface_addresses(&self) -> bool {
        matches!(self.config.node_port_addresses, NodePortAddresses::Cidrs(_))
    }

    /// The host's interface addresses as just read; whether they changed. The next sync
    /// re-plans the NodePort addresses from them (a full sync, as for any node fact).
    pub fn set_interface_addresses(&mut self, mut addresses: Vec<IpAddr>) -> bool {
        addresses.sort();
        addresses.dedup();
        let changed = self.config.interface_addresses != addresses;
        self.config.interface_addresses = addresses;
        changed
    }

    /// Services currently programmed.
    pub fn programmed_services(&self) -> usize {
        self.applied.len()
    }

    /// Programmed service ports whose Local-policy traffic is dropped for want of a local
    /// endpoint: (internal, external).
    pub fn no_local_endpoints(&self) -> (usize, usize) {
        self.no_local
            .values()
            .fold((0, 0), |(internal, external), ports| {
                (
                    internal + usize::from(ports.internal),
                    external + usize::from(ports.external),
                )
            })
    }

    /// Whether the last full sync programmed NetworkPolicy enforcement.
    pub fn enforces_policies(&self) -> bool {
        self.facts
            .as_ref()
            .is_some_and(|facts| facts.network_policy)
    }

    /// Pods of this node that NetworkPolicies isolate in some direction.
    pub fn isolated_pods(&self) -> usize {
        self.policy.isolated_pods()
    }

    /// Pods of this node failing closed because the kernel refused their allowances.
    pub fn refused_policy_pods(&self) -> impl Iterator<Item = &RefusedPod> {
        self.policy.refused()
    }

    /// Heap bytes of the per-service records (footprints and the map's table), an
    /// estimate for the memory budget (the proxy bench prints it).
    pub fn record_bytes(&self) -> usize {
        self.applied.heap_bytes()
    }

    /// Keeps what was committed for the service `key` (`None`: it is gone).
    fn record(&mut self, key: u64, record: Option<Record>) {
        match record {
            Some(Record {
                footprint,
                no_local,
            }) => {
                if let Err(error) = self.applied.insert(key, &footprint) {
                    // Unrecorded, the service would be added again over itself.
                    error!(%error, "a service's record was not kept; a full sync follows");
                    self.needs_full_sync = true;
                }
                if no_local == NoLocalEndpoints::default() {
                    self.no_local.remove(&key)
                } else {
                    self.no_local.insert(key, no_local)
                };
            }
            None => {
                self.applied.remove(key);
                self.no_local.remove(&key);
            }
        }
    }

    /// Programs the whole view; see `full.rs` for adoption and cleanup of leftovers.
    pub fn full_sync(&mut self, view: &View) -> Result<SyncReport, Error> {
        let start = Instant::now();
        let mut report = SyncReport::new(SyncKind::Full);
        self.needs_full_sync = true;
        let planner = Planner::new(view, &self.config);
        // Every UDP service address, those of services gone since too: after a restart
        // this deletes what the previous process left pinned to old endpoints.
        let mut udp = UdpCheck::default();
        udp.had(self.udp_addresses_recorded(planner.facts()));
        let mut outcome = full::FullSync::new(self, &planner, &mut report, &mut udp).run();
        if let Err(Error::Unentered(refusal)) = &outcome {
            warn!(error = %refusal, "the cold start's entries were refused; adopting its table service by service");
            // The second run counts and refuses every service again.
            report.added = 0;
            report.refused.clear();
            udp = UdpCheck::default();
            udp.had(self.udp_addresses_recorded(planner.facts()));
            outcome = full::FullSync::new(self, &planner, &mut report, &mut udp).run();
        }
        if outcome.is_ok() {
            // At once, with what earlier syncs left for it: the addresses of services
            // they removed are in no footprint any more.
            let mut stale = std::mem::take(&mut self.udp_pending);
            stale.merge(udp.stale_flows());
            report.udp_cleanup = Some(self.clean_conntrack(&stale, &planner));
        }
        let skeleton = outcome?;
        if planner.facts().network_policy {
            self.program_policies(view, &mut report)?
        } else {
            self.policy = policy::PolicyRecords::default()
        }
        report.duration = start.elapsed();
        self.facts = Some(planner.facts().clone());
        self.expected = Expected::of(&skeleton);
        // Every object of ours was written again: whatever others did before is gone.
        self.outside_commits = false;
        self.needs_full_sync = false;
        info!(
            services = report.added,
            refused = report.refused.len(),
            leftovers = report.leftovers_removed,
            transactions = report.transactions,
            duration_ms = report.duration.as_millis() as u64,
            "full proxy sync"
        );
        Ok(report)
    }

    /// Deletes the UDP conntrack entries of `stale` that no endpoint serves any more.
    fn clean_conntrack(&mut self, stale: &StaleFlows, planner: &Planner<'_>) -> UdpCleanup {
        let start = Instant::now();
        let deletions = stale.delete(&mut self.socket, planner);
        self.udp_cleaned = Some(start);
        UdpCleanup {
            deletions,
            took: start.elapsed(),
        }
    }

    /// When the UDP conntrack cleanup that syncs left waiting is due, if they left one:
    /// [`UDP_CLEANUP_PERIOD`] after the last. The caller then runs
    /// [`Proxy::clean_udp_flows`] (a later sync would run it too).
    pub fn udp_cleanup_due(&self) -> Option<Instant> {
        // A full sync is owed: it runs the cleanup at once.
        if self.udp_pending.is_empty() || self.needs_full_sync {
            return None;
        }
        Some(
            self.udp_cleaned
                .map_or_else(Instant::now, |last| last + UDP_CLEANUP_PERIOD),
        )
    }

    /// Runs the UDP conntrack cleanup that syncs left waiting, if it is due, against the
    /// services of `view` now.
    pub fn clean_udp_flows(&mut self, view: &View) -> Option<UdpCleanup> {
        self.udp_cleanup_is_due()
            .then(|| self.clean_pending_udp_flows(&Planner::new(view, &self.config)))
    }

    fn udp_cleanup_is_due(&self) -> bool {
        self.udp_cleanup_due()
            .is_some_and(|due| due <= Instant::now())
    }

    fn clean_pending_udp_flows(&mut self, planner: &Planner<'_>) -> UdpCleanup {
        let stale = std::mem::take(&mut self.udp_pending);
        self.clean_conntrack(&stale, planner)
    }

    /// Applies the services of `changes`; falls back to a full sync when the node facts
    /// the ruleset depends on changed (this node's zone, addresses or pod CIDRs: not its
    /// annotations, conditions or heartbeats), after an earlier failure, or when the
    /// kernel refuses the transaction.
    pub fn sync(&mut self, view: &View, changes: &ChangeSet) -> Result<SyncReport, Error> {
        let planner = Planner::new(view, &self.config);
        let start = Instant::now();
        let mut report = SyncReport::new(SyncKind::Partial);
        if let Some(facts) = &self.facts
            && !self.needs_full_sync
            && facts.differs_only_in_skeleton(planner.facts())
        {
            // A Node joined or left, or a ServiceCIDR changed: only the skeleton changes.
            let skeleton = planner.skeleton();
            let batch = match self.skeleton_refresh(&skeleton) {
                Ok(batch) => batch,
                Err(failure) => return self.fall_back(view, failure.to_string()),
            };
            if let Err(failure) = self.commit(&batch.into_batch(), &mut report) {
                return self.fall_back(view, failure.to_string());
            }
            self.facts = Some(planner.facts().clone());
            self.expected = Expected::of(&skeleton);
        }
        let reason = if self.needs_full_sync {
            Some("the previous sync failed or none ran yet".to_string())
        } else if self.facts.as_ref() != Some(planner.facts()) {
            Some("the node facts the ruleset depends on changed".to_string())
        } else {
            None
        };
        if let Some(reason) = reason {
            return self.fall_back(view, reason);
        }

        let Planned {
            mut batch,
            records,
            claims,
            udp,
        } = match self.plan_changes(&planner, changes, &mut report) {
            Ok(planned) => planned,
            Err(reason) => return self.fall_back(view, reason),
        };
        let port_maps = batch.delete_emptied_port_maps(&self.port_map_elements);
        let declared: Vec<SharedSet> = batch.declared_maps().collect();
        if !batch.is_empty()
            && let Err(failure) = self.commit_partial(batch.into_batch(), &mut report)
        {
            let mut full = self.fall_back(view, failure.to_string())?;
            full.transactions += 1;
            return Ok(full);
        }
        port_maps.apply_to(&mut self.port_map_elements);
        for map in &port_maps.emptied {
            self.endpoint_maps.remove(map);
        }
        self.endpoint_maps.extend(declared);
        for (key, record) in records {
            self.record(key, record);
        }
        if !udp.is_empty() {
            self.udp_pending.merge(udp);
        }
        if self.udp_cleanup_is_due() {
            report.udp_cleanup = Some(self.clean_pending_udp_flows(&planner));
        }
        self.shared.merge(claims);
        if planner.facts().network_policy
            && !changes.policy_pods.is_empty()
            && let Err(error) = self.update_policies(view, &changes.policy_pods, &mut report)
        {
            return self.fall_back(view, error.to_string());
        }
        report.duration = start.elapsed();
        Ok(report)
    }

    /// Plans the services of `changes` against what was recorded for them: the
    /// transaction, the new records, the claims on shared elements it changes, and the
    /// UDP flows to check; the reason for a full sync instead when a record is corrupt.
    fn plan_changes(
        &mut self,
        planner: &Planner<'_>,
        changes: &ChangeSet,
        report: &mut SyncReport,
    ) -> Result<Planned, String> {
        let mut batch = PlanBatch::assuming_maps(&self.endpoint_maps);
        let mut records: Vec<(u64, Option<Record>)> = Vec::new();
        let mut udp = UdpCheck::default();
        // Claims on shared elements this transaction adds (+) and drops (-).
        let mut claims = SharedClaims::default();
        for name in &changes.services {
            let key = service_key(&name.namespace, &name.name);
            let previous = self.applied.get(key);
            let plan = planner.service(
                &name.namespace,
                &name.name,
                &mut self.keys.lease(
                    &previous
                        .map(|footprint| footprint.blocks(&name.namespace, &name.name))
                        .unwrap_or_default(),
                ),
            );
            let digest = (!plan.is_empty()).then(|| plan.digest());
            match (previous, digest) {
                (None, None) => report.unchanged += 1,
                (Some(previous), Some(digest)) if previous.digest() == digest => {
                    report.unchanged += 1;
                }
                (None, Some(digest)) => {
                    warn_contested(&plan, report);
                    udp.planned(&plan);
                    claims.claim(&plan, 1);
                    batch.add_service(&plan);
                    report.added += 1;
                    records.push((key, Some(Record::of(digest, &plan))));
                }
                (Some(previous), digest) => {
                    warn_contested(&plan, report);
                    let Some(mut old) = previous.previous_plan(&plan) else {
                        return Err(format!("the record of {name:?} is corrupt"));
                    };
                    udp.had(udp::addresses_of(&old.elements, planner.facts()));
                    udp.planned(&plan);
                    claims.claim(&old, -1);
                    claims.claim(&plan, 1);
                    // What another service still wants stays in the table.
                    old.elements.retain(|element| {
                        !element.set.kind.is_shared()
                            || plan.elements.contains(element)
                            || self.shared.count(element) + claims.count(element) <= 0
                    });
                    batch.update_service(&old, &plan);
                    match digest {
                        Some(digest) => {
                            report.updated += 1;
                            records.push((key, Some(Record::of(digest, &plan))));
                        }
                        None => {
                            report.removed += 1;
                            records.push((key, None));
                        }
                    }
                }
            }
        }
        Ok(Planned {
            batch,
            records,
            claims,
            udp: udp.stale_flows(),
        })
    }

    /// Commits a partial sync's transaction; a refusal is logged with the kernel's words.
    fn commit_partial(&mut self, batch: Batch, report: &mut SyncReport) -> Result<(), nft::Error> {
        report.count(&batch);
        match self.socket.commit(&batch) {
            Ok(generation) => {
                self.committed(generation);
                Ok(())
            }
            Err(failure) => {
                if let nft::Error::Refused { message, .. } = &failure {
                    error!(refused = %message, error = %failure, "partial proxy sync refused");
                } else {
                    error!(error = %failure, "partial proxy sync failed");
                }
                Err(failure)
            }
        }
    }

    /// The UDP service addresses of every service recorded, read back from the
    /// footprints (their NodePorts on the node addresses of `facts`).
    fn udp_addresses_recorded(&self, facts: &NodeFacts) -> Vec<(IpAddr, u16)> {
        let facts = self.facts.as_ref().unwrap_or(facts);
        self.applied
            .iter()
            .filter_map(|footprint| footprint.shared_elements())
            .flat_map(|elements| udp::addresses_of(&elements, facts))
            .collect()
    }

    fn fall_back(&mut self, view: &View, reason: String) -> Result<SyncReport, Error> {
        warn!(%reason, "full proxy sync instead of a partial one");
        let mut report = self.full_sync(view)?;
        report.fell_back = Some(reason);
        Ok(report)
    }

    /// Detects outside changes to our table, and repairs them with a full sync, whose
    /// report is returned. When nobody else committed since our last commit, that is one
    /// netlink round trip. When someone did (another program's commit to its own table,
    /// every few seconds on a node with firewalld or Docker; or an `nft flush` of ours),
    /// our table is read back cheaply: it must exist, hold as many chains as we made, and
    /// a skeleton chain its rules; only then is it rebuilt.
    pub fn check(&mut self, view: &View) -> Result<Option<SyncReport>, Error> {
        let current = self
            .socket
            .generation()
            .map_err(Error::netlink("reading the ruleset generation"))?;
        if !self.needs_full_sync {
            if self.generation == Some(current) && !self.outside_commits {
                return Ok(None);
            }
            match self.table_intact() {
                Ok(true) => {
                    debug!(
                        current,
                        "another program committed to nf_tables; our table is intact"
                    );
                    self.generation = Some(current);
                    self.outside_commits = false;
                    return Ok(None);
                }
                Ok(false) => {}
                Err(error) => warn!(%error, "cannot read our table back; repairing it"),
            }
        }
        warn!(
            expected = ?self.generation,
            current,
            "our nf_tables table changed outside the proxy; repairing"
        );
        let mut report = self.full_sync(view)?;
        report.fell_back = Some("the table changed outside the proxy".into());
        Ok(Some(report))
    }

    /// Whether our table holds what it must: it exists, with the chains we made (a
    /// deleted one is missing), and its canary chain with its rules (a flush empties it).
    fn table_intact(&mut self) -> Result<bool, Error> {
        let table = Table::inet(TABLE);
        if !self
            .socket
            .table_exists(&table)
            .map_err(Error::netlink("looking up our table"))?
        {
            return Ok(false);
        }
        let dispatch_chains = self
            .endpoint_maps
            .iter()
            .filter(|map| map.kind == SharedKind::PortEndpoints)
            .count();
        let chains = self.expected.skeleton_chains
            + dispatch_chains
            + self
                .applied
                .iter()
                .map(|footprint| footprint.chains())
                .sum::<usize>();
        if self
            .socket
            .count_chains(&table)
            .map_err(Error::netlink("counting our chains"))?
            != chains
        {
            return Ok(false);
        }
        match &self.expected.canary {
            Some((chain, rules)) => Ok(self
                .socket
                .count_rules(&table, chain)
                .map_err(Error::netlink("counting the rules of a skeleton chain"))?
                == *rules),
            None => Ok(true),
        }
    }

    fn commit(&mut self, batch: &Batch, report: &mut SyncReport) -> Result<(), nft::Error> {
        report.count(batch);
        let generation = self.socket.commit(batch)?;
        self.committed(generation);
        Ok(())
    }

    /// Records the generation of a commit of ours. One that does not follow our previous
    /// commit directly means another program committed in between: the next
    /// [`Proxy::check`] looks at our table, even while our own commits keep coming.
    fn committed(&mut self, generation: u32) {
        if let Some(last) = self.generation
            && generation != last.wrapping_add(1)
        {
            self.outside_commits = true;
        }
        self.generation = Some(generation);
    }
}

/// Deletes the `nodus` table, with everything in it, from the calling thread's network
/// namespace (`nodus cleanup`). Returns whether there was one.
pub fn cleanup() -> Result<bool, Error> {
    Socket::open()
        .map_err(Error::Open)?
        .delete_table_if_exists(&Table::inet(TABLE))
        .map_err(Error::netlink("deleting the nodus table"))
}

/// How many programmed services want each shared element (see
/// [`SharedKind::is_shared`]), by [`full::planned_slot_id`]: a service that lets one go
/// deletes it only when no other still wants it. A node's hairpin pairs are its local
/// endpoints times their service addresses, so this stays small.
#[derive(Debug, Default)]
struct SharedClaims(HashMap<u64, i64>);

impl SharedClaims {
    /// Counts `plan`'s shared elements `by` more claims (negative: fewer).
    fn claim(&mut self, plan: &ServicePlan, by: i64) {
        for element in plan.elements.iter().filter(|e| e.set.kind.is_shared()) {
            *self.0.entry(full::planned_slot_id(element)).or_default() += by;
        }
    }

    fn count(&self, element: &ElementPlan) -> i64 {
        self.0
            .get(&full::planned_slot_id(element))
            .copied()
            .unwrap_or_default()
    }

    /// Adds a committed transaction's changes.
    fn merge(&mut self, changes: SharedClaims) {
        for (id, by) in changes.0 {
            let count = self.0.entry(id).or_default();
            *count += by;
            if *count <= 0 {
                self.0.remove(&id);
            }
        }
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// What a partial sync plans before it commits.
struct Planned {
    batch: PlanBatch,
    records: Vec<(u64, Option<Record>)>,
    /// Claims on shared elements the transaction adds (+) and drops (-).
    claims: SharedClaims,
    /// The UDP addresses the changed services had and have, with their endpoints now.
    udp: StaleFlows,
}

/// What a committed plan leaves in the applier's records.
struct Record {
    /// Made by [`Footprint::encode`].
    footprint: Box<[u8]>,
    no_local: NoLocalEndpoints,
}

impl Record {
    fn of(digest: u64, plan: &ServicePlan) -> Record {
        Record {
            footprint: Footprint::encode(plan, digest),
            no_local: plan.no_local,
        }
    }
}

impl Expected {
    fn of(skeleton: &Skeleton) -> Expected {
        Expected {
            skeleton_chains: skeleton.chains.len(),
            canary: skeleton
                .chains
                .iter()
                .find(|chain| !chain.rules.is_empty())
                .map(|chain| (chain.name().to_string(), chain.rules.len())),
        }
    }
}

/// External addresses and ports a service claims and is not given ([`ClaimLoss`]): it is
/// told here, at each sync that programs it, and they are counted in `report`.
fn warn_contested(plan: &ServicePlan, report: &mut SyncReport) {
    for contested in &plan.contested {
        warn!(
            service = %format!("{}/{}", plan.namespace, plan.name),
            address = %std::net::SocketAddr::from((contested.address, contested.port)),
            "{}",
            contested.loss.explain()
        );
        report.external_left_out.push(contested.loss);
    }
}

#[cfg(test)]
mod tests;
