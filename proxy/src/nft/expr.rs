//! Rule expressions and their netlink encoding.
//!
//! Each variant mirrors one kernel expression type (`nft_payload`, `nft_meta`, …) and
//! encodes to exactly the attributes `nft` sends for it; the unit tests pin the bytes,
//! the kernel tests read the result back with `nft list`. Registers are numbered in
//! 32-bit slots so concatenations can be built as nft builds them: successive fields
//! in successive slots, each field rounded up to whole slots.

use std::time::Duration;

use super::attr::Attr;
use super::set::SetRef;
use super::sys;
use super::types::{Tuple, Value, Verdict, millis, padded_len};

/// A data register, counted in 32-bit slots (`NFT_REG32_00` + n), or the verdict
/// register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Register(Option<u8>);

impl Register {
    /// Where immediate verdicts and verdict-map lookups deliver their result.
    pub const VERDICT: Register = Register(None);

    /// The `n`th 32-bit slot; there are 16.
    ///
    /// # Panics
    /// If `n` is 16 or more.
    pub const fn slot(n: u8) -> Register {
        assert!(n < 16, "nf_tables has 16 32-bit registers");
        Register(Some(n))
    }

    /// The first slot, where single values and concatenations start.
    pub const FIRST: Register = Register::slot(0);

    /// The kernel register number, chosen as nft chooses it: a slot that starts one of
    /// the four legacy 16-byte registers is named by that register (`NFT_REG_1`…), any
    /// other by its 32-bit name. Both address the same storage.
    pub fn number(self) -> u32 {
        match self.0 {
            None => sys::NFT_REG_VERDICT,
            Some(slot) if slot % 4 == 0 => sys::NFT_REG_1 + u32::from(slot / 4),
            Some(slot) => sys::NFT_REG32_00 + u32::from(slot),
        }
    }

    /// The slot `bytes` further on (the next field of a concatenation).
    fn after(self, bytes: usize) -> Register {
        let slot = self.0.unwrap_or(0) as usize + padded_len(bytes) / 4;
        Register::slot(u8::try_from(slot).unwrap_or(u8::MAX))
    }

    fn attr(self, kind: u16) -> Attr {
        Attr::u32(kind, self.number())
    }
}

/// Which header a payload offset counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadBase {
    Link,
    Network,
    Transport,
}

/// `meta` keys we load or set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaKey {
    Mark,
    Iif,
    Oif,
    IifName,
    OifName,
    /// The netfilter family of the packet (`NFPROTO_IPV4`/`NFPROTO_IPV6`), one byte.
    NfProto,
    /// The layer-4 protocol after extension headers, one byte.
    L4Proto,
    /// The group of the interface the packet came in through, host order.
    IifGroup,
}

