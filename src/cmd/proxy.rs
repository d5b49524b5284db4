//! `nodus proxy render` and `nodus cleanup`: the service proxy's ruleset for people and
//! tests, and removing what nodus programmed.

use crate::agent::feed::complete_view;
use crate::cli::ClusterArgs;
use crate::config::Config;
use nodus_proxy::plan::{EndpointKeys, Planner, render};
use std::io::Write;

/// Prints the ruleset nodus would program on this node, in `nft -f` syntax.
pub async fn render_ruleset(cluster: ClusterArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !cluster.node_name.is_empty(),
        "the ruleset is planned for one node: pass --node-name or set NODE_NAME"
    );
    let config = Config::load_or_default(cluster.config.as_deref())?;
    let feed = complete_view(&cluster).await?;
    let view = feed.read();
    let planner = Planner::new(&view, &config.proxy_settings());
    let text = render(
        &planner.skeleton(),
        planner.services(&mut EndpointKeys::new()),
    );
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// Deletes the proxy's table, the mesh's device and the CNI conflist, after asking on a
/// terminal unless `yes`. Services and pod traffic between nodes stop at once on this
/// node, which is why it asks.
pub fn cleanup(yes: bool, config: &Config) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let mesh = &config.mesh;
    if !yes {
        anyhow::ensure!(
            std::io::stdin().is_terminal(),
            "refusing to remove the nftables table and the mesh without --yes when not on a terminal"
        );
        print!(
            "Remove the nftables table inet nodus, the WireGuard device {} and {}? Services and \
             pod traffic between nodes stop working on this node. [y/N] ",
            mesh.interface,
            mesh.cni_conflist.display()
        );
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
    let removed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(nodus_mesh::cleanup::remove(
            &mesh.interface,
            &mesh.cni_conflist,
        ))
        .map_err(|error| anyhow::anyhow!("removing the mesh: {error}"))?;
    match removed.device {
        true => println!("removed WireGuard device {} and its routes", mesh.interface),
        false => println!("no WireGuard device {}", mesh.interface),
    }
    match removed.conflist {
        true => println!("removed {}", mesh.cni_conflist.display()),
        false => println!("no {}", mesh.cni_conflist.display()),
    }
    Ok(())
}
