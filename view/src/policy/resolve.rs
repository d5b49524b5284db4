//! What the policies allow each pod of this node, per address: for each direction a
//! policy governs, whether the pod is isolated and the traffic allowed, as peer address
//! ranges with protocols and port ranges. Named ports are resolved here, against the pod
//! that receives (the local pod for ingress, each peer for egress). Pure code: the proxy
//! turns the answer into nftables sets.

use super::store::PolicyState;
use super::{NetworkPolicy, Peer, PolicyPod, PolicyRule, PortRef, Selector};
use crate::intern::{Interner, Sym};
use crate::model::{Family, Protocol};
use crate::ranges::{from_number, merge_ranges};
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

/// Traffic one rule allows: from or to `peer` (inclusive), over `protocol` (any when
/// `None`) to a destination port in `ports` (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Allowance {
    pub peer: (IpAddr, IpAddr),
    pub protocol: Option<Protocol>,
    pub ports: (u16, u16),
}

/// One address of a pod of this node and what policies allow it. `None`: no policy
/// governs that direction, everything passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPolicy {
    /// The pod's key, as [`crate::ChangeSet::policy_pods`] names it.
    pub pod: u64,
    pub ip: IpAddr,
    pub ingress: Option<Vec<Allowance>>,
    pub egress: Option<Vec<Allowance>>,
    /// The directions whose policies allow more than [`ALLOWANCES_MAX`]: they allow
    /// nothing there (failing closed), and the pod is reported.
    pub over_cap: Vec<Direction>,
}

impl PodPolicy {
    /// What is allowed in `direction`; `None` when no policy governs it.
    pub fn allowed(&self, direction: Direction) -> Option<&[Allowance]> {
        match direction {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    /// Its name as policies spell it, in lower case: `ingress` or `egress`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl NetworkPolicy {
    /// Its rules for `direction`; `None` when it does not govern that direction.
    fn rules(&self, direction: Direction) -> Option<&[PolicyRule]> {
        match direction {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }

    /// `namespace/name`.
    fn full_name(&self, strings: &Interner) -> String {
        format!(
            "{}/{}",
            strings.resolve(self.namespace),
            strings.resolve(self.name)
        )
    }

    /// Whether it isolates `pod`: a pod of this node with an address, in its namespace,
    /// that its pod selector matches, or whose labels are not known (failing closed: such
    /// a pod is isolated by every policy of its namespace and allowed nothing).
    pub(super) fn selects(&self, pod: &PolicyPod) -> bool {
        pod.local
            && !pod.ips.is_empty()
            && pod.namespace == self.namespace
            && pod.labels.as_deref().is_none_or(|l| self.pods.matches(l))
    }

    /// Whether what it allows depends on `pod`, whose namespace has `namespace_labels`:
    /// the pod is a peer of one of its rules, or may be (an egress rule open to everyone
    /// on a named port resolves the name on every pod).
    pub(super) fn depends_on(
        &self,
        pod: &PolicyPod,
        namespace_labels: Option<&[(Sym, Sym)]>,
    ) -> bool {
        if pod.ips.is_empty() {
            return false;
        }
        Direction::ALL.into_iter().any(|direction| {
            self.rules(direction).into_iter().flatten().any(|rule| {
                if rule.peers.is_empty() {
                    return direction == Direction::Egress
                        && rule
                            .ports
                            .iter()
                            .any(|port| matches!(port.port, PortRef::Named(_)));
                }
                rule.peers.iter().any(|peer| match peer {
                    Peer::Block(_) => false,
                    Peer::Pods { namespaces, pods } => {
                        self.in_namespaces(namespaces.as_ref(), pod.namespace, namespace_labels)
                            && pod.matched_by(pods)
                    }
                })
            })
        })
    }

    /// The peers of all its rules.
    fn all_peers(&self) -> impl Iterator<Item = &Peer> {
        Direction::ALL
            .into_iter()
            .flat_map(|direction| self.rules(direction).into_iter().flatten())
            .flat_map(|rule| rule.peers.iter())
    }

    /// Whether it selects peers by namespace labels that `labels` match.
    pub(super) fn selects_namespace(&self, labels: &[(Sym, Sym)]) -> bool {
        self.all_peers().any(|peer| {
            matches!(peer, Peer::Pods { namespaces: Some(selector), .. }
                if selector.matches(labels))
        })
    }

    /// Whether a pod of namespace `namespace` (labelled `labels`, `None` when not known:
    /// then only the empty selector matches) is in the namespaces a peer names: those
    /// `namespaces` matches, or the policy's own when `None`.
    fn in_namespaces(
        &self,
        namespaces: Option<&Selector>,
        namespace: Sym,
        labels: Option<&[(Sym, Sym)]>,
    ) -> bool {
        match namespaces {
            None => namespace == self.namespace,
            Some(selector) => labels.map_or(selector.is_empty(), |l| selector.matches(l)),
        }
    }
}

/// What the policies that select one pod allow it so far, by [`Direction::index`].
type Governed = [Option<Vec<Allowance>>; 2];

/// The peers of one rule.
enum Peers<'a> {
    Everyone,
    Some {
        pods: Vec<&'a PolicyPod>,
        blocks: Vec<(IpAddr, IpAddr)>,
    },
}

impl PolicyState {
    /// A namespace's labels; `None` when it is not known or has more labels than nodus
    /// keeps (then no namespace selector matches it).
    pub(super) fn namespace_labels(&self, namespace: Sym) -> Option<&[(Sym, Sym)]> {
        self.namespaces.get(&namespace)?.as_deref()
    }

    fn peers<'a>(&'a self, policy: &NetworkPolicy, rule: &PolicyRule) -> Peers<'a> {
        if rule.peers.is_empty() {
            return Peers::Everyone;
        }
        let mut pods = Vec::new();
        let mut blocks = Vec::new();
        for peer in rule.peers.iter() {
            match peer {
                Peer::Block(ranges) => blocks.extend_from_slice(ranges),
                Peer::Pods {
                    namespaces,
                    pods: selector,
                } => pods.extend(
                    self.pods
                        .values()
                        .filter(|pod| !pod.ips.is_empty())
                        .filter(|pod| {
                            policy.in_namespaces(
                                namespaces.as_ref(),
                                pod.namespace,
                                self.namespace_labels(pod.namespace),
                            )
                        })
                        .filter(|pod| pod.matched_by(selector)),
                ),
            }
        }
        Peers::Some { pods, blocks }
    }

