//! Where each dispatch chain's endpoints live in the shared endpoint maps.
//!
//! A chain without affinity DNATs with `numgen random mod N offset K map @endpoints-…`: its
//! N endpoints are the keys K…K+N−1 of one of a few shared maps. Why shared maps and not
//! one map per chain: the kernel keeps a table's sets in a list, and creating a set or
//! naming one in a rule walks it, so 20,000 per-port maps made a cold start quadratic
//! (8.7 s at 10,000 services). Why several maps and not one: adding an element to a map
//! re-validates it against every rule bound to the map, so one map bound by 10,000 rules
//! is quadratic the other way (63 s, measured with nft). [`SHARDS`] maps per family, the
//! chain's name hashed to one of them, keep both walks short.
//!
//! Key blocks are allocated here, outside the pure planner, because they depend on what
//! is already programmed: a block's size is N rounded up to a power of two, and a chain
//! keeps its block while N fits, so only changed elements are rewritten. A block whose
//! chain went or outgrew it is reused by the next chain of its size in that map. A full
//! sync starts over with a fresh allocator that avoids every key the table already holds
//! (a previous run's, or those of a partial sync the kernel refused), so the rules using
//! them keep working until their service's turn comes; the keys it did not claim are
//! removed at its end. Before it plans, it reads the blocks the table's dispatch rules use
//! ([`EndpointKeys::adopt`]): a chain gets its own block back while its endpoints fit, so
//! that an adoption after a restart finds its elements already in place and sends none of
//! them again, and the kernel never holds two copies.

use std::collections::HashMap;
use std::net::IpAddr;

use nodus_view::model::{Family, Protocol};

use super::names::protocol_name;
use super::objects::{KeyBlock, PORT_SHARDS, SHARDS, SharedSet};

/// The keys of one endpoint map.
#[derive(Debug, Default)]
struct KeySpace {
    /// Never allocated at or above this, except from `free`.
    next: u32,
    /// Released blocks by class.
    free: HashMap<u8, Vec<u32>>,
    /// Keys present in the table before the current full sync, and every key of an
    /// adopted block, as inclusive ranges: a table's keys come in blocks, so a range
    /// stands for ten keys or more (20,000 ranges at a restart with 200,000 elements,
    /// where the keys one by one were 3 MiB of its peak). Sorted and merged unless
    /// `unsorted`.
    reserved: Vec<(u32, u32)>,
    unsorted: bool,
}

impl KeySpace {
    fn allocate(&mut self, class: u8) -> u32 {
        if let Some(offset) = self.free.get_mut(&class).and_then(Vec::pop) {
            return offset;
        }
        if self.unsorted {
            self.reserved = merged(std::mem::take(&mut self.reserved));
            self.unsorted = false;
        }
        let size = 1u64 << class;
        let mut offset = u64::from(self.next);
        let mut wrapped = false;
        // Skip the blocks that hold a previous run's keys, wrapping around once at the end
        // of the key space (2³² keys against at most a few hundred thousand live ones).
        loop {
            if offset + size > 1 << 32 {
                if wrapped {
                    break;
                }
                (offset, wrapped) = (0, true);
            }
            // The first range that ends at or above `offset`: if it starts below the
            // block's end, the block moves past it.
            let first_reserved = self
                .reserved
                .partition_point(|(_, last)| u64::from(*last) < offset);
            match self.reserved.get(first_reserved) {
                Some((first, last)) if u64::from(*first) < offset + size => {
                    offset = u64::from(*last) + 1;
                }
                _ => break,
            }
        }
        // `next` grows only with the peak of live blocks: released ones are reused, and a
        // full sync starts a fresh allocator.
        self.next = u32::try_from(offset + size).unwrap_or(u32::MAX);
        u32::try_from(offset).unwrap_or_default()
    }
}

/// The allocator of key blocks, kept by the applier from sync to sync.
#[derive(Debug, Default)]
pub struct EndpointKeys {
    spaces: HashMap<SharedSet, KeySpace>,
    /// Blocks the table's dispatch rules use, found at the start of a full sync, and
    /// whether a chain took its block back; sorted by chain (hashed) and map once the
    /// first is asked for. A vector rather than a map: 20,000 of them at a restart's peak.
    adopted: Vec<(KeyBlock, bool)>,
    adopted_sorted: bool,
}

