//! `nodus run`: the agent.

use crate::config::Config;
use crate::feed::Feed;
use crate::metrics::Metrics;
use crate::on_change::OnChange;
use crate::proxy_cmd::proxy_config;
use crate::watch::WatchItem;
use crate::watch::{self, WatchSet};
use crate::{ClusterArgs, RunArgs};
use anyhow::Context;
use futures::Stream;
use nodus_dns::Zone;
use nodus_dns::forward::{ForwardConfig, Forwarder, upstreams_from_resolv_conf};
use nodus_dns::server::DnsServer;
use nodus_proxy::apply::Proxy;
use nodus_proxy::health::HealthChecks;
use nodus_view::SharedView;
use nodus_view::{ChangeSet, View};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The configuration file, if any, with the flags applied over it.
pub fn load_config(cluster: &ClusterArgs) -> anyhow::Result<Config> {
    match &cluster.config {
        Some(path) => Config::load(path),
        None => Ok(Config::default()),
    }
}

/// Resolves on SIGTERM or SIGINT. nodus never tears its dataplane down on exit: a restart
/// must not drop traffic.
pub async fn shutdown_signal() -> anyhow::Result<&'static str> {
    Ok(ShutdownSignals::install()?.recv().await)
}

/// SIGTERM and SIGINT, caught from the moment this is made (inside a tokio runtime) instead
/// of ending the process.
pub struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    pub fn install() -> anyhow::Result<ShutdownSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(ShutdownSignals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// The name of the next signal caught.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// How often the proxy checks that nobody changed its table (and retries a failed sync).
const PROXY_CHECK_PERIOD: Duration = Duration::from_secs(10);

/// A tick every `period`, merged into the watch stream so that the loop also runs when the
/// cluster is quiet.
fn ticks(period: Duration) -> impl Stream<Item = WatchItem> {
    futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some((WatchItem::Tick, ()))
    })
}

/// nodus's nftables table in the run loop (the service proxy, or with only the mesh on
/// the egress masquerade): a full sync first, then one transaction per batch, and a
/// periodic check that repairs outside changes.
struct ProxyLoop {
    proxy: Proxy,
    /// Health-check node ports, served only by the service proxy.
    health: Option<HealthChecks>,
    /// The last sync failed, or none happened yet: the next step is a full sync.
    needs_full: bool,
    last_check: Instant,
}

impl ProxyLoop {
    fn new(config: &Config, view: SharedView) -> anyhow::Result<ProxyLoop> {
        let proxy = Proxy::new(proxy_config(config)).context("opening nf_tables netlink")?;
        Ok(ProxyLoop {
            proxy,
            health: config
                .proxy
                .enabled
                .then(|| HealthChecks::new(view, config.proxy.health_check_address)),
            needs_full: true,
            last_check: Instant::now(),
        })
    }

    /// Brings the kernel in step with `view`; returns whether the table is programmed.
    fn step(&mut self, view: &View, changes: &ChangeSet, metrics: &Metrics) -> bool {
        let result = if self.needs_full {
            self.proxy.full_sync(view).map(Some)
        } else if !changes.is_empty() {
            self.proxy.sync(view, changes).map(Some)
        } else if self.last_check.elapsed() >= PROXY_CHECK_PERIOD / 2 {
            // Half the tick period: a tick a few milliseconds early must not skip a check.
            self.last_check = Instant::now();
            self.proxy.check(view)
        } else {
            Ok(None)
        };
        match result {
            Ok(Some(report)) => {
                self.needs_full = false;
                metrics.proxy_synced(&report, self.proxy.programmed_services());
                metrics.status.proxy.synced(report.duration);
                for refused in &report.refused {
                    tracing::warn!(service = %format!("{}/{}", refused.service.namespace, refused.service.name), reason = %refused.reason, "the kernel refused a service");
                }
                tracing::debug!(?report, "proxy synced");
            }
            Ok(None) => {}
            Err(error) => {
                self.needs_full = true;
                metrics.proxy_sync_failed();
                metrics.status.proxy.failed(&error);
                tracing::error!(error = %error, "proxy sync failed; a full sync follows");
            }
        }
        !self.needs_full
    }
}

