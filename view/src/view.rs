//! The node view: every Service, EndpointSlice, Node and ServiceCIDR nodus watches, and
//! this node's Pods, in compact form, updated in batches that report what they touched.

use crate::decode::{self, InvalidObject};
use crate::intern::{Interner, Sym};
use crate::model::{Cidr, LocalPod, Node, Service, Slice};
use crate::policy::resolve::{Connection, Direction, Judgement, PodPolicy};
use crate::policy::store::{ClaimError, Dirty, PolicyState};
use crate::resolve::NodeContext;
use crate::reverse::ReverseIndex;
use crate::{policy, wire};
use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;

mod pods;
mod slice_owners;
mod snapshot;
use slice_owners::{SliceKey, SliceOwners};
pub use snapshot::{MAX_BYTES as SNAPSHOT_MAX_BYTES, SnapshotError};

/// The kinds of object the view holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    ServiceCidr,
    /// This node's pods, or every pod when NetworkPolicy is on.
    Pod,
    Namespace,
    NetworkPolicy,
    /// The cluster's DNS ConfigMap, and only it.
    ConfigMap,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Node,
        Kind::ServiceCidr,
        Kind::Pod,
        Kind::Namespace,
        Kind::NetworkPolicy,
        Kind::ConfigMap,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::ConfigMap => "ConfigMap",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One event from a watch, as the view consumes it. Objects are boxed: a batch holds
/// hundreds of updates, and most of them are not the largest kind.
#[derive(Debug)]
pub enum Update {
    Service(Box<wire::Service>),
    EndpointSlice(Box<wire::EndpointSlice>),
    Node(Box<wire::Node>),
    ServiceCidr(Box<wire::ServiceCidr>),
    Pod(Box<wire::Pod>),
    Namespace(Box<wire::Namespace>),
    NetworkPolicy(Box<wire::NetworkPolicy>),
    ConfigMap(Box<wire::ConfigMap>),
    Deleted {
        kind: Kind,
        namespace: String,
        name: String,
    },
    /// A (re)list of `kind` begins: objects it does not deliver before `RelistDone` are
    /// deleted then, so the view never empties in between.
    RelistStarted(Kind),
    RelistDone(Kind),
}

/// A Service is named by its namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

/// A pod of this node, with its namespace's name.
#[derive(Clone, Copy, Debug)]
pub struct LocalPodView<'a> {
    pub namespace: &'a str,
    pub pod: &'a LocalPod,
}

/// What a batch touched, so that each subsystem re-plans only that.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeSet {
    pub services: BTreeSet<ServiceName>,
    pub nodes: BTreeSet<String>,
    /// This node's own labels or addresses changed: zone-dependent results may all differ
    /// (checklist B.18), so subsystems resync fully.
    pub this_node: bool,
    /// The ServiceCIDRs changed: the ranges whose unallocated addresses are dropped.
    pub service_cidrs: bool,
    /// When the changes behind the EndpointSlices this batch changed happened, in
    /// milliseconds since the epoch (their `endpoints.kubernetes.io/last-change-trigger-time`),
    /// for the proxy's network programming latency. At most [`TRIGGER_TIMES_MAX`].
    pub trigger_times: Vec<i64>,
    /// Services and EndpointSlices added, changed or deleted in this batch (kube-proxy's
    /// service and endpoint change counters).
    pub service_updates: u32,
    pub slice_updates: u32,
    /// The pods of this node (by key) whose NetworkPolicy verdicts may have changed: with
    /// a policy, a namespace's labels, or a pod's addresses, labels or named ports.
    pub policy_pods: BTreeSet<u64>,
    /// The cluster's DNS ConfigMap came, changed or went.
    pub dns_config_map: bool,
}

/// Trigger times kept per batch: a relist changes thousands of slices, and a sample
/// of them tells the latency as well.
pub const TRIGGER_TIMES_MAX: usize = 256;

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.nodes.is_empty()
            && !self.this_node
            && !self.service_cidrs
            && !self.dns_config_map
            && self.policy_pods.is_empty()
    }
}

/// The outcome of one batch.
#[derive(Debug, Default)]
pub struct ApplyReport {
    pub changes: ChangeSet,
    /// Objects skipped in this batch, each reported once until it changes.
    pub invalid: Vec<InvalidObject>,
    /// The kind of every object skipped in this batch, repeats included.
    pub skipped: Vec<Kind>,
    /// This node's pods changed; no subsystem re-plans for them (DNS reads them per
    /// question), so they are not in `changes`.
    pub pods: bool,
}

/// A service of the view, named by its interned strings ([`View::service_refs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceRef(ServiceKey);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ServiceKey {
    namespace: Sym,
    name: Sym,
}

/// A service and its slices travel together: slices may arrive before their service.
/// The service is boxed, and the slices a boxed slice rather than a `Vec` (most services
/// have one), so that the map's buckets stay small: 32 bytes, 8 less at 50,000 services
/// is half a MiB.
#[derive(Default)]
struct ServiceEntry {
    service: Option<Box<Service>>,
    slices: Box<[Slice]>,
}

/// Object counts, for metrics and `nodus view`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub services: usize,
    pub endpoint_slices: usize,
    pub endpoints: usize,
    pub nodes: usize,
    /// This node's pods.
    pub pods: usize,
    /// Every pod, namespace and NetworkPolicy, held with NetworkPolicy on.
    pub policy_pods: usize,
    pub namespaces: usize,
    pub network_policies: usize,
    /// Pods and namespaces with more labels than nodus keeps, failing closed.
    pub over_label_cap: usize,
    pub strings: usize,
}

pub struct View {
    strings: Interner,
    node_name: Sym,
    services: HashMap<ServiceKey, ServiceEntry>,
    /// Which service each slice belongs to, to find it again when it moves or goes.
    slice_owner: SliceOwners,
    nodes: HashMap<Sym, Node>,
    /// Each ServiceCIDR's ranges, by name: a cluster has one or a few.
    service_cidrs: HashMap<Box<str>, Box<[Cidr]>>,
    /// Per kind, the objects a relist in progress has delivered so far.
    relists: [Option<HashSet<u64>>; Kind::ALL.len()],
    /// Objects that are invalid now, with the reason last reported: a new reason, or the
    /// same one after a valid version in between, is reported again. A valid update or a
    /// delete removes the object, so this holds only what is broken at present.
    reported: HashMap<u64, u64>,
    /// Which services own an address: cluster IPs, and the endpoints of headless services.
    /// PTR answers read it; it holds keys of live entries only, so it takes no references.
    reverse: ReverseIndex<ServiceKey>,
    /// Which services claim an ExternalIP or LB IP: when one changes, the others that
    /// claim its addresses are re-planned, since which of them owns a contested address
    /// and port may change with it (the proxy's BUG-7).
    external: ReverseIndex<ServiceKey>,
    /// Service entries per namespace, so that `<ns>.svc.<zone>` can tell an existing
    /// namespace from a missing one without a namespace watch.
    namespaces: HashMap<Sym, u32>,
    pods: pods::LocalPods,
    policy: PolicyState,
    /// The cluster's DNS ConfigMap's upstreams and stub domains, when it is watched and
    /// exists. Not saved with the view: a restored view forwards as configured until
    /// the list brings it.
    dns_config_map: Option<wire::DnsConfigMap>,
}

/// The identity of a Pod, NetworkPolicy or listed object in this process: a hash of its
/// kind, namespace and name under a key drawn at start (SipHash-1-3, as std's maps), so
/// that nobody can look for two names of one identity beforehand; with a fixed key a
/// tenant could find two pod names that share one policy slot in about 2^32 tries (the
/// tenants-2 review's N5). Never saved: the next process draws another key.
fn object_hash(kind: Kind, namespace: &str, name: &str) -> u64 {
    static KEY: std::sync::LazyLock<std::hash::RandomState> =
        std::sync::LazyLock::new(std::hash::RandomState::new);
    std::hash::BuildHasher::hash_one(&*KEY, (kind.index(), namespace, name))
}

