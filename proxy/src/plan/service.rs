//! One Service's part of the table, after kube-proxy's `syncProxyRules` and
//! `writeServiceToEndpointRules`: per service port and IP family, the dispatch elements
//! for its ClusterIP, ExternalIPs, LB IPs and NodePort, the reject/drop elements when it
//! has no usable endpoints, and the chains that pick an endpoint and DNAT to it.
//! Endpoint sets come from `nodus_view::resolve`; this module only decides what to
//! program for them.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use nodus_view::model::{Family, Protocol, Service, ServicePort, ServiceType, TrafficPolicy};
use nodus_view::resolve::{PortEndpoints, Target, port_endpoints, serving_endpoints};
use nodus_view::{ServiceView, View};

use super::config::NodeFacts;
use super::keys::KeyLease;
use super::names::PortIdentity;
use super::objects::{
    ChainPlan, ClaimLoss, Contested, ElementPlan, MAX_PORT_ENDPOINTS, ServicePlan, SetPlan,
    SharedKind, SharedSet, UdpFlows,
};
use super::rule::{Addr, RulePlan, Stmt, address_type, ip_value, node_port_key, service_key};
use super::skeleton::{MARK_FOR_MASQUERADE, REJECT, source_is_pod};
use crate::nft::{Element, Set, SetFlags, Tuple, Value, Verdict};
use nodus_view::ranges::merged_ranges;

/// Entries an affinity set may hold; the kernel wants a bound on sets the packet path
/// fills.
const AFFINITY_SET_SIZE: u32 = 65535;

/// Whether the proxy programs anything for `service` (A.1, A.2).
fn is_proxied(service: &Service) -> bool {
    !service.not_proxied()
        && !service.headless
        && service.type_ != ServiceType::ExternalName
        && !service.cluster_ips.is_empty()
}

/// The plan of one service of `view`.
pub fn plan_service(
    view: &View,
    service: &ServiceView<'_>,
    facts: &NodeFacts,
    keys: &mut KeyLease<'_>,
) -> ServicePlan {
    let mut plan = ServicePlan::empty(service.namespace, service.name);
    let Some(spec) = service.service.filter(|spec| is_proxied(spec)) else {
        return plan;
    };
    let shared_dispatch = dispatch_is_shared(spec);
    for family in Family::ALL {
        let Some(cluster_ip) = spec.cluster_ip(family) else {
            continue;
        };
        for port in &spec.ports {
            let port_name = view.strings().resolve(port.name);
            let label = if port_name.is_empty() {
                port.port.to_string()
            } else {
                port_name.to_string()
            };
            let identity = PortIdentity::new(
                service.namespace,
                service.name,
                family,
                port.protocol,
                &label,
            );
            let endpoints = port_endpoints(service.slices, family, port, &facts.node);
            if let Some(listener) = facts.local_dns_port(service.namespace, service.name, port.port)
            {
                plan_local_dns(
                    &mut plan, facts, identity, cluster_ip, port, family, listener,
                );
                continue;
            }
            PortPlanner {
                spec,
                owns: &|ip| owns_external(view, service, ip, port),
                port,
                family,
                cluster_ip,
                shared_dispatch: shared_dispatch.then(|| identity.service_wide()),
                identity,
                facts,
                keys: &mut *keys,
                plan: &mut plan,
            }
            .plan(&endpoints, || {
                serving_endpoints(service.slices, family, port, &facts.node)
            });
        }
    }
    dedup_elements(&mut plan.elements);
    plan
}

/// Whether the service's ports share their dispatch chains in each family, one rule per
/// port matching its number: every commit walks every chain of the namespace, so a
/// two-port Service with a chain per port doubles that walk for every change anywhere.
/// Only when every packet that reaches the chain still has the service port as its
/// destination (no NodePort, whose number is the one seen there) and the chain picks from
/// an endpoint map (no affinity, whose chains are per endpoint). A service of one port
/// keeps its port's chain, without the match.
fn dispatch_is_shared(spec: &Service) -> bool {
    spec.ports.len() > 1
        && spec.affinity_timeout == 0
        && spec.ports.iter().all(|port| port.node_port == 0)
}

