//! nodus against a real control plane (etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler built from their modules by `k8s/build.sh`): its objects, its
//! controllers' EndpointSlices, its authorization and admission, its `kubectl` output, and
//! its faults (a restart, a compaction that answers `410 Gone`, connections cut).
//!
//! The stand-in stays for the faults a real server cannot be made to show: a watch cut in
//! the middle of an object, a history restored from a backup (a real one would also lose
//! the token's pod), and the injected errors of `faults.rs`.

use crate::dns::dig;
use crate::support::{EXAMPLE, RealCluster, get, metric, wait_for, wait_ready, wait_within};
use nodus_testbed::fixtures;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn service(name: &str, ip: &str) -> Value {
    fixtures::service("default", name, fixtures::cluster_ip(ip))
}

/// A Pod on `node` as its kubelet would report it once running: `ip`, and ready or not.
fn pod(name: &str, node: &str, ip: &str, ready: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": {"app": "cache"}},
           "spec": {"nodeName": node, "hostname": name, "subdomain": "cache",
                    "containers": [{"name": "redis", "image": "redis:test",
                                    "ports": [{"name": "redis", "containerPort": 6379}]}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                      "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
}

fn resolves(dns: std::net::SocketAddr, name: &str) -> Vec<String> {
    dig(dns, &format!("{name}.default.svc.cluster.local"), "A").1
}

/// The view follows what the real API server holds (the `kubernetes` Service it makes
/// itself, the fixture) and what its EndpointSlice controller makes of Pods: pods becoming
/// ready, one leaving readiness, the Service deleted.
#[test]
fn the_agent_follows_the_real_api_server_and_its_controllers() {
    let mut cluster = RealCluster::new("real-view", EXAMPLE);
    let (http, dns) = cluster.run_agent_with_dns("node-1");
    wait_ready(http);
    assert_eq!(resolves(dns, "web"), ["10.96.0.20"]);
    assert_eq!(resolves(dns, "kubernetes"), ["10.96.0.1"]);
    // A namespace with no Service exists (NODATA, as CoreDNS answers); one that does not
    // exist is NXDOMAIN. The real server makes kube-public, with no Service in it.
    assert_eq!(dig(dns, "kube-public.svc.cluster.local", "A").0, "NOERROR");
    assert_eq!(dig(dns, "emptyns.svc.cluster.local", "A").0, "NXDOMAIN");
    cluster
        .plane
        .kubectl(&["create", "namespace", "emptyns"])
        .expect("create namespace");
    wait_for("the new namespace to be NODATA", || {
        (dig(dns, "emptyns.svc.cluster.local", "A").0 == "NOERROR").then_some(())
    });

    cluster.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "cache", "namespace": "default"},
        "spec": {"clusterIP": "None", "selector": {"app": "cache"},
                 "ports": [{"name": "redis", "port": 6379}]}}));
    cluster.apply(pod("cache-0", "node-1", "10.244.1.50", true));
    cluster.apply(pod("cache-1", "node-2", "10.244.2.51", true));
    wait_for("the controller's slice of both ready pods", || {
        (resolves(dns, "cache") == ["10.244.1.50", "10.244.2.51"]).then_some(())
    });
    // The controller names each endpoint by its pod's hostname (the pods set `subdomain`
    // to the Service's name).
    assert_eq!(resolves(dns, "cache-1.cache"), ["10.244.2.51"]);

    cluster.apply(pod("cache-1", "node-2", "10.244.2.51", false));
    wait_for("the pod no longer ready to leave the answer", || {
        (resolves(dns, "cache") == ["10.244.1.50"]).then_some(())
    });
    cluster
        .plane
        .kubectl(&[
            "delete",
            "service",
            "cache",
            "-n",
            "default",
            "--wait=false",
        ])
        .expect("delete");
    wait_for("the deleted Service to be NXDOMAIN", || {
        (dig(dns, "cache.default.svc.cluster.local", "A").0 == "NXDOMAIN").then_some(())
    });
    let (_, body) = get(http, "/metrics").expect("metrics");
    for kind in ["service", "endpointslice", "node", "namespace"] {
        assert_eq!(
            metric(
                &body,
                &format!("nodus_invalid_objects_total{{kind=\"{kind}\"}}")
            ),
            Some(0.0),
            "every object of the real server decodes: {kind}\n{body}"
        );
    }
}

