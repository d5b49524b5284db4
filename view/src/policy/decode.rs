//! Pods, Namespaces and NetworkPolicies from the wire into the policy model. A policy is
//! taken whole or refused whole with the reason: an invalid CIDR, port or selector skips
//! that policy alone (the API server validates them, so this is a server that lies).

use super::{
    LabelSet, NamedPort, NetworkPolicy, Operator, Peer, PolicyPod, PolicyRule, PortMatch, PortRef,
    Requirement, Selector, SharedLabels,
};
use crate::InvalidObject;
use crate::decode::{invalid, parse_port, parse_protocol, pod_ips};
use crate::intern::{Interner, Sym};
use crate::model::Cidr;
use crate::ranges::block_ranges;
use crate::wire;

/// Strings interned for one object, given back if the object turns out invalid.
struct Taker<'a> {
    strings: &'a mut Interner,
    taken: Vec<Sym>,
}

impl<'a> Taker<'a> {
    fn new(strings: &'a mut Interner) -> Taker<'a> {
        Taker {
            strings,
            taken: Vec::new(),
        }
    }

    fn intern(&mut self, text: &str) -> Sym {
        let sym = self.strings.intern(text);
        self.taken.push(sym);
        sym
    }

    /// `result`, or its error after every string taken is given back.
    fn finish<T>(self, result: Result<T, String>) -> Result<T, String> {
        if result.is_err() {
            for sym in self.taken {
                self.strings.release(sym);
            }
        }
        result
    }

    /// `labels` interned, sorted by key.
    fn labels<'l>(
        &mut self,
        labels: impl IntoIterator<Item = (&'l String, &'l String)>,
    ) -> LabelSet {
        let mut set: Vec<(Sym, Sym)> = labels
            .into_iter()
            .map(|(key, value)| (self.intern(key), self.intern(value)))
            .collect();
        set.sort_unstable_by_key(|(key, _)| *key);
        set.into()
    }

    /// An object's labels; `None` when it has more than nodus keeps.
    fn label_map(&mut self, labels: &wire::LabelMap) -> Option<LabelSet> {
        let entries = labels.entries.iter().map(|(k, v)| (k, v));
        (!labels.overflow).then(|| self.labels(entries))
    }

