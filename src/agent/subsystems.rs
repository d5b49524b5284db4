//! The subsystems inside `nodus run`: each started through its crate's front door
//! (`nodus_dns::start`, `nodus_mesh::start`, `nodus_proxy::subsystem::start`) or the
//! `--on-change` backend, supervised (a failed start, or a panic later, is retried in the
//! background), registered with the metrics, and then fed every batch through one
//! contract ([`Subsystem`]).

use crate::agent::board::Setup;
use crate::agent::http;
use crate::agent::metrics::{Latest, Metrics};
use crate::agent::on_change::{self, OnChange};
use crate::agent::retry;
use crate::agent::subscribe::{Hub, Publisher};
use crate::cli::RunArgs;
use crate::config::Config;
use anyhow::Context as _;
use nodus_dns::server::{BoundSockets, DnsServer, Handover};
use nodus_mesh::MeshSubsystem;
use nodus_proxy::subsystem::ProxySubsystem;
use nodus_view::config::Cluster;
use nodus_view::{Applied, Subsystem, View, ViewReader};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The running subsystems.
pub struct Subsystems {
    list: Vec<Box<dyn Subsystem>>,
    /// DNS's sockets, for a successor, once DNS runs.
    pub dns_handover: Arc<Latest<Handover>>,
    /// The `--on-change` program's task, a subscriber of the view.
    _on_change: Option<OnChange>,
}

/// What every start reads; the supervised starts hold it, since they may run again.
struct Context {
    config: Config,
    cluster: Cluster,
    view: ViewReader,
    client: kube::Client,
    metrics: Arc<Metrics>,
}

impl Subsystems {
    /// Starts what `config` and `args` turn on, before the first list: a DNS port taken or
    /// a mesh that cannot make its device leaves the proxy working. `inherited_dns`: DNS's
    /// sockets from the process before.
    pub async fn start(
        config: &Config,
        args: &RunArgs,
        view: ViewReader,
        client: kube::Client,
        metrics: &Arc<Metrics>,
        inherited_dns: BTreeMap<SocketAddr, BoundSockets>,
    ) -> Subsystems {
        let context = Arc::new(Context {
            config: config.clone(),
            cluster: config.cluster(),
            view: view.clone(),
            client,
            metrics: metrics.clone(),
        });
        let starts = metrics.status.starts.clone();
        let dns_handover: Arc<Latest<Handover>> = Arc::default();
        let mut list: Vec<Box<dyn Subsystem>> = Vec::new();
        if config.dns.enabled {
            let (context, handover) = (context.clone(), dns_handover.clone());
            let inherited = Mutex::new(inherited_dns);
            let start = move || {
                let (context, handover) = (context.clone(), handover.clone());
                // Only the first start serves on them; what it does not take is closed.
                let inherited =
                    std::mem::take(&mut *inherited.lock().unwrap_or_else(|p| p.into_inner()));
                async move { start_dns(&context, inherited, &handover).await }
            };
            list.push(retry::start_supervised("dns", starts.clone(), start).await);
        }
        if config.mesh.enabled {
            let context = context.clone();
            let start = move || {
                let context = context.clone();
                async move { start_mesh(&context).await }
            };
            list.push(retry::start_supervised("mesh", starts.clone(), start).await);
        }
        // The mesh alone still needs the table, for its egress masquerade.
        if config.programs_table() {
            let context = context.clone();
            let start = move || std::future::ready(start_proxy(&context));
            list.push(retry::start_supervised("proxy", starts.clone(), start).await);
        }
        let on_change = subscribers(config, args, view, metrics, &mut list);
        let _ = metrics.status.setup.set(Setup {
            node: args.cluster.node_name.clone(),
            proxy: config.proxy.enabled,
            egress_only_table: !config.proxy.enabled && config.programs_table(),
            dns: config.dns.enabled,
            mesh: config.mesh.enabled,
            on_change: args.on_change.as_ref().map(|p| p.display().to_string()),
        });
        let names: Vec<&str> = list.iter().map(|s| s.name()).collect();
        tracing::info!(subsystems = ?names, "subsystems started");
        Subsystems {
            list,
            dns_handover,
            _on_change: on_change,
        }
    }

