//! Real Kubernetes nodes for the test bed: containerd 2 (its CRI plugin, with Debian's
//! `runc`) and a kubelet, both built from their modules by `k8s/build.sh`, running in a
//! node's network namespace and in a mount namespace of their own.
//!
//! The mount namespace gives each node what a machine has to itself: `/run` (containerd's
//! socket and state, the pods' network namespaces), `/var/lib` (the kubelet's root, the
//! CNI plugins' address leases) and `/var/log` (the pods' logs) are private tmpfs, so two
//! kubelets on one machine never see each other's files. The kernel settings a kubelet
//! writes at start (`vm.overcommit_memory`, `kernel.panic`, …) are machine-wide; in the
//! node's mount namespace they are files of its own, so this machine's stay as they are.
//! Pods run in a cgroup of the node's own ([`KubeletNode::cgroup_root`]), below which
//! everything is killed and removed when the node drops, with the mount namespace and
//! everything mounted in it.
//!
//! Daemons enter the node's network namespace with `nsenter`, not `ip netns exec`, which
//! remounts `/sys` and hides the cgroup mounts from runc and the kubelet.

#![allow(unsafe_code)] // kill(2) of the node's own processes, each with its SAFETY comment

use crate::control_plane::{KubeletCredentials, PAUSE_IMAGE, k8s_script};
use anyhow::{Context, bail};
use std::io::BufRead as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The machine-wide kernel settings a kubelet sets at start, each given a file of its own
/// in the node's mount namespace.
const KERNEL_TUNABLES: [(&str, &str); 4] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
];

/// The cgroup hierarchies a kubelet with the `cgroupfs` driver uses: every v1 one mounted
/// here, the named `systemd` one included, and the hybrid's `unified` (cgroup2, no
/// controllers), where runc makes each container's cgroup too.
const CGROUP_HIERARCHIES: [&str; 10] = [
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd",
    "unified",
];

/// Where the node's CNI configuration and plugins are, in its mount namespace.
const CNI_CONF_DIR: &str = "/etc/cni/net.d";
const CNI_BIN_DIR: &str = "/opt/cni/bin";

/// containerd's socket inside the node's mount namespace.
const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// How long containerd may take to answer on its socket.
const START_LIMIT: Duration = Duration::from_secs(60);

/// Where `k8s/build.sh` put a real node's binaries (kubelet, containerd, its runc shim,
/// ctr) and `k8s/images.sh` the images its pods run: built once if missing.
pub struct NodeBinaries {
    pub bin: PathBuf,
    /// OCI archives, imported before the kubelet starts: the upstream images under their
    /// upstream names (pause, agnhost, …), and whatever a caller adds (nodus's).
    pub images: Vec<PathBuf>,
}

impl NodeBinaries {
    pub fn get() -> anyhow::Result<NodeBinaries> {
        static BUILT: Mutex<Option<(PathBuf, PathBuf)>> = Mutex::new(None);
        let mut built = BUILT.lock().unwrap_or_else(PoisonError::into_inner);
        let (bin, images) = match built.as_ref() {
            Some(dirs) => dirs.clone(),
            None => {
                let bin = k8s_script(
                    "build.sh",
                    &["kubelet", "containerd", "containerd-shim-runc-v2", "ctr"],
                )?;
                let images = k8s_script("images.sh", &[])?;
                *built = Some((bin.clone(), images.clone()));
                (bin, images)
            }
        };
        let mut archives: Vec<PathBuf> = std::fs::read_dir(&images)
            .with_context(|| format!("reading {}", images.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|e| e == "tar"))
            .collect();
        archives.sort();
        Ok(NodeBinaries {
            bin,
            images: archives,
        })
    }
}

