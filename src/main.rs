//! nodus: one node agent in place of kube-proxy, CoreDNS and a CNI overlay.
//!
//! This binary watches the API server, keeps the node view up to date, and serves health
//! and metrics. Subcommands print the view for people and scripts (`view`), validate a
//! configuration (`check-config`), and bring up a simulated cluster (`sandbox`).

mod config;
mod feed;
mod http;
mod metrics;
mod on_change;
mod proxy_cmd;
mod run;
mod sandbox;
mod status;
mod view_cmd;
mod watch;

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "nodus", version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Watch the cluster and keep this node's dataplane in step (the default).
    Run(RunArgs),
    /// Print the resolved node view as JSON once the initial lists are in, or stream changes.
    View(ViewArgs),
    /// Ask a running nodus (at --http-addr, else the configuration's) what each subsystem
    /// is doing, and print one screen.
    Status(RunArgs),
    /// Validate a configuration file and exit.
    CheckConfig {
        /// The YAML file to check.
        file: PathBuf,
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
    },
    /// Bring up a simulated cluster on this machine (root needed) until Ctrl-C.
    Sandbox(sandbox::SandboxArgs),
    /// A tiny TCP and UDP echo server answering with its name (the sandbox's pods).
    #[command(hide = true)]
    Echo(sandbox::EchoArgs),
}

#[derive(Subcommand)]
enum ProxyCommand {
    /// Print the ruleset planned for this node in `nft -f` syntax.
    Render(ClusterArgs),
}

/// hickory-server logs every malformed packet at info, and the embedded WireGuard device
/// every peer it adds or removes (thousands at a cold start).
const DEFAULT_LOG_FILTER: &str = "info,hickory_server=warn,defguard_boringtun=warn";

/// How to reach the cluster and which node this is.
#[derive(Args, Clone, Debug, Default)]
pub struct ClusterArgs {
    /// kubeconfig file; without it nodus uses $KUBECONFIG, else the in-cluster account,
    /// else ~/.kube/config.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
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
}

#[derive(Args, Clone, Debug)]
pub struct ViewArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Keep running and print one JSON line per changed service or node.
    #[arg(long)]
    pub watch: bool,
}

fn init_logging(cluster: &ClusterArgs) {
    let filter = &cluster.log_level;
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|error| {
        eprintln!("nodus: invalid log filter {filter:?} ({error}); using \"info\"");
        tracing_subscriber::EnvFilter::new("info")
    });
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cluster.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // One thread: the agent's work is sequential, and a single arena keeps memory flat.
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `nodus run`. With the proxy on, a second worker keeps DNS and the HTTP endpoints
/// answering while a netlink commit blocks the first (a full sync can take seconds).
fn agent(args: RunArgs) -> anyhow::Result<()> {
    init_logging(&args.cluster);
    let runtime = match run::load_config(&args.cluster)?.proxy.enabled {
        true => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
        false => runtime()?,
    };
    runtime.block_on(run::run(args))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        None => agent(cli.run),
        Some(Command::Run(args)) => agent(args),
        Some(Command::View(args)) => {
            init_logging(&args.cluster);
            runtime()?.block_on(view_cmd::view(args))
        }
        Some(Command::Status(args)) => {
            let mut addr = match args.http_addr {
                Some(addr) => addr,
                None => run::load_config(&args.cluster)?.http_addr,
            };
            if addr.ip().is_unspecified() {
                addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            status::print(addr)
        }
        Some(Command::CheckConfig { file }) => {
            config::Config::load(&file)?;
            println!("{}: valid", file.display());
            Ok(())
        }
        Some(Command::Proxy(ProxyCommand::Render(args))) => {
            init_logging(&args);
            runtime()?.block_on(proxy_cmd::render_ruleset(args))
        }
        Some(Command::Cleanup { yes }) => {
            proxy_cmd::cleanup(yes, &run::load_config(&cli.run.cluster)?)
        }
        Some(Command::Sandbox(args)) => {
            init_logging(&ClusterArgs {
                log_level: DEFAULT_LOG_FILTER.into(),
                ..ClusterArgs::default()
            });
            sandbox::sandbox(args)
        }
        Some(Command::Echo(args)) => runtime()?.block_on(sandbox::echo(args)),
    }
}
