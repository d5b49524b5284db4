//! [`Footprints`]: every service's footprint in one arena, found through a table of
//! offsets (10,000 boxes would each cost their allocation's rounding, and a map of keys
//! to spans 17 bytes a slot).

use hashbrown::HashTable;
use integer_encoding::VarInt;

use super::footprint::Footprint;

/// Every service's footprint, by [`super::footprint::service_key`], in one arena. Each
/// record there is its key, its length as a varint and its bytes; the index holds where
/// each record starts, found by the key it holds (the key is already a hash), so that a
/// service costs the index 5 bytes a slot, not the 17 of a map from keys to spans. A
/// footprint replaced or removed leaves its bytes behind until they pass a sixteenth of
/// those still used (and [`PACK_ABOVE`]); the arena is then packed in place. What that
/// costs: a sorted list of the starts, 8 bytes a service, and 0.2–0.3 ms at 10,000
/// services of two ports, once every six hundred changed services or so. What it saves:
/// a quarter, the threshold before, let the arena of a two-port cluster grow by 275 KiB
/// in a churn.
#[derive(Debug, Default)]
pub struct Footprints {
    index: HashTable<u32>,
    arena: Vec<u8>,
    /// Bytes of `arena` that no record covers any more.
    garbage: usize,
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

/// The key of the record at `start`.
fn key_at(arena: &[u8], start: u32) -> u64 {
    let start = start as usize;
    arena
        .get(start..start + 8)
        .and_then(|bytes| bytes.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// The record at `start`: its footprint's place in the arena, and where the record ends.
fn record_at(arena: &[u8], start: u32) -> (std::ops::Range<usize>, usize) {
    let head = start as usize + 8;
    let (len, varint) = arena
        .get(head..)
        .and_then(u32::decode_var)
        .unwrap_or_default();
    let body = head + varint;
    let end = (body + len as usize).min(arena.len());
    (body.min(end)..end, end)
}

impl Footprints {
    pub fn get(&self, key: u64) -> Option<Footprint<'_>> {
        self.find(key).map(|start| self.at(start))
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = Footprint<'_>> {
        self.index.iter().map(|start| self.at(*start))
    }

    /// Heap bytes held: the index and the arena.
    pub fn heap_bytes(&self) -> usize {
        self.index.allocation_size() + self.arena.capacity()
    }

    /// Keeps `footprint` (made by [`Footprint::encode`]) for the service `key`, in place of
    /// the one it had.
    pub fn insert(&mut self, key: u64, footprint: &[u8]) -> Result<(), RecordsFull> {
        self.remove(key);
        let start = u32::try_from(self.arena.len()).map_err(|_| RecordsFull)?;
        let len = u32::try_from(footprint.len()).map_err(|_| RecordsFull)?;
        let mut head = [0; 13];
        head[..8].copy_from_slice(&key.to_ne_bytes());
        let head_len = 8 + len.encode_var(&mut head[8..]);
        let record = head_len + footprint.len();
        u32::try_from(record)
            .ok()
            .and_then(|record| start.checked_add(record))
            .ok_or(RecordsFull)?;
        if self.arena.capacity() - self.arena.len() < record {
            // Grown by an eighth, not doubled: a doubled arena would hold up to twice the
            // records, and the part written before a packing stays resident.
            let step = (self.arena.len() / 8).max(ARENA_STEP);
            self.arena.reserve_exact(step.max(record));
        }
        self.arena.extend_from_slice(&head[..head_len]);
        self.arena.extend_from_slice(footprint);
        let arena = &self.arena;
        self.index
            .insert_unique(key, start, |start| key_at(arena, *start));
        Ok(())
    }

    pub fn remove(&mut self, key: u64) {
        let arena = &self.arena;
        let Ok(entry) = self
            .index
            .find_entry(key, |start| key_at(arena, *start) == key)
        else {
            return;
        };
        let (start, _) = entry.remove();
        let (_, end) = record_at(&self.arena, start);
        self.garbage += end - start as usize;
        let used = self.arena.len() - self.garbage;
        if self.garbage > PACK_ABOVE && self.garbage * 16 > used {
            self.pack();
        }
    }

    /// Forgets every footprint, and gives the arena back: the records about to be made
    /// again may take less.
    pub fn clear(&mut self) {
        self.index = HashTable::new();
        self.arena = Vec::new();
        self.garbage = 0;
    }

    fn find(&self, key: u64) -> Option<u32> {
        self.index
            .find(key, |start| key_at(&self.arena, *start) == key)
            .copied()
    }

    fn at(&self, start: u32) -> Footprint<'_> {
        let (body, _) = record_at(&self.arena, start);
        Footprint(self.arena.get(body).unwrap_or_default())
    }

    /// Moves every record down over the garbage, in arena order.
    fn pack(&mut self) {
        let mut starts: Vec<&mut u32> = self.index.iter_mut().collect();
        starts.sort_unstable_by_key(|start| **start);
        let mut end = 0;
        for start in starts {
            let (_, record_end) = record_at(&self.arena, *start);
            let from = *start as usize;
            self.arena.copy_within(from..record_end, end);
            // Below the old start, which fit in 32 bits.
            *start = end as u32;
            end += record_end - from;
        }
        self.arena.truncate(end);
        // The packed tail was written: keep an eighth of it for the records that follow,
        // and give the rest back.
        self.arena
            .shrink_to(self.arena.len() + self.arena.len() / 8);
        self.garbage = 0;
    }
}
