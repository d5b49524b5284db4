//! `nodus proxy render`, `nodus proxy trace` and `nodus cleanup`: the service proxy's
//! ruleset for people and tests, a packet's way through it, and removing what nodus
//! programmed.

use crate::agent::feed::complete_view;
use crate::agent::state::StateDir;
use crate::cli::{ClusterArgs, TraceArgs, TraceEntry, TraceProtocol};
use crate::config::Config;
use nodus_proxy::plan::{EndpointKeys, Entry, Packet, Planner, render};
use nodus_view::View;
use nodus_view::model::{Family, Protocol};
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
        &planner.complete_skeleton(),
        planner.services(&mut EndpointKeys::new()),
    );
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// Prints every way a connection's first packet can go through the ruleset planned for
/// this node, from the API server's view of the cluster or the one the agent saved.
pub async fn trace(args: TraceArgs) -> anyhow::Result<()> {
    let cluster = &args.cluster;
    anyhow::ensure!(
        !cluster.node_name.is_empty(),
        "the ruleset is planned for one node: pass --node-name or set NODE_NAME"
    );
    let config = Config::load_or_default(cluster.config.as_deref())?;
    let (restored, feed, listed);
    let view: &View = match &args.saved_view {
        Some(dir) => {
            restored = saved_view(dir, &cluster.node_name)?;
            &restored
        }
        None => {
            feed = complete_view(cluster).await?;
            listed = feed.read();
            &listed
        }
    };
    let planner = Planner::new(view, &config.proxy_settings());
    let local = planner.node_addresses();
    let destination = args.destination.ip();
    let source = match args.from {
        Some(source) => source,
        None => local
            .iter()
            .copied()
            .find(|ip| Family::of(*ip) == Family::of(destination))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "node {} has no {:?} address to send from: pass --from",
                    cluster.node_name,
                    Family::of(destination)
                )
            })?,
    };
    anyhow::ensure!(
        Family::of(source) == Family::of(destination),
        "--from {source} and {} are of different IP families",
        args.destination
    );
    let entry = match args.entry {
        Some(TraceEntry::Pod) => Entry::Pod,
        Some(TraceEntry::Host) => Entry::Host,
        Some(TraceEntry::Outside) => Entry::Outside,
        None if args.from.is_none() || local.contains(&source) => Entry::Host,
        None if planner
            .facts()
            .node_pod_cidrs
            .iter()
            .any(|cidr| cidr.contains(source)) =>
        {
            Entry::Pod
        }
        None => Entry::Outside,
    };
    let protocol = match args.protocol {
        TraceProtocol::Tcp => Protocol::Tcp,
        TraceProtocol::Udp => Protocol::Udp,
        TraceProtocol::Sctp => Protocol::Sctp,
    };
    let trace = planner.trace(Packet {
        entry,
        source,
        destination,
        protocol,
        port: args.destination.port(),
    });
    print!("{trace}");
    Ok(())
}

/// The view the agent saved in `dir` for `node`.
fn saved_view(dir: &std::path::Path, node: &str) -> anyhow::Result<View> {
    let state = StateDir::new(dir, node)
        .ok_or_else(|| anyhow::anyhow!("{node:?} cannot name a saved view"))?;
    let path = state.view_path();
    state.restore().map(|(view, _)| view).ok_or_else(|| {
        anyhow::anyhow!(
            "no usable saved view at {} (the agent saves one when its state_dir is set)",
            path.display()
        )
    })
}

/// Deletes the proxy's table, the mesh's device and the CNI conflist (with `kube_proxy`,
/// what kube-proxy left instead), after asking on a terminal unless `yes`. Services and
/// pod traffic between nodes stop at once on this node, which is why it asks.
pub fn cleanup(yes: bool, kube_proxy: bool, config: &Config) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let mesh = &config.mesh;
    if !yes {
        anyhow::ensure!(
            std::io::stdin().is_terminal(),
            "refusing to remove anything without --yes when not on a terminal"
        );
        match kube_proxy {
            true => print!(
                "Remove kube-proxy's nftables tables and iptables chains? Services that only \
                 kube-proxy still serves stop working on this node. [y/N] "
            ),
            false => print!(
                "Remove the nftables table inet nodus, the WireGuard device {} and {}? \
                 Services and pod traffic between nodes stop working on this node. [y/N] ",
                mesh.interface,
                mesh.cni_conflist.display()
            ),
        }
        std::io::stdout().flush()?;
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("nothing removed");
            return Ok(());
        }
    }
    if kube_proxy {
        return remove_kube_proxy_leftovers();
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

/// kube-proxy's nftables tables, then its iptables chains through each backend's tools
/// that are installed; a failure of one does not keep the others from going.
fn remove_kube_proxy_leftovers() -> anyhow::Result<()> {
    use nodus_proxy::leftovers::{self, IptablesOutcome};
    let tables = leftovers::remove_kube_proxy_tables()
        .map_err(|error| anyhow::anyhow!("removing kube-proxy's nftables tables: {error}"))?;
    match tables.is_empty() {
        true => println!("no kube-proxy nftables tables"),
        false => println!("removed {}", tables.join(" and ")),
    }
    let mut failed = Vec::new();
    for program in [
        "iptables",
        "ip6tables",
        "iptables-legacy",
        "ip6tables-legacy",
    ] {
        match leftovers::remove_kube_proxy_chains(program) {
            Ok(IptablesOutcome::Removed(chains)) => {
                println!("removed {chains} kube-proxy chains with {program}")
            }
            Ok(IptablesOutcome::Nothing) => println!("no kube-proxy chains in {program}"),
            Ok(IptablesOutcome::NoProgram) => {}
            Err(error) => failed.push(format!("{program}: {error}")),
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "kube-proxy's iptables chains were not all removed: {}",
        failed.join("; ")
    );
    Ok(())
}
