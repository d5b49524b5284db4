//! Unit tests of the pure parts: footprints and the previous plans rebuilt from them.

use nodus_view::model::Family;

use super::Footprint;
use super::records::Footprints;
use crate::nft::{Chain, DataType, Element, Set, Tuple, Value, Verdict};
use crate::plan::{
    ChainPlan, ElementPlan, KeyBlock, RulePlan, ServicePlan, SetPlan, SharedKind, SharedSet, Stmt,
};

fn plan(endpoints: u8, data_chain: &str) -> ServicePlan {
    let mut plan = ServicePlan::empty("default", "web");
    let path = "default/web/ipv4/tcp/http";
    let chain = |name: String| ChainPlan {
        chain: Chain::regular(name),
        rules: vec![RulePlan::new([Stmt::Verdict(Verdict::Accept)])],
    };
    plan.chains
        .push(chain(crate::plan::join_name("service", path)));
    for i in 0..endpoints {
        let endpoint = format!("{path}__10.244.1.{i}/8080");
        plan.chains
            .push(chain(crate::plan::join_name("endpoint", &endpoint)));
    }
    plan.sets.push(SetPlan {
        set: Set::new("affinity-XXXXXXXX-cut", DataType::Ipv4Addr),
        elements: Vec::new(),
    });
    plan.elements.push(ElementPlan {
        set: SharedSet::new(SharedKind::ServiceIps, Family::V4),
        element: Element::new(Tuple(vec![
            Value::Ipv4([10, 96, 0, 10].into()),
            Value::TCP,
            Value::InetService(80),
        ]))
        .with_verdict(Verdict::goto(data_chain)),
    });
    plan.elements.push(ElementPlan {
        set: SharedSet::new(SharedKind::ClusterIps, Family::V6),
        element: Element::new(Value::Ipv6("fd00::10".parse().expect("ip"))),
    });
    plan
}

#[test]
fn footprint_restores_names_and_keys() {
    let old = plan(10, "service-a");
    let bytes = Footprint::encode(&old, old.digest());
    let footprint = Footprint(&bytes);
    let previous = footprint
        .previous_plan(&ServicePlan::empty("default", "web"))
        .expect("readable");
    let mut names: Vec<&str> = previous.chains.iter().map(|c| c.name()).collect();
    let mut expected: Vec<&str> = old.chains.iter().map(|c| c.name()).collect();
    names.sort();
    expected.sort();
    assert_eq!(names, expected);
    assert_eq!(previous.sets[0].set.name, "affinity-XXXXXXXX-cut");
    let keys: Vec<&Tuple> = previous.elements.iter().map(|e| &e.element.key).collect();
    let expected: Vec<&Tuple> = old.elements.iter().map(|e| &e.element.key).collect();
    assert_eq!(keys, expected);
    // Compact: about 13 bytes per endpoint chain (with its digest), not the ~60 of a name.
    assert!(footprint.len() < 290, "{} bytes", footprint.len());
}

#[test]
fn unchanged_elements_are_left_alone_and_changed_ones_replaced() {
    let old = plan(2, "service-a");
    let bytes = Footprint::encode(&old, old.digest());
    let footprint = Footprint(&bytes);
    // Same data: the rebuilt element equals the new one, so no delete or add.
    let same = footprint.previous_plan(&old).expect("readable");
    assert_eq!(same.elements, old.elements);
    // Chains whose rules have the same digest are left alone.
    assert_eq!(same.chains, old.chains);
    // Other data: the rebuilt element differs, so it is deleted and re-added.
    let new = plan(2, "reject-chain");
    let changed = footprint.previous_plan(&new).expect("readable");
    assert_ne!(changed.elements[0], new.elements[0]);
    assert_eq!(changed.elements[1], new.elements[1]);
    // A chain whose rules changed counts as changed, so it is rewritten.
    let mut rewritten = old.clone();
    rewritten.chains[0].rules = vec![RulePlan::new([Stmt::Verdict(Verdict::Drop)])];
    let previous = footprint.previous_plan(&rewritten).expect("readable");
    assert_ne!(previous.chains[0], rewritten.chains[0]);
    assert_eq!(previous.chains[1..], rewritten.chains[1..]);
}

