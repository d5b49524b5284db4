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
//! is already programmed: a block's size is N rounded up to a power of two, and a service
//! keeps its block while N fits, so only changed elements are rewritten. A block whose
//! service went or outgrew it is reused by the next chain that needs a block of its size. A full sync starts over; it avoids every key the table already holds, so
//! services of a previous run keep working until their turn comes, and the keys it did not
//! claim are removed at its end.

use std::collections::HashMap;

use nodus_view::model::Family;

use super::objects::SharedSet;

/// Endpoint maps per IP family.
pub const SHARDS: u8 = 128;

/// A block of keys one chain took in one endpoint map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyBlock {
    pub map: SharedSet,
    pub offset: u32,
    /// log2 of the block's size.
    pub class: u8,
}

/// The keys of one endpoint map.
#[derive(Debug, Default)]
struct KeySpace {
    /// Never allocated at or above this, except from `free`.
    next: u32,
    /// Released blocks by class.
    free: HashMap<u8, Vec<u32>>,
    /// Keys present in the table before the current full sync, sorted.
    reserved: Vec<u32>,
}

impl KeySpace {
    fn allocate(&mut self, class: u8) -> u32 {
        if let Some(offset) = self.free.get_mut(&class).and_then(Vec::pop) {
            return offset;
        }
        let size = 1u32 << class;
        let mut offset = self.next;
        // Skip the blocks that hold a previous run's keys.
        loop {
            let first_reserved = self.reserved.partition_point(|key| *key < offset);
            match self.reserved.get(first_reserved) {
                Some(key) if u64::from(*key) < u64::from(offset) + u64::from(size) => {
                    offset = key.saturating_add(1);
                }
                _ => break,
            }
        }
        // 2³² keys per map against at most a few hundred thousand live ones: `next` grows
        // only with the peak of live blocks, and released ones are reused.
        self.next = offset.saturating_add(size);
        offset
    }
}

/// The allocator of key blocks, kept by the applier from sync to sync.
#[derive(Debug, Default)]
pub struct EndpointKeys {
    spaces: HashMap<SharedSet, KeySpace>,
}

impl EndpointKeys {
    pub fn new() -> EndpointKeys {
        EndpointKeys::default()
    }

    /// Marks `keys` of `map` as taken by a previous run, until [`EndpointKeys::release_reserved`].
    pub fn reserve(&mut self, map: SharedSet, keys: impl IntoIterator<Item = u32>) {
        let space = self.spaces.entry(map).or_default();
        space.reserved.extend(keys);
        space.reserved.sort_unstable();
        space.reserved.dedup();
    }

    /// Forgets the reserved keys once the previous run's elements are gone.
    pub fn release_reserved(&mut self) {
        for space in self.spaces.values_mut() {
            space.reserved = Vec::new();
        }
    }

    /// Blocks for one service's plan, reusing `previous` (what the service held) where
    /// the sizes still fit; what it does not reuse is released when the lease is dropped.
    pub fn lease(&mut self, previous: &[KeyBlock]) -> KeyLease<'_> {
        KeyLease {
            keys: self,
            previous: previous.to_vec(),
        }
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
    /// A block of at least `len` keys in the endpoint map of `chain` (by its name).
    pub fn take(&mut self, chain: &str, family: Family, len: u32) -> KeyBlock {
        let map = SharedSet::endpoints(family, shard_of(chain));
        let class = u8::try_from(len.max(1).next_power_of_two().trailing_zeros()).unwrap_or(31);
        // A block that still fits is kept, even when it is larger than needed now: keys
        // cost nothing, and a service that scales down and up again keeps them.
        if let Some(index) = self
            .previous
            .iter()
            .position(|block| block.map == map && block.class >= class)
        {
            return self.previous.swap_remove(index);
        }
        let offset = self.keys.spaces.entry(map).or_default().allocate(class);
        KeyBlock { map, offset, class }
    }
}

impl Drop for KeyLease<'_> {
    fn drop(&mut self) {
        for block in self.previous.drain(..) {
            self.keys.release(block);
        }
    }
}

/// The shard of a chain: FNV-1a of its name, so it never changes between builds.
pub(crate) fn shard_of(chain: &str) -> u8 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    let hash = chain.bytes().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(PRIME)
    });
    (hash % u32::from(SHARDS)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_reused_while_their_size_fits_and_released_when_not() {
        let mut keys = EndpointKeys::new();
        let first = keys.lease(&[]).take("service-a", Family::V4, 3);
        assert_eq!((first.offset, first.class), (0, 2));
        // Scaling from 3 to 4 endpoints (or down to 1) keeps the block; to 5 it moves.
        assert_eq!(keys.lease(&[first]).take("service-a", Family::V4, 4), first);
        assert_eq!(keys.lease(&[first]).take("service-a", Family::V4, 1), first);
        let grown = keys.lease(&[first]).take("service-a", Family::V4, 5);
        assert_eq!((grown.offset, grown.class), (4, 3));
        // The released block goes to the next chain of its size in that map.
        let mut lease = keys.lease(&[]);
        let reused = lease.take("service-a", Family::V4, 4);
        assert_eq!(reused.offset, 0);
    }

    #[test]
    fn a_full_sync_allocates_around_the_previous_runs_keys() {
        let mut keys = EndpointKeys::new();
        let map = SharedSet::endpoints(Family::V6, shard_of("service-b"));
        keys.reserve(map, [0, 1, 2, 9, 20]);
        let mut lease = keys.lease(&[]);
        let a = lease.take("service-b", Family::V6, 4);
        let b = lease.take("service-b", Family::V6, 8);
        drop(lease);
        assert_eq!((a.offset, b.offset), (3, 10));
        keys.release_reserved();
        let c = keys.lease(&[]).take("service-b", Family::V6, 1);
        assert_eq!(c.offset, 18);
    }

    #[test]
    fn chains_spread_over_the_shards() {
        let used: std::collections::HashSet<u8> = (0..1000)
            .map(|i| shard_of(&format!("service-{i}")))
            .collect();
        assert!(used.len() > usize::from(SHARDS) * 9 / 10, "{}", used.len());
    }
}