impl MetaKey {
    fn number(self) -> u32 {
        match self {
            MetaKey::Mark => sys::NFT_META_MARK,
            MetaKey::Iif => sys::NFT_META_IIF,
            MetaKey::Oif => sys::NFT_META_OIF,
            MetaKey::IifName => sys::NFT_META_IIFNAME,
            MetaKey::OifName => sys::NFT_META_OIFNAME,
            MetaKey::NfProto => sys::NFT_META_NFPROTO,
            MetaKey::L4Proto => sys::NFT_META_L4PROTO,
            MetaKey::IifGroup => sys::NFT_META_IIFGROUP,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Neq,
    Lt,
    Lte,
    Gt,
    Gte,
}

/// Address family of a `nat` expression and of `meta nfproto` matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub(crate) fn nfproto(self) -> u8 {
        match self {
            IpFamily::V4 => sys::NFPROTO_IPV4,
            IpFamily::V6 => sys::NFPROTO_IPV6,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NatKind {
    Snat,
    Dnat,
}

/// `NF_NAT_RANGE_*` flags shared by `nat` and `masq`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct NatFlags {
    pub random: bool,
    pub fully_random: bool,
    pub persistent: bool,
}

impl NatFlags {
    pub const FULLY_RANDOM: NatFlags = NatFlags {
        random: false,
        fully_random: true,
        persistent: false,
    };

    fn bits(self) -> u32 {
        let mut bits = 0;
        if self.random {
            bits |= sys::NF_NAT_RANGE_PROTO_RANDOM;
        }
        if self.fully_random {
            bits |= sys::NF_NAT_RANGE_PROTO_RANDOM_FULLY;
        }
        if self.persistent {
            bits |= sys::NF_NAT_RANGE_PERSISTENT;
        }
        bits
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NumgenKind {
    Random,
    Incremental,
}

/// Which address `fib` looks up and with what extra keys (`NFTA_FIB_F_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FibFlags {
    pub saddr: bool,
    pub daddr: bool,
    pub mark: bool,
    pub iif: bool,
    pub oif: bool,
}

impl FibFlags {
    pub const DADDR: FibFlags = FibFlags {
        saddr: false,
        daddr: true,
        mark: false,
        iif: false,
        oif: false,
    };
    pub const SADDR: FibFlags = FibFlags {
        saddr: true,
        daddr: false,
        mark: false,
        iif: false,
        oif: false,
    };

    fn bits(self) -> u32 {
        [
            (self.saddr, sys::NFTA_FIB_F_SADDR),
            (self.daddr, sys::NFTA_FIB_F_DADDR),
            (self.mark, sys::NFTA_FIB_F_MARK),
            (self.iif, sys::NFTA_FIB_F_IIF),
            (self.oif, sys::NFTA_FIB_F_OIF),
        ]
        .into_iter()
        .filter(|(set, _)| *set)
        .fold(0, |bits, (_, bit)| bits | bit)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FibResult {
    Oif,
    OifName,
    /// The route type (`RTN_LOCAL`, …), host order u32; see [`RTN_LOCAL`].
    AddrType,
}

/// `fib … type local`: the route type of an address of this host.
pub const RTN_LOCAL: u32 = libc::RTN_LOCAL as u32;

/// conntrack keys we load or set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtKey {
    /// Host-order bitmask of [`ct_state`] bits.
    State,
    Status,
    Mark,
    L3Protocol,
    Protocol,
    ProtoSrc,
    ProtoDst,
    SrcIp,
    DstIp,
    SrcIp6,
    DstIp6,
}

impl CtKey {
    fn number(self) -> u32 {
        match self {
            CtKey::State => sys::NFT_CT_STATE,
            CtKey::Status => sys::NFT_CT_STATUS,
            CtKey::Mark => sys::NFT_CT_MARK,
            CtKey::L3Protocol => sys::NFT_CT_L3PROTOCOL,
            CtKey::Protocol => sys::NFT_CT_PROTOCOL,
            CtKey::ProtoSrc => sys::NFT_CT_PROTO_SRC,
            CtKey::ProtoDst => sys::NFT_CT_PROTO_DST,
            CtKey::SrcIp => sys::NFT_CT_SRC_IP,
            CtKey::DstIp => sys::NFT_CT_DST_IP,
            CtKey::SrcIp6 => sys::NFT_CT_SRC_IP6,
            CtKey::DstIp6 => sys::NFT_CT_DST_IP6,
        }
    }
}

/// `ct state` bits (`NF_CT_STATE_*_BIT`), host order.
pub mod ct_state {
    pub const INVALID: u32 = 1;
    pub const ESTABLISHED: u32 = 2;
    pub const RELATED: u32 = 4;
    pub const NEW: u32 = 8;
    pub const UNTRACKED: u32 = 64;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtDirection {
    Original,
    Reply,
}

/// What `reject` answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reject {
    /// ICMP (IPv4) or ICMPv6 destination-unreachable with this code, for a rule that
    /// already matched one family.
    Icmp {
        code: u8,
    },
    /// `icmpx`: the family-independent codes the kernel maps to ICMP or ICMPv6.
    Icmpx(IcmpxCode),
    TcpReset,
}

/// `NFT_REJECT_ICMPX_*` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcmpxCode {
    NoRoute = 0,
    PortUnreachable = 1,
    HostUnreachable = 2,
    AdminProhibited = 3,
}

/// ICMP port-unreachable, what a bare `reject` sends in an `ip` rule.
pub const ICMP_PORT_UNREACHABLE: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DynsetOp {
    Add,
    Update,
    Delete,
}

/// One nf_tables expression.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// Load `len` bytes at `offset` of a header into `dreg`.
    Payload {
        base: PayloadBase,
        offset: u32,
        len: u32,
        dreg: Register,
    },
    MetaLoad {
        key: MetaKey,
        dreg: Register,
    },
    MetaSet {
        key: MetaKey,
        sreg: Register,
    },
    Cmp {
        sreg: Register,
        op: CmpOp,
        data: Vec<u8>,
    },
    /// `dreg = (sreg & mask) ^ xor`, over `mask.len()` bytes.
    Bitwise {
        sreg: Register,
        dreg: Register,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// Look `sreg` up in a set: a plain match (or a non-match if `inverted`), or with
    /// `dreg` a map lookup that writes the element's data (or verdict) there.
    Lookup {
        set: SetRef,
        sreg: Register,
        dreg: Option<Register>,
        inverted: bool,
    },
    /// Load constant bytes into a register.
    Immediate {
        dreg: Register,
        data: Vec<u8>,
    },
    Verdict(Verdict),
    Nat {
        kind: NatKind,
        family: IpFamily,
        addr_min: Option<Register>,
        addr_max: Option<Register>,
        proto_min: Option<Register>,
        proto_max: Option<Register>,
        flags: NatFlags,
    },
    Masquerade {
        flags: NatFlags,
    },
    /// `redirect to :<port>`: DNAT to this host (the incoming interface's primary
    /// address, or loopback for local traffic), the port from `proto_min`.
    Redirect {
        proto_min: Register,
    },
    Numgen {
        kind: NumgenKind,
        modulus: u32,
        offset: u32,
        dreg: Register,
    },
    Fib {
        flags: FibFlags,
        result: FibResult,
        dreg: Register,
    },
    CtLoad {
        key: CtKey,
        direction: Option<CtDirection>,
        dreg: Register,
    },
    CtSet {
        key: CtKey,
        sreg: Register,
    },
    Reject(Reject),
    Counter,
    /// Add or refresh the element keyed by `key` (and mapped to `data`) in a dynamic set.
    Dynset {
        set: SetRef,
        op: DynsetOp,
        key: Register,
        data: Option<Register>,
        timeout: Option<Duration>,
    },
    /// `limit rate N/unit burst B` (packets) or bytes; `inverted` is `limit rate over`.
    Limit {
        rate: u64,
        per: Duration,
        burst: u32,
        bytes: bool,
        inverted: bool,
    },
}

impl Expr {
    /// The kernel's expression type name (`NFTA_EXPR_NAME`).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Expr::Payload { .. } => "payload",
            Expr::MetaLoad { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Lookup { .. } => "lookup",
            Expr::Immediate { .. } | Expr::Verdict(_) => "immediate",
            Expr::Nat { .. } => "nat",
            Expr::Masquerade { .. } => "masq",
            Expr::Redirect { .. } => "redir",
            Expr::Numgen { .. } => "numgen",
            Expr::Fib { .. } => "fib",
            Expr::CtLoad { .. } | Expr::CtSet { .. } => "ct",
            Expr::Reject(_) => "reject",
            Expr::Counter => "counter",
            Expr::Dynset { .. } => "dynset",
            Expr::Limit { .. } => "limit",
        }
    }

    /// The expression-specific attributes (the contents of `NFTA_EXPR_DATA`).
    #[expect(
        clippy::too_many_lines,
        reason = "an encoder table: one arm per expression"
    )]
    pub(crate) fn data_attrs(&self) -> Vec<Attr> {
        match self {
            Expr::Payload {
                base,
                offset,
                len,
                dreg,
            } => vec![
                dreg.attr(sys::NFTA_PAYLOAD_DREG),
                Attr::u32(
                    sys::NFTA_PAYLOAD_BASE,
                    match base {
                        PayloadBase::Link => sys::NFT_PAYLOAD_LL_HEADER,
                        PayloadBase::Network => sys::NFT_PAYLOAD_NETWORK_HEADER,
                        PayloadBase::Transport => sys::NFT_PAYLOAD_TRANSPORT_HEADER,
                    },
                ),
                Attr::u32(sys::NFTA_PAYLOAD_OFFSET, *offset),
                Attr::u32(sys::NFTA_PAYLOAD_LEN, *len),
            ],
            Expr::MetaLoad { key, dreg } => vec![
                Attr::u32(sys::NFTA_META_KEY, key.number()),
                dreg.attr(sys::NFTA_META_DREG),
            ],
            Expr::MetaSet { key, sreg } => vec![
                Attr::u32(sys::NFTA_META_KEY, key.number()),
                sreg.attr(sys::NFTA_META_SREG),
            ],
            Expr::Cmp { sreg, op, data } => vec![
                sreg.attr(sys::NFTA_CMP_SREG),
                Attr::u32(sys::NFTA_CMP_OP, *op as u32),
                value_data(sys::NFTA_CMP_DATA, data),
            ],
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => vec![
                sreg.attr(sys::NFTA_BITWISE_SREG),
                dreg.attr(sys::NFTA_BITWISE_DREG),
                Attr::u32(sys::NFTA_BITWISE_LEN, len_u32(mask)),
                value_data(sys::NFTA_BITWISE_MASK, mask),
                value_data(sys::NFTA_BITWISE_XOR, xor),
            ],
            Expr::Lookup {
                set,
                sreg,
                dreg,
                inverted,
            } => {
                let mut attrs = vec![Attr::string(sys::NFTA_LOOKUP_SET, set.name())];
                if let Some(id) = set.id() {
                    attrs.push(Attr::u32(sys::NFTA_LOOKUP_SET_ID, id));
                }
                attrs.push(sreg.attr(sys::NFTA_LOOKUP_SREG));
                if let Some(dreg) = dreg {
                    attrs.push(dreg.attr(sys::NFTA_LOOKUP_DREG));
                }
                if *inverted {
                    attrs.push(Attr::u32(sys::NFTA_LOOKUP_FLAGS, sys::NFT_LOOKUP_F_INV));
                }
                attrs
            }
            Expr::Immediate { dreg, data } => vec![
                dreg.attr(sys::NFTA_IMMEDIATE_DREG),
                value_data(sys::NFTA_IMMEDIATE_DATA, data),
            ],
            Expr::Verdict(verdict) => vec![
                Register::VERDICT.attr(sys::NFTA_IMMEDIATE_DREG),
                verdict.data_attr(sys::NFTA_IMMEDIATE_DATA),
            ],
            Expr::Nat {
                kind,
                family,
                addr_min,
                addr_max,
                proto_min,
                proto_max,
                flags,
            } => {
                let mut attrs = vec![
                    Attr::u32(
                        sys::NFTA_NAT_TYPE,
                        match kind {
                            NatKind::Snat => sys::NFT_NAT_SNAT,
                            NatKind::Dnat => sys::NFT_NAT_DNAT,
                        },
                    ),
                    Attr::u32(sys::NFTA_NAT_FAMILY, u32::from(family.nfproto())),
                ];
                let registers = [
                    (addr_min, sys::NFTA_NAT_REG_ADDR_MIN),
                    (addr_max, sys::NFTA_NAT_REG_ADDR_MAX),
                    (proto_min, sys::NFTA_NAT_REG_PROTO_MIN),
                    (proto_max, sys::NFTA_NAT_REG_PROTO_MAX),
                ];
                for (register, kind) in registers {
                    if let Some(register) = register {
                        attrs.push(register.attr(kind));
                    }
                }
                // nft marks a port mapping explicitly; the kernel infers the address
                // part (NF_NAT_RANGE_MAP_IPS) from the address register itself.
                let mut bits = flags.bits();
                if proto_min.is_some() {
                    bits |= sys::NF_NAT_RANGE_PROTO_SPECIFIED;
                }
                if bits != 0 {
                    attrs.push(Attr::u32(sys::NFTA_NAT_FLAGS, bits));
                }
                attrs
            }
            Expr::Redirect { proto_min } => vec![proto_min.attr(sys::NFTA_REDIR_REG_PROTO_MIN)],
            Expr::Masquerade { flags } => {
                let bits = flags.bits();
                if bits == 0 {
                    Vec::new()
                } else {
                    vec![Attr::u32(sys::NFTA_MASQ_FLAGS, bits)]
                }
            }
            Expr::Numgen {
                kind,
                modulus,
                offset,
                dreg,
            } => {
                let mut attrs = vec![
                    dreg.attr(sys::NFTA_NG_DREG),
                    Attr::u32(sys::NFTA_NG_MODULUS, *modulus),
                    Attr::u32(
                        sys::NFTA_NG_TYPE,
                        match kind {
                            NumgenKind::Random => sys::NFT_NG_RANDOM,
                            NumgenKind::Incremental => sys::NFT_NG_INCREMENTAL,
                        },
                    ),
                ];
                if *offset != 0 {
                    attrs.push(Attr::u32(sys::NFTA_NG_OFFSET, *offset));
                }
                attrs
            }
            Expr::Fib {
                flags,
                result,
                dreg,
            } => vec![
                dreg.attr(sys::NFTA_FIB_DREG),
                Attr::u32(
                    sys::NFTA_FIB_RESULT,
                    match result {
                        FibResult::Oif => sys::NFT_FIB_RESULT_OIF,
                        FibResult::OifName => sys::NFT_FIB_RESULT_OIFNAME,
                        FibResult::AddrType => sys::NFT_FIB_RESULT_ADDRTYPE,
                    },
                ),
                Attr::u32(sys::NFTA_FIB_FLAGS, flags.bits()),
            ],
            Expr::CtLoad {
                key,
                direction,
                dreg,
            } => {
                let mut attrs = vec![
                    dreg.attr(sys::NFTA_CT_DREG),
                    Attr::u32(sys::NFTA_CT_KEY, key.number()),
                ];
                if let Some(direction) = direction {
                    // A u8 attribute (IP_CT_DIR_ORIGINAL = 0, IP_CT_DIR_REPLY = 1).
                    attrs.push(Attr::bytes(sys::NFTA_CT_DIRECTION, [*direction as u8]));
                }
                attrs
            }
            Expr::CtSet { key, sreg } => vec![
                Attr::u32(sys::NFTA_CT_KEY, key.number()),
                sreg.attr(sys::NFTA_CT_SREG),
            ],
            Expr::Reject(reject) => {
                let (kind, code) = match reject {
                    Reject::Icmp { code } => (sys::NFT_REJECT_ICMP_UNREACH, *code),
                    Reject::Icmpx(code) => (sys::NFT_REJECT_ICMPX_UNREACH, *code as u8),
                    Reject::TcpReset => (sys::NFT_REJECT_TCP_RST, 0),
                };
                vec![
                    Attr::u32(sys::NFTA_REJECT_TYPE, kind),
                    // NFTA_REJECT_ICMP_CODE is a u8 attribute.
                    Attr::bytes(sys::NFTA_REJECT_ICMP_CODE, [code]),
                ]
            }
            Expr::Counter => Vec::new(),
            Expr::Dynset {
                set,
                op,
                key,
                data,
                timeout,
            } => {
                let mut attrs = vec![Attr::string(sys::NFTA_DYNSET_SET_NAME, set.name())];
                if let Some(id) = set.id() {
                    attrs.push(Attr::u32(sys::NFTA_DYNSET_SET_ID, id));
                }
                attrs.push(Attr::u32(
                    sys::NFTA_DYNSET_OP,
                    match op {
                        DynsetOp::Add => sys::NFT_DYNSET_OP_ADD,
                        DynsetOp::Update => sys::NFT_DYNSET_OP_UPDATE,
                        DynsetOp::Delete => sys::NFT_DYNSET_OP_DELETE,
                    },
                ));
                attrs.push(key.attr(sys::NFTA_DYNSET_SREG_KEY));
                if let Some(data) = data {
                    attrs.push(data.attr(sys::NFTA_DYNSET_SREG_DATA));
                }
                if let Some(timeout) = timeout {
                    attrs.push(Attr::u64(sys::NFTA_DYNSET_TIMEOUT, millis(*timeout)));
                }
                attrs
            }
            Expr::Limit {
                rate,
                per,
                burst,
                bytes,
                inverted,
            } => vec![
                Attr::u64(sys::NFTA_LIMIT_RATE, *rate),
                Attr::u64(sys::NFTA_LIMIT_UNIT, per.as_secs()),
                Attr::u32(sys::NFTA_LIMIT_BURST, *burst),
                Attr::u32(
                    sys::NFTA_LIMIT_TYPE,
                    if *bytes {
                        sys::NFT_LIMIT_PKT_BYTES
                    } else {
                        sys::NFT_LIMIT_PKTS
                    },
                ),
                Attr::u32(
                    sys::NFTA_LIMIT_FLAGS,
                    if *inverted { sys::NFT_LIMIT_F_INV } else { 0 },
                ),
            ],
        }
    }

