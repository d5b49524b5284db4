//! Data types, values and verdicts: what set keys, map data and comparisons hold.
//!
//! A [`DataType`] carries nft's own type number (from nftables' `enum datatypes`), which
//! the kernel stores opaquely in `NFTA_SET_KEY_TYPE` and `nft list` uses to print set
//! types and elements. Concatenated types combine those numbers six bits at a time, as
//! `concat_type_alloc` in nftables does. Values are encoded in the byte order the packet
//! path produces them in: addresses, protocol numbers and ports as on the wire, marks
//! and other host integers in host order.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use super::attr::Attr;
use super::sys;

/// A type of set key or map data field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ipv4_addr`
    Ipv4Addr,
    /// `ipv6_addr`
    Ipv6Addr,
    /// `inet_proto`: the layer-4 protocol number, one byte.
    InetProto,
    /// `inet_service`: a port, two bytes in network order.
    InetService,
    /// `mark`: a packet or conntrack mark, host order.
    Mark,
    /// `integer` of 32 bits in host order, what `numgen` produces.
    Integer32,
}

/// nft's datatype numbers combine into a concatenated type this many bits at a time.
const CONCAT_TYPE_BITS: u32 = 6;

impl DataType {
    /// nftables' `enum datatypes` number.
    pub fn nft_type(self) -> u32 {
        match self {
            DataType::Integer32 => 4,
            DataType::Ipv4Addr => 7,
            DataType::Ipv6Addr => 8,
            DataType::InetProto => 12,
            DataType::InetService => 13,
            DataType::Mark => 19,
        }
    }

    /// Bytes of the value, before any register padding.
    pub fn byte_len(self) -> usize {
        match self {
            DataType::Ipv4Addr | DataType::Mark | DataType::Integer32 => 4,
            DataType::Ipv6Addr => 16,
            DataType::InetProto => 1,
            DataType::InetService => 2,
        }
    }

    /// Whether values are in host byte order (nft must be told so to print them).
    pub fn is_host_order(self) -> bool {
        matches!(self, DataType::Mark | DataType::Integer32)
    }

    pub fn name(self) -> &'static str {
        match self {
            DataType::Ipv4Addr => "ipv4_addr",
            DataType::Ipv6Addr => "ipv6_addr",
            DataType::InetProto => "inet_proto",
            DataType::InetService => "inet_service",
            DataType::Mark => "mark",
            DataType::Integer32 => "integer",
        }
    }
}

/// A set key or map data type: one field, or a concatenation (`a . b . c`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fields(Vec<DataType>);

impl Fields {
    /// # Panics
    /// If `fields` is empty: a key without fields is a programming error.
    pub fn new(fields: impl Into<Vec<DataType>>) -> Fields {
        let fields = fields.into();
        assert!(
            !fields.is_empty(),
            "a key or data type needs at least one field"
        );
        Fields(fields)
    }

    pub fn fields(&self) -> &[DataType] {
        &self.0
    }

    pub fn is_concat(&self) -> bool {
        self.0.len() > 1
    }

    /// The combined nft type number (`NFTA_SET_KEY_TYPE` / `NFTA_SET_DATA_TYPE`).
    pub fn nft_type(&self) -> u32 {
        self.0
            .iter()
            .fold(0, |acc, field| (acc << CONCAT_TYPE_BITS) | field.nft_type())
    }

    /// A single field in host byte order, which nft prints wrongly unless told.
    pub(crate) fn is_host_order(&self) -> bool {
        matches!(self.0.as_slice(), [field] if field.is_host_order())
    }

    /// Bytes of an encoded value: in a concatenation every field takes whole 32-bit
    /// registers, so each is padded to four bytes.
    pub fn byte_len(&self) -> usize {
        if self.is_concat() {
            self.0
                .iter()
                .map(|field| padded_len(field.byte_len()))
                .sum()
        } else {
            self.0[0].byte_len()
        }
    }
}

impl From<DataType> for Fields {
    fn from(field: DataType) -> Fields {
        Fields(vec![field])
    }
}

impl fmt::Display for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|field| field.name()).collect();
        f.write_str(&names.join(" . "))
    }
}

/// Rounds a length up to whole 32-bit registers.
/// A timeout as netlink carries it.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn padded_len(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// One field's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Ipv4(Ipv4Addr),
    Ipv6(Ipv6Addr),
    InetProto(u8),
    InetService(u16),
    Mark(u32),
    Integer32(u32),
}

impl Value {
    pub const TCP: Value = Value::InetProto(libc::IPPROTO_TCP as u8);
    pub const UDP: Value = Value::InetProto(libc::IPPROTO_UDP as u8);
    pub const SCTP: Value = Value::InetProto(libc::IPPROTO_SCTP as u8);

