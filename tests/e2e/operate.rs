//! Operating nodus: `nodus status`, `--on-change` backends, and SIGTERM.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use crate::support::{
    Cluster, EXAMPLE, NODUS, free_port, get, wait_for, wait_ready, wait_ready_in,
};
use nodus_testbed::fixtures;
use nodus_testbed::netns::Netns;
use serde_json::{Value, json};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const EXAMPLE_BACKEND: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/on-change.sh");

fn status_json(http: SocketAddr) -> Value {
    let (code, body) = get(http, "/status").expect("/status answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("/status is JSON")
}

fn subsystem<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["subsystems"]
        .as_array()
        .expect("subsystems")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {status}"))
}

#[test]
fn status_summarises_every_subsystem_of_a_running_agent() {
    let mut cluster = Cluster::new("status", EXAMPLE);
    let (http, dns) = cluster.run_agent_with_dns("node-1");
    wait_ready(http);

    let status = status_json(http);
    assert_eq!(status["node"], "node-1");
    assert_eq!(status["ready"], true);
    let view = subsystem(&status, "view");
    assert_eq!(view["synced"], true);
    assert_eq!(view["objects"]["service"], 5);
    assert_eq!(view["objects"]["endpoint"], 10);
    assert!(view["last_sync_unix_ms"].as_u64().is_some(), "{view}");
    assert!(view["last_sync_duration_ms"].as_f64().is_some(), "{view}");
    assert_eq!(subsystem(&status, "proxy")["enabled"], false);
    assert_eq!(subsystem(&status, "mesh")["enabled"], false);
    assert_eq!(
        subsystem(&status, "dns")["detail"],
        format!("answering on {dns}")
    );

    // A bad object shows as the view's last error.
    cluster.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "broken", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.300", "ports": [{"port": 80}]}
    }));
    wait_for("the invalid service in /status", || {
        let status = status_json(http);
        let view = subsystem(&status, "view");
        (view["errors"] == 1).then(|| view["last_error"].to_string())
    });

    let output = cluster
        .nodus(&["status", "--http-addr", &http.to_string()])
        .output()
        .expect("nodus status runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let screen = String::from_utf8_lossy(&output.stdout);
    for expected in [
        "on node node-1",
        "ready",
        "view       synced",
        "5 services",
        "10 endpoints",
        "proxy      off",
        "dns        synced",
        "mesh       off",
        "view: last error",
        "10.96.0.300",
    ] {
        assert!(screen.contains(expected), "{expected:?} missing:\n{screen}");
    }
    assert!(screen.lines().count() < 25, "one screen:\n{screen}");

    let nobody = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let refused = cluster
        .nodus(&["status", "--http-addr", &nobody.to_string()])
        .output()
        .expect("nodus status runs");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is it running?"));
}

fn labelled_service(name: &str, owner: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"service.kubernetes.io/service-proxy-name": owner}},
        "spec": {"clusterIP": "10.96.0.77", "clusterIPs": ["10.96.0.77"],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    })
}

fn slice(service: &str, addresses: &[&str]) -> Value {
    let ready = json!({"conditions": {"ready": true}});
    let endpoints = addresses
        .iter()
        .map(|a| fixtures::endpoint(a, "node-2", ready.clone()))
        .collect();
    let name = format!("{service}-1");
    fixtures::slice(
        "default",
        &name,
        service,
        "IPv4",
        endpoints,
        fixtures::http(8080),
    )
}

/// Starts `nodus run --on-change PROGRAM` for node-1, with DNS off and what `configure`
/// adds; returns its HTTP address once it is ready.
fn run_with_on_change(
    cluster: &mut Cluster,
    program: &Path,
    configure: impl FnOnce(&mut Command),
) -> SocketAddr {
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let config = cluster.dir.join("config.yaml");
    std::fs::write(&config, "dns:\n  enabled: false\n").expect("config");
    let mut cmd = cluster.nodus(&[
        "run",
        "--node-name",
        "node-1",
        "--http-addr",
        &http.to_string(),
    ]);
    cmd.arg("--on-change")
        .arg(program)
        .arg("--config")
        .arg(&config);
    configure(&mut cmd);
    cluster.spawn(cmd);
    wait_ready(http);
    http
}