    /// The `NFTA_LIST_ELEM` nest of this expression inside `NFTA_RULE_EXPRESSIONS`.
    pub(crate) fn to_attr(&self) -> Attr {
        Attr::nested(
            sys::NFTA_LIST_ELEM,
            vec![
                Attr::string(sys::NFTA_EXPR_NAME, self.kind_name()),
                Attr::nested(sys::NFTA_EXPR_DATA, self.data_attrs()),
            ],
        )
    }
}

fn value_data(kind: u16, bytes: &[u8]) -> Attr {
    Attr::nested(kind, vec![Attr::bytes(sys::NFTA_DATA_VALUE, bytes)])
}

fn len_u32(bytes: &[u8]) -> u32 {
    u32::try_from(bytes.len()).unwrap_or(u32::MAX)
}

/// A packet field that rules match on or build keys from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    IpSaddr,
    IpDaddr,
    Ip6Saddr,
    Ip6Daddr,
    /// `meta l4proto`
    L4Proto,
    /// `th sport`: the first two bytes of any transport header.
    ThSport,
    /// `th dport`
    ThDport,
    /// `meta mark`
    Mark,
    /// `ct original ip daddr` / `ct original ip6 daddr`: the address the client asked
    /// for, before DNAT.
    CtOriginalDaddr(IpFamily),
}