/// `deploy/base`'s ValidatingAdmissionPolicy, evaluated by the real API server: nodus's
/// token, bound to a pod on node-1, may change node-1's nodus annotations and nothing else;
/// RBAC refuses what the ClusterRole does not grant.
#[test]
fn the_admission_policy_lets_a_nodes_token_change_only_its_own_nodus_annotations() {
    let cluster = RealCluster::new("real-admission", EXAMPLE);
    let plane = &cluster.plane;
    let own = plane
        .nodus_token("node-1")
        .expect("a token bound to node-1");
    let patch = |token: &str, node: &str, change: Value| {
        plane
            .request_as(
                token,
                "PATCH",
                &format!("/api/v1/nodes/{node}"),
                Some(&change),
            )
            .expect("the API server answers")
    };
    let annotation = |key: &str| json!({"metadata": {"annotations": {key: "x"}}});
    for key in [
        "nodus.dev/wireguard-public-key",
        "nodus.dev/wireguard-peer-endpoints",
    ] {
        let (code, answer) = patch(&own, "node-1", annotation(key));
        assert_eq!(code, 200, "its own Node's {key}: {answer}");
    }
    let refused = |(code, answer): (u16, Value), status: u16, why: &str| {
        assert_eq!(code, status, "{answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{message}");
    };
    refused(
        patch(&own, "node-2", annotation("nodus.dev/wireguard-public-key")),
        422,
        "nodus may change only the Node its pod runs on (node-1), not node-2",
    );
    refused(
        patch(&own, "node-1", annotation("example.com/owner")),
        422,
        "nodus may change only the nodus.dev/wireguard-* annotations of its Node",
    );
    refused(
        patch(
            &own,
            "node-1",
            json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-b"}}}),
        ),
        422,
        "nodus may not change a Node's labels or spec",
    );
    refused(
        patch(&own, "node-1", json!({"spec": {"unschedulable": true}})),
        422,
        "nodus may not change a Node's labels or spec",
    );
    let request = |method: &str, path: &str| {
        plane
            .request_as(&own, method, path, None)
            .expect("the API server answers")
    };
    refused(
        request("DELETE", "/api/v1/nodes/node-2"),
        403,
        "cannot delete resource \"nodes\"",
    );
    refused(
        request("GET", "/api/v1/namespaces/kube-system/secrets"),
        403,
        "cannot list resource \"secrets\"",
    );
    refused(
        request("GET", "/api/v1/nodes/node-1"),
        403,
        "cannot get resource \"nodes\"",
    );
    // A token of the same ServiceAccount bound to no pod names no node: refused everywhere.
    let unbound = plane
        .kubectl(&["create", "token", "nodus", "-n", "kube-system"])
        .expect("an unbound token");
    refused(
        patch(
            unbound.trim(),
            "node-1",
            annotation("nodus.dev/wireguard-port"),
        ),
        422,
        "nodus may change only the Node its pod runs on (), not node-1",
    );
    let node = plane
        .kubectl(&["get", "node", "node-1", "-o", "json"])
        .expect("kubectl get");
    let node: Value = serde_json::from_str(&node).expect("JSON");
    assert_eq!(
        node["metadata"]["labels"]["topology.kubernetes.io/zone"],
        "zone-a"
    );
    assert!(
        node["metadata"]["annotations"]
            .get("example.com/owner")
            .is_none()
    );
}

/// Nodes as their kubelets report them: Ready, a role label, a version.
fn reported_nodes() -> String {
    let now = "2026-01-01T00:00:00Z";
    let mut yaml = String::new();
    for (name, role) in [("cp-1", Some("control-plane")), ("worker-1", None)] {
        let mut labels = json!({"kubernetes.io/hostname": name});
        if let Some(role) = role {
            labels[format!("node-role.kubernetes.io/{role}")] = json!("");
        }
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "lastHeartbeatTime": now, "lastTransitionTime": now}],
                       "nodeInfo": {"kubeletVersion": "v1.37.2", "kubeProxyVersion": "",
                                    "machineID": "", "systemUUID": "", "bootID": "",
                                    "kernelVersion": "6.1.0", "osImage": "Debian GNU/Linux 12",
                                    "containerRuntimeVersion": "containerd://2.2.9",
                                    "operatingSystem": "linux", "architecture": "amd64"},
                       "addresses": [{"type": "InternalIP", "address": "172.30.0.11"}]}});
        yaml.push_str(&format!("---\n{node}\n"));
    }
    yaml
}

