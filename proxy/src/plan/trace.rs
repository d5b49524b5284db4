//! A packet tracer over the plan: walks the planned ruleset the way the kernel runs it
//! for the first packet of a connection, hook by hook and chain by chain, and says which
//! endpoints the connection can reach, or where it is dropped or rejected, and whether
//! its source is masqueraded. Operators ask it why a connection fails (`nodus proxy
//! trace`); tests ask it about every item of the checklist on many shapes of cluster,
//! as kube-proxy's packet-flow tests do, with the kernel tests as its ground truth.
//!
//! The walk follows netfilter: base chains of a hook in priority order, `accept` ends a
//! base chain and the packet goes on to the next, `drop` and `reject` end the packet,
//! `jump` returns and `goto` does not, a NAT statement accepts. The routing decision
//! between prerouting and input or forward looks at the destination after DNAT: an
//! address of this node is delivered here. A random choice (`numgen`) forks the walk,
//! one path per endpoint. Dynamic sets (affinity) are empty, as for a client not seen
//! before.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use nodus_view::model::{Family, Protocol};

use super::names::protocol_name;
use super::objects::{ChainPlan, ServicePlan, SharedSet, Skeleton};
use super::rule::{
    Addr, LookupKey, RulePlan, Stmt, ip_value, node_port_key, protocol_value, service_key,
};
use crate::nft::{ChainType, Element, ElementData, Hook, Tuple, Value, Verdict};

/// Rules and chain moves one path may take before the walk gives up.
const MAX_STEPS: usize = 100_000;

/// Where a packet enters this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// From a pod on this node (through its veth: prerouting).
    Pod,
    /// From this host or a host-network pod (output).
    Host,
    /// From another machine, through a node interface (prerouting).
    Outside,
}

/// The first packet of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub entry: Entry,
    pub source: IpAddr,
    pub destination: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

/// What becomes of the packet on one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// It passes every chain, to `to` (after any DNAT): delivered on this host when
    /// `here`, else routed on. `masqueraded`: its source became the node's address.
    Passes {
        to: SocketAddr,
        here: bool,
        masqueraded: bool,
    },
    /// Dropped by a rule of `chain`, on its way to `to` (after any DNAT): the client
    /// times out.
    Dropped { chain: String, to: SocketAddr },
    /// Rejected by a rule of `chain`: the client gets ICMP port unreachable.
    Rejected { chain: String },
}

/// A rule the packet matched, and what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub hook: Hook,
    pub chain: String,
    pub rule: String,
    pub effect: String,
}

/// One way through the ruleset: the rules it matched, in order, and its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    pub steps: Vec<Step>,
    pub fate: Fate,
}

/// Every way the packet can go, one per random choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub packet: Packet,
    pub paths: Vec<Path>,
    /// What the ruleset alone cannot say: which NetworkPolicies decided.
    pub notes: Vec<String>,
}

impl Trace {
    /// The outcome in one line, as kube-proxy's packet-flow tests state it: each
    /// destination reached, sorted, with ` masq` when its path masquerades, then `DROP`
    /// and `REJECT` when some path ends so; comma-separated.
    pub fn summary(&self) -> String {
        let mut reached: Vec<String> = Vec::new();
        let mut ends: Vec<&str> = Vec::new();
        for path in &self.paths {
            match &path.fate {
                Fate::Passes {
                    to, masqueraded, ..
                } => reached.push(match masqueraded {
                    true => format!("{to} masq"),
                    false => to.to_string(),
                }),
                Fate::Dropped { .. } => ends.push("DROP"),
                Fate::Rejected { .. } => ends.push("REJECT"),
            }
        }
        reached.sort();
        reached.dedup();
        ends.sort_unstable();
        ends.dedup();
        reached.extend(ends.iter().map(ToString::to_string));
        reached.join(", ")
    }
}

/// The planned ruleset, indexed for lookups by name.
pub struct Ruleset<'p> {
    chains: HashMap<&'p str, &'p ChainPlan>,
    /// The shared chains the plans' ports dispatch through by endpoint count, which no
    /// plan holds ([`crate::plan::SharedSet::dispatch_chain`]).
    dispatch: HashMap<String, ChainPlan>,
    elements: HashMap<String, Vec<&'p Element>>,
    /// Base chains per hook, in priority order.
    hooks: HashMap<Hook, Vec<&'p ChainPlan>>,
    /// This node's own addresses: traffic to them is delivered here, traffic from them
    /// is `fib saddr type local`.
    local: Vec<IpAddr>,
}