impl Field {
    /// Bytes the field occupies in a register.
    pub fn byte_len(self) -> usize {
        match self {
            Field::IpSaddr | Field::IpDaddr | Field::Mark => 4,
            Field::CtOriginalDaddr(IpFamily::V4) => 4,
            Field::Ip6Saddr | Field::Ip6Daddr | Field::CtOriginalDaddr(IpFamily::V6) => 16,
            Field::L4Proto => 1,
            Field::ThSport | Field::ThDport => 2,
        }
    }

    /// The family a rule must match before loading this field (`ip daddr` in an `inet`
    /// table reads garbage from IPv6 packets otherwise). nft adds the same implicit
    /// `meta nfproto` check, and hides it again when listing.
    pub fn family(self) -> Option<IpFamily> {
        match self {
            Field::IpSaddr | Field::IpDaddr => Some(IpFamily::V4),
            Field::Ip6Saddr | Field::Ip6Daddr => Some(IpFamily::V6),
            Field::CtOriginalDaddr(family) => Some(family),
            _ => None,
        }
    }

    pub fn load(self, dreg: Register) -> Expr {
        let payload = |base, offset, len| Expr::Payload {
            base,
            offset,
            len,
            dreg,
        };
        match self {
            Field::IpSaddr => payload(PayloadBase::Network, 12, 4),
            Field::IpDaddr => payload(PayloadBase::Network, 16, 4),
            Field::Ip6Saddr => payload(PayloadBase::Network, 8, 16),
            Field::Ip6Daddr => payload(PayloadBase::Network, 24, 16),
            Field::ThSport => payload(PayloadBase::Transport, 0, 2),
            Field::ThDport => payload(PayloadBase::Transport, 2, 2),
            Field::L4Proto => Expr::MetaLoad {
                key: MetaKey::L4Proto,
                dreg,
            },
            Field::Mark => Expr::MetaLoad {
                key: MetaKey::Mark,
                dreg,
            },
            Field::CtOriginalDaddr(family) => Expr::CtLoad {
                key: match family {
                    IpFamily::V4 => CtKey::DstIp,
                    IpFamily::V6 => CtKey::DstIp6,
                },
                direction: Some(CtDirection::Original),
                dreg,
            },
        }
    }
}

