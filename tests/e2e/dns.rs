//! DNS answers follow the API: a service created, scaled and deleted shows up in `dig`
//! within one batch.

use crate::support::{Cluster, EXAMPLE, get, metric, wait_for, wait_ready};
use serde_json::json;
use std::net::SocketAddr;
use std::process::Command;

fn dig(dns: SocketAddr, name: &str, qtype: &str) -> (String, Vec<String>) {
    let output = Command::new("dig")
        .arg(format!("@{}", dns.ip()))
        .args([
            "-p",
            &dns.port().to_string(),
            "+tries=1",
            "+time=2",
            "+noall",
            "+answer",
            "+comments",
        ])
        .args([name, qtype])
        .output()
        .expect("dig is installed (dnsutils)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let status = text
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("")
        .to_string();
    let mut data: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().skip(4).collect::<Vec<_>>().join(" "))
        .collect();
    data.sort();
    (status, data)
}

fn slice(ips: &[&str]) -> serde_json::Value {
    let endpoints: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip], "hostname": format!("h{}", ip.rsplit('.').next().unwrap_or("0"))})).collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "cache-1", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "cache",
                                "service.kubernetes.io/headless": ""}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "redis", "protocol": "TCP", "port": 6379}]
    })
}

#[test]
fn answers_follow_create_scale_and_delete() {
    let mut cluster = Cluster::new("dns", EXAMPLE);
    let (http, dns) = cluster.run_agent_with_dns("node-1");
    wait_ready(http);
    assert_eq!(
        dig(dns, "web.default.svc.cluster.local", "A").1,
        ["10.96.0.20"]
    );

    cluster.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "cache", "namespace": "default"},
        "spec": {"clusterIP": "None", "ports": [{"name": "redis", "port": 6379}]}
    }));
    cluster.apply(slice(&["10.244.1.50"]));
    wait_for("the new headless service to resolve", || {
        let (_, data) = dig(dns, "cache.default.svc.cluster.local", "A");
        (data == ["10.244.1.50"]).then_some(())
    });

    cluster.apply(slice(&["10.244.1.50", "10.244.2.51", "10.244.3.52"]));
    wait_for("the scaled service to resolve to three pods", || {
        let (_, data) = dig(dns, "cache.default.svc.cluster.local", "A");
        (data.len() == 3).then_some(())
    });
    let (_, srv) = dig(dns, "_redis._tcp.cache.default.svc.cluster.local", "SRV");
    assert_eq!(srv.len(), 3, "{srv:?}");
    assert!(
        srv.iter()
            .any(|r| r.ends_with("h52.cache.default.svc.cluster.local.")),
        "{srv:?}"
    );

    cluster
        .store
        .delete("v1", "Service", Some("default"), "cache")
        .expect("delete");
    wait_for("the deleted service to be NXDOMAIN", || {
        let (status, _) = dig(dns, "cache.default.svc.cluster.local", "A");
        (status == "NXDOMAIN").then_some(())
    });

    let (_, body) = get(http, "/metrics").expect("metrics");
    for series in [
        "nodus_dns_requests_total{qtype=\"A\"}",
        "nodus_dns_requests_total{qtype=\"SRV\"}",
        "nodus_dns_responses_total{rcode=\"NXDOMAIN\"}",
        "nodus_dns_request_duration_seconds_count",
    ] {
        assert!(
            metric(&body, series).is_some_and(|v| v >= 1.0),
            "{series}:\n{body}"
        );
    }
}
