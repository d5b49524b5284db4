//! Planning rules, each test named for the checklist item it covers
//! (`proxy/CHECKLIST.md`). Views are built from wire JSON, as the watch delivers it.

use serde_json::{Value as Json, json};

use super::*;
use crate::nft::{Element, Value};
use nodus_testbed::fixtures;
use nodus_view::model::{Family, Protocol};
use nodus_view::{Update, View};

const NODE: &str = "node-a";

fn node(name: &str, addresses: Json, pod_cidrs: Json) -> Update {
    let node = fixtures::node(name, addresses, pod_cidrs);
    Update::Node(serde_json::from_value(node).expect("test node"))
}

/// This node: primary IPs 192.168.0.10 and fd00:c::10 (plus an ExternalIP that is not
/// primary), pods in 10.244.1.0/24 and fd00:244:1::/64.
fn this_node() -> Update {
    node(
        NODE,
        json!([
            {"type": "ExternalIP", "address": "203.0.113.1"},
            {"type": "InternalIP", "address": "192.168.0.10"},
            {"type": "InternalIP", "address": "fd00:c::10"}
        ]),
        json!(["10.244.1.0/24", "fd00:244:1::/64"]),
    )
}

/// A service `default/<name>` with `spec` merged over a one-port ClusterIP spec.
fn service(name: &str, spec: Json, status: Json) -> Update {
    let full = fixtures::merged(
        json!({"clusterIP": "10.96.0.10", "ports": fixtures::http(80)}),
        spec,
    );
    let service = fixtures::with_status(fixtures::service("default", name, full), status);
    Update::Service(serde_json::from_value(service).expect("test service"))
}

/// A ServiceCIDR named `name` holding `cidrs`.
fn service_cidr(name: &str, cidrs: Json) -> Update {
    Update::ServiceCidr(
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"cidrs": cidrs}}))
            .expect("test service cidr"),
    )
}

/// An endpoint: address, node, ready.
type Ep<'a> = (&'a str, &'a str, bool);