    /// What the policies allow each address of each pod of this node that some policy
    /// selects, of the pods `only` names (by key) or all of them; a pod no policy selects
    /// is not listed. The peers of a rule are found once, whatever the number of pods it
    /// applies to.
    pub(crate) fn resolve(&self, only: Option<&BTreeSet<u64>>) -> Vec<PodPolicy> {
        let local: Vec<(u64, &PolicyPod)> = match only {
            None => self
                .local
                .iter()
                .filter_map(|key| Some((*key, self.pods.get(key)?)))
                .collect(),
            Some(keys) => keys
                .iter()
                .filter(|key| self.local.contains(key))
                .filter_map(|key| Some((*key, self.pods.get(key)?)))
                .collect(),
        };
        let mut governed: Vec<Option<Governed>> = vec![None; local.len()];
        for policy in self.policies.values() {
            let selected: Vec<usize> = (0..local.len())
                .filter(|&i| policy.selects(local[i].1))
                .collect();
            if selected.is_empty() {
                continue;
            }
            for direction in Direction::ALL {
                let Some(rules) = policy.rules(direction) else {
                    continue;
                };
                let peers: Vec<Peers<'_>> =
                    rules.iter().map(|rule| self.peers(policy, rule)).collect();
                for &i in &selected {
                    let entry = governed[i].get_or_insert_with(Governed::default);
                    let allowed = entry[direction.index()].get_or_insert_with(Vec::new);
                    if local[i].1.labels.is_none() {
                        continue; // failing closed
                    }
                    for (rule, peers) in rules.iter().zip(&peers) {
                        allow(direction, local[i].1, rule, peers, self, allowed);
                    }
                }
            }
        }
        let mut resolved = Vec::new();
        for ((key, pod), entry) in local.iter().zip(governed) {
            let Some(mut entry) = entry else { continue };
            let mut over_cap = Vec::new();
            for direction in Direction::ALL {
                if let Some(allowed) = &mut entry[direction.index()]
                    && allowed.len() > ALLOWANCES_MAX
                {
                    *allowed = Vec::new();
                    over_cap.push(direction);
                }
            }
            for &ip in pod.ips.iter() {
                let [ingress, egress] = &entry;
                resolved.push(PodPolicy {
                    pod: *key,
                    ip,
                    ingress: of_family(ingress, Family::of(ip)),
                    egress: of_family(egress, Family::of(ip)),
                    over_cap: over_cap.clone(),
                });
            }
        }
        self.close_shared_addresses(only, &mut resolved);
        resolved.sort_unstable_by_key(|p| (p.pod, p.ip));
        resolved
    }

    /// Of an address that several pods of this node claim (one reused while the old
    /// pod's object is still there), the kernel can hold one verdict: it is listed once,
    /// under the lowest key of those pods, failing closed (allowed nothing but itself) in
    /// every direction a policy governs any of them; never under the others, whose
    /// elements would otherwise overlap or be removed with them.
    fn close_shared_addresses(&self, only: Option<&BTreeSet<u64>>, resolved: &mut Vec<PodPolicy>) {
        let mut claims: HashMap<IpAddr, Vec<u64>> = HashMap::new();
        for key in &self.local {
            for &ip in self
                .pods
                .get(key)
                .into_iter()
                .flat_map(|pod| pod.ips.iter())
            {
                claims.entry(ip).or_default().push(*key);
            }
        }
        claims.retain(|_, keys| keys.len() > 1);
        if claims.is_empty() {
            return;
        }
        resolved.retain(|p| !claims.contains_key(&p.ip));
        for (ip, keys) in claims {
            let owner = keys.iter().copied().min().unwrap_or_default();
            if only.is_some_and(|only| !only.contains(&owner)) {
                continue;
            }
            let governs = |direction: Direction| {
                let sharers = keys.iter().filter_map(|key| self.pods.get(key));
                let mut pairs =
                    sharers.flat_map(|pod| self.policies.values().map(move |p| (p, pod)));
                pairs.any(|(policy, pod)| policy.selects(pod) && policy.rules(direction).is_some())
            };
            let closed = |direction| governs(direction).then(Vec::new);
            let (ingress, egress) = (closed(Direction::Ingress), closed(Direction::Egress));
            if ingress.is_some() || egress.is_some() {
                resolved.push(PodPolicy {
                    pod: owner,
                    ip,
                    ingress,
                    egress,
                    over_cap: Vec::new(),
                });
            }
        }
    }
}

