//! Pure planning: the node view → what the device, its routes and the own Node should hold,
//! and the per-peer deltas from one state to another. No I/O.

use crate::key::Key;
use nodus_view::View;
use nodus_view::model::{Cidr, Family, Node, NodeAddressKind};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The annotations every node publishes on its own Node object (the view keeps these).
pub use nodus_view::wire::{
    ANNOTATION_ENDPOINT, ANNOTATION_FORCE_ENDPOINT, ANNOTATION_PEER_ENDPOINTS, ANNOTATION_PORT,
    ANNOTATION_PUBLIC_KEY,
};
use nodus_view::wire::{PEER_ENDPOINTS_MAX, PEER_KEY_PREFIX};

/// What planning needs besides the view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSettings {
    /// Our UDP port, and a peer's when it publishes none.
    pub listen_port: u16,
    /// The node address family endpoints use when a node has both.
    pub endpoint_family: Family,
    /// The cluster's pod ranges: a peer's pod CIDRs must lie inside them, or the peer is
    /// left out. Without them nothing is routed: any Node could claim any range.
    pub cluster_cidrs: Vec<Cidr>,
    /// The ranges node addresses lie in: a peer's addresses outside them are not its
    /// allowed IPs (it cannot send from them). Empty: every address its Node lists.
    pub node_cidrs: Vec<Cidr>,
    /// Which of its addresses this node publishes for peers.
    pub endpoint: EndpointChoice,
    /// Seconds between keepalives to each peer, 0 for none: they keep the mapping of a
    /// NAT in front of either node open, so that the peer can reach it at any time.
    pub persistent_keepalive: u16,
    /// Now, in seconds since the epoch: how long a NotReady node has been so.
    pub now: i64,
}

/// How long a node that turned NotReady keeps its standing in the mesh's claims: a
/// kubelet silent past the node monitor's grace (40 s), an API outage, an agent restart
/// must not let another node take its address, range or key. Past it (the eviction's
/// default too), it is a ghost, and a ready node may take over.
pub const CLAIM_GRACE_SECONDS: i64 = 300;

/// Whether `node` stands as a ready node for its claims at `now`: Ready, or NotReady for
/// less than [`CLAIM_GRACE_SECONDS`].
fn stands(node: &Node, now: i64) -> bool {
    node.ready || now.saturating_sub(node.ready_changed) < CLAIM_GRACE_SECONDS
}

/// Which address a node publishes for peers to reach it. A Node's `nodus.dev/force-endpoint`
/// annotation wins over it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EndpointChoice {
    /// Its InternalIP of the endpoint family (else its ExternalIP).
    #[default]
    Internal,
    /// Its ExternalIP of the endpoint family (else its InternalIP): nodes on other sites
    /// or behind a one-to-one NAT (k3s's `--flannel-external-ip`).
    External,
    /// The address its peers see its packets come from, as most of them report it
    /// ([`ANNOTATION_PEER_ENDPOINTS`]), else what it published last, else its InternalIP: a
    /// node behind a NAT that maps its port alike for every destination, so that another
    /// such node can reach it through the mapping its keepalives to a reachable node keep
    /// open.
    Learned,
}

/// A peer as the device holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    pub endpoint: Option<SocketAddr>,
    /// The node's pod CIDRs and its own addresses (host prefixes). Sorted, so that two
    /// peers compare equal whatever order the device listed them in.
    ///
    /// The node addresses are there for replies the peer un-NATs: a NodePort answered by a
    /// pod on another node comes back from the node address the client asked, through the
    /// tunnel, and WireGuard drops a source outside the sender's allowed IPs. No route sends
    /// node addresses into the device; they only make such packets acceptable.
    pub allowed_ips: Vec<Cidr>,
    /// Persistent keepalive in seconds, 0 for none.
    pub keepalive: u16,
}

/// The desired state for one view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// Keyed by public key: a rotated key is a different peer, so the old one goes.
    pub peers: BTreeMap<Key, Peer>,
    /// The node each peer stands for (logs and the bench).
    pub peer_nodes: BTreeMap<Key, Box<str>>,
    /// Remote pod CIDRs, each routed into the device.
    pub routes: BTreeSet<Cidr>,
    /// Our own pod CIDRs: the CNI ranges.
    pub own_cidrs: Vec<Cidr>,
    /// The first address of each own pod CIDR, as a host prefix: the device's addresses.
    pub device_addresses: BTreeSet<Cidr>,
    /// Our own node address of the preferred family: the underlay, whose MTU the device's
    /// follows.
    pub own_endpoint: Option<IpAddr>,
    /// Where peers reach us: what we publish.
    pub published_endpoint: Option<SocketAddr>,
    /// Nodes left out, with why (no key, a bad key, a key shared with another node…).
    pub skipped: Vec<(Box<str>, &'static str)>,
}

/// The desired state from the view; `own_key` keeps a node that shares our key out, and
/// `previous` (the last plan) tells which claims are established.
///
/// Of nodes whose claims (a public key, pod CIDRs, node addresses) overlap, the one that
/// comes first keeps them and the others are left out, the same on every node: first a
/// ready node before one NotReady or stale (a powered-off node's leftover Node never
/// evicts the machine that got its address); then one whose claims were all in the last
/// plan before one that claims something new (a node that adds a peer's address or copies
/// its key does not take them over); then the older Node, then the name.
pub fn desired(view: &View, settings: &PlanSettings, own_key: &Key, previous: &Desired) -> Desired {
    let mut plan = Desired::default();
    let own_name = view.node_name();
    if let Some(own) = view.this_node() {
        plan.own_cidrs = own.pod_cidrs.to_vec();
        plan.device_addresses = own
            .pod_cidrs
            .iter()
            .filter_map(|c| c.first_host())
            .collect();
        plan.own_endpoint = endpoint_ip(own, settings.endpoint_family);
    }
    let mut claimed: BTreeSet<Cidr> = plan.own_cidrs.iter().copied().collect();
    if let Some(own) = view.this_node() {
        claimed.extend(host_prefixes(own));
    }
    let mut claims = Vec::new();
    for (name, node) in view.nodes().filter(|(n, _)| *n != own_name) {
        match peer_of(node, settings) {
            Ok((key, peer)) => {
                let established = previous.holds(name, &key, &peer.allowed_ips);
                let rank = (!stands(node, settings.now), !established, node.created);
                claims.push((rank, name, node, key, peer));
            }
            Err(reason) => plan.skipped.push((name.into(), reason)),
        }
    }
    claims.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    for (_, name, node, key, peer) in claims {
        match conflict(&key, &peer, own_key, &plan.peers, &claimed) {
            None => {
                claimed.extend(peer.allowed_ips.iter().copied());
                plan.routes
                    .extend(node.pod_cidrs.iter().map(|c| c.network()));
                plan.peer_nodes.insert(key, name.into());
                plan.peers.insert(key, peer);
            }
            Some(reason) => plan.skipped.push((name.into(), reason)),
        }
    }
    plan.skipped.sort_unstable();
    if let Some(own) = view.this_node() {
        // Peers stop reporting what we publish: what we published stays until they see
        // another address.
        let learned = match settings.endpoint {
            EndpointChoice::Learned => {
                seen_by_peers(view, &plan.peer_nodes, own_key).or_else(|| published_endpoint(own))
            }
            EndpointChoice::Internal | EndpointChoice::External => None,
        };
        plan.published_endpoint = own_endpoint(own, settings, learned);
    }
    plan
}

