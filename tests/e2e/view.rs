//! `nodus view`: the resolved node view of the example cluster, and its change stream.

use crate::support::{Cluster, EXAMPLE, Lines};
use serde_json::{Value, json};
use std::process::Stdio;

fn service<'a>(view: &'a Value, ns: &str, name: &str) -> &'a Value {
    view["services"]
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|s| s["namespace"] == ns && s["name"] == name)
        })
        .unwrap_or_else(|| panic!("{ns}/{name} is not in the view"))
}

fn ips(set: &Value) -> Vec<String> {
    set.as_array()
        .into_iter()
        .flatten()
        .map(|t| format!("{}:{}", t["ip"].as_str().unwrap_or("?"), t["port"]))
        .collect()
}

#[test]
fn view_prints_the_example_cluster_resolved_for_the_node() {
    let cluster = Cluster::new("view", EXAMPLE);
    let output = cluster
        .nodus(&["view", "--node-name", "node-1"])
        .output()
        .expect("nodus view runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let view: Value = serde_json::from_slice(&output.stdout).expect("JSON");

    assert_eq!(view["nodeName"], "node-1");
    assert_eq!(view["nodeZone"], "zone-a");
    assert_eq!(view["counts"]["nodes"], 3);
    assert_eq!(view["counts"]["services"], 5);

    let web = service(&view, "default", "web");
    assert_eq!(
        web["spec"]["clusterIPs"],
        json!(["10.96.0.20", "fd00:96::20"])
    );
    let http = &web["ports"][0];
    assert_eq!(http["nodePort"], 30080);
    assert_eq!(
        ips(&http["families"]["IPv4"]["cluster"]),
        ["10.244.1.10:8080", "10.244.2.10:8080", "10.244.3.10:8080"]
    );
    assert_eq!(
        ips(&http["families"]["IPv4"]["local"]),
        ["10.244.1.10:8080"]
    );
    assert_eq!(
        ips(&http["families"]["IPv6"]["local"]),
        ["fd00:244:1::10:8080"]
    );

    let api = service(&view, "shop", "api");
    assert_eq!(api["spec"]["internalTrafficPolicy"], "Local");
    let udp = api["ports"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["protocol"] == "UDP"))
        .expect("udp port");
    assert_eq!(ips(&udp["families"]["IPv4"]["local"]), ["10.244.1.20:9000"]);
    assert!(
        udp["families"].get("IPv6").is_none(),
        "api has no IPv6 cluster IP"
    );

    let db = service(&view, "shop", "db");
    assert_eq!(db["spec"]["headless"], true);
    let hostnames: Vec<&str> = db["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .filter_map(|e| e["hostname"].as_str())
        .collect();
    assert_eq!(hostnames, ["db-0", "db-1"]);

    assert_eq!(
        service(&view, "shop", "docs")["spec"]["externalName"],
        "docs.example.org"
    );
}

#[test]
fn view_watch_streams_one_line_per_change() {
    let mut cluster = Cluster::new("view-watch", EXAMPLE);
    let mut cmd = cluster.nodus(&["view", "--watch", "--node-name", "node-2"]);
    cmd.stdout(Stdio::piped());
    let child = cluster.spawn(cmd);
    let lines = Lines::new(child.stdout.take().expect("stdout"));

    let web = lines.next_for("Service", "default/web");
    assert_eq!(web["object"]["spec"]["clusterIPs"][0], "10.96.0.20");
    lines.next_for("Node", "node-3");

    cluster.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "new", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.99", "ports": [{"port": 80}]}
    }));
    let new = lines.next_for("Service", "default/new");
    assert_eq!(new["object"]["spec"]["clusterIPs"], json!(["10.96.0.99"]));

    cluster
        .store
        .delete("v1", "Service", Some("default"), "new")
        .expect("delete");
    let gone = lines.next_for("Service", "default/new");
    assert!(gone["object"].is_null(), "{gone}");
}
