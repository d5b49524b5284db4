//! UDP conntrack entries over ctnetlink: read from a dump, deleted one by one by their
//! exact tuple. A UDP flow keeps its DNAT target for as long as packets keep it alive,
//! so when an endpoint stops serving the proxy deletes the entries it answers (checklist
//! I.53). As upstream's `pkg/proxy/conntrack/cleanup.go`, the table is dumped and each
//! stale entry deleted by its tuple: that works on every kernel (a filtered delete needs
//! Linux 6.3), and the decision needs no memory of an earlier run, so it also holds after
//! a restart.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::attr::{self, Attr};
use super::sys;

const UDP: u8 = libc::IPPROTO_UDP as u8;

/// One side of a conntrack tuple: source and destination, each an address and a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowTuple {
    pub source: (IpAddr, u16),
    pub destination: (IpAddr, u16),
}

/// One UDP conntrack entry: what the client sent (the original tuple), and who answers
/// (the reply tuple's source: the endpoint, after DNAT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpEntry {
    pub original: FlowTuple,
    pub reply_source: (IpAddr, u16),
    /// The conntrack zone, part of the entry's identity; 0 when none is set.
    pub zone: u16,
}

impl UdpEntry {
    /// The entry of one ctnetlink message body (after the `nfgenmsg` header); `None` for
    /// another protocol or a message without both tuples.
    pub(crate) fn parse(body: &[u8]) -> Option<UdpEntry> {
        let original = attr::find(body, sys::CTA_TUPLE_ORIG)?;
        let reply = attr::find(body, sys::CTA_TUPLE_REPLY)?;
        let (protocol, original) = parse_tuple(original)?;
        let (_, reply) = parse_tuple(reply)?;
        let zone = attr::find(body, sys::CTA_ZONE)
            .and_then(|zone| Some(u16::from_be_bytes(zone.get(..2)?.try_into().ok()?)))
            .unwrap_or(0);
        (protocol == UDP).then_some(UdpEntry {
            original,
            reply_source: reply.source,
            zone,
        })
    }

    /// The attributes of a dump request for UDP entries only. The kernel then skips the
    /// other protocols' entries (`CTA_FILTER`, Linux 5.8) instead of encoding each one
    /// for us to drop, and on a node the TCP entries (every connection, and for two
    /// minutes after it closed) far outnumber the UDP ones.
    pub(crate) fn dump_attrs() -> Vec<Attr> {
        let protocol = Attr::bytes(sys::CTA_PROTO_NUM, vec![UDP]);
        vec![
            Attr::nested(
                sys::CTA_TUPLE_ORIG,
                vec![Attr::nested(sys::CTA_TUPLE_PROTO, vec![protocol])],
            ),
            // The flags are host-order u32s (`NLA_U32`), unlike nf_tables numbers.
            Attr::nested(
                sys::CTA_FILTER,
                vec![
                    Attr::bytes(
                        sys::CTA_FILTER_ORIG_FLAGS,
                        sys::CTA_FILTER_F_CTA_PROTO_NUM.to_ne_bytes(),
                    ),
                    Attr::bytes(sys::CTA_FILTER_REPLY_FLAGS, 0u32.to_ne_bytes()),
                ],
            ),
        ]
    }

    pub(crate) fn family_number(&self) -> u8 {
        match self.original.destination.0 {
            IpAddr::V4(_) => libc::AF_INET as u8,
            IpAddr::V6(_) => libc::AF_INET6 as u8,
        }
    }

    /// The attributes of a delete request for exactly this entry.
    pub(crate) fn delete_attrs(&self) -> Vec<Attr> {
        let mut attrs = vec![Attr::nested(sys::CTA_TUPLE_ORIG, tuple(UDP, self.original))];
        if self.zone != 0 {
            attrs.push(Attr::bytes(sys::CTA_ZONE, self.zone.to_be_bytes()));
        }
        attrs
    }
}

/// The inside of a `CTA_TUPLE_ORIG` or `CTA_TUPLE_REPLY` nest.
fn tuple(protocol: u8, tuple: FlowTuple) -> Vec<Attr> {
    vec![
        Attr::nested(
            sys::CTA_TUPLE_IP,
            vec![
                address(tuple.source.0, sys::CTA_IP_V4_SRC, sys::CTA_IP_V6_SRC),
                address(tuple.destination.0, sys::CTA_IP_V4_DST, sys::CTA_IP_V6_DST),
            ],
        ),
        Attr::nested(
            sys::CTA_TUPLE_PROTO,
            vec![
                Attr::bytes(sys::CTA_PROTO_NUM, vec![protocol]),
                Attr::bytes(sys::CTA_PROTO_SRC_PORT, tuple.source.1.to_be_bytes()),
                Attr::bytes(sys::CTA_PROTO_DST_PORT, tuple.destination.1.to_be_bytes()),
            ],
        ),
    ]
}

fn address(ip: IpAddr, v4_kind: u16, v6_kind: u16) -> Attr {
    match ip {
        IpAddr::V4(ip) => Attr::bytes(v4_kind, ip.octets().to_vec()),
        IpAddr::V6(ip) => Attr::bytes(v6_kind, ip.octets().to_vec()),
    }
}