/// `meta nfproto ipv4|ipv6`: restricts the rest of a rule to one family.
pub fn match_family(family: IpFamily) -> Vec<Expr> {
    vec![
        Expr::MetaLoad {
            key: MetaKey::NfProto,
            dreg: Register::FIRST,
        },
        cmp_eq(Register::FIRST, vec![family.nfproto()]),
    ]
}

/// Loads `fields` into consecutive registers from [`Register::FIRST`], each field
/// rounded up to whole 32-bit slots: the register image of a concatenated key, ready for
/// a lookup of [`Register::FIRST`]. A family check comes first when a field needs one.
pub fn load_concat(fields: &[Field]) -> Vec<Expr> {
    let mut exprs = Vec::new();
    if let Some(family) = fields.iter().find_map(|field| field.family()) {
        exprs.extend(match_family(family));
    }
    let mut register = Register::FIRST;
    for field in fields {
        exprs.push(field.load(register));
        register = register.after(field.byte_len());
    }
    exprs
}

/// `<fields> == <value>` with the family check the fields need.
pub fn match_fields(fields: &[Field], op: CmpOp, value: &Tuple) -> Vec<Expr> {
    let mut exprs = load_concat(fields);
    exprs.push(Expr::Cmp {
        sreg: Register::FIRST,
        op,
        data: value.to_bytes(),
    });
    exprs
}

pub fn cmp_eq(sreg: Register, data: Vec<u8>) -> Expr {
    Expr::Cmp {
        sreg,
        op: CmpOp::Eq,
        data,
    }
}

/// `ct state <bits>`: true when any of the bits is set, as nft encodes it.
pub fn match_ct_state(bits: u32) -> Vec<Expr> {
    vec![
        Expr::CtLoad {
            key: CtKey::State,
            direction: None,
            dreg: Register::FIRST,
        },
        Expr::Bitwise {
            sreg: Register::FIRST,
            dreg: Register::FIRST,
            mask: bits.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        },
        Expr::Cmp {
            sreg: Register::FIRST,
            op: CmpOp::Neq,
            data: vec![0; 4],
        },
    ]
}

/// `fib <flags> type <route type>`, e.g. `fib daddr type local` with [`RTN_LOCAL`].
pub fn match_fib_type(flags: FibFlags, route_type: u32) -> Vec<Expr> {
    vec![
        Expr::Fib {
            flags,
            result: FibResult::AddrType,
            dreg: Register::FIRST,
        },
        cmp_eq(Register::FIRST, route_type.to_ne_bytes().to_vec()),
    ]
}

/// `meta mark set meta mark | bits`.
pub fn mark_or(bits: u32) -> Vec<Expr> {
    mark_update(!bits, bits)
}

