//! Conntrack entries to delete, as ctnetlink filters: a UDP flow keeps its DNAT target
//! for as long as packets keep it alive, so when an endpoint goes away (or a service
//! that rejected gets endpoints) the proxy must delete the entries, as kube-proxy does
//! (checklist I.53). One `IPCTNL_MSG_CT_DELETE` with `CTA_FILTER` deletes every match
//! in the kernel (Linux 6.3 and later), without dumping the table.

use std::fmt;
use std::net::IpAddr;

use super::attr::Attr;
use super::sys;

/// Which flows of one protocol to delete: those a client sent to `service`
/// (original destination), and, when `endpoint` is set, only those answered by it
/// (reply source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowFilter {
    pub protocol: u8,
    pub service: (IpAddr, u16),
    pub endpoint: Option<(IpAddr, u16)>,
}

impl FlowFilter {
    pub(crate) fn family_number(&self) -> u8 {
        match self.service.0 {
            IpAddr::V4(_) => libc::AF_INET as u8,
            IpAddr::V6(_) => libc::AF_INET6 as u8,
        }
    }

    pub(crate) fn attrs(&self) -> Vec<Attr> {
        let original = tuple(
            self.protocol,
            (sys::CTA_IP_V4_DST, sys::CTA_IP_V6_DST),
            sys::CTA_PROTO_DST_PORT,
            self.service,
        );
        let mut attrs = vec![Attr::nested(sys::CTA_TUPLE_ORIG, original)];
        let mut filter = vec![host_u32(
            sys::CTA_FILTER_ORIG_FLAGS,
            sys::CTA_FILTER_F_CTA_IP_DST
                | sys::CTA_FILTER_F_CTA_PROTO_NUM
                | sys::CTA_FILTER_F_CTA_PROTO_DST_PORT,
        )];
        if let Some(endpoint) = self.endpoint {
            let reply = tuple(
                self.protocol,
                (sys::CTA_IP_V4_SRC, sys::CTA_IP_V6_SRC),
                sys::CTA_PROTO_SRC_PORT,
                endpoint,
            );
            attrs.push(Attr::nested(sys::CTA_TUPLE_REPLY, reply));
            filter.push(host_u32(
                sys::CTA_FILTER_REPLY_FLAGS,
                sys::CTA_FILTER_F_CTA_IP_SRC
                    | sys::CTA_FILTER_F_CTA_PROTO_NUM
                    | sys::CTA_FILTER_F_CTA_PROTO_SRC_PORT,
            ));
        }
        attrs.push(Attr::nested(sys::CTA_FILTER, filter));
        attrs
    }
}

/// The filter flags are `NLA_U32`: host order, unlike nf_tables' big-endian numbers.
fn host_u32(kind: u16, value: u32) -> Attr {
    Attr::bytes(kind, value.to_ne_bytes())
}

/// `CTA_TUPLE_IP { addr }, CTA_TUPLE_PROTO { num, port }` for one side of a tuple.
fn tuple(
    protocol: u8,
    addr_kinds: (u16, u16),
    port_kind: u16,
    (ip, port): (IpAddr, u16),
) -> Vec<Attr> {
    let addr = match ip {
        IpAddr::V4(ip) => Attr::bytes(addr_kinds.0, ip.octets().to_vec()),
        IpAddr::V6(ip) => Attr::bytes(addr_kinds.1, ip.octets().to_vec()),
    };
    vec![
        Attr::nested(sys::CTA_TUPLE_IP, vec![addr]),
        Attr::nested(
            sys::CTA_TUPLE_PROTO,
            vec![
                Attr::bytes(sys::CTA_PROTO_NUM, vec![protocol]),
                Attr::bytes(port_kind, port.to_be_bytes().to_vec()),
            ],
        ),
    ]
}

fn endpoint_text((ip, port): (IpAddr, u16)) -> String {
    match ip {
        IpAddr::V4(ip) => format!("{ip}:{port}"),
        IpAddr::V6(ip) => format!("[{ip}]:{port}"),
    }
}

impl fmt::Display for FlowFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "delete conntrack entries of protocol {} to {}",
            self.protocol,
            endpoint_text(self.service)
        )?;
        if let Some(endpoint) = self.endpoint {
            write!(f, " answered by {}", endpoint_text(endpoint))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::Nla;

    #[test]
    fn a_removed_endpoint_selects_by_service_and_reply_source() {
        let filter = FlowFilter {
            protocol: 17,
            service: ("10.96.0.10".parse().expect("ip"), 53),
            endpoint: Some(("10.244.1.5".parse().expect("ip"), 5353)),
        };
        let attrs = filter.attrs();
        // Nests carry NLA_F_NESTED in their kind.
        let kinds: Vec<u16> = attrs.iter().map(|attr| attr.kind() & 0x7fff).collect();
        assert_eq!(
            kinds,
            [sys::CTA_TUPLE_ORIG, sys::CTA_TUPLE_REPLY, sys::CTA_FILTER]
        );
        assert_eq!(
            filter.to_string(),
            "delete conntrack entries of protocol 17 to 10.96.0.10:53 answered by 10.244.1.5:5353"
        );
    }
}
