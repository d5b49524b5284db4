//! A real Kubernetes control plane for the test bed: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler, built from their published modules by
//! `k8s/build.sh` and run as child processes on loopback.
//!
//! The API server runs as a cluster's does: TLS with a CA of the test's own, ServiceAccount
//! tokens, `Node,RBAC` authorization and the default admission plugins (with
//! ValidatingAdmissionPolicy). The controller manager allocates node pod CIDRs and runs the
//! EndpointSlice, namespace and garbage-collector controllers; the scheduler binds pods.
//! Everything lives in one directory and is stopped and removed when the value drops.

#![allow(unsafe_code)] // prctl in a spawned child, with its SAFETY comment

use crate::bench::free_port;
use anyhow::{Context, bail};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The ranges the API server and controller manager are started with: the ones the
/// sandbox's and the tests' fixtures use.
pub const SERVICE_CIDRS: &str = "10.96.0.0/16,fd00:96::/112";
pub const CLUSTER_CIDRS: &str = "10.244.0.0/16,fd00:244::/56";

/// How long the control plane may take to answer `/readyz` (the API server's first start
/// on a loaded 2-core machine installs every built-in object).
const START_LIMIT: Duration = Duration::from_secs(120);

/// Where `k8s/build.sh` put the binaries: `NODUS_K8S_BIN` if set, else the script's own
/// answer, which builds what is missing (nothing, once the cache holds it).
pub fn binaries() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("NODUS_K8S_BIN") {
        return Ok(PathBuf::from(dir));
    }
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    build_once(&BUILT, &[])
}

/// The reference CNI plugins and cnitool that read CNI 1.1 (Debian 12's do not), as
/// `k8s/build.sh cni` built them from their modules: `NODUS_CNI_BIN` if set.
pub fn reference_cni_plugins() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("NODUS_CNI_BIN") {
        return Ok(PathBuf::from(dir));
    }
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    build_once(&BUILT, &["cni"])
}

/// `k8s/build.sh args`, once per process: the directory it prints.
fn build_once(built: &Mutex<Option<PathBuf>>, args: &[&str]) -> anyhow::Result<PathBuf> {
    let mut built = built.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(dir) = built.as_ref() {
        return Ok(dir.clone());
    }
    let dir = k8s_script("build.sh", args)?;
    *built = Some(dir.clone());
    Ok(dir)
}

/// Runs `k8s/<script> args` (which builds what its cache lacks) and returns the directory
/// it prints.
pub(crate) fn k8s_script(script: &str, args: &[&str]) -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../k8s")
        .join(script);
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} {args:?} failed ({})", script.display(), output.status);
    }
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

/// The pause image of this Kubernetes version, which `k8s/images.sh` makes and every real
/// node ([`crate::kubelet`]) has.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";

/// What a control plane is started with.
#[derive(Clone, Debug)]
pub struct ControlPlaneConfig {
    /// The address the API server advertises (the `kubernetes` Service's endpoint): where
    /// nodes reach it. Loopback is refused by the API server.
    pub advertise: IpAddr,
    /// More addresses its serving certificate names, besides loopback, the advertised one
    /// and the `kubernetes` Service's first cluster IP.
    pub extra_sans: Vec<IpAddr>,
    /// The API server's port on loopback (default: a free one). The `kubernetes` Service
    /// names the advertised address with this port.
    pub api_port: Option<u16>,
    /// The Unix socket of an HTTP CONNECT proxy ([`EgressProxy`]) through which the API
    /// server reaches nodes and pods (kubelets for `exec` and `logs`, the `proxy`
    /// subresources), which live in namespaces it cannot reach itself.
    pub cluster_egress: Option<PathBuf>,
    /// Real kubelets run the nodes (`crate::kubelet`): the node lifecycle controller runs,
    /// which removes a new Node's `not-ready` taint once its kubelet reports Ready. Without
    /// kubelets it would mark every Node unreachable after 40 s.
    pub kubelets: bool,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        ControlPlaneConfig {
            // TEST-NET-1: routed nowhere, never assigned here.
            advertise: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            extra_sans: Vec::new(),
            api_port: None,
            cluster_egress: None,
            kubelets: false,
        }
    }
}