/// `meta mark set meta mark ^ bits`.
pub fn mark_xor(bits: u32) -> Vec<Expr> {
    mark_update(u32::MAX, bits)
}

/// `meta mark set meta mark & ~bits`.
pub fn mark_unset(bits: u32) -> Vec<Expr> {
    mark_update(!bits, 0)
}

fn mark_update(mask: u32, xor: u32) -> Vec<Expr> {
    vec![
        Field::Mark.load(Register::FIRST),
        Expr::Bitwise {
            sreg: Register::FIRST,
            dreg: Register::FIRST,
            mask: mask.to_ne_bytes().to_vec(),
            xor: xor.to_ne_bytes().to_vec(),
        },
        Expr::MetaSet {
            key: MetaKey::Mark,
            sreg: Register::FIRST,
        },
    ]
}

/// `meta mark & bits == value` (`value` 0 tests that none of `bits` is set).
pub fn match_mark_bits(bits: u32, op: CmpOp, value: u32) -> Vec<Expr> {
    vec![
        Field::Mark.load(Register::FIRST),
        Expr::Bitwise {
            sreg: Register::FIRST,
            dreg: Register::FIRST,
            mask: bits.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        },
        Expr::Cmp {
            sreg: Register::FIRST,
            op,
            data: value.to_ne_bytes().to_vec(),
        },
    ]
}

/// `iifname`/`oifname` comparison data: the name NUL-padded to `IFNAMSIZ`, as nft sends.
pub fn ifname_bytes(name: &str) -> Vec<u8> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.resize(libc::IFNAMSIZ.max(bytes.len() + 1), 0);
    bytes
}

/// `dnat ip|ip6 to <addr>[:<port>]`: immediates into registers, then `nat`.
pub fn dnat_to(addr: Value, port: Option<u16>) -> Vec<Expr> {
    nat_to(NatKind::Dnat, addr, port, NatFlags::default())
}