/// The cluster DNS Service's port 53 when this node answers it (`serve_cluster_dns_ip`):
/// its ClusterIP goes to the node's own listener, whatever its endpoints, so kubelet's
/// `clusterDNS` reaches nodus without touching pods. The host's own questions are not
/// masqueraded: the mark `services` gives them as ClusterIP traffic from outside the pods
/// is taken off again, since the redirected packet never leaves the node.
fn plan_local_dns(
    plan: &mut ServicePlan,
    facts: &NodeFacts,
    identity: PortIdentity,
    cluster_ip: IpAddr,
    port: &ServicePort,
    family: Family,
    listener: u16,
) {
    let chain = identity.cluster_chain();
    plan.elements.push(ElementPlan {
        set: SharedSet::new(SharedKind::ServiceIps, family),
        element: Element::new(service_key(cluster_ip, port.protocol, port.port))
            .with_verdict(Verdict::goto(&chain)),
    });
    plan.elements.push(ElementPlan {
        set: SharedSet::new(SharedKind::ClusterIps, family),
        element: Element::new(ip_value(cluster_ip)),
    });
    let unmark = facts
        .marks_cluster_ip_traffic(family)
        .then(|| RulePlan::new([Stmt::MarkUnset(facts.masquerade_mark)]));
    let redirect = RulePlan::new([Stmt::L4Proto(port.protocol), Stmt::Redirect(listener)]);
    plan.chains.push(ChainPlan::regular(
        chain,
        unmark.into_iter().chain([redirect]).collect(),
    ));
}

/// A service may name one address twice (an ExternalIP that is also its LB IP). The
/// kernel refuses a key with two different data in one map, so the first entry is kept.
fn dedup_elements(elements: &mut Vec<ElementPlan>) {
    let mut seen: HashSet<(SharedSet, Tuple)> = HashSet::new();
    elements.retain(|element| seen.insert((element.set, element.element.key.clone())));
}

/// F.40, F.41: whether `service` owns its ExternalIP or LB IP `ip` on `port`: it is no
/// ClusterIP and lies in no ServiceCIDR (a ClusterIP is never displaced), and no other
/// service the proxy programs captures it on the same protocol and port with a smaller
/// [`Service::claim_rank`]. A contested address costs the younger service that address
/// and port only, and every node picks the same owner.
fn owns_external(
    view: &View,
    service: &ServiceView<'_>,
    ip: IpAddr,
    port: &ServicePort,
) -> Result<(), ClaimLoss> {
    let Some(spec) = service.service else {
        return Err(ClaimLoss::OlderService);
    };
    let is_cluster_ip = || {
        view.services_by_ip(ip)
            .any(|other| other.service.is_some_and(|s| s.cluster_ips.contains(&ip)))
    };
    if view.in_service_cidrs(ip) || is_cluster_ip() {
        return Err(ClaimLoss::ClusterIp);
    }
    let rank = spec.claim_rank(service.namespace, service.name);
    let owns = view.external_claimants(ip).all(|other| {
        let Some(other_spec) = other.service.filter(|spec| is_proxied(spec)) else {
            return true;
        };
        let captures = other_spec.external_ips().contains(&ip)
            || captured_lb_ips(other_spec).any(|lb| lb == ip);
        let same_port = other_spec
            .ports
            .iter()
            .any(|p| p.protocol == port.protocol && p.port == port.port);
        !(captures && same_port) || other_spec.claim_rank(other.namespace, other.name) >= rank
    });
    if owns {
        Ok(())
    } else {
        Err(ClaimLoss::OlderService)
    }
}

/// F.41: the LB IPs the proxy captures; `ipMode: Proxy` LBs deliver to the node, so
/// their IPs are left alone.
fn captured_lb_ips(spec: &Service) -> impl Iterator<Item = IpAddr> + '_ {
    spec.load_balancer_ingress()
        .iter()
        .filter(|ingress| !ingress.proxy_mode)
        .map(|ingress| ingress.ip)
}