impl<'p> Ruleset<'p> {
    pub fn new(
        skeleton: &'p Skeleton,
        services: &'p [ServicePlan],
        local_addresses: Vec<IpAddr>,
    ) -> Ruleset<'p> {
        let chains: Vec<&ChainPlan> = skeleton
            .chains
            .iter()
            .chain(services.iter().flat_map(|plan| &plan.chains))
            .collect();
        let mut elements: HashMap<String, Vec<&Element>> = HashMap::new();
        for set in skeleton
            .sets
            .iter()
            .chain(services.iter().flat_map(|plan| &plan.sets))
        {
            elements
                .entry(set.set.name.clone())
                .or_default()
                .extend(&set.elements);
        }
        for element in services.iter().flat_map(|plan| &plan.elements) {
            elements
                .entry(element.set.name())
                .or_default()
                .push(&element.element);
        }
        let mut hooks: HashMap<Hook, Vec<&ChainPlan>> = HashMap::new();
        for chain in &chains {
            if let Some(base) = &chain.chain.base {
                hooks.entry(base.hook).or_default().push(chain);
            }
        }
        for base_chains in hooks.values_mut() {
            base_chains.sort_by_key(|chain| chain.chain.base.as_ref().map(|base| base.priority));
        }
        let dispatch = services
            .iter()
            .flat_map(ServicePlan::endpoint_maps)
            .filter_map(SharedSet::dispatch_chain)
            .map(|chain| (chain.name().to_string(), chain))
            .collect();
        Ruleset {
            chains: chains.iter().map(|chain| (chain.name(), *chain)).collect(),
            dispatch,
            elements,
            hooks,
            local: local_addresses,
        }
    }

    /// Every way `packet` can go through the ruleset.
    pub fn trace(&self, packet: Packet) -> Trace {
        let first = match packet.entry {
            Entry::Host => Hook::Output,
            Entry::Pod | Entry::Outside => Hook::Prerouting,
        };
        let state = Walk {
            source: packet.source,
            destination: packet.destination,
            port: packet.port,
            original_destination: packet.destination,
            protocol: packet.protocol,
            mark: 0,
            masqueraded: false,
            from_host: packet.entry == Entry::Host,
            from_pod: packet.entry == Entry::Pod,
            looped_back: false,
            hook: first,
            base: 0,
            stack: Vec::new(),
            steps: Vec::new(),
        };
        let mut paths = Vec::new();
        self.run(state, &mut paths);
        Trace {
            packet,
            paths,
            notes: Vec::new(),
        }
    }

    fn run<'s>(&'s self, mut walk: Walk<'s>, paths: &mut Vec<Path>) {
        // The kernel refuses jump loops; a plan with one is a planner bug, and the walk
        // ends rather than spin.
        for _ in 0..MAX_STEPS {
            match self.advance(&mut walk) {
                Advance::On => {}
                Advance::Fork(walks) => {
                    for walk in walks {
                        self.run(walk, paths);
                    }
                    return;
                }
                Advance::End(fate) => {
                    paths.push(Path {
                        steps: walk.steps,
                        fate,
                    });
                    return;
                }
            }
        }
        let to = walk.to();
        paths.push(Path {
            steps: walk.steps,
            fate: Fate::Dropped {
                chain: format!("none: no end after {MAX_STEPS} steps (a loop in the plan)"),
                to,
            },
        });
    }

    /// One rule, or the move to the next base chain or hook.
    fn advance<'s>(&'s self, walk: &mut Walk<'s>) -> Advance<'s> {
        let Some(frame) = walk.stack.last_mut() else {
            return self.next_base_chain(walk);
        };
        let (chain, index) = (frame.chain, frame.rule);
        let Some(rule) = chain.rules.get(index) else {
            // The end of a chain returns; of a base chain, its policy accepts.
            walk.stack.pop();
            if walk.stack.is_empty() {
                walk.base += 1;
            }
            return Advance::On;
        };
        frame.rule += 1;
        match self.evaluate(walk, rule) {
            Outcome::Miss => Advance::On,
            Outcome::Done(effect) => {
                walk.record(chain, rule, effect);
                Advance::On
            }
            Outcome::Verdict(verdict, effect) => {
                walk.record(chain, rule, effect.unwrap_or_else(|| verdict.to_string()));
                self.verdict(walk, chain, verdict)
            }
            Outcome::Nat(effect) => {
                walk.record(chain, rule, effect);
                walk.end_base_chain();
                Advance::On
            }
            Outcome::Reject => {
                walk.record(chain, rule, "reject".to_string());
                Advance::End(Fate::Rejected {
                    chain: chain.name().to_string(),
                })
            }
            Outcome::Fork(choices) => {
                let count = choices.len();
                let forks = choices
                    .into_iter()
                    .enumerate()
                    .map(|(i, choice)| {
                        let mut fork = walk.clone();
                        match choice {
                            Choice::Dnat(to) => {
                                fork.record(
                                    chain,
                                    rule,
                                    format!("dnat to {to} ({} of {count})", i + 1),
                                );
                                fork.destination = to.ip();
                                fork.port = to.port();
                                fork.end_base_chain();
                            }
                            Choice::Goto(target) => {
                                fork.record(
                                    chain,
                                    rule,
                                    format!("goto {target} ({} of {count})", i + 1),
                                );
                                if let Some(target) = self.chain(&target) {
                                    fork.goto(target);
                                }
                            }
                        }
                        fork
                    })
                    .collect();
                Advance::Fork(forks)
            }
        }
    }

    fn verdict<'s>(
        &'s self,
        walk: &mut Walk<'s>,
        chain: &ChainPlan,
        verdict: Verdict,
    ) -> Advance<'s> {
        match verdict {
            Verdict::Accept => walk.end_base_chain(),
            Verdict::Drop => {
                return Advance::End(Fate::Dropped {
                    chain: chain.name().to_string(),
                    to: walk.to(),
                });
            }
            Verdict::Continue | Verdict::Break => {}
            Verdict::Return => {
                walk.stack.pop();
                if walk.stack.is_empty() {
                    walk.base += 1;
                }
            }
            Verdict::Jump(target) | Verdict::Goto(target) if self.chain(&target).is_none() => {
                // The kernel refuses a rule naming a missing chain; a plan that does is a
                // planner bug, reported as the packet's end.
                return Advance::End(Fate::Dropped {
                    chain: format!("{} (no chain {target})", chain.name()),
                    to: walk.to(),
                });
            }
            Verdict::Jump(target) => {
                if let Some(chain) = self.chain(&target) {
                    walk.stack.push(Frame { chain, rule: 0 });
                }
            }
            Verdict::Goto(target) => {
                if let Some(chain) = self.chain(&target) {
                    walk.goto(chain);
                }
            }
        }
        Advance::On
    }

    /// Past the last base chain of a hook: the next hook, or the end.
    fn next_base_chain<'s>(&'s self, walk: &mut Walk<'s>) -> Advance<'s> {
        let chains = self.hooks.get(&walk.hook).map_or(&[][..], Vec::as_slice);
        if let Some(chain) = chains.get(walk.base) {
            let is_nat = chain.chain.base.as_ref().map(|base| base.kind) == Some(ChainType::Nat);
            if is_nat && walk.looped_back {
                // NAT is decided once per connection, on the way out.
                walk.base += 1;
            } else {
                walk.stack.push(Frame { chain, rule: 0 });
            }
            return Advance::On;
        }
        let here = self.is_local(walk.destination);
        let next = match walk.hook {
            Hook::Prerouting if here => Hook::Input,
            Hook::Prerouting => Hook::Forward,
            Hook::Forward | Hook::Output => Hook::Postrouting,
            Hook::Postrouting if here && !walk.looped_back => {
                // Host traffic to this host comes back in through loopback.
                walk.looped_back = true;
                Hook::Prerouting
            }
            Hook::Input | Hook::Postrouting => {
                return Advance::End(Fate::Passes {
                    to: SocketAddr::new(walk.destination, walk.port),
                    here,
                    masqueraded: walk.masqueraded,
                });
            }
        };
        walk.hook = next;
        walk.base = 0;
        Advance::On
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        self.local.contains(&ip) || ip.is_loopback()
    }

    /// The rule's statements in order, until one does not match or one decides.
    #[expect(
        clippy::too_many_lines,
        reason = "an interpreter: one arm per statement"
    )]
    fn evaluate(&self, walk: &mut Walk<'_>, rule: &RulePlan) -> Outcome {
        let mut effect = None;
        for stmt in &rule.0 {
            let matched = match stmt {
                // A traced packet opens a connection.
                Stmt::CtStateNew => true,
                Stmt::CtStateEstablished => false,
                Stmt::PolicyAllowed { family, local, set } => {
                    let (own, peer) = (walk.address(*local), walk.address(local.other()));
                    Family::of(own) == *family
                        && self
                            .find(
                                set,
                                &Tuple(vec![
                                    ip_value(own),
                                    ip_value(peer),
                                    protocol_value(walk.protocol),
                                    Value::InetService(walk.port),
                                ]),
                            )
                            .is_some()
                }
                Stmt::AddrIs { addr, value } => walk.address(*addr) == *value,
                Stmt::AddrInSet {
                    addr,
                    family,
                    set,
                    negated,
                } => {
                    let ip = walk.address(*addr);
                    Family::of(ip) == *family
                        && self.find(set, &Tuple::from(ip_value(ip))).is_some() != *negated
                }
                Stmt::AddrInRanges {
                    addr,
                    family,
                    ranges,
                    negated,
                } => {
                    let ip = walk.address(*addr);
                    Family::of(ip) == *family
                        && ranges.iter().any(|(start, end)| *start <= ip && ip <= *end) != *negated
                }
                // The interfaces a walk knows: a pod's (the detector's names), loopback
                // (host traffic to this host, back in), or another; host traffic on its
                // way out has none.
                Stmt::Iifname { name, negated, .. } => {
                    let arrived_on = match name.as_str() {
                        "lo" => walk.looped_back,
                        _ => walk.from_pod,
                    };
                    arrived_on != *negated
                }
                Stmt::L4Proto(protocol) => walk.protocol == *protocol,
                Stmt::Dport(port) => walk.port == *port,
                Stmt::FibSaddrLocal => walk.from_host || self.is_local(walk.source),
                // A pod's packet comes through its own link, from its own address (the
                // trace does not forge), and is TCP, UDP or SCTP.
                Stmt::IifGroup(_) => walk.from_pod,
                Stmt::SourceNotRoutedBack | Stmt::Icmpv6Type(_) => false,
                Stmt::MarkClear(bits) => walk.mark & bits == 0,
                Stmt::Vmap { key, map } => {
                    let key = match key {
                        LookupKey::DaddrProtoPort(family)
                            if Family::of(walk.destination) == *family =>
                        {
                            service_key(walk.destination, walk.protocol, walk.port)
                        }
                        LookupKey::DaddrProtoPort(_) => return Outcome::Miss,
                        LookupKey::ProtoPort => node_port_key(walk.protocol, walk.port),
                    };
                    return match self
                        .find(map, &key)
                        .and_then(|element| element.data.as_ref())
                    {
                        Some(ElementData::Verdict(verdict)) => {
                            Outcome::Verdict(verdict.clone(), Some(format!("{key} : {verdict}")))
                        }
                        _ => Outcome::Miss,
                    };
                }
                Stmt::MarkOr(bits) => {
                    walk.mark |= bits;
                    effect = Some(format!("mark {:#010x}", walk.mark));
                    true
                }
                Stmt::MarkXor(bits) => {
                    walk.mark ^= bits;
                    effect = Some(format!("mark {:#010x}", walk.mark));
                    true
                }
                Stmt::MarkUnset(bits) => {
                    walk.mark &= !bits;
                    effect = Some(format!("mark {:#010x}", walk.mark));
                    true
                }
                Stmt::Masquerade => {
                    walk.masqueraded = true;
                    return Outcome::Nat("masquerade: the source becomes this node's".into());
                }
                Stmt::Dnat { addr, port } => {
                    let to = SocketAddr::new(*addr, *port);
                    walk.destination = *addr;
                    walk.port = *port;
                    return Outcome::Nat(format!("dnat to {to}"));
                }
                Stmt::DnatFromMap {
                    map,
                    endpoints,
                    offset,
                    ..
                } => {
                    let keys = (*offset..offset.saturating_add(*endpoints))
                        .map(|key| Tuple::from(Value::Integer32(key)));
                    return Outcome::Fork(self.endpoints_in(map, keys));
                }
                Stmt::DnatFromPortMap { map, endpoints, .. } => {
                    let service = service_key(walk.destination, walk.protocol, walk.port);
                    let keys = (0..*endpoints).map(|index| {
                        let mut key = service.clone();
                        key.0.push(Value::Integer32(index));
                        key
                    });
                    return Outcome::Fork(self.endpoints_in(map, keys));
                }
                Stmt::Hairpin { set, .. } => {
                    let key = Tuple(vec![
                        ip_value(walk.source),
                        ip_value(walk.destination),
                        ip_value(walk.original_destination),
                    ]);
                    self.find(set, &key).is_some()
                }
                Stmt::Redirect(port) => {
                    walk.destination = self
                        .local
                        .iter()
                        .copied()
                        .find(|ip| Family::of(*ip) == Family::of(walk.destination))
                        .unwrap_or(walk.destination);
                    walk.port = *port;
                    return Outcome::Nat(format!("redirect to this host's port {port}"));
                }
                Stmt::Reject => return Outcome::Reject,
                Stmt::RandomGoto(chains) => {
                    return Outcome::Fork(chains.iter().cloned().map(Choice::Goto).collect());
                }
                Stmt::RememberSource { set, .. } => {
                    effect = Some(format!("{} remembered in @{set}", walk.source));
                    true
                }
                Stmt::Verdict(verdict) => return Outcome::Verdict(verdict.clone(), None),
            };
            if !matched {
                return Outcome::Miss;
            }
        }
        Outcome::Done(effect.unwrap_or_else(|| "matched".into()))
    }

    /// The element of `set` whose key is, or whose range holds, `key`.
    /// The chain named `name`: the plans' or a shared dispatch chain.
    fn chain(&self, name: &str) -> Option<&ChainPlan> {
        self.chains
            .get(name)
            .copied()
            .or_else(|| self.dispatch.get(name))
    }

    /// The endpoints the elements of `map` at `keys` DNAT to, as forks of a walk.
    fn endpoints_in(&self, map: &str, keys: impl Iterator<Item = Tuple>) -> Vec<Choice> {
        keys.filter_map(|key| match self.find(map, &key)?.data.as_ref()? {
            ElementData::Value(Tuple(values)) => match values.as_slice() {
                [Value::Ipv4(ip), Value::InetService(port)] => {
                    Some(SocketAddr::new(IpAddr::V4(*ip), *port))
                }
                [Value::Ipv6(ip), Value::InetService(port)] => {
                    Some(SocketAddr::new(IpAddr::V6(*ip), *port))
                }
                _ => None,
            },
            ElementData::Verdict(_) => None,
        })
        .map(Choice::Dnat)
        .collect()
    }

    fn find(&self, set: &str, key: &Tuple) -> Option<&'p Element> {
        self.elements
            .get(set)?
            .iter()
            .copied()
            .find(|element| match &element.key_end {
                None => element.key == *key,
                // A range of concatenations is a box: each field within its own range.
                Some(end) => {
                    key.0.len() == end.0.len()
                        && element
                            .key
                            .0
                            .iter()
                            .zip(&end.0)
                            .zip(&key.0)
                            .all(|((start, end), value)| start <= value && value <= end)
                }
            })
    }
}

