//! Synthetic clusters for the scale bench and the memory tests.
//!
//! Objects look like what a real API server returns: labels, a last-applied annotation and
//! managedFields on Services, targetRefs, zones and conditions on every endpoint. nodus
//! must skip the parts it does not use while parsing, so they belong in the workload.

use nodus_view::{Update, View, wire};
use serde_json::{Value, json};
use std::net::Ipv4Addr;

/// The shape of a generated cluster.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub services: usize,
    pub endpoints_per_service: usize,
    pub nodes: usize,
    /// Ports per Service (and per slice): `http` 80/TCP, then `dns` 53/UDP, `dns-tcp`
    /// 53/TCP (kube-dns's three), then `p<k>` 8000+k/TCP.
    pub ports: usize,
    /// The share of ready endpoints, in tenths: 9 (the default) leaves one endpoint in
    /// ten not ready, 10 none.
    pub ready_tenths: usize,
}

impl Shape {
    /// `services × endpoints × nodes`, one port per Service, nine endpoints in ten ready.
    pub fn new(services: usize, endpoints_per_service: usize, nodes: usize) -> Shape {
        Shape {
            services,
            endpoints_per_service,
            nodes,
            ports: 1,
            ready_tenths: 9,
        }
    }

    /// `SxExN[:P[:R]]`, as the benches take it on their command lines: services,
    /// endpoints per service and nodes, then ports per Service (1) and the percentage of
    /// ready endpoints (90, in steps of ten).
    pub fn parse(text: &str) -> anyhow::Result<Shape> {
        use anyhow::Context;
        let mut fields = text.split(':');
        let sizes = fields.next().unwrap_or_default();
        let parts: Vec<usize> = sizes
            .split('x')
            .map(|p| {
                p.parse()
                    .with_context(|| format!("shape {text:?}: expected SxExN[:PORTS[:READY%]]"))
            })
            .collect::<Result<_, _>>()?;
        let [services, endpoints_per_service, nodes] = parts[..] else {
            anyhow::bail!("shape {text:?}: expected SxExN[:PORTS[:READY%]]");
        };
        let mut shape = Shape::new(services, endpoints_per_service, nodes);
        if let Some(ports) = fields.next() {
            shape.ports = ports
                .parse()
                .ok()
                .filter(|p| (1..=100).contains(p))
                .with_context(|| format!("shape {text:?}: ports per Service is 1 to 100"))?;
        }
        if let Some(ready) = fields.next() {
            let percent: usize = ready
                .trim_end_matches('%')
                .parse()
                .ok()
                .filter(|r| *r <= 100 && r % 10 == 0)
                .with_context(|| format!("shape {text:?}: ready is 0 to 100 %, in tens"))?;
            shape.ready_tenths = percent / 10;
        }
        anyhow::ensure!(fields.next().is_none(), "shape {text:?}: too many fields");
        Ok(shape)
    }

    /// The Service ports as the Service lists them (port, targetPort).
    fn service_ports(&self) -> Vec<Value> {
        (0..self.ports)
            .map(|k| {
                let (name, protocol, port, target) = port_of(k);
                json!({"name": name, "protocol": protocol, "port": port, "targetPort": target})
            })
            .collect()
    }

    /// The same ports as an EndpointSlice lists them (the target ports).
    fn slice_ports(&self) -> Vec<Value> {
        (0..self.ports)
            .map(|k| {
                let (name, protocol, _, target) = port_of(k);
                json!({"name": name, "protocol": protocol, "port": target})
            })
            .collect()
    }
}

/// Port `k` of a generated Service: name, protocol, port and target port.
fn port_of(k: usize) -> (String, &'static str, u16, u16) {
    match k {
        0 => ("http".into(), "TCP", 80, 8080),
        1 => ("dns".into(), "UDP", 53, 53),
        2 => ("dns-tcp".into(), "TCP", 53, 53),
        k => (format!("p{k}"), "TCP", 8000 + k as u16, 8000 + k as u16),
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}×{}×{}",
            self.services, self.endpoints_per_service, self.nodes
        )?;
        if self.ports != 1 || self.ready_tenths != 9 {
            write!(
                f,
                " ({} ports, {} % ready)",
                self.ports,
                self.ready_tenths * 10
            )?;
        }
        Ok(())
    }
}

/// KiB as MiB with one decimal, as the benches print memory.
pub fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

pub const NAMESPACES: usize = 20;
pub const ZONES: usize = 3;

pub fn namespace(service: usize) -> String {
    format!("ns-{}", service % NAMESPACES)
}

pub fn service_name(service: usize) -> String {
    format!("svc-{service}")
}

