//! The compact record of what one service put in the table: the digest of its plan, its
//! key blocks, the names of its chains and sets and the keys of its shared-map elements,
//! packed into one small byte string, and [`Footprints`], which keeps every service's
//! string in one arena (10,000 boxes would each cost their allocation's rounding, and the
//! map a fat pointer per entry).
//!
//! An update needs to know what to flush, delete and replace, but holding every
//! committed [`ServicePlan`] would hold the whole ruleset (rules, anonymous maps,
//! element data). A footprint keeps only names and keys. Names are stored without their
//! `role-HASH-` head when the hash can be recomputed, and front-coded against the
//! previous name in sorted order, the first against the service's own `namespace/name/`
//! (which every name of its ports starts with, and which the reader knows), so the ten
//! endpoint chains of a port cost a few bytes each (`…__10.244.1.5/8080` after
//! `…__10.244.1.4/8080`). Contents are kept as 32-bit digests: a chain's rules, a set's
//! elements, a shared-map element's data, and for the endpoint maps' runs of keys one
//! digest per chunk of 4 elements, so that the record grows with services and ports, not
//! with endpoints. A run names the key block it fills rather than repeating its map and
//! first key, counts and keys are varints, and an element without data stores no digest.
//! What still matches is left alone; a chain that changed is rewritten, a set refilled,
//! an element (or an endpoint chunk) deleted by key and re-added.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr};

use integer_encoding::VarInt;
use nodus_view::model::Family;