/// `plan` with a key block of `endpoints` keys from `offset` in an endpoint map.
fn dispatched(endpoints: u8, offset: u32) -> ServicePlan {
    let mut plan = plan(0, "service-a");
    let map = SharedSet::endpoints(Family::V4, 7);
    plan.blocks.push(KeyBlock {
        map,
        offset,
        class: 5,
        chain: 0xfeed,
        rule: 2,
    });
    for i in 0..endpoints {
        plan.elements.push(ElementPlan {
            set: map,
            element: Element::new(Value::Integer32(offset + u32::from(i))).with_value(Tuple(vec![
                Value::Ipv4([10, 244, 1, i].into()),
                Value::InetService(8080),
            ])),
        });
    }
    plan
}

#[test]
fn the_record_holds_digest_chains_blocks_and_endpoint_runs() {
    let old = dispatched(20, 32);
    let bytes = Footprint::encode(&old, 0xabcd_ef01_2345_6789);
    let footprint = Footprint(&bytes);
    assert_eq!(footprint.digest(), 0xabcd_ef01_2345_6789);
    assert_eq!(footprint.chains(), old.chains.len());
    assert_eq!(footprint.blocks("default", "web"), old.blocks);
    // Twenty endpoint elements as one run: a digest for each chunk of four, not a set,
    // key and digest each, and the run names the block it fills in one byte.
    let without = Footprint::encode(&dispatched(0, 32), 1).len();
    assert!(
        footprint.len() - without <= 5 * 4 + 2,
        "{} bytes for twenty endpoints",
        footprint.len() - without
    );
    let same = footprint.previous_plan(&old).expect("readable");
    let mut elements = same.elements.clone();
    let mut expected = old.elements.clone();
    elements.sort_by_key(|e| format!("{e:?}"));
    expected.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(elements, expected);
    // One endpoint moved: only the elements of its chunk are rebuilt key-only (deleted
    // and re-added): keys 32 to 35 for key 35, 48 to 51 for key 50.
    for (key, chunk) in [(35, 32..36), (50, 48..52)] {
        let mut moved = old.clone();
        let endpoint = moved
            .elements
            .iter_mut()
            .find(|e| e.element.key == Tuple(vec![Value::Integer32(key)]))
            .expect("the key");
        endpoint.element = Element::new(Value::Integer32(key)).with_value(Tuple(vec![
            Value::Ipv4([10, 244, 9, 9].into()),
            Value::InetService(8080),
        ]));
        let previous = footprint.previous_plan(&moved).expect("readable");
        let differing: Vec<&Element> = previous
            .elements
            .iter()
            .filter(|e| !moved.elements.contains(e))
            .map(|e| &e.element)
            .collect();
        let rebuilt: Vec<Element> = chunk.map(|k| Element::new(Value::Integer32(k))).collect();
        assert_eq!(differing, rebuilt.iter().collect::<Vec<_>>());
    }
    // Fewer endpoints: the chunk whose keys the new plan lacks is rebuilt whole; the four
    // chunks before it and the two elements outside the run are left alone.
    let shrunk = dispatched(18, 32);
    let previous = footprint.previous_plan(&shrunk).expect("readable");
    let kept = previous
        .elements
        .iter()
        .filter(|e| shrunk.elements.contains(e))
        .count();
    assert_eq!(kept, 16 + 2);
}

/// A plan of two ports that dispatch by endpoint count, `endpoints` each, the second's
/// first endpoint moved to `moved`.
fn by_count(endpoints: u16, moved: u8) -> ServicePlan {
    let mut plan = ServicePlan::empty("default", "web");
    let map = SharedSet::port_endpoints(Family::V4, endpoints, 0);
    for (port, protocol) in [(80, Value::TCP), (53, Value::UDP)] {
        let service = [
            Value::Ipv4([10, 96, 0, 10].into()),
            protocol,
            Value::InetService(port),
        ];
        plan.elements.push(ElementPlan {
            set: SharedSet::new(SharedKind::ServiceIps, Family::V4),
            element: Element::new(Tuple(service.to_vec()))
                .with_verdict(Verdict::goto(map.dispatch_chain_name())),
        });
        for i in 0..endpoints {
            let host = if port == 53 && i == 0 {
                moved
            } else {
                u8::try_from(i).expect("small")
            };
            let mut key = service.to_vec();
            key.push(Value::Integer32(u32::from(i)));
            plan.elements.push(ElementPlan {
                set: map,
                element: Element::new(Tuple(key)).with_value(Tuple(vec![
                    Value::Ipv4([10, 244, 1, host].into()),
                    Value::InetService(8080),
                ])),
            });
        }
    }
    plan
}