/// The worked example of docs/backends.md against the stand-in: the script keeps a file per
/// service handed to it, and nodus's own proxy leaves those services alone.
#[test]
fn on_change_feeds_the_example_backend_the_services_handed_to_it() {
    let readme = include_str!("../../docs/backends.md");
    let script = std::fs::read_to_string(EXAMPLE_BACKEND).expect("example script");
    assert!(
        readme.contains(script.trim()),
        "docs/backends.md shows deploy/examples/on-change.sh as it is"
    );

    let mut cluster = Cluster::new("on-change", EXAMPLE);
    cluster.apply(labelled_service("lb", "example-backend"));
    cluster.apply(slice("lb", &["10.244.2.50", "10.244.2.51"]));
    let backend = cluster.dir.join("backend");
    let http = run_with_on_change(&mut cluster, Path::new(EXAMPLE_BACKEND), |cmd| {
        cmd.env("BACKEND_DIR", &backend);
    });

    let file = backend.join("default_lb");
    let read = || std::fs::read_to_string(&file).ok();
    wait_for("the backend's file after the initial sync", || {
        read().filter(|text| text == "80 10.244.2.50 8080\n80 10.244.2.51 8080\n")
    });
    assert!(
        !backend.join("default_web").exists(),
        "services nodus proxies itself are not the backend's"
    );

    // A change reaches the backend; so does a service changing hands, and a deletion.
    cluster.apply(slice("lb", &["10.244.2.52"]));
    wait_for("the endpoint change", || {
        read().filter(|text| text == "80 10.244.2.52 8080\n")
    });
    cluster.apply(labelled_service("lb", "someone-else"));
    wait_for("the service handed elsewhere", || {
        (!file.exists()).then_some(())
    });
    cluster.apply(labelled_service("lb", "example-backend"));
    wait_for("the service handed back", read);
    cluster
        .store
        .delete("v1", "Service", Some("default"), "lb")
        .expect("delete");
    wait_for("the deleted service", || (!file.exists()).then_some(()));

    let status = status_json(http);
    let on_change = subsystem(&status, "on-change");
    assert_eq!(on_change["synced"], true, "{on_change}");
    assert_eq!(on_change["errors"], 0, "{on_change}");

    // The view exposes the labelled service; the proxy's ruleset does not program it.
    cluster.apply(labelled_service("lb", "example-backend"));
    let view = cluster
        .nodus(&["view", "--node-name", "node-1"])
        .output()
        .expect("nodus view");
    let view: Value = serde_json::from_slice(&view.stdout).expect("view JSON");
    let lb = view["services"]
        .as_array()
        .expect("services")
        .iter()
        .find(|s| s["name"] == "lb")
        .expect("the labelled service is in the view");
    assert_eq!(lb["spec"]["serviceProxyName"], "example-backend");
    let rules = cluster
        .nodus(&["proxy", "render", "--node-name", "node-1"])
        .output()
        .expect("nodus proxy render");
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(rules.contains("10.96.0.20"), "{rules}");
    assert!(!rules.contains("10.96.0.77"), "{rules}");
}