fn slice(service: &str, name: &str, family: &str, endpoints: &[Ep<'_>], ports: Json) -> Update {
    let endpoints = endpoints
        .iter()
        .map(|(ip, node, ready)| fixtures::endpoint(ip, node, fixtures::conditions(*ready)))
        .collect();
    let slice = fixtures::slice("default", name, service, family, endpoints, ports);
    Update::EndpointSlice(serde_json::from_value(slice).expect("test slice"))
}

fn http_slice(service: &str, endpoints: &[Ep<'_>]) -> Update {
    slice(
        service,
        &format!("{service}-v4"),
        "IPv4",
        endpoints,
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
    )
}

/// The ruleset as [`super::render`] writes it, without the digests that the first rule of
/// each chain carries in a comment, which these tests of rules do not name.
fn render(skeleton: &Skeleton, services: impl IntoIterator<Item = ServicePlan>) -> String {
    let text = super::render(skeleton, services);
    let mut bare = String::with_capacity(text.len());
    for line in text.lines() {
        bare.push_str(line.split(" comment \"nodus chain ").next().unwrap_or(line));
        bare.push('\n');
    }
    bare
}

fn view(updates: impl IntoIterator<Item = Update>) -> View {
    let mut view = View::new(NODE);
    let report = view.apply(updates);
    assert!(report.invalid.is_empty(), "{:?}", report.invalid);
    view
}

fn plan_with(view: &View, config: &ProxySettings, name: &str) -> ServicePlan {
    Planner::new(view, config).service("default", name, &mut EndpointKeys::new().lease(&[]))
}

fn plan(view: &View, name: &str) -> ServicePlan {
    plan_with(view, &ProxySettings::default(), name)
}

/// The data of the element with key `key` in `kind`/`family`, as nft prints it
/// (`goto service-…`, `drop`), or "" for a set element.
fn element(plan: &ServicePlan, kind: SharedKind, family: Family, key: &str) -> Option<String> {
    plan.elements_in(SharedSet::new(kind, family))
        .find(|element| element.key.to_string() == key)
        .map(|element| {
            element
                .data
                .as_ref()
                .map_or_else(String::new, ToString::to_string)
        })
}

fn v4(plan: &ServicePlan, kind: SharedKind, key: &str) -> Option<String> {
    element(plan, kind, Family::V4, key)
}

/// The rules, as nft text, of the one chain whose name starts with `prefix`.
fn rules(plan: &ServicePlan, prefix: &str) -> Vec<String> {
    let chains: Vec<&ChainPlan> = plan
        .chains
        .iter()
        .filter(|chain| chain.name().starts_with(prefix))
        .collect();
    assert_eq!(chains.len(), 1, "one chain {prefix}… in {:#?}", plan.chains);
    chains[0].rules.iter().map(ToString::to_string).collect()
}

/// The rules of the skeleton's chain `name`, as nft prints them.
fn skeleton_rules(view: &View, config: &ProxySettings, name: &str) -> Vec<String> {
    let skeleton = Planner::new(view, config).skeleton();
    let chain = skeleton.chains.iter().find(|chain| chain.name() == name);
    let chain = chain.unwrap_or_else(|| panic!("no chain {name} in {skeleton:#?}"));
    chain.rules.iter().map(ToString::to_string).collect()
}

/// The endpoints the dispatch chain `chain` DNATs to, keyed from 0 within its block.
fn endpoint_map(plan: &ServicePlan, chain: &str) -> Vec<String> {
    let rule = plan
        .chains
        .iter()
        .find(|c| c.name() == chain)
        .and_then(|c| c.rules.last())
        .unwrap_or_else(|| panic!("chain {chain} in {:#?}", plan.chains));
    let Some(Stmt::DnatFromMap {
        map,
        endpoints,
        offset,
        ..
    }) = rule.0.last()
    else {
        panic!("{rule} DNATs from no map");
    };
    let mut keyed: Vec<(u32, String)> = plan
        .elements
        .iter()
        .filter(|element| element.set.name() == *map)
        .filter_map(|element| match element.element.key.0[..] {
            [Value::Integer32(key)] if (*offset..offset + endpoints).contains(&key) => {
                let data = element.element.data.as_ref().map(ToString::to_string)?;
                Some((key - offset, data))
            }
            _ => None,
        })
        .collect();
    keyed.sort();
    keyed
        .into_iter()
        .map(|(key, data)| format!("{key} : {data}"))
        .collect()
}

/// The elements of `map`, as nft prints them, in key order.
fn port_endpoints(plan: &ServicePlan, map: SharedSet) -> Vec<String> {
    let mut elements: Vec<String> = plan.elements_in(map).map(ToString::to_string).collect();
    elements.sort();
    elements
}

/// The DNAT of `chain` to its `endpoints`, in the first block of its endpoint map.
fn dnat_from(chain: &str, family: Family, endpoints: usize) -> String {
    let map = SharedSet::endpoints(family, keys::shard_of(chain)).name();
    let h = if family == Family::V4 { "ip" } else { "ip6" };
    format!("meta l4proto tcp dnat {h} addr . port to numgen random mod {endpoints} map @{map}")
}

fn chain_named(plan: &ServicePlan, prefix: &str) -> String {
    let chain = plan
        .chains
        .iter()
        .find(|chain| chain.name().starts_with(prefix))
        .unwrap_or_else(|| panic!("no chain {prefix}… in {:#?}", plan.chains));
    chain.name().to_string()
}

fn count_chains(plan: &ServicePlan, prefix: &str) -> usize {
    plan.chains
        .iter()
        .filter(|chain| chain.name().starts_with(prefix))
        .count()
}

/// `default/kube-dns` is the cluster DNS, answered by this node's listener on port 5353.
fn local_dns_config() -> ProxySettings {
    ProxySettings {
        local_dns: Some(LocalDns {
            namespace: "default".into(),
            name: "kube-dns".into(),
            port: 5353,
        }),
        ..ProxySettings::default()
    }
}

fn two_endpoints() -> [Ep<'static>; 2] {
    [("10.244.1.5", NODE, true), ("10.244.2.9", "node-b", true)]
}

#[test]
fn a1_services_of_another_proxy_or_labelled_headless_are_skipped() {
    let label_proxy_name = |labels: &mut nodus_view::wire::Labels| {
        labels.service_proxy_name = Some("other".into());
    };
    let label_headless = |labels: &mut nodus_view::wire::Labels| labels.headless = true;
    for label in [
        &label_proxy_name as &dyn Fn(&mut nodus_view::wire::Labels),
        &label_headless,
    ] {
        let mut labelled = service("web", json!({}), json!({}));
        if let Update::Service(svc) = &mut labelled {
            label(&mut svc.metadata.labels);
        }
        let view = view([this_node(), labelled, http_slice("web", &two_endpoints())]);
        assert!(plan(&view, "web").is_empty());
        assert_eq!(
            Planner::new(&view, &ProxySettings::default())
                .services(&mut EndpointKeys::new())
                .count(),
            0
        );
    }
}

#[test]
fn a2_headless_and_external_name_services_produce_nothing() {
    let view = view([
        this_node(),
        service("headless", json!({"clusterIP": "None"}), json!({})),
        http_slice("headless", &two_endpoints()),
        service(
            "alias",
            json!({"type": "ExternalName", "externalName": "example.com", "clusterIP": ""}),
            json!({}),
        ),
    ]);
    assert!(plan(&view, "headless").is_empty());
    assert!(plan(&view, "alias").is_empty());
    assert!(plan(&view, "missing").is_empty());
}

#[test]
fn c21_cluster_ip_picks_a_random_endpoint_and_dnats() {
    let view = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    // A ClusterIP-only port has no chain of its own: its entry goes to the shared chain of
    // its endpoint count, which draws from the map of that count by the packet's address
    // and port.
    assert!(plan.chains.is_empty(), "{:#?}", plan.chains);
    assert!(plan.blocks.is_empty());
    assert_eq!(
        v4(&plan, SharedKind::ServiceIps, "10.96.0.10 . tcp . 80"),
        Some("goto dispatch-v4-n2-1f".to_string())
    );
    let map = keys::port_map("10.96.0.10".parse().expect("ip"), Protocol::Tcp, 80, 2);
    assert_eq!(map, SharedSet::port_endpoints(Family::V4, 2, 0x1f));
    assert_eq!(map.name(), "endpoints-v4-n2-1f");
    assert_eq!(SharedSet::endpoints_from_name(&map.name()), Some(map));
    assert_eq!(plan.endpoint_maps(), [map]);
    let dispatch = map.dispatch_chain().expect("a dispatch chain");
    assert_eq!(dispatch.name(), "dispatch-v4-n2-1f");
    let dnat = |protocol: &str| {
        format!(
            "meta l4proto {protocol} dnat ip addr . port to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints-v4-n2-1f"
        )
    };
    let dispatch_rules: Vec<String> = dispatch.rules.iter().map(ToString::to_string).collect();
    assert_eq!(dispatch_rules, [dnat("tcp"), dnat("udp")]);
    assert_eq!(
        port_endpoints(&plan, map),
        [
            "10.96.0.10 . tcp . 80 . 0 : 10.244.1.5 . 8080",
            "10.96.0.10 . tcp . 80 . 1 : 10.244.2.9 . 8080"
        ]
    );
    assert_eq!(count_chains(&plan, "endpoint-"), 0);
    assert!(
        v4(
            &plan,
            SharedKind::NoEndpointServices,
            "10.96.0.10 . tcp . 80"
        )
        .is_none()
    );
}

/// Ports that another chain must see first keep a dispatch chain of their own: a NodePort,
/// an ExternalIP, an LB IP, `internalTrafficPolicy: Local`, affinity. A Service whose ports
/// differ in endpoint count puts each in the map of its own count.
#[test]
fn c21_only_cluster_ip_ports_dispatch_by_endpoint_count() {
    let two_ports = json!([
        {"name": "http", "port": 80, "protocol": "TCP"},
        {"name": "dns", "port": 53, "protocol": "UDP"}
    ]);
    let kept = [
        json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
        json!({"externalIPs": ["203.0.113.9"]}),
        json!({"internalTrafficPolicy": "Local"}),
        json!({"sessionAffinity": "ClientIP"}),
    ];
    for spec in kept {
        let view = view([
            this_node(),
            service("web", spec.clone(), json!({})),
            http_slice("web", &two_endpoints()),
        ]);
        let plan = plan(&view, "web");
        assert!(
            plan.elements
                .iter()
                .all(|element| element.set.kind != SharedKind::PortEndpoints),
            "{spec}: {:#?}",
            plan.elements
        );
        assert!(!plan.chains.is_empty(), "{spec}");
    }
    let view = view([
        this_node(),
        service("web", json!({"ports": two_ports}), json!({})),
        http_slice("web", &two_endpoints()),
        slice(
            "web",
            "web-dns",
            "IPv4",
            &[("10.244.1.7", NODE, true)],
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
        ),
    ]);
    let plan = plan(&view, "web");
    assert!(plan.chains.is_empty(), "{:#?}", plan.chains);
    assert_eq!(
        v4(&plan, SharedKind::ServiceIps, "10.96.0.10 . udp . 53"),
        Some("goto dispatch-v4-n1-2f".to_string())
    );
    assert_eq!(
        port_endpoints(&plan, SharedSet::port_endpoints(Family::V4, 1, 0x2f)),
        ["10.96.0.10 . udp . 53 . 0 : 10.244.1.7 . 5353"]
    );
    assert_eq!(
        port_endpoints(&plan, SharedSet::port_endpoints(Family::V4, 2, 0x1f)).len(),
        2
    );
}

/// A slice labelled `service.kubernetes.io/headless` is no proxy's, though its service
/// has a cluster IP: with only that slice the service has no endpoints and rejects (the
/// upstream e2e spec "Services should implement service.kubernetes.io/headless" labels
/// the slice of a running service and waits for it to go down).
#[test]
fn a1_a_slice_labelled_headless_gives_no_endpoints() {
    let mut labelled = http_slice("web", &two_endpoints());
    if let Update::EndpointSlice(slice) = &mut labelled {
        slice.metadata.labels.headless = true;
    }
    let view = view([this_node(), service("web", json!({}), json!({})), labelled]);
    assert_rejects(&plan(&view, "web"));
}

#[test]
fn c23_no_endpoints_rejects() {
    let view = view([this_node(), service("web", json!({}), json!({}))]);
    assert_rejects(&plan(&view, "web"));
}

/// C.23: `web`'s plan sends its port to the reject chain, with no endpoint chain.
fn assert_rejects(plan: &ServicePlan) {
    assert_eq!(
        v4(
            plan,
            SharedKind::NoEndpointServices,
            "10.96.0.10 . tcp . 80"
        )
        .as_deref(),
        Some("goto reject-chain")
    );
    assert!(v4(plan, SharedKind::ServiceIps, "10.96.0.10 . tcp . 80").is_none());
    assert!(plan.chains.is_empty());
}

#[test]
fn c24_active_cluster_ips_reject_undefined_ports() {
    let view = view([this_node(), service("web", json!({}), json!({}))]);
    assert_eq!(
        v4(&plan(&view, "web"), SharedKind::ClusterIps, "10.96.0.10").as_deref(),
        Some("")
    );
    let skeleton = Planner::new(&view, &ProxySettings::default()).skeleton();
    let text = render(&skeleton, []);
    assert!(text.contains("ip daddr @cluster-ips-v4 reject with icmpx port-unreachable"));
    assert!(
        text.contains("chain filter-output-post-dnat {\n\t\ttype filter hook output priority -90;")
    );
}

#[test]
fn c25_unallocated_addresses_of_service_cidrs_are_dropped() {
    let without = view([this_node(), service("web", json!({}), json!({}))]);
    let text = render(
        &Planner::new(&without, &ProxySettings::default()).skeleton(),
        [],
    );
    assert!(
        !text.contains("drop\n\t\tip6 daddr @cluster-ips-v6"),
        "{text}"
    );
    let with = view([
        this_node(),
        service("web", json!({}), json!({})),
        service_cidr("kubernetes", json!(["10.96.0.0/16", "fd00:96::/112"])),
        service_cidr("extra", json!(["10.97.0.0/16"])),
    ]);
    let planner = Planner::new(&with, &ProxySettings::default());
    let text = render(&planner.skeleton(), []);
    // After the reject of undefined ports: an allocated address is not dropped.
    assert!(
        text.contains(
            "\t\tip daddr @cluster-ips-v4 reject with icmpx port-unreachable\n\
             \t\tip daddr { 10.96.0.0-10.97.255.255 } drop\n\
             \t\tip6 daddr @cluster-ips-v6 reject with icmpx port-unreachable\n\
             \t\tip6 daddr { fd00:96::-fd00:96::ffff } drop\n"
        ),
        "{text}"
    );
    // Only the skeleton reads them: a change needs no full sync.
    let before = Planner::new(&without, &ProxySettings::default())
        .facts()
        .clone();
    assert!(before.differs_only_in_skeleton(planner.facts()));
}

#[test]
fn b19_internal_local_without_local_endpoints_drops() {
    let spec = json!({"internalTrafficPolicy": "Local"});
    let remote_only = view([
        this_node(),
        service("web", spec.clone(), json!({})),
        http_slice("web", &[("10.244.2.9", "node-b", true)]),
    ]);
    let plan_remote = plan(&remote_only, "web");
    assert_eq!(
        v4(
            &plan_remote,
            SharedKind::NoEndpointServices,
            "10.96.0.10 . tcp . 80"
        )
        .as_deref(),
        Some("drop")
    );
    assert!(plan_remote.chains.is_empty());

    let with_local = view([
        this_node(),
        service("web", spec, json!({})),
        http_slice("web", &two_endpoints()),
    ]);
    let plan_local = plan(&with_local, "web");
    let local_chain = chain_named(&plan_local, "local-");
    assert_eq!(
        v4(&plan_local, SharedKind::ServiceIps, "10.96.0.10 . tcp . 80"),
        Some(format!("goto {local_chain}"))
    );
    // Off-cluster sources are marked for masquerade before the dispatch, as for
    // `service-` (d28_d29_…), so the chain only dispatches.
    assert_eq!(
        rules(&plan_local, "local-"),
        [dnat_from(&local_chain, Family::V4, 1)]
    );
    assert_eq!(
        endpoint_map(&plan_local, &local_chain),
        ["0 : 10.244.1.5 . 8080"],
        "only the local endpoint"
    );
    assert_eq!(count_chains(&plan_local, "service-"), 0);
}

#[test]
fn d27_hairpin_traffic_is_masqueraded() {
    let view = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    // The local endpoint, back to itself through the ClusterIP; the remote endpoint
    // cannot be a client on this node.
    let hairpin: Vec<&Element> = plan
        .elements_in(SharedSet::new(SharedKind::Hairpin, Family::V4))
        .collect();
    assert_eq!(hairpin.len(), 1, "{hairpin:?}");
    assert_eq!(
        hairpin[0].to_string(),
        "10.244.1.5 . 10.244.1.5 . 10.96.0.10"
    );
    let skeleton = Planner::new(&view, &ProxySettings::default()).skeleton();
    let masquerading = render(&skeleton, []);
    assert!(masquerading.contains(
        "\t\tip saddr . ip daddr . ct original ip daddr @hairpin-v4 \
         meta mark set meta mark | 0x00004000\n"
    ));
}

#[test]
fn d27_hairpin_covers_external_addresses_under_the_local_policy() {
    let spec = |policy: &str| {
        json!({"type": "NodePort", "externalIPs": ["192.0.2.7"], "externalTrafficPolicy": policy,
               "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                          "nodePort": 30080, "protocol": "TCP"}]})
    };
    let hairpin = |policy: &str| {
        let view = view([
            this_node(),
            service("web", spec(policy), json!({})),
            http_slice("web", &two_endpoints()),
        ]);
        let mut hairpin: Vec<String> = plan(&view, "web")
            .elements_in(SharedSet::new(SharedKind::Hairpin, Family::V4))
            .map(ToString::to_string)
            .collect();
        hairpin.sort();
        hairpin
    };
    // Under Cluster, external traffic is masqueraded on entry.
    assert_eq!(hairpin("Cluster"), ["10.244.1.5 . 10.244.1.5 . 10.96.0.10"]);
    assert_eq!(
        hairpin("Local"),
        [
            "10.244.1.5 . 10.244.1.5 . 10.96.0.10",
            "10.244.1.5 . 10.244.1.5 . 192.0.2.7",
            "10.244.1.5 . 10.244.1.5 . 192.168.0.10",
        ]
    );
}

#[test]
fn d28_d29_off_cluster_traffic_to_cluster_ips_is_masqueraded() {
    let updates = || {
        [
            service("web", json!({}), json!({})),
            http_slice("web", &two_endpoints()),
        ]
    };
    let detected = view(std::iter::once(this_node()).chain(updates()));
    let default = ProxySettings::default();
    // One rule for every ClusterIP, ahead of the dispatch; the service has no chain of
    // its own, and the shared chain it dispatches through only DNATs. External addresses are not ClusterIPs, so eTP=Local traffic that shares
    // a `local-` chain is not marked.
    let masquerade = "ip daddr @cluster-ips-v4 ip saddr != @pod-cidrs-v4 jump mark-for-masquerade";
    let services = skeleton_rules(&detected, &default, "services");
    assert_eq!(services[0], masquerade, "{services:#?}");
    assert_eq!(
        services[1],
        "ip daddr . meta l4proto . th dport vmap @service-ips-v4"
    );
    assert!(plan(&detected, "web").chains.is_empty());
    let all = ProxySettings {
        masquerade_all: true,
        ..ProxySettings::default()
    };
    assert_eq!(
        skeleton_rules(&detected, &all, "services")[0],
        "ip daddr @cluster-ips-v4 jump mark-for-masquerade"
    );
    // No pod CIDRs known: no detector, so no rule (and no short-circuit, F.45).
    let undetected = view(std::iter::once(node(NODE, json!([]), json!([]))).chain(updates()));
    let services = skeleton_rules(&undetected, &default, "services");
    assert!(
        !services
            .iter()
            .any(|rule| rule.contains("mark-for-masquerade")),
        "{services:#?}"
    );
    // Configured cluster CIDRs replace the node's.
    let configured = ProxySettings {
        cluster_cidrs: vec!["10.244.0.0/16".parse().expect("cidr")],
        ..ProxySettings::default()
    };
    let skeleton = Planner::new(&undetected, &configured).skeleton();
    assert!(
        render(&skeleton, []).contains("elements = { 10.244.0.0-10.244.255.255 }"),
        "{}",
        render(&skeleton, [])
    );
}

#[test]
fn d30_masquerading_uses_the_mark_bit() {
    let view = view([this_node()]);
    let config = ProxySettings {
        masquerade_mark: 0x8000,
        ..ProxySettings::default()
    };
    let text = render(&Planner::new(&view, &config).skeleton(), []);
    for line in [
        "meta mark set meta mark | 0x00008000",
        "meta mark & 0x00008000 == 0x00000000 return",
        "meta mark set meta mark ^ 0x00008000",
        "masquerade fully-random",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

fn node_port_service(spec: Json) -> Update {
    let mut full = json!({
        "type": "NodePort",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]
    });
    if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        full.extend(extra.clone());
    }
    service("web", full, json!({}))
}

#[test]
fn d31_e33_node_port_under_cluster_policy_is_masqueraded() {
    let view = view([
        this_node(),
        node_port_service(json!({})),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    let external = chain_named(&plan, "external-");
    assert_eq!(
        v4(&plan, SharedKind::ServiceNodeports, "tcp . 30080"),
        Some(format!("goto {external}"))
    );
    assert_eq!(
        rules(&plan, "external-"),
        [
            "jump mark-for-masquerade".to_string(),
            format!("goto {}", chain_named(&plan, "service-"))
        ]
    );
}

#[test]
fn e34_e35_node_ports_are_served_on_primary_ips_only() {
    let view = view([this_node()]);
    let skeleton = Planner::new(&view, &ProxySettings::default()).skeleton();
    let text = render(&skeleton, []);
    assert!(
        text.contains("set nodeport-ips-v4 {\n\t\ttype ipv4_addr\n\t\telements = { 192.168.0.10 }")
    );
    assert!(text.contains("elements = { fd00:c::10 }"));
    assert!(!text.contains("203.0.113.1"), "not the ExternalIP");
    assert!(
        text.contains(
            "ip daddr @nodeport-ips-v4 meta l4proto . th dport vmap @service-nodeports-v4"
        )
    );
}

#[test]
fn e36_node_port_without_endpoints_rejects() {
    let view = view([this_node(), node_port_service(json!({}))]);
    let plan = plan(&view, "web");
    assert_eq!(
        v4(&plan, SharedKind::NoEndpointNodeports, "tcp . 30080").as_deref(),
        Some("goto reject-chain")
    );
    assert!(v4(&plan, SharedKind::ServiceNodeports, "tcp . 30080").is_none());
}

#[test]
fn e37_f45_local_node_port_without_local_endpoints_drops_but_pods_short_circuit() {
    let view = view([
        this_node(),
        node_port_service(json!({"externalTrafficPolicy": "Local"})),
        http_slice("web", &[("10.244.2.9", "node-b", true)]),
    ]);
    let plan = plan(&view, "web");
    assert_eq!(
        v4(&plan, SharedKind::NoEndpointNodeports, "tcp . 30080").as_deref(),
        Some("drop")
    );
    let external = chain_named(&plan, "external-");
    assert_eq!(
        v4(&plan, SharedKind::ServiceNodeports, "tcp . 30080"),
        Some(format!("goto {external}")),
        "pods and the host still reach the cluster set"
    );
    let service = chain_named(&plan, "service-");
    assert_eq!(
        rules(&plan, "external-"),
        [
            format!("ip saddr @pod-cidrs-v4 goto {service}"),
            "fib saddr type local jump mark-for-masquerade".to_string(),
            format!("fib saddr type local goto {service}"),
        ]
    );
    assert_eq!(count_chains(&plan, "local-"), 0);
}

#[test]
fn f45_local_policy_keeps_the_source_and_goes_to_local_endpoints() {
    let view = view([
        this_node(),
        node_port_service(json!({"externalTrafficPolicy": "Local"})),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    let external = rules(&plan, "external-");
    assert_eq!(external.len(), 4, "{external:?}");
    assert_eq!(
        external[3],
        format!("goto {}", chain_named(&plan, "local-"))
    );
    assert!(!external.contains(&"jump mark-for-masquerade".to_string()));
    assert_eq!(
        v4(&plan, SharedKind::ServiceIps, "10.96.0.10 . tcp . 80"),
        Some(format!("goto {}", chain_named(&plan, "service-"))),
        "ClusterIP traffic keeps the Cluster policy"
    );
}

#[test]
fn f40_external_ips_dispatch_to_the_external_chain() {
    let view = view([
        this_node(),
        service(
            "web",
            json!({"externalIPs": ["203.0.113.9", "2001:db8::9"]}),
            json!({}),
        ),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    assert_eq!(
        v4(&plan, SharedKind::ServiceIps, "203.0.113.9 . tcp . 80"),
        Some(format!("goto {}", chain_named(&plan, "external-")))
    );
    assert!(
        plan.elements.iter().all(|e| e.set.family == Family::V4),
        "the service has no IPv6 ClusterIP, so no IPv6 entries"
    );
}

/// F.40: of two Services claiming one external address and port, the older owns it; the
/// younger keeps its other ports on that address, and an address only the younger one
/// claims on another port; `ipMode: Proxy` LB IPs claim nothing.
#[test]
fn f40_a_contested_external_address_and_port_goes_to_the_older_service() {
    let claim = |name: &str, created: &str, spec: Json, ingress: Json| {
        let mut update = service(name, spec, json!({"loadBalancer": {"ingress": ingress}}));
        if let Update::Service(wire) = &mut update {
            wire.metadata.creation_timestamp = Some(created.parse().expect("seconds"));
        }
        update
    };
    let view = view([
        this_node(),
        claim(
            "older",
            "1000",
            json!({"clusterIP": "10.96.0.20", "externalIPs": ["203.0.113.9"]}),
            json!([{"ip": "198.51.100.7", "ipMode": "Proxy"}]),
        ),
        http_slice("older", &two_endpoints()),
        claim(
            "younger",
            "2000",
            json!({"clusterIP": "10.96.0.21", "type": "LoadBalancer",
                   "externalIPs": ["203.0.113.9"],
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                             {"name": "alt", "port": 81, "protocol": "TCP", "nodePort": 30081}]}),
            json!([{"ip": "198.51.100.7"}]),
        ),
        http_slice("younger", &two_endpoints()),
    ]);
    let older = plan(&view, "older");
    let younger = plan(&view, "younger");
    let dispatch = |plan: &ServicePlan, key: &str| v4(plan, SharedKind::ServiceIps, key);
    assert!(dispatch(&older, "203.0.113.9 . tcp . 80").is_some());
    assert!(older.contested.is_empty());
    assert_eq!(dispatch(&younger, "203.0.113.9 . tcp . 80"), None);
    // Port 81 has no endpoints: rejected, on the address the younger one owns there.
    assert!(
        v4(
            &younger,
            SharedKind::NoEndpointServices,
            "203.0.113.9 . tcp . 81"
        )
        .is_some()
    );
    assert!(dispatch(&younger, "198.51.100.7 . tcp . 80").is_some());
    assert!(dispatch(&younger, "10.96.0.21 . tcp . 80").is_some());
    assert_eq!(
        younger.contested,
        [Contested {
            address: "203.0.113.9".parse().expect("ip"),
            port: 80,
            loss: ClaimLoss::OlderService,
        }]
    );
}

/// A tenant's ExternalIP equal to the cluster DNS Service's ClusterIP, on its port: the
/// ClusterIP keeps its element on every node, whatever order the services come in, and
/// the tenant loses that address alone (its own ClusterIP stays). An ExternalIP inside a
/// ServiceCIDR that no Service holds yet is refused too, so a later ClusterIP finds it
/// free.
#[test]
fn a_cluster_ip_is_never_displaced_by_an_external_ip() {
    let dns = |name: &str| {
        let mut update = service(
            name,
            json!({"clusterIP": "10.96.0.10",
                   "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            json!({}),
        );
        if let Update::Service(wire) = &mut update {
            wire.metadata.namespace = Some("kube-system".into());
        }
        update
    };
    let tenant = |created: &str| {
        let mut update = service(
            "hijack",
            json!({"clusterIP": "10.96.7.7", "externalIPs": ["10.96.0.10", "10.96.200.1"],
                   "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            json!({}),
        );
        if let Update::Service(wire) = &mut update {
            wire.metadata.creation_timestamp = Some(created.parse().expect("seconds"));
        }
        update
    };
    // The tenant's Service older than kube-dns, and younger: the same outcome.
    for created in ["1", "4000000000"] {
        let view = view([
            this_node(),
            service_cidr("kubernetes", json!(["10.96.0.0/16"])),
            dns("kube-dns"),
            tenant(created),
        ]);
        let all = ProxySettings {
            external_ips: None,
            ..ProxySettings::default()
        };
        let hijack = plan_with(&view, &all, "hijack");
        let losses: Vec<(String, ClaimLoss)> = hijack
            .contested
            .iter()
            .map(|c| (c.address.to_string(), c.loss))
            .collect();
        assert_eq!(
            losses,
            [
                ("10.96.0.10".to_string(), ClaimLoss::ClusterIp),
                ("10.96.200.1".to_string(), ClaimLoss::ClusterIp)
            ]
        );
        assert!(
            hijack
                .elements
                .iter()
                .all(|e| !e.element.key.to_string().starts_with("10.96.0.10 ")),
            "{:?}",
            hijack.elements
        );
        let own = v4(
            &hijack,
            SharedKind::NoEndpointServices,
            "10.96.7.7 . udp . 53",
        );
        assert!(own.is_some(), "the tenant keeps its own ClusterIP");
    }
}

/// `proxy.external_ips`: an ExternalIP outside the allowed ranges is not honoured (the
/// service keeps its ClusterIP), one inside is; LB IPs, which only the cloud's controller
/// writes, do not depend on it.
#[test]
fn external_ips_are_honoured_only_inside_the_allowed_ranges() {
    let view = view([
        this_node(),
        service(
            "web",
            json!({"type": "LoadBalancer", "externalIPs": ["203.0.113.9", "198.51.100.3"],
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]}),
            json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.44"}]}}),
        ),
        http_slice("web", &two_endpoints()),
    ]);
    let allowing = |cidrs: &[&str]| ProxySettings {
        external_ips: Some(cidrs.iter().map(|c| c.parse().expect("cidr")).collect()),
        ..ProxySettings::default()
    };
    let dispatch = |plan: &ServicePlan, key: &str| v4(plan, SharedKind::ServiceIps, key);
    let none = plan_with(&view, &allowing(&[]), "web");
    assert_eq!(dispatch(&none, "203.0.113.9 . tcp . 80"), None);
    assert_eq!(dispatch(&none, "198.51.100.3 . tcp . 80"), None);
    assert!(dispatch(&none, "192.0.2.44 . tcp . 80").is_some());
    assert!(dispatch(&none, "10.96.0.10 . tcp . 80").is_some());
    assert!(
        none.contested
            .iter()
            .all(|c| c.loss == ClaimLoss::NotAllowed && c.port == 80)
            && none.contested.len() == 2
    );
    let some = plan_with(&view, &allowing(&["203.0.113.0/24"]), "web");
    assert!(dispatch(&some, "203.0.113.9 . tcp . 80").is_some());
    assert_eq!(dispatch(&some, "198.51.100.3 . tcp . 80"), None);
}

/// Pods' sources are checked before conntrack: a packet from a pod link (by its group)
/// whose source is not routed back through that link is dropped and counted, and so are
/// router advertisements and redirects; without a group, no such chain.
#[test]
fn the_source_of_what_pods_send_is_checked_before_anything_else() {
    let view = view([this_node()]);
    let checked = ProxySettings {
        pod_link_group: Some(0x6e6f_6475),
        ..ProxySettings::default()
    };
    for scope in [TableScope::Services, TableScope::EgressOnly] {
        let config = ProxySettings {
            scope,
            ..checked.clone()
        };
        let text = render(&Planner::new(&view, &config).skeleton(), []);
        let chain = text
            .split("chain pod-source-check {")
            .nth(1)
            .and_then(|rest| rest.split("\n\t}").next())
            .unwrap_or_else(|| panic!("no source check in {scope:?}: {text}"));
        for line in [
            "type filter hook prerouting priority -300; policy accept;",
            "meta iifgroup 0x6e6f6475 icmpv6 type 134 ip6 saddr @pod-router-messages-v6 drop",
            "meta iifgroup 0x6e6f6475 icmpv6 type 137 ip6 saddr @pod-router-messages-v6 drop",
            "meta iifgroup 0x6e6f6475 fib saddr . iif oif missing ip saddr @pod-forged-sources-v4 drop",
            "meta iifgroup 0x6e6f6475 fib saddr . iif oif missing ip6 saddr @pod-forged-sources-v6 drop",
        ] {
            assert!(chain.contains(line), "{line} in {chain}");
        }
        assert!(text.contains("set pod-forged-sources-v4 {"), "{text}");
    }
    let text = render(
        &Planner::new(&view, &ProxySettings::default()).skeleton(),
        [],
    );
    assert!(!text.contains("pod-source-check"), "{text}");
}

fn load_balancer(spec: Json, ingress: Json) -> Update {
    let mut full = json!({
        "type": "LoadBalancer",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]
    });
    if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        full.extend(extra.clone());
    }
    service("web", full, json!({"loadBalancer": {"ingress": ingress}}))
}

#[test]
fn f41_proxy_mode_load_balancer_ips_are_not_captured() {
    let view = view([
        this_node(),
        load_balancer(
            json!({}),
            json!([{"ip": "198.51.100.1"}, {"ip": "198.51.100.2", "ipMode": "Proxy"},
                   {"hostname": "lb.example.com"}]),
        ),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    assert!(v4(&plan, SharedKind::ServiceIps, "198.51.100.1 . tcp . 80").is_some());
    assert!(v4(&plan, SharedKind::ServiceIps, "198.51.100.2 . tcp . 80").is_none());
}

#[test]
fn f42_f43_e38_source_ranges_guard_load_balancer_ips_only() {
    let view = view([
        this_node(),
        load_balancer(
            json!({"loadBalancerSourceRanges": ["192.168.0.0/16", "10.0.0.0/8", "10.1.0.0/16"]}),
            json!([{"ip": "198.51.100.1"}]),
        ),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    let firewall = chain_named(&plan, "firewall-");
    assert_eq!(
        v4(&plan, SharedKind::FirewallIps, "198.51.100.1 . tcp . 80"),
        Some(format!("goto {firewall}"))
    );
    // The node (192.168.0.10) is inside a range, so the LB IP may be a source too.
    assert_eq!(
        rules(&plan, "firewall-"),
        [
            "ip saddr != { 10.0.0.0-10.255.255.255, 192.168.0.0-192.168.255.255, \
          198.51.100.1-198.51.100.1 } drop"
        ]
    );
    assert_eq!(
        plan.elements_in(SharedSet::new(SharedKind::FirewallIps, Family::V4))
            .count(),
        1,
        "not the NodePort, not the ClusterIP"
    );
}

#[test]
fn g48_client_ip_affinity_sticks_per_endpoint() {
    let view = view([
        this_node(),
        service(
            "web",
            json!({"sessionAffinity": "ClientIP",
                   "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}}),
            json!({}),
        ),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    assert_eq!(plan.sets.len(), 2);
    for set in &plan.sets {
        let set = &set.set;
        assert!(set.name.starts_with("affinity-"), "{}", set.name);
        assert!(set.flags.dynamic && set.flags.timeout);
        assert_eq!(set.timeout, Some(std::time::Duration::from_secs(600)));
    }
    let service_rules = rules(&plan, "service-");
    // Two affinity checks, then the random choice.
    assert_eq!(service_rules.len(), 3, "{service_rules:?}");
    assert!(service_rules[0].starts_with("ip saddr @affinity-"));
    assert!(service_rules[0].contains(" goto endpoint-"));
    let endpoint = plan
        .chains
        .iter()
        .find(|chain| chain.name().ends_with("__10.244.1.5/8080"))
        .expect("endpoint chain");
    assert_eq!(
        endpoint.rules[0].to_string(),
        format!("update @{} {{ ip saddr }}", plan.sets[0].set.name)
    );
}

#[test]
fn j57_dual_stack_families_are_planned_independently() {
    let view = view([
        this_node(),
        service(
            "web",
            json!({"clusterIPs": ["10.96.0.10", "fd00:96::10"], "ipFamilyPolicy": "RequireDualStack"}),
            json!({}),
        ),
        http_slice("web", &two_endpoints()),
    ]);
    let v4_only = plan(&view, "web");
    assert!(v4(&v4_only, SharedKind::ServiceIps, "10.96.0.10 . tcp . 80").is_some());
    // Only IPv4 endpoints: the IPv6 ClusterIP rejects.
    assert_eq!(
        element(
            &v4_only,
            SharedKind::NoEndpointServices,
            Family::V6,
            "fd00:96::10 . tcp . 80"
        )
        .as_deref(),
        Some("goto reject-chain")
    );

    let plan = plan(&view_with_v6_endpoint(), "web");
    let v6_map = SharedSet::port_endpoints(Family::V6, 1, 0x12);
    assert_eq!(
        port_endpoints(&plan, v6_map),
        ["fd00:96::10 . tcp . 80 . 0 : fd00:244:1::5 . 8080"]
    );
    assert_eq!(
        element(
            &plan,
            SharedKind::ServiceIps,
            Family::V6,
            "fd00:96::10 . tcp . 80"
        )
        .as_deref(),
        Some("goto dispatch-v6-n1-12")
    );
    let dispatch = v6_map.dispatch_chain().expect("a dispatch chain");
    assert!(
        dispatch.rules[0]
            .to_string()
            .contains("dnat ip6 addr . port to ip6 daddr . meta l4proto . th dport . numgen random mod 1 map @endpoints-v6-n1-12"),
        "{dispatch:?}"
    );
}

fn view_with_v6_endpoint() -> View {
    view([
        this_node(),
        service(
            "web",
            json!({"clusterIPs": ["10.96.0.10", "fd00:96::10"]}),
            json!({}),
        ),
        http_slice("web", &two_endpoints()),
        slice(
            "web",
            "web-v6",
            "IPv6",
            &[("fd00:244:1::5", NODE, true)],
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        ),
    ])
}

#[test]
fn j58_udp_and_sctp_ports_are_keyed_by_protocol() {
    let view = view([
        this_node(),
        service(
            "dns",
            json!({"ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                             {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                             {"name": "sig", "port": 9, "protocol": "SCTP"}]}),
            json!({}),
        ),
        slice(
            "dns",
            "dns-1",
            "IPv4",
            &[("10.244.1.7", NODE, true)],
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"},
                   {"name": "dns-tcp", "port": 5353, "protocol": "TCP"},
                   {"name": "sig", "port": 9999, "protocol": "SCTP"}]),
        ),
    ]);
    let plan = plan(&view, "dns");
    for key in [
        "10.96.0.10 . udp . 53",
        "10.96.0.10 . tcp . 53",
        "10.96.0.10 . sctp . 9",
    ] {
        assert!(v4(&plan, SharedKind::ServiceIps, key).is_some(), "{key}");
    }
    // UDP and TCP dispatch from the map of their endpoint count, keyed by protocol; SCTP
    // keeps the service's dispatch chain, its rule matching its protocol and number.
    // Each in the map of its count that its address, protocol and port hash to.
    let map = |protocol| keys::port_map("10.96.0.10".parse().expect("ip"), protocol, 53, 1);
    assert_eq!(
        port_endpoints(&plan, map(Protocol::Tcp)),
        ["10.96.0.10 . tcp . 53 . 0 : 10.244.1.7 . 5353"]
    );
    assert_eq!(
        port_endpoints(&plan, map(Protocol::Udp)),
        ["10.96.0.10 . udp . 53 . 0 : 10.244.1.7 . 5353"]
    );
    assert_eq!(map(Protocol::Tcp).name(), "endpoints-v4-n1-27");
    let shared = rules(&plan, "service-");
    assert_eq!(shared.len(), 1, "{shared:?}");
    assert!(
        shared[0].starts_with("meta l4proto sctp th dport 9 dnat"),
        "{shared:?}"
    );
    let blocks: Vec<(u16, u32)> = plan.blocks.iter().map(|b| (b.rule, b.offset)).collect();
    assert_eq!(blocks, [(0, 0)]);
    let text = render(
        &Planner::new(&view, &ProxySettings::default()).skeleton(),
        [plan],
    );
    assert!(text.contains("meta l4proto sctp th dport 9 dnat ip addr . port to numgen"));
    assert!(text.contains("0 : 10.244.1.7 . 9999"));
    assert!(text.contains("10.96.0.10 . udp . 53 . 0 : 10.244.1.7 . 5353"));
    assert!(text.contains("chain dispatch-v4-n1-27 {"));
}

/// The plan of `web`, a Service of two TCP ports (80 and 443) with two endpoints, and
/// `spec` merged over its spec.
fn two_port_plan(spec: Json) -> ServicePlan {
    let two_ports = json!([{"name": "http", "port": 80, "protocol": "TCP"},
                           {"name": "https", "port": 443, "protocol": "TCP"}]);
    let slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                             {"name": "https", "port": 8443, "protocol": "TCP"}]);
    let view = view([
        this_node(),
        service(
            "web",
            fixtures::merged(json!({"ports": two_ports}), spec),
            json!({}),
        ),
        slice("web", "web-v4", "IPv4", &two_endpoints(), slice_ports),
    ]);
    plan(&view, "web")
}

/// Ports an external address leads to share their service's dispatch chain. A NodePort
/// reaches the dispatch chain with its own number, not the service port's, and with
/// affinity the chain picks among endpoint chains: both keep a chain per port, as a
/// service of one port keeps its own. ClusterIP-only ports need none.
#[test]
fn ports_keep_their_own_dispatch_chains_with_a_node_port_or_affinity() {
    assert!(two_port_plan(json!({})).chains.is_empty());
    let shared = two_port_plan(json!({"externalIPs": ["192.0.2.7"]}));
    assert_eq!(count_chains(&shared, "service-"), 1);
    assert_eq!(rules(&shared, "service-").len(), 2);
    let node_port = two_port_plan(json!({"type": "NodePort", "ports": [
        {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
        {"name": "https", "port": 443, "protocol": "TCP"}]}));
    // The port without a NodePort needs no chain.
    assert_eq!(count_chains(&node_port, "service-"), 1);
    assert_eq!(
        v4(&node_port, SharedKind::ServiceIps, "10.96.0.10 . tcp . 443"),
        Some("goto dispatch-v4-n2-14".to_string())
    );
    let dispatch = node_port
        .chains
        .iter()
        .filter(|chain| chain.name().starts_with("service-"));
    for chain in dispatch {
        assert_eq!(chain.rules.len(), 1);
        assert!(!chain.rules[0].to_string().contains("dport"), "{chain:?}");
    }
    let affinity = two_port_plan(json!({"sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}));
    assert_eq!(count_chains(&affinity, "service-"), 2);
}

/// `add_service` sends what an update from an empty plan sends, without comparing: for a
/// shared dispatch chain, NodePorts under a Local policy, and affinity with its own sets.
#[test]
fn adding_a_service_is_updating_it_from_nothing() {
    let specs = [
        json!({}),
        json!({"type": "NodePort", "externalTrafficPolicy": "Local", "externalIPs": ["192.0.2.7"],
               "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                         {"name": "https", "port": 443, "protocol": "TCP", "nodePort": 30443}]}),
        json!({"sessionAffinity": "ClientIP",
               "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}),
    ];
    for spec in specs {
        let plan = two_port_plan(spec.clone());
        let mut added = PlanBatch::new();
        added.add_service(&plan);
        let mut updated = PlanBatch::new();
        updated.update_service(&ServicePlan::empty("default", "web"), &plan);
        let (added, updated) = (
            added.into_batch().to_string(),
            updated.into_batch().to_string(),
        );
        assert!(added.contains("add rule"), "{spec}: {added}");
        assert_eq!(added, updated, "{spec}");
    }
}

#[test]
fn digests_follow_the_plan() {
    let before = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice("web", &two_endpoints()),
    ]);
    let after = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice("web", &[("10.244.1.5", NODE, true)]),
    ]);
    assert_eq!(plan(&before, "web").digest(), plan(&before, "web").digest());
    assert_ne!(plan(&before, "web").digest(), plan(&after, "web").digest());
}

#[test]
fn updates_touch_only_what_changed() {
    let before = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice("web", &two_endpoints()),
    ]);
    let after = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice(
            "web",
            &[("10.244.1.5", NODE, true), ("10.244.2.10", "node-b", true)],
        ),
    ]);
    let (old, new) = (plan(&before, "web"), plan(&after, "web"));
    let mut same = PlanBatch::new();
    same.update_service(&old, &old);
    assert!(same.is_empty());

    let map = old.endpoint_maps()[0];
    let mut batch = PlanBatch::assuming_maps(&std::iter::once(map).collect());
    batch.update_service(&old, &new);
    let text = batch.into_batch().to_string();
    let lines: Vec<&str> = text.lines().collect();
    let map = map.name();
    // An endpoint replaced by another: only its element in the map of the port's endpoint
    // count changes. No rule is touched, and the other shared maps' entries did not
    // change either.
    assert_eq!(
        lines,
        [
            format!("delete element from {map}: 10.96.0.10 . tcp . 80 . 1 : 10.244.2.9 . 8080"),
            format!("add element to {map}: 10.96.0.10 . tcp . 80 . 1 : 10.244.2.10 . 8080"),
        ],
        "{text}"
    );

    let mut removal = PlanBatch::new();
    removal.remove_service(&new);
    let text = removal.into_batch().to_string();
    assert!(text.starts_with("delete "), "{text}");
    assert!(text.contains("delete element from service-ips-v4: 10.96.0.10 . tcp . 80"));
}

/// A cold start's three parts: the first leaves the service unreachable and its maps
/// unfilled (only its chains and rules), the second adds its endpoint map elements, the
/// third exactly its elements in the skeleton's shared sets, and together they are what
/// one `add_service` sends.
#[test]
fn an_unentered_service_is_filled_and_entered_by_the_rest_of_its_elements() {
    let view = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    let mut whole = PlanBatch::new();
    whole.add_service(&plan);
    let mut unentered = PlanBatch::new();
    unentered.add_service_unentered(&plan);
    let mut endpoints = PlanBatch::new();
    endpoints.fill_endpoints(&plan);
    let mut entries = PlanBatch::new();
    entries.enter_service(&plan);
    let (whole, unentered, endpoints, entries) = (
        whole.into_batch().to_string(),
        unentered.into_batch().to_string(),
        endpoints.into_batch().to_string(),
        entries.into_batch().to_string(),
    );
    let map = plan.endpoint_maps()[0].name();
    assert!(!unentered.contains(" element"), "{unentered}");
    assert!(unentered.contains("add rule"), "{unentered}");
    assert!(
        unentered.contains(&format!("add map {map}")),
        "the rule's map is declared before it: {unentered}"
    );
    assert_eq!(
        endpoints.lines().count(),
        1,
        "one message for the map: {endpoints}"
    );
    assert!(
        endpoints.starts_with(&format!("add 2 elements to {map} ")),
        "{endpoints}"
    );
    assert!(
        entries
            .lines()
            .all(|line| line.starts_with("add element to ")),
        "{entries}"
    );
    assert!(!entries.contains(&map), "{entries}");
    assert!(
        entries.contains(
            "add element to service-ips-v4: 10.96.0.10 . tcp . 80 : goto dispatch-v4-n2-1f"
        ),
        "{entries}"
    );
    assert!(
        entries.contains("add element to cluster-ips-v4: 10.96.0.10"),
        "{entries}"
    );
    let mut parts: Vec<&str> = unentered
        .lines()
        .chain(endpoints.lines())
        .chain(entries.lines())
        .collect();
    let mut lines: Vec<&str> = whole.lines().collect();
    parts.sort_unstable();
    lines.sort_unstable();
    assert_eq!(parts, lines);
}

/// The endpoint elements of a cold start's services go to the kernel one message per map
/// for the whole batch, not one per service: each message makes the kernel look its set
/// up by name in the table's list of sets.
#[test]
fn endpoint_fills_of_services_in_one_map_share_a_message() {
    let view = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice("web", &two_endpoints()),
        service("api", json!({"clusterIP": "10.96.0.11"}), json!({})),
        http_slice("api", &two_endpoints()),
    ]);
    // Two services of two endpoints each, in one map of count 2 as two that hash alike
    // would be.
    let web = plan(&view, "web");
    let mut api = plan(&view, "api");
    let map = web.endpoint_maps()[0];
    for element in &mut api.elements {
        if element.set.is_endpoint_map() {
            element.set = map;
        }
    }
    let mut endpoints = PlanBatch::new();
    endpoints.fill_endpoints(&web);
    endpoints.fill_endpoints(&api);
    assert_eq!(endpoints.element_count(), 4);
    let text = endpoints.into_batch().to_string();
    assert!(
        text.starts_with(&format!("add 4 elements to {} ", map.name())),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
}

/// A batch that knows an endpoint map is in the table (an earlier transaction of the sync
/// created it) does not declare it again, and refers to it by name.
#[test]
fn a_map_known_to_exist_is_not_declared_again() {
    let view = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice("web", &two_endpoints()),
    ]);
    let plan = plan(&view, "web");
    let map = plan.endpoint_maps()[0];
    let mut first = PlanBatch::new();
    first.add_service(&plan);
    assert_eq!(first.declared_maps().collect::<Vec<_>>(), [map]);
    let text = first.into_batch().to_string();
    // With its dispatch chain, whose rules a batch writes only with the map.
    for declared in [
        format!("add map {}", map.name()),
        "add chain dispatch-v4-n2-1f".to_string(),
        "flush chain dispatch-v4-n2-1f".to_string(),
    ] {
        assert!(text.contains(&declared), "{declared} in {text}");
    }
    assert_eq!(text.matches("add rule").count(), 2, "{text}");

    let mut known = PlanBatch::assuming_maps(&std::iter::once(map).collect());
    known.add_service(&plan);
    assert_eq!(known.declared_maps().count(), 0);
    let text = known.into_batch().to_string();
    assert!(!text.contains("add map"), "{text}");
    assert!(!text.contains("chain"), "{text}");
    assert!(
        text.contains(&format!("elements to {} ", map.name())),
        "{text}"
    );
}

#[test]
fn cold_start_packs_services_into_bounded_batches() {
    let mut updates = vec![this_node()];
    for i in 0..20 {
        let name = format!("svc-{i}");
        updates.push(service(
            &name,
            json!({"clusterIP": format!("10.96.1.{i}")}),
            json!({}),
        ));
        updates.push(http_slice(&name, &two_endpoints()));
    }
    let view = view(updates);
    let planner = Planner::new(&view, &ProxySettings::default());
    let mut keys = EndpointKeys::new();
    let batches: Vec<_> =
        cold_start(&planner.skeleton(), planner.services(&mut keys), 40).collect();
    assert!(
        batches[0]
            .to_string()
            .starts_with("add table inet nodus\ndelete table")
    );
    assert!(batches.len() > 3, "{} batches", batches.len());
    // Every chain an element points at was added earlier in the same batch.
    for batch in &batches[1..] {
        let text = batch.to_string();
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            let Some((_, chain)) = line.split_once(" : goto ") else {
                continue;
            };
            let added = format!("add chain {}", chain.trim_end_matches(')'));
            assert!(
                chain == "reject-chain" || lines[..at].contains(&added.as_str()),
                "{line} before its chain in\n{text}"
            );
        }
    }
}

/// I.53, as upstream's conntrack cleanup: a UDP flow may stay on any endpoint that still
/// serves, whatever the traffic policy, topology or terminating state that steers new
/// flows; only the UDP port lists them.
#[test]
fn i53_udp_flows_may_stay_on_every_serving_endpoint() {
    let endpoint = |ip: &str, node: &str, ready: bool, serving: bool| {
        json!({"addresses": [ip], "nodeName": node,
               "conditions": {"ready": ready, "serving": serving, "terminating": !ready}})
    };
    let view = view([
        this_node(),
        service(
            "dns",
            json!({"internalTrafficPolicy": "Local",
                   "ports": [{"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"},
                             {"name": "tcp", "port": 53, "targetPort": 5353, "protocol": "TCP"}]}),
            json!({}),
        ),
        Update::EndpointSlice(
            serde_json::from_value(json!({
                "metadata": {"name": "dns-1", "namespace": "default",
                             "labels": {"kubernetes.io/service-name": "dns"}},
                "addressType": "IPv4",
                "endpoints": [endpoint("10.244.1.5", NODE, true, true),
                              endpoint("10.244.2.9", "node-b", true, true),
                              endpoint("10.244.2.10", "node-b", false, true),
                              endpoint("10.244.2.11", "node-b", false, false)],
                "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"},
                          {"name": "tcp", "port": 5353, "protocol": "TCP"}]
            }))
            .expect("test slice"),
        ),
    ]);
    let plan = plan(&view, "dns");
    assert_eq!(
        plan.udp_flows.len(),
        1,
        "only the UDP port: {:?}",
        plan.udp_flows
    );
    let at = |ip: &str, port: u16| (ip.parse::<IpAddr>().expect("test address"), port);
    assert_eq!(plan.udp_flows[0].service_addresses, [at("10.96.0.10", 53)]);
    assert_eq!(
        plan.udp_flows[0].serving,
        [
            at("10.244.1.5", 5353),
            at("10.244.2.9", 5353),
            at("10.244.2.10", 5353)
        ],
        "the remote and terminating ones too, not the one that stopped serving"
    );
}

#[test]
fn egress_from_pods_to_outside_the_cluster_is_masqueraded_with_the_mesh() {
    let other = node(
        "node-b",
        json!([{"type": "InternalIP", "address": "192.168.0.11"}]),
        json!(["10.244.2.0/24"]),
    );
    let view = view([this_node(), other]);
    let egress = ProxySettings {
        egress_masquerade: true,
        ..ProxySettings::default()
    };
    let text = render(&Planner::new(&view, &egress).skeleton(), []);
    assert!(
        text.contains(
            "\t\tip saddr @pod-cidrs-v4 ip daddr != @cluster-cidrs-v4 meta mark set meta mark | 0x00004000\n"
        ),
        "{text}"
    );
    // Every Node's pod range stays inside the cluster.
    assert!(
        text.contains("elements = { 10.244.1.0-10.244.2.255 }"),
        "{text}"
    );
    let without = render(
        &Planner::new(&view, &ProxySettings::default()).skeleton(),
        [],
    );
    assert!(!without.contains("cluster-cidrs"), "{without}");

    // A Node joining changes only the egress ranges: no full sync is needed.
    let before = Planner::new(&view, &egress).facts().clone();
    let third = node(
        "node-c",
        json!([{"type": "InternalIP", "address": "192.168.0.12"}]),
        json!(["10.244.3.0/24"]),
    );
    let grown = self::view([
        this_node(),
        node(
            "node-b",
            json!([{"type": "InternalIP", "address": "192.168.0.11"}]),
            json!(["10.244.2.0/24"]),
        ),
        third,
    ]);
    let after = Planner::new(&grown, &egress).facts().clone();
    assert!(before.differs_only_in_skeleton(&after));
    assert!(!before.differs_only_in_skeleton(&before));
}

#[test]
fn with_the_proxy_off_the_table_carries_only_the_egress_masquerade() {
    let other = node(
        "node-b",
        json!([{"type": "InternalIP", "address": "192.168.0.11"}]),
        json!(["10.244.2.0/24", "fd00:244:2::/64"]),
    );
    let view = view([
        this_node(),
        other,
        service("web", json!({"clusterIP": "10.96.0.10"}), json!({})),
    ]);
    let egress_only = ProxySettings {
        scope: TableScope::EgressOnly,
        egress_masquerade: true,
        ..ProxySettings::default()
    };
    let planner = Planner::new(&view, &egress_only);
    let mut keys = EndpointKeys::new();
    assert_eq!(planner.services(&mut keys).count(), 0);
    assert!(
        planner
            .service("default", "web", &mut keys.lease(&[]))
            .is_empty()
    );
    let skeleton = planner.skeleton();
    let chains: Vec<&str> = skeleton.chains.iter().map(ChainPlan::name).collect();
    assert_eq!(chains, ["nat-postrouting", "masquerading"]);
    let sets: Vec<&str> = skeleton.sets.iter().map(|s| s.set.name.as_str()).collect();
    assert_eq!(
        sets,
        [
            "pod-cidrs-v4",
            "cluster-cidrs-v4",
            "pod-cidrs-v6",
            "cluster-cidrs-v6"
        ]
    );
    let text = render(&skeleton, []);
    for expected in [
        "\t\tip saddr @pod-cidrs-v4 ip daddr != @cluster-cidrs-v4 meta mark set meta mark | 0x00004000\n",
        "\t\tip6 saddr @pod-cidrs-v6 ip6 daddr != @cluster-cidrs-v6 meta mark set meta mark | 0x00004000\n",
        "\t\tmasquerade fully-random\n",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    // No hairpin rule: its sets belong to the service proxy.
    assert!(!text.contains("hairpin"), "{text}");
}

#[test]
fn the_cluster_dns_service_is_redirected_to_this_nodes_listener() {
    let view = view([
        this_node(),
        service(
            "kube-dns",
            json!({"ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                             {"name": "metrics", "port": 9153, "protocol": "TCP"}]}),
            json!({}),
        ),
        http_slice("kube-dns", &two_endpoints()),
    ]);
    let config = local_dns_config();
    let plan = plan_with(&view, &config, "kube-dns");
    let dns_chain = plan
        .chains
        .iter()
        .find(|chain| chain.name().ends_with("/udp/dns"))
        .expect("the DNS port's chain");
    assert_eq!(
        dns_chain
            .rules
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "meta mark set meta mark & 0xffffbfff",
            "meta l4proto udp redirect to :5353"
        ]
    );
    // The host's questions to the ClusterIP are marked as off-cluster ClusterIP traffic in
    // `services`; the DNS chain takes the mark off, so they reach the listener unmasqueraded.
    let host = Planner::new(&view, &config).trace(Packet {
        entry: Entry::Host,
        source: "192.168.0.10".parse().expect("node ip"),
        destination: "10.96.0.10".parse().expect("cluster ip"),
        protocol: Protocol::Udp,
        port: 53,
    });
    assert_eq!(host.summary(), "192.168.0.10:5353", "{host}");
    assert_eq!(
        v4(&plan, SharedKind::ServiceIps, "10.96.0.10 . udp . 53"),
        Some(format!("goto {}", dns_chain.name()))
    );
    // Other ports of the service are proxied as usual (this one has no endpoints).
    assert_eq!(
        v4(
            &plan,
            SharedKind::NoEndpointServices,
            "10.96.0.10 . tcp . 9153"
        )
        .as_deref(),
        Some("goto reject-chain")
    );
    assert!(
        plan_with(&view, &ProxySettings::default(), "kube-dns")
            .chains
            .iter()
            .all(|chain| chain
                .rules
                .iter()
                .all(|r| !r.to_string().contains("redirect")))
    );
}

mod flows;

#[test]
fn a_chain_is_in_place_only_with_its_rules_and_the_digest_of_this_plan() {
    let view = view([
        this_node(),
        service("web", json!({}), json!({})),
        http_slice("web", &two_endpoints()),
    ]);
    let skeleton = Planner::new(&view, &ProxySettings::default()).skeleton();
    let chain = skeleton
        .chains
        .iter()
        .find(|chain| chain.rules.len() > 1)
        .expect("a chain of several rules");
    let digest = ChainPlan::digest_of_comment(&chain.comment());
    assert_eq!(digest, Some(chain.digest()), "{}", chain.comment());
    let rules = chain.rules.len();
    assert!(chain.is_in_place(rules, digest));
    assert!(!chain.is_in_place(rules - 1, digest), "a rule deleted");
    assert!(!chain.is_in_place(0, None), "flushed");
    assert!(!chain.is_in_place(rules, None), "another first rule");
    let mut other = chain.clone();
    other.rules.swap(0, 1);
    assert_ne!(other.digest(), chain.digest(), "rules in another order");
    assert!(!other.is_in_place(rules, digest));
    let empty = ChainPlan::regular("empty".into(), Vec::new());
    assert!(
        !empty.is_in_place(0, None),
        "an empty chain is always added"
    );
    assert_eq!(ChainPlan::digest_of_comment("kube-proxy rule"), None);
}

fn pod_at(name: &str, ip: &str, labels: Json) -> Update {
    Update::Pod(Box::new(
        serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": name, "labels": labels},
            "spec": {"nodeName": NODE, "containers": [{"image": "agnhost"}]},
            "status": {"podIPs": [{"ip": ip}]}
        }))
        .expect("test pod"),
    ))
}

/// The tracer's NetworkPolicy note tells a pod failing closed from one its policies
/// deny: an address two local pods claim (one reused while the old pod's object is still
/// there) is allowed nothing, whatever the policy allows; the packet is dropped and the
/// note says why.
#[test]
fn the_tracer_says_when_a_shared_address_fails_closed() {
    let policy = || {
        Update::NetworkPolicy(Box::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": "shop", "name": "web-in"},
                "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                         "ingress": [{"from": [{"ipBlock": {"cidr": "10.244.2.0/24"}}]}]}
            }))
            .expect("test policy"),
        ))
    };
    let config = ProxySettings {
        network_policy: true,
        ..ProxySettings::default()
    };
    let trace = |view: &View| {
        Planner::new(view, &config).trace(Packet {
            entry: Entry::Outside,
            source: "10.244.2.7".parse().expect("source"),
            destination: "10.244.1.9".parse().expect("destination"),
            protocol: Protocol::Tcp,
            port: 80,
        })
    };
    let alone = view([
        this_node(),
        policy(),
        pod_at("web-1", "10.244.1.9", json!({"app": "web"})),
    ]);
    let passes = trace(&alone);
    assert_eq!(passes.summary(), "10.244.1.9:80", "{passes}");
    assert!(
        passes
            .notes
            .iter()
            .any(|n| n.ends_with("allowed by shop/web-in")),
        "{passes}"
    );
    let shared = view([
        this_node(),
        policy(),
        pod_at("web-1", "10.244.1.9", json!({"app": "web"})),
        pod_at("web-2", "10.244.1.9", json!({"app": "web"})),
    ]);
    let dropped = trace(&shared);
    assert_eq!(dropped.summary(), "DROP", "{dropped}");
    assert!(
        dropped
            .notes
            .iter()
            .any(|n| n.contains("denied: allowed by shop/web-in, but its address is another")),
        "{dropped}"
    );
}