impl View {
    /// An empty view for the node `node_name` (empty when nodus runs outside a node, as
    /// `nodus view` may).
    pub fn new(node_name: &str) -> View {
        let mut strings = Interner::new();
        let node_name = strings.intern(node_name);
        View {
            strings,
            node_name,
            services: HashMap::new(),
            slice_owner: SliceOwners::default(),
            nodes: HashMap::new(),
            service_cidrs: HashMap::new(),
            relists: Default::default(),
            reported: HashMap::new(),
            reverse: ReverseIndex::default(),
            external: ReverseIndex::default(),
            namespaces: HashMap::new(),
            pods: pods::LocalPods::default(),
            policy: PolicyState::default(),
            dns_config_map: None,
        }
    }

    pub fn strings(&self) -> &Interner {
        &self.strings
    }

    pub fn node_name(&self) -> &str {
        self.strings.resolve(self.node_name)
    }

    pub fn this_node(&self) -> Option<&Node> {
        self.nodes.get(&self.node_name)
    }

    pub fn node_context(&self) -> NodeContext {
        NodeContext {
            name: self.node_name,
            zone: self.this_node().map_or(Sym::EMPTY, |n| n.zone),
        }
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.strings.lookup(name).and_then(|s| self.nodes.get(&s))
    }

    pub fn nodes(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.nodes
            .iter()
            .map(|(k, n)| (self.strings.resolve(*k), n))
    }

    /// The ranges of every ServiceCIDR, sorted, without repeats.
    pub fn service_cidrs(&self) -> Vec<Cidr> {
        let mut cidrs: Vec<Cidr> = self.service_cidrs.values().flatten().copied().collect();
        cidrs.sort();
        cidrs.dedup();
        cidrs
    }

    /// Whether `ip` lies in a ServiceCIDR.
    pub fn in_service_cidrs(&self, ip: IpAddr) -> bool {
        self.service_cidrs
            .values()
            .flatten()
            .any(|cidr| cidr.contains(ip))
    }

