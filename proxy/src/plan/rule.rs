//! The rule language of the plan: the few matches and statements the ruleset uses, each
//! rendered both as nft text and as nf_tables expressions, so that `nodus proxy render`
//! prints exactly what the agent programs.

use std::fmt;
use std::net::IpAddr;

use nodus_view::model::{Family, Protocol};

use super::names::protocol_name;
use crate::nft::expr::{
    self, CmpOp, DynsetOp, FibFlags, FibResult, IcmpxCode, IpFamily, MetaKey, NatFlags, NatKind,
    NumgenKind, PayloadBase, RTN_LOCAL, Reject, ct_state,
};
use crate::nft::{AnonymousSet, Batch, DataType, Element, Expr, Field, Register, SetRef, Value};
use crate::nft::{Tuple, Verdict};

/// ICMPv6's protocol number (`ipv6-icmp`).
const ICMPV6: u8 = 58;

/// Which address of the packet a match reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Addr {
    Source,
    Destination,
}

impl Addr {
    /// The other address of the packet.
    pub fn other(self) -> Addr {
        match self {
            Addr::Source => Addr::Destination,
            Addr::Destination => Addr::Source,
        }
    }
}

/// The key a verdict-map lookup builds from the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LookupKey {
    /// `ip daddr . meta l4proto . th dport`
    DaddrProtoPort(Family),
    /// `meta l4proto . th dport`
    ProtoPort,
}

/// One match or statement of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// `ct state new`
    CtStateNew,
    /// `ct state established,related`
    CtStateEstablished,
    /// `ip daddr . ip saddr . meta l4proto . th dport @set` (`local` is `Destination`), or
    /// `ip saddr . ip daddr . …` (`Source`): a pod of this node, its peer, and the
    /// protocol and destination port, in a NetworkPolicy's allowed set.
    PolicyAllowed {
        family: Family,
        local: Addr,
        set: String,
    },
    /// `ip saddr 10.0.0.1` / `ip6 daddr fd00::1`
    AddrIs {
        addr: Addr,
        value: IpAddr,
    },
    /// `ip daddr @set`, or `ip saddr != @set` when `negated`.
    AddrInSet {
        addr: Addr,
        family: Family,
        set: String,
        negated: bool,
    },
    /// `ip saddr != { 10.0.0.0-10.0.0.255, … }`, `ip daddr { … }`: inclusive ranges,
    /// sorted and disjoint.
    AddrInRanges {
        addr: Addr,
        family: Family,
        ranges: Vec<(IpAddr, IpAddr)>,
        negated: bool,
    },
    /// `iifname "cni0"`, `iifname != "veth*"`: the interface the packet came in through,
    /// by name or by prefix.
    Iifname {
        name: String,
        prefix: bool,
        negated: bool,
    },
    /// `meta l4proto tcp`
    L4Proto(Protocol),
    /// `th dport 80`
    Dport(u16),
    /// `fib saddr type local`: the packet comes from this host.
    FibSaddrLocal,
    /// `meta iifgroup 0x6e6f6475`: the packet came in through a link of this group.
    IifGroup(u32),
    /// `fib saddr . iif oif missing`: no route back to the packet's source leaves through
    /// the interface it came in on (a strict reverse-path check).
    SourceNotRoutedBack,
    /// `icmpv6 type 134`
    Icmpv6Type(u8),
    /// `meta mark & <bits> == 0`
    MarkClear(u32),
    /// `<key> vmap @map`
    Vmap {
        key: LookupKey,
        map: String,
    },
    /// `meta mark set meta mark | <bits>`
    MarkOr(u32),
    /// `meta mark set meta mark ^ <bits>`
    MarkXor(u32),
    /// `meta mark set meta mark & ~<bits>`: the bits cleared.
    MarkUnset(u32),
    /// `masquerade fully-random`
    Masquerade,
    /// `dnat ip to 10.244.1.5:8080` (needs a preceding [`Stmt::L4Proto`]).
    Dnat {
        addr: IpAddr,
        port: u16,
    },
    /// `dnat ip addr . port to numgen random mod N offset K map @map`: a uniformly random
    /// endpoint of the N keyed K…K+N−1 in a shared endpoint map (needs a preceding
    /// [`Stmt::L4Proto`]). The rule never names an endpoint, so replacing one touches
    /// only map elements.
    DnatFromMap {
        family: Family,
        map: String,
        endpoints: u32,
        offset: u32,
    },
    /// `dnat ip addr . port to ip daddr . meta l4proto . th dport . numgen random mod N map
    /// @map`: a uniformly random endpoint of the N a ClusterIP port keeps in the map of
    /// its count, keyed by the address and port the packet is sent to (needs a preceding
    /// [`Stmt::L4Proto`]). One such rule serves every port with N endpoints.
    DnatFromPortMap {
        family: Family,
        map: String,
        endpoints: u32,
    },
    /// `ip saddr . ip daddr . ct original ip daddr @set`: a DNATed connection from an
    /// endpoint back to itself through a service address (hairpin).
    Hairpin {
        family: Family,
        set: String,
    },
    /// `redirect to :53`: to this node's own listener (needs a preceding
    /// [`Stmt::L4Proto`]).
    Redirect(u16),
    /// `reject with icmpx port-unreachable`: ICMP or ICMPv6, whichever the packet needs.
    Reject,
    /// `numgen random mod N vmap { 0 : goto a, 1 : goto b, … }`
    RandomGoto(Vec<String>),
    /// `update @set { ip saddr }`
    RememberSource {
        family: Family,
        set: String,
    },
    Verdict(Verdict),
}