/// The forwarder for names outside the zone, from `dns.resolv_conf`. Without a usable
/// upstream nodus still serves the zone, and refuses the rest.
fn forwarder(config: &Config) -> Option<Arc<Forwarder>> {
    let dns = &config.dns;
    match upstreams_from_resolv_conf(&dns.resolv_conf, &dns.listen) {
        Ok(upstreams) if !upstreams.is_empty() => {
            tracing::info!(?upstreams, "forwarding names outside the cluster zone");
            Some(Arc::new(Forwarder::new(ForwardConfig {
                upstreams,
                timeout: Duration::from_millis(dns.forward_timeout_ms),
                cache_entries: dns.cache_entries,
                cache_bytes: dns.cache_bytes,
                max_concurrent: dns.forward_max_concurrent,
            })))
        }
        Ok(_) => {
            tracing::warn!(path = %dns.resolv_conf.display(), "no upstream nameserver; names outside the zone are refused");
            None
        }
        Err(error) => {
            tracing::warn!(path = %dns.resolv_conf.display(), %error, "cannot read upstreams; names outside the zone are refused");
            None
        }
    }
}

/// Binds the DNS server on every `dns.listen` address; it serves for as long as the
/// returned server lives. Until the view is complete it answers from what it has.
async fn start_dns(config: &Config, view: SharedView) -> anyhow::Result<DnsServer> {
    let zone = Zone::new(
        &config.cluster_domain,
        config.dns.ttl,
        config.dns.pod_records.into(),
    )
    .with_context(|| format!("cluster_domain {:?}", config.cluster_domain))?;
    let server = nodus_dns::server::serve_with_threads(
        view,
        zone,
        forwarder(config),
        &config.dns.listen,
        config.dns.udp_threads,
    )
    .await
    .with_context(|| format!("binding DNS on {:?}", config.dns.listen))?;
    tracing::info!(listen = ?server.addrs, zone = %config.cluster_domain, "DNS serving");
    Ok(server)
}

/// The running mesh task, as the run loop sees it.
struct MeshTask {
    /// Tells the task that the view changed.
    changed: tokio::sync::watch::Sender<()>,
    /// The device is the embedded one, which the kernel deletes when nodus exits.
    device_ends_with_process: bool,
}