impl EndpointKeys {
    pub fn new() -> EndpointKeys {
        EndpointKeys::default()
    }

    /// Marks `keys` of `map` as taken by a previous run, until
    /// [`EndpointKeys::release_reserved`]. For a fresh allocator, at the start of a full sync.
    pub fn reserve(&mut self, map: SharedSet, keys: impl IntoIterator<Item = u32>) {
        let space = self.spaces.entry(map).or_default();
        space.free.clear();
        space.reserved = merged(keys.into_iter().map(|key| (key, key)).collect());
    }

    /// Forgets the reserved keys once the previous run's elements are gone, and the
    /// adopted blocks no chain took back.
    pub fn release_reserved(&mut self) {
        for space in self.spaces.values_mut() {
            space.reserved = Vec::new();
        }
        self.adopted = Vec::new();
    }

    /// Records that the dispatch rule at place `rule` in `chain` picks from keys
    /// `offset`…`offset + len − 1` of `map` in the table: the rule gets that block back
    /// while its endpoints fit. Its keys must also be [reserved](EndpointKeys::reserve),
    /// so that no other chain is given them.
    pub fn adopt(&mut self, chain: &str, rule: u16, map: SharedSet, offset: u32, len: u32) {
        let chain = fnv1a(chain);
        let block = KeyBlock {
            map,
            offset,
            class: class_of(len),
            chain,
            rule,
        };
        // The whole block, also the keys above `len` the chain may grow into.
        let space = self.spaces.entry(map).or_default();
        let last = (u64::from(offset) + (1u64 << block.class) - 1).min(u64::from(u32::MAX));
        space
            .reserved
            .push((offset, u32::try_from(last).unwrap_or(u32::MAX)));
        space.unsorted = true;
        self.adopted.push((block, false));
        self.adopted_sorted = false;
    }

    /// Blocks for one service's plan, reusing `previous` (what the service held) where
    /// the sizes still fit; what it does not reuse is released when the lease is dropped.
    pub fn lease(&mut self, previous: &[KeyBlock]) -> KeyLease<'_> {
        KeyLease {
            keys: self,
            previous: previous.to_vec(),
        }
    }

    /// The adopted block of rule `rule` of `chain` in `map`, once, if it holds `class`.
    fn adopted_block(
        &mut self,
        chain: u32,
        rule: u16,
        map: SharedSet,
        class: u8,
    ) -> Option<KeyBlock> {
        let identity = |block: &KeyBlock| (block.chain, block.rule, block.map);
        if !self.adopted_sorted {
            self.adopted
                .sort_unstable_by_key(|(block, _)| identity(block));
            self.adopted_sorted = true;
        }
        let at = self
            .adopted
            .binary_search_by_key(&(chain, rule, map), |(block, _)| identity(block))
            .ok()?;
        let (block, taken) = &mut self.adopted[at];
        if *taken || block.class < class {
            return None;
        }
        *taken = true;
        Some(*block)
    }

    fn release(&mut self, block: KeyBlock) {
        self.spaces
            .entry(block.map)
            .or_default()
            .free
            .entry(block.class)
            .or_default()
            .push(block.offset);
    }
}

/// The blocks one service's planning takes.
#[derive(Debug)]
pub struct KeyLease<'k> {
    keys: &'k mut EndpointKeys,
    previous: Vec<KeyBlock>,
}

impl KeyLease<'_> {
    /// A block of at least `len` keys for the dispatch rule at place `rule` in `chain`
    /// (by its name), in the chain's endpoint map.
    pub fn take(&mut self, chain: &str, rule: u16, family: Family, len: u32) -> KeyBlock {
        let chain = fnv1a(chain);
        let map = SharedSet::endpoints(family, shard_of_hash(chain));
        let class = class_of(len);
        // The rule's own block, while it fits, even when larger than needed now: keys cost
        // nothing, and a service that scales down and up again keeps them.
        if let Some(index) = self.previous.iter().position(|block| {
            block.chain == chain && block.rule == rule && block.map == map && block.class >= class
        }) {
            return self.previous.swap_remove(index);
        }
        // The block the table's rule uses (a full sync adopting a table), while it fits.
        if let Some(block) = self.keys.adopted_block(chain, rule, map, class) {
            return block;
        }
        let offset = self.keys.spaces.entry(map).or_default().allocate(class);
        KeyBlock {
            map,
            offset,
            class,
            chain,
            rule,
        }
    }
}

