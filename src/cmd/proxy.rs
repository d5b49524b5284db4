//! `nodus proxy render` and `nodus proxy trace`: the service proxy's ruleset for people
//! and tests, and a packet's way through it.

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
    state.peek().map(|(view, _)| view).ok_or_else(|| {
        anyhow::anyhow!(
            "no usable saved view at {} (the agent saves one when its state_dir is set)",
            path.display()
        )
    })
}
