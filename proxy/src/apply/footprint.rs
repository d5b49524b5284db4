//! The compact record of what one service put in the table: the digest of its plan, the
//! names of its chains and sets, its key blocks and the keys of its shared-map elements,
//! packed into one small byte string (which `records` keeps with every other service's).
//!
//! An update needs to know what to flush, delete and replace, but holding every
//! committed [`ServicePlan`] would hold the whole ruleset (rules, anonymous maps,
//! element data). A footprint keeps only names and keys. Names are stored without their
//! `role-HASH-` head when the hash can be recomputed, and without the
//! `namespace/name/ipv4/tcp/` that starts the path of every name of a service port (the
//! reader knows the service, and the family and protocol are a number in the tag); each
//! is front-coded against the one before in sorted order, so the ten endpoint chains of a
//! port cost a few bytes each (`…__10.244.1.5/8080` after `…__10.244.1.4/8080`). A key
//! block names its chain, and a shared element its verdict's chain, by the place of the
//! chain's name. Contents are kept as 32-bit digests: a chain's rules, a set's elements,
//! other element data, and for the endpoint maps' runs of keys one digest per chunk of 4
//! elements, so that the record grows with services and ports, not with endpoints. A run
//! names the key block it fills rather than repeating its map and first key (a run in the
//! map of a port's endpoint count names its map, the port's address, protocol and port
//! once, and its first index), counts and
//! keys are varints, a key value equal to the one at its place in the key before (the
//! service's cluster IP) is one byte, and an element without data stores no digest. What
//! still matches is left alone; a chain that changed is rewritten, a set refilled, an
//! element (or an endpoint chunk) deleted by key and re-added.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr};

use integer_encoding::VarInt;
use nodus_view::model::Family;

use crate::nft::{Chain, DataType, Element, ElementData, Set, Tuple, Value, Verdict};
use crate::plan::{
    ChainPlan, ElementPlan, KeyBlock, RulePlan, ServicePlan, SetPlan, SharedKind, SharedSet, Stmt,
    fnv1a, join_name, split_name,
};

/// The key a service's footprint is kept under: a 64-bit hash of its name. Collisions among
/// a cluster's services are vanishingly unlikely (about 10⁻¹¹ for 10,000 services).
pub(super) fn service_key(namespace: &str, name: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    namespace.hash(&mut hasher);
    name.hash(&mut hasher);
    hasher.finish()
}

/// Roles whose names are `role-HASH-path` (see `plan::names`); the index is stored.
const ROLES: [&str; 6] = [
    "service", "local", "external", "firewall", "endpoint", "affinity",
];

/// What follows `namespace/name/` in the path of every name of a service port: its family
/// and protocol, stored as their index in the tag.
const HEADS: [&str; 6] = [
    "ipv4/tcp/",
    "ipv4/udp/",
    "ipv4/sctp/",
    "ipv6/tcp/",
    "ipv6/udp/",
    "ipv6/sctp/",
];

/// Endpoint elements per digest in a run: a change rewrites the chunk that holds it, at
/// most this many elements (each element added costs a validation against every rule
/// bound to its map, so 16 made a two-port churn three times slower), and a service of
/// ten endpoints keeps three digests a port where it kept ten.
const RUN_CHUNK: usize = 4;

/// Tag bits of a name entry: it names a set (else a chain); its role index + 1 in the
/// three bits above (0: the name is stored whole); its head index + 1 in the three above
/// those (0: the path is stored from the service's prefix on).
const TAG_SET: u8 = 0x01;
const TAG_ROLE_SHIFT: u32 = 1;
const TAG_HEAD_SHIFT: u32 = 4;
const TAG_FIELD: u8 = 0x07;

/// A key block's size class (below 32) and its rule's place share one varint.
const CLASS_BITS: u32 = 5;
const CLASS_MASK: u32 = (1 << CLASS_BITS) - 1;

/// Flags in the set byte of an element outside the runs (the set itself takes the low
/// five bits): it has data, whose digest follows, or, with the chain flag, the verdict
/// to one of the footprint's chains, by its index; it has a key end, which follows its
/// key.
const ELEMENT_DATA_IS_CHAIN: u8 = 0x20;
const ELEMENT_HAS_DATA: u8 = 0x40;
const ELEMENT_HAS_KEY_END: u8 = 0x80;
const ELEMENT_FLAGS: u8 = ELEMENT_DATA_IS_CHAIN | ELEMENT_HAS_DATA | ELEMENT_HAS_KEY_END;