    /// Hands each subsystem the view and what the batch did.
    pub fn after_batch(&mut self, view: &View, applied: &Applied) {
        for subsystem in &mut self.list {
            subsystem.after_batch(view, applied);
        }
    }

    /// The soonest any subsystem wants the loop to run again without a batch.
    pub fn wake_at(&self) -> Option<Instant> {
        self.list.iter().filter_map(|s| s.wake_at()).min()
    }

    pub fn all_ready(&self) -> bool {
        self.list.iter().all(|s| s.is_ready())
    }

    /// The proxy, which enforces policies, is in step (one that failed to start is not).
    pub fn proxy_ready(&self) -> bool {
        self.list
            .iter()
            .any(|s| s.name() == "proxy" && s.is_ready())
    }
}

/// The subscribers' publisher (a subsystem, with the socket when configured) and the
/// `--on-change` program, when either is on.
fn subscribers(
    config: &Config,
    args: &RunArgs,
    view: ViewReader,
    metrics: &Arc<Metrics>,
    list: &mut Vec<Box<dyn Subsystem>>,
) -> Option<OnChange> {
    let state_dir = args.state_dir.as_deref().or(config.state_dir.as_deref());
    let socket = (config.subscribe.enabled)
        .then(|| {
            config
                .subscribe
                .socket_path(state_dir, &args.cluster.node_name)
        })
        .flatten();
    if socket.is_none() && args.on_change.is_none() {
        return None;
    }
    let hub = Hub::new(view);
    let (publisher, error) = Publisher::start(&config.subscribe, socket.as_deref(), hub.clone());
    if let Some(error) = error {
        let error = format!("no subscription socket: {error:#}");
        tracing::error!(%error, "subscribers cannot connect; the rest runs");
        metrics.status.subscribe.error(error);
    }
    list.push(Box::new(publisher));
    metrics.subscribe.set(hub.clone());
    let program = args.on_change.clone()?;
    let timeout = Duration::from_secs(args.on_change_timeout);
    Some(on_change::start(program, timeout, &hub, metrics.clone()))
}

/// DNS, serving until dropped; its sockets can be handed over from now on.
async fn start_dns(
    context: &Context,
    inherited: BTreeMap<SocketAddr, BoundSockets>,
    handover: &Latest<Handover>,
) -> anyhow::Result<DnsServer> {
    let server = nodus_dns::start(
        &context.config.dns,
        &context.cluster,
        context.view.clone(),
        inherited,
    )
    .await?;
    context.metrics.dns.set(server.metrics.clone());
    let _ = context.metrics.status.dns_addrs.set(server.addrs.clone());
    handover.set(Arc::new(server.handover()));
    Ok(server)
}

/// The mesh's device opened (a running one adopted) and its task started.
///
/// Its first attempt runs before [`crate::agent::signals::ShutdownSignals::install`]
/// installs nodus's handlers: an embedded device's creation briefly holds signalfds for
/// SIGTERM and SIGINT (see `nodus_mesh::backend::embedded`), and a signal in that window
/// must keep its default action, ending the process, rather than reach them. A retry
/// after a failed start runs with the handlers installed, so a signal in its window can
/// reach those signalfds.
async fn start_mesh(context: &Context) -> anyhow::Result<MeshSubsystem> {
    let config = &context.config;
    let mesh = nodus_mesh::start(
        &config.mesh,
        &context.cluster,
        config.policy.gate(),
        context.view.clone(),
        context.client.clone(),
    )
    .await
    .context("starting the WireGuard mesh")?;
    context.metrics.mesh.set(mesh.metrics.clone());
    context
        .metrics
        .status
        .device_ends_with_process
        .store(mesh.device_ends_with_process, Relaxed);
    Ok(mesh)
}

/// nodus's nftables table: the service proxy, or with only the mesh on, its egress
/// masquerade.
fn start_proxy(context: &Context) -> anyhow::Result<ProxySubsystem> {
    let config = &context.config;
    let proxy = nodus_proxy::subsystem::start(
        &config.proxy,
        &context.cluster,
        &config.proxy_neighbours(),
        http::limits(&context.cluster.cluster_cidrs),
        context.view.clone(),
        nodus_dns::listen::host_addresses,
    )?;
    proxy.metrics.name_policies(config.policy.metrics_names);
    context.metrics.proxy.set(proxy.metrics.clone());
    Ok(proxy)
}
