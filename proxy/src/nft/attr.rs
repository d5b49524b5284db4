//! Netlink attributes (TLVs) as a small owned tree.
//!
//! nf_tables messages are nests of attributes all the way down (a rule holds a list of
//! expressions, each a name and a nest of its own attributes). One generic tree that
//! implements `netlink_packet_core::Nla` lets `netlink-packet-core` do the length,
//! padding and `NLA_F_NESTED` bookkeeping, and lets every encoder below be written as
//! data. Integers in nf_tables attributes are big-endian unless the attribute carries
//! register contents, which keep the byte order of the packet field or host value.

use netlink_packet_core::{Emitable, NLA_F_NESTED, Nla};

/// One netlink attribute: raw bytes, or a nest of attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attr {
    kind: u16,
    value: AttrValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum AttrValue {
    Bytes(Vec<u8>),
    /// The children with the bytes they take, counted once: every level of a message
    /// asks for the length of its nest when it writes its header.
    Nested {
        children: Vec<Attr>,
        len: usize,
    },
}

impl Attr {
    pub(crate) fn bytes(kind: u16, bytes: impl Into<Vec<u8>>) -> Attr {
        Attr {
            kind,
            value: AttrValue::Bytes(bytes.into()),
        }
    }

    /// A big-endian u32, the encoding of every nf_tables number attribute.
    pub(crate) fn u32(kind: u16, value: u32) -> Attr {
        Attr::bytes(kind, value.to_be_bytes())
    }

    /// A big-endian u64 (handles, timeouts in milliseconds, limit rates).
    pub(crate) fn u64(kind: u16, value: u64) -> Attr {
        Attr::bytes(kind, value.to_be_bytes())
    }

    /// A NUL-terminated string, as the kernel's `nla_strcmp`/`nla_strscpy` expect.
    pub(crate) fn string(kind: u16, value: &str) -> Attr {
        let mut bytes = Vec::with_capacity(value.len() + 1);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
        Attr::bytes(kind, bytes)
    }

    pub(crate) fn nested(kind: u16, children: Vec<Attr>) -> Attr {
        let len = children.iter().map(Emitable::buffer_len).sum();
        Attr {
            kind,
            value: AttrValue::Nested { children, len },
        }
    }

    /// Bytes this attribute takes in a message, header and padding included.
    pub(crate) fn encoded_len(&self) -> usize {
        self.buffer_len()
    }
}

impl Nla for Attr {
    fn value_len(&self) -> usize {
        match &self.value {
            AttrValue::Bytes(bytes) => bytes.len(),
            AttrValue::Nested { len, .. } => *len,
        }
    }

    fn kind(&self) -> u16 {
        match self.value {
            AttrValue::Bytes(_) => self.kind,
            AttrValue::Nested { .. } => self.kind | NLA_F_NESTED,
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match &self.value {
            AttrValue::Bytes(bytes) => buffer[..bytes.len()].copy_from_slice(bytes),
            AttrValue::Nested { children, .. } => {
                let mut offset = 0;
                for child in children {
                    let len = child.buffer_len();
                    child.emit(&mut buffer[offset..offset + len]);
                    offset += len;
                }
            }
        }
    }
}

/// Reads the attributes laid back to back in `bytes`: (type without flags, value). Stops
/// at the first malformed header, which the kernel never sends.
pub(crate) fn parse(bytes: &[u8]) -> Vec<(u16, &[u8])> {
    let mut found = Vec::new();
    let mut position = 0;
    while position + 4 <= bytes.len() {
        let len = usize::from(u16::from_ne_bytes([bytes[position], bytes[position + 1]]));
        let kind = u16::from_ne_bytes([bytes[position + 2], bytes[position + 3]]) & KIND_MASK;
        if len < 4 || position + len > bytes.len() {
            break;
        }
        found.push((kind, &bytes[position + 4..position + len]));
        position += len.div_ceil(4) * 4;
    }
    found
}

/// The attribute type without `NLA_F_NESTED` and `NLA_F_NET_BYTEORDER`.
const KIND_MASK: u16 = 0x3fff;

/// The value of the first attribute of type `kind`.
pub(crate) fn find(bytes: &[u8], kind: u16) -> Option<&[u8]> {
    parse(bytes)
        .into_iter()
        .find_map(|(found, value)| (found == kind).then_some(value))
}

/// Encodes attributes back to back, as they appear in a message body.
#[cfg(test)]
pub(crate) fn encode(attrs: &[Attr]) -> Vec<u8> {
    let len = attrs.iter().map(Emitable::buffer_len).sum();
    let mut buffer = vec![0; len];
    let mut offset = 0;
    for attr in attrs {
        let len = attr.buffer_len();
        attr.emit(&mut buffer[offset..offset + len]);
        offset += len;
    }
    buffer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_nul_terminated_and_padded() {
        let bytes = encode(&[Attr::string(1, "filter")]);
        // nla_len counts the NUL but not the padding.
        assert_eq!(
            bytes,
            [11, 0, 1, 0, b'f', b'i', b'l', b't', b'e', b'r', 0, 0]
        );
    }

    #[test]
    fn parse_reads_back_what_encode_wrote() {
        let bytes = encode(&[Attr::string(1, "x"), Attr::nested(2, vec![Attr::u32(1, 7)])]);
        let attrs = parse(&bytes);
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0], (1, &b"x\0"[..]));
        assert_eq!(find(attrs[1].1, 1), Some(&7u32.to_be_bytes()[..]));
    }

    #[test]
    fn nests_carry_the_nested_flag_and_total_length() {
        let bytes = encode(&[Attr::nested(4, vec![Attr::u32(1, 3), Attr::u32(2, 0)])]);
        assert_eq!(
            bytes,
            [
                20, 0, 4, 0x80, // nest header: len 20, type 4 | NLA_F_NESTED
                8, 0, 1, 0, 0, 0, 0, 3, // u32 big-endian 3
                8, 0, 2, 0, 0, 0, 0, 0,
            ]
        );
    }
}