impl Drop for KeyLease<'_> {
    fn drop(&mut self) {
        for block in self.previous.drain(..) {
            self.keys.release(block);
        }
    }
}

/// `ranges` sorted, with those that overlap or touch made one.
fn merged(mut ranges: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::new();
    for (first, last) in ranges {
        match merged.last_mut() {
            Some((_, end)) if u64::from(first) <= u64::from(*end) + 1 => *end = (*end).max(last),
            _ => merged.push((first, last)),
        }
    }
    merged.shrink_to_fit();
    merged
}

/// The size class (log2, rounded up) of a block of `len` keys.
fn class_of(len: u32) -> u8 {
    u8::try_from(len.max(1).next_power_of_two().trailing_zeros()).unwrap_or(31)
}

/// FNV-1a of a chain's name ([`KeyBlock::chain`]): it never changes between builds.
/// The map of `count` endpoints of the port `protocol`/`port` of `address`: its shard
/// is a hash of the three (FNV-1a, stable across builds).
pub fn port_map(address: IpAddr, protocol: Protocol, port: u16, count: u16) -> SharedSet {
    let hash = fnv1a(&format!("{address}/{}/{port}", protocol_name(protocol)));
    // Below PORT_SHARDS, so it fits.
    let shard = (hash % u32::from(PORT_SHARDS)) as u16;
    SharedSet::port_endpoints(Family::of(address), count, shard)
}

pub(crate) fn fnv1a(chain: &str) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    chain.bytes().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(PRIME)
    })
}

fn shard_of_hash(hash: u32) -> u16 {
    // Below SHARDS, so it fits.
    (hash % u32::from(SHARDS)) as u16
}

