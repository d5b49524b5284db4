//! Transactions: nf_tables messages between `NFNL_MSG_BATCH_BEGIN` and `_END`.
//!
//! The kernel applies a batch atomically: every message is checked and prepared, and
//! only if all succeed is the new ruleset generation committed; otherwise nothing
//! changes. Every message asks for an acknowledgement and carries its own sequence
//! number, so a refusal can be traced to the message, and for element lists (which
//! pack many elements per message) to the element, and described in our own terms.

use std::fmt;
use std::ops::Range;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterProtoFamily};

use super::attr::Attr;
use super::object::{Chain, Rule, Table};
use super::set::{AnonymousSet, Element, Set, SetRef};
use super::sys;

/// Bytes of elements packed into one element message. The element list is one
/// attribute, whose 16-bit length caps it at 64 KiB; half of that keeps messages small.
const ELEMENT_LIST_BUDGET: usize = 32 * 1024;

/// One nfnetlink request: `nfgenmsg` and attributes.
pub(crate) struct Request<'a> {
    pub message_type: u16,
    pub family: u8,
    /// `nfgenmsg.version`: 0, except where a subsystem reads 1 as "family given".
    pub version: u8,
    pub res_id: u16,
    pub attrs: &'a [Attr],
}

impl NetlinkSerializable for Request<'_> {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        4 + self.attrs.iter().map(Attr::encoded_len).sum::<usize>()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        use netlink_packet_core::Emitable;
        NetfilterHeader::new(
            NetfilterProtoFamily::from(self.family),
            self.version,
            self.res_id,
        )
        .emit(&mut buffer[..4]);
        let mut offset = 4;
        for attr in self.attrs {
            let len = attr.encoded_len();
            attr.emit(&mut buffer[offset..offset + len]);
            offset += len;
        }
    }
}

/// The netlink message type of an nf_tables message.
pub(crate) fn nftables_type(message: u8) -> u16 {
    (u16::from(sys::NFNL_SUBSYS_NFTABLES) << 8) | u16::from(message)
}

pub(crate) fn ctnetlink_type(message: u8) -> u16 {
    (u16::from(sys::NFNL_SUBSYS_CTNETLINK) << 8) | u16::from(message)
}

/// Appends one framed netlink message to `out`.
pub(crate) fn encode_message(out: &mut Vec<u8>, sequence: u32, flags: u16, request: Request<'_>) {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = sequence;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
    message.finalize();
    let start = out.len();
    out.resize(start + message.buffer_len(), 0);
    message.serialize(&mut out[start..]);
}

/// What one message of a batch does, in words, for errors.
#[derive(Debug, Clone)]
enum Description {
    Text(String),
    Elements {
        verb: &'static str,
        set: String,
        elements: Vec<Element>,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    /// The message's bytes within the batch buffer.
    bytes: Range<usize>,
    description: Description,
}

/// A transaction on one table, committed with [`super::Socket::commit`].
///
/// Sequence numbers are the position in the batch: `BATCH_BEGIN` is 0, the n-th message
/// n, `BATCH_END` one past the last.
#[derive(Debug, Clone)]
pub struct Batch {
    table: Table,
    /// `BATCH_BEGIN` followed by the messages, ready to send.
    buffer: Vec<u8>,
    entries: Vec<Entry>,
    next_set_id: u32,
    /// Set elements added or deleted by the messages.
    elements: usize,
    /// Rules added by the messages.
    rules: usize,
}

impl Batch {
    pub fn new(table: Table) -> Batch {
        let mut buffer = Vec::new();
        encode_message(
            &mut buffer,
            0,
            NLM_F_REQUEST,
            Request {
                message_type: sys::NFNL_MSG_BATCH_BEGIN,
                family: 0,
                version: sys::NFNETLINK_V0,
                res_id: u16::from(sys::NFNL_SUBSYS_NFTABLES),
                attrs: &[],
            },
        );
        Batch {
            table,
            buffer,
            entries: Vec::new(),
            next_set_id: 1,
            elements: 0,
            rules: 0,
        }
    }

    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Messages in the batch (not counting the begin and end markers).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Set elements the batch adds or deletes (flushes not counted).
    pub fn element_count(&self) -> usize {
        self.elements
    }

    /// Rules the batch adds.
    pub fn rule_count(&self) -> usize {
        self.rules
    }