/// How `key` is named in [`ANNOTATION_PEER_ENDPOINTS`].
fn key_prefix(key: &Key) -> String {
    let mut text = key.to_base64();
    text.truncate(PEER_KEY_PREFIX);
    text
}

/// The entries of a [`ANNOTATION_PEER_ENDPOINTS`] value that parse: key prefix, endpoint.
fn peer_endpoints(text: &str) -> impl Iterator<Item = (&str, SocketAddr)> {
    text.split(',')
        .take(PEER_ENDPOINTS_MAX)
        .filter_map(|entry| {
            let (prefix, endpoint) = entry.split_once('=')?;
            Some((prefix, endpoint.parse().ok()?))
        })
}

/// Where our peers see our packets come from: the endpoint that more than half of the
/// nodes in our mesh (`peer_nodes`) report for `own_key`, `None` when none has such a
/// quorum. Peers report only what differs from what we publish, so a silent peer counts
/// against a change: one node, or a few, cannot move us (a Node without a valid key
/// cannot even vote).
fn seen_by_peers(
    view: &View,
    peer_nodes: &BTreeMap<Key, Box<str>>,
    own_key: &Key,
) -> Option<SocketAddr> {
    let own = key_prefix(own_key);
    let mut reports: BTreeMap<SocketAddr, usize> = BTreeMap::new();
    for name in peer_nodes.values() {
        let Some(text) = view
            .node(name)
            .and_then(|node| node.annotation(ANNOTATION_PEER_ENDPOINTS))
        else {
            continue;
        };
        let seen = peer_endpoints(text)
            .find(|(prefix, _)| *prefix == own)
            .map(|(_, endpoint)| endpoint)
            .filter(|endpoint| reachable(endpoint.ip()));
        if let Some(endpoint) = seen {
            *reports.entry(endpoint).or_default() += 1;
        }
    }
    let quorum = peer_nodes.len() / 2 + 1;
    reports
        .into_iter()
        .find(|(_, count)| *count >= quorum)
        .map(|(endpoint, _)| endpoint)
}

/// The endpoint `node` publishes, when it is one a peer can use.
fn published_endpoint(node: &Node) -> Option<SocketAddr> {
    node.annotation(ANNOTATION_ENDPOINT)
        .and_then(|text| text.parse().ok())
        .filter(|endpoint: &SocketAddr| reachable(endpoint.ip()))
}

/// What this node publishes in [`ANNOTATION_PEER_ENDPOINTS`]: the endpoints of live
/// sessions (`learned`) other than the one the peer publishes (it is behind a NAT, or its
/// address changed); at most [`PEER_ENDPOINTS_MAX`], by key. Once the peer publishes what
/// we see its entry goes, so that in a settled mesh every such annotation is empty, and no
/// agent holds them.
pub fn peer_endpoints_seen(desired: &Desired, learned: &BTreeMap<Key, SocketAddr>) -> String {
    let entries: Vec<String> = learned
        .iter()
        .filter(|(key, endpoint)| {
            desired
                .peers
                .get(*key)
                .is_some_and(|peer| peer.endpoint != Some(**endpoint))
        })
        .take(PEER_ENDPOINTS_MAX)
        .map(|(key, endpoint)| format!("{}={endpoint}", key_prefix(key)))
        .collect();
    entries.join(",")
}

/// Why a node is left out whose claims overlap those granted to another.
pub const OVERLAPS: &str = "its pod CIDRs or addresses overlap another node's";

/// Why a node is left out while it joins: nothing is wrong with it.
pub const NO_KEY: &str = "no WireGuard key published";
pub const NO_POD_CIDRS: &str = "no pod CIDRs";

impl Desired {
    /// What the device already holds when the agent starts, as the last plan: its peers'
    /// claims stay established, so a restarted agent keeps what its predecessor granted
    /// instead of giving a contested address to the older of two claimants at once. The
    /// device names no node: whichever node has the key and claims those addresses holds
    /// them.
    pub fn adopted(peers: &BTreeMap<Key, Peer>) -> Desired {
        let peers = peers
            .iter()
            .map(|(key, peer)| {
                let mut peer = peer.clone();
                peer.allowed_ips.sort_unstable();
                (*key, peer)
            })
            .collect();
        Desired {
            peers,
            ..Desired::default()
        }
    }

    /// Whether the last plan had `node` as a peer with `key` and every one of
    /// `allowed_ips` (sorted); an adopted plan names no node.
    fn holds(&self, node: &str, key: &Key, allowed_ips: &[Cidr]) -> bool {
        let same_node = self.peer_nodes.get(key).is_none_or(|n| &**n == node);
        let held = self.peers.get(key).map_or(&[][..], |p| &p.allowed_ips[..]);
        same_node && allowed_ips.iter().all(|c| held.binary_search(c).is_ok())
    }
}

/// Why a node's claims cannot be granted beside what is granted already, if they cannot.
fn conflict(
    key: &Key,
    peer: &Peer,
    own_key: &Key,
    peers: &BTreeMap<Key, Peer>,
    claimed: &BTreeSet<Cidr>,
) -> Option<&'static str> {
    if key == own_key || peers.contains_key(key) {
        return Some("its key is another node's");
    }
    if peer.allowed_ips.iter().any(|c| overlaps_any(claimed, *c)) {
        return Some(OVERLAPS);
    }
    None
}