/// The endpoints of ports that dispatch by count are kept as runs too: the port's address,
/// protocol and port once, then a digest per chunk. A changed endpoint replaces its chunk
/// only, and a new count every element.
#[test]
fn port_runs_are_recorded_by_chunk_and_read_back_with_their_keys() {
    let old = by_count(10, 0);
    let bytes = Footprint::encode(&old, old.digest());
    let footprint = Footprint(&bytes);
    // Two ports: about 30 bytes each for 10 endpoints and 12 for its dispatch entry, not
    // 10 bytes an endpoint.
    assert!(footprint.len() < 110, "{} bytes", footprint.len());
    let same = footprint.previous_plan(&old).expect("readable");
    assert_eq!(same.elements.len(), old.elements.len());
    assert!(
        old.elements
            .iter()
            .all(|element| same.elements.contains(element))
    );

    let new = by_count(10, 99);
    let previous = footprint.previous_plan(&new).expect("readable");
    let changed: Vec<&ElementPlan> = previous
        .elements
        .iter()
        .filter(|element| !new.elements.contains(element))
        .collect();
    // The chunk of the moved endpoint, key-only: deleted and added again.
    assert_eq!(changed.len(), 4, "{changed:#?}");
    assert!(changed.iter().all(|element| element.element.data.is_none()
        && element.element.key.0[1] == Value::UDP));
    let keys = |plan: &ServicePlan| -> Vec<String> {
        let mut keys: Vec<String> = plan
            .elements
            .iter()
            .map(|e| e.element.key.to_string())
            .collect();
        keys.sort();
        keys
    };
    assert_eq!(keys(&previous), keys(&old));

    let fewer = by_count(9, 0);
    let previous = footprint.previous_plan(&fewer).expect("readable");
    assert_eq!(keys(&previous), keys(&old));
    assert!(
        previous
            .elements
            .iter()
            .filter(|element| element.set.kind == SharedKind::PortEndpoints)
            .all(|element| !fewer.elements.contains(element))
    );
    assert_eq!(
        footprint.shared_elements().expect("readable").len(),
        2,
        "the dispatch entries only"
    );
}

#[test]
fn a_truncated_record_is_rejected() {
    let bytes = Footprint::encode(&dispatched(3, 8), 1);
    let truncated = Footprint(&bytes[..bytes.len() - 3]);
    assert!(
        truncated
            .previous_plan(&ServicePlan::empty("default", "web"))
            .is_none()
    );
    assert!(truncated.shared_elements().is_none());
}

#[test]
fn names_cost_what_follows_the_service_name() {
    let footprint = |namespace: &str| {
        let mut plan = ServicePlan::empty(namespace, "web");
        let path = format!("{namespace}/web/ipv4/tcp/http");
        plan.chains.push(ChainPlan {
            chain: Chain::regular(crate::plan::join_name("service", &path)),
            rules: vec![RulePlan::new([Stmt::Verdict(Verdict::Accept)])],
        });
        let bytes = Footprint::encode(&plan, 1);
        let read = Footprint(&bytes).previous_plan(&plan).expect("readable");
        assert_eq!(read.chains, plan.chains, "read back against its own name");
        bytes.len()
    };
    assert_eq!(footprint("a"), footprint(&"long-namespace-".repeat(4)));
}