/// The planning of one service port in one family.
struct PortPlanner<'a, 'k> {
    spec: &'a Service,
    /// Whether the service owns an external address on this port ([`owns_external`]).
    owns: &'a dyn Fn(IpAddr) -> Result<(), ClaimLoss>,
    port: &'a ServicePort,
    family: Family,
    cluster_ip: IpAddr,
    /// The service's identity in this family when its ports share their dispatch chains
    /// ([`dispatch_is_shared`]).
    shared_dispatch: Option<PortIdentity>,
    identity: PortIdentity,
    facts: &'a NodeFacts,
    keys: &'a mut KeyLease<'k>,
    plan: &'a mut ServicePlan,
}

/// How a port's traffic is routed (B.20): which endpoint sets it needs, what traffic
/// finds none, and the chains that follow.
struct Routing {
    internal_local: bool,
    external_local: bool,
    /// Endpoints for internal (ClusterIP) and external traffic, under their policies.
    has_internal: bool,
    has_external: bool,
    /// What traffic without endpoints gets: dropped when endpoints exist elsewhere,
    /// rejected when there are none.
    filter_verdict: Verdict,
    /// The map of its endpoint count, for a port that dispatches through the shared chain
    /// of that count ([`PortPlanner::port_map`]); `cluster_chain` is that chain.
    port_map: Option<SharedSet>,
    cluster_chain: Option<String>,
    local_chain: Option<String>,
    external_chain: Option<String>,
    firewall_chain: Option<String>,
}

impl PortPlanner<'_, '_> {
    /// `serving` lists the endpoints UDP flows may stay on; only UDP ports ask.
    fn plan(mut self, endpoints: &PortEndpoints, serving: impl FnOnce() -> Vec<(IpAddr, u16)>) {
        let (external_ips, lb_ips) = self.owned_external_addresses();
        let routing = self.routing(endpoints, &external_ips, &lb_ips);
        self.entry_elements(&routing, &external_ips, &lb_ips);
        let endpoint_targets = self.service_chains(&routing, endpoints, &lb_ips);
        // Every address clients reach this port at: the ClusterIP first.
        let mut service_addresses: Vec<(IpAddr, u16)> = std::iter::once(self.cluster_ip)
            .chain(external_ips.iter().copied())
            .chain(lb_ips.iter().copied())
            .map(|ip| (ip, self.port.port))
            .collect();
        let node_port = self.port.node_port;
        if node_port != 0 {
            let ips = self.facts.node_port_ips(self.family);
            service_addresses.extend(ips.map(|ip| (ip, node_port)));
        }
        self.hairpins(
            &endpoint_targets,
            &service_addresses,
            routing.external_local,
        );
        if self.port.protocol == Protocol::Udp {
            self.plan.udp_flows.push(UdpFlows {
                service_addresses,
                serving: serving(),
            });
        }
    }

    /// The port's ExternalIPs and LB IPs of its family that this service owns; those
    /// another service holds are noted as contested.
    fn owned_external_addresses(&mut self) -> (Vec<IpAddr>, Vec<IpAddr>) {
        let spec = self.spec;
        let mut external_ips: Vec<IpAddr> =
            of_family(spec.external_ips().iter().copied(), self.family);
        let mut lb_ips: Vec<IpAddr> = of_family(captured_lb_ips(spec), self.family);
        for (ips, is_lb) in [(&mut external_ips, false), (&mut lb_ips, true)] {
            ips.retain(|ip| {
                let loss = if !is_lb && !self.facts.honours_external_ip(*ip) {
                    Some(ClaimLoss::NotAllowed)
                } else {
                    (self.owns)(*ip).err()
                };
                if let Some(loss) = loss {
                    self.plan.contested.push(Contested {
                        address: *ip,
                        port: self.port.port,
                        loss,
                    });
                }
                loss.is_none()
            });
        }
        (external_ips, lb_ips)
    }