use crate::nft::{Chain, DataType, Element, ElementData, Set, Tuple, Value, Verdict};
use crate::plan::{
    ChainPlan, ElementPlan, KeyBlock, RulePlan, ServicePlan, SetPlan, SharedKind, SharedSet, Stmt,
    join_name, split_name,
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

/// Endpoint elements per digest in a run: a change rewrites the chunk that holds it, at
/// most this many elements (each element added costs a validation against every rule
/// bound to its map, so 16 made a two-port churn three times slower), and a service of
/// ten endpoints keeps three digests a port where it kept ten.
const RUN_CHUNK: usize = 4;

/// Tag bits of a name entry.
const TAG_SET: u8 = 0x01;
/// Role index + 1 in the upper bits; 0 means the name is stored whole.
const TAG_ROLE_SHIFT: u32 = 1;

/// Flags in the set byte of an element outside the runs (the set itself takes the low
/// four bits): it has data, whose digest follows; it has a key end, which follows its key.
const ELEMENT_HAS_DATA: u8 = 0x40;
const ELEMENT_HAS_KEY_END: u8 = 0x80;
const ELEMENT_FLAGS: u8 = ELEMENT_HAS_DATA | ELEMENT_HAS_KEY_END;

/// What one service last put in the table, in a few dozen bytes: the bytes
/// [`Footprint::encode`] made, as [`Footprints`] keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint<'a>(pub(super) &'a [u8]);

/// The plan's digest comes first, then its chain count, its key blocks, the names and the
/// elements.
const DIGEST: std::ops::Range<usize> = 0..8;

impl<'a> Footprint<'a> {
    /// The record of `plan`, whose [`ServicePlan::digest`] is `digest`.
    pub fn encode(plan: &ServicePlan, plan_digest: u64) -> Box<[u8]> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&plan_digest.to_ne_bytes());
        write_count(&mut bytes, plan.chains.len());
        write_count(&mut bytes, plan.blocks.len());
        for block in &plan.blocks {
            write_set(&mut bytes, block.map, 0);
            write_varint(&mut bytes, block.offset);
            bytes.push(block.class);
            bytes.extend_from_slice(&block.chain.to_ne_bytes());
        }
        // Every entry carries a digest of its contents: a chain's rules, a set's elements.
        let mut names: Vec<(bool, u32, Option<u8>, &str)> = plan
            .chains
            .iter()
            .map(|chain| (false, digest(&chain.rules), chain.name()))
            .chain(
                plan.sets
                    .iter()
                    .map(|set| (true, digest(&set.elements), set.set.name.as_str())),
            )
            .map(|(is_set, digest, name)| match split_name(name) {
                Some((role, path)) => match ROLES.iter().position(|r| *r == role) {
                    Some(index) => (is_set, digest, u8::try_from(index).ok(), path),
                    None => (is_set, digest, None, name),
                },
                None => (is_set, digest, None, name),
            })
            .collect();
        names.sort_by(|a, b| a.3.cmp(b.3));
        write_count(&mut bytes, names.len());
        let prefix = service_prefix(plan);
        let mut previous = prefix.as_str();
        for (is_set, digest, role, text) in names {
            let shared = common_prefix(previous, text);
            let suffix = &text[shared..];
            let role_bits = role.map_or(0, |index| (index + 1) << TAG_ROLE_SHIFT);
            bytes.push((u8::from(is_set) * TAG_SET) | role_bits);
            // Names hold at most 255 bytes (nf_tables), so one byte holds each length.
            bytes.push(u8::try_from(shared).unwrap_or(u8::MAX));
            bytes.push(u8::try_from(suffix.len()).unwrap_or(u8::MAX));
            bytes.extend_from_slice(suffix.as_bytes());
            bytes.extend_from_slice(&digest.to_ne_bytes());
            previous = text;
        }
        // Endpoint-map elements come in runs of consecutive keys (a chain's key block):
        // a run is stored as the block it fills (or its set and first key), its count,
        // then one digest per chunk of [`RUN_CHUNK`] elements.
        let mut runs: Vec<(SharedSet, u32, Vec<&Option<ElementData>>)> = Vec::new();
        let mut others: Vec<&ElementPlan> = Vec::new();
        for element in &plan.elements {
            let Some(key) = run_key(element) else {
                others.push(element);
                continue;
            };
            let data = &element.element.data;
            match runs.last_mut() {
                Some((set, first, datas))
                    if *set == element.set
                        && u32::try_from(datas.len())
                            .ok()
                            .and_then(|n| first.checked_add(n))
                            == Some(key) =>
                {
                    datas.push(data);
                }
                _ => runs.push((element.set, key, vec![data])),
            }
        }
        write_count(&mut bytes, runs.len());
        for (set, first, datas) in &runs {
            let block = plan
                .blocks
                .iter()
                .position(|block| block.map == *set && block.offset == *first)
                .and_then(|index| u8::try_from(index + 1).ok());
            match block {
                Some(number) => bytes.push(number),
                None => {
                    bytes.push(0);
                    write_set(&mut bytes, *set, 0);
                    write_varint(&mut bytes, *first);
                }
            }
            write_count(&mut bytes, datas.len());
            for chunk in datas.chunks(RUN_CHUNK) {
                bytes.extend_from_slice(&digest(&chunk).to_ne_bytes());
            }
        }
        write_count(&mut bytes, others.len());
        for element in others {
            write_element(&mut bytes, element);
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

    /// The key blocks its endpoints took, for the next plan to reuse (none when corrupt).
    pub fn blocks(&self) -> Vec<KeyBlock> {
        let mut reader = self.after_digest();
        reader
            .count()
            .and_then(|_| reader.blocks())
            .unwrap_or_default()
    }

    /// The reader past the digest, at the chain count.
    fn after_digest(&self) -> Reader<'a> {
        Reader(self.0.get(DIGEST.end..).unwrap_or_default())
    }

    /// The previous plan as far as [`crate::plan::PlanBatch::update_service`] needs it to
    /// turn it into `new` (the same service's plan now): chains and sets by name, with
    /// rules that match no real chain so that every surviving chain is flushed and
    /// rewritten, and elements equal to `new`'s where key and data digest agree (left
    /// alone), key-only otherwise (deleted and re-added). `None` when the record is
    /// corrupt, which cannot happen for a footprint made by [`Footprint::encode`].
    pub fn previous_plan(&self, new: &ServicePlan) -> Option<ServicePlan> {
        let mut plan = ServicePlan::empty(&new.namespace, &new.name);
        let mut reader = self.after_digest();
        reader.count()?;
        let blocks = reader.blocks()?;
        let names = reader.count()?;
        let mut previous = service_prefix(new);
        for _ in 0..names {
            let RecordedName {
                tag,
                shared,
                suffix,
                contents,
            } = reader.name()?;
            let mut text = previous.get(..shared)?.to_string();
            text.push_str(suffix);
            let role = usize::from(tag >> TAG_ROLE_SHIFT);
            let name = match role.checked_sub(1) {
                Some(index) => join_name(ROLES.get(index)?, &text),
                None => text.clone(),
            };
            // Old contents are known only by digest: the same name with the same digest
            // is taken as unchanged (left alone), anything else as changed (a set is
            // flushed and refilled, a chain flushed and rewritten).
            if tag & TAG_SET != 0 {
                let same = new
                    .sets
                    .iter()
                    .find(|set| set.set.name == name && digest(&set.elements) == contents);
                plan.sets.push(match same {
                    Some(set) => set.clone(),
                    None => SetPlan {
                        set: Set::new(name, DataType::Integer32),
                        elements: vec![unknown_element()],
                    },
                });
            } else {
                let same = new
                    .chains
                    .iter()
                    .find(|chain| chain.name() == name && digest(&chain.rules) == contents);
                plan.chains.push(match same {
                    Some(chain) => chain.clone(),
                    None => ChainPlan {
                        chain: Chain::regular(name),
                        rules: vec![unknown_rules()],
                    },
                });
            }
            previous = text;
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
                .filter(|planned| digest(&planned.data) == element.data_digest);
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
        let blocks = reader.blocks()?;
        for _ in 0..reader.count()? {
            reader.name()?;
        }
        for _ in 0..reader.count()? {
            let run = reader.run(&blocks)?;
            reader.take(run.count.div_ceil(RUN_CHUNK as u32) as usize * 4)?;
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

/// What every name of a service's ports starts with: the first name is coded against it.
fn service_prefix(plan: &ServicePlan) -> String {
    format!("{}/{}/", plan.namespace, plan.name)
}

/// Every service's footprint, by [`service_key`], in one arena. A footprint replaced or
/// removed leaves its bytes behind until they are a quarter of those still used; the
/// arena is then packed in place (what it costs: a sorted list of the spans, 8 bytes a
/// service, for the moment it takes).
#[derive(Debug, Default)]
pub struct Footprints {
    spans: HashMap<u64, Span>,
    arena: Vec<u8>,
    /// Bytes of `arena` that no span covers any more.
    garbage: usize,
}

/// Where one footprint sits in the arena.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    len: u32,
}

/// Garbage below this is never packed away: a few changed services are not worth a pass.
const PACK_ABOVE: usize = 64 << 10;

/// The least the arena grows by at a time.
const ARENA_STEP: usize = 4 << 10;

/// The arena's size is kept to 32-bit offsets: 4 GiB of footprints, tens of millions of
/// services, far beyond what the view can hold.
#[derive(Debug, thiserror::Error)]
#[error("the proxy's records hold 4 GiB; this service's was not kept")]
pub struct RecordsFull;

impl Footprints {
    pub fn get(&self, key: u64) -> Option<Footprint<'_>> {
        self.spans.get(&key).map(|span| self.at(*span))
    }

    pub fn contains(&self, key: u64) -> bool {
        self.spans.contains_key(&key)
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = Footprint<'_>> {
        self.spans.values().map(|span| self.at(*span))
    }

    /// Heap bytes held: the map's table and the arena.
    pub fn heap_bytes(&self) -> usize {
        self.spans.capacity() * (size_of::<(u64, Span)>() + 1) + self.arena.capacity()
    }

    /// Keeps `footprint` (made by [`Footprint::encode`]) for the service `key`, in place of
    /// the one it had.
    pub fn insert(&mut self, key: u64, footprint: &[u8]) -> Result<(), RecordsFull> {
        self.remove(key);
        let start = u32::try_from(self.arena.len()).map_err(|_| RecordsFull)?;
        let len = u32::try_from(footprint.len()).map_err(|_| RecordsFull)?;
        start.checked_add(len).ok_or(RecordsFull)?;
        if self.arena.capacity() - self.arena.len() < footprint.len() {
            // Grown by an eighth, not doubled: a doubled arena would hold up to twice the
            // records, and the part written before a packing stays resident.
            let step = (self.arena.len() / 8).max(ARENA_STEP);
            self.arena.reserve_exact(step.max(footprint.len()));
        }
        self.arena.extend_from_slice(footprint);
        self.spans.insert(key, Span { start, len });
        Ok(())
    }

    pub fn remove(&mut self, key: u64) {
        if let Some(span) = self.spans.remove(&key) {
            self.garbage += span.len as usize;
            let used = self.arena.len() - self.garbage;
            if self.garbage > PACK_ABOVE && self.garbage * 4 > used {
                self.pack();
            }
        }
    }

    /// Forgets every footprint, and gives the arena back: the records about to be made
    /// again may take less.
    pub fn clear(&mut self) {
        self.spans.clear();
        self.arena = Vec::new();
        self.garbage = 0;
    }

    fn at(&self, span: Span) -> Footprint<'_> {
        let start = span.start as usize;
        Footprint(
            self.arena
                .get(start..start + span.len as usize)
                .unwrap_or_default(),
        )
    }

    /// Moves every footprint down over the garbage, in arena order.
    fn pack(&mut self) {
        let mut spans: Vec<&mut Span> = self.spans.values_mut().collect();
        spans.sort_unstable_by_key(|span| span.start);
        let mut end = 0;
        for span in spans {
            let start = span.start as usize;
            self.arena
                .copy_within(start..start + span.len as usize, end as usize);
            span.start = end;
            end += span.len;
        }
        self.arena.truncate(end as usize);
        // The packed tail was written: keep an eighth of it for the records that follow,
        // and give the rest back.
        self.arena
            .shrink_to(self.arena.len() + self.arena.len() / 8);
        self.garbage = 0;
    }
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
        let RecordedRun { set, first, count } = reader.run(blocks)?;
        // The chunks' keys, each chunk left alone when the new plan has the same data
        // at all of its keys, and replaced whole otherwise.
        let mut start = 0;
        while start < count {
            let end = count.min(start.saturating_add(RUN_CHUNK as u32));
            let keys: Vec<Tuple> = (start..end)
                .map(|i| Some(Tuple(vec![Value::Integer32(first.checked_add(i)?)])))
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

/// The key of an element stored in a run: a single 32-bit integer (an endpoint map's key).
fn run_key(element: &ElementPlan) -> Option<u32> {
    match (&element.element.key.0[..], &element.element.key_end) {
        ([Value::Integer32(key)], None) => Some(*key),
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
        kind => SharedKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or_default(),
    };
    let family = usize::from(set.family == Family::V6);
    bytes.push(u8::try_from(kind * 2 + family).unwrap_or_default() | flags);
    if set.kind == SharedKind::Endpoints {
        bytes.extend_from_slice(&set.shard.to_ne_bytes());
    }
}

/// An element outside the runs: its set and flags, its data's digest if it has data, its
/// key and key end.
fn write_element(bytes: &mut Vec<u8>, element: &ElementPlan) {
    let Element {
        key, key_end, data, ..
    } = &element.element;
    let mut flags = 0;
    if data.is_some() {
        flags |= ELEMENT_HAS_DATA;
    }
    if key_end.is_some() {
        flags |= ELEMENT_HAS_KEY_END;
    }
    write_set(bytes, element.set, flags);
    if data.is_some() {
        bytes.extend_from_slice(&digest(data).to_ne_bytes());
    }
    write_tuple(bytes, key);
    if let Some(end) = key_end {
        write_tuple(bytes, end);
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

fn write_tuple(bytes: &mut Vec<u8>, tuple: &Tuple) {
    bytes.push(u8::try_from(tuple.0.len()).unwrap_or(u8::MAX));
    for value in &tuple.0 {
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
    /// [`digest`] of its data (of none, when it has none).
    data_digest: u32,
}

/// A chain's or set's entry in a footprint: its name coded against the one before.
struct RecordedName<'a> {
    /// Role and kind ([`TAG_ROLE_SHIFT`], [`TAG_SET`]).
    tag: u8,
    /// Bytes it shares with the name before it.
    shared: usize,
    suffix: &'a str,
    /// [`digest`] of its rules or elements.
    contents: u32,
}

/// A run of endpoint-map elements: `count` consecutive keys from `first`, whose data
/// digests follow, a chunk of [`RUN_CHUNK`] each.
struct RecordedRun {
    set: SharedSet,
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

    fn name(&mut self) -> Option<RecordedName<'a>> {
        let tag = self.byte()?;
        let shared = usize::from(self.byte()?);
        let suffix_len = usize::from(self.byte()?);
        let suffix = std::str::from_utf8(self.take(suffix_len)?).ok()?;
        Some(RecordedName {
            tag,
            shared,
            suffix,
            contents: self.u32()?,
        })
    }

    /// A run's head: the block it fills (by its number among `blocks`, or spelled out as
    /// set and first key) and its length.
    fn run(&mut self, blocks: &[KeyBlock]) -> Option<RecordedRun> {
        let (set, first) = match usize::from(self.byte()?).checked_sub(1) {
            Some(index) => blocks.get(index).map(|block| (block.map, block.offset))?,
            None => (self.set()?, self.varint()?),
        };
        let count = u32::try_from(self.count()?).ok()?;
        Some(RecordedRun { set, first, count })
    }

    fn blocks(&mut self) -> Option<Vec<KeyBlock>> {
        let count = self.count()?;
        let mut blocks = Vec::with_capacity(count.min(self.0.len()));
        for _ in 0..count {
            blocks.push(KeyBlock {
                map: self.set()?,
                offset: self.varint()?,
                class: self.byte()?,
                chain: self.u32()?,
            });
        }
        Some(blocks)
    }

    /// The elements outside the runs, the last part of a footprint.
    fn elements(&mut self) -> Option<Vec<RecordedElement>> {
        let count = self.count()?;
        let mut elements = Vec::with_capacity(count.min(self.0.len()));
        for _ in 0..count {
            let (set, flags) = self.flagged_set()?;
            let data_digest = if flags & ELEMENT_HAS_DATA != 0 {
                self.u32()?
            } else {
                digest(&None::<ElementData>)
            };
            let key = self.tuple()?;
            let key_end = if flags & ELEMENT_HAS_KEY_END != 0 {
                Some(self.tuple()?)
            } else {
                None
            };
            elements.push(RecordedElement {
                set,
                key,
                key_end,
                data_digest,
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
            None => return None,
        };
        Some((set, byte & ELEMENT_FLAGS))
    }

    fn tuple(&mut self) -> Option<Tuple> {
        let len = self.byte()?;
        let mut values = Vec::with_capacity(usize::from(len));
        for _ in 0..len {
            values.push(match self.byte()? {
                0 => Value::Ipv4(Ipv4Addr::from(<[u8; 4]>::try_from(self.take(4)?).ok()?)),
                1 => Value::Ipv6(Ipv6Addr::from(<[u8; 16]>::try_from(self.take(16)?).ok()?)),
                2 => Value::InetProto(self.byte()?),
                3 => Value::InetService(u16::from_be_bytes(self.take(2)?.try_into().ok()?)),
                4 => Value::Mark(u32::from_ne_bytes(self.take(4)?.try_into().ok()?)),
                5 => Value::Integer32(u32::from_ne_bytes(self.take(4)?.try_into().ok()?)),
                _ => return None,
            });
        }
        Some(Tuple(values))
    }
}