/// What a real node is made with.
pub struct KubeletNodeConfig<'a> {
    /// The Node's name, which the kubelet registers.
    pub name: &'a str,
    /// The network namespace (`ip netns` name) the node's daemons run in.
    pub netns: &'a str,
    /// The node's address in that namespace: the kubelet serves there and reports it.
    pub ip: IpAddr,
    /// The node's own directory: containerd's root, the configurations and the logs.
    pub dir: &'a Path,
    pub credentials: &'a KubeletCredentials,
    /// The node's CNI configuration directory (nodus writes its conflist there) and plugin
    /// directory (`nodus install-cni` copies them there), which the node sees at the usual
    /// `/etc/cni/net.d` and `/opt/cni/bin`.
    pub cni_conf_dir: &'a Path,
    pub cni_bin_dir: &'a Path,
    /// The address pods ask for DNS (the `kube-dns` Service's).
    pub cluster_dns: IpAddr,
    /// The node's topology zone (`topology.kubernetes.io/zone`), which the kubelet labels
    /// its Node with.
    pub zone: &'a str,
}

/// containerd and a kubelet running for one node.
pub struct KubeletNode {
    pub name: String,
    dir: PathBuf,
    /// `sleep`, holding the node's mount namespace: every daemon enters it through this
    /// process.
    holder: Child,
    daemons: Vec<Child>,
    /// The cgroup (the same path in every v1 hierarchy) below which the pods run.
    pub cgroup_root: String,
}

impl KubeletNode {
    /// Starts containerd, imports `binaries.images` and starts the kubelet, which then
    /// registers its Node. Returns once the kubelet runs; the Node's readiness is the
    /// caller's to wait for (it needs the CNI configuration, which nodus writes).
    pub fn start(
        config: &KubeletNodeConfig<'_>,
        binaries: &NodeBinaries,
    ) -> anyhow::Result<KubeletNode> {
        std::fs::create_dir_all(config.dir)
            .with_context(|| format!("creating {}", config.dir.display()))?;
        let cgroup_root = format!(
            "/nodus-{}-{}",
            config.name,
            crate::netns::unique_name("k").trim_start_matches('k')
        );
        let holder = hold_mount_namespace(config)?;
        let mut node = KubeletNode {
            name: config.name.to_string(),
            dir: config.dir.to_path_buf(),
            holder,
            daemons: Vec::new(),
            cgroup_root,
        };
        node.make_cgroup_root()?;
        let containerd_config = write_containerd_config(config)?;
        let path = format!(
            "{}:{}",
            binaries.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut containerd = node.command(&binaries.bin.join("containerd"));
        containerd
            .arg("--config")
            .arg(&containerd_config)
            .env("PATH", &path);
        node.spawn("containerd", containerd)?;
        node.wait_for_containerd(&binaries.bin)?;
        for image in &binaries.images {
            node.run(
                Command::new(binaries.bin.join("ctr"))
                    .args(["--address", CONTAINERD_SOCKET, "-n", "k8s.io"])
                    .args(["images", "import"])
                    .arg(image),
            )
            .with_context(|| format!("importing {}", image.display()))?;
        }
        let kubelet_config = write_kubelet_config(config, &node.cgroup_root)?;
        let mut kubelet = node.command(&binaries.bin.join("kubelet"));
        kubelet
            .arg(format!("--config={}", kubelet_config.display()))
            .arg(format!(
                "--kubeconfig={}",
                config.credentials.kubeconfig.display()
            ))
            .arg(format!("--hostname-override={}", config.name))
            .arg(format!("--node-ip={}", config.ip))
            .arg(format!(
                "--node-labels=topology.kubernetes.io/zone={}",
                config.zone
            ))
            .arg("--v=1")
            .env("PATH", &path);
        node.spawn("kubelet", kubelet)?;
        Ok(node)
    }

    /// `program` in the node's network and mount namespaces.
    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--target={}", self.holder.id()))
            .args(["--mount", "--net", "--"])
            .arg(program)
            .stdin(Stdio::null());
        command
    }