pub fn node_name(node: usize) -> String {
    format!("node-{node}")
}

/// The ClusterIP of service `i`, in 10.96.0.0/12.
pub fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 10)) + i as u32)
}

/// The pod IP of endpoint `e` of service `i`, moved by `generation` so churn changes it.
pub fn pod_ip(i: usize, e: usize, generation: usize) -> Ipv4Addr {
    let n = (i * 64 + e + generation * 7) as u32;
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + n % (1 << 21))
}

pub fn node(i: usize) -> Value {
    let name = node_name(i);
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": format!("zone-{}", i % ZONES),
                "node.kubernetes.io/instance-type": "m5.large"
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", 128 + i / 256, i % 256),
                 "podCIDRs": [format!("10.{}.{}.0/24", 128 + i / 256, i % 256)]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": format!("172.31.{}.{}", i / 250, i % 250 + 1)},
                          {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status"}],
            "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "containerRuntimeVersion": "containerd://1.7.24"}
        }
    })
}

/// Service `i` of the generated cluster, with `shape`'s ports.
pub fn service(i: usize, shape: &Shape) -> Value {
    let (ns, name) = (namespace(i), service_name(i));
    let ip = cluster_ip(i).to_string();
    let spec = json!({
        "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
        "ports": shape.service_ports(),
        "selector": {"app": name}, "sessionAffinity": "None",
        "internalTrafficPolicy": "Cluster"
    });
    let last_applied = json!({"apiVersion": "v1", "kind": "Service",
                              "metadata": {"name": name, "namespace": ns}, "spec": spec})
    .to_string();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": {"app": name, "app.kubernetes.io/part-of": "bench", "tier": "backend"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": last_applied},
            "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update",
                               "apiVersion": "v1", "time": "2026-11-22T00:00:00Z",
                               "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:spec": {"f:ports": {}, "f:selector": {}}}}]
        },
        "spec": spec,
        "status": {"loadBalancer": {}}
    })
}

/// The EndpointSlice of service `i`; `generation` moves the pod IPs and readiness.
pub fn slice(i: usize, shape: &Shape, generation: usize) -> Value {
    let (ns, name) = (namespace(i), service_name(i));
    let endpoints: Vec<Value> = (0..shape.endpoints_per_service)
        .map(|e| {
            let node = (i * 7 + e) % shape.nodes.max(1);
            let ready = (e + generation) % 10 < shape.ready_tenths;
            json!({
                "addresses": [pod_ip(i, e, generation).to_string()],
                "conditions": {"ready": ready, "serving": ready, "terminating": false},
                "nodeName": node_name(node),
                "zone": format!("zone-{}", node % ZONES),
                "targetRef": {"kind": "Pod", "namespace": ns,
                              "name": format!("{name}-7d9f8c6b5-{e:05}"),
                              "uid": format!("0000{i:08x}-0000-4000-8000-{e:012x}")}
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{name}-abcde"), "namespace": ns,
            "labels": {"kubernetes.io/service-name": name,
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                       "app": name},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-22T00:00:00Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                 "uid": format!("0000{i:08x}-0000-4000-8000-000000000000"),
                                 "controller": true, "blockOwnerDeletion": true}]
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": shape.slice_ports()
    })
}

/// Pods kubelet runs at most on one node by default (`maxPods`).
pub const PODS_PER_NODE: usize = 110;

/// The address of pod `k` of node `node`, in the node's pod CIDR.
pub fn local_pod_ip(node: usize, k: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        (128 + node / 256) as u8,
        (node % 256) as u8,
        (k % 250 + 2) as u8,
    )
}