#[test]
fn the_shared_elements_are_read_without_the_service() {
    let old = dispatched(6, 8);
    let bytes = Footprint::encode(&old, 1);
    let elements = Footprint(&bytes).shared_elements().expect("readable");
    let keys: Vec<(SharedSet, &Tuple)> = elements.iter().map(|e| (e.set, &e.element.key)).collect();
    // The two elements outside the endpoint run, by key.
    let expected: Vec<(SharedSet, &Tuple)> = old
        .elements
        .iter()
        .filter(|e| e.set.kind != SharedKind::Endpoints)
        .map(|e| (e.set, &e.element.key))
        .collect();
    assert_eq!(keys, expected);
    assert!(elements.iter().all(|e| e.element.data.is_none()));
}

#[test]
fn the_records_keep_every_footprint_through_replacements_and_packing() {
    let mut records = Footprints::default();
    let footprint = |i: u32| {
        Footprint::encode(
            &dispatched(u8::try_from(i % 9).expect("small"), i * 16),
            u64::from(i),
        )
    };
    for i in 0..2000_u32 {
        records.insert(u64::from(i), &footprint(i)).expect("room");
    }
    let full = records.heap_bytes();
    // The arena grows by an eighth, not by doubling, and holds each footprint after its
    // key and length (a varint of one or two bytes); the index takes at most two slots of
    // 5 bytes a service.
    let written: usize = (0..2000_u32).map(|i| footprint(i).len() + 8 + 2).sum();
    assert!(
        full <= written * 9 / 8 + 4096 + 2000 * 2 * 5 + 16,
        "{full} bytes held for {written} bytes of footprints"
    );
    // Replace every other one many times over: the garbage is packed away as it grows.
    for round in 1..20 {
        for i in (0..2000_u32).step_by(2) {
            records
                .insert(u64::from(i), &footprint(i + round))
                .expect("room");
        }
    }
    for i in (1..2000_u32).step_by(4) {
        records.remove(u64::from(i));
    }
    assert_eq!(records.len(), 2000 - 500);
    for i in 0..2000_u32 {
        let now = records
            .get(u64::from(i))
            .map(|footprint| footprint.0.to_vec());
        let expected = match i {
            i if i % 2 == 0 => Some(footprint(i + 19).to_vec()),
            i if i % 4 == 1 => None,
            i => Some(footprint(i).to_vec()),
        };
        assert_eq!(now, expected, "service {i}");
    }
    assert!(
        records.heap_bytes() < full * 3 / 2,
        "{} bytes held, {full} before the churn",
        records.heap_bytes()
    );
    records.clear();
    assert_eq!(records.len(), 0);
    assert!(records.get(0).is_none());
}

/// A service of two ports as the planner makes it: a dispatch chain per port with its key
/// block, each port's service-IP element a goto to its chain, the cluster IP, and
/// `endpoints` endpoint elements per port.
fn two_ports(endpoints: u8) -> ServicePlan {
    let mut plan = two_ports_sharing_a_chain(endpoints);
    let shared = plan.chains.remove(0);
    for (index, label) in ["tcp/http", "udp/dns"].into_iter().enumerate() {
        let chain = crate::plan::join_name("service", &format!("shop/cart/ipv4/{label}"));
        plan.chains.push(ChainPlan {
            chain: Chain::regular(chain.clone()),
            rules: vec![shared.rules[index].clone()],
        });
        plan.blocks[index].chain = crate::plan::fnv1a(&chain);
        plan.blocks[index].rule = 0;
        let dispatch = plan
            .elements
            .iter_mut()
            .filter(|element| element.set.kind == SharedKind::ServiceIps)
            .nth(index)
            .expect("a service-IP element per port");
        dispatch.element = dispatch.element.clone().with_verdict(Verdict::goto(chain));
    }
    plan
}