/// A key value that equals the one at its position in the key before it (the same
/// cluster IP in each of a service's elements), in place of a value's type byte.
const VALUE_AS_BEFORE: u8 = 6;

/// What one service last put in the table, in a few dozen bytes: the bytes
/// [`Footprint::encode`] made, as the proxy's records keep them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint<'a>(pub(super) &'a [u8]);

/// The plan's digest comes first, then its chain count, the names, its key blocks, and
/// the elements.
const DIGEST: std::ops::Range<usize> = 0..8;

/// One chain's or set's entry, as [`Footprint::encode`] codes it.
struct NameEntry<'p> {
    full: &'p str,
    is_set: bool,
    /// [`digest`] of its rules or elements.
    contents: u32,
    /// What it is sorted by: its path, or its name when stored whole.
    order: &'p str,
    /// The tag's role and head fields, and what is stored of the name.
    role: u8,
    head: u8,
    text: &'p str,
}

impl<'p> NameEntry<'p> {
    fn new(full: &'p str, is_set: bool, contents: u32, prefix: &str) -> NameEntry<'p> {
        let whole = NameEntry {
            full,
            is_set,
            contents,
            order: full,
            role: 0,
            head: 0,
            text: full,
        };
        let Some((role, path)) = split_name(full) else {
            return whole;
        };
        let Some(role) = ROLES.iter().position(|r| *r == role) else {
            return whole;
        };
        let head = path.strip_prefix(prefix).and_then(|rest| {
            HEADS
                .iter()
                .enumerate()
                .find_map(|(index, head)| Some((index, rest.strip_prefix(head)?)))
        });
        let (head, text) = match head {
            Some((index, text)) => (index + 1, text),
            None => (0, path),
        };
        NameEntry {
            order: path,
            role: u8::try_from(role + 1).unwrap_or_default(),
            head: u8::try_from(head).unwrap_or_default(),
            text,
            ..whole
        }
    }

    fn tag(&self) -> u8 {
        (u8::from(self.is_set) * TAG_SET)
            | (self.role << TAG_ROLE_SHIFT)
            | (self.head << TAG_HEAD_SHIFT)
    }
}

impl<'a> Footprint<'a> {
    /// The record of `plan`, whose [`ServicePlan::digest`] is `digest`.
    pub fn encode(plan: &ServicePlan, plan_digest: u64) -> Box<[u8]> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&plan_digest.to_ne_bytes());
        write_count(&mut bytes, plan.chains.len());
        // Every entry carries a digest of its contents: a chain's rules, a set's elements.
        let prefix = service_prefix(&plan.namespace, &plan.name);
        let mut names: Vec<NameEntry<'_>> = plan
            .chains
            .iter()
            .map(|chain| NameEntry::new(chain.name(), false, digest(&chain.rules), &prefix))
            .chain(
                plan.sets
                    .iter()
                    .map(|set| NameEntry::new(&set.set.name, true, digest(&set.elements), &prefix)),
            )
            .collect();
        names.sort_by(|a, b| a.order.cmp(b.order));
        write_count(&mut bytes, names.len());
        let mut previous = prefix.as_str();
        for entry in &names {
            let shared = common_prefix(previous, entry.text);
            let suffix = &entry.text[shared..];
            bytes.push(entry.tag());
            // Names hold at most 255 bytes (nf_tables), so one byte holds each length.
            bytes.push(u8::try_from(shared).unwrap_or(u8::MAX));
            bytes.push(u8::try_from(suffix.len()).unwrap_or(u8::MAX));
            bytes.extend_from_slice(suffix.as_bytes());
            bytes.extend_from_slice(&entry.contents.to_ne_bytes());
            previous = entry.text;
        }
        // A chain is referred to by its place among the names: a block's chain (its name's
        // hash), a shared element's verdict.
        let chain_index = |wanted: &dyn Fn(&str) -> bool| {
            names
                .iter()
                .position(|entry| !entry.is_set && wanted(entry.full))
                .and_then(|index| u32::try_from(index).ok())
        };
        write_count(&mut bytes, plan.blocks.len());
        for block in &plan.blocks {
            write_block(
                &mut bytes,
                block,
                chain_index(&|name| fnv1a(name) == block.chain),
            );
        }
        // Endpoint-map elements come in runs of consecutive keys (a chain's key block, or
        // a port's indexes in the map of its endpoint count).
        let mut runs: Vec<Run<'_>> = Vec::new();
        let mut others: Vec<&ElementPlan> = Vec::new();
        for element in &plan.elements {
            let Some((prefix, key)) = run_key(element) else {
                others.push(element);
                continue;
            };
            let data = &element.element.data;
            match runs.last_mut() {
                Some(run) if run.continues(element.set, prefix, key) => run.datas.push(data),
                _ => runs.push(Run {
                    set: element.set,
                    prefix,
                    first: key,
                    datas: vec![data],
                }),
            }
        }
        write_runs(&mut bytes, &runs, &plan.blocks);
        write_count(&mut bytes, others.len());
        let mut previous_key = None;
        for element in others {
            let target = match &element.element.data {
                Some(ElementData::Verdict(Verdict::Goto(chain) | Verdict::Jump(chain))) => {
                    chain_index(&|name| name == chain)
                }
                _ => None,
            };
            write_element(&mut bytes, element, target, previous_key);
            previous_key = Some(&element.element.key);
        }
        bytes.into_boxed_slice()
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The digest of the plan it records; 0 for a corrupt record, which then matches no
    /// plan and is read by [`Footprint::previous_plan`] (which rejects it).
    pub fn digest(&self) -> u64 {
        let mut reader = Reader(self.0.get(DIGEST).unwrap_or_default());
        reader.u64().unwrap_or_default()
    }