    /// B.20: which endpoint sets the port needs, and the chains that follow.
    fn routing(
        &mut self,
        endpoints: &PortEndpoints,
        external_ips: &[IpAddr],
        lb_ips: &[IpAddr],
    ) -> Routing {
        let spec = self.spec;
        let externally_accessible =
            self.port.node_port != 0 || !external_ips.is_empty() || !lb_ips.is_empty();
        let internal_local = spec.internal_policy == TrafficPolicy::Local;
        let external_local = externally_accessible && spec.external_policy == TrafficPolicy::Local;
        let uses_cluster = !internal_local || externally_accessible;
        let uses_local = internal_local || external_local;

        let has_endpoints = endpoints.has_endpoints;
        let has_local = !endpoints.local.is_empty();
        // B.19, E.37: with endpoints elsewhere but none here, Local traffic is dropped,
        // not rejected, so clients retry while the LB's health check catches up.
        let has_internal = if internal_local {
            has_local
        } else {
            has_endpoints
        };
        let has_external = if external_local {
            has_local
        } else {
            has_endpoints
        };
        // kube-proxy counts the ports whose Local traffic meets the drop below.
        if has_endpoints && !has_internal {
            self.plan.no_local.internal += 1;
        }
        if has_endpoints && externally_accessible && !has_external {
            self.plan.no_local.external += 1;
        }
        let filter_verdict = if has_endpoints {
            Verdict::Drop
        } else {
            Verdict::goto(REJECT)
        };
        let firewalled = !lb_ips.is_empty()
            && spec
                .load_balancer_source_ranges()
                .iter()
                .any(|range| range.family() == self.family);
        let dispatch = self.shared_dispatch.as_ref().unwrap_or(&self.identity);
        let port_map = (!externally_accessible && !internal_local)
            .then(|| self.port_map(&endpoints.cluster))
            .flatten();
        let cluster_chain = match port_map {
            Some(map) => Some(map.dispatch_chain_name()),
            None => {
                (uses_cluster && !endpoints.cluster.is_empty()).then(|| dispatch.cluster_chain())
            }
        };
        Routing {
            internal_local,
            external_local,
            has_internal,
            has_external,
            filter_verdict,
            port_map,
            cluster_chain,
            local_chain: (uses_local && has_local).then(|| dispatch.local_chain()),
            external_chain: (has_endpoints && externally_accessible)
                .then(|| self.identity.external_chain()),
            firewall_chain: firewalled.then(|| self.identity.firewall_chain()),
        }
    }

    /// The elements that lead traffic in: the ClusterIP (C.21, C.23, C.24, B.19), the
    /// ExternalIPs and LB IPs (F.40, F.41, F.42, F.44) and the NodePort on the addresses
    /// of `nodeport-ips` (E.33, E.36, E.37).
    fn entry_elements(&mut self, routing: &Routing, external_ips: &[IpAddr], lb_ips: &[IpAddr]) {
        let protocol = self.port.protocol;
        let cluster_key = service_key(self.cluster_ip, protocol, self.port.port);
        let internal_chain = if routing.internal_local {
            &routing.local_chain
        } else {
            &routing.cluster_chain
        };
        let no_endpoints = Some(routing.filter_verdict.clone());
        match internal_chain {
            Some(chain) if routing.has_internal => {
                self.element(SharedKind::ServiceIps, cluster_key, goto(chain));
            }
            _ => self.element(
                SharedKind::NoEndpointServices,
                cluster_key,
                no_endpoints.clone(),
            ),
        }
        self.element(
            SharedKind::ClusterIps,
            Tuple::from(ip_value(self.cluster_ip)),
            None,
        );
        for (ip, is_lb) in external_ips
            .iter()
            .map(|ip| (*ip, false))
            .chain(lb_ips.iter().map(|ip| (*ip, true)))
        {
            let key = service_key(ip, protocol, self.port.port);
            if let Some(chain) = &routing.external_chain {
                self.element(SharedKind::ServiceIps, key.clone(), goto(chain));
            }
            if let (true, Some(chain)) = (is_lb, &routing.firewall_chain) {
                self.element(SharedKind::FirewallIps, key.clone(), goto(chain));
            }
            if !routing.has_external {
                self.element(SharedKind::NoEndpointServices, key, no_endpoints.clone());
            }
        }
        let node_port = self.port.node_port;
        if node_port != 0 {
            let key = node_port_key(protocol, node_port);
            if let Some(chain) = &routing.external_chain {
                self.element(SharedKind::ServiceNodeports, key.clone(), goto(chain));
            }
            if !routing.has_external {
                self.element(SharedKind::NoEndpointNodeports, key, no_endpoints);
            }
        }
    }

