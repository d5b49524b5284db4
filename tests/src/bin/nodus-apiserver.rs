//! `nodus-apiserver`: serves the test bed's API-server stand-in until interrupted.
//!
//! ```text
//! nodus-apiserver --listen 127.0.0.1:6443 --load fixtures/ --kubeconfig-out /tmp/kubeconfig
//! kubectl --kubeconfig /tmp/kubeconfig apply --validate=false -f svc.yaml
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use nodus_testbed::apiserver::{ApiServerConfig, Store, serve, write_kubeconfig};

/// A Kubernetes API-server stand-in for tests (plain HTTP, objects kept in memory).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on; repeat for more. The first one goes into the kubeconfig.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: Vec<SocketAddr>,
    /// YAML file (multi-document) or directory of *.yaml/*.yml/*.json to load at start.
    #[arg(long)]
    load: Vec<PathBuf>,
    /// Write a kubeconfig pointing at the server here.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Events kept for watch resumption and continue tokens.
    #[arg(long, default_value_t = ApiServerConfig::default().history)]
    history: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 5.0)]
    bookmark_interval: f64,
    /// Reject `sendInitialEvents` (watch-list) like a 1.33 server.
    #[arg(long)]
    no_watch_list: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let bookmark_interval = Duration::try_from_secs_f64(args.bookmark_interval)
        .context("--bookmark-interval must be a non-negative number of seconds")?;
    let store = Store::new(ApiServerConfig {
        history: args.history,
        bookmark_interval,
        watch_list: !args.no_watch_list,
    });
    for path in &args.load {
        let n = store
            .load_path(path)
            .with_context(|| format!("loading {}", path.display()))?;
        tracing::info!("loaded {n} objects from {}", path.display());
    }

    let (first, rest) = args
        .listen
        .split_first()
        .context("at least one --listen address is needed")?;
    let listener = tokio::net::TcpListener::bind(first)
        .await
        .with_context(|| format!("binding {first}"))?;
    let server = serve(store, listener).await?;
    for addr in rest {
        let listener =
            std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
        server.add_listener(listener)?;
    }
    if let Some(path) = &args.kubeconfig_out {
        write_kubeconfig(path, &server.url())?;
        tracing::info!("wrote kubeconfig {}", path.display());
    }
    tracing::info!("serving on {}", server.url());

    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}
