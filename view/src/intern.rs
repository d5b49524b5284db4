//! Reference-counted string interning.
//!
//! Namespaces, service names, port names, node names and zones repeat across thousands of
//! objects. The view stores each distinct string once and refers to it by a 4-byte [`Sym`].
//! Entries are counted, so a name that leaves the cluster also leaves memory: churn does not
//! grow the table (the reason `lasso`-style append-only interners do not fit here).

use std::collections::HashMap;
use std::sync::Arc;

/// A handle to an interned string. `Sym::EMPTY` is the empty string and is never freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(u32);

impl Sym {
    pub const EMPTY: Sym = Sym(0);

    pub fn is_empty(self) -> bool {
        self == Sym::EMPTY
    }
}

struct Slot {
    text: Arc<str>,
    refs: u32,
}

/// The string table. Every `Sym` held by the model owns one reference, taken by
/// [`Interner::intern`] and given back by [`Interner::release`].
pub struct Interner {
    index: HashMap<Arc<str>, Sym>,
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl Default for Interner {
    fn default() -> Self {
        Self::new()
    }
}

impl Interner {
    pub fn new() -> Self {
        let empty: Arc<str> = Arc::from("");
        Interner {
            index: HashMap::new(),
            slots: vec![Slot { text: empty, refs: 0 }],
            free: Vec::new(),
        }
    }

    /// Returns the handle for `text`, taking one reference.
    pub fn intern(&mut self, text: &str) -> Sym {
        if text.is_empty() {
            return Sym::EMPTY;
        }
        if let Some(&sym) = self.index.get(text) {
            self.slots[sym.0 as usize].refs += 1;
            return sym;
        }
        let text: Arc<str> = Arc::from(text);
        let slot = Slot { text: text.clone(), refs: 1 };
        let sym = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                Sym(i)
            }
            None => {
                let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 distinct strings");
                self.slots.push(slot);
                Sym(i)
            }
        };
        self.index.insert(text, sym);
        sym
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
            let text = std::mem::replace(&mut slot.text, Arc::from(""));
            self.index.remove(&*text);
            self.free.push(sym.0);
        }
    }

    /// Looks a string up without taking a reference.
    pub fn lookup(&self, text: &str) -> Option<Sym> {
        if text.is_empty() {
            return Some(Sym::EMPTY);
        }
        self.index.get(text).copied()
    }

    pub fn resolve(&self, sym: Sym) -> &str {
        &self.slots[sym.0 as usize].text
    }

    /// Distinct live strings, for metrics and memory tests.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Frees the spare capacity that churn left behind.
    pub fn shrink_to_fit(&mut self) {
        self.index.shrink_to_fit();
        self.free.shrink_to_fit();
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