    /// The port's chains (firewall, external, cluster, local); the endpoints they send
    /// to, sorted and once each.
    fn service_chains(
        &mut self,
        routing: &Routing,
        endpoints: &PortEndpoints,
        lb_ips: &[IpAddr],
    ) -> Vec<Target> {
        if let Some(chain) = &routing.firewall_chain {
            self.firewall_chain(chain, lb_ips);
        }
        let (cluster_chain, local_chain) = (&routing.cluster_chain, &routing.local_chain);
        if let Some(chain) = &routing.external_chain {
            let policy_chain = if routing.external_local {
                local_chain
            } else {
                cluster_chain
            };
            let rules = self.external_rules(
                routing.external_local,
                cluster_chain.as_deref(),
                policy_chain.as_deref().filter(|_| routing.has_external),
            );
            self.chain(chain.clone(), rules);
        }
        let mut endpoint_targets: Vec<Target> = Vec::new();
        if let Some(map) = routing.port_map {
            self.port_map_elements(map, &endpoints.cluster);
            endpoint_targets.extend(&endpoints.cluster);
        } else if let Some(chain) = cluster_chain {
            self.dispatch_chain(chain, &endpoints.cluster);
            endpoint_targets.extend(&endpoints.cluster);
        }
        if let Some(chain) = local_chain {
            // Under `internalTrafficPolicy: Local` ClusterIP traffic reaches this chain
            // instead of `service-`, already marked for masquerade when it comes from
            // outside the pods (`skeleton::cluster_masquerade_rule`).
            self.dispatch_chain(chain, &endpoints.local);
            endpoint_targets.extend(&endpoints.local);
        }
        endpoint_targets.sort_by_key(|target| (target.ip, target.port));
        endpoint_targets.dedup_by_key(|target| (target.ip, target.port));
        if self.spec.affinity_timeout > 0 {
            for target in &endpoint_targets {
                self.endpoint(target);
            }
        }
        endpoint_targets
    }

    /// D.27: endpoints that run here can hairpin, including those of slices that name no
    /// node or another (hand-made or mirrored ones) but hold this node's pod address.
    /// External traffic under the Cluster policy is masqueraded anyway; pods reach a
    /// Local-policy service's external addresses without masquerade, so those can
    /// hairpin too.
    fn hairpins(
        &mut self,
        endpoint_targets: &[Target],
        service_addresses: &[(IpAddr, u16)],
        external_local: bool,
    ) {
        let mut local_ips: Vec<IpAddr> = endpoint_targets
            .iter()
            .filter(|target| self.facts.runs_here(target))
            .map(|target| target.ip)
            .collect();
        local_ips.dedup();
        let hairpin_addresses = if external_local {
            service_addresses
        } else {
            &service_addresses[..1]
        };
        for ip in local_ips {
            for (service_ip, _) in hairpin_addresses {
                self.element(
                    SharedKind::Hairpin,
                    Tuple(vec![ip_value(ip), ip_value(ip), ip_value(*service_ip)]),
                    None,
                );
            }
        }
    }

    fn element(&mut self, kind: SharedKind, key: Tuple, verdict: Option<Verdict>) {
        let mut element = Element::new(key);
        element.data = verdict.map(crate::nft::ElementData::Verdict);
        self.plan.elements.push(ElementPlan {
            set: SharedSet::new(kind, self.family),
            element,
        });
    }

    fn chain(&mut self, name: String, rules: Vec<RulePlan>) {
        self.plan.chains.push(ChainPlan::regular(name, rules));
    }

    /// F.42, F.43: LB traffic from outside the source ranges is dropped before DNAT. When
    /// the node itself is inside a range, the LB IPs are allowed too: VIP-style LBs that
    /// route the VIP locally loop the node's traffic back with the VIP as source.
    fn firewall_chain(&mut self, chain: &str, lb_ips: &[IpAddr]) {
        let ranges = self.spec.load_balancer_source_ranges();
        let node_inside = self
            .facts
            .node_port_ips(self.family)
            .any(|ip| ranges.iter().any(|range| range.contains(ip)));
        let allowed_ips = if node_inside { lb_ips } else { &[] };
        let rule = RulePlan::new([
            Stmt::AddrInRanges {
                addr: Addr::Source,
                family: self.family,
                ranges: merged_ranges(ranges, allowed_ips, self.family),
                negated: true,
            },
            Stmt::Verdict(Verdict::Drop),
        ]);
        self.chain(chain.to_string(), vec![rule]);
    }