    /// `add table` (no error if it exists).
    pub fn add_table(&mut self) -> &mut Self {
        let attrs = self.table.attrs();
        let text = format!("add table {} {}", self.table.family.name(), self.table.name);
        self.push(
            sys::NFT_MSG_NEWTABLE,
            NLM_F_CREATE,
            &attrs,
            Description::Text(text),
        )
    }

    /// `delete table`: the table and everything in it.
    pub fn delete_table(&mut self) -> &mut Self {
        let attrs = [Attr::string(sys::NFTA_TABLE_NAME, &self.table.name)];
        let text = format!(
            "delete table {} {}",
            self.table.family.name(),
            self.table.name
        );
        self.push(sys::NFT_MSG_DELTABLE, 0, &attrs, Description::Text(text))
    }

    /// `add chain` (no error if it exists with the same hook).
    pub fn add_chain(&mut self, chain: &Chain) -> &mut Self {
        let attrs = chain.attrs(&self.table.name);
        let text = format!("add chain {}", chain.name);
        self.push(
            sys::NFT_MSG_NEWCHAIN,
            NLM_F_CREATE,
            &attrs,
            Description::Text(text),
        )
    }

    /// `delete chain`: it must be empty and unreferenced by the end of the batch.
    pub fn delete_chain(&mut self, name: &str) -> &mut Self {
        let attrs = [
            Attr::string(sys::NFTA_CHAIN_TABLE, &self.table.name),
            Attr::string(sys::NFTA_CHAIN_NAME, name),
        ];
        self.push(
            sys::NFT_MSG_DELCHAIN,
            0,
            &attrs,
            Description::Text(format!("delete chain {name}")),
        )
    }

    /// `flush chain`: delete all its rules.
    pub fn flush_chain(&mut self, name: &str) -> &mut Self {
        let attrs = [
            Attr::string(sys::NFTA_RULE_TABLE, &self.table.name),
            Attr::string(sys::NFTA_RULE_CHAIN, name),
        ];
        self.push(
            sys::NFT_MSG_DELRULE,
            0,
            &attrs,
            Description::Text(format!("flush chain {name}")),
        )
    }

    /// Appends a rule at the end of its chain.
    pub fn add_rule(&mut self, rule: &Rule) -> &mut Self {
        self.push_rule(rule, None, NLM_F_APPEND, "add rule to")
    }

    /// Adds a rule after the rule with `handle`.
    pub fn add_rule_after(&mut self, rule: &Rule, handle: u64) -> &mut Self {
        self.push_rule(rule, Some(handle), NLM_F_APPEND, "add rule to")
    }

    /// Inserts a rule at the start of its chain.
    pub fn insert_rule(&mut self, rule: &Rule) -> &mut Self {
        self.push_rule(rule, None, 0, "insert rule into")
    }

    fn push_rule(
        &mut self,
        rule: &Rule,
        position: Option<u64>,
        flags: u16,
        verb: &str,
    ) -> &mut Self {
        self.rules += 1;
        let attrs = rule.attrs(&self.table.name, position);
        let text = format!("{verb} chain {}: {}", rule.chain, rule.summary());
        self.push(
            sys::NFT_MSG_NEWRULE,
            NLM_F_CREATE | flags,
            &attrs,
            Description::Text(text),
        )
    }

    /// Deletes one rule by handle.
    pub fn delete_rule(&mut self, chain: &str, handle: u64) -> &mut Self {
        let attrs = [
            Attr::string(sys::NFTA_RULE_TABLE, &self.table.name),
            Attr::string(sys::NFTA_RULE_CHAIN, chain),
            Attr::u64(sys::NFTA_RULE_HANDLE, handle),
        ];
        let text = format!("delete rule {handle} from chain {chain}");
        self.push(sys::NFT_MSG_DELRULE, 0, &attrs, Description::Text(text))
    }

    /// `add set`/`add map`, and a reference for rules in this and later batches.
    pub fn add_set(&mut self, set: &Set) -> SetRef {
        let id = self.allocate_set_id();
        let attrs = set.attrs(&self.table.name, id, false);
        let text = format!("add {} {}", set.noun(), set.name);
        self.push(
            sys::NFT_MSG_NEWSET,
            NLM_F_CREATE,
            &attrs,
            Description::Text(text),
        );
        SetRef::with_id(set.name.clone(), id)
    }