    /// Its chains in the table.
    pub fn chains(&self) -> usize {
        self.after_digest().count().unwrap_or_default()
    }

    /// The key blocks its endpoints took, for the next plan of the service
    /// `namespace/name` to reuse (none when corrupt).
    pub fn blocks(&self, namespace: &str, name: &str) -> Vec<KeyBlock> {
        let blocks = |mut reader: Reader<'_>| {
            reader.count()?;
            let names = reader.names(&service_prefix(namespace, name))?;
            reader.blocks(&names)
        };
        blocks(self.after_digest()).unwrap_or_default()
    }

    /// The reader past the digest, at the chain count.
    fn after_digest(&self) -> Reader<'a> {
        Reader(self.0.get(DIGEST.end..).unwrap_or_default())
    }

    /// The previous plan as far as [`crate::plan::PlanBatch::update_service`] needs it to
    /// turn it into `new` (the same service's plan now): chains and sets by name, with
    /// rules that match no real chain so that every surviving chain is flushed and
    /// rewritten, and elements equal to `new`'s where key and data agree (left alone),
    /// key-only otherwise (deleted and re-added). `None` when the record is corrupt, which
    /// cannot happen for a footprint made by [`Footprint::encode`].
    pub fn previous_plan(&self, new: &ServicePlan) -> Option<ServicePlan> {
        let mut plan = ServicePlan::empty(&new.namespace, &new.name);
        let mut reader = self.after_digest();
        reader.count()?;
        let names = reader.names(&service_prefix(&new.namespace, &new.name))?;
        let blocks = reader.blocks(&names)?;
        for RecordedName {
            name,
            is_set,
            contents,
        } in &names
        {
            // Old contents are known only by digest: the same name with the same digest
            // is taken as unchanged (left alone), anything else as changed (a set is
            // flushed and refilled, a chain flushed and rewritten).
            if *is_set {
                let same = new
                    .sets
                    .iter()
                    .find(|set| set.set.name == *name && digest(&set.elements) == *contents);
                plan.sets.push(match same {
                    Some(set) => set.clone(),
                    None => SetPlan {
                        set: Set::new(name.clone(), DataType::Integer32),
                        elements: vec![unknown_element()],
                    },
                });
            } else {
                let same = new
                    .chains
                    .iter()
                    .find(|chain| chain.name() == name && digest(&chain.rules) == *contents);
                plan.chains.push(match same {
                    Some(chain) => chain.clone(),
                    None => ChainPlan {
                        chain: Chain::regular(name.clone()),
                        rules: vec![unknown_rules()],
                    },
                });
            }
        }
        // By set and key: a service may have thousands of endpoint elements.
        let planned: Planned<'_> = new
            .elements
            .iter()
            .map(|e| ((e.set, &e.element.key, &e.element.key_end), &e.element))
            .collect();
        previous_runs(&mut reader, &blocks, &planned, &mut plan.elements)?;
        for element in reader.elements()? {
            let same = planned
                .get(&(element.set, &element.key, &element.key_end))
                .filter(|planned| element.data.is(&planned.data, &names));
            plan.elements.push(ElementPlan {
                set: element.set,
                element: match same {
                    Some(planned) => (*planned).clone(),
                    None => Element {
                        key_end: element.key_end,
                        ..Element::new(element.key)
                    },
                },
            });
        }
        Some(plan)
    }

    /// The shared elements it holds outside the endpoint maps, key-only: what the UDP
    /// check reads the service's addresses from when the service itself is not known.
    /// `None` when the record is corrupt.
    pub fn shared_elements(&self) -> Option<Vec<ElementPlan>> {
        let mut reader = self.after_digest();
        reader.count()?;
        for _ in 0..reader.count()? {
            reader.name()?;
        }
        let blocks = reader.raw_blocks()?;
        for _ in 0..reader.count()? {
            let count = reader.run_head(blocks.len())?;
            reader.take(count.div_ceil(RUN_CHUNK as u32) as usize * 4)?;
        }
        let elements = reader.elements()?;
        Some(
            elements
                .into_iter()
                .map(|element| ElementPlan {
                    set: element.set,
                    element: Element {
                        key_end: element.key_end,
                        ..Element::new(element.key)
                    },
                })
                .collect(),
        )
    }
}

