//! NetworkPolicy in the `nodus` table: what the view resolved for this node's pods
//! ([`PodPolicy`]) as per-direction, per-family sets that one chain looks packets up in.
//!
//! ```text
//! policy-forward   filter forward, priority filter (after the proxy's DNAT: a policy
//!                  sees the endpoint pod, not the service address)
//!   ct state established,related accept      replies of allowed connections
//!   jump policy-egress
//!   jump policy-ingress
//! policy-egress
//!   ip saddr . ip daddr . meta l4proto . th dport @policy-egress-allowed-v4 return
//!   ip saddr @policy-egress-isolated-v4 drop
//! policy-ingress   the same with daddr first, on the policy-ingress-… sets
//! ```
//!
//! The isolated sets count, per pod, the packets they drop (nft's `counter` on every
//! element): the agent reads them as `nodus_policy_denied_packets_total`.
//!
//! An allowed set holds, per isolated pod, the boxes `pod . peer range . protocols .
//! ports` that its policies allow, and the pod itself (traffic of a pod to itself is
//! always allowed). The per-packet cost is one lookup per direction, whatever the number
//! of policies. The `pipapo` set backend refuses an element that overlaps one present,
//! so the boxes of one pod are made disjoint first ([`disjoint_within`]), and counted:
//! a pod whose boxes pass [`ELEMENTS_MAX`] fails closed. Traffic between a pod
//! and its own node does not cross the forward hook, so probes of the node's kubelet
//! always reach its pods, as upstream requires.

use std::net::IpAddr;

use nodus_view::View;
use nodus_view::model::{Family, Protocol};
use nodus_view::policy::resolve::{Allowance, Connection, Direction, PodPolicy};
use nodus_view::ranges::{from_number, to_number};

use super::names::protocol_name;
use super::objects::{ChainPlan, SetPlan, family_suffix};
use super::rule::{Addr, RulePlan, Stmt, address_type, ip_value, protocol_value};
use super::trace::{Fate, Trace};
use crate::nft::{Chain, ChainType, DataType, Element, Fields, Hook, Set, SetFlags, Value};
use crate::nft::{Verdict, priority};

pub const POLICY_FORWARD: &str = "policy-forward";

fn chain(direction: Direction) -> &'static str {
    match direction {
        Direction::Ingress => "policy-ingress",
        Direction::Egress => "policy-egress",
    }
}

/// Which address of a packet is the pod of this node.
fn local(direction: Direction) -> Addr {
    match direction {
        Direction::Ingress => Addr::Destination,
        Direction::Egress => Addr::Source,
    }
}

pub(crate) fn isolated_set(direction: Direction, family: Family) -> String {
    format!("{}-isolated-{}", chain(direction), family_suffix(family))
}

fn allowed_set(direction: Direction, family: Family) -> String {
    format!("{}-allowed-{}", chain(direction), family_suffix(family))
}

/// The chains of NetworkPolicy enforcement.
pub fn chains() -> Vec<ChainPlan> {
    let mut chains = vec![ChainPlan {
        chain: Chain::base(
            POLICY_FORWARD,
            ChainType::Filter,
            Hook::Forward,
            priority::FILTER,
        ),
        rules: vec![
            RulePlan::new([Stmt::CtStateEstablished, Stmt::Verdict(Verdict::Accept)]),
            RulePlan::new([Stmt::Verdict(Verdict::jump(chain(Direction::Egress)))]),
            RulePlan::new([Stmt::Verdict(Verdict::jump(chain(Direction::Ingress)))]),
        ],
    }];
    for direction in Direction::ALL {
        let mut rules = Vec::new();
        for family in Family::ALL {
            rules.push(RulePlan::new([
                Stmt::PolicyAllowed {
                    family,
                    local: local(direction),
                    set: allowed_set(direction, family),
                },
                Stmt::Verdict(Verdict::Return),
            ]));
            rules.push(RulePlan::new([
                Stmt::AddrInSet {
                    addr: local(direction),
                    family,
                    set: isolated_set(direction, family),
                    negated: false,
                },
                Stmt::Verdict(Verdict::Drop),
            ]));
        }
        chains.push(ChainPlan::regular(chain(direction).to_string(), rules));
    }
    chains
}

