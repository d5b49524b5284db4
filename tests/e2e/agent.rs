//! `nodus run` against the stand-in: readiness, metrics, bad input, relists and restarts.

use crate::support::{Cluster, EXAMPLE, get, metric, wait_for, wait_metric, wait_ready};
use serde_json::json;

const SERVICES: &str = "nodus_view_objects{kind=\"service\"}";

#[test]
fn run_becomes_ready_and_reports_the_view_in_metrics() {
    let mut cluster = Cluster::new("ready", EXAMPLE);
    let http = cluster.run_agent("node-1");
    wait_ready(http);
    assert_eq!(get(http, "/healthz").map(|(code, _)| code), Some(200));
    let (_, body) = get(http, "/metrics").expect("metrics");
    assert_eq!(metric(&body, SERVICES), Some(5.0), "{body}");
    assert_eq!(
        metric(&body, "nodus_view_objects{kind=\"endpoint\"}"),
        Some(10.0),
        "{body}"
    );
    // Only its own Node: the mesh is off.
    assert_eq!(
        metric(&body, "nodus_view_objects{kind=\"node\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(metric(&body, "nodus_ready"), Some(1.0));
    assert!(body.contains("nodus_view_apply_duration_seconds_count"));
}

#[test]
fn run_refuses_to_start_without_a_node_name() {
    let cluster = Cluster::new("no-node", EXAMPLE);
    let output = cluster
        .nodus(&["run"])
        .env_remove("NODE_NAME")
        .output()
        .expect("runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--node-name"));
}

/// The stand-in speaks plain HTTP: without being told, the agent does not send its
/// credentials over it, and says why.
#[test]
fn run_refuses_a_plain_http_api_server_unless_allowed() {
    let cluster = Cluster::new("plain-http", EXAMPLE);
    let output = cluster
        .nodus(&["run", "--node-name", "node-1"])
        .env_remove("NODUS_ALLOW_HTTP_API")
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("plain http://") && stderr.contains("--allow-http-api"),
        "{stderr}"
    );
}

#[test]
fn an_invalid_object_is_skipped_counted_and_never_poisons_the_view() {
    let mut cluster = Cluster::new("invalid", EXAMPLE);
    cluster.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "broken", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.300", "ports": [{"port": 80}]}
    }));
    cluster.apply(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "broken-1", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.11"]}],
        "ports": [{"name": "http", "port": 8080, "protocol": "ICMP"}]
    }));
    let http = cluster.run_agent("node-1");
    wait_ready(http);
    let (_, body) = get(http, "/metrics").expect("metrics");
    assert_eq!(
        metric(&body, SERVICES),
        Some(5.0),
        "the valid services are all there"
    );
    assert_eq!(
        metric(&body, "nodus_invalid_objects_total{kind=\"service\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        metric(&body, "nodus_invalid_objects_total{kind=\"endpointslice\"}"),
        Some(1.0),
        "{body}"
    );
    let log = std::fs::read_to_string(cluster.dir.join("nodus-0.log")).expect("log");
    assert!(
        log.contains("default/broken") && log.contains("10.96.0.300"),
        "{log}"
    );
}

#[test]
fn a_forced_410_relists_without_losing_the_view() {
    let mut cluster = Cluster::new("relist", EXAMPLE);
    let http = cluster.run_agent("node-1");
    wait_ready(http);
    // While the watches are cut, one service goes and one comes: only a relist sees both.
    cluster.store.force_compaction();
    cluster
        .store
        .delete("v1", "Service", Some("shop"), "docs")
        .expect("delete");
    cluster.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "late", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.77", "ports": [{"port": 80}]}
    }));
    // Make the history too short for the watchers' last resourceVersion.
    for i in 0..3 {
        cluster.store.force_compaction();
        cluster.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": format!("churn-{i}"), "namespace": "default"}}));
    }
    cluster.drop_watches();
    wait_for("a watch restart after the 410", || {
        get(http, "/metrics")
            .and_then(|(_, body)| metric(&body, "nodus_watch_restarts_total{kind=\"service\"}"))
            .filter(|v| *v >= 1.0)
    });
    wait_metric(http, SERVICES, 5.0);
    let view = cluster
        .nodus(&["view", "--node-name", "node-1"])
        .output()
        .expect("view");
    let text = String::from_utf8_lossy(&view.stdout);
    assert!(
        text.contains("\"late\"") && !text.contains("\"docs\""),
        "{text}"
    );
}

#[test]
fn the_agent_survives_an_api_server_restart() {
    let mut cluster = Cluster::new("restart", EXAMPLE);
    let http = cluster.run_agent("node-1");
    wait_ready(http);
    cluster.stop_server();
    cluster.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "while-down", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.78", "ports": [{"port": 80}]}
    }));
    cluster.restart_server();
    wait_metric(http, SERVICES, 6.0);
    assert_eq!(
        get(http, "/readyz").map(|(code, _)| code),
        Some(200),
        "stays ready throughout"
    );
}