#[test]
fn a_failing_or_hanging_program_is_logged_and_never_stalls_the_agent() {
    let mut cluster = Cluster::new("on-change-fail", EXAMPLE);
    let script = cluster.dir.join("hang.sh");
    // Reads its input, then hangs past the timeout on every run but the first, which fails.
    std::fs::write(
        &script,
        "#!/bin/sh\ncat >/dev/null\n[ -e \"$0.ran\" ] || { touch \"$0.ran\"; exit 3; }\nexec sleep 30\n",
    )
    .expect("script");
    Command::new("chmod")
        .args(["+x", &script.to_string_lossy()])
        .status()
        .expect("chmod");
    let http = run_with_on_change(&mut cluster, &script, |cmd| {
        cmd.args(["--on-change-timeout", "1"])
            .env("NODUS_LOG_FORMAT", "json");
    });
    let errors = |http| subsystem(&status_json(http), "on-change")["errors"].clone();
    wait_for("a timed-out run after the failed one", || {
        (errors(http).as_u64() >= Some(2)).then_some(())
    });
    // Meanwhile the view kept following the cluster.
    cluster.apply(slice("web", &["10.244.1.99"]));
    wait_for("the view to take a change while the program hangs", || {
        let status = status_json(http);
        (subsystem(&status, "view")["objects"]["endpoint"] != 10).then_some(())
    });
    // Logged as JSON lines (NODUS_LOG_FORMAT=json), the error in its own field.
    let log = std::fs::read_to_string(cluster.dir.join("nodus-0.log")).expect("log");
    let errors: Vec<String> = log
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON log line"))
        .filter(|line| {
            line["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("--on-change program failed"))
        })
        .map(|line| {
            line["fields"]["error"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert!(
        errors.iter().any(|e| e == "exited with exit status: 3"),
        "{log}"
    );
    assert!(
        errors.iter().any(|e| e == "still running after 1s; killed"),
        "{log}"
    );
}

/// The DaemonSet's capabilities suffice: with only NET_ADMIN and NET_BIND_SERVICE (the
/// bounding set of a root process is what it keeps), nodus programs its table and answers
/// DNS on port 53. On SIGTERM it exits promptly and its nftables table stays, so traffic
/// keeps flowing until the next nodus adopts it.
#[test]
fn with_only_the_daemonsets_capabilities_it_programs_and_answers_and_sigterm_leaves_the_table() {
    let mut cluster = Cluster::new("sigterm", EXAMPLE);
    let ns = Netns::new("term").expect("netns");
    ns.ip(&["link", "set", "lo", "up"]).expect("lo up");
    let kubeconfig = cluster.listen_in(&ns, SocketAddr::from((Ipv4Addr::LOCALHOST, free_port())));
    let config = cluster.dir.join("config.yaml");
    std::fs::write(
        &config,
        "proxy:\n  enabled: true\ndns:\n  listen: [\"127.0.0.1:53\"]\n",
    )
    .expect("config");
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let mut cmd = ns.command("setpriv");
    cmd.args([
        "--bounding-set",
        "-all,+net_admin,+net_bind_service",
        "--",
        NODUS,
    ])
    .args([
        "run",
        "--node-name",
        "node-1",
        "--http-addr",
        &http.to_string(),
    ])
    .arg("--kubeconfig")
    .arg(&kubeconfig)
    .arg("--config")
    .arg(&config)
    .env("NODUS_ALLOW_HTTP_API", "true")
    .env("NODUS_STATE_DIR", cluster.dir.join("state"));
    let pid = cluster.spawn(cmd).id();
    wait_ready_in(&ns, http);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(
        status.contains("CapEff:\t0000000000001400"),
        "only CAP_NET_ADMIN (12) and CAP_NET_BIND_SERVICE (10):\n{status}"
    );
    let table = ns
        .exec("nft", &["list", "table", "inet", "nodus"])
        .expect("the proxy programmed its table");
    assert!(table.contains("10.96.0.20"), "{table}");
    let answer = ns
        .exec(
            "dig",
            &[
                "@127.0.0.1",
                "+short",
                "+tries=1",
                "web.default.svc.cluster.local",
                "A",
            ],
        )
        .expect("dig");
    assert_eq!(answer.trim(), "10.96.0.20");

    let start = Instant::now();
    // SAFETY: kill(2) on the pid of a child we started and have not reaped.
    let rc = unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert_eq!(rc, 0, "SIGTERM sent");
    let status = cluster.wait_child(pid);
    let took = start.elapsed();
    println!("exit after SIGTERM: {took:?}");
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let after = ns
        .exec("nft", &["list", "table", "inet", "nodus"])
        .expect("the table is still there");
    assert!(after.contains("10.96.0.20"), "{after}");
}

/// `nodus check-config --host` names, one line each, what this host lacks for a
/// configuration: DNS's port taken (and by whom), a WireGuard backend that cannot run, a
/// CNI directory that cannot be made, CNI plugins missing; and passes once the host allows
/// it (the plugins put in place by `nodus install-cni`, as the init container does).
#[test]
fn check_config_host_names_what_the_host_lacks() {
    let ns = Netns::new("prfl").expect("netns");
    ns.ip(&["link", "set", "lo", "up"]).expect("loopback up");
    let held = ns
        .enter(|| std::net::UdpSocket::bind("127.0.0.1:53").expect("hold UDP 53"))
        .expect("entering the namespace");
    let dir = std::env::temp_dir().join(format!("nodus-e2e-preflight-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let not_a_directory = dir.join("file");
    std::fs::write(&not_a_directory, b"").expect("a file");
    let cni_bin = dir.join("opt/cni/bin");
    let write_config = |wireguard_go: &str, conflist: &Path| {
        let file = dir.join("nodus.yaml");
        let yaml = format!(
            "cluster_cidrs: [10.244.0.0/16]\ndns:\n  listen: [\"127.0.0.1:53\"]\nmesh:\n  \
             enabled: true\n  backend: wireguard-go\n  wireguard_go: {wireguard_go}\n  \
             cni_conflist: {}\n  cni_bin_dir: {}\n",
            conflist.display(),
            cni_bin.display()
        );
        std::fs::write(&file, yaml).expect("config");
        file
    };
    let check = |config: &Path| {
        let mut command = ns.command(NODUS);
        command.args(["check-config", "--host"]).arg(config);
        command.output().expect("nodus check-config runs")
    };

    let config = write_config(
        "/nonexistent/wireguard-go",
        &not_a_directory.join("00-nodus.conflist"),
    );
    let refused = check(&config);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    let me = format!("(pid {})", std::process::id());
    for line in [
        "mesh.backend wireguard-go: mesh.wireguard_go /nonexistent/wireguard-go: not found",
        &format!(
            "mesh.cni_conflist {}",
            not_a_directory.join("00-nodus.conflist").display()
        ),
        "is not a directory",
        "dns.listen 127.0.0.1:53: udp port 53 is in use by ",
        &me,
        &format!(
            "mesh.cni_bin_dir {}: no executable nodus-cni, host-local, portmap, loopback",
            cni_bin.display()
        ),
        "4 checks failed",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }

    drop(held);
    let wireguard_go = Command::new("sh")
        .args(["-c", "command -v wireguard-go"])
        .output()
        .expect("sh");
    let wireguard_go = String::from_utf8_lossy(&wireguard_go.stdout)
        .trim()
        .to_string();
    assert!(
        !wireguard_go.is_empty(),
        "wireguard-go is installed by .ci/run"
    );
    let config = write_config(&wireguard_go, &dir.join("net.d/00-nodus.conflist"));
    let installed = Command::new(NODUS)
        .args([
            "install-cni",
            "--from",
            nodus_testbed::runtime::CNI_PATH,
            "--to",
        ])
        .arg(&cni_bin)
        .output()
        .expect("nodus install-cni runs");
    assert!(installed.status.success(), "{installed:?}");
    let passed = check(&config);
    assert!(passed.status.success(), "{passed:?}");
    assert!(
        String::from_utf8_lossy(&passed.stdout).contains("valid, and this host can run it"),
        "{passed:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
