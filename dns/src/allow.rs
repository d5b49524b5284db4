//! Who may ask: the cluster's DNS answers the cluster's clients, not the world. A node
//! with a public address must not be an open resolver (forwarding anyone's questions,
//! and telling anyone the cluster's names).
//!
//! By default a client may ask from loopback, from this host's own addresses, from any
//! address of any Node (every node itself, and the hostNetwork pods on it), from the
//! configured cluster CIDRs and `dns.allow` prefixes, and, when no cluster CIDRs are
//! configured, from any Node's pod CIDR. With cluster CIDRs a Node's pod CIDR adds
//! nothing: a Node registered with `podCIDR: 0.0.0.0/0` (bootstrap credentials suffice)
//! cannot make every node an open resolver. Everyone else gets REFUSED, and
//! nothing is forwarded for them. The list is rebuilt from the view when Nodes change,
//! and looked up with a binary search over merged ranges ([`nodus_view::ranges`]).

use nodus_view::View;
use nodus_view::model::{Cidr, Family};
use nodus_view::ranges::merged_ranges;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The prefixes allowed whatever the view holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedPrefixes {
    /// The cluster's pod ranges (`cluster_cidrs`); without them, every Node's pod CIDR is
    /// trusted instead.
    pub cluster: Vec<Cidr>,
    /// `dns.allow`.
    pub extra: Vec<Cidr>,
}

/// The clients DNS answers: per family, sorted and merged inclusive ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    v4: Vec<(IpAddr, IpAddr)>,
    v6: Vec<(IpAddr, IpAddr)>,
}

impl AllowList {
    /// Loopback and `prefixes`.
    pub fn new(prefixes: &[Cidr]) -> AllowList {
        AllowList::of(prefixes, &[])
    }

    /// Loopback, `prefixes`, the `host`'s own addresses, every address of every Node in
    /// `view`, and when `prefixes` has no cluster CIDRs to hold them to, every Node's pod
    /// CIDR.
    pub fn from_view(view: &View, prefixes: &AllowedPrefixes, host: &[IpAddr]) -> AllowList {
        let mut cidrs: Vec<Cidr> = prefixes
            .cluster
            .iter()
            .chain(&prefixes.extra)
            .copied()
            .collect();
        let mut addresses = host.to_vec();
        for (_, node) in view.nodes() {
            if prefixes.cluster.is_empty() {
                cidrs.extend(node.pod_cidrs.iter().copied());
            }
            addresses.extend(node.addresses.iter().map(|a| a.address));
        }
        AllowList::of(&cidrs, &addresses)
    }

    fn of(cidrs: &[Cidr], addresses: &[IpAddr]) -> AllowList {
        let mut cidrs = cidrs.to_vec();
        cidrs.extend(LOOPBACK);
        AllowList {
            v4: merged_ranges(&cidrs, addresses, Family::V4),
            v6: merged_ranges(&cidrs, addresses, Family::V6),
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        // A v4 client on a dual-stack socket arrives as ::ffff:a.b.c.d: the same client.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            IpAddr::V4(_) => ip,
        };
        let ranges = match ip {
            IpAddr::V4(_) => &self.v4,
            IpAddr::V6(_) => &self.v6,
        };
        let after = ranges.partition_point(|(start, _)| *start <= ip);
        after > 0 && ranges[after - 1].1 >= ip
    }
}

const LOOPBACK: [Cidr; 2] = [
    Cidr {
        addr: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)),
        prefix: 8,
    },
    Cidr {
        addr: IpAddr::V6(Ipv6Addr::LOCALHOST),
        prefix: 128,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Cidr {
        text.parse().expect("cidr")
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn prefixes_and_loopback_are_allowed_and_nothing_else() {
        let allow = AllowList::new(&[cidr("10.244.0.0/16"), cidr("fd00:244::/48")]);
        for inside in [
            "10.244.0.0",
            "10.244.255.255",
            "127.0.0.53",
            "::1",
            "fd00:244::5",
        ] {
            assert!(allow.contains(ip(inside)), "{inside}");
        }
        for outside in [
            "10.243.255.255",
            "10.245.0.0",
            "203.0.113.7",
            "fd00:245::1",
            "::2",
        ] {
            assert!(!allow.contains(ip(outside)), "{outside}");
        }
    }

    #[test]
    fn a_v4_client_on_a_dual_stack_socket_is_its_v4_address() {
        let allow = AllowList::new(&[cidr("10.244.0.0/16")]);
        assert!(allow.contains(ip("::ffff:10.244.1.5")));
        assert!(!allow.contains(ip("::ffff:192.0.2.1")));
    }

    #[test]
    fn overlapping_and_adjacent_ranges_merge() {
        let allow = AllowList::new(&[
            cidr("10.0.0.0/25"),
            cidr("10.0.0.128/25"),
            cidr("10.0.0.0/24"),
            cidr("10.0.1.7/32"),
        ]);
        assert_eq!(allow.v4.len(), 3, "with 127.0.0.0/8: {allow:?}");
        assert!(allow.contains(ip("10.0.0.200")));
        assert!(!allow.contains(ip("10.0.1.6")));
        assert!(allow.contains(ip("10.0.1.7")));
    }

    #[test]
    fn everyone_can_be_let_in() {
        let allow = AllowList::new(&[cidr("0.0.0.0/0"), cidr("::/0")]);
        assert!(allow.contains(ip("203.0.113.7")));
        assert!(allow.contains(ip("2001:db8::1")));
    }

    #[test]
    fn every_nodes_addresses_and_pod_cidrs_are_allowed() {
        let mut view = View::new("node-1");
        let node = |name: &str, address: &str, pods: &str| {
            nodus_view::Update::Node(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name},
                    "spec": {"podCIDRs": [pods]},
                    "status": {"addresses": [{"type": "InternalIP", "address": address}]}
                }))
                .expect("node"),
            )
        };
        view.apply([
            node("node-1", "172.30.0.11", "10.244.1.0/24"),
            node("node-2", "172.30.0.12", "10.244.2.0/24"),
            // A rogue Node (bootstrap credentials suffice) claiming every address.
            node("rogue", "172.30.0.99", "0.0.0.0/0"),
        ]);
        let host = [ip("192.0.2.9")];
        // With the cluster's pod ranges, Nodes' pod CIDRs are held to them.
        let cluster = AllowedPrefixes {
            cluster: vec![cidr("10.244.0.0/16")],
            extra: Vec::new(),
        };
        let allow = AllowList::from_view(&view, &cluster, &host);
        for inside in [
            "172.30.0.12",
            "10.244.2.77",
            "10.244.3.1",
            "127.0.0.1",
            "192.0.2.9",
        ] {
            assert!(allow.contains(ip(inside)), "{inside}");
        }
        for outside in ["172.30.0.13", "203.0.113.7", "10.245.0.1"] {
            assert!(!allow.contains(ip(outside)), "{outside}");
        }
        // Without them, every Node's pod CIDR is trusted, the rogue's too.
        let allow = AllowList::from_view(&view, &AllowedPrefixes::default(), &host);
        assert!(allow.contains(ip("203.0.113.7")));
    }
}