/// A chain being run, and the index of its next rule.
#[derive(Clone)]
struct Frame<'p> {
    chain: &'p ChainPlan,
    rule: usize,
}

/// The packet as the rules see it so far, and where the walk stands.
#[derive(Clone)]
struct Walk<'p> {
    source: IpAddr,
    destination: IpAddr,
    port: u16,
    original_destination: IpAddr,
    protocol: Protocol,
    mark: u32,
    masqueraded: bool,
    /// Sent by this host: its source is local whatever address it carries.
    from_host: bool,
    /// Sent by a pod on this node, through its interface.
    from_pod: bool,
    /// Host traffic to this host, back in through loopback after postrouting.
    looped_back: bool,
    hook: Hook,
    /// The index of the current base chain in its hook.
    base: usize,
    stack: Vec<Frame<'p>>,
    steps: Vec<Step>,
}

impl<'p> Walk<'p> {
    /// Where the packet is headed now.
    fn to(&self) -> SocketAddr {
        SocketAddr::new(self.destination, self.port)
    }

    fn address(&self, addr: Addr) -> IpAddr {
        match addr {
            Addr::Source => self.source,
            Addr::Destination => self.destination,
        }
    }

    fn record(&mut self, chain: &ChainPlan, rule: &RulePlan, effect: String) {
        self.steps.push(Step {
            hook: self.hook,
            chain: chain.name().to_string(),
            rule: rule.to_string(),
            effect,
        });
    }