/// Pod `k` of node `node`, of a service's deployment in namespace `namespace`, as the API
/// serves a running pod (containers, conditions and managed fields included, which nodus
/// skips while parsing).
pub fn pod(node: usize, k: usize, namespace: &str) -> Value {
    let name = format!("app-{k}-7d9f8c6b5-x{k:04}");
    let ip = local_pod_ip(node, k).to_string();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace,
            "uid": format!("0000{node:08x}-0000-4000-8000-{k:012x}"),
            "labels": {"app": format!("app-{k}"), "pod-template-hash": "7d9f8c6b5"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": format!("app-{k}-7d9f8c6b5"), "controller": true,
                                 "uid": format!("0000{k:08x}-0000-4000-8000-000000000000")}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "v1", "time": "2026-11-22T00:00:00Z",
                               "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {"f:containers": {}}}},
                              {"manager": "kubelet", "operation": "Update", "subresource": "status",
                               "apiVersion": "v1", "time": "2026-11-22T00:00:05Z",
                               "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:status": {"f:conditions": {}, "f:podIPs": {}}}}]
        },
        "spec": {
            "nodeName": node_name(node), "dnsPolicy": "ClusterFirst", "restartPolicy": "Always",
            "serviceAccountName": "default", "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "app", "image": "registry.example/app:1.4.2",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "LOG_LEVEL", "value": "info"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                              "limits": {"memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
                "volumeMounts": [{"name": "kube-api-access", "readOnly": true,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
            }],
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}]
        },
        "status": {
            "phase": "Running", "hostIP": format!("172.31.{}.{}", node / 250, node % 250 + 1),
            "podIP": ip, "podIPs": [{"ip": ip}], "qosClass": "Burstable",
            "startTime": "2026-11-22T00:00:01Z",
            "conditions": [{"type": "Ready", "status": "True",
                            "lastTransitionTime": "2026-11-22T00:00:05Z"},
                           {"type": "ContainersReady", "status": "True",
                            "lastTransitionTime": "2026-11-22T00:00:05Z"}],
            "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0,
                                   "image": "registry.example/app:1.4.2",
                                   "imageID": "registry.example/app@sha256:0123456789abcdef",
                                   "containerID": format!("containerd://{k:064x}"),
                                   "started": true,
                                   "state": {"running": {"startedAt": "2026-11-22T00:00:03Z"}}}]
        }
    })
}

/// Every object of a cluster of `shape`, nodes first.
/// A generated object decoded as the watcher decodes it, through the view's lean wire
/// structs.
pub fn update(object: Value) -> anyhow::Result<Update> {
    Ok(match object["kind"].as_str() {
        Some("Service") => Update::Service(serde_json::from_value::<Box<wire::Service>>(object)?),
        Some("EndpointSlice") => Update::EndpointSlice(serde_json::from_value(object)?),
        Some("Pod") => Update::Pod(serde_json::from_value(object)?),
        _ => Update::Node(serde_json::from_value(object)?),
    })
}

/// Applies `objects` to `view` a page of 100 at a time (the watcher's page size), so that
/// no more than one page of decoded objects is alive beside the view. An object the view
/// refuses is an error.
pub fn apply_in_pages(view: &mut View, objects: impl Iterator<Item = Value>) -> anyhow::Result<()> {
    let mut page = Vec::with_capacity(100);
    let mut objects = objects.peekable();
    while let Some(object) = objects.next() {
        page.push(update(object)?);
        if page.len() == 100 || objects.peek().is_none() {
            let report = view.apply(page.drain(..));
            anyhow::ensure!(report.invalid.is_empty(), "{:?}", report.invalid);
        }
    }
    Ok(())
}

pub fn cluster(shape: &Shape) -> impl Iterator<Item = Value> + '_ {
    (0..shape.nodes)
        .map(node)
        .chain((0..shape.services).flat_map(move |i| [service(i, shape), slice(i, shape, 0)]))
}

/// The NetworkPolicy part of a generated cluster: `pods` pods spread over the nodes,
/// `namespaces` Namespaces, and `policies` NetworkPolicies (`PxQxN` on command lines).
#[derive(Clone, Copy, Debug)]
pub struct PolicyShape {
    pub pods: usize,
    pub policies: usize,
    pub namespaces: usize,
}

impl PolicyShape {
    pub fn parse(text: &str) -> anyhow::Result<PolicyShape> {
        let shape = Shape::parse(text)?;
        Ok(PolicyShape {
            pods: shape.services,
            policies: shape.endpoints_per_service,
            namespaces: shape.nodes.max(1),
        })
    }
}

impl std::fmt::Display for PolicyShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}×{}×{}", self.pods, self.policies, self.namespaces)
    }
}

const ROLES: [&str; 3] = ["frontend", "backend", "db"];

fn policy_namespace(j: usize) -> String {
    format!("team-{j}")
}

/// Pod `i` of the cluster: on node `i % nodes`, in namespace `(i / nodes) % namespaces`,
/// its role (frontend, backend, db) by `i % 3`.
pub fn policy_pod(i: usize, policy: &PolicyShape, nodes: usize) -> Value {
    let nodes = nodes.max(1);
    let namespace = policy_namespace((i / nodes) % policy.namespaces);
    let mut pod = pod(i % nodes, i / nodes, &namespace);
    pod["metadata"]["name"] = format!("app-{}-7d9f8c6b5-x{i:05}", i % 7).into();
    pod["metadata"]["uid"] = format!("0000{i:08x}-0000-4000-8000-00000000cafe").into();
    pod["metadata"]["labels"] = json!({
        "app": format!("app-{}", i % 7), "role": ROLES[i % 3], "pod-template-hash": "7d9f8c6b5"
    });
    pod
}

