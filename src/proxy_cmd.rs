//! `nodus proxy …`: the service proxy's ruleset for people and tests.

use crate::ClusterArgs;
use crate::config::Config;
use crate::run::load_config;
use crate::view_cmd::synced_view;
use nodus_proxy::plan::{Planner, ProxyConfig, render};
use std::io::Write;

/// The proxy's settings from the configuration file.
pub fn proxy_config(config: &Config) -> ProxyConfig {
    ProxyConfig {
        cluster_cidrs: config.cluster_cidrs.clone(),
        ..ProxyConfig::default()
    }
}

/// Prints the ruleset nodus would program on this node, in `nft -f` syntax.
pub async fn render_ruleset(cluster: ClusterArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !cluster.node_name.is_empty(),
        "the ruleset is planned for one node: pass --node-name or set NODE_NAME"
    );
    let config = load_config(&cluster)?;
    let feed = synced_view(&cluster).await?;
    let view = feed.read();
    let planner = Planner::new(&view, &proxy_config(&config));
    let text = render(&planner.skeleton(), planner.services());
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    Ok(())
}