/// How one policy that isolates a pod judges one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    /// `namespace/name`.
    pub policy: String,
    pub allows: bool,
}

/// One connection as a pod of this node sees it in one direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    pub direction: Direction,
    /// The pod of this node: the destination for ingress, the source for egress.
    pub pod: IpAddr,
    pub peer: IpAddr,
    pub protocol: Protocol,
    /// The destination port.
    pub port: u16,
}

impl Allowance {
    fn admits(&self, connection: &Connection) -> bool {
        Family::of(self.peer.0) == Family::of(connection.peer)
            && (self.peer.0..=self.peer.1).contains(&connection.peer)
            && self.protocol.is_none_or(|p| p == connection.protocol)
            && (self.ports.0..=self.ports.1).contains(&connection.port)
    }
}

impl PolicyState {
    /// The pod of this node at `ip`, and the policies that isolate it in `direction`.
    fn isolating_policies(
        &self,
        ip: IpAddr,
        direction: Direction,
    ) -> Option<(&PolicyPod, impl Iterator<Item = &NetworkPolicy>)> {
        let pod = self
            .local
            .iter()
            .filter_map(|key| self.pods.get(key))
            .find(|pod| pod.ips.contains(&ip))?;
        let policies = self
            .policies
            .values()
            .filter(move |policy| policy.selects(pod) && policy.rules(direction).is_some());
        Some((pod, policies))
    }

    /// The names (`namespace/name`, sorted) of the policies that isolate the pod of this
    /// node at `ip` in `direction`.
    pub(crate) fn isolating(
        &self,
        ip: IpAddr,
        direction: Direction,
        strings: &Interner,
    ) -> Vec<String> {
        let mut names: Vec<String> = self
            .isolating_policies(ip, direction)
            .into_iter()
            .flat_map(|(_, policies)| policies)
            .map(|policy| policy.full_name(strings))
            .collect();
        names.sort_unstable();
        names
    }

    /// The policies that isolate `connection.pod` in its direction, each with whether it
    /// allows the connection, by name; empty when none does (everything passes).
    pub(crate) fn judge(&self, connection: &Connection, strings: &Interner) -> Vec<Judgement> {
        let Some((pod, policies)) = self.isolating_policies(connection.pod, connection.direction)
        else {
            return Vec::new();
        };
        let mut judged: Vec<Judgement> = policies
            .map(|policy| {
                let mut allowed = Vec::new();
                let rules = policy.rules(connection.direction).into_iter().flatten();
                // A pod whose labels are not known is allowed nothing.
                for rule in rules.take_while(|_| pod.labels.is_some()) {
                    let peers = self.peers(policy, rule);
                    allow(connection.direction, pod, rule, &peers, self, &mut allowed);
                }
                Judgement {
                    policy: policy.full_name(strings),
                    allows: allowed.iter().any(|a| a.admits(connection)),
                }
            })
            .collect();
        judged.sort_unstable_by(|a, b| a.policy.cmp(&b.policy));
        judged
    }
}

/// The allowances of `family`, sorted, each once.
fn of_family(list: &Option<Vec<Allowance>>, family: Family) -> Option<Vec<Allowance>> {
    list.as_ref().map(|list| {
        let mut list: Vec<Allowance> = list
            .iter()
            .filter(|a| Family::of(a.peer.0) == family)
            .copied()
            .collect();
        list.sort_unstable();
        list.dedup();
        list
    })
}

/// Every address of `family`.
fn everything(family: Family) -> (IpAddr, IpAddr) {
    let last = match family {
        Family::V4 => u128::from(u32::MAX),
        Family::V6 => u128::MAX,
    };
    (from_number(0, family), from_number(last, family))
}

/// The most allowances one pod keeps per direction (peer ranges × protocols × port
/// ranges, after merging adjacent peers). The kernel holds each as a set element for each
/// pod a policy selects, so one policy with hundreds of disjoint blocks and ports (a
/// product in the hundreds of thousands) could exhaust the node's memory: a pod whose
/// policies allow more fails closed in that direction and is reported.
pub const ALLOWANCES_MAX: usize = 10_000;

