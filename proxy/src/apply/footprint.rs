//! The compact record of what one service put in the table: the digest of its plan, its
//! key blocks, the names of its chains and sets and the keys of its shared-map elements,
//! packed into one small byte string (the applier keeps one per service, so every field
//! held outside it would cost a word or more in 10,000 map entries).
//!
//! An update needs to know what to flush, delete and replace, but holding every
//! committed [`ServicePlan`] would hold the whole ruleset (rules, anonymous maps,
//! element data). A footprint keeps only names and keys. Names are stored without their
//! `role-HASH-` head when the hash can be recomputed, and front-coded against the
//! previous name in sorted order, so the ten endpoint chains of a port cost a few bytes
//! each (`…__10.244.1.5/8080` after `…__10.244.1.4/8080`). Contents are kept as 32-bit
//! digests: a chain's rules, a set's elements, a shared-map element's data, and for the
//! endpoint maps' runs of keys one digest per chunk of 4 elements, so that the record
//! grows with services and ports, not with endpoints. What still matches is left alone; a
//! chain that changed is rewritten, a set refilled, an element (or an endpoint chunk)
//! deleted by key and re-added.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr};

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

/// What one service last put in the table, in a few dozen bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint(pub(super) Box<[u8]>);

/// Where the header's fields sit: the plan's digest, then its chain count, then its key
/// blocks (a count and the blocks), then the names and elements.
const DIGEST: std::ops::Range<usize> = 0..8;
const CHAINS: std::ops::Range<usize> = 8..12;
const BLOCKS: usize = 12;

impl Footprint {
    /// The record of `plan`, whose [`ServicePlan::digest`] is `digest`.
    pub fn of(plan: &ServicePlan, plan_digest: u64) -> Footprint {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&plan_digest.to_ne_bytes());
        write_count(&mut bytes, plan.chains.len());
        write_count(&mut bytes, plan.blocks.len());
        for block in &plan.blocks {
            write_set(&mut bytes, block.map);
            bytes.extend_from_slice(&block.offset.to_ne_bytes());
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
        let mut previous = "";
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
        // a run is stored as its set, first key and count, then one digest per chunk of
        // [`RUN_CHUNK`] elements.
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
            write_set(&mut bytes, *set);
            bytes.extend_from_slice(&first.to_ne_bytes());
            write_count(&mut bytes, datas.len());
            for chunk in datas.chunks(RUN_CHUNK) {
                bytes.extend_from_slice(&digest(&chunk).to_ne_bytes());
            }
        }
        write_count(&mut bytes, others.len());
        for element in others {
            write_set(&mut bytes, element.set);
            bytes.extend_from_slice(&data_digest(&element.element.data).to_ne_bytes());
            write_tuple(&mut bytes, &element.element.key);
            match &element.element.key_end {
                Some(end) => {
                    bytes.push(1);
                    write_tuple(&mut bytes, end);
                }
                None => bytes.push(0),
            }
        }
        Footprint(bytes.into_boxed_slice())
    }

    /// Heap bytes held.
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
        let mut reader = Reader(self.0.get(CHAINS).unwrap_or_default());
        reader.count().unwrap_or_default()
    }

    /// The key blocks its endpoints took, for the next plan to reuse (none when corrupt).
    pub fn blocks(&self) -> Vec<KeyBlock> {
        let mut reader = Reader(self.0.get(BLOCKS..).unwrap_or_default());
        reader.blocks().unwrap_or_default()
    }

    /// The previous plan as far as [`crate::plan::PlanBatch::update_service`] needs it to
    /// turn it into `new`: chains and sets by name, with rules that match no real chain
    /// so that every surviving chain is flushed and rewritten, and elements equal to
    /// `new`'s where key and data digest agree (left alone), key-only otherwise (deleted
    /// and re-added). `None` when the record is corrupt, which cannot happen for a
    /// footprint made by [`Footprint::of`].
    pub fn previous_plan(&self, new: &ServicePlan) -> Option<ServicePlan> {
        let mut plan = ServicePlan::empty(&new.namespace, &new.name);
        let mut reader = Reader(self.0.get(BLOCKS..)?);
        reader.blocks()?;
        let names = reader.count()?;
        let mut previous = String::new();
        for _ in 0..names {
            let tag = reader.byte()?;
            let shared = usize::from(reader.byte()?);
            let suffix_len = usize::from(reader.byte()?);
            let suffix = std::str::from_utf8(reader.take(suffix_len)?).ok()?;
            let mut text = previous.get(..shared)?.to_string();
            text.push_str(suffix);
            let role = usize::from(tag >> TAG_ROLE_SHIFT);
            let name = match role.checked_sub(1) {
                Some(index) => join_name(ROLES.get(index)?, &text),
                None => text.clone(),
            };
            let contents = u32::from_ne_bytes(reader.take(4)?.try_into().ok()?);
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
        previous_runs(&mut reader, &planned, &mut plan.elements)?;
        let mut previous_element = |set: SharedSet, key: Tuple, key_end: Option<Tuple>, digest| {
            let same = planned
                .get(&(set, &key, &key_end))
                .filter(|element| data_digest(&element.data) == digest);
            let element = match same {
                Some(element) => (*element).clone(),
                None => Element {
                    key_end,
                    ..Element::new(key)
                },
            };
            plan.elements.push(ElementPlan { set, element });
        };
        let elements = reader.count()?;
        for _ in 0..elements {
            let set = reader.set()?;
            let digest = reader.u32()?;
            let key = reader.tuple()?;
            let key_end = match reader.byte()? {
                0 => None,
                _ => Some(reader.tuple()?),
            };
            previous_element(set, key, key_end, digest);
        }
        Some(plan)
    }
}