    /// D.31, D.32, F.45, F.46: the entry for external traffic.
    fn external_rules(
        &self,
        external_local: bool,
        cluster_chain: Option<&str>,
        policy_chain: Option<&str>,
    ) -> Vec<RulePlan> {
        let mut rules = Vec::new();
        if !external_local {
            // The endpoint may be on another node: masquerade so replies come back here.
            rules.push(RulePlan::new([jump(MARK_FOR_MASQUERADE)]));
        } else if let Some(cluster_chain) = cluster_chain {
            // Pods reach an eTP=Local service through the cluster set, as if they had gone
            // out to the load balancer and come back in.
            if self.facts.detects_local(self.family) {
                rules.push(RulePlan::new([
                    source_is_pod(self.facts, self.family, false),
                    Stmt::Verdict(Verdict::goto(cluster_chain)),
                ]));
            }
            // The host's own traffic has a local (often the external) address as source:
            // masquerade it, and let it use the cluster set too.
            rules.push(RulePlan::new([
                Stmt::FibSaddrLocal,
                jump(MARK_FOR_MASQUERADE),
            ]));
            rules.push(RulePlan::new([
                Stmt::FibSaddrLocal,
                Stmt::Verdict(Verdict::goto(cluster_chain)),
            ]));
        }
        if let Some(policy_chain) = policy_chain {
            rules.push(RulePlan::new([Stmt::Verdict(Verdict::goto(policy_chain))]));
        }
        rules
    }

    /// The map of the port's endpoint count, when the port needs no chain of its own: only
    /// its ClusterIP leads to it (no NodePort, ExternalIP or LB IP, whose traffic passes
    /// an `external-` chain first), under `internalTrafficPolicy: Cluster`, without
    /// affinity (whose chains are per endpoint), over TCP or UDP (the shared chain's
    /// rules), with 1 to [`MAX_PORT_ENDPOINTS`] endpoints. Its dispatch entry goes to the
    /// shared chain of that count, which picks an endpoint by the packet's own address and
    /// port: a cold start then writes no chain and no rule per port.
    fn port_map(&self, targets: &[Target]) -> Option<SharedSet> {
        let eligible = self.spec.affinity_timeout == 0
            && matches!(self.port.protocol, Protocol::Tcp | Protocol::Udp);
        let count = u16::try_from(distinct_endpoints(targets).len()).ok()?;
        (eligible && (1..=MAX_PORT_ENDPOINTS).contains(&count)).then(|| {
            super::keys::port_map(self.cluster_ip, self.port.protocol, self.port.port, count)
        })
    }

    /// C.21: the port's endpoints in the map of their count, keyed by its ClusterIP,
    /// protocol, port and an index below the count, which the shared chain draws at random.
    fn port_map_elements(&mut self, map: SharedSet, targets: &[Target]) {
        let service = service_key(self.cluster_ip, self.port.protocol, self.port.port);
        for (index, (ip, port)) in (0..).zip(distinct_endpoints(targets)) {
            let mut key = service.clone();
            key.0.push(Value::Integer32(index));
            self.plan.elements.push(ElementPlan {
                set: map,
                element: Element::new(key)
                    .with_value(Tuple(vec![ip_value(ip), Value::InetService(port)])),
            });
        }
    }

    /// The port's rules in the dispatch chain `chain`: a chain of its own, or appended to
    /// the one its service's ports share, after the rules of the ports before it.
    fn dispatch_chain(&mut self, chain: &str, targets: &[Target]) {
        let shared = self.plan.chains.iter().position(|c| c.name() == chain);
        let place = shared.map_or(0, |index| self.plan.chains[index].rules.len());
        let rules = self.dispatch_rules(chain, place, targets);
        match shared {
            Some(index) => self.plan.chains[index].rules.extend(rules),
            None => self.chain(chain.to_string(), rules),
        }
    }