    pub fn data_type(self) -> DataType {
        match self {
            Value::Ipv4(_) => DataType::Ipv4Addr,
            Value::Ipv6(_) => DataType::Ipv6Addr,
            Value::InetProto(_) => DataType::InetProto,
            Value::InetService(_) => DataType::InetService,
            Value::Mark(_) => DataType::Mark,
            Value::Integer32(_) => DataType::Integer32,
        }
    }

    /// The value as the packet path holds it in a register (unpadded).
    pub fn to_bytes(self) -> Vec<u8> {
        match self {
            Value::Ipv4(addr) => addr.octets().to_vec(),
            Value::Ipv6(addr) => addr.octets().to_vec(),
            Value::InetProto(proto) => vec![proto],
            Value::InetService(port) => port.to_be_bytes().to_vec(),
            Value::Mark(value) | Value::Integer32(value) => value.to_ne_bytes().to_vec(),
        }
    }

    /// The next value up, for the exclusive end of an interval; `None` past the top.
    pub(crate) fn successor(self) -> Option<Value> {
        Some(match self {
            Value::Ipv4(addr) => Value::Ipv4(Ipv4Addr::from(u32::from(addr).checked_add(1)?)),
            Value::Ipv6(addr) => Value::Ipv6(Ipv6Addr::from(u128::from(addr).checked_add(1)?)),
            Value::InetProto(proto) => Value::InetProto(proto.checked_add(1)?),
            Value::InetService(port) => Value::InetService(port.checked_add(1)?),
            Value::Mark(mark) => Value::Mark(mark.checked_add(1)?),
            Value::Integer32(value) => Value::Integer32(value.checked_add(1)?),
        })
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Value::Ipv4(addr) => write!(f, "{addr}"),
            Value::Ipv6(addr) => write!(f, "{addr}"),
            Value::InetProto(proto) => match i32::from(proto) {
                libc::IPPROTO_TCP => f.write_str("tcp"),
                libc::IPPROTO_UDP => f.write_str("udp"),
                libc::IPPROTO_SCTP => f.write_str("sctp"),
                other => write!(f, "{other}"),
            },
            Value::InetService(port) => write!(f, "{port}"),
            Value::Mark(mark) => write!(f, "{mark:#010x}"),
            Value::Integer32(value) => write!(f, "{value}"),
        }
    }
}

/// A key or data value: one field or a concatenation, encoded as the kernel compares it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple(pub Vec<Value>);

impl Tuple {
    /// A key of a set with `fields` from the kernel's bytes: [`Tuple::to_bytes`] read back.
    /// Keys are exact-match values, one field unpadded or fields padded to four bytes.
    pub fn from_bytes(fields: &Fields, bytes: &[u8]) -> Option<Tuple> {
        let concat = fields.is_concat();
        let mut values = Vec::new();
        let mut rest = bytes;
        for field in fields.fields() {
            let len = field.byte_len();
            let value = rest.get(..len)?;
            values.push(match field {
                DataType::Ipv4Addr => Value::Ipv4(Ipv4Addr::from(<[u8; 4]>::try_from(value).ok()?)),
                DataType::Ipv6Addr => {
                    Value::Ipv6(Ipv6Addr::from(<[u8; 16]>::try_from(value).ok()?))
                }
                DataType::InetProto => Value::InetProto(value[0]),
                DataType::InetService => {
                    Value::InetService(u16::from_be_bytes(value.try_into().ok()?))
                }
                DataType::Mark => Value::Mark(u32::from_ne_bytes(value.try_into().ok()?)),
                DataType::Integer32 => Value::Integer32(u32::from_ne_bytes(value.try_into().ok()?)),
            });
            let step = if concat { padded_len(len) } else { len };
            rest = rest.get(step.min(rest.len())..)?;
        }
        Some(Tuple(values))
    }

    /// The register image: a lone field unpadded, concatenated fields four-byte aligned.
    pub fn to_bytes(&self) -> Vec<u8> {
        if let [single] = self.0.as_slice() {
            return single.to_bytes();
        }
        let mut bytes = Vec::new();
        for value in &self.0 {
            let field = value.to_bytes();
            let padded = padded_len(field.len());
            bytes.extend_from_slice(&field);
            bytes.resize(bytes.len() + padded - field.len(), 0);
        }
        bytes
    }

    pub fn fields(&self) -> Fields {
        Fields::new(
            self.0
                .iter()
                .map(|value| value.data_type())
                .collect::<Vec<_>>(),
        )
    }

    pub(crate) fn data_attr(&self, kind: u16) -> Attr {
        Attr::nested(
            kind,
            vec![Attr::bytes(sys::NFTA_DATA_VALUE, self.to_bytes())],
        )
    }
}

impl From<Value> for Tuple {
    fn from(value: Value) -> Tuple {
        Tuple(vec![value])
    }
}

