//! This node's pods, by the addresses they send from: DNS tells who asks by them (autopath).
//!
//! Only the node's own pods are here (the watch asks for `spec.nodeName`), about a hundred,
//! each keyed by a hash of its namespace and name: no pod name is kept.

use crate::intern::Interner;
use crate::model::LocalPod;
use crate::policy::store::unseen;
use crate::reverse::ReverseIndex;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

#[derive(Default)]
pub(super) struct LocalPods {
    pods: HashMap<u64, LocalPod>,
    by_ip: ReverseIndex<u64>,
}

impl LocalPods {
    pub(super) fn len(&self) -> usize {
        self.pods.len()
    }

    /// Stores `pod` under `key`, replacing the one before; whether that changed anything.
    pub(super) fn put(&mut self, key: u64, pod: LocalPod, strings: &mut Interner) -> bool {
        if self.pods.get(&key) == Some(&pod) {
            pod.release(strings);
            return false;
        }
        for &ip in &pod.ips {
            self.by_ip.add(ip, key);
        }
        if let Some(old) = self.pods.insert(key, pod) {
            self.unindex(key, &old);
            old.release(strings);
        }
        true
    }

    /// Whether there was a pod to remove.
    pub(super) fn remove(&mut self, key: u64, strings: &mut Interner) -> bool {
        let Some(old) = self.pods.remove(&key) else {
            return false;
        };
        self.unindex(key, &old);
        old.release(strings);
        true
    }

    /// Drops the addresses `old` had and the pod now under `key` has not.
    fn unindex(&mut self, key: u64, old: &LocalPod) {
        let kept = self.pods.get(&key).map_or(&[][..], |pod| &pod.ips[..]);
        for ip in old.ips.iter().filter(|ip| !kept.contains(ip)) {
            self.by_ip.remove(*ip, key);
        }
    }

    /// Removes every pod whose key is not in `seen` (a relist that did not deliver it);
    /// whether there was one.
    pub(super) fn retain(&mut self, seen: &HashSet<u64>, strings: &mut Interner) -> bool {
        let stale = unseen(&self.pods, seen);
        for &key in &stale {
            self.remove(key, strings);
        }
        !stale.is_empty()
    }

    /// The pod that sends from `ip`. While an address passes from an ended pod to a new
    /// one both may hold it: then only if they agree on what DNS reads.
    pub(super) fn at(&self, ip: IpAddr) -> Option<&LocalPod> {
        let mut owners = self.by_ip.owners(ip).filter_map(|key| self.pods.get(&key));
        let first = owners.next()?;
        owners
            .all(|other| {
                other.namespace == first.namespace && other.cluster_search == first.cluster_search
            })
            .then_some(first)
    }
}