/// Planned elements by set, key and key end.
type Planned<'a> = HashMap<(SharedSet, &'a Tuple, &'a Option<Tuple>), &'a Element>;

/// Reads a footprint's endpoint runs into `elements`: the chunks' keys, each chunk left
/// alone when `planned` has the same data at all of its keys, and replaced whole
/// otherwise. `None` when the record is corrupt.
fn previous_runs(
    reader: &mut Reader<'_>,
    planned: &Planned<'_>,
    elements: &mut Vec<ElementPlan>,
) -> Option<()> {
    let runs = reader.count()?;
    for _ in 0..runs {
        let set = reader.set()?;
        let first = reader.u32()?;
        let count = reader.u32()?;
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

/// A digest of a chain's rules or a set's elements, like [`data_digest`] for one
/// element's data.
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

/// A digest of element data; the process-local hasher is fine for an in-memory record.
fn data_digest(data: &Option<ElementData>) -> u32 {
    let mut hasher = DefaultHasher::new();
    data.hash(&mut hasher);
    // Truncated: a collision only skips re-adding an element whose data changed in a
    // way a 1 in 4 billion chance hides; the next full sync corrects it.
    hasher.finish() as u32
}

/// A shared set in one byte (its kind and family), and its shard in two more for
/// endpoint maps.
fn write_set(bytes: &mut Vec<u8>, set: SharedSet) {
    let kind = match set.kind {
        SharedKind::Endpoints => SharedKind::ALL.len(),
        kind => SharedKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or_default(),
    };
    let family = usize::from(set.family == Family::V6);
    bytes.push(u8::try_from(kind * 2 + family).unwrap_or_default());
    if set.kind == SharedKind::Endpoints {
        bytes.extend_from_slice(&set.shard.to_ne_bytes());
    }
}

fn write_count(bytes: &mut Vec<u8>, count: usize) {
    // A service's elements are bounded by its endpoints and ports, far below 2³².
    bytes.extend_from_slice(&u32::try_from(count).unwrap_or(u32::MAX).to_ne_bytes());
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

    fn count(&mut self) -> Option<usize> {
        usize::try_from(self.u32()?).ok()
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_ne_bytes(self.take(8)?.try_into().ok()?))
    }

    fn blocks(&mut self) -> Option<Vec<KeyBlock>> {
        let count = self.count()?;
        let mut blocks = Vec::with_capacity(count.min(self.0.len()));
        for _ in 0..count {
            blocks.push(KeyBlock {
                map: self.set()?,
                offset: self.u32()?,
                class: self.byte()?,
                chain: self.u32()?,
            });
        }
        Some(blocks)
    }

    fn set(&mut self) -> Option<SharedSet> {
        let index = usize::from(self.byte()?);
        let family = if index % 2 == 0 {
            Family::V4
        } else {
            Family::V6
        };
        match SharedKind::ALL.get(index / 2) {
            Some(kind) => Some(SharedSet::new(*kind, family)),
            None if index / 2 == SharedKind::ALL.len() => Some(SharedSet::endpoints(
                family,
                u16::from_ne_bytes([self.byte()?, self.byte()?]),
            )),
            None => None,
        }
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