/// Consecutive keys of one endpoint map, as [`Footprint::encode`] gathers them.
struct Run<'p> {
    set: SharedSet,
    /// What precedes the key in a map of [`SharedKind::PortEndpoints`].
    prefix: &'p [Value],
    first: u32,
    datas: Vec<&'p Option<ElementData>>,
}

impl Run<'_> {
    /// Whether `key` in `set` after `prefix` is the run's next.
    fn continues(&self, set: SharedSet, prefix: &[Value], key: u32) -> bool {
        self.set == set
            && self.prefix == prefix
            && u32::try_from(self.datas.len())
                .ok()
                .and_then(|n| self.first.checked_add(n))
                == Some(key)
    }
}

/// What every name of a service's ports starts with: the first name is coded against it.
fn service_prefix(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}/")
}

/// Planned elements by set, key and key end.
type Planned<'a> = HashMap<(SharedSet, &'a Tuple, &'a Option<Tuple>), &'a Element>;

/// Reads a footprint's endpoint runs into `elements`: the chunks' keys, each chunk left
/// alone when `planned` has the same data at all of its keys, and replaced whole
/// otherwise. `None` when the record is corrupt.
fn previous_runs(
    reader: &mut Reader<'_>,
    blocks: &[KeyBlock],
    planned: &Planned<'_>,
    elements: &mut Vec<ElementPlan>,
) -> Option<()> {
    let runs = reader.count()?;
    for _ in 0..runs {
        let RecordedRun {
            set,
            prefix,
            first,
            count,
        } = reader.run(blocks)?;
        // The chunks' keys, each chunk left alone when the new plan has the same data
        // at all of its keys, and replaced whole otherwise.
        let key = |index: u32| {
            let mut values = prefix.clone();
            values.push(Value::Integer32(index));
            Tuple(values)
        };
        let mut start = 0;
        while start < count {
            let end = count.min(start.saturating_add(RUN_CHUNK as u32));
            let keys: Vec<Tuple> = (start..end)
                .map(|i| Some(key(first.checked_add(i)?)))
                .collect::<Option<_>>()?;
            let stored = reader.u32()?;
            let now: Option<Vec<&Element>> = keys
                .iter()
                .map(|key| planned.get(&(set, key, &None)).copied())
                .collect();
            let unchanged = now.filter(|now| {
                let datas: Vec<&Option<ElementData>> =
                    now.iter().map(|element| &element.data).collect();
                digest(&datas.as_slice()) == stored
            });
            match unchanged {
                Some(now) => elements.extend(now.into_iter().map(|element| ElementPlan {
                    set,
                    element: element.clone(),
                })),
                None => elements.extend(keys.into_iter().map(|key| ElementPlan {
                    set,
                    element: Element::new(key),
                })),
            }
            start = end;
        }
    }
    Some(())
}

/// The key of an element stored in a run: a 32-bit integer (an endpoint map's key), after
/// the service address, protocol and port in a map of [`SharedKind::PortEndpoints`].
fn run_key(element: &ElementPlan) -> Option<(&[Value], u32)> {
    match (
        element.set.kind,
        &element.element.key.0[..],
        &element.element.key_end,
    ) {
        (SharedKind::Endpoints, [Value::Integer32(key)], None) => Some((&[], *key)),
        (SharedKind::PortEndpoints, [prefix @ .., Value::Integer32(index)], None)
            if prefix.len() == 3 =>
        {
            Some((prefix, *index))
        }
        _ => None,
    }
}

