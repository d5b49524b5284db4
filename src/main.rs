//! nodus: one node agent in place of kube-proxy, CoreDNS and a CNI overlay.
//!
//! `nodus run` ([`agent`]) watches the API server, keeps the node view up to date, drives
//! the subsystems from it and serves health and metrics. The other subcommands ([`cmd`])
//! print the view for people and scripts, show a running agent's status, render the
//! proxy's ruleset, validate a configuration, remove what nodus programmed and (with the
//! default `sandbox` feature) bring up a simulated cluster. Run as `nodus-cni`, it is the
//! CNI plugin that links pods to the node ([`nodus_cni`]).

mod agent;
mod cli;
mod cmd;
mod config;
mod preflight;

use anyhow::Context as _;
use clap::Parser;
use cli::{Cli, ClusterArgs, Command, LogFormat, ProxyCommand, RunArgs};
use config::Config;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    agent::metrics::count_panics();
    let runtime = if Config::load_or_default(args.cluster.config.as_deref())?
        .proxy
        .enabled
    {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
    } else {
        runtime()?
    };
    runtime.block_on(agent::run(args))
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    // The runtime runs the CNI plugin by its file name: a copy of this binary that
    // `install-cni` puts in its plugin directory.
    let name = std::env::args_os().next().map(std::path::PathBuf::from);
    if name.is_some_and(|n| n.file_name() == Some(nodus_cni::PLUGIN.as_ref())) {
        return Ok(nodus_cni::main());
    }
    command(Cli::parse()).map(|()| std::process::ExitCode::SUCCESS)
}

fn command(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        None => agent(cli.run),
        Some(Command::Run(args)) => agent(args),
        Some(Command::View(args)) => {
            init_logging(&args.cluster);
            runtime()?.block_on(cmd::view::view(args))
        }
        Some(Command::Status(args)) => {
            let mut addr = match args.http_addr {
                Some(addr) => addr,
                None => Config::load_or_default(args.cluster.config.as_deref())?.http_addr,
            };
            if addr.ip().is_unspecified() {
                addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            cmd::status::print(addr)
        }
        Some(Command::CheckConfig { file, host }) => {
            let cluster = &cli.run.cluster;
            let config = Config::load(&file)?.with_api_server(cluster.api_server.as_deref())?;
            config
                .check_bootstrap(&config::ApiDiscovery::of_process(
                    cluster.kubeconfig.is_some(),
                ))
                .with_context(|| format!("invalid configuration {}", file.display()))?;
            if !host {
                println!("{}: valid", file.display());
                return Ok(());
            }
            let failures = preflight::check_host(&config, false);
            for failure in &failures {
                eprintln!("{failure}");
            }
            anyhow::ensure!(
                failures.is_empty(),
                "{}: valid, but this host cannot run it as it is ({} checks failed)",
                file.display(),
                failures.len()
            );
            println!("{}: valid, and this host can run it", file.display());
            Ok(())
        }
        Some(Command::Proxy(ProxyCommand::Render(args))) => {
            init_logging(&args);
            runtime()?.block_on(cmd::proxy::render_ruleset(args))
        }
        Some(Command::Proxy(ProxyCommand::Trace(args))) => {
            init_logging(&args.cluster);
            runtime()?.block_on(cmd::proxy::trace(args))
        }
        Some(Command::Cleanup {
            yes,
            kube_proxy,
            foreign,
        }) => {
            use cmd::cleanup::Foreign;
            let config = Config::load_or_default(cli.run.cluster.config.as_deref())?;
            runtime()?.block_on(async {
                match (foreign, kube_proxy) {
                    (true, _) => cmd::cleanup::foreign(yes, &Foreign::ALL, &config).await,
                    (false, true) => {
                        cmd::cleanup::foreign(yes, &[Foreign::KubeProxy], &config).await
                    }
                    (false, false) => cmd::cleanup::own(yes, &config).await,
                }
            })
        }
        Some(Command::InstallCni { from, to, replace }) => {
            use nodus_mesh::conflist::Installed;
            let nodus = std::env::current_exe().context("finding this binary")?;
            let installed = nodus_mesh::conflist::install_plugins(&nodus, &from, &to, replace)?;
            for (plugin, done) in installed {
                let done = match done {
                    Installed::Written => "installed",
                    Installed::Unchanged => "unchanged",
                    Installed::KeptHosts => {
                        "kept the host's (another binary; --replace replaces it)"
                    }
                };
                println!("{plugin}: {done} in {}", to.display());
            }
            Ok(())
        }
        #[cfg(feature = "sandbox")]
        Some(Command::Sandbox(args)) => {
            init_logging(&ClusterArgs {
                log_level: cli::DEFAULT_LOG_FILTER.into(),
                ..ClusterArgs::default()
            });
            nodus_testbed::sandbox::sandbox(args)
        }
        #[cfg(feature = "sandbox")]
        Some(Command::Echo(args)) => runtime()?.block_on(nodus_testbed::sandbox::echo(args)),
    }
}

#[cfg(all(test, feature = "sandbox"))]
mod tests {
    /// The sandbox checks for the plugins that `install-cni` copies before it starts.
    #[test]
    fn the_sandbox_checks_for_the_plugins_install_cni_copies() {
        assert_eq!(
            nodus_testbed::runtime::REFERENCE_PLUGINS,
            nodus_mesh::conflist::REFERENCE_PLUGINS
        );
    }
}