/// The peer a node asks to be, checked on its own (its key, its ranges inside the
/// cluster's), not yet against the others.
fn peer_of(node: &Node, settings: &PlanSettings) -> Result<(Key, Peer), &'static str> {
    let text = node.annotation(ANNOTATION_PUBLIC_KEY).ok_or(NO_KEY)?;
    let key = Key::from_base64(text).ok_or("the published key is not a WireGuard key")?;
    let mut allowed_ips: Vec<Cidr> = node.pod_cidrs.iter().map(|c| c.network()).collect();
    if allowed_ips.is_empty() {
        return Err(NO_POD_CIDRS);
    }
    if !allowed_ips.iter().all(|c| {
        settings
            .cluster_cidrs
            .iter()
            .any(|cluster| cluster.contains_cidr(c))
    }) {
        return Err("its pod CIDRs are not inside cluster_cidrs");
    }
    let in_node_ranges = |host: &Cidr| {
        settings.node_cidrs.is_empty() || settings.node_cidrs.iter().any(|r| r.contains_cidr(host))
    };
    allowed_ips.extend(host_prefixes(node).filter(in_node_ranges));
    allowed_ips.sort_unstable();
    let port = node
        .annotation(ANNOTATION_PORT)
        .and_then(|p| p.parse().ok())
        .unwrap_or(settings.listen_port);
    // What the node published (its ExternalIP, a forced address), else its own address.
    let endpoint = published_endpoint(node).or_else(|| {
        endpoint_ip(node, settings.endpoint_family).map(|ip| SocketAddr::new(ip, port))
    });
    Ok((
        key,
        Peer {
            endpoint,
            allowed_ips,
            keepalive: settings.persistent_keepalive,
        },
    ))
}

/// Whether a published address can be another node's: not loopback, unspecified or
/// multicast, which would turn a peer's packets back on itself or scatter them.
fn reachable(ip: IpAddr) -> bool {
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast()))
}

/// Where peers should reach `own`: its `nodus.dev/force-endpoint` (`IP` or `IP:port`),
/// else what its peers see (`learned`, with [`EndpointChoice::Learned`]), else the address
/// `settings.endpoint` picks, at our listen port.
fn own_endpoint(
    own: &Node,
    settings: &PlanSettings,
    learned: Option<SocketAddr>,
) -> Option<SocketAddr> {
    let forced = own.annotation(ANNOTATION_FORCE_ENDPOINT).and_then(|text| {
        text.parse::<SocketAddr>()
            .ok()
            .or_else(|| Some(SocketAddr::new(text.parse().ok()?, settings.listen_port)))
    });
    if let Some(endpoint) = forced.filter(|e| reachable(e.ip())).or(learned) {
        return Some(endpoint);
    }
    let external = match settings.endpoint {
        EndpointChoice::External => family_first(settings.endpoint_family, |family| {
            own.addresses
                .iter()
                .find(|a| a.kind == NodeAddressKind::ExternalIP && Family::of(a.address) == family)
                .map(|a| a.address)
        }),
        EndpointChoice::Internal | EndpointChoice::Learned => None,
    };
    let ip = external.or_else(|| endpoint_ip(own, settings.endpoint_family))?;
    Some(SocketAddr::new(ip, settings.listen_port))
}

/// The node's addresses as host prefixes.
fn host_prefixes(node: &Node) -> impl Iterator<Item = Cidr> + '_ {
    node.addresses.iter().map(|a| Cidr {
        addr: a.address,
        prefix: match a.address {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        },
    })
}

/// The node's address of `family`, else of the other family.
fn endpoint_ip(node: &Node, family: Family) -> Option<IpAddr> {
    family_first(family, |f| node.primary_ip(f))
}

/// What `pick` finds of `family`, else of the other family.
fn family_first(family: Family, pick: impl Fn(Family) -> Option<IpAddr>) -> Option<IpAddr> {
    let other = match family {
        Family::V4 => Family::V6,
        Family::V6 => Family::V4,
    };
    pick(family).or_else(|| pick(other))
}

/// Whether `cidr` overlaps a prefix of `claimed`, in O(prefix length × log n): a prefix
/// that contains `cidr` is one of its supernets, and one that `cidr` contains sorts within
/// `cidr`'s address range. (Checking every pair made a join cost 0.8 s at 5,000 nodes.)
fn overlaps_any(claimed: &BTreeSet<Cidr>, cidr: Cidr) -> bool {
    let supernet = (0..=cidr.prefix).any(|prefix| {
        claimed.contains(
            &Cidr {
                addr: cidr.addr,
                prefix,
            }
            .network(),
        )
    });
    let first = cidr.network();
    let last = match first.addr {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(
            u32::from(a) | u32::MAX.checked_shr(u32::from(cidr.prefix)).unwrap_or(0),
        )),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(
            u128::from(a) | u128::MAX.checked_shr(u32::from(cidr.prefix)).unwrap_or(0),
        )),
    };
    let within = claimed
        .range(
            Cidr {
                addr: first.addr,
                prefix: 0,
            }..=Cidr {
                addr: last,
                prefix: u8::MAX,
            },
        )
        .next()
        .is_some();
    supernet || within
}

/// One per-peer change to the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerChange {
    /// Add the peer, or set its endpoint and replace its allowed IPs.
    Upsert(Key, Peer),
    Remove(Key),
}

/// The per-peer changes that turn `current` into `desired`: removals first, so that an
/// allowed IP moving from an old key to a new one is never claimed twice.
///
/// `learned` holds the endpoints of live sessions: WireGuard moves a peer's endpoint to the
/// source of its authenticated packets, and while the session lives that address is kept
/// over the planned one. Behind a NAT it is the only address that reaches the peer;
/// resetting it at every poll would cut the peer off until its next keepalive.
pub fn peer_changes(
    current: &BTreeMap<Key, Peer>,
    desired: &BTreeMap<Key, Peer>,
    learned: &BTreeMap<Key, SocketAddr>,
) -> Vec<PeerChange> {
    let removed = current
        .keys()
        .filter(|k| !desired.contains_key(k))
        .map(|k| PeerChange::Remove(*k));
    let upserted = desired.iter().filter_map(|(k, peer)| {
        let mut wanted = std::borrow::Cow::Borrowed(peer);
        if let Some(endpoint) = learned.get(k).filter(|e| peer.endpoint != Some(**e)) {
            wanted.to_mut().endpoint = Some(*endpoint);
        }
        (current.get(k) != Some(&*wanted)).then(|| PeerChange::Upsert(*k, wanted.into_owned()))
    });
    removed.chain(upserted).collect()
}

/// What to add and what to remove to turn `current` into `desired`.
pub fn set_changes<T: Ord + Copy>(
    current: &BTreeSet<T>,
    desired: &BTreeSet<T>,
) -> (Vec<T>, Vec<T>) {
    (
        desired.difference(current).copied().collect(),
        current.difference(desired).copied().collect(),
    )
}