/// The elements one pod may have in one direction's allowed set. Its policies' peers and
/// ports are made into disjoint boxes, which can grow as the square of its rules (rules
/// whose peer ranges overlap with other ports each): the boxes are counted as they are
/// made, and a pod over the cap fails closed there before they take the node's memory.
pub const ELEMENTS_MAX: usize = 10_000;

/// The disjoint boxes `pod . peer range . protocols . ports` that `allowances` and the pod
/// itself make; `None` past `limit` of them.
fn allowed_boxes(pod: IpAddr, allowances: &[Allowance], limit: usize) -> Option<Vec<[Span; 3]>> {
    let boxes: Vec<[Span; 3]> = allowances
        .iter()
        .map(|a| {
            [
                (to_number(a.peer.0), to_number(a.peer.1)),
                protocol_span(a.protocol),
                (u128::from(a.ports.0), u128::from(a.ports.1)),
            ]
        })
        .chain([own_box(pod)])
        .collect();
    disjoint_within(&boxes, limit)
}

/// The pod itself, every protocol and port: traffic of a pod to itself always passes.
fn own_box(pod: IpAddr) -> [Span; 3] {
    let own = to_number(pod);
    [(own, own), (0, 255), (0, u128::from(u16::MAX))]
}

/// `policies` as the kernel can hold them: a pod whose allowances in a direction make
/// more than [`ELEMENTS_MAX`] elements is allowed nothing there (but itself) and marked
/// over the cap, so that it is reported as over the view's allowance cap is.
pub fn within_element_cap(mut policies: Vec<PodPolicy>) -> Vec<PodPolicy> {
    for pod in &mut policies {
        for direction in Direction::ALL {
            let over = pod
                .allowed(direction)
                .is_some_and(|allowed| allowed_boxes(pod.ip, allowed, ELEMENTS_MAX).is_none());
            if !over {
                continue;
            }
            match direction {
                Direction::Ingress => pod.ingress = Some(Vec::new()),
                Direction::Egress => pod.egress = Some(Vec::new()),
            }
            if !pod.over_cap.contains(&direction) {
                pod.over_cap.push(direction);
            }
        }
    }
    policies
}

/// The sets of NetworkPolicy enforcement, filled from `pods`.
pub fn sets(pods: &[PodPolicy]) -> Vec<SetPlan> {
    let mut sets = Vec::new();
    for direction in Direction::ALL {
        for family in Family::ALL {
            let addr = address_type(family);
            let mut isolated = Vec::new();
            let mut allowed = Vec::new();
            for pod in pods.iter().filter(|pod| Family::of(pod.ip) == family) {
                let Some(allowances) = pod.allowed(direction) else {
                    continue;
                };
                isolated.push(Element::new(ip_value(pod.ip)));
                // Over the cap (which `within_element_cap` reports first): the pod
                // itself alone, failing closed.
                let boxes = allowed_boxes(pod.ip, allowances, ELEMENTS_MAX)
                    .unwrap_or_else(|| vec![own_box(pod.ip)]);
                for [peer, protocol, ports] in boxes {
                    let value = |peer: u128, protocol: u128, port: u128| {
                        vec![
                            ip_value(pod.ip),
                            ip_value(from_number(peer, family)),
                            Value::InetProto(u8::try_from(protocol).unwrap_or(u8::MAX)),
                            Value::InetService(u16::try_from(port).unwrap_or(u16::MAX)),
                        ]
                    };
                    allowed.push(Element::range(
                        value(peer.0, protocol.0, ports.0),
                        value(peer.1, protocol.1, ports.1),
                    ));
                }
            }
            // Its elements count the packets dropped for want of an allowance.
            sets.push(SetPlan {
                set: Set::new(isolated_set(direction, family), addr).with_counter(),
                elements: isolated,
            });
            sets.push(SetPlan {
                set: Set::new(
                    allowed_set(direction, family),
                    Fields::new([addr, addr, DataType::InetProto, DataType::InetService]),
                )
                .with_flags(SetFlags {
                    interval: true,
                    ..SetFlags::default()
                }),
                elements: allowed,
            });
        }
    }
    sets
}