    /// Every service the view knows, including slices whose Service has not arrived.
    pub fn services(&self) -> impl Iterator<Item = ServiceView<'_>> {
        self.services
            .iter()
            .map(|(key, entry)| self.service_view(key, entry))
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<ServiceView<'_>> {
        let key = ServiceKey {
            namespace: self.strings.lookup(namespace)?,
            name: self.strings.lookup(name)?,
        };
        self.services
            .get_key_value(&key)
            .map(|(key, entry)| self.service_view(key, entry))
    }

    /// Every service, by reference: what a walk over the view keeps between read locks
    /// (8 bytes a service, against a name's two strings).
    pub fn service_refs(&self) -> Vec<ServiceRef> {
        self.services.keys().map(|key| ServiceRef(*key)).collect()
    }

    /// The service `at` refers to, if the view still holds it. After a later batch a
    /// reference can name another service (the interner reuses a freed string's slot);
    /// that service is then as current as any.
    pub fn service_at(&self, at: ServiceRef) -> Option<ServiceView<'_>> {
        self.services
            .get_key_value(&at.0)
            .map(|(key, entry)| self.service_view(key, entry))
    }

    /// Every node, by its interned name: see [`View::service_refs`].
    pub fn node_refs(&self) -> Vec<Sym> {
        self.nodes.keys().copied().collect()
    }

    /// The node named by `name`, if the view still holds it.
    pub fn node_at(&self, name: Sym) -> Option<(&str, &Node)> {
        self.nodes
            .get(&name)
            .map(|node| (self.strings.resolve(name), node))
    }

    fn service_view<'a>(&'a self, key: &ServiceKey, entry: &'a ServiceEntry) -> ServiceView<'a> {
        ServiceView {
            namespace: self.strings.resolve(key.namespace),
            name: self.strings.resolve(key.name),
            service: entry.service.as_deref(),
            slices: &entry.slices,
        }
    }

    /// Whether `namespace` exists as far as the view can tell: a service (or slice) lives
    /// in it, or (NetworkPolicy on: every Namespace is watched) its Namespace exists.
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.strings
            .lookup(namespace)
            .is_some_and(|ns| self.namespaces.contains_key(&ns) || self.policy.knows_namespace(ns))
    }

    /// The pod of this node that sends from `ip`, if the view knows one.
    pub fn local_pod(&self, ip: IpAddr) -> Option<LocalPodView<'_>> {
        self.pods.at(ip).map(|pod| LocalPodView {
            namespace: self.strings.resolve(pod.namespace),
            pod,
        })
    }

    /// The services that own `ip`: through a cluster IP, or an endpoint of a headless
    /// service.
    pub fn services_by_ip(&self, ip: IpAddr) -> impl Iterator<Item = ServiceView<'_>> {
        self.services_of(self.reverse.owners(ip))
    }

    /// The services that claim `ip` as an ExternalIP or LB IP.
    pub fn external_claimants(&self, ip: IpAddr) -> impl Iterator<Item = ServiceView<'_>> {
        self.services_of(self.external.owners(ip))
    }

    /// The live services among `keys`.
    fn services_of<'a>(
        &'a self,
        keys: impl Iterator<Item = ServiceKey> + 'a,
    ) -> impl Iterator<Item = ServiceView<'a>> {
        keys.filter_map(|key| {
            self.services
                .get_key_value(&key)
                .map(|(key, entry)| self.service_view(key, entry))
        })
    }

    pub fn counts(&self) -> Counts {
        let (policy_pods, namespaces, network_policies) = self.policy.counts();
        let mut counts = Counts {
            nodes: self.nodes.len(),
            pods: self.pods.len(),
            policy_pods,
            namespaces,
            network_policies,
            over_label_cap: self.policy.over_label_cap(),
            strings: self.strings.len(),
            ..Counts::default()
        };
        for entry in self.services.values() {
            counts.services += usize::from(entry.service.is_some());
            counts.endpoint_slices += entry.slices.len();
            counts.endpoints += entry
                .slices
                .iter()
                .map(|s| s.endpoints.len())
                .sum::<usize>();
        }
        counts
    }

    /// Applies one batch of updates and reports what changed.
    pub fn apply(&mut self, batch: impl IntoIterator<Item = Update>) -> ApplyReport {
        let mut report = ApplyReport::default();
        for update in batch {
            let object = update_key(&update);
            // Entries of a valid object left out: the object is applied and reported.
            let mut partly_invalid = None;
            let result = match update {
                Update::Service(svc) => {
                    self.upsert_service(*svc, &mut report.changes, &mut partly_invalid)
                }
                Update::EndpointSlice(slice) => {
                    self.upsert_slice(*slice, &mut report.changes, &mut partly_invalid)
                }
                Update::Node(node) => self.upsert_node(*node, &mut report.changes),
                Update::ServiceCidr(cidr) => self.upsert_service_cidr(*cidr, &mut report.changes),
                Update::Pod(pod) => self.upsert_pod(
                    *pod,
                    &mut report.pods,
                    &mut report.changes.policy_pods,
                    &mut partly_invalid,
                ),
                Update::Namespace(namespace) => self.upsert_namespace(
                    *namespace,
                    &mut report.changes.policy_pods,
                    &mut partly_invalid,
                ),
                Update::NetworkPolicy(policy) => {
                    self.upsert_policy(*policy, &mut report.changes.policy_pods)
                }
                Update::ConfigMap(map) => {
                    self.seen(Kind::ConfigMap, "", &map.metadata.name);
                    self.set_dns_config_map(Some(map.data), &mut report.changes);
                    Ok(())
                }
                Update::Deleted {
                    kind,
                    namespace,
                    name,
                } => {
                    let pods = self.pods.len();
                    self.delete(kind, &namespace, &name, &mut report.changes);
                    // Deletes and sweeps only remove: a pod went when the count fell.
                    report.pods |= self.pods.len() != pods;
                    Ok(())
                }
                Update::RelistStarted(kind) => {
                    self.relists[kind.index()] = Some(HashSet::new());
                    Ok(())
                }
                Update::RelistDone(kind) => {
                    let pods = self.pods.len();
                    self.finish_relist(kind, &mut report.changes);
                    report.pods |= self.pods.len() != pods;
                    Ok(())
                }
            };
            let notice = match result {
                Err((kind, err)) => {
                    report.skipped.push(kind);
                    Some(err)
                }
                Ok(()) => partly_invalid,
            };
            match notice {
                Some(err) => {
                    let mut h = DefaultHasher::new();
                    err.reason.hash(&mut h);
                    let reason = h.finish();
                    let fresh =
                        object.is_none_or(|o| self.reported.insert(o, reason) != Some(reason));
                    if fresh {
                        report.invalid.push(err);
                    }
                }
                None => {
                    if let Some(o) = object {
                        self.reported.remove(&o);
                    }
                }
            }
        }
        report
    }

    fn seen(&mut self, kind: Kind, namespace: &str, name: &str) {
        if let Some(seen) = &mut self.relists[kind.index()] {
            let hash = match kind {
                Kind::EndpointSlice => slice_relist_hash(namespace, decode::hash_name(name)),
                _ => object_hash(kind, namespace, name),
            };
            seen.insert(hash);
        }
    }

    /// The key of the entry for `namespace/name`, creating the entry if needed. The map
    /// holds one reference on each key string for as long as the entry exists.
    fn entry_key(&mut self, namespace: &str, name: &str) -> ServiceKey {
        if let (Some(ns), Some(n)) = (self.strings.lookup(namespace), self.strings.lookup(name)) {
            let key = ServiceKey {
                namespace: ns,
                name: n,
            };
            if self.services.contains_key(&key) {
                return key;
            }
        }
        let key = ServiceKey {
            namespace: self.strings.intern(namespace),
            name: self.strings.intern(name),
        };
        self.services.insert(key, ServiceEntry::default());
        *self.namespaces.entry(key.namespace).or_default() += 1;
        key
    }

    fn index(&mut self, key: ServiceKey, ips: impl IntoIterator<Item = IpAddr>, add: bool) {
        for ip in ips {
            if add {
                self.reverse.add(ip, key);
            } else if !self.still_owns(key, ip) {
                self.reverse.remove(ip, key);
            }
        }
    }

    /// Whether the service still claims `ip` through what remains in its entry: slices
    /// overlap while the EndpointSlice controller moves endpoints between them.
    fn still_owns(&self, key: ServiceKey, ip: IpAddr) -> bool {
        self.services.get(&key).is_some_and(|entry| {
            entry
                .service
                .as_ref()
                .is_some_and(|s| s.cluster_ips.contains(&ip))
                || entry
                    .slices
                    .iter()
                    .filter(|s| s.headless)
                    .any(|s| s.endpoints().any(|e| e.addr == ip))
        })
    }

    fn index_service(&mut self, key: ServiceKey, service: &Service, add: bool) {
        self.index(key, service.cluster_ips.iter().copied(), add);
    }

    fn drop_entry_if_empty(&mut self, key: ServiceKey) {
        if let Some(entry) = self.services.get(&key)
            && entry.service.is_none()
            && entry.slices.is_empty()
        {
            self.services.remove(&key);
            if let Some(count) = self.namespaces.get_mut(&key.namespace) {
                *count -= 1;
                if *count == 0 {
                    self.namespaces.remove(&key.namespace);
                }
            }
            self.strings.release(key.namespace);
            self.strings.release(key.name);
        }
    }

    fn service_changed(&self, key: ServiceKey, changes: &mut ChangeSet) {
        changes.services.insert(ServiceName {
            namespace: self.strings.resolve(key.namespace).to_string(),
            name: self.strings.resolve(key.name).to_string(),
        });
    }

    fn upsert_service(
        &mut self,
        wire: wire::Service,
        changes: &mut ChangeSet,
        partly_invalid: &mut Option<InvalidObject>,
    ) -> Result<(), (Kind, InvalidObject)> {
        let namespace = wire.metadata.namespace.as_deref().unwrap_or_default();
        self.seen(Kind::Service, namespace, &wire.metadata.name);
        // An invalid update keeps the last good state: nothing is lost on bad input.
        let mut skipped = Vec::new();
        let service = decode::service(&wire, &mut self.strings, &mut skipped)
            .map_err(|e| (Kind::Service, e))?;
        if !skipped.is_empty() {
            *partly_invalid = Some(decode::partly_invalid("Service", &wire.metadata, &skipped));
        }
        self.put_service(namespace, &wire.metadata.name, service, changes);
        Ok(())
    }

    /// Stores a decoded service (its strings already interned), replacing the one before.
    fn put_service(
        &mut self,
        namespace: &str,
        name: &str,
        service: Service,
        changes: &mut ChangeSet,
    ) {
        let key = self.entry_key(namespace, name);
        let Some(entry) = self.services.get_mut(&key) else {
            return;
        };
        if entry.service.as_deref() == Some(&service) {
            service.release(&mut self.strings);
            return;
        }
        let cluster_ips = service.cluster_ips;
        let external: Vec<IpAddr> = service.external_addresses().collect();
        let mut old_external = Vec::new();
        if let Some(old) = entry.service.replace(Box::new(service)) {
            self.index_service(key, &old, false);
            old_external.extend(old.external_addresses());
            old.release(&mut self.strings);
        }
        self.index(key, cluster_ips.iter().copied(), true);
        self.index_external(key, &old_external, &external, changes);
        self.service_changed(key, changes);
        changes.service_updates += 1;
    }

    /// Moves the service `key`'s external claims from `old` to `new`, and marks every
    /// other service claiming one of them changed.
    fn index_external(
        &mut self,
        key: ServiceKey,
        old: &[IpAddr],
        new: &[IpAddr],
        changes: &mut ChangeSet,
    ) {
        for ip in old.iter().chain(new) {
            let others: Vec<ServiceKey> = self
                .external
                .owners(*ip)
                .filter(|other| *other != key)
                .collect();
            for other in others {
                self.service_changed(other, changes);
            }
        }
        for ip in old.iter().filter(|ip| !new.contains(ip)) {
            self.external.remove(*ip, key);
        }
        for ip in new {
            self.external.add(*ip, key);
        }
    }

    fn upsert_slice(
        &mut self,
        wire: wire::EndpointSlice,
        changes: &mut ChangeSet,
        partly_invalid: &mut Option<InvalidObject>,
    ) -> Result<(), (Kind, InvalidObject)> {
        let namespace = wire.metadata.namespace.as_deref().unwrap_or_default();
        let name = &wire.metadata.name;
        self.seen(Kind::EndpointSlice, namespace, name);
        let mut skipped = Vec::new();
        let decoded = decode::slice(&wire, &mut self.strings, &mut skipped)
            .map_err(|e| (Kind::EndpointSlice, e))?;
        if !skipped.is_empty() {
            *partly_invalid = Some(decode::partly_invalid(
                "EndpointSlice",
                &wire.metadata,
                &skipped,
            ));
        }
        let owner = wire
            .metadata
            .labels
            .service_name
            .as_deref()
            .unwrap_or_default();
        // A slice without a service label, or one nodus cannot use, is gone for the view.
        let slice = match decoded {
            Some(slice) if !owner.is_empty() => slice,
            unused => {
                if let Some(unused) = unused {
                    unused.release(&mut self.strings);
                }
                self.delete_slice(namespace, name, changes);
                return Ok(());
            }
        };
        if self.put_slice(namespace, owner, slice, changes)
            && let Some(millis) = wire
                .metadata
                .annotations
                .get(wire::ANNOTATION_LAST_CHANGE_TRIGGER_TIME)
                .and_then(wire::parse_rfc3339_millis)
            && changes.trigger_times.len() < TRIGGER_TIMES_MAX
        {
            changes.trigger_times.push(millis);
        }
        Ok(())
    }

    /// Stores a decoded slice of the service `namespace/owner`, replacing the one of the
    /// same name (moving it from another service if it belonged to one). Whether it changed.
    fn put_slice(
        &mut self,
        namespace: &str,
        owner: &str,
        slice: Slice,
        changes: &mut ChangeSet,
    ) -> bool {
        let key = self.entry_key(namespace, owner);
        let slice_key = SliceKey {
            namespace: key.namespace,
            name_hash: slice.name_hash,
        };
        match self.slice_owner.get(slice_key) {
            Some(previous) if previous == key.name => {}
            previous => {
                if previous.is_some() {
                    // The slice moved to another service: it leaves the old one first.
                    self.delete_slice_by_key(slice_key, changes);
                }
                self.strings.retain(key.namespace);
                self.strings.retain(key.name);
                self.slice_owner.insert(slice_key, key.name);
            }
        }
        let Some(entry) = self.services.get_mut(&key) else {
            return false;
        };
        let position = entry
            .slices
            .iter()
            .position(|s| s.name_hash == slice.name_hash);
        if let Some(i) = position
            && entry.slices[i] == slice
        {
            slice.release(&mut self.strings);
            return false;
        }
        let indexed = headless_addrs(&slice);
        let replaced = match position {
            Some(i) => Some(std::mem::replace(&mut entry.slices[i], slice)),
            None => {
                let mut slices = std::mem::take(&mut entry.slices).into_vec();
                slices.reserve_exact(1);
                slices.push(slice);
                entry.slices = slices.into_boxed_slice();
                None
            }
        };
        if let Some(old) = replaced {
            self.index(key, headless_addrs(&old), false);
            old.release(&mut self.strings);
        }
        self.index(key, indexed, true);
        self.service_changed(key, changes);
        changes.slice_updates += 1;
        true
    }

    fn upsert_node(
        &mut self,
        wire: wire::Node,
        changes: &mut ChangeSet,
    ) -> Result<(), (Kind, InvalidObject)> {
        self.seen(Kind::Node, "", &wire.metadata.name);
        let node = decode::node(&wire, &mut self.strings).map_err(|e| (Kind::Node, e))?;
        self.put_node(wire.metadata.name, node, changes);
        Ok(())
    }

    /// Stores a decoded Node, replacing the one before.
    fn put_node(&mut self, name: String, node: Node, changes: &mut ChangeSet) {
        let sym = self.strings.intern(&name);
        match self.nodes.entry(sym) {
            Entry::Occupied(mut stored) => {
                self.strings.release(sym);
                if *stored.get() == node {
                    node.release(&mut self.strings);
                    return;
                }
                stored.insert(node).release(&mut self.strings);
            }
            Entry::Vacant(slot) => {
                slot.insert(node);
            }
        }
        if sym == self.node_name {
            changes.this_node = true;
        }
        changes.nodes.insert(name);
    }

    fn upsert_service_cidr(
        &mut self,
        wire: wire::ServiceCidr,
        changes: &mut ChangeSet,
    ) -> Result<(), (Kind, InvalidObject)> {
        self.seen(Kind::ServiceCidr, "", &wire.metadata.name);
        let cidrs = decode::service_cidr(&wire).map_err(|e| (Kind::ServiceCidr, e))?;
        self.put_service_cidr(wire.metadata.name.into(), cidrs, changes);
        Ok(())
    }

    fn put_service_cidr(&mut self, name: Box<str>, cidrs: Box<[Cidr]>, changes: &mut ChangeSet) {
        if self.service_cidrs.get(&name) != Some(&cidrs) {
            self.service_cidrs.insert(name, cidrs);
            changes.service_cidrs = true;
        }
    }

    /// A pod of this node changes what DNS reads per question (`local_changed`); any pod
    /// may change what policies allow the pods `policy_pods` collects. A pod with more
    /// labels than nodus keeps is kept failing closed and reported (`partly_invalid`).
    fn upsert_pod(
        &mut self,
        wire: wire::Pod,
        local_changed: &mut bool,
        policy_pods: &mut Dirty,
        partly_invalid: &mut Option<InvalidObject>,
    ) -> Result<(), (Kind, InvalidObject)> {
        let namespace = wire.metadata.namespace.as_deref().unwrap_or_default();
        let key = object_hash(Kind::Pod, namespace, &wire.metadata.name);
        self.seen(Kind::Pod, namespace, &wire.metadata.name);
        let node_name = self.strings.resolve(self.node_name).to_string();
        let for_policy = policy::decode::pod(&wire, &node_name, &mut self.strings);
        if wire.metadata.labels.overflow {
            *partly_invalid = Some(policy::decode::over_label_cap("Pod", &wire.metadata));
        }
        let local = if wire.spec.node_name.as_deref() == Some(node_name.as_str()) {
            Some(decode::pod(&wire, &node_name, &mut self.strings))
        } else {
            None
        };
        // What the last version claimed is not trusted past a version that is wrong.
        let mut error = None;
        match for_policy {
            Ok(mut pod) => {
                // The addresses nodus-cni gave it stay until the status reports them, or
                // the pod ends.
                let ended = matches!(wire.status.phase.as_deref(), Some("Succeeded" | "Failed"))
                    || wire.spec.host_network == Some(true)
                    || !pod.local;
                let sandbox = self.policy.sandboxes.get(&key);
                if ended || sandbox.is_some_and(|ips| ips.iter().all(|ip| pod.ips.contains(ip))) {
                    self.policy.sandboxes.remove(&key);
                } else {
                    pod.ips = self.policy.addresses_with_sandbox(key, &pod.ips);
                }
                if pod.ips.is_empty() && !pod.local {
                    // No address: no selector can find it as a peer, and nothing of it is
                    // held (it comes again, labels and all, with its first address). A
                    // tenant's pending or gated pods cost the other nodes nothing; this
                    // node keeps its own, whose sandbox nodus-cni may claim.
                    pod.release_decoded(&mut self.strings);
                    self.policy.remove_pod(key, &mut self.strings, policy_pods);
                } else {
                    self.policy
                        .put_pod(key, pod, &mut self.strings, policy_pods);
                }
            }
            Err(e) => {
                error = Some(e);
                self.policy.remove_pod(key, &mut self.strings, policy_pods);
            }
        }
        match local {
            Some(Ok(pod)) => *local_changed |= self.pods.put(key, pod, &mut self.strings),
            Some(Err(e)) => {
                *local_changed |= self.pods.remove(key, &mut self.strings);
                error = Some(e);
            }
            None => *local_changed |= self.pods.remove(key, &mut self.strings),
        }
        error.map_or(Ok(()), |e| Err((Kind::Pod, e)))
    }

    /// A namespace with more labels than nodus keeps is kept failing closed and reported
    /// (`partly_invalid`).
    fn upsert_namespace(
        &mut self,
        wire: wire::Namespace,
        policy_pods: &mut Dirty,
        partly_invalid: &mut Option<InvalidObject>,
    ) -> Result<(), (Kind, InvalidObject)> {
        self.seen(Kind::Namespace, "", &wire.metadata.name);
        let labels = policy::decode::namespace(&wire, &mut self.strings);
        if labels.is_none() {
            *partly_invalid = Some(policy::decode::over_label_cap("Namespace", &wire.metadata));
        }
        let name = &wire.metadata.name;
        self.policy
            .put_namespace(name, labels, &mut self.strings, policy_pods);
        Ok(())
    }

    fn upsert_policy(
        &mut self,
        wire: wire::NetworkPolicy,
        policy_pods: &mut Dirty,
    ) -> Result<(), (Kind, InvalidObject)> {
        let namespace = wire.metadata.namespace.as_deref().unwrap_or_default();
        let key = object_hash(Kind::NetworkPolicy, namespace, &wire.metadata.name);
        self.seen(Kind::NetworkPolicy, namespace, &wire.metadata.name);
        match policy::decode::network_policy(&wire, &mut self.strings) {
            Ok(policy) => {
                self.policy
                    .put_policy(key, policy, &mut self.strings, policy_pods);
                Ok(())
            }
            Err(error) => {
                self.policy
                    .remove_policy(key, &mut self.strings, policy_pods);
                Err((Kind::NetworkPolicy, error))
            }
        }
    }

    /// nodus-cni gave pod `namespace/name` of this node `ips` (its new sandbox's):
    /// policies see it at them until its status reports them, so that it is isolated
    /// before its containers start. The pods whose verdicts that changes join `changes`.
    pub fn claim_sandbox(
        &mut self,
        namespace: &str,
        name: &str,
        ips: &[IpAddr],
        changes: &mut ChangeSet,
    ) -> Result<(), ClaimError> {
        let key = object_hash(Kind::Pod, namespace, name);
        self.policy
            .claim_sandbox(key, ips, &mut changes.policy_pods)
    }

    /// What NetworkPolicies allow each address of each pod of this node they select,
    /// sorted by pod key.
    pub fn pod_policies(&self) -> Vec<PodPolicy> {
        self.policy.resolve(None)
    }

    /// The NetworkPolicies that isolate a pod of this node in one direction, each with
    /// whether it allows `connection` (for `nodus proxy trace`).
    pub fn judge_policies(&self, connection: &Connection) -> Vec<Judgement> {
        self.policy.judge(connection, &self.strings)
    }

    /// Each policy pod's namespace and how many labels it keeps, sorted.
    #[cfg(test)]
    pub(crate) fn policy_pod_labels(&self) -> Vec<(String, usize)> {
        self.policy.pod_labels(&self.strings)
    }

    /// Distinct sets of pod labels stored.
    #[cfg(test)]
    pub(crate) fn policy_label_sets(&self) -> usize {
        self.policy.label_sets.len()
    }

    /// The NetworkPolicies (`namespace/name`, sorted) that isolate the pod of this node at
    /// `pod` in `direction`.
    pub fn isolating_policies(&self, pod: IpAddr, direction: Direction) -> Vec<String> {
        self.policy.isolating(pod, direction, &self.strings)
    }

    /// [`View::pod_policies`] of the pods `pods` names (by key): a pod that is gone, or
    /// that no policy selects, has none.
    pub fn pod_policies_of(&self, pods: &BTreeSet<u64>) -> Vec<PodPolicy> {
        self.policy.resolve(Some(pods))
    }

    fn delete(&mut self, kind: Kind, namespace: &str, name: &str, changes: &mut ChangeSet) {
        match kind {
            Kind::Service => self.delete_service(namespace, name, changes),
            Kind::EndpointSlice => self.delete_slice(namespace, name, changes),
            Kind::Node => self.delete_node(name, changes),
            Kind::ServiceCidr => {
                if self.service_cidrs.remove(name).is_some() {
                    changes.service_cidrs = true;
                }
            }
            Kind::Pod => {
                let key = object_hash(kind, namespace, name);
                self.pods.remove(key, &mut self.strings);
                self.policy
                    .remove_pod(key, &mut self.strings, &mut changes.policy_pods);
            }
            Kind::Namespace => {
                self.policy
                    .remove_namespace(name, &mut self.strings, &mut changes.policy_pods);
            }
            Kind::NetworkPolicy => {
                let key = object_hash(kind, namespace, name);
                self.policy
                    .remove_policy(key, &mut self.strings, &mut changes.policy_pods);
            }
            Kind::ConfigMap => self.set_dns_config_map(None, changes),
        }
    }

    fn set_dns_config_map(&mut self, map: Option<wire::DnsConfigMap>, changes: &mut ChangeSet) {
        if self.dns_config_map != map {
            self.dns_config_map = map;
            changes.dns_config_map = true;
        }
    }

    /// The cluster's DNS ConfigMap's upstreams and stub domains, if it is watched and
    /// exists.
    pub fn dns_config_map(&self) -> Option<&wire::DnsConfigMap> {
        self.dns_config_map.as_ref()
    }

    fn delete_service(&mut self, namespace: &str, name: &str, changes: &mut ChangeSet) {
        let (Some(ns), Some(n)) = (self.strings.lookup(namespace), self.strings.lookup(name))
        else {
            return;
        };
        self.remove_service(
            ServiceKey {
                namespace: ns,
                name: n,
            },
            changes,
        );
    }

    fn remove_service(&mut self, key: ServiceKey, changes: &mut ChangeSet) {
        let Some(old) = self.services.get_mut(&key).and_then(|e| e.service.take()) else {
            return;
        };
        self.index_service(key, &old, false);
        let old_external: Vec<IpAddr> = old.external_addresses().collect();
        self.index_external(key, &old_external, &[], changes);
        old.release(&mut self.strings);
        self.service_changed(key, changes);
        changes.service_updates += 1;
        self.drop_entry_if_empty(key);
    }

    fn delete_slice(&mut self, namespace: &str, name: &str, changes: &mut ChangeSet) {
        if let Some(ns) = self.strings.lookup(namespace) {
            let key = SliceKey {
                namespace: ns,
                name_hash: decode::hash_name(name),
            };
            self.delete_slice_by_key(key, changes);
        }
    }

    fn delete_slice_by_key(&mut self, slice_key: SliceKey, changes: &mut ChangeSet) {
        let Some(owner) = self.slice_owner.remove(slice_key) else {
            return;
        };
        let key = ServiceKey {
            namespace: slice_key.namespace,
            name: owner,
        };
        if let Some(entry) = self.services.get_mut(&key)
            && let Some(i) = entry
                .slices
                .iter()
                .position(|s| s.name_hash == slice_key.name_hash)
        {
            let mut slices = std::mem::take(&mut entry.slices).into_vec();
            let old = slices.swap_remove(i);
            entry.slices = slices.into_boxed_slice();
            self.index(key, headless_addrs(&old), false);
            old.release(&mut self.strings);
        }
        self.service_changed(key, changes);
        changes.slice_updates += 1;
        self.drop_entry_if_empty(key);
        // Released last: the owner map's references may be the last ones.
        self.strings.release(owner);
        self.strings.release(slice_key.namespace);
    }

    fn delete_node(&mut self, name: &str, changes: &mut ChangeSet) {
        let Some(sym) = self.strings.lookup(name) else {
            return;
        };
        let Some(old) = self.nodes.remove(&sym) else {
            return;
        };
        old.release(&mut self.strings);
        if sym == self.node_name {
            changes.this_node = true;
        }
        self.strings.release(sym);
        changes.nodes.insert(name.to_string());
    }

    fn finish_relist(&mut self, kind: Kind, changes: &mut ChangeSet) {
        let Some(seen) = self.relists[kind.index()].take() else {
            return;
        };
        match kind {
            Kind::Service => {
                let stale: Vec<ServiceKey> = self
                    .services
                    .iter()
                    .filter(|(k, e)| {
                        e.service.is_some()
                            && !seen.contains(&object_hash(
                                kind,
                                self.strings.resolve(k.namespace),
                                self.strings.resolve(k.name),
                            ))
                    })
                    .map(|(k, _)| *k)
                    .collect();
                for key in stale {
                    self.remove_service(key, changes);
                }
            }
            Kind::EndpointSlice => {
                let stale: Vec<SliceKey> = self
                    .slice_owner
                    .keys()
                    .filter(|k| {
                        !seen.contains(&slice_relist_hash(
                            self.strings.resolve(k.namespace),
                            k.name_hash,
                        ))
                    })
                    .collect();
                for key in stale {
                    self.delete_slice_by_key(key, changes);
                }
            }
            Kind::Node => {
                let stale: Vec<String> = self
                    .nodes
                    .keys()
                    .map(|k| self.strings.resolve(*k))
                    .filter(|name| !seen.contains(&object_hash(kind, "", name)))
                    .map(str::to_string)
                    .collect();
                for name in stale {
                    self.delete_node(&name, changes);
                }
            }
            Kind::ServiceCidr => {
                let before = self.service_cidrs.len();
                self.service_cidrs
                    .retain(|name, _| seen.contains(&object_hash(kind, "", name)));
                changes.service_cidrs |= self.service_cidrs.len() != before;
            }
            Kind::Pod => {
                self.pods.retain(&seen, &mut self.strings);
                self.policy
                    .retain_pods(&seen, &mut self.strings, &mut changes.policy_pods);
            }
            Kind::Namespace => {
                self.policy.retain_namespaces(
                    |name| seen.contains(&object_hash(kind, "", name)),
                    &mut self.strings,
                    &mut changes.policy_pods,
                );
            }
            Kind::NetworkPolicy => {
                self.policy
                    .retain_policies(&seen, &mut self.strings, &mut changes.policy_pods);
            }
            // One object at most, under the one name the watch selects.
            Kind::ConfigMap => {
                if seen.is_empty() {
                    self.set_dns_config_map(None, changes);
                }
            }
        }
    }
}

