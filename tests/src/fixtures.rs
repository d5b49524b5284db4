//! Kubernetes objects for tests, as the API serves them (JSON with `apiVersion` and
//! `kind`), in one vocabulary for the test bed, the e2e tests and the crates' tests. The
//! stand-in and the real API server take them as they are; the crates' tests read them
//! into the view's wire types with `serde_json::from_value` (which skips `apiVersion`
//! and `kind`).

use serde_json::{Value, json};

/// A Service `namespace/name` with `spec`.
pub fn service(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": namespace},
           "spec": spec})
}

/// A ClusterIP spec at `ip` with one port, `http` 80/TCP.
pub fn cluster_ip(ip: &str) -> Value {
    json!({"clusterIP": ip, "clusterIPs": [ip], "ports": http(80)})
}

/// One port named `http` on `port`/TCP, as a `ports` list.
pub fn http(port: u16) -> Value {
    json!([{"name": "http", "port": port, "protocol": "TCP"}])
}

/// An EndpointSlice `namespace/name` of `service`'s endpoints of `family` (`IPv4` or
/// `IPv6`) on `ports`.
pub fn slice(
    namespace: &str,
    name: &str,
    service: &str,
    family: &str,
    endpoints: Vec<Value>,
    ports: Value,
) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": family,
        "endpoints": endpoints,
        "ports": ports
    })
}

/// An endpoint at `ip` on `node`, with `more` fields (conditions, hostname, zone).
pub fn endpoint(ip: &str, node: &str, more: Value) -> Value {
    merged(json!({"addresses": [ip], "nodeName": node}), more)
}

/// The conditions of an endpoint that is ready (and serving) or terminating.
pub fn conditions(ready: bool) -> Value {
    json!({"conditions": {"ready": ready, "serving": ready, "terminating": !ready}})
}

/// A Node `name` with its `addresses` (the status list) and `pod_cidrs`.
pub fn node(name: &str, addresses: Value, pod_cidrs: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name},
           "spec": {"podCIDRs": pod_cidrs},
           "status": {"addresses": addresses}})
}

/// `base` with the fields of `over` laid over it (both JSON objects; `null` adds nothing).
pub fn merged(mut base: Value, over: Value) -> Value {
    if let (Some(base), Some(over)) = (base.as_object_mut(), over.as_object()) {
        base.extend(over.clone());
    }
    base
}

/// `object` with its `status` set.
pub fn with_status(mut object: Value, status: Value) -> Value {
    object["status"] = status;
    object
}