/// Namespace `j`: its name label, as the API server sets it, and an environment.
pub fn policy_namespace_object(j: usize) -> Value {
    let name = policy_namespace(j);
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name,
                                              "env": if j.is_multiple_of(2) { "prod" } else { "staging" }}},
        "status": {"phase": "Active"}
    })
}

/// Policy `p`, in namespace `p % namespaces`, of one of three kinds in turn: a
/// default-deny of ingress; backends open to their namespace's frontends on the named
/// port and to the first namespace (monitoring) on 9090; databases isolated both ways,
/// open to backends on 5432 and sending only to DNS and to addresses outside the cluster.
pub fn network_policy(p: usize, policy: &PolicyShape) -> Value {
    let namespace = policy_namespace(p % policy.namespaces);
    let spec = match (p / policy.namespaces) % 3 {
        0 => json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        1 => json!({
            "podSelector": {"matchLabels": {"role": "backend"}},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"role": "frontend"}}}],
                 "ports": [{"protocol": "TCP", "port": "http"}]},
                {"from": [{"namespaceSelector": {"matchLabels":
                              {"kubernetes.io/metadata.name": policy_namespace(0)}}}],
                 "ports": [{"protocol": "TCP", "port": 9090}]}
            ]
        }),
        _ => json!({
            "podSelector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["db"]}]},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "backend"}}}],
                         "ports": [{"protocol": "TCP", "port": 5432}]}],
            "egress": [
                {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}
            ]
        }),
    };
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": format!("policy-{p}"), "namespace": namespace,
                     "uid": format!("0000{p:08x}-0000-4000-8000-00000000beef")},
        "spec": spec
    })
}

/// The NetworkPolicy objects of a cluster with `nodes` nodes: namespaces, pods, policies.
pub fn policy_cluster(policy: &PolicyShape, nodes: usize) -> impl Iterator<Item = Value> + '_ {
    (0..policy.namespaces)
        .map(policy_namespace_object)
        .chain((0..policy.pods).map(move |i| policy_pod(i, policy, nodes)))
        .chain((0..policy.policies).map(|p| network_policy(p, policy)))
}

/// Memory of a process, from `/proc/<pid>/status` and `/proc/<pid>/smaps_rollup`, in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcMemory {
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
    pub anon_kib: u64,
}

fn field_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

pub fn proc_memory(pid: u32) -> anyhow::Result<ProcMemory> {
    use anyhow::Context;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .with_context(|| format!("reading /proc/{pid}/smaps_rollup"))?;
    Ok(ProcMemory {
        rss_kib: field_kib(&status, "VmRSS:").unwrap_or(0),
        peak_rss_kib: field_kib(&status, "VmHWM:").unwrap_or(0),
        anon_kib: field_kib(&smaps, "Anonymous:").unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_generate_distinct_objects() {
        let shape = Shape::new(30, 10, 4);
        let objects: Vec<Value> = cluster(&shape).collect();
        assert_eq!(objects.len(), 4 + 30 * 2);
        assert_ne!(
            slice(1, &shape, 0),
            slice(1, &shape, 1),
            "churn changes a slice"
        );
        assert_eq!(cluster_ip(0).to_string(), "10.96.0.10");
    }

    #[test]
    fn shapes_take_ports_per_service_and_the_ready_share() {
        let shape = Shape::parse("100x10x5:3:100").expect("shape");
        assert_eq!((shape.ports, shape.ready_tenths), (3, 10));
        assert_eq!(shape.to_string(), "100×10×5 (3 ports, 100 % ready)");
        let service = service(7, &shape);
        let names: Vec<&str> = service["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
        assert_eq!(names, ["http", "dns", "dns-tcp"]);
        let slice = slice(7, &shape, 3);
        assert_eq!(slice["ports"].as_array().map(Vec::len), Some(3));
        let ready = |slice: &Value| {
            let endpoints = slice["endpoints"].as_array().expect("endpoints");
            endpoints
                .iter()
                .filter(|e| e["conditions"]["ready"] == true)
                .count()
        };
        assert_eq!(ready(&slice), 10);
        let default = Shape::parse("100x10x5").expect("shape");
        assert_eq!(ready(&super::slice(7, &default, 3)), 9);
        assert_eq!(default.to_string(), "100×10×5");
        for bad in ["100x10", "100x10x5:0", "100x10x5:2:95", "100x10x5:2:100:1"] {
            assert!(Shape::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_own_memory() {
        let mem = proc_memory(std::process::id()).expect("proc");
        assert!(mem.rss_kib > 0 && mem.peak_rss_kib >= mem.rss_kib);
    }
}