/// A rule: statements in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RulePlan(pub Vec<Stmt>);

impl RulePlan {
    pub fn new(stmts: impl IntoIterator<Item = Stmt>) -> RulePlan {
        RulePlan(stmts.into_iter().collect())
    }

    /// The expressions of this rule. Anonymous sets (`numgen … vmap {…}`, `{ ranges }`)
    /// are created in `batch`; `set_ref` resolves named sets.
    pub fn to_exprs(&self, batch: &mut Batch, set_ref: impl Fn(&str) -> SetRef) -> Vec<Expr> {
        let mut exprs = Vec::new();
        for stmt in &self.0 {
            stmt.encode(batch, &set_ref, &mut exprs);
        }
        exprs
    }
}

impl fmt::Display for RulePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, stmt) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{stmt}")?;
        }
        Ok(())
    }
}

/// `ip` or `ip6`: the nft keyword for a family's header.
fn header(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

fn address_field(addr: Addr, family: Family) -> Field {
    match (addr, family) {
        (Addr::Source, Family::V4) => Field::IpSaddr,
        (Addr::Destination, Family::V4) => Field::IpDaddr,
        (Addr::Source, Family::V6) => Field::Ip6Saddr,
        (Addr::Destination, Family::V6) => Field::Ip6Daddr,
    }
}

fn address_word(addr: Addr) -> &'static str {
    match addr {
        Addr::Source => "saddr",
        Addr::Destination => "daddr",
    }
}

pub fn ip_value(ip: IpAddr) -> Value {
    match ip {
        IpAddr::V4(ip) => Value::Ipv4(ip),
        IpAddr::V6(ip) => Value::Ipv6(ip),
    }
}

pub fn protocol_value(protocol: Protocol) -> Value {
    match protocol {
        Protocol::Tcp => Value::TCP,
        Protocol::Udp => Value::UDP,
        Protocol::Sctp => Value::SCTP,
    }
}

pub fn address_type(family: Family) -> DataType {
    match family {
        Family::V4 => DataType::Ipv4Addr,
        Family::V6 => DataType::Ipv6Addr,
    }
}

/// The key of the hairpin set: who sent, where it goes after DNAT, and the service
/// address it was sent to. (nft cannot put `ct original proto-dst` in a concatenation,
/// so the service port is not part of it.)
pub fn hairpin_fields(family: Family) -> [Field; 3] {
    let original = Field::CtOriginalDaddr(ip_family(family));
    match family {
        Family::V4 => [Field::IpSaddr, Field::IpDaddr, original],
        Family::V6 => [Field::Ip6Saddr, Field::Ip6Daddr, original],
    }
}

/// The key of a NetworkPolicy's allowed set: the local pod's address, the peer's, the
/// protocol and the destination port.
pub fn policy_fields(family: Family, local: Addr) -> [Field; 4] {
    [
        address_field(local, family),
        address_field(local.other(), family),
        Field::L4Proto,
        Field::ThDport,
    ]
}

fn ip_family(family: Family) -> IpFamily {
    match family {
        Family::V4 => IpFamily::V4,
        Family::V6 => IpFamily::V6,
    }
}

/// DNAT to the `addr . port` an endpoint map's lookup left from the first slot: the port
/// follows the address in slot `port_slot`.
fn dnat_from_map_data(family: Family, port_slot: u8) -> Expr {
    Expr::Nat {
        kind: NatKind::Dnat,
        family: ip_family(family),
        addr_min: Some(Register::FIRST),
        addr_max: None,
        proto_min: Some(Register::slot(port_slot)),
        proto_max: None,
        flags: NatFlags::default(),
    }
}

