//! NetworkPolicy in the kernel, through the applier: the policy sets follow the pods the
//! view names, and a pod whose allowances the kernel refuses fails closed alone while
//! the other pods and the services are programmed.

use nodus_proxy::apply::{Proxy, SyncKind};
use nodus_proxy::plan::ProxySettings;
use nodus_testbed::netns::{self, Netns};
use nodus_view::{ChangeSet, Kind, Update, View};
use serde_json::json;

mod common;
use common::*;

const POD_A: &str = "10.244.1.10";
const POD_B: &str = "10.244.1.11";
const CLIENT: &str = "10.244.2.5";
const ALLOWED: &str = "policy-ingress-allowed-v4";
const ISOLATED: &str = "policy-ingress-isolated-v4";

fn pod(name: &str, node: &str, ip: &str, app: &str) -> Update {
    Update::Pod(Box::new(
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": name, "labels": {"app": app}},
            "spec": {"nodeName": node},
            "status": {"podIPs": [{"ip": ip}]}
        }))
        .expect("test pod"),
    ))
}

/// The servers `a` and `b` open to the client on `ports`.
fn policy(ports: &[u16]) -> Update {
    let ports: Vec<_> = ports.iter().map(|port| json!({"port": port})).collect();
    Update::NetworkPolicy(Box::new(
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "servers"},
            "spec": {
                "podSelector": {"matchExpressions": [{"key": "app", "operator": "In",
                                                       "values": ["a", "b"]}]},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                             "ports": ports}]
            }
        }))
        .expect("test policy"),
    ))
}

/// Another program's `nft add element` or `nft delete element` on our `set`.
fn outside_element(ns: &Netns, verb: &str, set: &str, element: &str) {
    ns.exec(
        "nft",
        &[
            verb,
            "element",
            "inet",
            "nodus",
            set,
            &format!("{{ {element} }}"),
        ],
    )
    .unwrap_or_else(|error| panic!("nft {verb} element {element}: {error}"));
}

fn set_elements(ns: &Netns, set: &str) -> String {
    ns.exec("nft", &["list", "set", "inet", "nodus", set])
        .expect("nft list set")
}

/// Whether `listing` holds the element `pod . CLIENT . tcp . port`.
fn allows(listing: &str, pod: &str, port: u16) -> bool {
    listing.contains(&format!("{pod} . {CLIENT} . tcp . {port}"))
}

/// NetworkPolicy on, and a view where pods `a` and `b` of this node are open on 8080 to
/// `client` of another node.
fn servers_and_client() -> (ProxySettings, View) {
    let config = ProxySettings {
        network_policy: true,
        ..ProxySettings::default()
    };
    let mut view: View = node_view(&TWO_ENDPOINTS);
    // In the agent's order: the policies, then a list of the pods (which then keeps the
    // labels the policies select other nodes' pods by).
    let report = view.apply([
        policy(&[8080]),
        Update::RelistStarted(Kind::Pod),
        pod("a", NODE, POD_A, "a"),
        pod("b", NODE, POD_B, "b"),
        pod("client", "node-b", CLIENT, "client"),
        Update::RelistDone(Kind::Pod),
    ]);
    assert!(report.invalid.is_empty(), "{:?}", report.invalid);
    (config, view)
}