/// Opens the WireGuard device (adopting a running one) and starts the mesh's task. It
/// programs nothing before the first view-change signal, which comes once the view is
/// complete.
///
/// It runs before [`shutdown_signal`] installs nodus's handlers: an embedded device's
/// creation briefly holds signalfds for SIGTERM and SIGINT (see
/// `nodus_mesh::backend::embedded`), and a signal in that window must keep its default
/// action, ending the process, rather than reach them.
async fn start_mesh(
    config: &Config,
    view: SharedView,
    client: kube::Client,
    metrics: &Metrics,
) -> anyhow::Result<MeshTask> {
    let mesh_metrics = Arc::new(nodus_mesh::metrics::MeshMetrics::default());
    let _ = metrics.mesh.set(mesh_metrics.clone());
    let mesh = nodus_mesh::Mesh::start(config.mesh.settings(), mesh_metrics)
        .await
        .context("starting the WireGuard mesh")?;
    let device_ends_with_process = mesh.device_ends_with_process();
    let (changed, follower) = tokio::sync::watch::channel(());
    tokio::spawn(nodus_mesh::follow::follow(mesh, view, client, follower));
    Ok(MeshTask {
        changed,
        device_ends_with_process,
    })
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut config = load_config(&args.cluster)?;
    if let Some(addr) = args.http_addr {
        config.http_addr = addr;
    }
    let node_name = args.cluster.node_name.clone();
    anyhow::ensure!(
        !node_name.is_empty(),
        "the node name is required: pass --node-name or set NODE_NAME"
    );
    let client = watch::connect(
        args.cluster.kubeconfig.as_deref(),
        config.api_server.as_deref(),
    )
    .await?;
    let metrics = Arc::new(Metrics::default());
    let http_addr = crate::http::serve(config.http_addr, metrics.clone()).await?;
    tracing::info!(node = %node_name, %http_addr, "nodus starting");

    let view: SharedView = Arc::new(RwLock::new(View::new(&node_name)));
    // Bound before the first list: a port already taken fails start-up, not later.
    let _dns = match config.dns.enabled {
        true => {
            let dns = start_dns(&config, view.clone()).await?;
            let _ = metrics.dns.set(dns.metrics.clone());
            Some(dns)
        }
        false => None,
    };
    let dns_synced = _dns.as_ref().map(|d| d.synced.clone()).unwrap_or_default();
    let _ = metrics.status.setup.set(crate::status::Setup {
        node: node_name.clone(),
        proxy: config.proxy.enabled,
        egress_only_table: !config.proxy.enabled && config.programs_table(),
        dns: _dns.as_ref().map(|dns| dns.addrs.clone()),
        mesh: config.mesh.enabled,
        on_change: args.on_change.as_ref().map(|p| p.display().to_string()),
    });
    let on_change = args.on_change.clone().map(|program| {
        let timeout = Duration::from_secs(args.on_change_timeout);
        OnChange::start(program, timeout, view.clone(), metrics.clone())
    });
    let set = WatchSet {
        page_size: config.watch_page_size,
        all_nodes: config.mesh.enabled,
        node_name: node_name.clone(),
    };
    let (items, kinds) = watch::watch_all(&client, &set);
    let mesh = match config.mesh.enabled {
        true => Some(start_mesh(&config, view.clone(), client.clone(), &metrics).await?),
        false => None,
    };
    // The mesh alone still needs the table, for its egress masquerade.
    let mut proxy = match config.programs_table() {
        true => Some(ProxyLoop::new(&config, view.clone())?),
        false => None,
    };
    let items = futures::stream::select(items, ticks(PROXY_CHECK_PERIOD));
    let mut feed = Feed::new(view, metrics.clone(), kinds);
    let follow = feed.drive(items, |feed, applied| {
        if !feed.synced() {
            return ControlFlow::Continue(());
        }
        if applied.initial_sync || !applied.changes.is_empty() {
            feed.metrics.status.view.synced(applied.took);
        }
        if let Some(on_change) = &on_change {
            on_change.queue(applied.initial_sync, &applied.changes);
        }
        // DNS answers from the view itself; the proxy must have programmed it.
        let proxy_ready = proxy.as_mut().is_none_or(|proxy| {
            let mut step = || proxy.step(&feed.read(), &applied.changes, &feed.metrics);
            // Netlink commits block: a full sync of the proxy takes seconds, so the runtime
            // moves DNS and HTTP to its other worker meanwhile. The egress masquerade
            // alone is a few messages, synced on the mesh's single-threaded runtime.
            let programmed = match config.proxy.enabled {
                true => tokio::task::block_in_place(step),
                false => step(),
            };
            if let Some(health) = &mut proxy.health {
                health.update((!applied.initial_sync).then_some(&applied.changes));
            }
            programmed
        });
        if let Some(mesh) = &mesh
            && (applied.initial_sync
                || !applied.changes.nodes.is_empty()
                || applied.changes.this_node)
        {
            mesh.changed.send_replace(());
        }
        // Readiness follows the proxy: a node whose rules are failing to sync is not ready.
        dns_synced.store(true, Relaxed);
        if proxy_ready != feed.metrics.ready.swap(proxy_ready, Relaxed) && proxy_ready {
            let counts = feed.read().counts();
            tracing::info!(
                services = counts.services,
                endpoint_slices = counts.endpoint_slices,
                endpoints = counts.endpoints,
                nodes = counts.nodes,
                "initial view applied; ready"
            );
        }
        if !applied.changes.is_empty() {
            tracing::debug!(
                services = applied.changes.services.len(),
                nodes = applied.changes.nodes.len(),
                "view updated"
            );
        }
        ControlFlow::Continue(())
    });
    tokio::select! {
        () = follow => anyhow::bail!("the watch streams ended"),
        signal = shutdown_signal() => {
            let signal = signal?;
            match mesh.as_ref().is_some_and(|mesh| mesh.device_ends_with_process) {
                true => tracing::info!(
                    signal,
                    "exiting; the dataplane stays in place but for the embedded WireGuard \
                     device, which ends with the process"
                ),
                false => tracing::info!(signal, "exiting; the dataplane stays in place"),
            }
            Ok(())
        }
    }
}