    /// `accept` or a NAT statement: the base chain is done, the hook goes on.
    fn end_base_chain(&mut self) {
        self.stack.clear();
        self.base += 1;
    }

    /// `goto`: the chain replaces the current one, so its end returns to the caller's.
    /// From a base chain, the target's end is the base chain's end.
    fn goto(&mut self, chain: &'p ChainPlan) {
        self.stack.pop();
        self.stack.push(Frame { chain, rule: 0 });
    }
}

enum Advance<'p> {
    On,
    Fork(Vec<Walk<'p>>),
    End(Fate),
}

enum Outcome {
    Miss,
    Done(String),
    Verdict(Verdict, Option<String>),
    Nat(String),
    Reject,
    Fork(Vec<Choice>),
}

enum Choice {
    Dnat(SocketAddr),
    Goto(String),
}

fn hook_name(hook: Hook) -> &'static str {
    match hook {
        Hook::Prerouting => "prerouting",
        Hook::Input => "input",
        Hook::Forward => "forward",
        Hook::Output => "output",
        Hook::Postrouting => "postrouting",
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Entry::Pod => "a pod on this node",
            Entry::Host => "this host",
            Entry::Outside => "outside the node",
        })
    }
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fate::Passes {
                to,
                here,
                masqueraded,
            } => {
                let place = if *here {
                    "delivered on this host"
                } else {
                    "routed on"
                };
                let source = if *masqueraded {
                    "source masqueraded"
                } else {
                    "source kept"
                };
                write!(f, "{place} to {to}, {source}")
            }
            Fate::Dropped { chain, .. } => {
                write!(f, "dropped in {chain} (the client times out)")
            }
            Fate::Rejected { chain } => {
                write!(f, "rejected in {chain} (ICMP port unreachable)")
            }
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<11} {}\n{:<11}   {}  => {}",
            hook_name(self.hook),
            self.chain,
            "",
            self.rule,
            self.effect
        )
    }
}

