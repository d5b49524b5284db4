//! Names of per-service chains and sets (checklist K.64).
//!
//! As in kube-proxy, a name is a role prefix, a short hash and the readable identity:
//! `service-K7XQ2M4A-shop/cart/ipv4/tcp/http`, and for an endpoint
//! `endpoint-…-shop/cart/ipv4/tcp/http__10.244.1.5/8080`. The hash covers the whole
//! identity, so names stay unique when a long one is cut to the kernel's limit. Names
//! live in the kernel across agent restarts and upgrades, so the hash is FNV-1a, whose
//! output never changes, not `std`'s hasher, whose algorithm may.

use std::net::IpAddr;

use nodus_view::model::{Family, Protocol};

/// nf_tables chain and set names hold at most 255 bytes (256 with the NUL).
pub const MAX_NAME_LEN: usize = 255;

/// Characters of the hash: 40 bits in base32.
const HASH_CHARS: usize = 8;

/// Which service port (and family) a group of chains belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortIdentity {
    /// `ns/svc/ipv4/tcp/http`: the readable part of every name of this port.
    path: String,
    /// Where its `ns/svc/ipv4` ends.
    family_end: usize,
}

impl PortIdentity {
    /// `port_label` is the port's name, or its number when it has none.
    pub fn new(
        namespace: &str,
        service: &str,
        family: Family,
        protocol: Protocol,
        port_label: &str,
    ) -> PortIdentity {
        let family = match family {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        };
        let service_wide = format!("{namespace}/{service}/{family}");
        PortIdentity {
            family_end: service_wide.len(),
            path: format!("{service_wide}/{}/{port_label}", protocol_name(protocol)),
        }
    }

    /// The identity every port of the service shares in this family, `ns/svc/ipv4`: the
    /// dispatch chains it names hold one rule per port (`service-…-ns/svc/ipv4`), since
    /// the kernel walks every chain of the namespace at every commit.
    pub fn service_wide(&self) -> PortIdentity {
        PortIdentity {
            path: self.path[..self.family_end].to_string(),
            family_end: self.family_end,
        }
    }

    /// `service-…`: dispatch to the endpoints usable under the Cluster policy.
    pub fn cluster_chain(&self) -> String {
        name("service", &self.path)
    }

    /// `local-…`: dispatch to this node's endpoints (a Local policy).
    pub fn local_chain(&self) -> String {
        name("local", &self.path)
    }

    /// `external-…`: the entry for NodePort, ExternalIP and load-balancer traffic.
    pub fn external_chain(&self) -> String {
        name("external", &self.path)
    }

    /// `firewall-…`: drops load-balancer traffic from outside the source ranges.
    pub fn firewall_chain(&self) -> String {
        name("firewall", &self.path)
    }

    /// `endpoint-…__<ip>/<port>`: hairpin masquerade, affinity refresh, DNAT.
    pub fn endpoint_chain(&self, ip: IpAddr, port: u16) -> String {
        name("endpoint", &self.endpoint_path(ip, port))
    }

    /// `affinity-…__<ip>/<port>`: the clients recently sent to one endpoint. The timeout
    /// is part of the hash: a changed timeout means a new set, which the rules then name,
    /// so the old one is no longer referenced and can be deleted in the same batch.
    pub fn affinity_set(&self, ip: IpAddr, port: u16, timeout_seconds: u32) -> String {
        let path = self.endpoint_path(ip, port);
        let hashed = format!("{path}#{timeout_seconds}");
        bounded(format!("affinity-{}-{path}", hash(&hashed)))
    }

    fn endpoint_path(&self, ip: IpAddr, port: u16) -> String {
        // nft's scanner does not take `:` inside a name; kube-proxy writes dots instead.
        let ip = ip.to_string().replace(':', ".");
        format!("{}__{ip}/{port}", self.path)
    }
}

pub fn protocol_name(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn name(prefix: &str, path: &str) -> String {
    bounded(format!("{prefix}-{}-{path}", hash(path)))
}

/// Splits `role-HASH-path` into role and path when the name is exactly what
/// [`join_name`] makes of them (not cut, hash over the path alone), so that a compact
/// record can store the path and recompute the rest.
pub(crate) fn split_name(full: &str) -> Option<(&str, &str)> {
    let (role, rest) = full.split_once('-')?;
    let path = rest.get(HASH_CHARS + 1..)?;
    (name(role, path) == full).then_some((role, path))
}

/// The name of role `role` for `path`, as every per-port chain is named.
pub(crate) fn join_name(role: &str, path: &str) -> String {
    name(role, path)
}

/// Cuts `name` to [`MAX_NAME_LEN`] bytes, on a character boundary.
fn bounded(mut name: String) -> String {
    if name.len() > MAX_NAME_LEN {
        let mut end = MAX_NAME_LEN;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// Eight base32 characters (RFC 4648 alphabet) of the FNV-1a hash of `text`.
fn hash(text: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let digest = text.bytes().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    });
    (0..HASH_CHARS)
        .map(|i| char::from(ALPHABET[((digest >> (5 * i)) & 31) as usize]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K.64: readable, deterministic, bounded names.
    #[test]
    fn k64_names_are_readable_deterministic_and_bounded() {
        let port = PortIdentity::new("shop", "cart", Family::V4, Protocol::Tcp, "http");
        let chain = port.cluster_chain();
        assert!(chain.starts_with("service-"), "{chain}");
        assert!(chain.ends_with("-shop/cart/ipv4/tcp/http"), "{chain}");
        assert_eq!(
            chain.len(),
            "service-".len() + 8 + "-shop/cart/ipv4/tcp/http".len()
        );
        assert_eq!(chain, port.cluster_chain(), "deterministic");
        assert_eq!(
            port.external_chain()["external-".len()..],
            chain["service-".len()..],
            "one port's chains share hash and path"
        );
        let shared = port.service_wide().cluster_chain();
        assert!(shared.ends_with("-shop/cart/ipv4"), "{shared}");
        let other = PortIdentity::new("shop", "cart", Family::V4, Protocol::Udp, "dns");
        assert_eq!(other.service_wide().cluster_chain(), shared);
        let v6 = PortIdentity::new("shop", "cart", Family::V6, Protocol::Tcp, "http");
        assert_ne!(v6.cluster_chain(), chain);
        let endpoint = v6.endpoint_chain("fd00::5".parse().expect("ip"), 8080);
        assert!(endpoint.ends_with("__fd00..5/8080"), "{endpoint}");

        let long = "n".repeat(63);
        let huge = PortIdentity::new(&long, &long, Family::V6, Protocol::Sctp, &long);
        let ip = "fd00:1111:2222:3333:4444:5555:6666:7777"
            .parse()
            .expect("ip");
        let a = huge.endpoint_chain(ip, 8080);
        let b = huge.endpoint_chain(ip, 8081);
        assert_eq!(a.len(), MAX_NAME_LEN);
        assert_ne!(a, b, "the hash keeps truncated names apart");
        assert_ne!(
            huge.affinity_set(ip, 8080, 10),
            huge.affinity_set(ip, 8080, 20)
        );
    }
}