/// One component's process, its command line kept for restarts.
struct Component {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

/// etcd, the API server, the controller manager and the scheduler, running.
pub struct ControlPlane {
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub api_port: u16,
    etcd_port: u16,
    /// `admin.kubeconfig`: the CA, and a client certificate in `system:masters`.
    pub admin_kubeconfig: PathBuf,
    components: Vec<Component>,
}

/// etcd for a test's data: no fsync, and no metrics listener.
fn etcd(bin: &Path, dir: &Path, etcd_url: &str, etcd_peer_port: u16) -> Component {
    let path = |p: &Path| p.to_string_lossy().into_owned();
    Component::new(
        "etcd",
        bin.join("etcd"),
        &[
            format!("--data-dir={}", path(&dir.join("etcd"))),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer_port}"),
            // A test's data: no fsync, and no metrics listener.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ],
    )
}

/// kube-apiserver with the test's PKI, `Node,RBAC` and NodeRestriction.
fn kube_apiserver(
    bin: &Path,
    pki: &Pki,
    config: &ControlPlaneConfig,
    etcd_url: &str,
    api_port: u16,
    egress_selector: Option<&Path>,
) -> Component {
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let mut flags = vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={api_port}"),
        format!("--advertise-address={}", config.advertise),
        format!("--tls-cert-file={}", path(&pki.apiserver.cert)),
        format!("--tls-private-key-file={}", path(&pki.apiserver.key)),
        format!("--client-ca-file={}", path(&pki.ca.cert)),
        format!(
            "--kubelet-client-certificate={}",
            path(&pki.apiserver_kubelet.cert)
        ),
        format!("--kubelet-client-key={}", path(&pki.apiserver_kubelet.key)),
        format!("--kubelet-certificate-authority={}", path(&pki.ca.cert)),
        // kubeadm's order: a Node's address, not its hostname, which nothing here resolves.
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into(),
        format!(
            "--service-account-key-file={}",
            path(&pki.service_account_public)
        ),
        format!(
            "--service-account-signing-key-file={}",
            path(&pki.service_account_key)
        ),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDRS}"),
        "--service-node-port-range=30000-32767".into(),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--allow-privileged=true".into(),
        "--profiling=false".into(),
        "--v=1".into(),
    ];
    if let Some(file) = egress_selector {
        flags.push(format!("--egress-selector-config-file={}", path(file)));
    }
    Component::new("kube-apiserver", bin.join("kube-apiserver"), &flags)
}