    /// C.21, G.48: a uniformly random endpoint, for rules that start at `place` in
    /// `chain`. Without affinity the chain DNATs straight from its block of an endpoint
    /// map, so an endpoint change rewrites only map elements, which the kernel commits
    /// without re-validating the table; in a chain the ports share, each port's rule
    /// matches its number first. With affinity, sticky clients go first, and every
    /// endpoint needs a chain of its own to refresh its affinity set.
    fn dispatch_rules(&mut self, chain: &str, place: usize, targets: &[Target]) -> Vec<RulePlan> {
        let timeout = self.spec.affinity_timeout;
        if timeout == 0 {
            let endpoints = distinct_endpoints(targets);
            let count = u32::try_from(endpoints.len()).unwrap_or(u32::MAX);
            let place = u16::try_from(place).unwrap_or(u16::MAX);
            let block = self.keys.take(chain, place, self.family, count);
            self.plan.blocks.push(block);
            for (index, (ip, port)) in (block.offset..).zip(endpoints) {
                self.plan.elements.push(ElementPlan {
                    set: block.map,
                    element: Element::new(Value::Integer32(index))
                        .with_value(Tuple(vec![ip_value(ip), Value::InetService(port)])),
                });
            }
            let port = self
                .shared_dispatch
                .is_some()
                .then_some(Stmt::Dport(self.port.port));
            let dnat = Stmt::DnatFromMap {
                family: self.family,
                map: block.map.name(),
                endpoints: count,
                offset: block.offset,
            };
            return vec![RulePlan::new(
                [Stmt::L4Proto(self.port.protocol)]
                    .into_iter()
                    .chain(port)
                    .chain([dnat]),
            )];
        }
        let mut rules: Vec<RulePlan> = targets
            .iter()
            .map(|target| {
                RulePlan::new([
                    Stmt::AddrInSet {
                        addr: Addr::Source,
                        family: self.family,
                        set: self.identity.affinity_set(target.ip, target.port, timeout),
                        negated: false,
                    },
                    Stmt::Verdict(Verdict::goto(
                        self.identity.endpoint_chain(target.ip, target.port),
                    )),
                ])
            })
            .collect();
        rules.push(RulePlan::new([Stmt::RandomGoto(
            targets
                .iter()
                .map(|target| self.identity.endpoint_chain(target.ip, target.port))
                .collect(),
        )]));
        rules
    }

    /// G.48: an endpoint of a service with affinity: remember the client, DNAT.
    fn endpoint(&mut self, target: &Target) {
        let timeout = self.spec.affinity_timeout;
        let set = self.identity.affinity_set(target.ip, target.port, timeout);
        self.plan.sets.push(SetPlan {
            set: Set::new(set.clone(), address_type(self.family))
                .with_flags(SetFlags {
                    dynamic: true,
                    ..SetFlags::default()
                })
                .with_timeout(Duration::from_secs(u64::from(timeout)))
                .with_size(AFFINITY_SET_SIZE),
            elements: Vec::new(),
        });
        let rules = vec![
            RulePlan::new([Stmt::RememberSource {
                family: self.family,
                set,
            }]),
            RulePlan::new([
                Stmt::L4Proto(self.port.protocol),
                Stmt::Dnat {
                    addr: target.ip,
                    port: target.port,
                },
            ]),
        ];
        let name = self.identity.endpoint_chain(target.ip, target.port);
        self.chain(name, rules);
    }
}

/// The distinct `targets` in a stable order.
fn distinct_endpoints(targets: &[Target]) -> Vec<(IpAddr, u16)> {
    let mut endpoints: Vec<(IpAddr, u16)> = targets.iter().map(|t| (t.ip, t.port)).collect();
    endpoints.sort();
    endpoints.dedup();
    endpoints
}

fn jump(chain: &str) -> Stmt {
    Stmt::Verdict(Verdict::jump(chain))
}

fn goto(chain: &str) -> Option<Verdict> {
    Some(Verdict::goto(chain))
}

fn of_family(ips: impl Iterator<Item = IpAddr>, family: Family) -> Vec<IpAddr> {
    ips.filter(|ip| Family::of(*ip) == family).collect()
}