    /// Creates an anonymous constant set with its elements, for one rule of this batch.
    pub fn add_anonymous_set(&mut self, set: &AnonymousSet) -> SetRef {
        let id = self.allocate_set_id();
        let definition = set.as_set();
        let attrs = definition.attrs(&self.table.name, id, true);
        let text = format!("add anonymous {} {}", definition.noun(), set.key);
        self.push(
            sys::NFT_MSG_NEWSET,
            NLM_F_CREATE,
            &attrs,
            Description::Text(text),
        );
        let reference = SetRef::with_id(definition.name, id);
        self.push_elements(&reference, &set.elements, false, "add");
        reference
    }

    /// `delete set`/`delete map`.
    pub fn delete_set(&mut self, name: &str) -> &mut Self {
        let attrs = [
            Attr::string(sys::NFTA_SET_TABLE, &self.table.name),
            Attr::string(sys::NFTA_SET_NAME, name),
        ];
        self.push(
            sys::NFT_MSG_DELSET,
            0,
            &attrs,
            Description::Text(format!("delete set {name}")),
        )
    }

    /// `flush set`: remove every element.
    pub fn flush_set(&mut self, set: &SetRef) -> &mut Self {
        let attrs = element_list_header(&self.table.name, set);
        let text = format!("flush set {}", set.name());
        self.push(sys::NFT_MSG_DELSETELEM, 0, &attrs, Description::Text(text))
    }

    /// `add element`: existing elements with the same data are left alone; an existing
    /// key with different data is refused (delete it first in the same batch).
    pub fn add_elements(&mut self, set: &SetRef, elements: &[Element]) -> &mut Self {
        self.push_elements(set, elements, false, "add")
    }

    /// `create element`: an element that already exists is refused.
    pub fn create_elements(&mut self, set: &SetRef, elements: &[Element]) -> &mut Self {
        self.push_elements(set, elements, true, "create")
    }

    /// `delete element`: each must exist.
    pub fn delete_elements(&mut self, set: &SetRef, elements: &[Element]) -> &mut Self {
        self.elements += elements.len();
        for chunk in chunk_by_size(elements, |element| element.key_attrs()) {
            let mut attrs = element_list_header(&self.table.name, set);
            attrs.push(Attr::nested(sys::NFTA_SET_ELEM_LIST_ELEMENTS, chunk.attrs));
            let description = Description::Elements {
                verb: "delete",
                set: set.name().to_string(),
                elements: chunk.elements.to_vec(),
            };
            self.push(sys::NFT_MSG_DELSETELEM, 0, &attrs, description);
        }
        self
    }

    fn push_elements(
        &mut self,
        set: &SetRef,
        elements: &[Element],
        exclusive: bool,
        verb: &'static str,
    ) -> &mut Self {
        let flags = NLM_F_CREATE | if exclusive { NLM_F_EXCL } else { 0 };
        self.elements += elements.len();
        for chunk in chunk_by_size(elements, Element::attrs) {
            let mut attrs = element_list_header(&self.table.name, set);
            attrs.push(Attr::nested(sys::NFTA_SET_ELEM_LIST_ELEMENTS, chunk.attrs));
            let description = Description::Elements {
                verb,
                set: set.name().to_string(),
                elements: chunk.elements.to_vec(),
            };
            self.push(sys::NFT_MSG_NEWSETELEM, flags, &attrs, description);
        }
        self
    }

    fn allocate_set_id(&mut self) -> u32 {
        let id = self.next_set_id;
        self.next_set_id += 1;
        id
    }

    fn push(
        &mut self,
        message: u8,
        flags: u16,
        attrs: &[Attr],
        description: Description,
    ) -> &mut Self {
        let start = self.buffer.len();
        let sequence = self.sequence_of_next();
        encode_message(
            &mut self.buffer,
            sequence,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            Request {
                message_type: nftables_type(message),
                family: self.table.family.nfproto(),
                version: sys::NFNETLINK_V0,
                res_id: 0,
                attrs,
            },
        );
        self.entries.push(Entry {
            bytes: start..self.buffer.len(),
            description,
        });
        self
    }

    fn sequence_of_next(&self) -> u32 {
        u32::try_from(self.entries.len() + 1).unwrap_or(u32::MAX)
    }

    /// The sequence number of `BATCH_END`.
    pub(crate) fn end_sequence(&self) -> u32 {
        self.sequence_of_next()
    }