/// The API server's egress selection: traffic to the cluster (nodes, pods, services)
/// through the HTTP CONNECT proxy listening on `socket`.
fn write_egress_selector(dir: &Path, socket: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("egress-selector.json");
    let config = serde_json::json!({
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [{
            "name": "cluster",
            "connection": {
                "proxyProtocol": "HTTPConnect",
                "transport": {"uds": {"udsName": socket}},
            },
        }],
    });
    std::fs::write(&path, serde_json::to_string_pretty(&config)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// kube-controller-manager: node IPAM, EndpointSlices, ServiceAccounts and the rest,
/// but the node lifecycle controller.
fn kube_controller_manager(
    bin: &Path,
    pki: &Pki,
    kubeconfig: &Path,
    port: u16,
    kubelets: bool,
) -> Component {
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let mut flags = controller_flags(kubeconfig, port);
    flags.extend([
        "--use-service-account-credentials=true".into(),
        format!(
            "--service-account-private-key-file={}",
            path(&pki.service_account_key)
        ),
        format!("--root-ca-file={}", path(&pki.ca.cert)),
        format!("--cluster-signing-cert-file={}", path(&pki.ca.cert)),
        format!("--cluster-signing-key-file={}", path(&pki.ca.key)),
        "--allocate-node-cidrs=true".into(),
        format!("--cluster-cidr={CLUSTER_CIDRS}"),
        "--node-cidr-mask-size-ipv4=24".into(),
        "--node-cidr-mask-size-ipv6=64".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDRS}"),
        // Without kubelet heartbeats the node lifecycle controller would mark every Node
        // unreachable after 40 s, and its pods not ready.
        if kubelets {
            "--controllers=*".into()
        } else {
            "--controllers=*,-node-lifecycle-controller".into()
        },
        // The footprint bench's clusters: 10,000 slices to write.
        "--kube-api-qps=1000".into(),
        "--kube-api-burst=2000".into(),
    ]);
    Component::new(
        "kube-controller-manager",
        bin.join("kube-controller-manager"),
        &flags,
    )
}

/// kube-scheduler.
fn kube_scheduler(bin: &Path, kubeconfig: &Path, port: u16) -> Component {
    Component::new(
        "kube-scheduler",
        bin.join("kube-scheduler"),
        &controller_flags(kubeconfig, port),
    )
}

/// What the controller manager and the scheduler are both given: their kubeconfig for
/// everything, loopback only, and no leader election.
fn controller_flags(kubeconfig: &Path, port: u16) -> Vec<String> {
    let path = kubeconfig.to_string_lossy();
    vec![
        format!("--kubeconfig={path}"),
        format!("--authentication-kubeconfig={path}"),
        format!("--authorization-kubeconfig={path}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--leader-elect=false".into(),
        "--v=1".into(),
    ]
}

impl ControlPlane {
    /// Starts a control plane in `dir` (made afresh, and removed when it drops) and waits
    /// until the API server is ready and the controllers run.
    pub fn start(dir: &Path, config: &ControlPlaneConfig) -> anyhow::Result<ControlPlane> {
        let bin = binaries()?;
        // What a killed control plane left here (its etcd data above all) is not this one's.
        match std::fs::remove_dir_all(dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(error).with_context(|| format!("removing {}", dir.display()));
            }
            _ => {}
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let pki = Pki::create(&dir.join("pki"), config)?;
        let api_port = match config.api_port {
            Some(port) => port,
            None => free_port()?,
        };
        // A port the caller chose is free until the API server binds it, so the others
        // must not be picked from it (the sandbox's `--api-port` comes from the same pool).
        let other_port = || -> anyhow::Result<u16> {
            loop {
                let port = free_port()?;
                if port != api_port {
                    return Ok(port);
                }
            }
        };
        let etcd_port = other_port()?;
        let etcd_peer_port = other_port()?;
        let url = format!("https://127.0.0.1:{api_port}");
        // A kubeconfig for one of the control plane's own client certificates.
        let client_kubeconfig = |name: &str, pair: &Pair| -> anyhow::Result<PathBuf> {
            let path = dir.join(format!("{name}.kubeconfig"));
            write_kubeconfig(&path, &url, &pki.ca, Credentials::Cert(pair))?;
            Ok(path)
        };
        let admin_kubeconfig = client_kubeconfig("admin", &pki.admin)?;
        let kcm_kubeconfig = client_kubeconfig("controller-manager", &pki.kcm)?;
        let scheduler_kubeconfig = client_kubeconfig("scheduler", &pki.scheduler)?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let egress_selector = match &config.cluster_egress {
            Some(socket) => Some(write_egress_selector(dir, socket)?),
            None => None,
        };
        let components = vec![
            etcd(&bin, dir, &etcd_url, etcd_peer_port),
            kube_apiserver(
                &bin,
                &pki,
                config,
                &etcd_url,
                api_port,
                egress_selector.as_deref(),
            ),
            kube_controller_manager(&bin, &pki, &kcm_kubeconfig, other_port()?, config.kubelets),
            kube_scheduler(&bin, &scheduler_kubeconfig, other_port()?),
        ];
        let mut plane = ControlPlane {
            dir: dir.to_path_buf(),
            bin,
            api_port,
            etcd_port,
            admin_kubeconfig,
            components,
        };
        for index in 0..plane.components.len() {
            plane.components[index].spawn(&plane.dir)?;
            match plane.components[index].name {
                "etcd" => plane.wait_etcd()?,
                "kube-apiserver" => plane.wait_ready()?,
                _ => {}
            }
        }
        // The controllers are up once the ServiceAccount controller has made `default`
        // in a namespace: pods can be created from then on.
        plane.wait_for("the controller manager's ServiceAccount controller", || {
            plane
                .kubectl(&[
                    "get",
                    "serviceaccount",
                    "default",
                    "-n",
                    "default",
                    "-o",
                    "name",
                ])
                .is_ok()
        })?;
        Ok(plane)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    pub fn api_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.api_port))
    }

    /// The built `kubectl`, as the cluster's administrator.
    fn kubectl_command(&self) -> Command {
        let mut command = Command::new(self.bin.join("kubectl"));
        command
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .stdin(Stdio::null());
        command
    }

    /// `kubectl <args>` as the administrator: its standard output, or an error with what
    /// it printed on standard error.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        run_with_input(self.kubectl_command().args(args), None)
    }

    /// `kubectl <args>` with `input` on standard input (`-f -`).
    pub fn kubectl_with_input(&self, args: &[&str], input: &str) -> anyhow::Result<String> {
        run_with_input(self.kubectl_command().args(args), Some(input))
    }

    /// Creates or updates `objects` as a client would (`kubectl apply`), then writes each
    /// one's `status` through the status subresource, where the API server keeps it (a
    /// Service's load-balancer ingress, a Pod's IPs): it drops the status of a create.
    pub fn apply(&self, objects: &[Value]) -> anyhow::Result<()> {
        if objects.is_empty() {
            return Ok(());
        }
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
        // Client-side apply: the server-side one refuses dual-stack Nodes, whose addresses
        // hold two InternalIPs where its schema keys the list by type.
        self.kubectl_with_input(&["apply", "-f", "-"], &list.to_string())?;
        for object in objects.iter().filter(|o| o.get("status").is_some()) {
            self.write_status(object)?;
        }
        Ok(())
    }

    /// Applies the repository's `deploy/base` as a user does (`kubectl apply -k`): nodus's
    /// ServiceAccount, RBAC, admission policy, ConfigMap and DaemonSet (whose pods no
    /// kubelet runs here).
    pub fn apply_deploy_base(&self) -> anyhow::Result<()> {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base");
        self.kubectl(&["apply", "-k", &base.to_string_lossy()])
            .map(drop)
            .context("applying deploy/base")
    }

    /// Parses `yaml` (documents separated by `---`) and [`ControlPlane::apply`]s them.
    pub fn apply_yaml(&self, yaml: &str) -> anyhow::Result<()> {
        let mut objects = Vec::new();
        for document in serde_saphyr::from_multiple::<Value>(yaml).context("parsing YAML")? {
            if document.is_object() {
                objects.push(document);
            }
        }
        self.apply(&objects)
    }

    fn write_status(&self, object: &Value) -> anyhow::Result<()> {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let patch = serde_json::json!({"status": object["status"]});
        let mut args = vec![
            "patch".to_string(),
            kind.to_lowercase(),
            name.to_string(),
            "--subresource=status".into(),
            "--type=merge".into(),
            "-p".into(),
            patch.to_string(),
        ];
        if let Some(namespace) = object["metadata"]["namespace"].as_str() {
            args.extend(["-n".into(), namespace.into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.kubectl(&args)
            .with_context(|| format!("writing the status of {kind} {name}"))?;
        Ok(())
    }

    /// A kubeconfig for nodus on `node`, as its DaemonSet pod has it: the `nodus`
    /// ServiceAccount of `deploy/base` (which must be applied) with a token bound to a pod
    /// on that node, so that it carries the node-name claim the admission policy reads.
    /// `server` is where nodus reaches the API (the relay's address for nodes in
    /// namespaces).
    pub fn nodus_kubeconfig(&self, node: &str, server: &str) -> anyhow::Result<PathBuf> {
        let token = self.nodus_token(node)?;
        let path = self.dir.join(format!("nodus-{node}.kubeconfig"));
        write_kubeconfig(&path, server, &self.ca(), Credentials::Token(&token))?;
        Ok(path)
    }

    /// The token of [`ControlPlane::nodus_kubeconfig`].
    pub fn nodus_token(&self, node: &str) -> anyhow::Result<String> {
        let pod = format!("nodus-token-{node}");
        // It only binds the token to the node. It tolerates every taint, as the
        // DaemonSet's pods do, so that no controller evicts it from a node without a
        // kubelet, which would end the token. Where a real kubelet runs it (the test bed's
        // real nodes), it is the pause image every node has, and it runs.
        let object = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": "kube-system"},
            "spec": {"nodeName": node, "serviceAccountName": "nodus",
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "nodus", "image": PAUSE_IMAGE,
                                     "imagePullPolicy": "Never"}]}
        });
        self.kubectl_with_input(&["apply", "-f", "-"], &object.to_string())?;
        let token = self.kubectl(&[
            "create",
            "token",
            "nodus",
            "-n",
            "kube-system",
            "--bound-object-kind=Pod",
            &format!("--bound-object-name={pod}"),
            "--duration=24h",
        ])?;
        Ok(token.trim().to_string())
    }

    /// One request with a bearer token, as a client without kubectl's reads before its
    /// writes sends it (nodus may patch a Node but not get one): the HTTP status and the
    /// body. `body` is JSON, sent as a merge patch for PATCH.
    pub fn request_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut command = Command::new("curl");
        command
            .args([
                "-sS",
                "-m",
                "10",
                "-X",
                method,
                "-w",
                "\n%{http_code}",
                "--cacert",
            ])
            .arg(&self.ca().cert)
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-H", "Content-Type: application/merge-patch+json"]);
        if body.is_some() {
            command.args(["--data-binary", "@-"]);
        }
        command.arg(format!("{}{path}", self.url()));
        let text = run_with_input(&mut command, body.map(Value::to_string).as_deref())?;
        let (answer, code) = text
            .trim_end()
            .rsplit_once('\n')
            .context("curl printed no status")?;
        Ok((
            code.parse()?,
            serde_json::from_str(answer).unwrap_or(Value::Null),
        ))
    }

    /// The CA, for kubeconfigs of other identities.
    fn ca(&self) -> Pair {
        Pair::at(&self.dir.join("pki"), "ca")
    }

    /// Stops the API server (SIGTERM, as a rollout does), and leaves it stopped until
    /// [`ControlPlane::start_api_server`], which starts it with the same command line. Its
    /// watch cache starts empty.
    pub fn stop_api_server(&mut self) {
        let index = self.index_of("kube-apiserver");
        self.components[index].stop();
    }

    pub fn start_api_server(&mut self) -> anyhow::Result<()> {
        let index = self.index_of("kube-apiserver");
        self.components[index].spawn(&self.dir)?;
        self.wait_ready()
    }

    /// Compacts etcd's history up to its current revision: a watch asked to resume from an
    /// older resourceVersion that the API server's cache no longer holds gets `410 Gone`.
    /// Returns the revision compacted to.
    pub fn compact_etcd(&self) -> anyhow::Result<u64> {
        let status = self.etcd_call("/v3/kv/range", r#"{"key":"AA==","limit":1}"#)?;
        let revision: u64 = status["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .context("etcd's answer has no revision")?;
        self.etcd_call(
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )?;
        Ok(revision)
    }

    /// Moves etcd's revision on with a write outside the API server's keys, as writes that
    /// nodus does not watch do.
    pub fn bump_etcd_revision(&self) -> anyhow::Result<()> {
        // "/nodus-test/bump" and "x", base64.
        self.etcd_call(
            "/v3/kv/put",
            r#"{"key":"L25vZHVzLXRlc3QvYnVtcA==","value":"eA=="}"#,
        )
        .map(drop)
    }

    /// A call to etcd's JSON gateway on loopback.
    fn etcd_call(&self, path: &str, body: &str) -> anyhow::Result<Value> {
        let text = run_with_input(
            Command::new("curl")
                .args([
                    "-sS",
                    "--fail",
                    "-m",
                    "10",
                    "-X",
                    "POST",
                    "--data-binary",
                    "@-",
                ])
                .arg(format!("http://127.0.0.1:{}{path}", self.etcd_port)),
            Some(body),
        )?;
        serde_json::from_str(&text).with_context(|| format!("etcd answered {path} with {text}"))
    }

    fn index_of(&self, name: &str) -> usize {
        self.components
            .iter()
            .position(|c| c.name == name)
            .expect("a component of the control plane")
    }

    fn wait_etcd(&self) -> anyhow::Result<()> {
        let etcd = self.index_of("etcd");
        self.wait_for("etcd to answer", || {
            Command::new("curl")
                .args(["-sf", "-m", "2"])
                .arg(format!("http://127.0.0.1:{}/health", self.etcd_port))
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map_err(|e| e.context(self.components[etcd].log_tail(&self.dir)))
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        let apiserver = self.index_of("kube-apiserver");
        self.wait_for("the API server's /readyz", || {
            self.kubectl(&["get", "--raw", "/readyz"])
                .is_ok_and(|body| body.trim() == "ok")
        })
        .map_err(|e| e.context(self.components[apiserver].log_tail(&self.dir)))
    }

    fn wait_for(&self, what: &str, mut check: impl FnMut() -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if check() {
                return Ok(());
            }
            if let Some(component) = self.components.iter().find(|c| {
                c.child
                    .as_ref()
                    .is_some_and(|child| !crate::netns::is_running(child.id() as i32))
            }) {
                bail!(
                    "{} exited while waiting for {what}; {}",
                    component.name,
                    component.log_tail(&self.dir)
                );
            }
            if Instant::now() > deadline {
                bail!("timed out after {START_LIMIT:?} waiting for {what}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // The scheduler and controllers first, etcd last.
        for component in self.components.iter_mut().rev() {
            component.stop();
        }
        if std::thread::panicking() {
            eprintln!("control plane logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Component {
    fn new(name: &'static str, program: PathBuf, args: &[String]) -> Component {
        Component {
            name,
            program,
            args: args.to_vec(),
            child: None,
        }
    }

    /// Starts it, logging to `<dir>/<name>.log` (appended across restarts). It dies with
    /// the thread that started it, so that a killed test leaves no control plane behind.
    fn spawn(&mut self, dir: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.log", self.name)))?;
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: prctl is async-signal-safe and touches only the child's own state.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGTERM, then SIGKILL after 10 s.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id() as i32;
        // SAFETY: signalling a child we own and have not reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn log_tail(&self, dir: &Path) -> String {
        let log =
            std::fs::read_to_string(dir.join(format!("{}.log", self.name))).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "{}.log ends:\n{}",
            self.name,
            lines[lines.len().saturating_sub(20)..].join("\n")
        )
    }
}

fn run_with_input(command: &mut Command, input: Option<&str>) -> anyhow::Result<String> {
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {:?}", command.get_program()))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(input.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "{:?} {:?} failed ({}): {}",
            command.get_program(),
            command.get_args().collect::<Vec<_>>(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// A key and certificate, as files.
#[derive(Clone, Debug)]
struct Pair {
    key: PathBuf,
    cert: PathBuf,
}

impl Pair {
    fn at(dir: &Path, name: &str) -> Pair {
        Pair {
            key: dir.join(format!("{name}.key")),
            cert: dir.join(format!("{name}.crt")),
        }
    }
}

/// The control plane's keys and certificates, made with `openssl`: one CA signs the API
/// server's serving certificate and every client's.
struct Pki {
    ca: Pair,
    apiserver: Pair,
    apiserver_kubelet: Pair,
    admin: Pair,
    kcm: Pair,
    scheduler: Pair,
    service_account_key: PathBuf,
    service_account_public: PathBuf,
}

/// openssl (Debian's package) run in the PKI's directory.
struct Openssl<'d> {
    dir: &'d Path,
}

impl Openssl<'_> {
    fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        run_with_input(
            Command::new("openssl").args(args).current_dir(self.dir),
            None,
        )
        .map(drop)
        .context("openssl (Debian's openssl package)")
    }

    /// An ECDSA P-256 key, `<name>.key`.
    fn key(&self, name: &str) -> anyhow::Result<()> {
        let out = format!("{name}.key");
        self.run(&[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            &out,
        ])
    }

    /// The CA, `ca.key` and a self-signed `ca.crt`.
    fn ca(&self) -> anyhow::Result<Pair> {
        self.key("ca")?;
        self.run(&[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=nodus-test-ca",
            "-days",
            "3650",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            "ca.crt",
        ])?;
        Ok(Pair::at(self.dir, "ca"))
    }

    /// A key and a certificate the CA signs for `subject`, with `extensions`.
    fn leaf(&self, name: &str, subject: &str, extensions: &str) -> anyhow::Result<Pair> {
        std::fs::write(self.dir.join(format!("{name}.ext")), extensions)?;
        self.key(name)?;
        let (key, csr) = (format!("{name}.key"), format!("{name}.csr"));
        self.run(&["req", "-new", "-key", &key, "-subj", subject, "-out", &csr])?;
        let (ext, crt) = (format!("{name}.ext"), format!("{name}.crt"));
        self.run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ])?;
        Ok(Pair::at(self.dir, name))
    }
}

/// The API server's certificate extensions: its names and addresses, the advertised one
/// and `extra_sans` among them.
fn server_extensions(config: &ControlPlaneConfig) -> String {
    let mut sans: Vec<String> = [
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
        "IP:127.0.0.1",
        "IP:10.96.0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    sans.extend(
        std::iter::once(config.advertise)
            .chain(config.extra_sans.iter().copied())
            .map(|ip| format!("IP:{ip}")),
    );
    format!(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName={}\n",
        sans.join(",")
    )
}

impl Pki {
    fn create(dir: &Path, config: &ControlPlaneConfig) -> anyhow::Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let openssl = Openssl { dir };
        let ca = openssl.ca()?;
        let client = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n";
        let server = server_extensions(config);
        let apiserver = openssl.leaf("apiserver", "/CN=kube-apiserver", &server)?;
        let apiserver_kubelet = openssl.leaf(
            "apiserver-kubelet-client",
            "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client",
            client,
        )?;
        let admin = openssl.leaf("admin", "/O=system:masters/CN=kubernetes-admin", client)?;
        let kcm = openssl.leaf(
            "controller-manager",
            "/CN=system:kube-controller-manager",
            client,
        )?;
        let scheduler = openssl.leaf("scheduler", "/CN=system:kube-scheduler", client)?;
        openssl.run(&["genrsa", "-out", "sa.key", "2048"])?;
        openssl.run(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
        Ok(Pki {
            ca,
            apiserver,
            apiserver_kubelet,
            admin,
            kcm,
            scheduler,
            service_account_key: dir.join("sa.key"),
            service_account_public: dir.join("sa.pub"),
        })
    }
}

enum Credentials<'a> {
    Cert(&'a Pair),
    Token(&'a str),
}

/// A kubeconfig for `server` that trusts `ca`, with the certificates' contents inline.
fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Pair,
    user: Credentials<'_>,
) -> anyhow::Result<()> {
    use base64::Engine as _;
    let inline = |file: &Path| -> anyhow::Result<String> {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let user = match user {
        Credentials::Cert(pair) => serde_json::json!({
            "client-certificate-data": inline(&pair.cert)?,
            "client-key-data": inline(&pair.key)?,
        }),
        Credentials::Token(token) => serde_json::json!({"token": token}),
    };
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": server, "certificate-authority-data": inline(&ca.cert)?}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        "current-context": "test",
    });
    std::fs::write(path, serde_json::to_string_pretty(&config)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// A TCP relay to the API server: listens where the API server cannot (inside a network
/// namespace, or on a port of its own) and forwards each connection to it. It can cut
/// every connection it carries at once, as a lost network does, which the API server
/// itself cannot be made to do.
pub struct Relay {
    pub addr: SocketAddr,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    listener: TcpListener,
}

impl Relay {
    /// Relays connections accepted on `listener` to `target`.
    pub fn start(listener: TcpListener, target: SocketAddr) -> anyhow::Result<Relay> {
        let addr = listener.local_addr()?;
        let connections: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let accepting = listener.try_clone()?;
        let tracked = connections.clone();
        std::thread::spawn(move || {
            for client in accepting.incoming() {
                let Ok(client) = client else { break };
                let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else {
                    continue;
                };
                let (Ok(client_read), Ok(server_read)) = (client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                {
                    let mut tracked = tracked.lock().unwrap_or_else(PoisonError::into_inner);
                    tracked.retain(|s| s.peer_addr().is_ok());
                    if let (Ok(a), Ok(b)) = (client.try_clone(), server.try_clone()) {
                        tracked.push(a);
                        tracked.push(b);
                    }
                }
                std::thread::spawn(move || copy(client_read, server));
                std::thread::spawn(move || copy(server_read, client));
            }
        });
        Ok(Relay {
            addr,
            connections,
            listener,
        })
    }

    /// Relays `127.0.0.1:<free port>` to `target`.
    pub fn on_loopback(target: SocketAddr) -> anyhow::Result<Relay> {
        Relay::start(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?, target)
    }

    /// Relays `addr` inside namespace `ns` to `target` in this one.
    pub fn in_namespace(
        ns: &crate::netns::Netns,
        addr: SocketAddr,
        target: SocketAddr,
    ) -> anyhow::Result<Relay> {
        let listener = ns
            .enter(|| TcpListener::bind(addr))?
            .with_context(|| format!("binding {addr} in {}", ns.name()))?;
        Relay::start(listener, target)
    }

    /// Closes every connection it relays now; new ones are relayed again.
    pub fn cut(&self) {
        let mut tracked = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for stream in tracked.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        wake_accepting(&self.listener);
        self.cut();
    }
}

/// Shuts a listening socket down, which wakes the thread blocked accepting on it (a copy
/// of it), and that thread ends; the descriptor stays open until its owner drops.
fn wake_accepting(listener: &impl std::os::fd::AsRawFd) {
    // SAFETY: shutdown(2) of a listening socket the caller owns, open for the call.
    unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// An HTTP CONNECT proxy on a Unix socket, through which the API server reaches the
/// cluster ([`ControlPlaneConfig::cluster_egress`]): each `CONNECT host:port` is dialled
/// from inside one network namespace (the nodes' underlay), so that the API server on
/// this namespace's loopback reaches kubelets and pods without a route to them here.
pub struct EgressProxy {
    pub socket: PathBuf,
    listener: std::os::unix::net::UnixListener,
}

impl EgressProxy {
    /// Listens on `socket` and dials into the namespace named `netns`.
    pub fn start(socket: &Path, netns: &str) -> anyhow::Result<EgressProxy> {
        remove_stale_socket(socket)?;
        let listener = std::os::unix::net::UnixListener::bind(socket)
            .with_context(|| format!("binding {}", socket.display()))?;
        let accepting = listener.try_clone()?;
        let netns = netns.to_string();
        std::thread::spawn(move || {
            for client in accepting.incoming() {
                let Ok(client) = client else { break };
                let netns = netns.clone();
                std::thread::spawn(move || {
                    if let Err(error) = tunnel(client, &netns) {
                        tracing::debug!("egress proxy: {error:#}");
                    }
                });
            }
        });
        Ok(EgressProxy {
            socket: socket.to_path_buf(),
            listener,
        })
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        wake_accepting(&self.listener);
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn remove_stale_socket(socket: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(socket) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(error).with_context(|| format!("removing {}", socket.display()))
        }
        _ => Ok(()),
    }
}

/// Reads one `CONNECT host:port` request, dials it inside `netns`, answers 200 and copies
/// both ways until either side closes.
fn tunnel(client: std::os::unix::net::UnixStream, netns: &str) -> anyhow::Result<()> {
    use std::io::BufRead as _;
    let mut reader = std::io::BufReader::new(client.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    let target = request
        .strip_prefix("CONNECT ")
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("not a CONNECT request: {request:?}"))?
        .to_string();
    // The headers, up to the empty line.
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim_end().is_empty() {
            break;
        }
    }
    let mut answer = client.try_clone()?;
    let addr: SocketAddr = match target.parse() {
        Ok(addr) => addr,
        Err(_) => {
            answer.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")?;
            bail!("CONNECT to {target}: not an address and port");
        }
    };
    let server = crate::netns::enter(netns, || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5))
    })?;
    let server = match server {
        Ok(server) => server,
        Err(error) => {
            answer.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")?;
            return Err(error).with_context(|| format!("dialling {addr} in {netns}"));
        }
    };
    answer.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    // What the client sent after its request is in the reader's buffer: send it first.
    let buffered = reader.buffer().to_vec();
    let mut upstream = server.try_clone()?;
    upstream.write_all(&buffered)?;
    let mut downstream = client;
    let from_client = std::thread::spawn(move || {
        let _ = std::io::copy(reader.get_mut(), &mut upstream);
        let _ = upstream.shutdown(Shutdown::Write);
    });
    let mut from_server = server;
    let _ = std::io::copy(&mut from_server, &mut downstream);
    let _ = downstream.shutdown(Shutdown::Write);
    let _ = from_client.join();
    Ok(())
}

/// What a kubelet on one node authenticates with, made by the cluster's CA.
pub struct KubeletCredentials {
    /// A kubeconfig as `system:node:<node>` in `system:nodes`, which the Node authorizer
    /// and NodeRestriction judge.
    pub kubeconfig: PathBuf,
    /// The kubelet's serving certificate and key, for the node's address: the API server
    /// checks it against the CA (`--kubelet-certificate-authority`).
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// The CA that signs the API server's clients, for the kubelet's x509 authentication.
    pub client_ca: PathBuf,
}

impl ControlPlane {
    /// A kubelet's credentials for `node` at `ip`, reaching the API server at `server`.
    pub fn kubelet_credentials(
        &self,
        node: &str,
        ip: IpAddr,
        server: &str,
    ) -> anyhow::Result<KubeletCredentials> {
        let pki = self.dir.join("pki");
        let openssl = Openssl { dir: &pki };
        let client = openssl.leaf(
            &format!("kubelet-{node}"),
            &format!("/O=system:nodes/CN=system:node:{node}"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
        )?;
        let serving = openssl.leaf(
            &format!("kubelet-{node}-serving"),
            &format!("/O=system:nodes/CN=system:node:{node}"),
            &format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:{node},IP:{ip}\n"
            ),
        )?;
        let kubeconfig = self.dir.join(format!("kubelet-{node}.kubeconfig"));
        write_kubeconfig(&kubeconfig, server, &self.ca(), Credentials::Cert(&client))?;
        Ok(KubeletCredentials {
            kubeconfig,
            serving_cert: serving.cert,
            serving_key: serving.key,
            client_ca: self.ca().cert,
        })
    }
}