/// The key an update's object is reported under, if it names one.
fn update_key(update: &Update) -> Option<u64> {
    let (kind, meta) = match update {
        Update::Service(s) => (Kind::Service, &s.metadata),
        Update::EndpointSlice(s) => (Kind::EndpointSlice, &s.metadata),
        Update::Node(n) => (Kind::Node, &n.metadata),
        Update::ServiceCidr(c) => (Kind::ServiceCidr, &c.metadata),
        Update::Pod(p) => return Some(meta_key(Kind::Pod, &p.metadata)),
        Update::Namespace(n) => return Some(meta_key(Kind::Namespace, &n.metadata)),
        Update::NetworkPolicy(p) => (Kind::NetworkPolicy, &p.metadata),
        Update::ConfigMap(m) => (Kind::ConfigMap, &m.metadata),
        Update::Deleted {
            kind,
            namespace,
            name,
        } => return Some(object_hash(*kind, namespace, name)),
        Update::RelistStarted(_) | Update::RelistDone(_) => return None,
    };
    Some(meta_key(kind, meta))
}

fn meta_key<L>(kind: Kind, meta: &wire::Meta<L>) -> u64 {
    object_hash(
        kind,
        meta.namespace.as_deref().unwrap_or_default(),
        &meta.name,
    )
}