    /// `BATCH_BEGIN` and all messages.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buffer
    }

    /// The `BATCH_END` message.
    pub(crate) fn end_message(&self) -> Vec<u8> {
        let mut end = Vec::new();
        encode_message(
            &mut end,
            self.end_sequence(),
            NLM_F_REQUEST,
            Request {
                message_type: sys::NFNL_MSG_BATCH_END,
                family: 0,
                version: sys::NFNETLINK_V0,
                res_id: u16::from(sys::NFNL_SUBSYS_NFTABLES),
                attrs: &[],
            },
        );
        end
    }

    /// Messages that will be acknowledged one by one.
    pub(crate) fn acknowledged_messages(&self) -> usize {
        self.entries.len()
    }

    /// Describes the message with `sequence`, narrowed to one element when the kernel
    /// pointed (`NLMSGERR_ATTR_OFFS`) at a byte inside an element list.
    pub(crate) fn describe(&self, sequence: u32, error_offset: Option<u32>) -> String {
        let Some(entry) = (sequence as usize)
            .checked_sub(1)
            .and_then(|index| self.entries.get(index))
        else {
            return format!("message {sequence} (not part of the batch)");
        };
        match &entry.description {
            Description::Text(text) => text.clone(),
            Description::Elements {
                verb,
                set,
                elements,
            } => {
                let message = &self.buffer[entry.bytes.clone()];
                let element = error_offset
                    .and_then(|offset| list_element_at(message, offset))
                    .and_then(|list_index| element_of_list_index(elements, list_index));
                match (element, elements.as_slice()) {
                    (Some(element), _) | (None, [element]) => {
                        format!("{verb} element {}{set}: {element}", preposition(verb))
                    }
                    (None, [first, ..]) => format!(
                        "{verb} {} elements {}{set} (first: {first})",
                        elements.len(),
                        preposition(verb)
                    ),
                    (None, []) => format!("{verb} elements {}{set}", preposition(verb)),
                }
            }
        }
    }
}

fn preposition(verb: &str) -> &'static str {
    if verb == "delete" { "from " } else { "to " }
}

fn element_list_header(table: &str, set: &SetRef) -> Vec<Attr> {
    let mut attrs = vec![Attr::string(sys::NFTA_SET_ELEM_LIST_TABLE, table)];
    if !set.id_only() {
        attrs.push(Attr::string(sys::NFTA_SET_ELEM_LIST_SET, set.name()));
    }
    if let Some(id) = set.id() {
        attrs.push(Attr::u32(sys::NFTA_SET_ELEM_LIST_SET_ID, id));
    }
    attrs
}

struct Chunk<'a> {
    elements: &'a [Element],
    attrs: Vec<Attr>,
}

/// Splits elements into runs whose encoded list stays within [`ELEMENT_LIST_BUDGET`].
fn chunk_by_size<'a>(
    elements: &'a [Element],
    encode: impl Fn(&Element) -> Vec<Attr>,
) -> Vec<Chunk<'a>> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut attrs = Vec::new();
    let mut size = 0;
    for (index, element) in elements.iter().enumerate() {
        let encoded = encode(element);
        let len: usize = encoded.iter().map(Attr::encoded_len).sum();
        if size + len > ELEMENT_LIST_BUDGET && !attrs.is_empty() {
            chunks.push(Chunk {
                elements: &elements[start..index],
                attrs: std::mem::take(&mut attrs),
            });
            start = index;
            size = 0;
        }
        size += len;
        attrs.extend(encoded);
    }
    if !attrs.is_empty() {
        chunks.push(Chunk {
            elements: &elements[start..],
            attrs,
        });
    }
    chunks
}

/// The index of the `NFTA_LIST_ELEM` within the element list of `message` (a whole
/// netlink message) that contains byte `offset`.
fn list_element_at(message: &[u8], offset: u32) -> Option<usize> {
    const HEADERS: usize = 16 + 4; // nlmsghdr + nfgenmsg
    let offset = offset as usize;
    let (_, start, end) = attributes(message, HEADERS)?
        .into_iter()
        .find(|(kind, ..)| *kind == sys::NFTA_SET_ELEM_LIST_ELEMENTS)?;
    attributes(&message[..end], start + 4)?
        .into_iter()
        .position(|(_, child_start, child_end)| (child_start..child_end).contains(&offset))
}