/// A stand-in for the rules of an old chain we no longer know: a `return` alone, which
/// no planned chain consists of, so the chain always counts as changed.
fn unknown_rules() -> RulePlan {
    RulePlan::new([Stmt::Verdict(Verdict::Return)])
}

/// A stand-in for the elements of an old set we no longer know, equal to no planned
/// element list.
fn unknown_element() -> Element {
    Element::new(Value::Integer32(u32::MAX))
}

/// A digest of a chain's rules, a set's elements or one element's data; the process-local
/// hasher is fine for an in-memory record. Truncated: a collision only leaves alone what
/// changed in a way a 1 in 4 billion chance hides; the next full sync corrects it.
fn digest(contents: &impl Hash) -> u32 {
    let mut hasher = DefaultHasher::new();
    contents.hash(&mut hasher);
    hasher.finish() as u32
}

fn common_prefix(a: &str, b: &str) -> usize {
    let mut shared = a
        .bytes()
        .zip(b.bytes())
        .take(usize::from(u8::MAX))
        .take_while(|(x, y)| x == y)
        .count();
    while !b.is_char_boundary(shared) {
        shared -= 1;
    }
    shared
}

/// A shared set in one byte (its kind and family, with `flags` in the bits above), and its
/// shard in two more for endpoint maps.
fn write_set(bytes: &mut Vec<u8>, set: SharedSet, flags: u8) {
    let kind = match set.kind {
        SharedKind::Endpoints => SharedKind::ALL.len(),
        SharedKind::PortEndpoints => SharedKind::ALL.len() + 1,
        kind => SharedKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or_default(),
    };
    let family = usize::from(set.family == Family::V6);
    bytes.push(u8::try_from(kind * 2 + family).unwrap_or_default() | flags);
    if set.is_endpoint_map() {
        bytes.extend_from_slice(&set.shard.to_ne_bytes());
    }
}

