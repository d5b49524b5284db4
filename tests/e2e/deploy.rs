//! `deploy/`: every kustomization rendered with `kubectl kustomize`, checked for what an
//! operator relies on, and its configuration validated by the built `nodus check-config`.

use crate::support::NODUS;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");

/// Which subsystems a variant turns on, and the capabilities that follow from them.
struct Variant {
    dir: &'static str,
    proxy: bool,
    dns: bool,
    capabilities: &'static [&'static str],
}

/// `deploy/` itself is `overlays/replace`.
const VARIANTS: [Variant; 3] = [
    Variant {
        dir: "",
        proxy: true,
        dns: true,
        capabilities: &["NET_ADMIN", "NET_BIND_SERVICE"],
    },
    Variant {
        dir: "overlays/mesh-only",
        proxy: false,
        dns: false,
        capabilities: &["NET_ADMIN"],
    },
    Variant {
        dir: "overlays/replace",
        proxy: true,
        dns: true,
        capabilities: &["NET_ADMIN", "NET_BIND_SERVICE"],
    },
];

fn render(dir: &Path) -> Vec<Value> {
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl runs (CI installs it)");
    assert!(
        output.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    serde_saphyr::from_multiple(&text).expect("rendered YAML parses")
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind}");
    found[0]
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `nodus check-config` on the ConfigMap's file, with the API server's address as
/// NODUS_API_SERVER, in an environment without a kubeconfig or a cluster.
fn check_config_output(
    config_map: &Value,
    scratch: &Path,
    api_server: &str,
) -> std::process::Output {
    let text = config_map["data"]["nodus.yaml"]
        .as_str()
        .expect("the ConfigMap holds nodus.yaml");
    let file = scratch.join("nodus.yaml");
    std::fs::write(&file, text).expect("write config");
    Command::new(NODUS)
        .arg("check-config")
        .arg(&file)
        .env_clear()
        .env("HOME", scratch)
        .env("NODUS_API_SERVER", api_server)
        .output()
        .expect("nodus check-config runs")
}

/// The ConfigMap's file, checked by the built binary as the DaemonSet runs it; returns it
/// parsed.
fn check_config(config_map: &Value, scratch: &Path, api_server: &str) -> Value {
    let output = check_config_output(config_map, scratch, api_server);
    let text = config_map["data"]["nodus.yaml"]
        .as_str()
        .unwrap_or_default();
    assert!(
        output.status.success(),
        "nodus check-config refused the ConfigMap:\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_saphyr::from_str(text).expect("YAML")
}

/// A container's environment variable's value.
fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

fn enabled(config: &Value, section: &str) -> bool {
    config[section]["enabled"].as_bool().unwrap_or(false)
}

#[test]
fn every_kustomization_renders_a_least_privilege_daemonset_with_a_valid_config() {
    let scratch = std::env::temp_dir().join(format!("nodus-e2e-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    for variant in &VARIANTS {
        let objects = render(&Path::new(DEPLOY).join(variant.dir));
        let context = format!("deploy/{}", variant.dir);

        // RBAC: read services, endpointslices, nodes, servicecidrs, pods, namespaces and
        // networkpolicies; patch nodes; nothing more.
        let role = find(&objects, "ClusterRole");
        let mut rules: Vec<(String, String, Vec<&str>)> = Vec::new();
        for rule in role["rules"].as_array().expect("rules") {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    let mut verbs = strings(&rule["verbs"]);
                    verbs.sort_unstable();
                    rules.push((group.into(), resource.into(), verbs));
                }
            }
        }
        rules.sort();
        assert_eq!(
            rules,
            vec![
                ("".into(), "namespaces".into(), vec!["list", "watch"]),
                ("".into(), "nodes".into(), vec!["list", "patch", "watch"]),
                ("".into(), "pods".into(), vec!["list", "watch"]),
                ("".into(), "services".into(), vec!["list", "watch"]),
                (
                    "discovery.k8s.io".into(),
                    "endpointslices".into(),
                    vec!["list", "watch"]
                ),
                (
                    "networking.k8s.io".into(),
                    "networkpolicies".into(),
                    vec!["list", "watch"]
                ),
                (
                    "networking.k8s.io".into(),
                    "servicecidrs".into(),
                    vec!["list", "watch"]
                ),
            ],
            "{context}"
        );
        let binding = find(&objects, "ClusterRoleBinding");
        let account = find(&objects, "ServiceAccount");
        let subject = json!({"kind": "ServiceAccount", "name": account["metadata"]["name"],
                             "namespace": account["metadata"]["namespace"]});
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(binding["subjects"][0], subject);
        // In kube-system, the cluster's DNS ConfigMap and nothing else.
        let dns_role = find(&objects, "Role");
        assert_eq!(
            dns_role["rules"],
            json!([{"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": ["kube-dns"], "verbs": ["get", "list", "watch"]}]),
            "{context}"
        );
        let dns_binding = find(&objects, "RoleBinding");
        assert_eq!(dns_binding["roleRef"]["name"], dns_role["metadata"]["name"]);
        assert_eq!(dns_binding["metadata"]["namespace"], "kube-system");
        assert_eq!(dns_binding["subjects"][0], subject);

        // The admission policy: nodus's own account, its own Node, the annotations the
        // mesh publishes (the ones the code names).
        let policy = find(&objects, "ValidatingAdmissionPolicy");
        let policy_binding = find(&objects, "ValidatingAdmissionPolicyBinding");
        assert_eq!(
            policy_binding["spec"]["policyName"],
            policy["metadata"]["name"]
        );
        assert_eq!(policy_binding["spec"]["validationActions"], json!(["Deny"]));
        assert_eq!(
            policy["spec"]["matchConditions"][0]["expression"],
            format!(
                "request.userInfo.username == 'system:serviceaccount:{}:{}'",
                account["metadata"]["namespace"]
                    .as_str()
                    .expect("namespace"),
                account["metadata"]["name"].as_str().expect("name")
            ),
            "{context}"
        );
        let published = policy["spec"]["variables"]
            .as_array()
            .expect("variables")
            .iter()
            .find(|v| v["name"] == "published")
            .expect("the published annotations")["expression"]
            .to_string();
        for key in [
            nodus_mesh::plan::ANNOTATION_PUBLIC_KEY,
            nodus_mesh::plan::ANNOTATION_PORT,
            nodus_mesh::plan::ANNOTATION_ENDPOINT,
            nodus_mesh::plan::ANNOTATION_PEER_ENDPOINTS,
        ] {
            assert!(published.contains(&format!("'{key}'")), "{published}");
        }

        let daemonset = find(&objects, "DaemonSet");
        let pod = &daemonset["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], account["metadata"]["name"]);
        assert_eq!(pod["hostNetwork"], true, "{context}");
        assert_eq!(pod["priorityClassName"], "system-node-critical");
        assert!(
            pod["tolerations"]
                .as_array()
                .expect("tolerations")
                .iter()
                .any(|t| t == &json!({"operator": "Exists"})),
            "{context}: tolerates every taint"
        );
        let container = &pod["containers"][0];
        let security = &container["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true, "{context}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{context}");
        assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
        assert_eq!(
            strings(&security["capabilities"]["add"]),
            variant.capabilities,
            "{context}"
        );
        assert!(
            container["env"].as_array().expect("env").iter().any(|e| e
                == &json!({"name": "NODE_NAME",
                               "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})),
            "{context}: NODE_NAME from the downward API"
        );
        let memory = &container["resources"];
        assert!(memory["requests"]["memory"].is_string() && memory["limits"]["memory"].is_string());

        // The configuration: the DaemonSet mounts the generated ConfigMap, and the file parses.
        let config_map = find(&objects, "ConfigMap");
        let config_volume = pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["configMap"].is_object())
            .expect("a ConfigMap volume");
        assert_eq!(
            config_volume["configMap"]["name"],
            config_map["metadata"]["name"]
        );
        // As shipped, the proxy's API server is the placeholder, which nodus refuses with
        // the step to take; with an address the file is valid.
        let api_server = env_value(container, "NODUS_API_SERVER").expect("NODUS_API_SERVER");
        if variant.proxy {
            let shipped = check_config_output(config_map, &scratch, api_server);
            let error = String::from_utf8_lossy(&shipped.stderr);
            assert!(
                !shipped.status.success() && error.contains("placeholder"),
                "{context}: {error}"
            );
            // Without any address, the error names the key to set.
            let unset = check_config_output(config_map, &scratch, "");
            let error = String::from_utf8_lossy(&unset.stderr);
            assert!(
                error.contains("api_server: proxy.enabled needs"),
                "{context}: {error}"
            );
        }
        let config = check_config(config_map, &scratch, "https://192.0.2.10:6443");
        assert_eq!(enabled(&config, "proxy"), variant.proxy, "{context}");
        assert_eq!(enabled(&config, "dns"), variant.dns, "{context}");
        assert!(enabled(&config, "mesh"), "{context}: the mesh is on");
        // NetworkPolicy needs the proxy's table: on wherever the proxy is.
        assert_eq!(enabled(&config, "policy"), variant.proxy, "{context}");

        // Probes on the configured HTTP port.
        let http_port: u16 = config["http_addr"]
            .as_str()
            .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
            .expect("http_addr is set: the default is loopback, which the kubelet cannot probe")
            .port();
        // No containerPort: on the host network it is a hostPort, which would keep the
        // surge pod of a rolling update off its node.
        assert!(container["ports"].is_null(), "{context}");
        for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
            assert_eq!(
                container[probe]["httpGet"],
                json!({"path": path, "port": http_port}),
                "{context}"
            );
        }
        // Updates surge: the new pod takes the old one's sockets over before it stops, and
        // the grace period covers the lameduck.
        assert_eq!(
            daemonset["spec"]["updateStrategy"]["rollingUpdate"],
            json!({"maxSurge": 1, "maxUnavailable": 0}),
            "{context}"
        );
        let lameduck = config["lameduck_seconds"].as_u64().unwrap_or(0);
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        assert!(lameduck > 0 && grace > lameduck + 2, "{context}");

        // Host paths: the key directory and the CNI directory.
        let host_paths: Vec<&str> = pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .filter_map(|v| v["hostPath"]["path"].as_str())
            .collect();
        for path in ["/var/lib/nodus", "/etc/cni/net.d", "/opt/cni/bin"] {
            assert!(host_paths.contains(&path), "{context}: {path} mounted");
        }
        // The CNI plugins come from the image, copied by an init container that needs no
        // capability.
        let init = &pod["initContainers"][0];
        assert_eq!(
            strings(&init["args"]),
            ["install-cni", "--to", "/host/opt/cni/bin"],
            "{context}"
        );
        assert_eq!(
            strings(&init["securityContext"]["capabilities"]["drop"]),
            ["ALL"]
        );
        assert!(
            init["securityContext"]["capabilities"]["add"].is_null(),
            "{context}"
        );
        assert_eq!(init["volumeMounts"][0]["mountPath"], "/host/opt/cni/bin");
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn the_replace_overlay_backs_kube_dns_and_names_the_api_server() {
    let objects = render(&Path::new(DEPLOY).join("overlays/replace"));
    let daemonset = find(&objects, "DaemonSet");
    assert_eq!(
        daemonset["spec"]["template"]["metadata"]["labels"]["k8s-app"],
        "kube-dns"
    );
    let data = find(&objects, "ConfigMap")["data"]["nodus.yaml"]
        .as_str()
        .expect("config");
    let config: Value = serde_saphyr::from_str(data).expect("YAML");
    assert_eq!(config["apiVersion"], "nodus.dev/v1alpha1");
    // The API server's address and the DNS Service's come from nodus-cluster, which is not
    // applied itself.
    let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env_value(container, "NODUS_API_SERVER"),
        Some("https://control-plane.invalid:6443")
    );
    let service = find(&objects, "Service");
    assert_eq!(service["metadata"]["name"], "kube-dns");
    assert_eq!(service["metadata"]["namespace"], "kube-system");
    assert_eq!(service["spec"]["clusterIP"], "10.96.0.10");
    assert_eq!(service["spec"]["selector"], json!({"k8s-app": "kube-dns"}));
    let ports: Vec<(&str, u64)> = service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter_map(|p| Some((p["protocol"].as_str()?, p["port"].as_u64()?)))
        .collect();
    assert_eq!(ports, [("UDP", 53), ("TCP", 53)]);
    // The ConfigMap is nodus's configuration alone: nodus-cluster stays local.
    find(&objects, "ConfigMap");
}