/// The attributes (kind without flags, start, end) from `from` to the end of `bytes`.
fn attributes(bytes: &[u8], from: usize) -> Option<Vec<(u16, usize, usize)>> {
    let mut found = Vec::new();
    let mut position = from;
    while position + 4 <= bytes.len() {
        let len = usize::from(u16::from_ne_bytes([bytes[position], bytes[position + 1]]));
        let kind = u16::from_ne_bytes([bytes[position + 2], bytes[position + 3]]) & 0x3fff;
        if len < 4 || position + len > bytes.len() {
            return None;
        }
        found.push((kind, position, position + len));
        position += len.div_ceil(4) * 4;
    }
    Some(found)
}

/// Maps an index into the encoded list back to the element (ranges take two entries).
fn element_of_list_index(elements: &[Element], list_index: usize) -> Option<&Element> {
    let mut seen = 0;
    for element in elements {
        seen += element.attrs().len();
        if list_index < seen {
            return Some(element);
        }
    }
    None
}

impl fmt::Display for Batch {
    /// One line per message, as the batch would be described in errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for sequence in 1..=self.entries.len() {
            writeln!(
                f,
                "{}",
                self.describe(u32::try_from(sequence).unwrap_or(u32::MAX), None)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::types::{DataType, Fields, Value, Verdict};
    use std::net::Ipv4Addr;

    fn header(bytes: &[u8]) -> (u32, u16, u16, u32) {
        let len = u32::from_ne_bytes(bytes[0..4].try_into().unwrap());
        let kind = u16::from_ne_bytes(bytes[4..6].try_into().unwrap());
        let flags = u16::from_ne_bytes(bytes[6..8].try_into().unwrap());
        let seq = u32::from_ne_bytes(bytes[8..12].try_into().unwrap());
        (len, kind, flags, seq)
    }

    #[test]
    fn framing_of_begin_table_and_end() {
        let mut batch = Batch::new(Table::inet("nodus"));
        batch.add_table();
        let bytes = batch.bytes();
        // BATCH_BEGIN: type 16, flags REQUEST, seq 0, nfgenmsg {AF_UNSPEC, 0, htons(10)}.
        assert_eq!(header(bytes), (20, 16, 1, 0));
        assert_eq!(&bytes[16..20], &[0, 0, 0, 10]);
        // NEWTABLE: type (10 << 8) | 0, flags REQUEST | ACK | CREATE, seq 1, family inet.
        let table = &bytes[20..];
        assert_eq!(header(table), (table.len() as u32, 0x0a00, 0x405, 1));
        assert_eq!(&table[16..20], &[1, 0, 0, 0]);
        assert_eq!(
            &table[20..32],
            &[10, 0, 1, 0, b'n', b'o', b'd', b'u', b's', 0, 0, 0]
        );
        let end = batch.end_message();
        assert_eq!(header(&end), (20, 17, 1, 2));
    }

    fn key(host: u8, port: u16) -> Element {
        Element::new(vec![
            Value::Ipv4(Ipv4Addr::new(10, 96, 0, host)),
            Value::TCP,
            Value::InetService(port),
        ])
        .with_verdict(Verdict::goto("svc"))
    }

    #[test]
    fn large_element_lists_are_split_and_errors_name_the_element() {
        let map = SetRef::named("service-ips");
        let elements: Vec<Element> = (0..2000).map(|i| key((i % 250) as u8, i)).collect();
        let mut batch = Batch::new(Table::inet("nodus"));
        batch.add_elements(&map, &elements);
        assert!(batch.len() > 1, "2000 elements fit no single 32 KiB list");
        // Point into the 3rd element of the second message.
        let entry = &batch.entries[1];
        let Description::Elements {
            elements: chunk, ..
        } = &entry.description
        else {
            panic!("element message expected");
        };
        let message = &batch.buffer[entry.bytes.clone()];
        let list = attributes(message, 20).unwrap();
        let (_, start, end) = *list.iter().find(|(kind, ..)| *kind == 3).unwrap();
        let third = attributes(&message[..end], start + 4).unwrap()[2];
        let described = batch.describe(2, Some(third.1 as u32 + 8));
        assert_eq!(
            described,
            format!("add element to service-ips: {}", chunk[2])
        );
        assert!(batch.describe(2, None).starts_with("add "));
        let _ = Fields::from(DataType::Ipv4Addr);
    }
}