    fn selector(&mut self, field: &str, wire: &wire::LabelSelector) -> Result<Selector, String> {
        let labels = self.labels(&wire.match_labels);
        let mut requirements = Vec::with_capacity(wire.match_expressions.len());
        for (i, r) in wire.match_expressions.iter().enumerate() {
            let field = format!("{field}.matchExpressions[{i}]");
            let operator = match r.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(format!("{field}: unknown operator {other:?}")),
            };
            let takes_values = matches!(operator, Operator::In | Operator::NotIn);
            if takes_values == r.values.is_empty() {
                return Err(format!(
                    "{field}: {} takes {} values",
                    r.operator,
                    if takes_values { "one or more" } else { "no" }
                ));
            }
            requirements.push(Requirement {
                key: self.intern(&r.key),
                operator,
                values: r.values.iter().map(|v| self.intern(v)).collect(),
            });
        }
        Ok(Selector {
            labels,
            requirements: requirements.into(),
        })
    }

    fn peer(&mut self, field: &str, wire: &wire::PolicyPeer) -> Result<Peer, String> {
        match (&wire.ip_block, &wire.pod_selector, &wire.namespace_selector) {
            (Some(block), None, None) => {
                let cidr: Cidr = block
                    .cidr
                    .parse()
                    .map_err(|e| format!("{field}.ipBlock.cidr: {e}"))?;
                let mut except = Vec::with_capacity(block.except.len());
                for text in &block.except {
                    let hole: Cidr = text
                        .parse()
                        .map_err(|e| format!("{field}.ipBlock.except: {e}"))?;
                    if !cidr.contains_cidr(&hole) {
                        return Err(format!(
                            "{field}.ipBlock.except: {text} is not inside {}",
                            block.cidr
                        ));
                    }
                    except.push(hole);
                }
                Ok(Peer::Block(block_ranges(cidr, &except).into()))
            }
            (Some(_), _, _) => Err(format!(
                "{field}: ipBlock cannot go with podSelector or namespaceSelector"
            )),
            (None, None, None) => Err(format!("{field}: names no peer")),
            (None, pods, namespaces) => Ok(Peer::Pods {
                pods: match pods {
                    Some(pods) => self.selector(&format!("{field}.podSelector"), pods)?,
                    None => Selector::default(),
                },
                namespaces: match namespaces {
                    Some(ns) => Some(self.selector(&format!("{field}.namespaceSelector"), ns)?),
                    None => None,
                },
            }),
        }
    }

    fn port(&mut self, field: &str, wire: &wire::PolicyPort) -> Result<PortMatch, String> {
        let protocol = parse_protocol(&format!("{field}.protocol"), wire.protocol.as_deref())?;
        let port = match (&wire.port, wire.end_port) {
            (None, None) => PortRef::All,
            (Some(wire::IntOrString::Int(port)), end) => {
                let start = parse_port(&format!("{field}.port"), *port)?;
                let end = match end {
                    Some(end) => parse_port(&format!("{field}.endPort"), end)?,
                    None => start,
                };
                if end < start {
                    return Err(format!("{field}.endPort: {end} is below port {start}"));
                }
                PortRef::Range(start, end)
            }
            (Some(wire::IntOrString::String(name)), None) => {
                if !is_port_name(name) {
                    return Err(format!("{field}.port: {name:?} is not a port name"));
                }
                PortRef::Named(self.intern(name))
            }
            (_, Some(_)) => return Err(format!("{field}.endPort: needs a numeric port")),
        };
        Ok(PortMatch { protocol, port })
    }

    fn rule(
        &mut self,
        field: &str,
        peers: &[wire::PolicyPeer],
        ports: &[wire::PolicyPort],
    ) -> Result<PolicyRule, String> {
        let peers = peers
            .iter()
            .enumerate()
            .map(|(i, peer)| self.peer(&format!("{field}.peers[{i}]"), peer))
            .collect::<Result<Vec<_>, _>>()?;
        let ports = ports
            .iter()
            .enumerate()
            .map(|(i, port)| self.port(&format!("{field}.ports[{i}]"), port))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PolicyRule {
            peers: peers.into(),
            ports: ports.into(),
        })
    }

    /// The rules of one direction, each as its peers and ports.
    fn rules<'w>(
        &mut self,
        field: &str,
        rules: impl Iterator<Item = (&'w [wire::PolicyPeer], &'w [wire::PolicyPort])>,
    ) -> Result<Box<[PolicyRule]>, String> {
        rules
            .enumerate()
            .map(|(i, (peers, ports))| self.rule(&format!("{field}[{i}]"), peers, ports))
            .collect()
    }

    fn policy(&mut self, wire: &wire::NetworkPolicy) -> Result<NetworkPolicy, String> {
        let spec = &wire.spec;
        let mut types = (false, false);
        for kind in &spec.policy_types {
            match kind.as_str() {
                "Ingress" => types.0 = true,
                "Egress" => types.1 = true,
                other => return Err(format!("spec.policyTypes: unknown type {other:?}")),
            }
        }
        if spec.policy_types.is_empty() {
            types = (true, spec.egress.is_some());
        }
        let ingress = if types.0 {
            let rules = spec.ingress.iter().flatten();
            Some(self.rules("spec.ingress", rules.map(|r| (&r.from[..], &r.ports[..])))?)
        } else {
            None
        };
        let egress = if types.1 {
            let rules = spec.egress.iter().flatten();
            Some(self.rules("spec.egress", rules.map(|r| (&r.to[..], &r.ports[..])))?)
        } else {
            None
        };
        Ok(NetworkPolicy {
            namespace: self.intern(wire.metadata.namespace.as_deref().unwrap_or_default()),
            name: self.intern(&wire.metadata.name),
            pods: self.selector("spec.podSelector", &spec.pod_selector)?,
            ingress,
            egress,
        })
    }

    fn pod(&mut self, wire: &wire::Pod, node_name: &str) -> Result<PolicyPod, String> {
        let ips = pod_ips(wire)?;
        let local = !node_name.is_empty() && wire.spec.node_name.as_deref() == Some(node_name);
        let labels = self
            .label_map(&wire.metadata.labels)
            .map(SharedLabels::from);
        let mut ports = Vec::new();
        for container in wire.spec.serving_containers() {
            for port in &container.ports {
                let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) else {
                    continue;
                };
                let field = "spec.containers.ports";
                ports.push(NamedPort {
                    name: self.intern(name),
                    protocol: parse_protocol(field, port.protocol.as_deref())?,
                    port: parse_port(field, port.container_port)?,
                });
            }
        }
        Ok(PolicyPod {
            namespace: self.intern(wire.metadata.namespace.as_deref().unwrap_or_default()),
            ips,
            labels,
            ports: ports.into(),
            local,
        })
    }
}

/// An IANA service name, as a container port's name must be.
fn is_port_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
}

pub fn network_policy(
    wire: &wire::NetworkPolicy,
    strings: &mut Interner,
) -> Result<NetworkPolicy, InvalidObject> {
    let mut taker = Taker::new(strings);
    let policy = taker.policy(wire);
    taker
        .finish(policy)
        .map_err(|reason| invalid("NetworkPolicy", &wire.metadata, reason))
}

/// Any Pod of the cluster, as policies see it, for node `node_name`.
pub fn pod(
    wire: &wire::Pod,
    node_name: &str,
    strings: &mut Interner,
) -> Result<PolicyPod, InvalidObject> {
    let mut taker = Taker::new(strings);
    let pod = taker.pod(wire, node_name);
    taker
        .finish(pod)
        .map_err(|reason| invalid("Pod", &wire.metadata, reason))
}

/// A Namespace's labels; `None` when it has more than nodus keeps.
pub fn namespace(wire: &wire::Namespace, strings: &mut Interner) -> Option<LabelSet> {
    Taker::new(strings).label_map(&wire.metadata.labels)
}

/// Why an object with more labels than nodus keeps fails closed, to report it.
pub fn over_label_cap(kind: &'static str, meta: &wire::Meta<wire::LabelMap>) -> InvalidObject {
    let consequence = match kind {
        "Pod" => "every NetworkPolicy of its namespace isolates it with nothing allowed",
        _ => "its pods are in no namespace a NetworkPolicy selects",
    };
    let reason = format!(
        "metadata.labels: more than {} labels or {} KiB, more than nodus keeps; \
         no selector but the empty one matches it and {consequence}",
        wire::LABELS_MAX,
        wire::LABEL_BYTES_MAX / 1024
    );
    invalid(kind, meta, reason)
}
