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
        egress_masquerade: config.mesh.enabled,
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

/// Deletes the proxy's table, after asking on a terminal unless `yes`. Traffic to services
/// stops being translated on this node at once, which is why it asks.
pub fn cleanup(yes: bool) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if !yes {
        anyhow::ensure!(
            std::io::stdin().is_terminal(),
            "refusing to remove the nftables table without --yes when not on a terminal"
        );
        print!("Remove the nftables table inet nodus? Services stop working on this node. [y/N] ");
        std::io::stdout().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("nothing removed");
            return Ok(());
        }
    }
    match nodus_proxy::apply::cleanup()? {
        true => println!("removed table inet nodus"),
        false => println!("no table inet nodus; nothing to remove"),
    }
    Ok(())
}