/// Slice names are not stored, so a relist records slices by `(namespace, name hash)`.
fn slice_relist_hash(namespace: &str, name_hash: u64) -> u64 {
    let mut h = DefaultHasher::new();
    (Kind::EndpointSlice.index(), namespace, name_hash).hash(&mut h);
    h.finish()
}

/// The addresses a slice puts in the reverse index: a headless service's endpoints.
fn headless_addrs(slice: &Slice) -> Vec<IpAddr> {
    if slice.headless {
        slice.endpoints().map(|e| e.addr).collect()
    } else {
        Vec::new()
    }
}

/// A service as the view holds it: its spec (absent while only slices are known) and slices.
#[derive(Clone, Copy)]
pub struct ServiceView<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub service: Option<&'a Service>,
    pub slices: &'a [Slice],
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_testbed::fixtures;

    fn service(ns: &str, name: &str, ip: &str) -> Update {
        let spec = serde_json::json!({"clusterIP": ip, "ports": [{"name": "http", "port": 80}]});
        let service = fixtures::service(ns, name, spec);
        Update::Service(serde_json::from_value(service).expect("test service"))
    }

    fn slice(ns: &str, name: &str, svc: &str, ips: &[&str], node: &str) -> Update {
        let zone = serde_json::json!({"zone": "z1"});
        let endpoints = ips
            .iter()
            .map(|ip| fixtures::endpoint(ip, node, zone.clone()))
            .collect();
        let ports = serde_json::json!([{"name": "http", "port": 8080}]);
        let slice = fixtures::slice(ns, name, svc, "IPv4", endpoints, ports);
        Update::EndpointSlice(serde_json::from_value(slice).expect("test slice"))
    }

    fn deleted(kind: Kind, ns: &str, name: &str) -> Update {
        Update::Deleted {
            kind,
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn names(changes: &ChangeSet) -> Vec<String> {
        changes
            .services
            .iter()
            .map(|s| format!("{}/{}", s.namespace, s.name))
            .collect()
    }

    #[test]
    fn change_sets_name_touched_services_only() {
        let mut view = View::new("node-a");
        let report = view.apply([
            service("default", "web", "10.0.0.1"),
            service("default", "db", "10.0.0.2"),
            slice("default", "web-1", "web", &["10.1.0.1"], "node-a"),
        ]);
        assert_eq!(names(&report.changes), ["default/db", "default/web"]);
        let report = view.apply([slice("default", "web-1", "web", &["10.1.0.2"], "node-a")]);
        assert_eq!(names(&report.changes), ["default/web"]);
    }

    fn service_cidr(name: &str, cidrs: &[&str]) -> Update {
        Update::ServiceCidr(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"cidrs": cidrs}
            }))
            .expect("test service cidr"),
        )
    }

    /// Checklist C.25: the ranges of every ServiceCIDR, a change reported once, and a
    /// malformed version keeping the last good one.
    #[test]
    fn c25_service_cidrs_are_held_by_name() {
        let mut view = View::new("node-a");
        let cidr = |text: &str| text.parse::<Cidr>().expect("cidr");
        let report = view.apply([
            service_cidr("kubernetes", &["10.96.0.0/16", "fd00:96::/112"]),
            service_cidr("extra", &["10.96.0.0/16"]),
        ]);
        assert!(report.changes.service_cidrs && !report.changes.is_empty());
        assert_eq!(
            view.service_cidrs(),
            [cidr("10.96.0.0/16"), cidr("fd00:96::/112")]
        );
        let report = view.apply([service_cidr("extra", &["10.96.0.0/16"])]);
        assert!(report.changes.is_empty(), "nothing changed");
        for bad in [
            &["10.97.0.0/33"][..],
            &["10.97.0.0/24", "10.98.0.0/24"],
            &["10.97.0.0/24", "fd00::/64", "fd01::/64"],
        ] {
            let report = view.apply([service_cidr("extra", bad)]);
            assert_eq!(report.invalid.len(), 1, "{bad:?}");
            assert_eq!(report.skipped, [Kind::ServiceCidr]);
            assert!(!report.changes.service_cidrs, "{bad:?}");
        }
        let report = view.apply([service_cidr("extra", &["10.97.0.0/24"])]);
        assert!(report.changes.service_cidrs);
        assert_eq!(view.service_cidrs().len(), 3);
        let report = view.apply([deleted(Kind::ServiceCidr, "", "kubernetes")]);
        assert!(report.changes.service_cidrs);
        assert_eq!(view.service_cidrs(), [cidr("10.97.0.0/24")]);
        let report = view.apply([
            Update::RelistStarted(Kind::ServiceCidr),
            service_cidr("kubernetes", &["10.96.0.0/16"]),
            Update::RelistDone(Kind::ServiceCidr),
        ]);
        assert!(report.changes.service_cidrs);
        assert_eq!(
            view.service_cidrs(),
            [cidr("10.96.0.0/16")],
            "extra is swept"
        );
    }

    /// Checklist A.10: an update that changes nothing triggers nothing.
    #[test]
    fn a10_no_op_updates_are_dropped() {
        let mut view = View::new("node-a");
        view.apply([
            service("default", "web", "10.0.0.1"),
            slice("default", "web-1", "web", &["10.1.0.1"], "node-a"),
        ]);
        let report = view.apply([
            service("default", "web", "10.0.0.1"),
            slice("default", "web-1", "web", &["10.1.0.1"], "node-a"),
        ]);
        assert!(report.changes.is_empty());
    }

    #[test]
    fn invalid_object_is_skipped_reported_once_and_keeps_last_good_state() {
        let mut view = View::new("node-a");
        view.apply([service("default", "web", "10.0.0.1")]);
        let report = view.apply([
            service("default", "web", "not-an-ip"),
            service("default", "ok", "10.0.0.9"),
        ]);
        assert_eq!(report.invalid.len(), 1);
        assert_eq!(report.invalid[0].object, "default/web");
        assert_eq!(names(&report.changes), ["default/ok"]);
        let web = view.service("default", "web").expect("kept");
        assert_eq!(
            web.service.expect("spec").cluster_ips[0].to_string(),
            "10.0.0.1"
        );
        let again = view.apply([service("default", "web", "not-an-ip")]);
        assert!(again.invalid.is_empty(), "reported once");
        assert_eq!(again.skipped, [Kind::Service]);
        // Fixed, then broken again: reported again.
        view.apply([service("default", "web", "10.0.0.1")]);
        let broken = view.apply([service("default", "web", "not-an-ip")]);
        assert_eq!(broken.invalid.len(), 1);
    }

    #[test]
    fn relist_sweeps_only_what_it_did_not_deliver() {
        let mut view = View::new("node-a");
        view.apply([
            service("default", "web", "10.0.0.1"),
            service("default", "gone", "10.0.0.2"),
            slice("default", "web-1", "web", &["10.1.0.1"], "node-a"),
            slice("default", "gone-1", "gone", &["10.1.0.2"], "node-a"),
        ]);
        let report = view.apply([
            Update::RelistStarted(Kind::Service),
            service("default", "web", "10.0.0.1"),
        ]);
        assert!(report.changes.is_empty());
        assert!(
            view.service("default", "gone").is_some(),
            "kept during the relist"
        );
        let report = view.apply([Update::RelistDone(Kind::Service)]);
        assert_eq!(names(&report.changes), ["default/gone"]);
        assert!(
            view.service("default", "gone")
                .expect("slices remain")
                .service
                .is_none()
        );

        view.apply([
            Update::RelistStarted(Kind::EndpointSlice),
            slice("default", "web-1", "web", &["10.1.0.1"], "node-a"),
            Update::RelistDone(Kind::EndpointSlice),
        ]);
        assert!(view.service("default", "gone").is_none());
        assert_eq!(view.counts().endpoint_slices, 1);
    }

    #[test]
    fn slice_moving_between_services() {
        let mut view = View::new("node-a");
        view.apply([slice("default", "s-1", "a", &["10.1.0.1"], "node-a")]);
        let report = view.apply([slice("default", "s-1", "b", &["10.1.0.1"], "node-a")]);
        assert_eq!(names(&report.changes), ["default/a", "default/b"]);
        assert!(view.service("default", "a").is_none());
        assert_eq!(view.service("default", "b").expect("moved").slices.len(), 1);
    }

    #[test]
    fn a_change_to_a_service_re_plans_the_others_that_claim_its_external_addresses() {
        let mut view = View::new("node-a");
        let claim = |name: &str, external: &[&str], created: &str| {
            Update::Service(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
                    "spec": {"clusterIP": "10.96.0.1", "externalIPs": external,
                             "ports": [{"port": 80, "protocol": "TCP"}]}
                }))
                .expect("test service"),
            )
        };
        view.apply([
            claim("a", &["192.0.2.1"], "2020-01-01T00:00:00Z"),
            claim("b", &["192.0.2.1", "192.0.2.2"], "2021-01-01T00:00:00Z"),
            claim("c", &["192.0.2.3"], "2022-01-01T00:00:00Z"),
        ]);
        let claimants = |view: &View, ip: &str| -> Vec<String> {
            let mut names: Vec<String> = view
                .external_claimants(ip.parse().expect("ip"))
                .map(|s| s.name.to_string())
                .collect();
            names.sort();
            names
        };
        assert_eq!(claimants(&view, "192.0.2.1"), ["a", "b"]);
        let report = view.apply([claim("a", &["192.0.2.2"], "2020-01-01T00:00:00Z")]);
        assert_eq!(names(&report.changes), ["default/a", "default/b"]);
        assert_eq!(claimants(&view, "192.0.2.1"), ["b"]);
        let a = view.service("default", "a").expect("a");
        let b = view.service("default", "b").expect("b");
        let (a_spec, b_spec) = (a.service.expect("spec"), b.service.expect("spec"));
        assert!(
            a_spec.claim_rank(a.namespace, a.name) < b_spec.claim_rank(b.namespace, b.name),
            "the older ranks first"
        );
        let report = view.apply([Update::Deleted {
            kind: Kind::Service,
            namespace: "default".into(),
            name: "b".into(),
        }]);
        assert_eq!(names(&report.changes), ["default/a", "default/b"]);
        assert_eq!(claimants(&view, "192.0.2.2"), ["a"]);
    }

    #[test]
    fn a_changed_slice_brings_its_trigger_time_and_counts_as_an_endpoint_change() {
        let mut view = View::new("node-a");
        let slice = |ip: &str| {
            Update::EndpointSlice(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "web-1", "namespace": "default",
                                 "labels": {"kubernetes.io/service-name": "web"},
                                 "annotations": {"endpoints.kubernetes.io/last-change-trigger-time":
                                                 "2024-02-29T12:34:56.250Z"}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [ip]}],
                    "ports": [{"port": 80}]
                }))
                .expect("test slice"),
            )
        };
        let report = view.apply([slice("10.1.0.1")]);
        assert_eq!(report.changes.trigger_times, [1_709_210_096_250]);
        assert_eq!(
            (report.changes.slice_updates, report.changes.service_updates),
            (1, 0)
        );
        // The same slice again changes nothing, and brings no time.
        let report = view.apply([slice("10.1.0.1")]);
        assert!(report.changes.trigger_times.is_empty());
        assert_eq!(report.changes.slice_updates, 0);
    }

    #[test]
    fn this_node_changes_are_flagged() {
        let mut view = View::new("node-a");
        let node = |name: &str, zone: &str| {
            Update::Node(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}}
                }))
                .expect("test node"),
            )
        };
        assert!(!view.apply([node("node-b", "z1")]).changes.this_node);
        assert!(view.apply([node("node-a", "z1")]).changes.this_node);
        assert_eq!(view.strings().resolve(view.node_context().zone), "z1");
        assert!(view.apply([node("node-a", "z2")]).changes.this_node);
        assert!(!view.apply([node("node-a", "z2")]).changes.this_node);
    }

    #[test]
    fn addresses_lead_back_to_their_services() {
        let mut view = View::new("node-a");
        let owners = |view: &View, ip: &str| -> Vec<String> {
            view.services_by_ip(ip.parse().expect("ip"))
                .map(|s| s.name.to_string())
                .collect()
        };
        let mut headless = slice("default", "db-1", "db", &["10.1.0.7"], "node-a");
        if let Update::EndpointSlice(s) = &mut headless {
            s.metadata.labels.headless = true;
        }
        view.apply([
            service("default", "web", "10.0.0.1"),
            slice("default", "web-1", "web", &["10.1.0.1"], "node-a"),
            headless,
        ]);
        assert_eq!(owners(&view, "10.0.0.1"), ["web"]);
        assert_eq!(owners(&view, "10.1.0.7"), ["db"]);
        assert!(
            owners(&view, "10.1.0.1").is_empty(),
            "only headless endpoints are indexed"
        );
        assert!(view.has_namespace("default") && !view.has_namespace("other"));

        // An address in two slices of a service stays indexed until both let go of it.
        let mut second = slice("default", "db-2", "db", &["10.1.0.7"], "node-a");
        if let Update::EndpointSlice(s) = &mut second {
            s.metadata.labels.headless = true;
        }
        view.apply([second]);
        view.apply([deleted(Kind::EndpointSlice, "default", "db-2")]);
        assert_eq!(owners(&view, "10.1.0.7"), ["db"]);

        view.apply([service("default", "web", "10.0.0.2")]);
        assert!(owners(&view, "10.0.0.1").is_empty());
        assert_eq!(owners(&view, "10.0.0.2"), ["web"]);
        view.apply([
            deleted(Kind::Service, "default", "web"),
            deleted(Kind::EndpointSlice, "default", "web-1"),
            deleted(Kind::EndpointSlice, "default", "db-1"),
        ]);
        assert!(owners(&view, "10.0.0.2").is_empty() && owners(&view, "10.1.0.7").is_empty());
        assert!(!view.has_namespace("default"));
        // With Namespaces watched (NetworkPolicy on), one without services exists too:
        // `<ns>.svc` answers NODATA for it, as CoreDNS does, not NXDOMAIN.
        let namespace = serde_json::json!({"metadata": {"name": "default"}});
        view.apply([Update::Namespace(Box::new(
            serde_json::from_value(namespace).expect("namespace"),
        ))]);
        assert!(view.has_namespace("default"));
    }

    /// Churn must not leak strings: once everything is deleted only the node name remains.
    #[test]
    fn deleting_everything_frees_every_string() {
        let mut view = View::new("node-a");
        for round in 0..3 {
            let ns = format!("ns-{round}");
            view.apply([
                service(&ns, "web", "10.0.0.1"),
                slice(&ns, "web-1", "web", &["10.1.0.1", "10.1.0.2"], "node-b"),
                slice(&ns, "orphan-1", "orphan", &["10.1.0.3"], "node-c"),
            ]);
            view.apply([slice(&ns, "web-1", "web", &["10.1.0.4"], "node-d")]);
            view.apply([
                deleted(Kind::Service, &ns, "web"),
                deleted(Kind::EndpointSlice, &ns, "web-1"),
                deleted(Kind::EndpointSlice, &ns, "orphan-1"),
            ]);
        }
        assert_eq!(
            view.counts(),
            Counts {
                strings: 1,
                ..Counts::default()
            }
        );
        assert_eq!(view.strings().len(), 1);
    }

    fn pod(ns: &str, name: &str, node: &str, ips: &[&str], spec: serde_json::Value) -> Update {
        let mut spec = spec;
        spec["nodeName"] = node.into();
        let ips: Vec<_> = ips.iter().map(|ip| serde_json::json!({"ip": ip})).collect();
        Update::Pod(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": ns},
                "spec": spec,
                "status": {"phase": "Running", "podIPs": ips}
            }))
            .expect("test pod"),
        )
    }

    /// A pod without an address is held only on its own node (where nodus-cni may claim
    /// its sandbox): another node keeps nothing of it, labels included, until it has one.
    #[test]
    fn pods_without_an_address_are_held_only_by_their_node() {
        let labelled = |name: &str, node: Option<&str>, ips: &[&str]| {
            let ips: Vec<_> = ips.iter().map(|ip| serde_json::json!({"ip": ip})).collect();
            Update::Pod(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "namespace": "tenant",
                                 "labels": {format!("{name}-key"): format!("{name}-value")}},
                    "spec": {"nodeName": node, "schedulingGates": [{"name": "hold"}]},
                    "status": {"phase": "Pending", "podIPs": ips}
                }))
                .expect("test pod"),
            )
        };
        let mut view = View::new("node-a");
        view.apply([
            labelled("gated", None, &[]),
            labelled("pending-b", Some("node-b"), &[]),
            labelled("pending-a", Some("node-a"), &[]),
        ]);
        assert_eq!(view.counts().policy_pods, 1, "this node's own pending pod");
        for gone in ["gated-value", "pending-b-value"] {
            assert!(view.strings().lookup(gone).is_none(), "{gone} is not held");
        }
        assert!(view.strings().lookup("pending-a-value").is_some());
        // With an address it is a peer like any other, and without one again, gone.
        view.apply([labelled("pending-b", Some("node-b"), &["10.244.1.9"])]);
        assert_eq!(view.counts().policy_pods, 2);
        view.apply([labelled("pending-b", Some("node-b"), &[])]);
        assert_eq!(view.counts().policy_pods, 1);
        assert!(view.strings().lookup("pending-b-value").is_none());
    }

    fn asker(view: &View, ip: &str) -> Option<(String, bool)> {
        let ip: IpAddr = ip.parse().expect("ip");
        view.local_pod(ip)
            .map(|p| (p.namespace.to_string(), p.pod.cluster_search))
    }

    #[test]
    fn this_nodes_pods_are_found_by_their_addresses_with_their_search_list() {
        let mut view = View::new("node-a");
        let none = serde_json::json!({});
        let report = view.apply([
            pod(
                "shop",
                "web-0",
                "node-a",
                &["10.244.0.5", "fd00::5"],
                none.clone(),
            ),
            pod(
                "shop",
                "own",
                "node-a",
                &["10.244.0.6"],
                serde_json::json!({"dnsConfig": {"searches": ["corp.example"]}}),
            ),
            pod(
                "shop",
                "plain",
                "node-a",
                &["10.244.0.7"],
                serde_json::json!({"dnsPolicy": "Default"}),
            ),
            pod(
                "kube-system",
                "agent",
                "node-a",
                &["192.168.1.10"],
                serde_json::json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}),
            ),
            pod("shop", "elsewhere", "node-b", &["10.244.1.5"], none.clone()),
            pod("shop", "bad", "node-a", &["10.244.0.300"], none.clone()),
            pod("shop", "lo", "node-a", &["127.0.0.1"], none.clone()),
        ]);
        let skipped: Vec<&str> = report.invalid.iter().map(|e| e.object.as_str()).collect();
        // Another node's pod is kept for policies only.
        assert_eq!(skipped, ["shop/bad", "shop/lo"]);
        assert_eq!(asker(&view, "10.244.0.5"), Some(("shop".into(), true)));
        assert_eq!(asker(&view, "fd00::5"), Some(("shop".into(), true)));
        assert_eq!(asker(&view, "10.244.0.6"), Some(("shop".into(), false)));
        assert_eq!(asker(&view, "10.244.0.7"), Some(("shop".into(), false)));
        // A host-network pod sends from the node's address: it is not told by it.
        assert_eq!(asker(&view, "192.168.1.10"), None);
        assert_eq!(asker(&view, "10.244.1.5"), None);
        assert_eq!(view.counts().pods, 4);
        assert!(report.changes.is_empty(), "pods re-plan nothing");

        // The address passes from an ended pod to a new one of another namespace.
        let ended = serde_json::json!({"metadata": {"name": "web-0", "namespace": "shop"},
            "spec": {"nodeName": "node-a"},
            "status": {"phase": "Succeeded", "podIPs": [{"ip": "10.244.0.5"}]}});
        view.apply([
            Update::Pod(serde_json::from_value(ended).expect("pod")),
            pod("blog", "api-0", "node-a", &["10.244.0.5"], none.clone()),
        ]);
        assert_eq!(asker(&view, "10.244.0.5"), Some(("blog".into(), true)));
        assert_eq!(
            asker(&view, "fd00::5"),
            None,
            "an ended pod holds no address"
        );
        // Two live pods claim one address: neither is trusted.
        view.apply([pod(
            "shop",
            "clash",
            "node-a",
            &["10.244.0.5"],
            none.clone(),
        )]);
        assert_eq!(asker(&view, "10.244.0.5"), None);
        view.apply([deleted(Kind::Pod, "shop", "clash")]);
        assert_eq!(asker(&view, "10.244.0.5"), Some(("blog".into(), true)));

        // A relist that delivers one pod sweeps the others, and their strings.
        view.apply([
            Update::RelistStarted(Kind::Pod),
            pod("blog", "api-0", "node-a", &["10.244.0.9"], none),
            Update::RelistDone(Kind::Pod),
        ]);
        assert_eq!(asker(&view, "10.244.0.5"), None);
        assert_eq!(asker(&view, "10.244.0.9"), Some(("blog".into(), true)));
        assert_eq!(view.counts().pods, 1);
        view.apply([deleted(Kind::Pod, "blog", "api-0")]);
        assert_eq!(view.counts().pods, 0);
        assert_eq!(view.strings().len(), 1, "only the node's own name is left");
    }
}