/// `snat|dnat ip|ip6 to <addr>[:<port>] [flags]`.
///
/// # Panics
/// If `addr` is not an address value.
pub fn nat_to(kind: NatKind, addr: Value, port: Option<u16>, flags: NatFlags) -> Vec<Expr> {
    let family = match addr {
        Value::Ipv4(_) => IpFamily::V4,
        Value::Ipv6(_) => IpFamily::V6,
        other => panic!("nat to a non-address value {other}"),
    };
    // nft puts the address in the first register and the port in the next 16-byte one.
    let addr_reg = Register::slot(0);
    let port_reg = Register::slot(4);
    let mut exprs = vec![Expr::Immediate {
        dreg: addr_reg,
        data: addr.to_bytes(),
    }];
    if let Some(port) = port {
        exprs.push(Expr::Immediate {
            dreg: port_reg,
            data: port.to_be_bytes().to_vec(),
        });
    }
    exprs.push(Expr::Nat {
        kind,
        family,
        addr_min: Some(addr_reg),
        addr_max: None,
        proto_min: port.map(|_| port_reg),
        proto_max: None,
        flags,
    });
    exprs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::attr::encode;

    fn expr_bytes(expr: &Expr) -> Vec<u8> {
        encode(&expr.data_attrs())
    }

    /// One big-endian u32 attribute, for writing expected layouts.
    fn u32_attr(kind: u16, value: u32) -> Vec<u8> {
        let mut bytes = vec![8, 0];
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&value.to_be_bytes());
        bytes
    }

    #[test]
    fn registers_are_named_as_nft_names_them() {
        // nft --debug=netlink for `ip daddr . meta l4proto . th dport`: reg 1, 9, 10;
        // for `ip6 daddr . meta l4proto . th dport`: reg 1, 2, 13.
        let v4: Vec<u32> = load_concat(&[Field::IpDaddr, Field::L4Proto, Field::ThDport])
            .iter()
            .filter_map(|expr| match expr {
                Expr::Payload { dreg, .. } | Expr::MetaLoad { dreg, .. } => Some(dreg.number()),
                _ => None,
            })
            .collect();
        assert_eq!(v4, [1, 1, 9, 10]); // the nfproto check, then the three fields
        let v6: Vec<u32> = load_concat(&[Field::Ip6Daddr, Field::L4Proto, Field::ThDport])
            .iter()
            .filter_map(|expr| match expr {
                Expr::Payload { dreg, .. } | Expr::MetaLoad { dreg, .. } => Some(dreg.number()),
                _ => None,
            })
            .collect();
        assert_eq!(v6, [1, 1, 2, 13]);
        assert_eq!(Register::VERDICT.number(), 0);
    }

    #[test]
    fn payload_ip_daddr() {
        // [ payload load 4b @ network header + 16 => reg 1 ]
        let expected = [
            u32_attr(sys::NFTA_PAYLOAD_DREG, 1),
            u32_attr(sys::NFTA_PAYLOAD_BASE, 1),
            u32_attr(sys::NFTA_PAYLOAD_OFFSET, 16),
            u32_attr(sys::NFTA_PAYLOAD_LEN, 4),
        ]
        .concat();
        assert_eq!(expr_bytes(&Field::IpDaddr.load(Register::FIRST)), expected);
    }

    #[test]
    fn meta_load_and_set() {
        // [ meta load l4proto => reg 9 ]
        let load = Expr::MetaLoad {
            key: MetaKey::L4Proto,
            dreg: Register::slot(1),
        };
        let expected = [
            u32_attr(sys::NFTA_META_KEY, 16),
            u32_attr(sys::NFTA_META_DREG, 9),
        ]
        .concat();
        assert_eq!(expr_bytes(&load), expected);
        // [ meta set mark with reg 1 ]
        let set = Expr::MetaSet {
            key: MetaKey::Mark,
            sreg: Register::FIRST,
        };
        let expected = [
            u32_attr(sys::NFTA_META_KEY, 3),
            u32_attr(sys::NFTA_META_SREG, 1),
        ]
        .concat();
        assert_eq!(expr_bytes(&set), expected);
    }

    #[test]
    fn cmp_with_nested_value() {
        // [ cmp eq reg 1 0x00000002 ] (one byte: meta nfproto ipv4)
        let exprs = match_family(IpFamily::V4);
        let expected = [
            u32_attr(sys::NFTA_CMP_SREG, 1),
            u32_attr(sys::NFTA_CMP_OP, 0),
            vec![12, 0, 3, 0x80, 5, 0, 1, 0, 2, 0, 0, 0],
        ]
        .concat();
        assert_eq!(expr_bytes(&exprs[1]), expected);
    }

    #[test]
    fn bitwise_mark_or() {
        // [ bitwise reg 1 = ( reg 1 & 0xffffbfff ) ^ 0x00004000 ]
        let exprs = mark_or(0x4000);
        let mut mask = vec![12, 0, 4, 0x80, 8, 0, 1, 0];
        mask.extend_from_slice(&0xffff_bfffu32.to_ne_bytes());
        let mut xor = vec![12, 0, 5, 0x80, 8, 0, 1, 0];
        xor.extend_from_slice(&0x4000u32.to_ne_bytes());
        let expected = [
            u32_attr(sys::NFTA_BITWISE_SREG, 1),
            u32_attr(sys::NFTA_BITWISE_DREG, 1),
            u32_attr(sys::NFTA_BITWISE_LEN, 4),
            mask,
            xor,
        ]
        .concat();
        assert_eq!(expr_bytes(&exprs[1]), expected);
    }

    #[test]
    fn verdict_map_lookup() {
        // [ lookup reg 1 set service-ips dreg 0 ]
        let lookup = Expr::Lookup {
            set: SetRef::named("service-ips"),
            sreg: Register::FIRST,
            dreg: Some(Register::VERDICT),
            inverted: false,
        };
        let expected = [
            vec![16, 0, 1, 0],
            b"service-ips\0".to_vec(),
            u32_attr(sys::NFTA_LOOKUP_SREG, 1),
            u32_attr(sys::NFTA_LOOKUP_DREG, 0),
        ]
        .concat();
        assert_eq!(expr_bytes(&lookup), expected);
    }

    #[test]
    fn inverted_lookup_sets_the_flag() {
        // [ lookup reg 1 set aff 0x1 ]
        let lookup = Expr::Lookup {
            set: SetRef::named("aff"),
            sreg: Register::FIRST,
            dreg: None,
            inverted: true,
        };
        let bytes = expr_bytes(&lookup);
        assert!(bytes.ends_with(&u32_attr(sys::NFTA_LOOKUP_FLAGS, 1)));
    }

    #[test]
    fn dnat_to_address_and_port() {
        // [ immediate reg 1 0x0501f40a ] [ immediate reg 2 0x0000901f ]
        // [ nat dnat ip addr_min reg 1 proto_min reg 2 flags 0x2 ]
        let exprs = dnat_to(Value::Ipv4([10, 244, 1, 5].into()), Some(8080));
        assert_eq!(
            exprs[0],
            Expr::Immediate {
                dreg: Register::slot(0),
                data: vec![10, 244, 1, 5]
            }
        );
        let expected = [
            u32_attr(sys::NFTA_IMMEDIATE_DREG, 2),
            vec![12, 0, 2, 0x80, 6, 0, 1, 0, 0x1f, 0x90, 0, 0],
        ]
        .concat();
        assert_eq!(expr_bytes(&exprs[1]), expected);
        let expected = [
            u32_attr(sys::NFTA_NAT_TYPE, 1),
            u32_attr(sys::NFTA_NAT_FAMILY, 2),
            u32_attr(sys::NFTA_NAT_REG_ADDR_MIN, 1),
            u32_attr(sys::NFTA_NAT_REG_PROTO_MIN, 2),
            u32_attr(sys::NFTA_NAT_FLAGS, 2),
        ]
        .concat();
        assert_eq!(expr_bytes(&exprs[2]), expected);
    }

    #[test]
    fn masquerade_fully_random() {
        // [ masq flags 0x10 ]; persistent,fully-random is 0x18.
        let masq = Expr::Masquerade {
            flags: NatFlags::FULLY_RANDOM,
        };
        assert_eq!(expr_bytes(&masq), u32_attr(sys::NFTA_MASQ_FLAGS, 0x10));
        let both = Expr::Masquerade {
            flags: NatFlags {
                persistent: true,
                ..NatFlags::FULLY_RANDOM
            },
        };
        assert_eq!(expr_bytes(&both), u32_attr(sys::NFTA_MASQ_FLAGS, 0x18));
    }

    #[test]
    fn redirect_to_a_port() {
        // [ redir proto_min reg 1 ]
        let expr = Expr::Redirect {
            proto_min: Register::FIRST,
        };
        assert_eq!(
            expr_bytes(&expr),
            u32_attr(sys::NFTA_REDIR_REG_PROTO_MIN, 1)
        );
    }

    #[test]
    fn numgen_random_mod_2() {
        // [ numgen reg 1 = random mod 2 ]
        let numgen = Expr::Numgen {
            kind: NumgenKind::Random,
            modulus: 2,
            offset: 0,
            dreg: Register::FIRST,
        };
        let expected = [
            u32_attr(sys::NFTA_NG_DREG, 1),
            u32_attr(sys::NFTA_NG_MODULUS, 2),
            u32_attr(sys::NFTA_NG_TYPE, 1),
        ]
        .concat();
        assert_eq!(expr_bytes(&numgen), expected);
    }

    #[test]
    fn fib_daddr_type_local() {
        // [ fib daddr type => reg 1 ] [ cmp eq reg 1 0x00000002 ]
        let exprs = match_fib_type(FibFlags::DADDR, RTN_LOCAL);
        let expected = [
            u32_attr(sys::NFTA_FIB_DREG, 1),
            u32_attr(sys::NFTA_FIB_RESULT, 3),
            u32_attr(sys::NFTA_FIB_FLAGS, 2),
        ]
        .concat();
        assert_eq!(expr_bytes(&exprs[0]), expected);
        assert_eq!(
            exprs[1],
            cmp_eq(Register::FIRST, 2u32.to_ne_bytes().to_vec())
        );
    }

    #[test]
    fn ct_original_daddr_and_state() {
        // [ ct load dst_ip => reg 1 , dir original ]
        let load = Expr::CtLoad {
            key: CtKey::DstIp,
            direction: Some(CtDirection::Original),
            dreg: Register::FIRST,
        };
        let expected = [
            u32_attr(sys::NFTA_CT_DREG, 1),
            u32_attr(sys::NFTA_CT_KEY, 20),
            vec![5, 0, 3, 0, 0, 0, 0, 0],
        ]
        .concat();
        assert_eq!(expr_bytes(&load), expected);
        // [ ct load state => reg 1 ] [ bitwise reg 1 = ( reg 1 & 0x00000008 ) ^ 0 ]
        // [ cmp neq reg 1 0x00000000 ]
        let state = match_ct_state(ct_state::NEW);
        assert_eq!(state.len(), 3);
        assert!(matches!(state[2], Expr::Cmp { op: CmpOp::Neq, .. }));
    }

    #[test]
    fn reject_variants() {
        // [ reject type 2 code 1 ], [ reject type 1 code 0 ], [ reject type 0 code 3 ]
        let icmpx = Expr::Reject(Reject::Icmpx(IcmpxCode::PortUnreachable));
        let expected = [
            u32_attr(sys::NFTA_REJECT_TYPE, 2),
            vec![5, 0, 2, 0, 1, 0, 0, 0],
        ]
        .concat();
        assert_eq!(expr_bytes(&icmpx), expected);
        let rst = Expr::Reject(Reject::TcpReset);
        assert!(expr_bytes(&rst).starts_with(&u32_attr(sys::NFTA_REJECT_TYPE, 1)));
        let icmp = Expr::Reject(Reject::Icmp {
            code: ICMP_PORT_UNREACHABLE,
        });
        assert!(expr_bytes(&icmp).ends_with(&[5, 0, 2, 0, 3, 0, 0, 0]));
    }

    #[test]
    fn dynset_update_with_timeout() {
        // [ dynset update reg_key 1 set aff timeout 10800000ms ]
        let dynset = Expr::Dynset {
            set: SetRef::named("aff"),
            op: DynsetOp::Update,
            key: Register::FIRST,
            data: None,
            timeout: Some(Duration::from_secs(3 * 3600)),
        };
        let expected = [
            vec![8, 0, 1, 0],
            b"aff\0".to_vec(),
            u32_attr(sys::NFTA_DYNSET_OP, 1),
            u32_attr(sys::NFTA_DYNSET_SREG_KEY, 1),
            vec![12, 0, 6, 0],
            10_800_000u64.to_be_bytes().to_vec(),
        ]
        .concat();
        assert_eq!(expr_bytes(&dynset), expected);
    }

    #[test]
    fn counter_and_expression_envelope() {
        // A counter carries no attributes; the envelope is name + empty data nest.
        let bytes = encode(&[Expr::Counter.to_attr()]);
        assert_eq!(
            bytes,
            [
                20, 0, 1, 0x80, // NFTA_LIST_ELEM
                12, 0, 1, 0, b'c', b'o', b'u', b'n', b't', b'e', b'r', 0, // name
                4, 0, 2, 0x80, // NFTA_EXPR_DATA, empty
            ]
        );
    }

    #[test]
    fn limit_rate_per_second() {
        // [ limit rate 10/second burst 5 type packets flags 0x0 ]
        let limit = Expr::Limit {
            rate: 10,
            per: Duration::from_secs(1),
            burst: 5,
            bytes: false,
            inverted: false,
        };
        let expected = [
            vec![12, 0, 1, 0],
            10u64.to_be_bytes().to_vec(),
            vec![12, 0, 2, 0],
            1u64.to_be_bytes().to_vec(),
            u32_attr(sys::NFTA_LIMIT_BURST, 5),
            u32_attr(sys::NFTA_LIMIT_TYPE, 0),
            u32_attr(sys::NFTA_LIMIT_FLAGS, 0),
        ]
        .concat();
        assert_eq!(expr_bytes(&limit), expected);
    }

    #[test]
    fn ifname_is_padded_to_ifnamsiz() {
        // [ cmp eq reg 1 0x30687465 0x00000000 0x00000000 0x00000000 ]
        assert_eq!(ifname_bytes("eth0"), b"eth0\0\0\0\0\0\0\0\0\0\0\0\0");
    }
}