/// `CTA_TUPLE_IP { src, dst }, CTA_TUPLE_PROTO { num, sport, dport }`: the protocol and
/// the tuple; `None` when a part is missing (the ports of ICMP, say).
fn parse_tuple(nest: &[u8]) -> Option<(u8, FlowTuple)> {
    let ips = attr::find(nest, sys::CTA_TUPLE_IP)?;
    let proto = attr::find(nest, sys::CTA_TUPLE_PROTO)?;
    let ip = |v4_kind: u16, v6_kind: u16| -> Option<IpAddr> {
        if let Some(v4) = attr::find(ips, v4_kind) {
            let octets: [u8; 4] = v4.try_into().ok()?;
            return Some(IpAddr::V4(Ipv4Addr::from(octets)));
        }
        let octets: [u8; 16] = attr::find(ips, v6_kind)?.try_into().ok()?;
        Some(IpAddr::V6(Ipv6Addr::from(octets)))
    };
    let port = |kind: u16| -> Option<u16> {
        Some(u16::from_be_bytes(
            attr::find(proto, kind)?.try_into().ok()?,
        ))
    };
    let protocol = *attr::find(proto, sys::CTA_PROTO_NUM)?.first()?;
    Some((
        protocol,
        FlowTuple {
            source: (
                ip(sys::CTA_IP_V4_SRC, sys::CTA_IP_V6_SRC)?,
                port(sys::CTA_PROTO_SRC_PORT)?,
            ),
            destination: (
                ip(sys::CTA_IP_V4_DST, sys::CTA_IP_V6_DST)?,
                port(sys::CTA_PROTO_DST_PORT)?,
            ),
        },
    ))
}

impl fmt::Display for UdpEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "UDP flow {} -> {} answered by {}",
            SocketAddr::from(self.original.source),
            SocketAddr::from(self.original.destination),
            SocketAddr::from(self.reply_source)
        )?;
        if self.zone != 0 {
            write!(f, " in zone {}", self.zone)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    fn flow(source: (&str, u16), destination: (&str, u16)) -> FlowTuple {
        FlowTuple {
            source: (ip(source.0), source.1),
            destination: (ip(destination.0), destination.1),
        }
    }

    /// A dumped entry as the kernel sends it: both tuples, the zone when set.
    fn dumped(protocol: u8, zone: Option<u16>) -> Vec<u8> {
        let original = flow(("10.0.0.2", 5000), ("10.96.0.10", 53));
        let reply = flow(("10.244.1.5", 5353), ("10.0.0.2", 5000));
        let mut attrs = vec![
            Attr::nested(sys::CTA_TUPLE_ORIG, tuple(protocol, original)),
            Attr::nested(sys::CTA_TUPLE_REPLY, tuple(protocol, reply)),
        ];
        if let Some(zone) = zone {
            attrs.push(Attr::bytes(sys::CTA_ZONE, zone.to_be_bytes()));
        }
        attr::encode(&attrs)
    }

    #[test]
    fn a_dumped_udp_entry_is_read_and_deleted_by_its_exact_tuple() {
        let entry = UdpEntry::parse(&dumped(UDP, Some(7))).expect("a UDP entry");
        assert_eq!(entry.original.source, (ip("10.0.0.2"), 5000));
        assert_eq!(entry.original.destination, (ip("10.96.0.10"), 53));
        assert_eq!(entry.reply_source, (ip("10.244.1.5"), 5353));
        assert_eq!(entry.zone, 7);
        assert_eq!(
            entry.to_string(),
            "UDP flow 10.0.0.2:5000 -> 10.96.0.10:53 answered by 10.244.1.5:5353 in zone 7"
        );
        let request = attr::encode(&entry.delete_attrs());
        let original = attr::find(&request, sys::CTA_TUPLE_ORIG).expect("the original tuple");
        assert_eq!(
            parse_tuple(original),
            Some((UDP, entry.original)),
            "the full original tuple, not a filter"
        );
        assert!(attr::find(&request, sys::CTA_TUPLE_REPLY).is_none());
        assert!(attr::find(&request, sys::CTA_FILTER).is_none());
        assert_eq!(
            attr::find(&request, sys::CTA_ZONE),
            Some(&7u16.to_be_bytes()[..])
        );
    }

    #[test]
    fn a_dump_asks_the_kernel_for_udp_entries_only() {
        let request = attr::encode(&UdpEntry::dump_attrs());
        let original = attr::find(&request, sys::CTA_TUPLE_ORIG).expect("the filter's tuple");
        let proto = attr::find(original, sys::CTA_TUPLE_PROTO).expect("its protocol");
        assert_eq!(attr::find(proto, sys::CTA_PROTO_NUM), Some(&[UDP][..]));
        assert!(
            attr::find(original, sys::CTA_TUPLE_IP).is_none(),
            "any address"
        );
        let filter = attr::find(&request, sys::CTA_FILTER).expect("the filter");
        let flags = |kind| {
            let bytes = attr::find(filter, kind).expect("flags");
            u32::from_ne_bytes(bytes.try_into().expect("a u32"))
        };
        assert_eq!(
            flags(sys::CTA_FILTER_ORIG_FLAGS),
            sys::CTA_FILTER_F_CTA_PROTO_NUM
        );
        assert_eq!(flags(sys::CTA_FILTER_REPLY_FLAGS), 0);
    }

    #[test]
    fn entries_of_other_protocols_are_not_read() {
        let tcp = libc::IPPROTO_TCP as u8;
        assert_eq!(UdpEntry::parse(&dumped(tcp, None)), None);
        let entry = UdpEntry::parse(&dumped(UDP, None)).expect("a UDP entry");
        assert_eq!(entry.zone, 0);
        assert_eq!(entry.delete_attrs().len(), 1, "no zone attribute");
    }
}