fn lookup(set: SetRef, dreg: Option<Register>, inverted: bool) -> Expr {
    Expr::Lookup {
        set,
        sreg: Register::FIRST,
        dreg,
        inverted,
    }
}

impl Stmt {
    #[expect(
        clippy::too_many_lines,
        reason = "an interpreter: one arm per statement"
    )]
    fn encode(&self, batch: &mut Batch, set_ref: &impl Fn(&str) -> SetRef, out: &mut Vec<Expr>) {
        match self {
            Stmt::CtStateNew => out.extend(expr::match_ct_state(ct_state::NEW)),
            Stmt::CtStateEstablished => out.extend(expr::match_ct_state(
                ct_state::ESTABLISHED | ct_state::RELATED,
            )),
            Stmt::PolicyAllowed { family, local, set } => {
                out.extend(expr::load_concat(&policy_fields(*family, *local)));
                out.push(lookup(set_ref(set), None, false));
            }
            Stmt::AddrIs { addr, value } => {
                let field = address_field(*addr, Family::of(*value));
                out.extend(expr::match_fields(
                    &[field],
                    CmpOp::Eq,
                    &ip_value(*value).into(),
                ));
            }
            Stmt::AddrInSet {
                addr,
                family,
                set,
                negated,
            } => {
                out.extend(expr::load_concat(&[address_field(*addr, *family)]));
                out.push(lookup(set_ref(set), None, *negated));
            }
            Stmt::AddrInRanges {
                addr,
                family,
                ranges,
                negated,
            } => {
                let elements = ranges
                    .iter()
                    .map(|(start, end)| Element::range(ip_value(*start), ip_value(*end)))
                    .collect();
                let set = batch.add_anonymous_set(&AnonymousSet {
                    key: address_type(*family).into(),
                    data: None,
                    interval: true,
                    elements,
                });
                out.extend(expr::load_concat(&[address_field(*addr, *family)]));
                out.push(lookup(set, None, *negated));
            }
            Stmt::Iifname {
                name,
                prefix,
                negated,
            } => {
                out.push(Expr::MetaLoad {
                    key: MetaKey::IifName,
                    dreg: Register::FIRST,
                });
                out.push(Expr::Cmp {
                    sreg: Register::FIRST,
                    op: if *negated { CmpOp::Neq } else { CmpOp::Eq },
                    // A prefix compares only its own bytes, as nft encodes `"veth*"`.
                    data: match prefix {
                        true => name.as_bytes().to_vec(),
                        false => expr::ifname_bytes(name),
                    },
                });
            }
            Stmt::L4Proto(protocol) => {
                out.push(Field::L4Proto.load(Register::FIRST));
                out.push(expr::cmp_eq(
                    Register::FIRST,
                    protocol_value(*protocol).to_bytes(),
                ));
            }
            Stmt::Dport(port) => {
                out.push(Field::ThDport.load(Register::FIRST));
                out.push(expr::cmp_eq(Register::FIRST, port.to_be_bytes().to_vec()));
            }
            Stmt::FibSaddrLocal => out.extend(expr::match_fib_type(FibFlags::SADDR, RTN_LOCAL)),
            Stmt::IifGroup(group) => {
                out.push(Expr::MetaLoad {
                    key: MetaKey::IifGroup,
                    dreg: Register::FIRST,
                });
                out.push(expr::cmp_eq(Register::FIRST, group.to_ne_bytes().to_vec()));
            }
            Stmt::SourceNotRoutedBack => {
                out.push(Expr::Fib {
                    flags: FibFlags {
                        iif: true,
                        ..FibFlags::SADDR
                    },
                    result: FibResult::Oif,
                    dreg: Register::FIRST,
                });
                out.push(expr::cmp_eq(Register::FIRST, vec![0; 4]));
            }
            Stmt::Icmpv6Type(kind) => {
                out.extend(expr::match_family(IpFamily::V6));
                out.push(Field::L4Proto.load(Register::FIRST));
                out.push(expr::cmp_eq(Register::FIRST, vec![ICMPV6]));
                out.push(Expr::Payload {
                    base: PayloadBase::Transport,
                    offset: 0,
                    len: 1,
                    dreg: Register::FIRST,
                });
                out.push(expr::cmp_eq(Register::FIRST, vec![*kind]));
            }
            Stmt::MarkClear(bits) => out.extend(expr::match_mark_bits(*bits, CmpOp::Eq, 0)),
            Stmt::Vmap { key, map } => {
                let fields: &[Field] = match key {
                    LookupKey::DaddrProtoPort(family) => &[
                        address_field(Addr::Destination, *family),
                        Field::L4Proto,
                        Field::ThDport,
                    ],
                    LookupKey::ProtoPort => &[Field::L4Proto, Field::ThDport],
                };
                out.extend(expr::load_concat(fields));
                out.push(lookup(set_ref(map), Some(Register::VERDICT), false));
            }
            Stmt::MarkOr(bits) => out.extend(expr::mark_or(*bits)),
            Stmt::MarkXor(bits) => out.extend(expr::mark_xor(*bits)),
            Stmt::MarkUnset(bits) => out.extend(expr::mark_unset(*bits)),
            Stmt::Masquerade => out.push(Expr::Masquerade {
                flags: NatFlags::FULLY_RANDOM,
            }),
            Stmt::Dnat { addr, port } => out.extend(expr::dnat_to(ip_value(*addr), Some(*port))),
            Stmt::DnatFromMap {
                family,
                map,
                endpoints,
                offset,
            } => {
                out.push(Expr::Numgen {
                    kind: NumgenKind::Random,
                    modulus: *endpoints,
                    offset: *offset,
                    dreg: Register::FIRST,
                });
                out.push(lookup(set_ref(map), Some(Register::FIRST), false));
                let port_slot = match family {
                    Family::V4 => 1,
                    Family::V6 => 4,
                };
                out.push(dnat_from_map_data(*family, port_slot));
            }
            Stmt::DnatFromPortMap {
                family,
                map,
                endpoints,
            } => {
                out.extend(expr::load_concat(&[
                    address_field(Addr::Destination, *family),
                    Field::L4Proto,
                    Field::ThDport,
                ]));
                // The index follows the address, protocol and port slots of the key.
                let (index_slot, port_slot) = match family {
                    Family::V4 => (3, 1),
                    Family::V6 => (6, 4),
                };
                out.push(Expr::Numgen {
                    kind: NumgenKind::Random,
                    modulus: *endpoints,
                    offset: 0,
                    dreg: Register::slot(index_slot),
                });
                out.push(lookup(set_ref(map), Some(Register::FIRST), false));
                out.push(dnat_from_map_data(*family, port_slot));
            }
            Stmt::Hairpin { family, set } => {
                out.extend(expr::load_concat(&hairpin_fields(*family)));
                out.push(lookup(set_ref(set), None, false));
            }
            Stmt::Redirect(port) => {
                out.push(Expr::Immediate {
                    dreg: Register::FIRST,
                    data: port.to_be_bytes().to_vec(),
                });
                out.push(Expr::Redirect {
                    proto_min: Register::FIRST,
                });
            }
            Stmt::Reject => out.push(Expr::Reject(Reject::Icmpx(IcmpxCode::PortUnreachable))),
            Stmt::RandomGoto(chains) => {
                let set = batch.add_anonymous_set(&AnonymousSet::numgen_vmap(
                    chains.iter().map(Verdict::goto),
                ));
                out.push(Expr::Numgen {
                    kind: NumgenKind::Random,
                    modulus: u32::try_from(chains.len()).unwrap_or(u32::MAX),
                    offset: 0,
                    dreg: Register::FIRST,
                });
                out.push(lookup(set, Some(Register::VERDICT), false));
            }
            Stmt::RememberSource { family, set } => {
                out.extend(expr::load_concat(&[address_field(Addr::Source, *family)]));
                out.push(Expr::Dynset {
                    set: set_ref(set),
                    op: DynsetOp::Update,
                    key: Register::FIRST,
                    data: None,
                    timeout: None,
                });
            }
            Stmt::Verdict(verdict) => out.push(Expr::Verdict(verdict.clone())),
        }
    }
}

