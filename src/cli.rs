//! The command line: every subcommand and its flags.

use clap::{Args, Parser, Subcommand};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "nodus", version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand)]
pub enum Command {
    /// Watch the cluster and keep this node's dataplane in step (the default).
    Run(RunArgs),
    /// Print the resolved node view as JSON once the initial lists are in, or stream changes.
    View(ViewArgs),
    /// Ask a running nodus (at --http-addr, else the configuration's) what each subsystem
    /// is doing, and print one screen.
    Status(StatusArgs),
    /// Validate a configuration file and exit.
    CheckConfig {
        /// The YAML file to check.
        file: PathBuf,
        /// Also check that this host can run it: the kernel and nftables for the proxy,
        /// the WireGuard backend and the CNI directory for the mesh, DNS's listen
        /// addresses free (root needed, as for `nodus run`).
        #[arg(long)]
        host: bool,
    },
    /// The service proxy's ruleset.
    #[command(subcommand)]
    Proxy(ProxyCommand),
    /// Remove what nodus programmed on this host: the `inet nodus` nftables table, the
    /// WireGuard device (with its routes) and the CNI conflist. The key file stays.
    Cleanup {
        /// Do not ask for confirmation. `--config` names the device and the conflist
        /// (the defaults otherwise).
        #[arg(long)]
        yes: bool,
        /// Instead, remove what kube-proxy left, and nothing of nodus's: its `ip`/`ip6
        /// kube-proxy` nftables tables, its iptables chains (through
        /// `iptables-save`/`-restore` when installed) and its IPVS mode's `kube-ipvs0`;
        /// the kubelet's chains stay. Lists them first.
        #[arg(long, conflicts_with = "foreign")]
        kube_proxy: bool,
        /// Instead, remove what kube-proxy and flannel left, and nothing of nodus's:
        /// kube-proxy's as `--kube-proxy` does, and flannel's `ip`/`ip6 flannel` tables,
        /// `FLANNEL-*` iptables chains, `flannel.1`, `flannel-v6.1`, `flannel-wg*` and
        /// `cni0` devices and its CNI configuration beside the mesh's conflist. Lists
        /// them first.
        #[arg(long)]
        foreign: bool,
    },
    /// Copy the CNI plugins the mesh's conflist uses (nodus's own `nodus-cni`, which is
    /// this binary, and host-local, portmap and loopback) into the runtime's plugin
    /// directory: the DaemonSet's init container.
    InstallCni {
        /// Where the reference plugins are (the image's copy of Debian's
        /// containernetworking-plugins).
        #[arg(long, default_value = "/usr/lib/nodus/cni")]
        from: PathBuf,
        /// The runtime's CNI binary directory (`/opt/cni/bin`), as mounted.
        #[arg(long)]
        to: PathBuf,
        /// Replace a plugin of the same name that the directory holds already. Without it
        /// that plugin is the host's (a containerd package's, k3s's, Talos's) and is kept.
        #[arg(long)]
        replace: bool,
    },
    /// Bring up a simulated cluster on this machine (root needed) until Ctrl-C.
    #[cfg(feature = "sandbox")]
    Sandbox(nodus_testbed::sandbox::SandboxArgs),
    /// A tiny TCP and UDP echo server answering with its name (the sandbox's pods).
    #[cfg(feature = "sandbox")]
    #[command(hide = true)]
    Echo(nodus_testbed::sandbox::EchoArgs),
}

#[derive(Subcommand)]
pub enum ProxyCommand {
    /// Print the ruleset planned for this node in `nft -f` syntax.
    Render(ClusterArgs),
    /// Follow a connection's first packet through the ruleset planned for this node, rule
    /// by rule, to the endpoints it can reach or to where it is dropped or rejected.
    Trace(TraceArgs),
}

