//! The plan as `nft -f` text, for `nodus proxy render` and for tests that load it with
//! nft. It is written from the same plan types the agent programs, the skeleton first,
//! then one block per service, so it can be streamed service by service.

use std::collections::HashSet;
use std::fmt::{self, Write};

use super::TABLE;
use super::objects::{ChainPlan, ServicePlan, SharedSet, Skeleton};
use crate::nft::{ChainType, DataType, Element, Fields, Hook, Policy, Set, SetData};

/// The whole ruleset: `table inet nodus { … }` with the skeleton, then each service's
/// chains and its elements of the shared maps.
pub fn render(skeleton: &Skeleton, services: impl IntoIterator<Item = ServicePlan>) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = write_ruleset(&mut out, skeleton, services);
    out
}

/// [`render`] into any writer.
pub fn write_ruleset(
    out: &mut impl Write,
    skeleton: &Skeleton,
    services: impl IntoIterator<Item = ServicePlan>,
) -> fmt::Result {
    writeln!(out, "table inet {TABLE} {{")?;
    for set in &skeleton.sets {
        write_set(out, &set.set, &set.elements)?;
    }
    for chain in &skeleton.chains {
        write_chain(out, chain)?;
    }
    writeln!(out, "}}")?;
    let mut dispatch_chains = HashSet::new();
    for service in services {
        write_service(out, &service, &mut dispatch_chains)?;
    }
    Ok(())
}

/// One service's block; nothing for a service the proxy leaves alone. The shared dispatch
/// chain of an endpoint count is written with the first service that needs it
/// (`dispatch_chains` holds the maps of those written): nft adds a chain's rules again
/// each time it is declared.
fn write_service(
    out: &mut impl Write,
    service: &ServicePlan,
    dispatch_chains: &mut HashSet<SharedSet>,
) -> fmt::Result {
    if service.is_empty() {
        return Ok(());
    }
    writeln!(out, "\n# {}/{}", service.namespace, service.name)?;
    let maps = service.endpoint_maps();
    let new_dispatch: Vec<ChainPlan> = maps
        .iter()
        .filter(|map| !dispatch_chains.contains(*map))
        .filter_map(|map| map.dispatch_chain())
        .collect();
    if !service.sets.is_empty() || !service.chains.is_empty() || !new_dispatch.is_empty() {
        writeln!(out, "table inet {TABLE} {{")?;
        // Shared with other services: declaring one again is a no-op for nft.
        for map in &maps {
            write_set(out, &map.definition(), &[])?;
        }
        for chain in &new_dispatch {
            write_chain(out, chain)?;
        }
        dispatch_chains.extend(maps);
        for set in &service.sets {
            write_set(out, &set.set, &set.elements)?;
        }
        for chain in &service.chains {
            write_chain(out, chain)?;
        }
        writeln!(out, "}}")?;
    }
    let mut sets: Vec<SharedSet> = service.elements.iter().map(|e| e.set).collect();
    sets.sort();
    sets.dedup();
    for set in sets {
        let elements: Vec<String> = service.elements_in(set).map(Element::to_string).collect();
        writeln!(
            out,
            "add element inet {TABLE} {} {{ {} }}",
            set.name(),
            elements.join(", ")
        )?;
    }
    Ok(())
}

fn write_set(out: &mut impl Write, set: &Set, elements: &[Element]) -> fmt::Result {
    writeln!(out, "\t{} {} {{", set.noun(), set.name)?;
    match &set.data {
        // nft has no type name for a numgen result; it takes the type from an expression.
        Some(SetData::Value(data)) if set.key.fields().contains(&DataType::Integer32) => writeln!(
            out,
            "\t\ttypeof {} : {}",
            typeof_fields(&set.key),
            typeof_fields(data)
        )?,
        None => writeln!(out, "\t\ttype {}", set.key)?,
        Some(SetData::Verdict) => writeln!(out, "\t\ttype {} : verdict", set.key)?,
        Some(SetData::Value(data)) => writeln!(out, "\t\ttype {} : {data}", set.key)?,
    }
    if let Some(size) = set.size {
        writeln!(out, "\t\tsize {size}")?;
    }
    let flags: Vec<&str> = [
        (set.flags.constant, "constant"),
        (set.flags.interval, "interval"),
        (set.flags.dynamic, "dynamic"),
        (set.flags.timeout, "timeout"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if !flags.is_empty() {
        writeln!(out, "\t\tflags {}", flags.join(","))?;
    }
    if let Some(timeout) = set.timeout {
        writeln!(out, "\t\ttimeout {}s", timeout.as_secs())?;
    }
    if set.counter {
        writeln!(out, "\t\tcounter")?;
    }
    if !elements.is_empty() {
        let elements: Vec<String> = elements.iter().map(Element::to_string).collect();
        writeln!(out, "\t\telements = {{ {} }}", elements.join(", "))?;
    }
    writeln!(out, "\t}}")
}

/// The `typeof` spelling of endpoint map data, `ip daddr . th dport`: expressions of
/// the same types (`th dport` is any transport protocol's).
fn typeof_fields(data: &Fields) -> String {
    let words: Vec<&str> = data
        .fields()
        .iter()
        .map(|field| match field {
            DataType::Ipv4Addr => "ip daddr",
            DataType::Ipv6Addr => "ip6 daddr",
            DataType::InetProto => "meta l4proto",
            DataType::InetService => "th dport",
            DataType::Mark => "meta mark",
            DataType::Integer32 => "numgen random mod 2",
        })
        .collect();
    words.join(" . ")
}

fn write_chain(out: &mut impl Write, chain: &ChainPlan) -> fmt::Result {
    writeln!(out, "\tchain {} {{", chain.name())?;
    if let Some(base) = &chain.chain.base {
        let kind = match base.kind {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
            ChainType::Route => "route",
        };
        let hook = match base.hook {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        };
        let policy = match base.policy {
            Policy::Accept => "accept",
            Policy::Drop => "drop",
        };
        writeln!(
            out,
            "\t\ttype {kind} hook {hook} priority {}; policy {policy};",
            base.priority
        )?;
    }
    for (index, rule) in chain.rules.iter().enumerate() {
        match index {
            0 => writeln!(out, "\t\t{rule} comment \"{}\"", chain.comment())?,
            _ => writeln!(out, "\t\t{rule}")?,
        }
    }
    writeln!(out, "\t}}")
}