#[test]
fn a_pod_whose_allowances_the_kernel_refuses_fails_closed_alone() {
    netns::require_root();
    let ns = Netns::new("pokr").expect("namespace");
    let (config, mut view) = servers_and_client();
    let mut proxy = ns
        .enter(|| Proxy::new(config).expect("proxy"))
        .expect("entering the namespace");
    let report = proxy.full_sync(&view).expect("full sync");
    assert!(report.policy_refused.is_empty(), "{report:?}");
    assert_eq!(proxy.isolated_pods(), 2);
    let allowed = set_elements(&ns, ALLOWED);
    assert!(
        allows(&allowed, POD_A, 8080) && allows(&allowed, POD_B, 8080),
        "{allowed}"
    );

    // Another program puts an element into our set that overlaps what pod a is about to
    // be allowed: the kernel refuses a's new element, and the transaction with it.
    outside_element(
        &ns,
        "add",
        ALLOWED,
        &format!("{POD_A} . {CLIENT} . 6 . 9000-9095"),
    );
    let report = view.apply([policy(&[8080, 9090]), service("web", http(json!({"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 81, "protocol": "TCP"}]})), json!({}))]);
    assert!(report.invalid.is_empty(), "{:?}", report.invalid);
    assert_eq!(
        report.changes.policy_pods.len(),
        2,
        "both servers are named"
    );
    let report = proxy.sync(&view, &report.changes).expect("partial sync");
    assert_eq!(report.kind, SyncKind::Partial, "{report:?}");
    assert_eq!(
        report.updated, 1,
        "the service changed with the policy: {report:?}"
    );
    let refused: Vec<_> = report
        .policy_refused
        .iter()
        .map(|p| p.addresses.clone())
        .collect();
    assert_eq!(
        refused,
        [vec![POD_A.parse::<std::net::IpAddr>().expect("ip")]]
    );
    assert!(
        report.policy_refused[0].reason.contains("exists"),
        "{:?}",
        report.policy_refused
    );
    let allowed = set_elements(&ns, ALLOWED);
    assert!(allows(&allowed, POD_B, 9090), "b is updated: {allowed}");
    assert!(
        !allows(&allowed, POD_A, 8080),
        "a is allowed nothing from the client any more: {allowed}"
    );
    assert!(
        allowed.contains(&format!("{POD_A} . {POD_A} . 0-255 . 0-65535")),
        "a still reaches itself: {allowed}"
    );
    let isolated = set_elements(&ns, ISOLATED);
    assert!(
        isolated.contains(POD_A) && isolated.contains(POD_B),
        "{isolated}"
    );
    assert_eq!(proxy.refused_policy_pods().count(), 1);

    // The next full sync refills the sets: the outside element goes, a gets its due.
    let report = proxy.full_sync(&view).expect("full sync");
    assert!(report.policy_refused.is_empty(), "{report:?}");
    assert_eq!(proxy.refused_policy_pods().count(), 0);
    let allowed = set_elements(&ns, ALLOWED);
    assert!(
        allows(&allowed, POD_A, 8080) && allows(&allowed, POD_A, 9090),
        "{allowed}"
    );
    assert!(!allowed.contains("9000-9095"), "{allowed}");

    // A pod that leaves takes its elements along; the other one stays.
    let report = view.apply([Update::Deleted {
        kind: Kind::Pod,
        namespace: "default".into(),
        name: "a".into(),
    }]);
    let changes: &ChangeSet = &report.changes;
    proxy.sync(&view, changes).expect("partial sync");
    assert_eq!(proxy.isolated_pods(), 1);
    let allowed = set_elements(&ns, ALLOWED);
    assert!(
        !allowed.contains(POD_A) && allows(&allowed, POD_B, 9090),
        "{allowed}"
    );
    let isolated = set_elements(&ns, ISOLATED);
    assert!(!isolated.contains(POD_A), "{isolated}");
}

/// A restart reads the policy sets back and sends only what differs: nothing when they
/// are right, here one element someone deleted and one someone added.
#[test]
fn a_restart_sends_only_the_policy_elements_that_differ() {
    netns::require_root();
    let ns = Netns::new("porr").expect("namespace");
    let (config, view) = servers_and_client();
    let open = || {
        ns.enter(|| Proxy::new(config.clone()).expect("proxy"))
            .expect("entering the namespace")
    };
    let first = open().full_sync(&view).expect("first run");
    assert!(first.elements > 0, "{first:?}");

    let report = open().full_sync(&view).expect("a restart");
    assert_eq!(report.elements, 0, "{report:?}");

    outside_element(&ns, "delete", ISOLATED, POD_B);
    outside_element(
        &ns,
        "add",
        ALLOWED,
        &format!("10.244.1.99 . {CLIENT} . 6 . 22"),
    );
    let report = open().full_sync(&view).expect("another restart");
    assert_eq!(report.elements, 2, "{report:?}");
    let isolated = set_elements(&ns, ISOLATED);
    assert!(
        isolated.contains(POD_A) && isolated.contains(POD_B),
        "{isolated}"
    );
    let allowed = set_elements(&ns, ALLOWED);
    assert!(!allowed.contains("10.244.1.99"), "{allowed}");
    assert!(
        allows(&allowed, POD_A, 8080) && allows(&allowed, POD_B, 8080),
        "{allowed}"
    );
}