/// The same service with its ports' dispatch rules in one chain of the service.
fn two_ports_sharing_a_chain(endpoints: u8) -> ServicePlan {
    let chain = crate::plan::join_name("service", "shop/cart/ipv4");
    let mut plan = ServicePlan::empty("shop", "cart");
    let ip = Value::Ipv4([10, 96, 0, 28].into());
    plan.elements.push(ElementPlan {
        set: SharedSet::new(SharedKind::ClusterIps, Family::V4),
        element: Element::new(ip),
    });
    plan.chains.push(ChainPlan {
        chain: Chain::regular(chain.clone()),
        rules: Vec::new(),
    });
    for (index, (protocol, port)) in [(Value::TCP, 80), (Value::UDP, 53)].into_iter().enumerate() {
        plan.chains[0].rules.push(RulePlan::new([
            Stmt::Dport(port),
            Stmt::Verdict(Verdict::Accept),
        ]));
        let map = SharedSet::endpoints(Family::V4, 7 + u16::try_from(index).expect("small"));
        plan.blocks.push(KeyBlock {
            map,
            offset: 16,
            class: 4,
            chain: crate::plan::fnv1a(&chain),
            rule: u16::try_from(index).expect("small"),
        });
        plan.elements.push(ElementPlan {
            set: SharedSet::new(SharedKind::ServiceIps, Family::V4),
            element: Element::new(Tuple(vec![ip, protocol, Value::InetService(port)]))
                .with_verdict(Verdict::goto(chain.clone())),
        });
        for i in 0..endpoints {
            plan.elements.push(ElementPlan {
                set: map,
                element: Element::new(Value::Integer32(16 + u32::from(i))).with_value(Tuple(vec![
                    Value::Ipv4([10, 244, 1, i].into()),
                    Value::InetService(port),
                ])),
            });
        }
    }
    plan
}

#[test]
fn a_ports_names_blocks_and_verdicts_cost_a_few_bytes_and_read_back() {
    let old = two_ports(10);
    let bytes = Footprint::encode(&old, old.digest());
    let footprint = Footprint(&bytes);
    // Each port: its name after `ipv4/tcp/` (a number in the tag), its block's chain and
    // its element's verdict by the name's index, the cluster IP written once.
    assert!(bytes.len() < 100, "{} bytes", bytes.len());
    assert_eq!(footprint.blocks("shop", "cart"), old.blocks);
    // With one chain for both ports, one name fewer, and each block keeps its rule.
    let shared = two_ports_sharing_a_chain(10);
    let shared_bytes = Footprint::encode(&shared, shared.digest());
    assert!(shared_bytes.len() < bytes.len(), "{}", shared_bytes.len());
    let shared_footprint = Footprint(&shared_bytes);
    assert_eq!(shared_footprint.blocks("shop", "cart"), shared.blocks);
    let same = shared_footprint.previous_plan(&shared).expect("readable");
    assert_eq!(same.chains, shared.chains);
    let same = footprint.previous_plan(&old).expect("readable");
    assert_eq!(same.chains, old.chains);
    let sorted = |plan: &ServicePlan| {
        let mut elements = plan.elements.clone();
        elements.sort_by_key(|e| format!("{e:?}"));
        elements
    };
    assert_eq!(sorted(&same), sorted(&old));
    // A verdict to another chain, or a jump where it was a goto, is not the one recorded:
    // the element is deleted and re-added.
    let chains: Vec<String> = old.chains.iter().map(|c| c.name().to_string()).collect();
    for verdict in [
        Verdict::goto(chains[1].clone()),
        Verdict::Jump(chains[0].clone()),
    ] {
        let mut new = old.clone();
        let element = new
            .elements
            .iter_mut()
            .find(|e| e.set.kind == SharedKind::ServiceIps)
            .expect("a service IP");
        element.element = element.element.clone().with_verdict(verdict);
        let key = element.element.key.clone();
        let previous = footprint.previous_plan(&new).expect("readable");
        let rebuilt: Vec<&ElementPlan> = previous
            .elements
            .iter()
            .filter(|e| !new.elements.contains(e))
            .collect();
        assert_eq!(rebuilt.len(), 1, "{rebuilt:?}");
        assert_eq!(rebuilt[0].element.data, None);
        assert_eq!(rebuilt[0].element.key, key);
    }
    // Read back without the service: the keys, cluster IP included in each.
    let shared = footprint.shared_elements().expect("readable");
    let keys: Vec<&Tuple> = shared.iter().map(|e| &e.element.key).collect();
    let expected: Vec<&Tuple> = old
        .elements
        .iter()
        .filter(|e| e.set.kind != SharedKind::Endpoints)
        .map(|e| &e.element.key)
        .collect();
    assert_eq!(keys, expected);
}