/// The steps every path shares once, then each path's own steps and fate.
impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let packet = &self.packet;
        writeln!(
            f,
            "{} {} -> {} from {}",
            protocol_name(packet.protocol),
            packet.source,
            SocketAddr::new(packet.destination, packet.port),
            packet.entry
        )?;
        let shared = self
            .paths
            .split_first()
            .map(|(first, rest)| {
                rest.iter().fold(first.steps.len(), |shared, path| {
                    first
                        .steps
                        .iter()
                        .zip(&path.steps)
                        .take(shared)
                        .take_while(|(a, b)| a == b)
                        .count()
                })
            })
            .unwrap_or(0);
        if let Some(first) = self.paths.first() {
            for step in &first.steps[..shared] {
                writeln!(f, "  {step}")?;
            }
        }
        let count = self.paths.len();
        for (i, path) in self.paths.iter().enumerate() {
            if count > 1 {
                writeln!(f, "path {} of {count}:", i + 1)?;
            }
            for step in &path.steps[shared..] {
                writeln!(f, "  {step}")?;
            }
            writeln!(f, "  => {}", path.fate)?;
        }
        for note in &self.notes {
            writeln!(f, "{note}")?;
        }
        writeln!(f, "summary: {}", self.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::Chain;

    /// A plan with a jump loop (which the kernel would refuse) ends the walk with a
    /// dropped path that says so, rather than spinning.
    #[test]
    fn a_loop_in_the_plan_ends_the_walk() {
        let jump = |chain: &str| RulePlan::new([Stmt::Verdict(Verdict::jump(chain))]);
        let skeleton = Skeleton {
            sets: Vec::new(),
            chains: vec![
                ChainPlan {
                    chain: Chain::base("out", ChainType::Filter, Hook::Output, 0),
                    rules: vec![jump("loop")],
                },
                ChainPlan::regular("loop".into(), vec![jump("loop")]),
            ],
        };
        let trace = Ruleset::new(&skeleton, &[], Vec::new()).trace(Packet {
            entry: Entry::Host,
            source: "10.0.0.1".parse().expect("ip"),
            destination: "10.0.0.2".parse().expect("ip"),
            protocol: Protocol::Tcp,
            port: 80,
        });
        assert_eq!(trace.summary(), "DROP");
        assert!(trace.to_string().contains("a loop in the plan"), "{trace}");
    }
}