/// The annotations our Node should carry. `peer_endpoints` ([`peer_endpoints_seen`]) is
/// there when it names a peer, or is emptied when `current` (our Node) still names some.
pub fn own_annotations(
    public: &Key,
    listen_port: u16,
    endpoint: Option<SocketAddr>,
    peer_endpoints: String,
    current: Option<&Node>,
) -> BTreeMap<&'static str, String> {
    let mut wanted = BTreeMap::from([
        (ANNOTATION_PUBLIC_KEY, public.to_base64()),
        (ANNOTATION_PORT, listen_port.to_string()),
    ]);
    if let Some(endpoint) = endpoint {
        wanted.insert(ANNOTATION_ENDPOINT, endpoint.to_string());
    }
    let stale = current
        .and_then(|node| node.annotation(ANNOTATION_PEER_ENDPOINTS))
        .is_some_and(|old| !old.is_empty());
    if !peer_endpoints.is_empty() || stale {
        wanted.insert(ANNOTATION_PEER_ENDPOINTS, peer_endpoints);
    }
    wanted
}

/// Whether `node` (our own, as the view has it) lacks any of `wanted`.
pub fn needs_publish(node: Option<&Node>, wanted: &BTreeMap<&'static str, String>) -> bool {
    node.is_none_or(|node| {
        wanted
            .iter()
            .any(|(k, v)| node.annotation(k) != Some(v.as_str()))
    })
}