/// The endpoint runs: each as the block it fills (by its number among `blocks`) or its
/// set, first key and, in a map of [`SharedKind::PortEndpoints`], its key's prefix; then
/// its count and one digest per chunk of [`RUN_CHUNK`] elements.
fn write_runs(bytes: &mut Vec<u8>, runs: &[Run<'_>], blocks: &[KeyBlock]) {
    write_count(bytes, runs.len());
    for Run {
        set,
        prefix,
        first,
        datas,
    } in runs
    {
        let block = blocks
            .iter()
            .position(|block| block.map == *set && block.offset == *first)
            .and_then(|index| u8::try_from(index + 1).ok());
        match block {
            Some(number) if prefix.is_empty() => bytes.push(number),
            _ => {
                bytes.push(0);
                write_set(bytes, *set, 0);
                write_varint(bytes, *first);
                if set.kind == SharedKind::PortEndpoints {
                    write_tuple(bytes, &Tuple(prefix.to_vec()), None);
                }
            }
        }
        write_count(bytes, datas.len());
        for chunk in datas.chunks(RUN_CHUNK) {
            bytes.extend_from_slice(&digest(&chunk).to_ne_bytes());
        }
    }
}

/// A key block: its map, first key, size class and rule's place, and its chain by the
/// index of its name (`chain`, when the footprint names it) or by hash.
fn write_block(bytes: &mut Vec<u8>, block: &KeyBlock, chain: Option<u32>) {
    write_set(bytes, block.map, 0);
    write_varint(bytes, block.offset);
    // A class is below 32: one byte holds it with the rule's place up to 3.
    write_varint(
        bytes,
        u32::from(block.rule) << CLASS_BITS | u32::from(block.class),
    );
    match chain {
        Some(index) => write_varint(bytes, index + 1),
        None => {
            bytes.push(0);
            bytes.extend_from_slice(&block.chain.to_ne_bytes());
        }
    }
}

/// An element outside the runs: its set and flags; its data's digest if it has data, or
/// the index of the chain its verdict names (`target`, when the footprint names it); its
/// key, coded against the key before it, and its key end, coded against its key.
fn write_element(
    bytes: &mut Vec<u8>,
    element: &ElementPlan,
    target: Option<u32>,
    previous_key: Option<&Tuple>,
) {
    let Element {
        key, key_end, data, ..
    } = &element.element;
    let mut flags = 0;
    if data.is_some() {
        flags |= ELEMENT_HAS_DATA;
        if target.is_some() {
            flags |= ELEMENT_DATA_IS_CHAIN;
        }
    }
    if key_end.is_some() {
        flags |= ELEMENT_HAS_KEY_END;
    }
    write_set(bytes, element.set, flags);
    match (data, target) {
        (Some(ElementData::Verdict(verdict)), Some(index)) => {
            let jump = u32::from(matches!(verdict, Verdict::Jump(_)));
            write_varint(bytes, index.saturating_mul(2) | jump);
        }
        (Some(_), _) => bytes.extend_from_slice(&digest(data).to_ne_bytes()),
        (None, _) => {}
    }
    write_tuple(bytes, key, previous_key);
    if let Some(end) = key_end {
        write_tuple(bytes, end, Some(key));
    }
}

fn write_varint(bytes: &mut Vec<u8>, value: u32) {
    let mut buffer = [0; 5];
    let len = value.encode_var(&mut buffer);
    bytes.extend_from_slice(&buffer[..len]);
}

fn write_count(bytes: &mut Vec<u8>, count: usize) {
    // A service's elements are bounded by its endpoints and ports, far below 2³².
    write_varint(bytes, u32::try_from(count).unwrap_or(u32::MAX));
}

/// A tuple's length, then each value by type and bytes, or as [`VALUE_AS_BEFORE`] when
/// it equals the value at its position in `previous`.
fn write_tuple(bytes: &mut Vec<u8>, tuple: &Tuple, previous: Option<&Tuple>) {
    bytes.push(u8::try_from(tuple.0.len()).unwrap_or(u8::MAX));
    for (position, value) in tuple.0.iter().enumerate() {
        if previous.and_then(|previous| previous.0.get(position)) == Some(value) {
            bytes.push(VALUE_AS_BEFORE);
            continue;
        }
        match *value {
            Value::Ipv4(addr) => {
                bytes.push(0);
                bytes.extend_from_slice(&addr.octets());
            }
            Value::Ipv6(addr) => {
                bytes.push(1);
                bytes.extend_from_slice(&addr.octets());
            }
            Value::InetProto(proto) => bytes.extend_from_slice(&[2, proto]),
            Value::InetService(port) => {
                bytes.push(3);
                bytes.extend_from_slice(&port.to_be_bytes());
            }
            Value::Mark(mark) => {
                bytes.push(4);
                bytes.extend_from_slice(&mark.to_ne_bytes());
            }
            Value::Integer32(value) => {
                bytes.push(5);
                bytes.extend_from_slice(&value.to_ne_bytes());
            }
        }
    }
}

/// A shared element as a footprint keeps it outside the runs.
struct RecordedElement {
    set: SharedSet,
    key: Tuple,
    key_end: Option<Tuple>,
    data: RecordedData,
}

/// What a footprint knows of an element's data.
enum RecordedData {
    None,
    /// [`digest`] of the data.
    Digest(u32),
    /// A verdict to the chain at this index among the footprint's names: a jump, or a goto.
    Chain {
        index: usize,
        jump: bool,
    },
}

impl RecordedData {
    /// Whether `data` is what was recorded (by digest, where only that was kept), the
    /// footprint's names being `names`.
    fn is(&self, data: &Option<ElementData>, names: &[RecordedName]) -> bool {
        match (self, data) {
            (RecordedData::None, None) => true,
            (RecordedData::Digest(recorded), Some(_)) => digest(data) == *recorded,
            (
                RecordedData::Chain { index, jump },
                Some(ElementData::Verdict(Verdict::Goto(chain))),
            ) => !jump && names.get(*index).is_some_and(|name| name.name == *chain),
            (
                RecordedData::Chain { index, jump },
                Some(ElementData::Verdict(Verdict::Jump(chain))),
            ) => *jump && names.get(*index).is_some_and(|name| name.name == *chain),
            _ => false,
        }
    }
}

/// A chain's or set's entry in a footprint, read back whole.
struct RecordedName {
    name: String,
    is_set: bool,
    /// [`digest`] of its rules or elements.
    contents: u32,
}

/// A name entry as stored: coded against the one before.
struct NameBytes<'a> {
    /// Role, head and kind ([`TAG_ROLE_SHIFT`], [`TAG_HEAD_SHIFT`], [`TAG_SET`]).
    tag: u8,
    /// Bytes it shares with the stored text before it.
    shared: usize,
    suffix: &'a str,
    contents: u32,
}