impl fmt::Display for Stmt {
    #[expect(
        clippy::too_many_lines,
        reason = "an interpreter: one arm per statement"
    )]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stmt::CtStateNew => f.write_str("ct state new"),
            Stmt::CtStateEstablished => f.write_str("ct state established,related"),
            Stmt::PolicyAllowed { family, local, set } => {
                let h = header(*family);
                write!(
                    f,
                    "{h} {} . {h} {} . meta l4proto . th dport @{set}",
                    address_word(*local),
                    address_word(local.other())
                )
            }
            Stmt::AddrIs { addr, value } => write!(
                f,
                "{} {} {value}",
                header(Family::of(*value)),
                address_word(*addr)
            ),
            Stmt::AddrInSet {
                addr,
                family,
                set,
                negated,
            } => write!(
                f,
                "{} {} {}@{set}",
                header(*family),
                address_word(*addr),
                if *negated { "!= " } else { "" }
            ),
            Stmt::AddrInRanges {
                addr,
                family,
                ranges,
                negated,
            } => {
                let ranges: Vec<String> = ranges
                    .iter()
                    .map(|(start, end)| format!("{start}-{end}"))
                    .collect();
                write!(
                    f,
                    "{} {} {}{{ {} }}",
                    header(*family),
                    address_word(*addr),
                    if *negated { "!= " } else { "" },
                    ranges.join(", ")
                )
            }
            Stmt::Iifname {
                name,
                prefix,
                negated,
            } => write!(
                f,
                "iifname {}\"{name}{}\"",
                if *negated { "!= " } else { "" },
                if *prefix { "*" } else { "" }
            ),
            Stmt::L4Proto(protocol) => write!(f, "meta l4proto {}", protocol_name(*protocol)),
            Stmt::Dport(port) => write!(f, "th dport {port}"),
            Stmt::FibSaddrLocal => f.write_str("fib saddr type local"),
            Stmt::IifGroup(group) => write!(f, "meta iifgroup {group:#x}"),
            Stmt::SourceNotRoutedBack => f.write_str("fib saddr . iif oif missing"),
            Stmt::Icmpv6Type(kind) => write!(f, "icmpv6 type {kind}"),
            Stmt::MarkClear(bits) => write!(f, "meta mark & {bits:#010x} == 0x00000000"),
            Stmt::Vmap { key, map } => match key {
                LookupKey::DaddrProtoPort(family) => write!(
                    f,
                    "{} daddr . meta l4proto . th dport vmap @{map}",
                    header(*family)
                ),
                LookupKey::ProtoPort => write!(f, "meta l4proto . th dport vmap @{map}"),
            },
            Stmt::MarkOr(bits) => write!(f, "meta mark set meta mark | {bits:#010x}"),
            Stmt::MarkXor(bits) => write!(f, "meta mark set meta mark ^ {bits:#010x}"),
            Stmt::MarkUnset(bits) => write!(f, "meta mark set meta mark & {:#010x}", !bits),
            Stmt::Masquerade => f.write_str("masquerade fully-random"),
            Stmt::Dnat { addr, port } => match addr {
                IpAddr::V4(addr) => write!(f, "dnat ip to {addr}:{port}"),
                IpAddr::V6(addr) => write!(f, "dnat ip6 to [{addr}]:{port}"),
            },
            Stmt::DnatFromMap {
                family,
                map,
                endpoints,
                offset,
            } => {
                write!(
                    f,
                    "dnat {} addr . port to numgen random mod {endpoints}",
                    header(*family)
                )?;
                // nft lists no offset when it is 0.
                if *offset != 0 {
                    write!(f, " offset {offset}")?;
                }
                write!(f, " map @{map}")
            }
            Stmt::DnatFromPortMap {
                family,
                map,
                endpoints,
            } => {
                let h = header(*family);
                write!(
                    f,
                    "dnat {h} addr . port to {h} daddr . meta l4proto . th dport . numgen random mod {endpoints} map @{map}"
                )
            }
            Stmt::Hairpin { family, set } => {
                let h = header(*family);
                write!(f, "{h} saddr . {h} daddr . ct original {h} daddr @{set}")
            }
            Stmt::Redirect(port) => write!(f, "redirect to :{port}"),
            Stmt::Reject => f.write_str("reject with icmpx port-unreachable"),
            Stmt::RandomGoto(chains) => {
                let entries: Vec<String> = chains
                    .iter()
                    .enumerate()
                    .map(|(i, chain)| format!("{i} : goto {chain}"))
                    .collect();
                write!(
                    f,
                    "numgen random mod {} vmap {{ {} }}",
                    chains.len(),
                    entries.join(", ")
                )
            }
            Stmt::RememberSource { family, set } => {
                write!(f, "update @{set} {{ {} saddr }}", header(*family))
            }
            Stmt::Verdict(verdict) => write!(f, "{verdict}"),
        }
    }
}

/// A set or map element's key from the packet fields the lookups build.
pub fn service_key(ip: IpAddr, protocol: Protocol, port: u16) -> Tuple {
    Tuple(vec![
        ip_value(ip),
        protocol_value(protocol),
        Value::InetService(port),
    ])
}

/// `proto . port`, the key of the NodePort maps.
pub fn node_port_key(protocol: Protocol, port: u16) -> Tuple {
    Tuple(vec![protocol_value(protocol), Value::InetService(port)])
}