/// The JSON merge patch that sets `wanted` and nothing else.
pub fn annotations_patch(wanted: &BTreeMap<&'static str, String>) -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": wanted } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_view::Update;
    use nodus_view::wire;

    fn settings() -> PlanSettings {
        PlanSettings {
            listen_port: 51820,
            endpoint_family: Family::V4,
            cluster_cidrs: vec![cidr("10.244.0.0/16"), cidr("fd00:10:244::/56")],
            node_cidrs: Vec::new(),
            endpoint: EndpointChoice::Internal,
            persistent_keepalive: 25,
            now: NOW,
        }
    }

    /// 2033-05-18: after every time the tests' Nodes carry.
    const NOW: i64 = 2_000_000_000;

    fn key(n: u8) -> Key {
        Key([n; 32])
    }

    fn node(
        name: &str,
        cidrs: &[&str],
        ips: &[&str],
        key: Option<Key>,
        port: Option<u16>,
    ) -> Update {
        let mut annotations = serde_json::Map::new();
        if let Some(key) = key {
            annotations.insert(ANNOTATION_PUBLIC_KEY.into(), key.to_base64().into());
        }
        if let Some(port) = port {
            annotations.insert(ANNOTATION_PORT.into(), port.to_string().into());
        }
        let addresses: Vec<_> = ips
            .iter()
            .map(|ip| serde_json::json!({"type": "InternalIP", "address": ip}))
            .collect();
        let json = serde_json::json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"podCIDRs": cidrs},
            "status": {"addresses": addresses},
        });
        Update::Node(Box::new(
            serde_json::from_value::<wire::Node>(json).expect("node"),
        ))
    }

    fn view(updates: Vec<Update>) -> View {
        let mut view = View::new("n1");
        view.apply(updates);
        view
    }

    fn cidr(text: &str) -> Cidr {
        text.parse().expect("cidr")
    }

    #[test]
    fn every_other_node_with_a_key_is_a_peer() {
        let view = view(vec![
            node(
                "n1",
                &["10.244.1.0/24", "fd00:10:244:1::/64"],
                &["192.168.1.1", "fd00::1"],
                Some(key(1)),
                None,
            ),
            node(
                "n2",
                &["10.244.2.0/24", "fd00:10:244:2::/64"],
                &["fd00::2", "192.168.1.2"],
                Some(key(2)),
                Some(5000),
            ),
            node("n3", &["10.244.3.0/24"], &["192.168.1.3"], None, None),
        ]);
        let plan = desired(&view, &settings(), &key(1), &Desired::default());
        assert_eq!(plan.peers.len(), 1);
        let peer = &plan.peers[&key(2)];
        assert_eq!(
            peer.endpoint,
            Some("192.168.1.2:5000".parse().expect("addr"))
        );
        assert_eq!(
            peer.allowed_ips,
            vec![
                cidr("10.244.2.0/24"),
                cidr("192.168.1.2/32"),
                cidr("fd00::2/128"),
                cidr("fd00:10:244:2::/64")
            ]
        );
        assert_eq!(&*plan.peer_nodes[&key(2)], "n2");
        assert_eq!(
            plan.routes,
            BTreeSet::from([cidr("10.244.2.0/24"), cidr("fd00:10:244:2::/64")])
        );
        assert_eq!(
            plan.device_addresses,
            BTreeSet::from([cidr("10.244.1.1/32"), cidr("fd00:10:244:1::1/128")])
        );
        assert_eq!(plan.own_endpoint, Some("192.168.1.1".parse().expect("ip")));
        assert_eq!(
            plan.skipped,
            vec![("n3".into(), "no WireGuard key published")]
        );

        let v6 = desired(
            &view,
            &PlanSettings {
                endpoint_family: Family::V6,
                ..settings()
            },
            &key(1),
            &Desired::default(),
        );
        assert_eq!(
            v6.peers[&key(2)].endpoint,
            Some("[fd00::2]:5000".parse().expect("addr"))
        );
    }

    #[test]
    fn conflicting_nodes_are_skipped_whatever_the_order() {
        let view = view(vec![
            own(),
            node(
                "n4",
                &["10.244.4.0/24"],
                &["192.168.1.4"],
                Some(key(2)),
                None,
            ),
            node(
                "n2",
                &["10.244.2.0/24"],
                &["192.168.1.2"],
                Some(key(2)),
                None,
            ),
            node(
                "n3",
                &["10.244.1.128/25"],
                &["192.168.1.3"],
                Some(key(3)),
                None,
            ),
            node(
                "n5",
                &["10.244.5.0/24"],
                &["192.168.1.5"],
                Some(key(1)),
                None,
            ),
            node("n6", &[], &["192.168.1.6"], Some(key(6)), None),
            node(
                "n7",
                &["10.244.7.0/24"],
                &["192.168.1.2"],
                Some(key(7)),
                None,
            ),
        ]);
        let plan = desired(&view, &settings(), &key(1), &Desired::default());
        assert_eq!(plan.peers.keys().collect::<Vec<_>>(), vec![&key(2)]);
        assert_eq!(&*plan.peer_nodes[&key(2)], "n2");
        let skipped: Vec<&str> = plan.skipped.iter().map(|(n, _)| &**n).collect();
        assert_eq!(skipped, vec!["n3", "n4", "n5", "n6", "n7"]);
    }

    /// `node(…)` made at `created` (RFC 3339), as the API server stamps it.
    fn created_at(update: Update, created: &str) -> Update {
        let Update::Node(mut node) = update else {
            unreachable!("node() makes nodes")
        };
        let json = serde_json::json!({"metadata": {"name": node.metadata.name, "creationTimestamp": created}});
        node.metadata.creation_timestamp = serde_json::from_value::<wire::Node>(json)
            .expect("node")
            .metadata
            .creation_timestamp;
        Update::Node(node)
    }

    #[test]
    fn of_two_nodes_claiming_one_range_the_older_keeps_it_whatever_the_names() {
        let nodes = |older: &str, newer: &str| {
            view(vec![
                own(),
                created_at(
                    node(
                        older,
                        &["10.244.2.0/24"],
                        &["192.168.1.2"],
                        Some(key(2)),
                        None,
                    ),
                    "2024-01-01T00:00:00Z",
                ),
                // The newer claims a range around the older's.
                created_at(
                    node(
                        newer,
                        &["10.244.0.0/22"],
                        &["192.168.1.3"],
                        Some(key(3)),
                        None,
                    ),
                    "2024-06-01T00:00:00Z",
                ),
            ])
        };
        for (older, newer) in [("a-old", "z-new"), ("z-old", "a-new")] {
            let plan = desired(
                &nodes(older, newer),
                &settings(),
                &key(1),
                &Desired::default(),
            );
            assert_eq!(plan.peers.keys().collect::<Vec<_>>(), vec![&key(2)]);
            assert_eq!(&*plan.peer_nodes[&key(2)], older);
            assert_eq!(plan.routes, BTreeSet::from([cidr("10.244.2.0/24")]));
            assert_eq!(plan.skipped.len(), 1);
            assert_eq!(&*plan.skipped[0].0, newer);
        }
    }

    /// `node(…)` whose kubelet reports it Ready.
    fn ready(update: Update) -> Update {
        let Update::Node(mut node) = update else {
            unreachable!("node() makes nodes")
        };
        node.status.conditions = vec![wire::NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: None,
        }];
        Update::Node(node)
    }

    fn own() -> Update {
        node(
            "n1",
            &["10.244.1.0/24"],
            &["192.168.1.1"],
            Some(key(1)),
            None,
        )
    }

    /// n3, ready, made on 2024-06-01, at 192.168.1.3.
    fn ready_n3() -> Update {
        let n3 = node(
            "n3",
            &["10.244.3.0/24"],
            &["192.168.1.3"],
            Some(key(3)),
            None,
        );
        created_at(ready(n3), "2024-06-01T00:00:00Z")
    }

    fn peers_of(plan: &Desired) -> Vec<&str> {
        plan.peer_nodes.values().map(|n| &**n).collect()
    }

    #[test]
    fn a_stale_or_not_ready_node_never_evicts_a_ready_one() {
        // A powered-off node's leftover Node (older, NotReady) still lists the address
        // DHCP has since given to a new machine.
        let ghost = || {
            let ghost = node(
                "ghost",
                &["10.244.9.0/24"],
                &["192.168.1.3"],
                Some(key(9)),
                None,
            );
            created_at(ghost, "2024-01-01T00:00:00Z")
        };
        let before = desired(
            &view(vec![own(), ghost()]),
            &settings(),
            &key(1),
            &Desired::default(),
        );
        assert_eq!(peers_of(&before), ["ghost"]);
        // Even though the ghost was a peer in the last plan, the ready node takes over.
        let plan = desired(
            &view(vec![own(), ghost(), ready_n3()]),
            &settings(),
            &key(1),
            &before,
        );
        assert_eq!(peers_of(&plan), ["n3"]);
        assert_eq!(plan.skipped, vec![("ghost".into(), OVERLAPS)]);
    }

    /// The tenants-2 review's N6: n2 squats n3's address; n3 turns NotReady for a moment
    /// (a silent kubelet, an API outage). It keeps its standing for the claim grace, so
    /// the squatter is not granted the address, and n3, Ready again, still has it. Only a
    /// node NotReady for longer than the grace loses to a ready one.
    #[test]
    fn a_not_ready_moment_does_not_hand_a_nodes_address_to_a_squatter() {
        let n2 = |ips: &[&str]| {
            let n2 = node("n2", &["10.244.2.0/24"], ips, Some(key(2)), None);
            created_at(ready(n2), "2024-01-01T00:00:00Z")
        };
        let not_ready_since = |since: i64| {
            let Update::Node(mut n3) = ready_n3() else {
                unreachable!("node() makes nodes")
            };
            n3.status.conditions = vec![wire::NodeCondition {
                type_: "Ready".into(),
                status: "Unknown".into(),
                last_transition_time: Some(since),
            }];
            Update::Node(n3)
        };
        let settled = desired(
            &view(vec![own(), n2(&["192.168.1.2"]), ready_n3()]),
            &settings(),
            &key(1),
            &Desired::default(),
        );
        let squatting = |n3: Update| view(vec![own(), n2(&["192.168.1.2", "192.168.1.3"]), n3]);
        let blip = desired(
            &squatting(not_ready_since(NOW - 60)),
            &settings(),
            &key(1),
            &settled,
        );
        assert_eq!(peers_of(&blip), ["n3"]);
        assert_eq!(blip.skipped, vec![("n2".into(), OVERLAPS)]);
        let back = desired(&squatting(ready_n3()), &settings(), &key(1), &blip);
        assert_eq!(peers_of(&back), ["n3"]);
        // NotReady past the grace: a ghost; the ready squatter takes the address.
        let gone = desired(
            &squatting(not_ready_since(NOW - CLAIM_GRACE_SECONDS - 1)),
            &settings(),
            &key(1),
            &settled,
        );
        assert_eq!(peers_of(&gone), ["n2"]);
    }

    #[test]
    fn a_node_that_claims_a_peers_address_or_key_later_does_not_take_it() {
        // n2 is older than n3; both are ready.
        let n2 = |ips: &[&str], key| {
            let n2 = node("n2", &["10.244.2.0/24"], ips, Some(key), None);
            created_at(ready(n2), "2024-01-01T00:00:00Z")
        };
        let settled = desired(
            &view(vec![own(), n2(&["192.168.1.2"], key(2)), ready_n3()]),
            &settings(),
            &key(1),
            &Desired::default(),
        );
        assert_eq!(peers_of(&settled), ["n2", "n3"]);
        // n2 adds n3's address to its own: n3's established claim holds, n2's new one is
        // refused (and n2 with it, until it drops the address).
        let squatting = || {
            view(vec![
                own(),
                n2(&["192.168.1.2", "192.168.1.3"], key(2)),
                ready_n3(),
            ])
        };
        let plan = desired(&squatting(), &settings(), &key(1), &settled);
        assert_eq!(peers_of(&plan), ["n3"]);
        assert_eq!(plan.skipped, vec![("n2".into(), OVERLAPS)]);
        // It stays so at the next plan, now that n3 alone is established.
        assert_eq!(
            peers_of(&desired(&squatting(), &settings(), &key(1), &plan)),
            ["n3"]
        );
        // An agent that starts afresh adopts what its device holds: n3 keeps its address.
        let afresh = desired(
            &squatting(),
            &settings(),
            &key(1),
            &Desired::adopted(&settled.peers),
        );
        assert_eq!(peers_of(&afresh), ["n3"]);
        // With nothing on its device (a node's first start), the older node wins.
        let empty = desired(&squatting(), &settings(), &key(1), &Desired::default());
        assert_eq!(peers_of(&empty), ["n2"]);
        // n2 copies n3's public key: the key stays n3's.
        let copied = view(vec![own(), n2(&["192.168.1.2"], key(3)), ready_n3()]);
        let plan = desired(&copied, &settings(), &key(1), &settled);
        assert_eq!(peers_of(&plan), ["n3"]);
        assert_eq!(plan.peer_nodes.get(&key(3)).map(|n| &**n), Some("n3"));
        assert_eq!(
            plan.skipped,
            vec![("n2".into(), "its key is another node's")]
        );
    }

    #[test]
    fn a_peer_sends_only_from_its_addresses_inside_node_cidrs() {
        // n2 lists an address outside the node network (one an ipBlock may allow).
        let n2 = || {
            let ips = ["192.168.1.2", "203.0.113.80"];
            node("n2", &["10.244.2.0/24"], &ips, Some(key(2)), None)
        };
        let plan = |node_cidrs: Vec<Cidr>| {
            let settings = PlanSettings {
                node_cidrs,
                ..settings()
            };
            let view = view(vec![own(), n2()]);
            desired(&view, &settings, &key(1), &Desired::default()).peers[&key(2)]
                .allowed_ips
                .clone()
        };
        let everything = plan(Vec::new());
        assert!(
            everything.contains(&cidr("203.0.113.80/32")),
            "{everything:?}"
        );
        let inside = plan(vec![cidr("192.168.0.0/16")]);
        assert_eq!(inside, [cidr("10.244.2.0/24"), cidr("192.168.1.2/32")]);
    }

    #[test]
    fn a_pod_cidr_outside_the_clusters_ranges_is_never_routed() {
        for claimed in ["8.0.0.0/7", "0.0.0.0/0", "10.244.0.0/15", "192.168.1.0/24"] {
            let view = view(vec![
                own(),
                node("rogue", &[claimed], &["192.168.1.9"], Some(key(9)), None),
                node(
                    "n2",
                    &["10.244.2.0/24", "fd00:10:244:2::/64"],
                    &["192.168.1.2"],
                    Some(key(2)),
                    None,
                ),
            ]);
            let plan = desired(&view, &settings(), &key(1), &Desired::default());
            assert_eq!(
                plan.peers.keys().collect::<Vec<_>>(),
                vec![&key(2)],
                "{claimed}"
            );
            assert_eq!(
                plan.skipped,
                vec![("rogue".into(), "its pod CIDRs are not inside cluster_cidrs")],
                "{claimed}"
            );
            assert!(
                plan.routes
                    .iter()
                    .all(|r| !r.contains(IpAddr::from([8, 8, 8, 8])))
            );
        }
        let no_ranges = PlanSettings {
            cluster_cidrs: Vec::new(),
            ..settings()
        };
        let view = view(vec![node(
            "n2",
            &["10.244.2.0/24"],
            &["192.168.1.2"],
            Some(key(2)),
            None,
        )]);
        assert!(
            desired(&view, &no_ranges, &key(1), &Desired::default())
                .peers
                .is_empty()
        );
    }

    #[test]
    fn deltas_touch_only_what_changed() {
        let peer = |ep: &str, ips: &[&str]| Peer {
            endpoint: Some(ep.parse().expect("addr")),
            allowed_ips: ips.iter().map(|c| cidr(c)).collect(),
            keepalive: 25,
        };
        let current = BTreeMap::from([
            (key(2), peer("192.168.1.2:51820", &["10.244.2.0/24"])),
            (key(3), peer("192.168.1.3:51820", &["10.244.3.0/24"])),
            (key(4), peer("192.168.1.4:51820", &["10.244.4.0/24"])),
        ]);
        let desired = BTreeMap::from([
            (key(2), peer("192.168.1.2:51820", &["10.244.2.0/24"])),
            (key(3), peer("192.168.1.33:51820", &["10.244.3.0/24"])),
            (key(9), peer("192.168.1.4:51820", &["10.244.4.0/24"])),
        ]);
        let none = BTreeMap::new();
        assert_eq!(
            peer_changes(&current, &desired, &none),
            vec![
                PeerChange::Remove(key(4)),
                PeerChange::Upsert(key(3), desired[&key(3)].clone()),
                PeerChange::Upsert(key(9), desired[&key(9)].clone()),
            ]
        );
        assert!(peer_changes(&desired, &desired, &none).is_empty());
        // A live session's endpoint, learned from the peer's packets (its NAT's address),
        // is kept over the planned one, also when something else of the peer changes.
        let learned = BTreeMap::from([(key(3), "203.0.113.9:40000".parse().expect("addr"))]);
        let behind_nat = BTreeMap::from([(key(3), peer("203.0.113.9:40000", &["10.244.3.0/24"]))]);
        let planned = BTreeMap::from([(key(3), peer("192.168.1.33:51820", &["10.244.3.0/24"]))]);
        assert!(peer_changes(&behind_nat, &planned, &learned).is_empty());
        let grown = BTreeMap::from([(
            key(3),
            peer("192.168.1.33:51820", &["10.244.3.0/24", "10.244.33.0/24"]),
        )]);
        assert_eq!(
            peer_changes(&behind_nat, &grown, &learned),
            vec![PeerChange::Upsert(
                key(3),
                peer("203.0.113.9:40000", &["10.244.3.0/24", "10.244.33.0/24"])
            )]
        );
        // Without a live session the planned endpoint comes back.
        assert_eq!(
            peer_changes(&behind_nat, &planned, &none),
            vec![PeerChange::Upsert(key(3), planned[&key(3)].clone())]
        );
        let (add, remove) = set_changes(
            &BTreeSet::from([cidr("10.0.1.0/24"), cidr("10.0.2.0/24")]),
            &BTreeSet::from([cidr("10.0.2.0/24"), cidr("10.0.3.0/24")]),
        );
        assert_eq!(
            (add, remove),
            (vec![cidr("10.0.3.0/24")], vec![cidr("10.0.1.0/24")])
        );
    }

    #[test]
    fn overlaps_are_found_both_ways() {
        let claimed = BTreeSet::from([
            cidr("10.244.1.0/24"),
            cidr("192.168.1.2/32"),
            cidr("fd00:10:244:1::/64"),
        ]);
        for (probe, expected) in [
            ("10.244.0.0/16", true),
            ("10.244.1.128/25", true),
            ("10.244.1.0/24", true),
            ("10.244.2.0/24", false),
            ("10.243.255.0/24", false),
            ("192.168.1.2/32", true),
            ("192.168.1.3/32", false),
            ("192.168.0.0/16", true),
            ("0.0.0.0/0", true),
            ("fd00:10:244:1:8000::/65", true),
            ("fd00:10:244:2::/64", false),
            ("::/0", true),
        ] {
            assert_eq!(overlaps_any(&claimed, cidr(probe)), expected, "{probe}");
        }
        assert!(!overlaps_any(&BTreeSet::new(), cidr("0.0.0.0/0")));
    }

    #[test]
    fn first_hosts_and_networks() {
        assert_eq!(
            cidr("10.244.1.0/24").first_host(),
            Some(cidr("10.244.1.1/32"))
        );
        assert_eq!(
            cidr("10.244.1.7/24").first_host(),
            Some(cidr("10.244.1.1/32"))
        );
        assert_eq!(cidr("10.244.1.0/31").first_host(), None);
        assert_eq!(cidr("fd00::/64").first_host(), Some(cidr("fd00::1/128")));
        assert_eq!(cidr("10.244.1.7/24").network(), cidr("10.244.1.0/24"));
        assert!(cidr("10.244.1.0/24").contains("10.244.1.200".parse().expect("ip")));
        assert!(!cidr("10.244.1.0/24").contains("10.244.2.1".parse().expect("ip")));
        assert!(!cidr("0.0.0.0/0").contains("::1".parse().expect("ip")));
        assert!(cidr("::/0").contains("fd00::1".parse().expect("ip")));
    }

    #[test]
    fn annotations_are_published_until_the_node_carries_them() {
        let wanted = own_annotations(
            &key(1),
            51820,
            Some("192.168.1.1:51820".parse().expect("addr")),
            String::new(),
            None,
        );
        assert_eq!(wanted[ANNOTATION_ENDPOINT], "192.168.1.1:51820");
        let patch = annotations_patch(&wanted);
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_PUBLIC_KEY],
            key(1).to_base64()
        );
        assert!(needs_publish(None, &wanted));
        let bare = view(vec![node(
            "n1",
            &["10.244.1.0/24"],
            &["192.168.1.1"],
            None,
            None,
        )]);
        assert!(needs_publish(bare.this_node(), &wanted));
        let done = view(vec![node(
            "n1",
            &["10.244.1.0/24"],
            &["192.168.1.1"],
            Some(key(1)),
            Some(51820),
        )]);
        let without_endpoint = own_annotations(&key(1), 51820, None, String::new(), None);
        assert!(!needs_publish(done.this_node(), &without_endpoint));
        assert!(needs_publish(done.this_node(), &wanted));
    }

    /// A node with `annotations` besides its key, and an ExternalIP when `external` is set.
    fn node_with(
        name: &str,
        i: u8,
        annotations: &[(&str, &str)],
        external: Option<&str>,
    ) -> Update {
        let mut addresses = vec![serde_json::json!({
            "type": "InternalIP", "address": format!("192.168.1.{i}")
        })];
        if let Some(ip) = external {
            addresses.push(serde_json::json!({"type": "ExternalIP", "address": ip}));
        }
        let mut map = serde_json::Map::new();
        map.insert(ANNOTATION_PUBLIC_KEY.into(), key(i).to_base64().into());
        for (k, v) in annotations {
            map.insert((*k).into(), (*v).into());
        }
        let json = serde_json::json!({
            "metadata": {"name": name, "annotations": map},
            "spec": {"podCIDRs": [format!("10.244.{i}.0/24")]},
            "status": {"addresses": addresses},
        });
        Update::Node(Box::new(serde_json::from_value(json).expect("node")))
    }

    #[test]
    fn peers_are_reached_where_they_publish_and_nodes_publish_what_they_are_told() {
        let own = || node_with("n1", 1, &[], Some("198.51.100.1"));
        let published = node_with(
            "n2",
            2,
            &[(ANNOTATION_ENDPOINT, "198.51.100.2:51999")],
            None,
        );
        let lying = node_with("n3", 3, &[(ANNOTATION_ENDPOINT, "127.0.0.1:51820")], None);
        let plan = desired(
            &view(vec![own(), published, lying]),
            &settings(),
            &key(1),
            &Desired::default(),
        );
        assert_eq!(
            plan.peers[&key(2)].endpoint,
            Some("198.51.100.2:51999".parse().expect("addr"))
        );
        // A loopback endpoint is no node's: the node's own address is used instead.
        assert_eq!(
            plan.peers[&key(3)].endpoint,
            Some("192.168.1.3:51820".parse().expect("addr"))
        );
        assert_eq!(plan.peers[&key(2)].keepalive, 25);
        assert_eq!(
            plan.published_endpoint,
            Some("192.168.1.1:51820".parse().expect("addr"))
        );
        assert_eq!(plan.own_endpoint, Some("192.168.1.1".parse().expect("ip")));

        let external_settings = PlanSettings {
            endpoint: EndpointChoice::External,
            ..settings()
        };
        let plan = desired(
            &view(vec![own()]),
            &external_settings,
            &key(1),
            &Desired::default(),
        );
        assert_eq!(
            plan.published_endpoint,
            Some("198.51.100.1:51820".parse().expect("addr"))
        );
        // The underlay, whose MTU the device takes, is still the internal address.
        assert_eq!(plan.own_endpoint, Some("192.168.1.1".parse().expect("ip")));
        // Without an ExternalIP, `external` publishes the InternalIP.
        let internal_only = node_with("n1", 1, &[], None);
        let plan = desired(
            &view(vec![internal_only]),
            &external_settings,
            &key(1),
            &Desired::default(),
        );
        assert_eq!(
            plan.published_endpoint,
            Some("192.168.1.1:51820".parse().expect("addr"))
        );
        // The operator's annotation wins, with our port when it names none.
        for (forced, expected) in [
            ("203.0.113.5", "203.0.113.5:51820"),
            ("203.0.113.5:4000", "203.0.113.5:4000"),
            ("0.0.0.0", "198.51.100.1:51820"),
            ("nonsense", "198.51.100.1:51820"),
        ] {
            let forced_node = node_with(
                "n1",
                1,
                &[(ANNOTATION_FORCE_ENDPOINT, forced)],
                Some("198.51.100.1"),
            );
            let plan = desired(
                &view(vec![forced_node]),
                &external_settings,
                &key(1),
                &Desired::default(),
            );
            assert_eq!(
                plan.published_endpoint,
                Some(expected.parse().expect("addr")),
                "{forced}"
            );
        }
    }

    #[test]
    #[expect(clippy::too_many_lines, reason = "one table of cases")]
    fn a_node_behind_a_nat_publishes_where_a_quorum_of_its_peers_see_it() {
        let learned_settings = PlanSettings {
            endpoint: EndpointChoice::Learned,
            ..settings()
        };
        let published_by = |nodes: Vec<Update>| {
            desired(
                &view(nodes),
                &learned_settings,
                &key(1),
                &Desired::default(),
            )
            .published_endpoint
        };
        let own_prefix = key_prefix(&key(1));
        let report = |endpoint: &str| format!("{}={endpoint},AAAA=192.0.2.1:1", own_prefix);
        let (seen, other) = (report("203.0.113.7:40000"), report("203.0.113.9:1"));
        let reporters = || {
            vec![
                node_with("n1", 1, &[], None),
                node_with("n2", 2, &[(ANNOTATION_PEER_ENDPOINTS, &seen)], None),
                node_with("n3", 3, &[(ANNOTATION_PEER_ENDPOINTS, &seen)], None),
                node_with("n4", 4, &[(ANNOTATION_PEER_ENDPOINTS, &other)], None),
            ]
        };
        let plan = desired(
            &view(reporters()),
            &learned_settings,
            &key(1),
            &Desired::default(),
        );
        assert_eq!(
            plan.published_endpoint,
            Some("203.0.113.7:40000".parse().expect("addr"))
        );
        // Internal publishing reads no report.
        let plan = desired(
            &view(reporters()),
            &settings(),
            &key(1),
            &Desired::default(),
        );
        assert_eq!(
            plan.published_endpoint,
            Some("192.168.1.1:51820".parse().expect("addr"))
        );
        // Nodes outside the mesh (here, without pod CIDRs) do not count, and a loopback
        // report is no address: the InternalIP until a peer sees us.
        let mut outside = node_with("n5", 5, &[(ANNOTATION_PEER_ENDPOINTS, &other)], None);
        if let Update::Node(node) = &mut outside {
            node.spec.pod_cidrs.clear();
            node.spec.pod_cidr = None;
        }
        let looped = report("127.0.0.1:51820");
        let lone = vec![
            node_with("n1", 1, &[], None),
            node_with("n2", 2, &[(ANNOTATION_PEER_ENDPOINTS, &looped)], None),
            outside,
        ];
        let plan = desired(&view(lone), &learned_settings, &key(1), &Desired::default());
        assert_eq!(plan.skipped, vec![("n5".into(), NO_POD_CIDRS)]);
        assert_eq!(
            plan.published_endpoint,
            Some("192.168.1.1:51820".parse().expect("addr"))
        );
        // What it published stays once the reports stop (its peers see what it publishes),
        // and a report of another address moves it.
        let published = [(ANNOTATION_ENDPOINT, "203.0.113.7:40000")];
        let quiet = vec![
            node_with("n1", 1, &published, None),
            node_with("n2", 2, &[], None),
        ];
        let plan = desired(
            &view(quiet),
            &learned_settings,
            &key(1),
            &Desired::default(),
        );
        assert_eq!(
            plan.published_endpoint,
            Some("203.0.113.7:40000".parse().expect("addr"))
        );
        let moved = vec![
            node_with("n1", 1, &published, None),
            node_with("n2", 2, &[(ANNOTATION_PEER_ENDPOINTS, &other)], None),
        ];
        assert_eq!(
            published_by(moved),
            Some("203.0.113.9:1".parse().expect("addr"))
        );
        // One node alone cannot move it where the mesh has more: with three peers, a
        // report needs two. Of n2, n3 and n4, only n4 reports another address.
        let lone_report = vec![
            node_with("n1", 1, &published, None),
            node_with("n2", 2, &[], None),
            node_with("n3", 3, &[], None),
            node_with("n4", 4, &[(ANNOTATION_PEER_ENDPOINTS, &other)], None),
        ];
        assert_eq!(
            published_by(lone_report),
            Some("203.0.113.7:40000".parse().expect("addr"))
        );
        // The operator's annotation still wins.
        let mut forced = reporters();
        forced[0] = node_with(
            "n1",
            1,
            &[(ANNOTATION_FORCE_ENDPOINT, "198.51.100.1")],
            None,
        );
        let plan = desired(
            &view(forced),
            &learned_settings,
            &key(1),
            &Desired::default(),
        );
        assert_eq!(
            plan.published_endpoint,
            Some("198.51.100.1:51820".parse().expect("addr"))
        );
    }

    #[test]
    fn a_node_reports_the_peers_it_sees_through_a_nat() {
        let nodes = vec![
            node_with("n1", 1, &[], None),
            node_with("n2", 2, &[], None),
            node_with("n3", 3, &[], None),
        ];
        let cluster = view(nodes);
        let plan = desired(&cluster, &settings(), &key(1), &Desired::default());
        let nat: SocketAddr = "203.0.113.9:4000".parse().expect("addr");
        let learned = BTreeMap::from([
            (key(2), nat),
            (key(3), "192.168.1.3:51820".parse().expect("addr")),
            (key(9), "203.0.113.10:1".parse().expect("addr")),
        ]);
        let text = peer_endpoints_seen(&plan, &learned);
        assert_eq!(text, format!("{}={nat}", key_prefix(&key(2))));
        // Once the peer publishes what we see, there is nothing to report.
        let settled = view(vec![
            node_with("n1", 1, &[], None),
            node_with("n2", 2, &[(ANNOTATION_ENDPOINT, "203.0.113.9:4000")], None),
            node_with("n3", 3, &[], None),
        ]);
        let settled_plan = desired(&settled, &settings(), &key(1), &Desired::default());
        assert_eq!(peer_endpoints_seen(&settled_plan, &learned), "");
        assert_eq!(
            peer_endpoints(&text).collect::<Vec<_>>(),
            [(key_prefix(&key(2)).as_str(), nat)]
        );
        assert!(text.len() <= PEER_KEY_PREFIX + 1 + 21);
        // Published while it names a peer; emptied once, when our Node still names one.
        let wanted = own_annotations(&key(1), 51820, None, text.clone(), None);
        assert_eq!(wanted[ANNOTATION_PEER_ENDPOINTS], text);
        let carrying = node_with("n1", 1, &[(ANNOTATION_PEER_ENDPOINTS, &text)], None);
        let carrying = view(vec![carrying]);
        let emptied = own_annotations(&key(1), 51820, None, String::new(), carrying.this_node());
        assert_eq!(emptied[ANNOTATION_PEER_ENDPOINTS], "");
        assert!(
            !own_annotations(&key(1), 51820, None, String::new(), None)
                .contains_key(ANNOTATION_PEER_ENDPOINTS)
        );
    }
}
