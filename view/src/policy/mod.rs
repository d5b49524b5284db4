//! NetworkPolicy in the view: the compact stored form of policies, of the Pods they
//! select (every pod of the cluster, as its addresses, namespace, labels and named ports)
//! and of Namespaces (their labels), decoded lean ([`decode`]), kept ([`store`]) and
//! resolved into what each pod of this node may send and receive ([`resolve`]).
//!
//! Every label of every pod is kept, so that a new policy is judged at once on the pods
//! already known, with no new list of them. Label keys and values are interned, so that a
//! selector matches by comparing handles, and each distinct set of a pod's labels is
//! stored once: the pods of one ReplicaSet share theirs.

pub mod decode;
pub mod resolve;
pub mod store;

use crate::intern::{Interner, Sym};
use crate::model::Protocol;
use std::net::IpAddr;
use std::sync::Arc;

/// Labels sorted by key handle, each key once.
pub type LabelSet = Box<[(Sym, Sym)]>;

/// A pod's labels, shared by every pod that has the same ([`store`]'s `LabelSets`).
pub type SharedLabels = Arc<[(Sym, Sym)]>;

fn release_labels(labels: &[(Sym, Sym)], strings: &mut Interner) {
    for (key, value) in labels.iter() {
        strings.release(*key);
        strings.release(*value);
    }
}

fn label(labels: &[(Sym, Sym)], key: Sym) -> Option<Sym> {
    labels
        .binary_search_by_key(&key, |(k, _)| *k)
        .ok()
        .map(|i| labels[i].1)
}

/// A Pod as policies see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyPod {
    pub namespace: Sym,
    /// One per family; none for a host-network pod (policies do not apply to it, and its
    /// address is its node's) or one that has ended.
    pub ips: Box<[IpAddr]>,
    /// `None` when it has more labels than nodus keeps ([`crate::wire::LABELS_MAX`]): no
    /// selector but the empty one matches it, and every policy of its namespace isolates it with nothing
    /// allowed (it fails closed).
    pub labels: Option<SharedLabels>,
    /// Its containers' named ports, which policies may name.
    pub ports: Box<[NamedPort]>,
    /// It runs on this node: the policies that select it are enforced here.
    pub local: bool,
}

impl PolicyPod {
    /// Gives back every string of a pod just decoded, labels included, when it is not
    /// stored after all.
    pub(crate) fn release_decoded(&self, strings: &mut Interner) {
        self.release_but_labels(strings);
        if let Some(labels) = &self.labels {
            release_labels(labels, strings);
        }
    }

    /// Gives back its strings but for its labels, which its owner gives back (decoded
    /// labels to the interner, stored ones to the shared sets).
    pub(crate) fn release_but_labels(&self, strings: &mut Interner) {
        strings.release(self.namespace);
        for port in self.ports.iter() {
            strings.release(port.name);
        }
    }

    /// Whether `selector` matches it; when its labels are not known, only the empty
    /// selector, which matches whatever they are.
    pub(crate) fn matched_by(&self, selector: &Selector) -> bool {
        self.labels
            .as_deref()
            .map_or(selector.is_empty(), |l| selector.matches(l))
    }

    /// The port its container names `name` for `protocol`.
    pub fn named_port(&self, name: Sym, protocol: Protocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.name == name && p.protocol == protocol)
            .map(|p| p.port)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamedPort {
    pub name: Sym,
    pub protocol: Protocol,
    pub port: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: Sym,
    pub operator: Operator,
    pub values: Box<[Sym]>,
}

/// A label selector; the empty one selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    pub labels: LabelSet,
    pub requirements: Box<[Requirement]>,
}

impl Selector {
    /// The empty selector, which selects everything.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &[(Sym, Sym)]) -> bool {
        self.labels
            .iter()
            .all(|(key, value)| label(labels, *key) == Some(*value))
            && self.requirements.iter().all(|r| {
                let value = label(labels, r.key);
                match r.operator {
                    Operator::In => value.is_some_and(|v| r.values.contains(&v)),
                    Operator::NotIn => value.is_none_or(|v| !r.values.contains(&v)),
                    Operator::Exists => value.is_some(),
                    Operator::DoesNotExist => value.is_none(),
                }
            })
    }

    fn release(&self, strings: &mut Interner) {
        release_labels(&self.labels, strings);
        for r in self.requirements.iter() {
            strings.release(r.key);
            for value in r.values.iter() {
                strings.release(*value);
            }
        }
    }
}

/// A NetworkPolicy, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkPolicy {
    pub namespace: Sym,
    /// Named in explanations and metrics only.
    pub name: Sym,
    pub pods: Selector,
    /// `None` when the policy does not govern ingress (its `policyTypes`); an empty list
    /// isolates the pods it selects and allows nothing.
    pub ingress: Option<Box<[PolicyRule]>>,
    pub egress: Option<Box<[PolicyRule]>>,
}

impl NetworkPolicy {
    pub(crate) fn release(&self, strings: &mut Interner) {
        strings.release(self.namespace);
        strings.release(self.name);
        self.pods.release(strings);
        for rule in self
            .ingress
            .iter()
            .chain(&self.egress)
            .flat_map(|r| r.iter())
        {
            rule.release(strings);
        }
    }
}

/// One ingress or egress rule: traffic with any of `peers` (everyone when empty) on any
/// of `ports` (every port when empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRule {
    pub peers: Box<[Peer]>,
    pub ports: Box<[PortMatch]>,
}

impl PolicyRule {
    fn release(&self, strings: &mut Interner) {
        for peer in self.peers.iter() {
            if let Peer::Pods { namespaces, pods } = peer {
                pods.release(strings);
                if let Some(namespaces) = namespaces {
                    namespaces.release(strings);
                }
            }
        }
        for port in self.ports.iter() {
            if let PortRef::Named(name) = port.port {
                strings.release(name);
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Pods matching `pods` in the namespaces matching `namespaces`, or in the policy's
    /// own namespace when `None`.
    Pods {
        namespaces: Option<Selector>,
        pods: Selector,
    },
    /// Addresses, as sorted disjoint inclusive ranges (`ipBlock` less its `except`).
    Block(Box<[(IpAddr, IpAddr)]>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortMatch {
    pub protocol: Protocol,
    pub port: PortRef,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortRef {
    All,
    /// Inclusive.
    Range(u16, u16),
    /// A container port's name, resolved per destination pod.
    Named(Sym),
}