    /// Runs `command` (a program and its arguments) in the node's namespaces, to its end.
    fn run(&self, command: &mut Command) -> anyhow::Result<String> {
        let mut inside = self.command(Path::new(command.get_program()));
        inside.args(command.get_args());
        let output = inside.output().context("nsenter")?;
        if !output.status.success() {
            bail!(
                "{:?} failed ({}): {}",
                command.get_program(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Starts a daemon, its output in `<dir>/<name>.log`.
    fn spawn(&mut self, name: &str, mut command: Command) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.log_path(name))?;
        command.stdout(log.try_clone()?).stderr(log);
        let child = command
            .spawn()
            .with_context(|| format!("starting {name} for {}", self.name))?;
        self.daemons.push(child);
        Ok(())
    }

    /// Runs `program` with `args` in the node's network and mount namespaces (its own
    /// `/run`, for one), to its end: its standard output.
    pub fn exec(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        self.run(Command::new(program).args(args))
    }

    pub fn log_path(&self, daemon: &str) -> PathBuf {
        self.dir.join(format!("{daemon}.log"))
    }

    /// The last lines of a daemon's log, for an error message.
    pub fn log_tail(&self, daemon: &str) -> String {
        let text = std::fs::read_to_string(self.log_path(daemon)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn wait_for_containerd(&mut self, bin: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let answered = self.run(
                Command::new(bin.join("ctr"))
                    .args(["--address", CONTAINERD_SOCKET])
                    .arg("version"),
            );
            if answered.is_ok() {
                return Ok(());
            }
            let exited = self
                .daemons
                .iter_mut()
                .any(|d| matches!(d.try_wait(), Ok(Some(_))));
            if exited || Instant::now() > deadline {
                bail!(
                    "containerd of {} did not answer: {}",
                    self.name,
                    self.log_tail("containerd")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The node's cgroup in every hierarchy; in `cpuset` with its parent's CPUs and memory
    /// nodes, which a new cpuset does not inherit.
    fn make_cgroup_root(&self) -> anyhow::Result<()> {
        for hierarchy in CGROUP_HIERARCHIES {
            let base = Path::new("/sys/fs/cgroup").join(hierarchy);
            let dir = base.join(self.cgroup_root.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if hierarchy == "cpuset" {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let value = std::fs::read_to_string(base.join(file))?;
                    std::fs::write(dir.join(file), value.trim())
                        .with_context(|| format!("writing {}", dir.join(file).display()))?;
                }
            }
        }
        Ok(())
    }

    /// Kills every process below the node's cgroup, then removes its cgroups, deepest
    /// first.
    fn remove_cgroups(&self) {
        for hierarchy in CGROUP_HIERARCHIES {
            let root = Path::new("/sys/fs/cgroup")
                .join(hierarchy)
                .join(self.cgroup_root.trim_start_matches('/'));
            let mut dirs = Vec::new();
            collect_dirs(&root, &mut dirs);
            for dir in &dirs {
                kill_procs(&dir.join("cgroup.procs"));
            }
            // Deepest first: a cgroup with children cannot be removed.
            dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
            for dir in dirs {
                for _ in 0..50 {
                    if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                        break;
                    }
                    kill_procs(&dir.join("cgroup.procs"));
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

impl Drop for KubeletNode {
    fn drop(&mut self) {
        for daemon in self.daemons.iter_mut().rev() {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        // The containers, and the shims, which left containerd's process tree.
        self.remove_cgroups();
        kill_in_mount_namespace(self.holder.id());
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        // containerd's root: its snapshots were mounted in the namespace that just ended.
        let _ = std::fs::remove_dir_all(self.dir.join("containerd"));
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
}

fn kill_procs(procs: &Path) {
    let Ok(text) = std::fs::read_to_string(procs) else {
        return;
    };
    for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        // SAFETY: kill(2) with a pid read from the node's own cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Kills every process in the mount namespace `holder` holds but `holder` itself: the
/// runc shims, which left containerd's process tree and cgroup.
fn kill_in_mount_namespace(holder: u32) {
    let Ok(ours) = std::fs::read_link(format!("/proc/{holder}/ns/mnt")) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid as u32 == holder {
            continue;
        }
        if std::fs::read_link(entry.path().join("ns/mnt")).is_ok_and(|ns| ns == ours) {
            // SAFETY: kill(2) of a process in the node's own mount namespace.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// A process in the node's network namespace and a new mount namespace with the node's
/// private tmpfs, CNI directories and kernel-setting files mounted, sleeping until killed.
/// Returns once the mounts are made.
fn hold_mount_namespace(config: &KubeletNodeConfig<'_>) -> anyhow::Result<Child> {
    let tunables = config.dir.join("sysctl");
    std::fs::create_dir_all(&tunables)?;
    let mut script = String::from("set -e\n");
    for target in ["/run", "/var/lib", "/var/log"] {
        script.push_str(&format!("mount -t tmpfs -o mode=0755 tmpfs {target}\n"));
    }
    // The DaemonSet's host paths and containerd's defaults. Their mount points are made on
    // this machine if it lacks them (empty directories); only the node sees what is in them.
    for (dir, target) in [
        (config.cni_conf_dir, CNI_CONF_DIR),
        (config.cni_bin_dir, CNI_BIN_DIR),
    ] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        script.push_str(&format!(
            "mkdir -p {target}\nmount --bind {} {target}\n",
            dir.display()
        ));
    }
    for (key, value) in KERNEL_TUNABLES {
        let file = tunables.join(key.replace('/', "."));
        std::fs::write(&file, format!("{value}\n"))?;
        script.push_str(&format!(
            "mount --bind {} /proc/sys/{key}\n",
            file.display()
        ));
    }
    script.push_str("echo ready\nexec sleep infinity\n");
    let mut holder = Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{}", config.netns))
        .args(["--", "unshare", "--mount", "--propagation", "private", "--"])
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the node's mount namespace (nsenter, unshare)")?;
    let stdout = holder.stdout.take().context("the holder's stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = holder.kill();
        let output = holder.wait_with_output()?;
        bail!(
            "the node's mount namespace: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(holder)
}

/// containerd's configuration: its root in the node's directory, its socket and state in
/// the node's `/run`, the CRI plugin with runc under cgroupfs, the pinned pause image and
/// the CNI directories at their usual paths.
fn write_containerd_config(config: &KubeletNodeConfig<'_>) -> anyhow::Result<PathBuf> {
    let path = config.dir.join("containerd.toml");
    let root = config.dir.join("containerd");
    let text = format!(
        r#"version = 4
root = "{root}"
state = "/run/containerd"

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"

[plugins.'io.containerd.cri.v1.runtime']
  # No process here may lower its OOM score (the machine withholds CAP_SYS_RESOURCE):
  # pods get at least containerd's own, where the pause container would get -998.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{CNI_CONF_DIR}"
    max_conf_num = 1
"#,
        root = root.display(),
        pause = PAUSE_IMAGE,
    );
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The kubelet's configuration: cgroup v1 allowed, cgroupfs below the node's cgroup,
/// TLS with the CA's certificate, clients of the CA only, no image garbage collection
/// (nothing can be pulled again) and no eviction on this shared machine's disk.
fn write_kubelet_config(
    config: &KubeletNodeConfig<'_>,
    cgroup_root: &str,
) -> anyhow::Result<PathBuf> {
    let resolv_conf = config.dir.join("resolv.conf");
    std::fs::write(&resolv_conf, format!("nameserver {}\n", config.cluster_dns))?;
    let credentials = config.credentials;
    let kubelet = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "containerRuntimeEndpoint": format!("unix://{CONTAINERD_SOCKET}"),
        "address": config.ip.to_string(),
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": credentials.serving_cert,
        "tlsPrivateKeyFile": credentials.serving_key,
        "authentication": {
            "x509": {"clientCAFile": credentials.client_ca},
            "webhook": {"enabled": false},
            "anonymous": {"enabled": false},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [config.cluster_dns.to_string()],
        "resolvConf": resolv_conf,
        "failSwapOn": false,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": false,
        "protectKernelDefaults": false,
    });
    let path = config.dir.join("kubelet.json");
    std::fs::write(&path, serde_json::to_string_pretty(&kubelet)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