#[derive(Args, Clone, Debug)]
pub struct TraceArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Where the connection goes: ADDRESS:PORT, or [ADDRESS]:PORT for IPv6.
    pub destination: SocketAddr,
    /// The client's address [default: this node's primary address of the destination's
    /// family].
    #[arg(long, value_name = "ADDRESS")]
    pub from: Option<IpAddr>,
    /// Where the packet enters [default: `host` for one of this node's addresses, `pod`
    /// for one of its pod ranges, else `outside`].
    #[arg(long, value_enum)]
    pub entry: Option<TraceEntry>,
    #[arg(long, value_enum, default_value_t)]
    pub protocol: TraceProtocol,
    /// Read the view the agent saved in DIR (its `state_dir`) instead of listing the
    /// cluster from the API server.
    #[arg(long, value_name = "DIR")]
    pub saved_view: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum TraceEntry {
    Pod,
    Host,
    Outside,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq)]
pub enum TraceProtocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

/// The embedded WireGuard device logs every peer it adds or removes at info (thousands at
/// a cold start).
pub const DEFAULT_LOG_FILTER: &str = "info,defguard_boringtun=warn";

/// How to reach the cluster and which node this is.
#[derive(Args, Clone, Debug, Default)]
pub struct ClusterArgs {
    /// kubeconfig file; without it nodus uses $KUBECONFIG, else the in-cluster account,
    /// else ~/.kube/config.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's URL, overriding the configuration's `api_server` (empty: unset).
    #[arg(long, env = "NODUS_API_SERVER", global = true, value_name = "URL")]
    pub api_server: Option<String>,
    /// The name of the Node nodus runs on.
    #[arg(long, env = "NODE_NAME", global = true, default_value = "")]
    pub node_name: String,
    /// Configuration file (YAML); flags override it.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Log filter, e.g. `info` or `nodus=debug,kube=warn`.
    #[arg(
        long,
        env = "NODUS_LOG",
        global = true,
        default_value = DEFAULT_LOG_FILTER
    )]
    pub log_level: String,
    /// Log lines for people (`text`) or for a log pipeline (`json`, one object a line).
    #[arg(
        long,
        env = "NODUS_LOG_FORMAT",
        global = true,
        value_enum,
        default_value_t
    )]
    pub log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Args, Clone, Debug, Default)]
pub struct RunArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Address for /healthz, /readyz, /metrics and /status [default: 127.0.0.1:10256].
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// Run PROGRAM after every batch of changes, with the changed services and nodes as
    /// JSON lines (`nodus view --watch`'s format) on its stdin.
    #[arg(long, value_name = "PROGRAM")]
    pub on_change: Option<PathBuf>,
    /// Seconds a --on-change run may take before it is killed.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub on_change_timeout: u64,
    /// Accept a plain http:// API server (test beds): by default only https:// is used.
    #[arg(long, env = "NODUS_ALLOW_HTTP_API")]
    pub allow_http_api: bool,
    /// Where nodus keeps what outlives the process [default: the configuration's
    /// `state_dir`].
    #[arg(long, env = "NODUS_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

#[derive(Args, Clone, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The agent's HTTP address [default: the configuration's `http_addr`].
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
}

#[derive(Args, Clone, Debug)]
pub struct ViewArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Keep running and print one JSON line per changed service or node.
    #[arg(long)]
    pub watch: bool,
    /// Where `--watch` follows the view from: the running agent's subscription socket
    /// (`agent`), a watch of the API server of its own (`api`), or the agent when one
    /// answers at the socket, else the API server (`auto`).
    #[arg(long, value_enum, default_value_t, requires = "watch")]
    pub source: ViewSource,
    /// The agent's subscription socket [default: the configuration's `subscribe.socket`,
    /// else `view-<node>.sock` in the state directory].
    #[arg(long, value_name = "PATH", requires = "watch")]
    pub socket: Option<PathBuf>,
    /// The agent's state directory, where its socket is by default [default: the
    /// configuration's `state_dir`].
    #[arg(long, env = "NODUS_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq)]
pub enum ViewSource {
    #[default]
    Auto,
    Agent,
    Api,
}