/// A key block as stored: its chain by the index of its name, or by hash.
struct BlockBytes {
    map: SharedSet,
    offset: u32,
    class: u8,
    rule: u16,
    chain: ChainRef,
}

enum ChainRef {
    Name(usize),
    Hash(u32),
}

/// A run of endpoint-map elements: `count` consecutive keys from `first`, whose data
/// digests follow, a chunk of [`RUN_CHUNK`] each.
struct RecordedRun {
    set: SharedSet,
    /// What precedes the index in the keys of a map of [`SharedKind::PortEndpoints`].
    prefix: Vec<Value>,
    first: u32,
    count: u32,
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.0.len() < len {
            return None;
        }
        let (head, tail) = self.0.split_at(len);
        self.0 = tail;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|bytes| bytes[0])
    }

    fn varint(&mut self) -> Option<u32> {
        let (value, len) = u32::decode_var(self.0)?;
        self.take(len)?;
        Some(value)
    }

    fn count(&mut self) -> Option<usize> {
        usize::try_from(self.varint()?).ok()
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_ne_bytes(self.take(8)?.try_into().ok()?))
    }

    fn name(&mut self) -> Option<NameBytes<'a>> {
        let tag = self.byte()?;
        let shared = usize::from(self.byte()?);
        let suffix_len = usize::from(self.byte()?);
        let suffix = std::str::from_utf8(self.take(suffix_len)?).ok()?;
        Some(NameBytes {
            tag,
            shared,
            suffix,
            contents: self.u32()?,
        })
    }

    /// The names, whole, of a service whose names' paths start with `prefix`.
    fn names(&mut self, prefix: &str) -> Option<Vec<RecordedName>> {
        let count = self.count()?;
        let mut names = Vec::with_capacity(count.min(self.0.len()));
        let mut previous = prefix.to_string();
        for _ in 0..count {
            let NameBytes {
                tag,
                shared,
                suffix,
                contents,
            } = self.name()?;
            let mut text = previous.get(..shared)?.to_string();
            text.push_str(suffix);
            let path = match usize::from((tag >> TAG_HEAD_SHIFT) & TAG_FIELD).checked_sub(1) {
                Some(head) => format!("{prefix}{}{text}", HEADS.get(head)?),
                None => text.clone(),
            };
            let name = match usize::from((tag >> TAG_ROLE_SHIFT) & TAG_FIELD).checked_sub(1) {
                Some(role) => join_name(ROLES.get(role)?, &path),
                None => path,
            };
            names.push(RecordedName {
                name,
                is_set: tag & TAG_SET != 0,
                contents,
            });
            previous = text;
        }
        Some(names)
    }

    fn raw_blocks(&mut self) -> Option<Vec<BlockBytes>> {
        let count = self.count()?;
        let mut blocks = Vec::with_capacity(count.min(self.0.len()));
        for _ in 0..count {
            let (map, offset, class_and_rule) = (self.set()?, self.varint()?, self.varint()?);
            blocks.push(BlockBytes {
                map,
                offset,
                class: u8::try_from(class_and_rule & CLASS_MASK).ok()?,
                rule: u16::try_from(class_and_rule >> CLASS_BITS).ok()?,
                chain: match self.count()?.checked_sub(1) {
                    Some(index) => ChainRef::Name(index),
                    None => ChainRef::Hash(self.u32()?),
                },
            });
        }
        Some(blocks)
    }

    /// The key blocks, their chains' hashes taken from `names`.
    fn blocks(&mut self, names: &[RecordedName]) -> Option<Vec<KeyBlock>> {
        self.raw_blocks()?
            .into_iter()
            .map(|block| {
                Some(KeyBlock {
                    map: block.map,
                    offset: block.offset,
                    class: block.class,
                    chain: match block.chain {
                        ChainRef::Name(index) => fnv1a(&names.get(index)?.name),
                        ChainRef::Hash(hash) => hash,
                    },
                    rule: block.rule,
                })
            })
            .collect()
    }

    /// A run's head: the block it fills (by its number among `blocks`, or spelled out as
    /// set and first key) and its length.
    fn run(&mut self, blocks: &[KeyBlock]) -> Option<RecordedRun> {
        let (set, first, prefix) = match usize::from(self.byte()?).checked_sub(1) {
            Some(index) => blocks
                .get(index)
                .map(|block| (block.map, block.offset, Vec::new()))?,
            None => {
                let (set, first) = (self.set()?, self.varint()?);
                (set, first, self.run_prefix(set)?)
            }
        };
        let count = u32::try_from(self.count()?).ok()?;
        Some(RecordedRun {
            set,
            prefix,
            first,
            count,
        })
    }

    /// The service address, protocol and port a run of `set` keys its elements by, if
    /// it is a map of [`SharedKind::PortEndpoints`].
    fn run_prefix(&mut self, set: SharedSet) -> Option<Vec<Value>> {
        if set.kind != SharedKind::PortEndpoints {
            return Some(Vec::new());
        }
        Some(self.tuple(None)?.0).filter(|prefix| prefix.len() == 3)
    }

    /// A run's head, of a footprint with `blocks` key blocks: its length.
    fn run_head(&mut self, blocks: usize) -> Option<u32> {
        match usize::from(self.byte()?).checked_sub(1) {
            Some(index) if index < blocks => {}
            Some(_) => return None,
            None => {
                let set = self.set()?;
                self.varint()?;
                self.run_prefix(set)?;
            }
        }
        u32::try_from(self.count()?).ok()
    }

    /// The elements outside the runs, the last part of a footprint.
    fn elements(&mut self) -> Option<Vec<RecordedElement>> {
        let count = self.count()?;
        let mut elements: Vec<RecordedElement> = Vec::with_capacity(count.min(self.0.len()));
        for _ in 0..count {
            let (set, flags) = self.flagged_set()?;
            let data = match (
                flags & ELEMENT_HAS_DATA != 0,
                flags & ELEMENT_DATA_IS_CHAIN != 0,
            ) {
                (false, false) => RecordedData::None,
                (true, false) => RecordedData::Digest(self.u32()?),
                (true, true) => {
                    let reference = self.count()?;
                    RecordedData::Chain {
                        index: reference / 2,
                        jump: reference % 2 == 1,
                    }
                }
                (false, true) => return None,
            };
            let key = self.tuple(elements.last().map(|previous| &previous.key))?;
            let key_end = if flags & ELEMENT_HAS_KEY_END != 0 {
                Some(self.tuple(Some(&key))?)
            } else {
                None
            };
            elements.push(RecordedElement {
                set,
                key,
                key_end,
                data,
            });
        }
        Some(elements)
    }

    fn set(&mut self) -> Option<SharedSet> {
        match self.flagged_set()? {
            (set, 0) => Some(set),
            _ => None,
        }
    }

    fn flagged_set(&mut self) -> Option<(SharedSet, u8)> {
        let byte = self.byte()?;
        let index = usize::from(byte & !ELEMENT_FLAGS);
        let family = if index % 2 == 0 {
            Family::V4
        } else {
            Family::V6
        };
        let set = match SharedKind::ALL.get(index / 2) {
            Some(kind) => SharedSet::new(*kind, family),
            None if index / 2 == SharedKind::ALL.len() => {
                SharedSet::endpoints(family, u16::from_ne_bytes([self.byte()?, self.byte()?]))
            }
            None if index / 2 == SharedKind::ALL.len() + 1 => SharedSet {
                kind: SharedKind::PortEndpoints,
                family,
                shard: u16::from_ne_bytes([self.byte()?, self.byte()?]),
            },
            None => return None,
        };
        Some((set, byte & ELEMENT_FLAGS))
    }

    /// A tuple written by [`write_tuple`] against `previous`.
    fn tuple(&mut self, previous: Option<&Tuple>) -> Option<Tuple> {
        let len = self.byte()?;
        let mut values = Vec::with_capacity(usize::from(len));
        for position in 0..usize::from(len) {
            values.push(match self.byte()? {
                0 => Value::Ipv4(Ipv4Addr::from(<[u8; 4]>::try_from(self.take(4)?).ok()?)),
                1 => Value::Ipv6(Ipv6Addr::from(<[u8; 16]>::try_from(self.take(16)?).ok()?)),
                2 => Value::InetProto(self.byte()?),
                3 => Value::InetService(u16::from_be_bytes(self.take(2)?.try_into().ok()?)),
                4 => Value::Mark(u32::from_ne_bytes(self.take(4)?.try_into().ok()?)),
                5 => Value::Integer32(u32::from_ne_bytes(self.take(4)?.try_into().ok()?)),
                VALUE_AS_BEFORE => *previous?.0.get(position)?,
                _ => return None,
            });
        }
        Some(Tuple(values))
    }
}