/// `kubectl get nodes` columns but AGE, one row per node.
fn columns(output: &str) -> Vec<Vec<String>> {
    output
        .lines()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            // NAME STATUS ROLES AGE VERSION: AGE differs between the two servers.
            words
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != 3)
                .map(|(_, w)| w.to_string())
                .collect()
        })
        .collect()
}

/// What a user sees: `kubectl get nodes` shows STATUS, ROLES and VERSION. (The stand-in
/// serves no `Table`, so kubectl prints only NAME and AGE from it.)
#[test]
fn kubectl_get_nodes_shows_status_roles_and_version() {
    let real = RealCluster::new("real-kubectl", &reported_nodes());
    let printed = real
        .plane
        .kubectl(&["get", "nodes"])
        .expect("kubectl get nodes");
    assert_eq!(
        columns(&printed),
        [
            ["NAME", "STATUS", "ROLES", "VERSION"],
            ["cp-1", "Ready", "control-plane", "v1.37.2"],
            ["worker-1", "Ready", "<none>", "v1.37.2"],
        ],
        "{printed}"
    );
}

/// The real server's faults: a restart (every watch fails, then resumes), a restart after
/// which the revision nodus resumes from is compacted away (`410 Gone`: nodus lists
/// afresh), and every connection cut at once. Through all of it DNS answers from the view,
/// `/readyz` stays 200, and a change made after each arrives.
#[test]
fn restarts_compaction_and_cut_connections_of_the_real_server() {
    let mut cluster = RealCluster::new("real-faults", EXAMPLE);
    let (http, dns) = cluster.run_agent_with_dns("node-1");
    wait_ready(http);
    let steady = |what: &str| {
        assert_eq!(resolves(dns, "web"), ["10.96.0.20"], "{what}");
        assert_eq!(
            get(http, "/readyz").map(|(code, _)| code),
            Some(200),
            "{what}"
        );
    };
    let arrives = |cluster: &RealCluster, name: &str, ip: &str| {
        let since = Instant::now();
        cluster.apply(service(name, ip));
        wait_within(
            &format!("{name} to resolve"),
            Duration::from_secs(90),
            || (resolves(dns, name) == [ip]).then_some(()),
        );
        since.elapsed()
    };

    // A restart: the API server down for 5 s.
    cluster.plane.stop_api_server();
    for _ in 0..5 {
        steady("while the API server is down");
        std::thread::sleep(Duration::from_secs(1));
    }
    cluster
        .plane
        .start_api_server()
        .expect("the API server starts again");
    let took = arrives(&cluster, "after-restart", "10.96.5.1");
    println!("real API server restarted: the next change arrived {took:.1?} after it was made");

    // A restart after which nodus's revision is older than the new watch cache and
    // compacted in etcd: its watches get 410 Gone and list again.
    let log_before = cluster.log(0).matches("too old resource version").count();
    cluster.plane.stop_api_server();
    cluster.plane.bump_etcd_revision().expect("a write to etcd");
    let compacted = cluster.plane.compact_etcd().expect("compaction");
    steady("while etcd is compacted");
    cluster
        .plane
        .start_api_server()
        .expect("the API server starts again");
    let took = arrives(&cluster, "after-compaction", "10.96.5.2");
    println!(
        "real API server restarted after a compaction to revision {compacted}: the next change \
         arrived {took:.1?} after it was made"
    );
    let log = cluster.log(0);
    assert!(
        log.matches("too old resource version").count() > log_before,
        "the watches were answered 410 Gone: {log}"
    );
    steady("after the relist");

    // Every connection between nodus and the API server cut at once.
    let (_, body) = get(http, "/metrics").expect("metrics");
    let services = metric(&body, "nodus_view_objects{kind=\"service\"}");
    cluster.relay.cut();
    let took = arrives(&cluster, "after-cut", "10.96.5.3");
    println!(
        "connections to the real API server cut: the next change arrived {took:.1?} after it was made"
    );
    let (_, body) = get(http, "/metrics").expect("metrics");
    assert_eq!(
        metric(&body, "nodus_view_objects{kind=\"service\"}"),
        services.map(|n| n + 1.0),
        "one Service more, none lost"
    );
    steady("after the cut");
}
