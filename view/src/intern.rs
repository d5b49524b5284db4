//! Reference-counted string interning.
//!
//! Namespaces, service names, port names, node names and zones repeat across thousands of
//! objects. The view stores each distinct string once and refers to it by a 4-byte [`Sym`].
//! Entries are counted, so a name that leaves the cluster also leaves memory: churn does not
//! grow the table (the reason `lasso`-style append-only interners do not fit here).

use hashbrown::HashTable;
use std::hash::{BuildHasher, RandomState};

/// A handle to an interned string. `Sym::EMPTY` is the empty string and is never freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(u32);

impl Sym {
    pub const EMPTY: Sym = Sym(0);

    pub fn is_empty(self) -> bool {
        self == Sym::EMPTY
    }

    /// Its slot in the table, below [`Interner::slots`].
    pub(crate) fn slot(self) -> usize {
        self.0 as usize
    }
}

struct Slot {
    text: Box<str>,
    refs: u32,
}

/// The string table. Every `Sym` held by the model owns one reference, taken by
/// [`Interner::intern`] and given back by [`Interner::release`].
///
/// Each string is stored once, in its slot; the index holds only slot numbers and finds
/// strings by hashing the slot's text.
pub struct Interner {
    index: HashTable<u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    hasher: RandomState,
}

impl Default for Interner {
    fn default() -> Self {
        Self::new()
    }
}

impl Interner {
    pub fn new() -> Self {
        Interner {
            index: HashTable::new(),
            slots: vec![Slot {
                text: Box::default(),
                refs: 0,
            }],
            free: Vec::new(),
            hasher: RandomState::new(),
        }
    }

    fn find(&self, text: &str) -> Option<Sym> {
        let hash = self.hasher.hash_one(text);
        self.index
            .find(hash, |&i| *self.slots[i as usize].text == *text)
            .map(|&i| Sym(i))
    }

    /// Returns the handle for `text`, taking one reference.
    pub fn intern(&mut self, text: &str) -> Sym {
        if text.is_empty() {
            return Sym::EMPTY;
        }
        if let Some(sym) = self.find(text) {
            self.slots[sym.0 as usize].refs += 1;
            return sym;
        }
        let slot = Slot {
            text: text.into(),
            refs: 1,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 distinct strings");
                self.slots.push(slot);
                i
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(hasher.hash_one(text), i, |&j| {
            hasher.hash_one(&*slots[j as usize].text)
        });
        Sym(i)
    }

    /// Takes one more reference on a handle the caller already holds.
    pub fn retain(&mut self, sym: Sym) -> Sym {
        if !sym.is_empty() {
            self.slots[sym.0 as usize].refs += 1;
        }
        sym
    }

    /// Gives one reference back; the string is freed with its last reference.
    pub fn release(&mut self, sym: Sym) {
        if sym.is_empty() {
            return;
        }
        let slot = &mut self.slots[sym.0 as usize];
        debug_assert!(slot.refs > 0, "released a dead symbol");
        slot.refs -= 1;
        if slot.refs == 0 {
            let text = std::mem::take(&mut slot.text);
            let hash = self.hasher.hash_one(&*text);
            if let Ok(entry) = self.index.find_entry(hash, |&i| i == sym.0) {
                entry.remove();
            }
            self.free.push(sym.0);
        }
    }

    /// Looks a string up without taking a reference.
    pub fn lookup(&self, text: &str) -> Option<Sym> {
        if text.is_empty() {
            return Some(Sym::EMPTY);
        }
        self.find(text)
    }

    pub fn resolve(&self, sym: Sym) -> &str {
        &self.slots[sym.0 as usize].text
    }

    /// Slots of the table, live or free: every [`Sym`] indexes below it.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Distinct live strings, for metrics and memory tests.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_shares_and_frees() {
        let mut strings = Interner::new();
        let a = strings.intern("default");
        let b = strings.intern("default");
        assert_eq!(a, b);
        assert_eq!(strings.resolve(a), "default");
        strings.release(a);
        assert_eq!(strings.lookup("default"), Some(b));
        strings.release(b);
        assert_eq!(strings.lookup("default"), None);
        assert!(strings.is_empty());
        let c = strings.intern("kube-system");
        assert_eq!(c, a, "a freed slot is reused");
    }

    #[test]
    fn empty_string_is_free() {
        let mut strings = Interner::new();
        assert_eq!(strings.intern(""), Sym::EMPTY);
        strings.release(Sym::EMPTY);
        assert_eq!(strings.resolve(Sym::EMPTY), "");
    }
}