impl From<Vec<Value>> for Tuple {
    fn from(values: Vec<Value>) -> Tuple {
        Tuple(values)
    }
}

impl fmt::Display for Tuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, value) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" . ")?;
            }
            write!(f, "{value}")?;
        }
        Ok(())
    }
}

/// What a rule or a verdict-map element decides.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    /// Go on with the next rule (what an expression without a verdict does).
    Continue,
    /// Stop evaluating this rule (used by `NFT_BREAK`, rarely by hand).
    Break,
    Return,
    Jump(String),
    Goto(String),
}

impl Verdict {
    pub fn jump(chain: impl Into<String>) -> Verdict {
        Verdict::Jump(chain.into())
    }

    pub fn goto(chain: impl Into<String>) -> Verdict {
        Verdict::Goto(chain.into())
    }

    fn code(&self) -> i32 {
        match self {
            Verdict::Accept => sys::NF_ACCEPT,
            Verdict::Drop => sys::NF_DROP,
            Verdict::Continue => sys::NFT_CONTINUE,
            Verdict::Break => sys::NFT_BREAK,
            Verdict::Return => sys::NFT_RETURN,
            Verdict::Jump(_) => sys::NFT_JUMP,
            Verdict::Goto(_) => sys::NFT_GOTO,
        }
    }

    /// `NFTA_DATA_*` nest with `NFTA_DATA_VERDICT` inside, the layout of immediate data
    /// and of map element data alike.
    pub(crate) fn data_attr(&self, kind: u16) -> Attr {
        let mut verdict = vec![Attr::bytes(
            sys::NFTA_VERDICT_CODE,
            self.code().to_be_bytes(),
        )];
        if let Verdict::Jump(chain) | Verdict::Goto(chain) = self {
            verdict.push(Attr::string(sys::NFTA_VERDICT_CHAIN, chain));
        }
        Attr::nested(kind, vec![Attr::nested(sys::NFTA_DATA_VERDICT, verdict)])
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Continue => f.write_str("continue"),
            Verdict::Break => f.write_str("break"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(chain) => write!(f, "jump {chain}"),
            Verdict::Goto(chain) => write!(f, "goto {chain}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenated_type_numbers_match_nft() {
        // nft: `type ipv4_addr . inet_proto . inet_service` is ((7 << 6 | 12) << 6) | 13.
        let key = Fields::new([
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
        ]);
        assert_eq!(key.nft_type(), 29453);
        assert_eq!(key.byte_len(), 12);
        let key6 = Fields::new([
            DataType::Ipv6Addr,
            DataType::InetProto,
            DataType::InetService,
        ]);
        assert_eq!(key6.byte_len(), 24);
        assert_eq!(Fields::from(DataType::InetService).byte_len(), 2);
        assert_eq!(key.to_string(), "ipv4_addr . inet_proto . inet_service");
    }

    #[test]
    fn concatenated_keys_pad_each_field_like_nft() {
        // nft --debug=netlink: `element 0100600a 00000006 00005000` (words printed LE).
        let key = Tuple(vec![
            Value::Ipv4(Ipv4Addr::new(10, 96, 0, 1)),
            Value::TCP,
            Value::InetService(80),
        ]);
        assert_eq!(key.to_bytes(), [10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(key.to_string(), "10.96.0.1 . tcp . 80");
        assert_eq!(Tuple::from(Value::InetService(80)).to_bytes(), [0, 80]);
    }

    #[test]
    fn keys_read_back_from_kernel_bytes() {
        let key = Tuple(vec![
            Value::Ipv4(Ipv4Addr::new(10, 96, 0, 1)),
            Value::TCP,
            Value::InetService(443),
        ]);
        assert_eq!(Tuple::from_bytes(&key.fields(), &key.to_bytes()), Some(key));
        let key = Tuple(vec![Value::Ipv6("fd00::1".parse().expect("ip"))]);
        assert_eq!(Tuple::from_bytes(&key.fields(), &key.to_bytes()), Some(key));
        assert_eq!(
            Tuple::from_bytes(&Fields::from(DataType::Ipv6Addr), &[1, 2, 3]),
            None
        );
    }

    #[test]
    fn goto_verdict_layout() {
        let bytes = super::super::attr::encode(&[Verdict::goto("svc").data_attr(2)]);
        assert_eq!(
            bytes,
            [
                24, 0, 2, 0x80, // NFTA_SET_ELEM_DATA
                20, 0, 2, 0x80, // NFTA_DATA_VERDICT
                8, 0, 1, 0, 0xff, 0xff, 0xff, 0xfc, // NFTA_VERDICT_CODE = NFT_GOTO (-4)
                8, 0, 2, 0, b's', b'v', b'c', 0, // NFTA_VERDICT_CHAIN
            ]
        );
    }
}
