//! Where DNS listens: the configured addresses, except a wildcard (`0.0.0.0:53`,
//! `[::]:53`) that another server on the same port keeps from binding. A node's own
//! resolver often holds one address of the port (systemd-resolved on 127.0.0.53:53,
//! Talos's host DNS), and Linux refuses the wildcard beside it; nodus then listens on each
//! address of the host of that family instead, and follows them as they come and go
//! (a pod's veth, the mesh's device), so that it starts, and still forwards to that
//! resolver.

#![allow(unsafe_code)] // getifaddrs, with its SAFETY comment

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// One configured listen address, as it will be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listen {
    /// Bound as configured.
    Fixed(SocketAddr),
    /// A wildcard that could not be bound: every host address of its family, at its port.
    EachAddress(SocketAddr),
}

/// Decides, for each address of `listen`, whether it can be bound as it is: a wildcard is
/// tried (UDP and TCP) and released at once.
pub fn plan(listen: &[SocketAddr]) -> Vec<Listen> {
    listen
        .iter()
        .map(|addr| {
            if addr.ip().is_unspecified() && !wildcard_is_free(*addr) {
                Listen::EachAddress(*addr)
            } else {
                Listen::Fixed(*addr)
            }
        })
        .collect()
}

fn wildcard_is_free(addr: SocketAddr) -> bool {
    let udp = std::net::UdpSocket::bind(addr);
    let port = match &udp {
        Ok(socket) => socket.local_addr().map_or(addr.port(), |a| a.port()),
        Err(error) => return error.kind() != io::ErrorKind::AddrInUse,
    };
    match std::net::TcpListener::bind(SocketAddr::new(addr.ip(), port)) {
        Ok(_) => true,
        Err(error) => error.kind() != io::ErrorKind::AddrInUse,
    }
}

/// The concrete addresses `plan` serves now: the fixed ones, and for each followed
/// wildcard, the host's addresses of its family. IPv6 link-local addresses are left out
/// (a socket on one needs its interface, and clients reach DNS on other addresses).
pub fn addresses(plan: &[Listen], host: &[IpAddr]) -> BTreeSet<SocketAddr> {
    let mut addresses = BTreeSet::new();
    for listen in plan {
        match listen {
            Listen::Fixed(addr) => {
                addresses.insert(*addr);
            }
            Listen::EachAddress(wildcard) => {
                addresses.extend(
                    host.iter()
                        .filter(|ip| ip.is_ipv4() == wildcard.is_ipv4())
                        .filter(|ip| !is_ipv6_link_local(ip))
                        .map(|ip| SocketAddr::new(*ip, wildcard.port())),
                );
            }
        }
    }
    addresses
}

/// The addresses whose queries reach this server, for telling upstreams from ourselves
/// ([`crate::forward::upstreams_from_resolv_conf`]): a bound wildcard as it is (every
/// local address reaches it), a followed one as the host's addresses, which leave out the
/// other resolver's.
pub fn own_addresses(plan: &[Listen], host: &[IpAddr]) -> Vec<SocketAddr> {
    plan.iter()
        .flat_map(|listen| match listen {
            Listen::Fixed(addr) => vec![*addr],
            Listen::EachAddress(_) => addresses(std::slice::from_ref(listen), host)
                .into_iter()
                .collect(),
        })
        .collect()
}

fn is_ipv6_link_local(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// The addresses of every interface of this network namespace.
pub fn host_addresses() -> io::Result<Vec<IpAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list this function frees below; each
    // entry's address is read according to its family, as getifaddrs(3) documents.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut found = Vec::new();
        let mut entry = list;
        while !entry.is_null() {
            let addr = (*entry).ifa_addr;
            if !addr.is_null() {
                match i32::from((*addr).sa_family) {
                    libc::AF_INET => {
                        let v4 = &*addr.cast::<libc::sockaddr_in>();
                        found.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))));
                    }
                    libc::AF_INET6 => {
                        let v6 = &*addr.cast::<libc::sockaddr_in6>();
                        found.push(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            entry = (*entry).ifa_next;
        }
        libc::freeifaddrs(list);
        found.sort();
        found.dedup();
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("address")
    }

    #[test]
    fn a_followed_wildcard_serves_each_host_address_of_its_family() {
        let host: Vec<IpAddr> = ["127.0.0.1", "10.0.0.5", "::1", "fe80::1", "fd00::5"]
            .iter()
            .map(|ip| ip.parse().expect("ip"))
            .collect();
        let plan = [
            Listen::EachAddress(addr("0.0.0.0:53")),
            Listen::Fixed(addr("[fd00::53]:5353")),
        ];
        let served: Vec<String> = addresses(&plan, &host)
            .iter()
            .map(SocketAddr::to_string)
            .collect();
        assert_eq!(
            served,
            ["10.0.0.5:53", "127.0.0.1:53", "[fd00::53]:5353"],
            "IPv4 host addresses at the wildcard's port, and the fixed one"
        );
    }

    #[test]
    fn a_resolver_beside_a_followed_wildcard_is_not_taken_for_ourselves() {
        let host: Vec<IpAddr> = vec!["127.0.0.1".parse().expect("ip")];
        let followed = own_addresses(&[Listen::EachAddress(addr("0.0.0.0:53"))], &host);
        assert_eq!(followed, [addr("127.0.0.1:53")]);
        let upstreams =
            crate::forward::parse_resolv_conf("nameserver 127.0.0.53\n", &followed, |_| None);
        assert_eq!(upstreams, [addr("127.0.0.53:53")]);
        // A bound wildcard answers on every loopback address: a nameserver there is us.
        let bound = own_addresses(&[Listen::Fixed(addr("0.0.0.0:53"))], &host);
        assert!(
            crate::forward::parse_resolv_conf("nameserver 127.0.0.53\n", &bound, |_| None)
                .is_empty()
        );
    }

    #[test]
    fn host_addresses_include_loopback() {
        let host = host_addresses().expect("getifaddrs");
        assert!(host.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{host:?}");
    }
}