/// Which NetworkPolicies decided each path of `trace` that crossed the policy chains:
/// per direction, those that isolate the pod, and which of them allow the connection; or
/// that the pod fails closed there (its policies allow more than the view keeps, or its
/// address is shared), whatever they allow.
pub fn notes(view: &View, trace: &Trace) -> Vec<String> {
    let packet = &trace.packet;
    let mut notes = Vec::new();
    let mut resolved: Option<Vec<PodPolicy>> = None;
    for path in &trace.paths {
        if !path.steps.iter().any(|step| step.chain == POLICY_FORWARD) {
            continue;
        }
        let to = match &path.fate {
            Fate::Passes { to, .. } | Fate::Dropped { to, .. } => *to,
            Fate::Rejected { .. } => continue,
        };
        for direction in Direction::ALL {
            let (pod, peer) = match direction {
                Direction::Egress => (packet.source, to.ip()),
                Direction::Ingress => (to.ip(), packet.source),
            };
            let judged = view.judge_policies(&Connection {
                direction,
                pod,
                peer,
                protocol: packet.protocol,
                port: to.port(),
            });
            if judged.is_empty() {
                continue;
            }
            let named = |allows: bool| -> Vec<&str> {
                judged
                    .iter()
                    .filter(|j| j.allows == allows)
                    .map(|j| j.policy.as_str())
                    .collect()
            };
            let allowing = named(true);
            let resolved = resolved.get_or_insert_with(|| within_element_cap(view.pod_policies()));
            let closed = resolved.iter().find(|p| p.ip == pod).map(|p| {
                let nothing = p.allowed(direction).is_some_and(<[_]>::is_empty);
                (p.over_cap.contains(&direction), nothing)
            });
            let verdict = if pod == peer {
                "allowed: a pod always reaches itself".to_string()
            } else if let Some((true, _)) = closed {
                format!(
                    "denied: isolated by {}, which allow it more than {} peer and port \
                     ranges or {} kernel elements: it fails closed",
                    judged
                        .iter()
                        .map(|j| j.policy.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    nodus_view::policy::resolve::ALLOWANCES_MAX,
                    ELEMENTS_MAX
                )
            } else if let (Some((_, true)), false) = (closed, allowing.is_empty()) {
                format!(
                    "denied: allowed by {}, but its address is another local pod's too, and \
                     an address shared fails closed",
                    allowing.join(", ")
                )
            } else if !allowing.is_empty() {
                format!("allowed by {}", allowing.join(", "))
            } else {
                format!(
                    "denied: isolated by {}, none allows it",
                    named(false).join(", ")
                )
            };
            let way = match direction {
                Direction::Egress => "from",
                Direction::Ingress => "to",
            };
            let label = direction.as_str();
            let note = format!(
                "NetworkPolicy {label} {way} pod {pod}, peer {peer}, {} port {}: {verdict}",
                protocol_name(packet.protocol),
                to.port()
            );
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
    }
    notes
}

/// Whether `name` is one of the policy sets, whose elements follow the policies rather
/// than the skeleton.
pub fn is_policy_set(name: &str) -> bool {
    name.starts_with("policy-")
}

fn protocol_span(protocol: Option<Protocol>) -> Span {
    match protocol.map(protocol_value) {
        Some(Value::InetProto(number)) => (u128::from(number), u128::from(number)),
        _ => (0, 255),
    }
}

/// An inclusive range along one axis.
type Span = (u128, u128);

/// Disjoint boxes whose union is the union of `boxes`: along the first axis, the points
/// where some box starts or ends cut it into pieces, each covered by the same boxes
/// throughout; the rest of those boxes is made disjoint the same way, and neighbouring
/// pieces with the same rest are joined again. `None` as soon as it would make more than
/// `limit` boxes: no more than about `limit` are ever held.
fn disjoint_within<const N: usize>(boxes: &[[Span; N]], limit: usize) -> Option<Vec<[Span; N]>> {
    let rows: Vec<&[Span]> = boxes.iter().map(|b| &b[..]).collect();
    Some(
        disjoint_rows(&rows, limit)?
            .into_iter()
            .filter_map(|row| <[Span; N]>::try_from(row).ok())
            .collect(),
    )
}

fn disjoint_rows(boxes: &[&[Span]], limit: usize) -> Option<Vec<Vec<Span>>> {
    let Some(first) = boxes.first() else {
        return Some(Vec::new());
    };
    if first.is_empty() {
        return Some(vec![Vec::new()]);
    }
    let mut cuts: Vec<u128> = Vec::with_capacity(boxes.len() * 2);
    for b in boxes {
        cuts.push(b[0].0);
        if let Some(after) = b[0].1.checked_add(1) {
            cuts.push(after);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut by_start: Vec<&&[Span]> = boxes.iter().collect();
    by_start.sort_unstable_by_key(|b| b[0].0);
    let mut next = 0;
    let mut active: Vec<&[Span]> = Vec::new();
    let mut out = Vec::new();
    // The piece being grown: its span on this axis, and the rest of its boxes.
    let mut open: Option<(Span, Vec<Vec<Span>>)> = None;
    for (i, &start) in cuts.iter().enumerate() {
        let end = cuts.get(i + 1).map_or(u128::MAX, |next| next - 1);
        active.retain(|b| b[0].1 >= start);
        while let Some(b) = by_start.get(next).filter(|b| b[0].0 <= start) {
            active.push(b);
            next += 1;
        }
        let rest = if active.is_empty() {
            Vec::new()
        } else {
            disjoint_rows(&active.iter().map(|b| &b[1..]).collect::<Vec<_>>(), limit)?
        };
        match &mut open {
            Some((span, open_rest))
                if *open_rest == rest && span.1.checked_add(1) == Some(start) =>
            {
                span.1 = end;
            }
            _ => {
                if let Some((span, rest)) = open.take() {
                    close(span, rest, &mut out, limit)?;
                }
                open = Some(((start, end), rest));
            }
        }
    }
    if let Some((span, rest)) = open {
        close(span, rest, &mut out, limit)?;
    }
    Some(out)
}

fn close(span: Span, rest: Vec<Vec<Span>>, out: &mut Vec<Vec<Span>>, limit: usize) -> Option<()> {
    if out.len().saturating_add(rest.len()) > limit {
        return None;
    }
    for tail in rest {
        let mut row = Vec::with_capacity(tail.len() + 1);
        row.push(span);
        row.extend(tail);
        out.push(row);
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disjoint<const N: usize>(boxes: &[[Span; N]]) -> Vec<[Span; N]> {
        disjoint_within(boxes, usize::MAX).expect("no limit")
    }

    /// Every point of a small grid is covered by `disjoint`'s boxes as often as it is by
    /// any of the input boxes: once if some covers it, else never.
    #[test]
    fn disjoint_boxes_cover_the_same_points_once() {
        let boxes = [
            [(0, 9), (6, 6), (80, 80)],
            [(3, 3), (0, 255), (0, 65535)],
            [(2, 5), (6, 6), (70, 90)],
            [(5, 12), (17, 17), (53, 53)],
            [(0, 9), (6, 6), (80, 80)],
        ];
        let out = disjoint(&boxes);
        for x in 0..14u128 {
            for proto in [0u128, 6, 17, 200] {
                for port in [0u128, 53, 69, 70, 80, 90, 91, 65535] {
                    let inside = |b: &[Span; 3]| {
                        b.iter()
                            .zip([x, proto, port])
                            .all(|(span, p)| span.0 <= p && p <= span.1)
                    };
                    let wanted = boxes.iter().any(inside);
                    let covered = out.iter().filter(|b| inside(b)).count();
                    assert_eq!(covered, usize::from(wanted), "{x} {proto} {port}: {out:?}");
                }
            }
        }
    }

    /// The review's "stairs": rule i allows 10.0.0.0/8 less the /24 number i, on TCP port
    /// 1000 + 2i. Each rule is two allowances, but the disjoint boxes grow as n² + n + 1:
    /// 50 rules fit (2,551), 300 (90,301) fail closed in egress alone, and counting stops
    /// at the cap instead of making them all.
    #[test]
    fn a_policy_whose_boxes_grow_as_its_rules_squared_fails_closed_at_the_cap() {
        let stairs = |n: u32| -> Vec<Allowance> {
            (0..n)
                .flat_map(|i| {
                    let hole = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)) + (i << 8);
                    let ip = |n: u32| IpAddr::from(std::net::Ipv4Addr::from(n));
                    let port = u16::try_from(1000 + 2 * i).expect("port");
                    [
                        (ip(0x0a00_0000), ip(hole - 1)),
                        (ip(hole + 256), ip(0x0aff_ffff)),
                    ]
                    .into_iter()
                    .filter(|(start, end)| start <= end)
                    .map(move |peer| Allowance {
                        peer,
                        protocol: Some(Protocol::Tcp),
                        ports: (port, port),
                    })
                })
                .collect()
        };
        let pod = |egress: Vec<Allowance>| PodPolicy {
            pod: 7,
            ip: "10.244.1.5".parse().expect("ip"),
            ingress: Some(Vec::new()),
            egress: Some(egress),
            over_cap: Vec::new(),
        };
        let ip: IpAddr = "10.244.1.5".parse().expect("ip");
        let fifty = allowed_boxes(ip, &stairs(50), usize::MAX).expect("no cap");
        assert_eq!(
            fifty.len(),
            50 * 50 + 50 + 1,
            "n² + n + 1, the pod itself among them"
        );
        let kept = within_element_cap(vec![pod(stairs(50))]);
        assert!(kept[0].over_cap.is_empty());
        assert_eq!(
            kept[0].egress.as_ref().map(Vec::len),
            Some(99),
            "rule 0 has one range"
        );

        let started = std::time::Instant::now();
        let capped = within_element_cap(vec![pod(stairs(300))]);
        assert_eq!(capped[0].over_cap, [Direction::Egress]);
        assert_eq!(capped[0].egress, Some(Vec::new()), "nothing allowed");
        assert_eq!(capped[0].ingress, Some(Vec::new()));
        let sets = sets(&capped);
        let allowed = sets
            .iter()
            .find(|set| set.set.name == "policy-egress-allowed-v4")
            .expect("the egress set");
        assert_eq!(allowed.elements.len(), 1, "the pod itself alone");
        // Not a timing assertion: what the cap spared, told.
        println!("300 stairs judged in {:?}", started.elapsed());
    }

    #[test]
    fn neighbouring_points_join_into_one_range() {
        let boxes: Vec<[Span; 2]> = (10..20).map(|x| [(x, x), (80, 80)]).collect();
        assert_eq!(disjoint(&boxes), vec![[(10, 19), (80, 80)]]);
        assert!(disjoint::<2>(&[]).is_empty());
        assert_eq!(
            disjoint(&[[(0, u128::MAX)], [(5, 5)]]),
            vec![[(0, u128::MAX)]]
        );
    }
}
