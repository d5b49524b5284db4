//! Which Service each EndpointSlice belongs to, by the slice's namespace and name hash: a
//! deleted slice arrives with its name only, and a slice relabelled to another Service
//! must leave the first.
//!
//! One slot is 16 bytes: the name hash, the namespace and the owner side by side. A map
//! from a `(namespace, hash)` key to the owner takes 24, since the key's padding cannot
//! hold the value: at 50,000 slices that is half a MiB.

use crate::intern::Sym;
use hashbrown::HashTable;
use std::hash::{BuildHasher, RandomState};

/// A slice, as the view finds it again: the hash of its name within its namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SliceKey {
    pub(super) namespace: Sym,
    pub(super) name_hash: u64,
}

#[derive(Clone, Copy)]
struct Slot {
    name_hash: u64,
    namespace: Sym,
    owner: Sym,
}

impl Slot {
    fn key(&self) -> SliceKey {
        SliceKey {
            namespace: self.namespace,
            name_hash: self.name_hash,
        }
    }
}

fn hash_of(hasher: &RandomState, key: SliceKey) -> u64 {
    hasher.hash_one((key.namespace, key.name_hash))
}

#[derive(Default)]
pub(super) struct SliceOwners {
    table: HashTable<Slot>,
    hasher: RandomState,
}

impl SliceOwners {
    fn hash(&self, key: SliceKey) -> u64 {
        hash_of(&self.hasher, key)
    }

    /// The name of the Service that owns the slice `key`.
    pub(super) fn get(&self, key: SliceKey) -> Option<Sym> {
        self.table
            .find(self.hash(key), |slot| slot.key() == key)
            .map(|slot| slot.owner)
    }

    /// Records `owner` for `key`, in place of the owner it had.
    pub(super) fn insert(&mut self, key: SliceKey, owner: Sym) {
        let hash = self.hash(key);
        let hasher = &self.hasher;
        let slot = Slot {
            name_hash: key.name_hash,
            namespace: key.namespace,
            owner,
        };
        *self
            .table
            .entry(
                hash,
                |held| held.key() == key,
                |held| hash_of(hasher, held.key()),
            )
            .or_insert(slot)
            .into_mut() = slot;
    }

    /// Forgets `key`; the owner it had.
    pub(super) fn remove(&mut self, key: SliceKey) -> Option<Sym> {
        let hash = self.hash(key);
        let held = self.table.find_entry(hash, |slot| slot.key() == key).ok()?;
        Some(held.remove().0.owner)
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = SliceKey> + '_ {
        self.table.iter().map(Slot::key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intern::Interner;

    #[test]
    fn owners_are_found_replaced_and_removed() {
        let mut strings = Interner::new();
        let (ns, other_ns) = (strings.intern("default"), strings.intern("other"));
        let (web, api) = (strings.intern("web"), strings.intern("api"));
        let key = SliceKey {
            namespace: ns,
            name_hash: 7,
        };
        // The same name in another namespace is another slice.
        let elsewhere = SliceKey {
            namespace: other_ns,
            ..key
        };
        let mut owners = SliceOwners::default();
        owners.insert(key, web);
        owners.insert(elsewhere, api);
        assert_eq!(owners.get(key), Some(web));
        owners.insert(key, api);
        assert_eq!(owners.get(key), Some(api));
        assert_eq!(owners.keys().count(), 2);
        assert_eq!(owners.remove(key), Some(api));
        assert_eq!(owners.remove(key), None);
        assert_eq!(owners.get(elsewhere), Some(api));
        assert_eq!(size_of::<Slot>(), 16);
    }
}