/// The shard of a chain's endpoint map.
#[cfg(test)]
pub(crate) fn shard_of(chain: &str) -> u16 {
    shard_of_hash(fnv1a(chain))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_reused_while_their_size_fits_and_released_when_not() {
        let mut keys = EndpointKeys::new();
        let first = keys.lease(&[]).take("service-a", 0, Family::V4, 3);
        assert_eq!((first.offset, first.class), (0, 2));
        // Scaling from 3 to 4 endpoints (or down to 1) keeps the block; to 5 it moves.
        assert_eq!(
            keys.lease(&[first]).take("service-a", 0, Family::V4, 4),
            first
        );
        assert_eq!(
            keys.lease(&[first]).take("service-a", 0, Family::V4, 1),
            first
        );
        let grown = keys.lease(&[first]).take("service-a", 0, Family::V4, 5);
        assert_eq!((grown.offset, grown.class), (4, 3));
        // The released block goes to the next chain of its size in that map.
        let mut lease = keys.lease(&[]);
        let reused = lease.take("service-a", 0, Family::V4, 4);
        assert_eq!(reused.offset, 0);
    }

    #[test]
    fn each_chain_gets_its_own_block_back() {
        let mut keys = EndpointKeys::new();
        // Two chains in one map (names chosen to share a shard), and one elsewhere.
        let (x, y) = same_shard_pair();
        let mut lease = keys.lease(&[]);
        let first = [
            lease.take("service-other", 0, Family::V4, 2),
            lease.take(&x, 0, Family::V4, 1),
            lease.take(&y, 0, Family::V4, 1),
        ];
        drop(lease);
        let mut lease = keys.lease(&first);
        let again = [
            lease.take("service-other", 0, Family::V4, 2),
            lease.take(&x, 0, Family::V4, 1),
            lease.take(&y, 0, Family::V4, 1),
        ];
        assert_eq!(again, first);
    }

    #[test]
    fn the_rules_of_a_shared_chain_get_their_own_blocks_back() {
        let mut keys = EndpointKeys::new();
        let mut lease = keys.lease(&[]);
        let first = [
            lease.take("service-s", 0, Family::V4, 4),
            lease.take("service-s", 1, Family::V4, 2),
        ];
        drop(lease);
        // Asked the other way round, each rule still gets its own: the first rule's
        // block would fit the second's two endpoints too.
        let mut lease = keys.lease(&first);
        let second = lease.take("service-s", 1, Family::V4, 2);
        let zeroth = lease.take("service-s", 0, Family::V4, 4);
        assert_eq!([zeroth, second], first);
        drop(lease);
        // Adopted from the table, by the rule's place in the chain.
        let map = first[0].map;
        let mut keys = EndpointKeys::new();
        keys.reserve(
            map,
            (first[0].offset..first[0].offset + 4).chain(first[1].offset..first[1].offset + 2),
        );
        keys.adopt("service-s", 1, map, first[1].offset, 2);
        keys.adopt("service-s", 0, map, first[0].offset, 4);
        let mut lease = keys.lease(&[]);
        assert_eq!(lease.take("service-s", 1, Family::V4, 1), first[1]);
        assert_eq!(lease.take("service-s", 0, Family::V4, 3), first[0]);
    }

    fn same_shard_pair() -> (String, String) {
        let x = "service-x".to_string();
        let y = (0..)
            .map(|i| format!("service-y{i}"))
            .find(|y| shard_of(y) == shard_of(&x))
            .expect("some name shares the shard");
        (x, y)
    }

    #[test]
    fn a_full_sync_allocates_around_the_previous_runs_keys() {
        let mut keys = EndpointKeys::new();
        let map = SharedSet::endpoints(Family::V6, shard_of("service-b"));
        keys.reserve(map, [20, 9, 0, 1, 2]);
        let mut lease = keys.lease(&[]);
        let a = lease.take("service-b", 0, Family::V6, 4);
        let b = lease.take("service-b", 0, Family::V6, 8);
        drop(lease);
        assert_eq!((a.offset, b.offset), (3, 10));
        keys.release_reserved();
        let c = keys.lease(&[]).take("service-b", 0, Family::V6, 1);
        assert_eq!(c.offset, 18);
    }

    #[test]
    fn an_adopted_block_goes_back_to_its_chain_while_it_fits() {
        let mut keys = EndpointKeys::new();
        let map = SharedSet::endpoints(Family::V4, shard_of("service-c"));
        keys.reserve(map, 40..43);
        keys.adopt("service-c", 0, map, 40, 3);
        let mut lease = keys.lease(&[]);
        let block = lease.take("service-c", 0, Family::V4, 4);
        assert_eq!(
            (block.offset, block.class),
            (40, 2),
            "3 keys rounded up to 4 fit 4"
        );
        // Another chain never gets a key of the block, not even the fourth, unused now.
        let others: Vec<u32> = (0..)
            .map(|i| format!("service-e{i}"))
            .filter(|name| shard_of(name) == map.shard)
            .take(50)
            .map(|name| lease.take(&name, 0, Family::V4, 1).offset)
            .collect();
        assert!(others.iter().all(|k| !(40..44).contains(k)), "{others:?}");
        assert!(others.contains(&39) && others.contains(&44), "{others:?}");
        drop(lease);
        let mut keys = EndpointKeys::new();
        keys.reserve(map, 40..43);
        keys.adopt("service-c", 0, map, 40, 3);
        let grown = keys.lease(&[]).take("service-c", 0, Family::V4, 5);
        assert!(!(40..44).contains(&grown.offset), "{grown:?}");
    }

    #[test]
    fn the_end_of_the_key_space_wraps_around() {
        let mut space = KeySpace {
            next: u32::MAX - 1,
            reserved: vec![(3, 3), (u32::MAX, u32::MAX)],
            ..KeySpace::default()
        };
        assert_eq!(space.allocate(2), 4);
    }

    #[test]
    fn reserved_keys_are_kept_as_merged_ranges() {
        let keys = [7, 3, 4, 5, 9, u32::MAX, u32::MAX - 1];
        let mut ranges: Vec<(u32, u32)> = keys.iter().map(|&key| (key, key)).collect();
        // An adopted block over 8…11, and one inside another.
        ranges.extend([(8, 11), (4, 4)]);
        assert_eq!(merged(ranges), [(3, 5), (7, 11), (u32::MAX - 1, u32::MAX)]);
        let mut space = KeySpace {
            reserved: vec![(0, 5), (8, 11)],
            ..KeySpace::default()
        };
        // Two keys fit between the ranges; four do not.
        assert_eq!(space.allocate(1), 6);
        assert_eq!(space.allocate(2), 12);
    }

    #[test]
    fn chains_spread_over_the_shards() {
        let used: std::collections::HashSet<u16> = (0..5000)
            .map(|i| shard_of(&format!("service-{i}")))
            .collect();
        assert!(used.len() > usize::from(SHARDS) * 9 / 10, "{}", used.len());
    }
}
