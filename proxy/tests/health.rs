//! Health-check node ports answered over real HTTP (checklist H.50, H.51).

use nodus_http::Limits;
use nodus_proxy::health::{HealthChecks, HealthListen};
use nodus_proxy::metrics::{HEALTH_TIMEOUT, ProxyMetrics};
use nodus_testbed::fixtures;
use nodus_testbed::probe::http_get;
use nodus_view::{ChangeSet, ServiceName, Update, View, ViewWriter};
use serde_json::{Value, json};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    nodus_testbed::bench::free_port().expect("free port")
}

fn lb(port: u16) -> Update {
    Update::Service(
        serde_json::from_value(json!({
            "metadata": {"name": "lb", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.50",
                     "externalTrafficPolicy": "Local", "healthCheckNodePort": port,
                     "ports": [{"name": "http", "port": 80, "nodePort": 30090}]}
        }))
        .expect("service"),
    )
}

fn slice(local: &[(&str, bool, bool)]) -> Update {
    let endpoints = local
        .iter()
        .map(|(ip, ready, terminating)| {
            let conditions = json!({"conditions": {"ready": ready, "serving": true, "terminating": terminating}});
            fixtures::endpoint(ip, "node-a", conditions)
        })
        .chain([fixtures::endpoint("10.244.2.9", "node-b", Value::Null)])
        .collect();
    let ports = json!([{"name": "http", "port": 8080}]);
    let slice = fixtures::slice("default", "lb-1", "lb", "IPv4", endpoints, ports);
    Update::EndpointSlice(serde_json::from_value(slice).expect("slice"))
}

fn changed() -> ChangeSet {
    let mut changes = ChangeSet::default();
    changes.services.insert(ServiceName {
        namespace: "default".into(),
        name: "lb".into(),
    });
    changes
}

fn get(port: u16) -> Option<(u16, Value)> {
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let (code, body) = http_get(addr, "/healthz", Duration::from_secs(2)).ok()?;
    Some((code, serde_json::from_str(&body).expect("JSON body")))
}

#[test]
fn health_check_node_port_follows_local_endpoints() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let port = free_port();
    let view = ViewWriter::new(View::new("node-a"));
    let apply = |updates: Vec<Update>| {
        view.write().apply(updates);
    };
    apply(vec![
        lb(port),
        slice(&[("10.244.1.5", true, false), ("10.244.1.6", true, false)]),
    ]);
    let proxy = Arc::new(ProxyMetrics::default());
    let mut checks = HealthChecks::new(
        view.reader(),
        proxy.clone(),
        HealthListen {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            limits: Limits::default(),
        },
    );
    checks.update(&view.read(), None);
    assert_eq!(checks.ports(), [port]);

    let (code, body) = get(port).expect("served");
    assert_eq!(code, 200);
    assert_eq!(
        body["localEndpoints"], 2,
        "remote endpoints do not count: {body}"
    );
    assert_eq!(body["service"]["name"], "lb");
    assert_eq!(body["serviceProxyHealthy"], true);

    // A proxy that has owed a sync for longer than kube-proxy's health timeout: the node
    // is drained whatever its endpoints, as upstream does.
    let long_ago = Instant::now()
        .checked_sub(HEALTH_TIMEOUT + Duration::from_secs(1))
        .expect("the machine has been up for a minute");
    proxy.owe_sync_since(long_ago);
    let (code, body) = get(port).expect("served");
    assert_eq!(
        (code, body["serviceProxyHealthy"].clone()),
        (503, json!(false))
    );
    assert_eq!(body["localEndpoints"], 2);

    // Only terminating locally: 503, so the load balancer drains the node.
    apply(vec![slice(&[("10.244.1.5", false, true)])]);
    checks.update(&view.read(), Some(&changed()));
    let (code, body) = get(port).expect("served");
    assert_eq!((code, body["localEndpoints"].clone()), (503, json!(0)));

    // Cluster policy needs no health check: the port closes.
    apply(vec![Update::Service(
        serde_json::from_value(json!({
            "metadata": {"name": "lb", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.50",
                     "ports": [{"name": "http", "port": 80, "nodePort": 30090}]}
        }))
        .expect("service"),
    )]);
    checks.update(&view.read(), Some(&changed()));
    assert!(checks.ports().is_empty());
    std::thread::sleep(Duration::from_millis(100));
    assert!(get(port).is_none(), "the port is closed");
}

#[test]
fn a_port_that_cannot_be_bound_is_skipped() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let view = ViewWriter::new(View::new("node-a"));
    view.write()
        .apply([lb(port), slice(&[("10.244.1.5", true, false)])]);
    let mut checks = HealthChecks::new(
        view.reader(),
        Arc::default(),
        HealthListen {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            limits: Limits::default(),
        },
    );
    checks.update(&view.read(), None);
    assert!(checks.ports().is_empty(), "logged and skipped, no panic");
}