/// Adds what `rule` allows `pod` in `direction` to `out`, stopping once `out` holds more
/// than [`ALLOWANCES_MAX`].
fn allow(
    direction: Direction,
    pod: &PolicyPod,
    rule: &PolicyRule,
    peers: &Peers<'_>,
    state: &PolicyState,
    out: &mut Vec<Allowance>,
) {
    // Ports that do not depend on the peer: numbers, and names of the local pod's ports
    // for ingress; egress names are resolved on each peer pod.
    let mut fixed: Vec<(Option<Protocol>, (u16, u16))> = Vec::new();
    let mut named = Vec::new();
    if rule.ports.is_empty() {
        fixed.push((None, (0, u16::MAX)));
    }
    for port in rule.ports.iter() {
        let protocol = Some(port.protocol);
        match port.port {
            PortRef::All => fixed.push((protocol, (0, u16::MAX))),
            PortRef::Range(start, end) => fixed.push((protocol, (start, end))),
            PortRef::Named(name) => match direction {
                Direction::Ingress => {
                    if let Some(number) = pod.named_port(name, port.protocol) {
                        fixed.push((protocol, (number, number)));
                    }
                }
                Direction::Egress => named.push((port.protocol, name)),
            },
        }
    }
    let push_fixed = |peer: (IpAddr, IpAddr), out: &mut Vec<Allowance>| {
        for &(protocol, ports) in &fixed {
            if out.len() > ALLOWANCES_MAX {
                return;
            }
            out.push(Allowance {
                peer,
                protocol,
                ports,
            });
        }
    };
    // A named port is resolved on the peer pod at `ip`.
    let push_named = |peer: &PolicyPod, ip: IpAddr, out: &mut Vec<Allowance>| {
        for &(protocol, name) in &named {
            if out.len() > ALLOWANCES_MAX {
                return;
            }
            if let Some(number) = peer.named_port(name, protocol) {
                out.push(Allowance {
                    peer: (ip, ip),
                    protocol: Some(protocol),
                    ports: (number, number),
                });
            }
        }
    };
    match peers {
        Peers::Everyone => {
            for &ip in pod.ips.iter() {
                push_fixed(everything(Family::of(ip)), out);
            }
            if !named.is_empty() {
                for peer in state.pods.values() {
                    for &ip in peer.ips.iter() {
                        push_named(peer, ip, out);
                    }
                }
            }
        }
        Peers::Some { pods, blocks } => {
            let addresses = pods
                .iter()
                .flat_map(|peer| peer.ips.iter().map(|&ip| (ip, ip)));
            for range in merge_ranges(blocks.iter().copied().chain(addresses)) {
                push_fixed(range, out);
            }
            for peer in pods {
                for &ip in peer.ips.iter() {
                    push_named(peer, ip, out);
                }
            }
            // A named port with an ipBlock is resolved on the pods inside the block, as
            // upstream's implementations do.
            if !named.is_empty() && !blocks.is_empty() {
                for peer in state.pods.values() {
                    let inside = |ip: &&IpAddr| blocks.iter().any(|b| (b.0..=b.1).contains(*ip));
                    for &ip in peer.ips.iter().filter(inside) {
                        push_named(peer, ip, out);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::store::ClaimError;
    use crate::{Kind, Update, View};
    use serde_json::json;

    fn pod(ns: &str, name: &str, node: &str, ip: &str, labels: serde_json::Value) -> Update {
        Update::Pod(Box::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": name, "labels": labels},
                "spec": {"nodeName": node, "containers": [
                    {"ports": [{"name": "http", "containerPort": 8080}]}
                ]},
                "status": {"podIPs": [{"ip": ip}]}
            }))
            .expect("pod"),
        ))
    }

    fn namespace(name: &str, labels: serde_json::Value) -> Update {
        Update::Namespace(Box::new(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("namespace"),
        ))
    }

    fn policy(ns: &str, name: &str, spec: serde_json::Value) -> Update {
        Update::NetworkPolicy(Box::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": name}, "spec": spec
            }))
            .expect("policy"),
        ))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    fn one(peer: &str, protocol: Option<Protocol>, ports: (u16, u16)) -> Allowance {
        Allowance {
            peer: (ip(peer), ip(peer)),
            protocol,
            ports,
        }
    }

    fn pods() -> [Update; 4] {
        [
            pod("shop", "web", "node-a", "10.1.0.2", json!({"app": "web"})),
            pod("shop", "db", "node-a", "10.1.0.3", json!({"app": "db"})),
            pod("shop", "api", "node-b", "10.2.0.4", json!({"app": "api"})),
            pod(
                "ops",
                "probe",
                "node-b",
                "10.2.0.5",
                json!({"app": "probe"}),
            ),
        ]
    }

    fn cluster() -> View {
        let mut view = View::new("node-a");
        let namespaces = [
            namespace("shop", json!({"team": "shop"})),
            namespace("ops", json!({"team": "ops"})),
        ];
        let report = view.apply(namespaces.into_iter().chain(pods()));
        assert!(report.invalid.is_empty(), "{:?}", report.invalid);
        view
    }

    #[test]
    fn only_selected_pods_are_isolated_and_only_in_the_governed_direction() {
        let mut view = cluster();
        assert!(view.pod_policies().is_empty());
        let report = view.apply([policy(
            "shop",
            "db-from-api",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "api"}}}],
                                "ports": [{"port": 5432}]}]}),
        )]);
        assert_eq!(report.changes.policy_pods.len(), 1, "db's verdicts change");
        // node-b's api pod is a peer at once: every pod keeps all of its labels.
        let policies = view.pod_policies();
        assert_eq!(policies.len(), 1, "{policies:?}");
        assert_eq!(policies[0].ip, ip("10.1.0.3"));
        assert_eq!(
            policies[0].ingress,
            Some(vec![one("10.2.0.4", Some(Protocol::Tcp), (5432, 5432))])
        );
        assert_eq!(policies[0].egress, None);
    }

    /// The peers `view` lets into its first isolated pod.
    fn ingress_peers(view: &View) -> Vec<(IpAddr, IpAddr)> {
        let policies = view.pod_policies();
        policies[0]
            .ingress
            .iter()
            .flatten()
            .map(|a| a.peer)
            .collect()
    }

    #[test]
    fn every_pod_keeps_all_its_labels_in_sets_shared_by_equal_pods() {
        let mut view = cluster();
        let all = [
            ("ops".into(), 1),
            ("shop".into(), 1),
            ("shop".into(), 1),
            ("shop".into(), 1),
        ];
        assert_eq!(view.policy_pod_labels(), all);
        // A NotIn selector on any key judges every pod by its labels, with no new list.
        view.apply([policy(
            "shop",
            "db-not-from-probes",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{
                       "namespaceSelector": {},
                       "podSelector": {"matchExpressions": [
                           {"key": "app", "operator": "NotIn", "values": ["probe"]}]}}]}]}),
        )]);
        // web and db, neighbours, merge into one range.
        let web_and_db = (ip("10.1.0.2"), ip("10.1.0.3"));
        let api = (ip("10.2.0.4"), ip("10.2.0.4"));
        assert_eq!(ingress_peers(&view), [web_and_db, api]);
        // Pods with equal labels share one stored set; it goes with the last of them.
        let sets = view.policy_label_sets();
        let twin = |name: &str| pod("shop", name, "node-b", "10.2.0.9", json!({"app": "api"}));
        view.apply([twin("api-2"), twin("api-3")]);
        assert_eq!(view.policy_label_sets(), sets);
        let strings = view.counts().strings;
        let hashed = json!({"app": "api", "pod-template-hash": "5d4f8c"});
        view.apply([pod("shop", "api-2", "node-b", "10.2.0.9", hashed.clone())]);
        view.apply([pod("shop", "api-3", "node-b", "10.2.0.9", hashed)]);
        assert_eq!(view.policy_label_sets(), sets + 1);
        let gone = |name: &str| Update::Deleted {
            kind: Kind::Pod,
            namespace: "shop".into(),
            name: name.into(),
        };
        view.apply([gone("api-2"), gone("api-3")]);
        assert_eq!(view.policy_label_sets(), sets);
        assert_eq!(
            view.counts().strings,
            strings,
            "its strings went with the set"
        );
    }

    /// The peers `view` lets into db (10.1.0.3).
    fn db_peers(view: &View) -> Vec<(IpAddr, IpAddr)> {
        let policies = view.pod_policies();
        let db = policies.iter().find(|p| p.ip == ip("10.1.0.3"));
        let ingress = db.into_iter().flat_map(|p| p.ingress.iter().flatten());
        ingress.map(|a| a.peer).collect()
    }

    /// Whether one of `ranges` holds `address`.
    fn admits(ranges: &[(IpAddr, IpAddr)], address: &str) -> bool {
        ranges.iter().any(|r| (r.0..=r.1).contains(&ip(address)))
    }

    /// Labels `l1=x` … `l{count}=x`, and `extra`.
    fn many_labels(count: usize, extra: serde_json::Value) -> serde_json::Value {
        let mut labels: serde_json::Map<String, serde_json::Value> =
            (1..=count).map(|i| (format!("l{i}"), "x".into())).collect();
        labels.extend(
            extra
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        labels.into()
    }

    #[test]
    fn a_pod_or_namespace_with_more_labels_than_kept_fails_closed() {
        let mut view = cluster();
        view.apply([policy(
            "shop",
            "deny",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}),
        )]);
        let many = crate::wire::LABELS_MAX;
        // web with every label it may have is selected as before; one more and no
        // selector can tell whether it matches, so every policy of its namespace
        // isolates it, allowing nothing, even one that does not select it by its labels.
        let web = |count| {
            pod(
                "shop",
                "web",
                "node-a",
                "10.1.0.2",
                many_labels(count, json!({"app": "web"})),
            )
        };
        let report = view.apply([web(many - 1)]);
        assert!(report.invalid.is_empty(), "{:?}", report.invalid);
        view.apply([policy(
            "shop",
            "from-anyone-to-db",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"namespaceSelector": {},
                                          "podSelector": {"matchExpressions": [
                       {"key": "app", "operator": "NotIn", "values": ["nothing"]}]}}]}]}),
        )]);
        let isolated = |view: &View| -> BTreeSet<IpAddr> {
            view.pod_policies().iter().map(|p| p.ip).collect()
        };
        assert_eq!(
            isolated(&view),
            BTreeSet::from([ip("10.1.0.2"), ip("10.1.0.3")])
        );
        let report = view.apply([web(many)]);
        assert_eq!(report.invalid.len(), 1, "reported");
        assert!(
            report.invalid[0].reason.contains("more than 1024 labels"),
            "{:?}",
            report.invalid
        );
        assert_eq!(view.counts().over_label_cap, 1);
        let web_policy = view
            .pod_policies()
            .into_iter()
            .find(|p| p.ip == ip("10.1.0.2"));
        assert_eq!(
            web_policy.map(|p| p.ingress),
            Some(Some(vec![])),
            "closed, not gone"
        );
        // As a peer it matches no selector but the empty one: db, open to every pod with
        // `app NotIn [nothing]`, lets in all but web.
        let peers = db_peers(&view);
        assert!(!admits(&peers, "10.1.0.2"), "{peers:?}");
        assert!(admits(&peers, "10.2.0.5"), "{peers:?}");

        // A namespace with too many labels is in no namespace a selector matches, NotIn
        // included: `ops` (team=ops) is kept out of `team NotIn [ops]` with 1,025 labels.
        view.apply([policy(
            "shop",
            "from-anyone-to-db",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
                       {"key": "team", "operator": "NotIn", "values": ["ops"]}]}}]}]}),
        )]);
        let probe = "10.2.0.5";
        assert!(!admits(&db_peers(&view), probe));
        let report = view.apply([namespace("ops", many_labels(many, json!({"team": "ops"})))]);
        assert_eq!(report.invalid.len(), 1, "reported");
        assert_eq!(view.counts().over_label_cap, 2);
        assert!(!admits(&db_peers(&view), probe), "{:?}", db_peers(&view));
        view.apply([namespace("ops", json!({"team": "dev"}))]);
        assert!(
            admits(&db_peers(&view), probe),
            "a namespace with fewer labels is judged again"
        );
        view.apply([web(1)]);
        assert_eq!(view.counts().over_label_cap, 0);
    }

    #[test]
    fn namespace_selectors_named_ports_and_blocks_resolve() {
        let mut view = cluster();
        view.apply([policy(
            "shop",
            "web",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}],
                                "ports": [{"port": "http"}, {"port": "missing"}]}],
                   "egress": [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24",
                                                   "except": ["192.0.2.128/25"]}}],
                               "ports": [{"protocol": "UDP", "port": 53, "endPort": 54}]},
                              {"to": [{"podSelector": {}}], "ports": [{"port": "http"}]}]}),
        )]);
        let policies = view.pod_policies();
        assert_eq!(policies.len(), 1);
        let web = &policies[0];
        assert_eq!(
            web.ingress,
            Some(vec![one("10.2.0.5", Some(Protocol::Tcp), (8080, 8080))])
        );
        let mut egress = vec![
            Allowance {
                peer: (ip("192.0.2.0"), ip("192.0.2.127")),
                protocol: Some(Protocol::Udp),
                ports: (53, 54),
            },
            one("10.1.0.2", Some(Protocol::Tcp), (8080, 8080)),
            one("10.1.0.3", Some(Protocol::Tcp), (8080, 8080)),
            one("10.2.0.4", Some(Protocol::Tcp), (8080, 8080)),
        ];
        egress.sort();
        assert_eq!(web.egress, Some(egress));

        // The ops namespace loses its label: its probe is no longer allowed in.
        let report = view.apply([namespace("ops", json!({}))]);
        assert!(!report.changes.policy_pods.is_empty());
        assert_eq!(view.pod_policies()[0].ingress, Some(vec![]));
    }

    #[test]
    fn peers_merge_and_a_policy_allowing_more_than_the_cap_fails_closed() {
        let mut view = cluster();
        // 300 pods of consecutive addresses in ops, one allowance when merged.
        let many: Vec<Update> = (0..300)
            .map(|i| {
                let ip = format!("10.3.{}.{}", i / 256, i % 256);
                pod(
                    "ops",
                    &format!("p{i}"),
                    "node-b",
                    &ip,
                    json!({"app": "many"}),
                )
            })
            .collect();
        view.apply(many);
        view.apply([policy(
            "shop",
            "db-from-many",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"namespaceSelector": {},
                                          "podSelector": {"matchLabels": {"app": "many"}}}],
                                "ports": [{"port": 5432}]}]}),
        )]);
        let db = view.pod_policies();
        assert_eq!(
            db[0].ingress,
            Some(vec![Allowance {
                peer: (ip("10.3.0.0"), ip("10.3.1.43")),
                protocol: Some(Protocol::Tcp),
                ports: (5432, 5432),
            }])
        );
        assert!(db[0].over_cap.is_empty());
        // 500 disjoint /32 blocks × 500 disjoint ports: 250,000 boxes, far over the cap.
        let to: Vec<_> = (0..500)
            .map(
                |i| json!({"ipBlock": {"cidr": format!("10.99.{}.{}/32", i / 128, (i % 128) * 2)}}),
            )
            .collect();
        let ports: Vec<_> = (0..500).map(|i| json!({"port": 10000 + 2 * i})).collect();
        view.apply([policy(
            "shop",
            "explode",
            json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": to, "ports": ports}]}),
        )]);
        let db = view.pod_policies();
        assert_eq!(db[0].egress, Some(vec![]), "closed");
        assert_eq!(db[0].over_cap, [Direction::Egress]);
        assert_eq!(
            db[0].ingress.as_ref().map(Vec::len),
            Some(1),
            "ingress as before"
        );
    }

    #[test]
    fn a_new_sandbox_is_isolated_at_the_addresses_nodus_cni_gave_it() {
        let mut view = cluster();
        view.apply([policy(
            "shop",
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        )]);
        let isolated = |view: &View| -> BTreeSet<IpAddr> {
            view.pod_policies().iter().map(|p| p.ip).collect()
        };
        let before = isolated(&view);
        // A pod of this node whose status has no address yet.
        let pending = |status: serde_json::Value| {
            let mut update = pod("shop", "new", "node-a", "10.1.0.9", json!({"app": "new"}));
            if let Update::Pod(wire) = &mut update {
                wire.status = serde_json::from_value(status).expect("status");
            }
            update
        };
        view.apply([pending(json!({"phase": "Pending"}))]);
        assert_eq!(isolated(&view), before);
        let mut changes = crate::ChangeSet::default();
        let ips = [ip("10.1.0.9")];
        assert_eq!(
            view.claim_sandbox("shop", "unknown", &ips, &mut changes),
            Err(ClaimError::Unknown)
        );
        assert_eq!(
            view.claim_sandbox("ops", "probe", &ips, &mut changes),
            Err(ClaimError::OtherNode)
        );
        view.claim_sandbox("shop", "new", &ips, &mut changes)
            .expect("claimed");
        assert_eq!(
            changes.policy_pods.len(),
            1,
            "the new pod is resolved again"
        );
        assert!(isolated(&view).contains(&ips[0]));
        // A status still without addresses keeps the claim; one with them takes over.
        view.apply([pending(json!({"phase": "Pending"}))]);
        assert!(isolated(&view).contains(&ips[0]));
        view.apply([pending(
            json!({"phase": "Running", "podIPs": [{"ip": "10.1.0.9"}]}),
        )]);
        view.apply([pending(json!({"phase": "Pending"}))]);
        assert!(
            !isolated(&view).contains(&ips[0]),
            "the claim went with the status"
        );
        // An ended pod keeps none.
        view.claim_sandbox("shop", "new", &ips, &mut changes)
            .expect("claimed");
        view.apply([pending(json!({"phase": "Failed"}))]);
        assert!(!isolated(&view).contains(&ips[0]));
    }

    #[test]
    fn a_native_sidecars_named_port_counts_and_an_init_containers_does_not() {
        let mut view = cluster();
        let mut web = pod("shop", "web", "node-a", "10.1.0.2", json!({"app": "web"}));
        if let Update::Pod(wire) = &mut web {
            wire.spec.init_containers = serde_json::from_value(json!([
                {"restartPolicy": "Always", "ports": [{"name": "metrics", "containerPort": 9100}]},
                {"ports": [{"name": "setup", "containerPort": 7000}]}
            ]))
            .expect("init containers");
        }
        view.apply([web]);
        view.apply([policy(
            "shop",
            "web",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"ipBlock": {"cidr": "10.9.0.0/16"}}],
                                "ports": [{"port": "metrics"}, {"port": "setup"}]}]}),
        )]);
        let web = view.pod_policies();
        assert_eq!(
            web[0].ingress,
            Some(vec![Allowance {
                peer: (ip("10.9.0.0"), ip("10.9.255.255")),
                protocol: Some(Protocol::Tcp),
                ports: (9100, 9100),
            }])
        );
    }

    #[test]
    fn an_address_two_pods_of_this_node_claim_is_listed_once_and_closed() {
        let mut view = cluster();
        view.apply([policy(
            "shop",
            "web-from-ops",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]}]}),
        )]);
        let web_ip = ip("10.1.0.2");
        let of_web = |view: &View| -> Vec<PodPolicy> {
            view.pod_policies()
                .into_iter()
                .filter(|p| p.ip == web_ip)
                .collect()
        };
        let open = of_web(&view);
        assert_eq!(open.len(), 1);
        assert_eq!(
            open[0].ingress.as_ref().map(Vec::len),
            Some(1),
            "ops' probe"
        );
        // The old pod's object still claims the address a new pod was given.
        let report = view.apply([pod(
            "shop",
            "old",
            "node-a",
            "10.1.0.2",
            json!({"app": "old"}),
        )]);
        let closed = of_web(&view);
        assert_eq!(closed.len(), 1, "once: {closed:?}");
        assert_eq!(closed[0].ingress, Some(vec![]));
        assert_eq!(closed[0].egress, None);
        assert!(report.changes.policy_pods.contains(&open[0].pod));
        // Resolving only the pods a change names says the same.
        let keys: BTreeSet<u64> = [open[0].pod, closed[0].pod].into();
        let partial = view.pod_policies_of(&keys);
        assert_eq!(partial.iter().filter(|p| p.ip == web_ip).count(), 1);
        // The old pod goes: the new one is judged by its policy again.
        let report = view.apply([Update::Deleted {
            kind: Kind::Pod,
            namespace: "shop".into(),
            name: "old".into(),
        }]);
        assert!(report.changes.policy_pods.contains(&open[0].pod));
        assert_eq!(of_web(&view), open);
    }

    #[test]
    fn an_egress_named_port_to_an_ip_block_is_resolved_on_the_pods_inside() {
        let mut view = cluster();
        view.apply([policy(
            "shop",
            "web-out",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"ipBlock": {"cidr": "10.2.0.0/16"}}],
                               "ports": [{"port": "http"}]}]}),
        )]);
        let web = view.pod_policies();
        // api and probe on node-b, inside the block, name `http` 8080; pods outside do not
        // count.
        assert_eq!(
            web[0].egress,
            Some(vec![
                one("10.2.0.4", Some(Protocol::Tcp), (8080, 8080)),
                one("10.2.0.5", Some(Protocol::Tcp), (8080, 8080)),
            ])
        );
    }

    #[test]
    fn an_invalid_policy_is_skipped_alone_and_gives_its_strings_back() {
        let mut view = cluster();
        let strings = view.strings().len();
        let report = view.apply([policy(
            "shop",
            "broken",
            json!({"podSelector": {"matchLabels": {"app": "web", "tier": "front"}},
                   "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}),
        )]);
        assert_eq!(report.skipped, [Kind::NetworkPolicy]);
        assert!(
            report.invalid[0].reason.contains("ipBlock.cidr"),
            "{:?}",
            report.invalid
        );
        assert_eq!(view.strings().len(), strings);
        assert!(view.pod_policies().is_empty());

        // Deleting every policy and pod gives every string back.
        view.apply([policy(
            "shop",
            "deny-all",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        )]);
        assert_eq!(view.pod_policies().len(), 2);
        for (ns, name) in [
            ("shop", "web"),
            ("shop", "db"),
            ("shop", "api"),
            ("ops", "probe"),
        ] {
            view.apply([Update::Deleted {
                kind: Kind::Pod,
                namespace: ns.into(),
                name: name.into(),
            }]);
        }
        for (kind, ns, name) in [
            (Kind::NetworkPolicy, "shop", "deny-all"),
            (Kind::Namespace, "", "shop"),
            (Kind::Namespace, "", "ops"),
        ] {
            view.apply([Update::Deleted {
                kind,
                namespace: ns.into(),
                name: name.into(),
            }]);
        }
        let counts = view.counts();
        assert_eq!(
            (
                counts.policy_pods,
                counts.namespaces,
                counts.network_policies
            ),
            (0, 0, 0)
        );
        assert_eq!(view.strings().len(), 1, "only the node's name is left");
    }

    /// What the view resolves for all pods, by pod.
    fn by_pod(policies: Vec<PodPolicy>) -> std::collections::BTreeMap<u64, Vec<PodPolicy>> {
        let mut pods = std::collections::BTreeMap::<u64, Vec<PodPolicy>>::new();
        for policy in policies {
            pods.entry(policy.pod).or_default().push(policy);
        }
        pods
    }

    /// Records kept up to date from the pods each change names, as the proxy keeps
    /// them, always equal what a resolution of everything gives; and a change no policy
    /// looks at names no pod.
    #[test]
    fn resolving_only_the_pods_a_change_names_keeps_up_with_everything() {
        let mut view = cluster();
        let mut records = by_pod(view.pod_policies());
        let steps: Vec<(&str, Update)> = vec![
            (
                "db open to api",
                policy(
                    "shop",
                    "db",
                    json!({"podSelector": {"matchLabels": {"app": "db"}},
                           "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "api"}}}]}]}),
                ),
            ),
            (
                "web open to ops by namespace, sending on named ports anywhere",
                policy(
                    "shop",
                    "web",
                    json!({"podSelector": {"matchLabels": {"app": "web"}},
                           "policyTypes": ["Ingress", "Egress"],
                           "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]}],
                           "egress": [{"ports": [{"port": "http"}]}]}),
                ),
            ),
            (
                "api moves",
                pod("shop", "api", "node-b", "10.2.0.9", json!({"app": "api"})),
            ),
            (
                "api relabelled",
                pod("shop", "api", "node-b", "10.2.0.9", json!({"app": "cache"})),
            ),
            ("ops relabelled", namespace("ops", json!({"team": "none"}))),
            ("ops back", namespace("ops", json!({"team": "ops"}))),
            (
                "db becomes web",
                pod("shop", "db", "node-a", "10.1.0.3", json!({"app": "web"})),
            ),
            (
                "a new probe",
                pod(
                    "ops",
                    "probe-2",
                    "node-b",
                    "10.2.0.6",
                    json!({"app": "probe"}),
                ),
            ),
            (
                "web policy narrowed",
                policy(
                    "shop",
                    "web",
                    json!({"podSelector": {"matchLabels": {"app": "none"}}}),
                ),
            ),
            (
                "probe gone",
                Update::Deleted {
                    kind: Kind::Pod,
                    namespace: "ops".into(),
                    name: "probe".into(),
                },
            ),
            (
                "db policy gone",
                Update::Deleted {
                    kind: Kind::NetworkPolicy,
                    namespace: "shop".into(),
                    name: "db".into(),
                },
            ),
        ];
        for (step, update) in steps {
            let report = view.apply([update]);
            assert!(report.invalid.is_empty(), "{step}: {:?}", report.invalid);
            let dirty = &report.changes.policy_pods;
            let mut resolved = by_pod(view.pod_policies_of(dirty));
            for pod in dirty {
                match resolved.remove(pod) {
                    Some(policies) => records.insert(*pod, policies),
                    None => records.remove(pod),
                };
            }
            assert_eq!(records, by_pod(view.pod_policies()), "{step}");
        }

        // A pod no policy selects or names, in a namespace none selects: nothing to do.
        view.apply([namespace("quiet", json!({}))]);
        let report = view.apply([pod("quiet", "x", "node-b", "10.2.0.7", json!({"app": "x"}))]);
        assert!(report.changes.policy_pods.is_empty());
        let report = view.apply([pod("quiet", "x", "node-b", "10.2.0.8", json!({"app": "y"}))]);
        assert!(report.changes.policy_pods.is_empty());
    }
}
