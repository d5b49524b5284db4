//! `nodus run`: the agent.
//!
//! The watch streams ([`watch`]) feed the view ([`feed`]); after every batch the run loop
//! hands the view and what the batch did to each subsystem through one contract
//! ([`nodus_view::Subsystem`]): the proxy, DNS, the mesh and an `--on-change` backend.
//! The node is ready when every subsystem is. [`http`] serves `/healthz`, `/readyz`,
//! `/metrics` ([`metrics`]) and `/status` ([`status`], [`board`]).

pub mod board;
pub mod feed;
pub mod gate;
pub mod handover;
pub mod health;
pub mod http;
pub mod kube_dns;
pub mod metrics;
pub mod on_change;
pub mod retry;
pub mod signals;
pub mod state;
pub mod status;
pub mod watch;

use crate::cli::RunArgs;
use crate::config::{ApiDiscovery, Config};
use anyhow::Context;
use feed::Feed;
use futures::{Stream, StreamExt};
use handover::Sockets;
use metrics::{Latest, Metrics};
use nodus_dns::Zone;
use nodus_dns::autopath::NodeSearch;
use nodus_dns::forward::{ForwardConfig, Forwarder, Name, upstreams_from_resolv_conf};
use nodus_dns::listen::{self, Listen};
use nodus_dns::server::BoundSockets;
use nodus_dns::server::DnsServer;
use nodus_mesh::follow::MeshSubsystem;
use nodus_proxy::apply::Proxy;
use nodus_proxy::health::HealthListen;
use nodus_proxy::subsystem::{CHECK_PERIOD, ProxySubsystem};
use nodus_view::{Applied, Subsystem, View, ViewReader};
use on_change::OnChange;
use state::{Saver, StateDir};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use watch::{WatchItem, WatchSet};

/// A tick every `period`, merged into the watch stream so that the loop also runs when the
/// cluster is quiet (the proxy checks its table on it).
fn ticks(period: Duration) -> impl Stream<Item = WatchItem> {
    futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some((WatchItem::Tick, ()))
    })
}

/// The upstreams of the configuration: the nameservers of `resolv_conf` (`dns.resolv_conf`
/// as read), leaving out those that are nodus itself (`own`), and the stub domains.
fn configured_routes(
    config: &Config,
    resolv_conf: &std::io::Result<String>,
    own: &[SocketAddr],
) -> kube_dns::Routes {
    let dns = &config.dns;
    let path = dns.resolv_conf.display();
    let upstreams = match resolv_conf {
        Ok(text) => {
            let upstreams = upstreams_from_resolv_conf(text, own);
            match upstreams.is_empty() {
                true => tracing::warn!(
                    %path,
                    "no upstream nameserver; names outside the zone are refused"
                ),
                false => tracing::info!(?upstreams, "forwarding names outside the cluster zone"),
            }
            upstreams
        }
        Err(error) => {
            tracing::warn!(%path, %error, "cannot read upstreams; names outside the zone are refused");
            Vec::new()
        }
    };
    kube_dns::Routes {
        upstreams,
        // Checked with the rest of the configuration at start.
        zones: dns.stub_domains(&config.cluster_domain).unwrap_or_default(),
    }
}

/// The forwarder for names outside the zone, to `routes`. Without a usable upstream nodus
/// still serves the zone, and refuses the rest.
fn forwarder(config: &Config, routes: &kube_dns::Routes) -> Option<Arc<Forwarder>> {
    let dns = &config.dns;
    if routes.upstreams.is_empty() && routes.zones.is_empty() {
        return None;
    }
    Some(Arc::new(Forwarder::new(ForwardConfig {
        upstreams: routes.upstreams.clone(),
        zones: routes.zones.clone(),
        policy: dns.forward_policy.into(),
        timeout: Duration::from_millis(dns.forward_timeout_ms),
        cache_entries: dns.cache_entries,
        cache_bytes: dns.cache_bytes,
        max_concurrent: dns.forward_max_concurrent,
        max_ttl: dns.cache_max_ttl,
        max_denial_ttl: dns.cache_max_denial_ttl,
        failure_ttl: dns.cache_servfail_ttl,
        serve_stale: dns.cache_serve_stale,
        prefetch_hits: dns.cache_prefetch,
    })))
}

/// Binds the DNS server on every `dns.listen` address; it serves for as long as the
/// returned server lives. Until the view is complete it answers from what it has.
async fn start_dns(
    config: &Config,
    view: ViewReader,
    client: kube::Client,
    metrics: &Metrics,
    inherited: BTreeMap<SocketAddr, BoundSockets>,
) -> anyhow::Result<DnsServer> {
    let zone = Zone::new(
        &config.cluster_domain,
        config.dns.ttl,
        config.dns.pod_records.into(),
    )
    .with_context(|| format!("cluster_domain {:?}", config.cluster_domain))?
    .with_cluster_ranges([&config.cluster_cidrs[..], &config.service_cidrs[..]].concat());
    // Read once: its nameservers are the upstreams, its search line the node's domains.
    let resolv_conf = std::fs::read_to_string(&config.dns.resolv_conf);
    let zone = match config.dns.autopath {
        // Unreadable, it has no search domains (and no upstreams, which is reported).
        true => {
            let text = resolv_conf.as_deref().unwrap_or_default();
            let node_search = NodeSearch::from_resolv_conf(text, zone.origin());
            let domains: Vec<String> = node_search.domains().iter().map(Name::to_string).collect();
            tracing::info!(
                node_search = %domains.join(" "),
                "autopath walks the search lists of this node's pods"
            );
            zone.with_autopath(node_search)
        }
        false => zone,
    };
    // A wildcard that another resolver on the node keeps from binding becomes each of the
    // host's addresses, and that resolver stays an upstream.
    let plan = listen::plan(&config.dns.listen);
    let host = match plan.iter().any(|l| matches!(l, Listen::EachAddress(_))) {
        true => listen::host_addresses().context("reading this host's addresses")?,
        false => Vec::new(),
    };
    let routes = configured_routes(config, &resolv_conf, &listen::own_addresses(&plan, &host));
    let forwarder = forwarder(config, &routes);
    let mut handler = nodus_dns::handler::ClusterDns::new(view, zone, forwarder.clone())
        .with_rate_limit(nodus_dns::rate::RateLimitSettings {
            responses_per_second: config.dns.rate_limit,
            slip: config.dns.rate_limit_slip,
        })
        .with_query_log(config.dns.query_log_one_in);
    if !config.dns.hosts.is_empty() || config.dns.hosts_file.is_some() {
        handler = handler.with_hosts(nodus_dns::hosts::HostsSource::new(
            config.dns.hosts.clone(),
            config.dns.hosts_file.clone(),
        ));
    }
    let mut server =
        nodus_dns::server::serve_planned(handler, &plan, config.dns.udp_threads, inherited)
            .await
            .with_context(|| format!("binding DNS on {:?}", config.dns.listen))?;
    server.allow(nodus_dns::allow::AllowedPrefixes {
        cluster: config.cluster_cidrs.clone(),
        extra: config.dns.allow.clone(),
    });
    if let (Some(forwarder), Some((namespace, name))) = (forwarder, config.dns.config_map()) {
        server.keep_task(tokio::spawn(kube_dns::follow(
            client,
            (namespace.to_string(), name.to_string()),
            config.cluster_domain.clone(),
            forwarder,
            routes,
        )));
    }
    tracing::info!(listen = ?server.addrs, zone = %config.cluster_domain, "DNS serving");
    metrics.dns.set(server.metrics.clone());
    let _ = metrics.status.dns_addrs.set(server.addrs.clone());
    Ok(server)
}

/// Opens the WireGuard device (adopting a running one) and starts the mesh's task. It
/// programs nothing before the first batch after the view is complete.
///
/// Its first attempt runs before [`signals::ShutdownSignals::install`] installs nodus's handlers:
/// an embedded device's creation briefly holds signalfds for SIGTERM and SIGINT (see
/// `nodus_mesh::backend::embedded`), and a signal in that window must keep its default
/// action, ending the process, rather than reach them. A retry after a failed start runs
/// with the handlers installed, so a signal in its window can reach those signalfds.
async fn start_mesh(
    config: &Config,
    view: ViewReader,
    client: kube::Client,
    metrics: &Metrics,
) -> anyhow::Result<MeshSubsystem> {
    let mesh_metrics = Arc::new(nodus_mesh::metrics::MeshMetrics::default());
    let mesh = nodus_mesh::Mesh::start(
        config
            .mesh
            .settings(&config.cluster_cidrs, config.policy.gate()),
        mesh_metrics.clone(),
    )
    .await
    .context("starting the WireGuard mesh")?;
    metrics.mesh.set(mesh_metrics);
    let mesh = MeshSubsystem::spawn(mesh, view, client);
    metrics
        .status
        .device_ends_with_process
        .store(mesh.device_ends_with_process, Relaxed);
    Ok(mesh)
}

/// nodus's nftables table: the service proxy, or with only the mesh on, its egress
/// masquerade.
fn start_proxy(
    config: &Config,
    view: ViewReader,
    metrics: &Metrics,
) -> anyhow::Result<ProxySubsystem> {
    let proxy = Proxy::new(config.proxy_settings()).context("opening nf_tables netlink")?;
    let health = config.proxy.enabled.then(|| HealthListen {
        bind: config.proxy.health_check_address,
        limits: http::limits(&config.cluster_cidrs),
    });
    let sysctls = config.proxy.enabled.then(|| nodus_proxy::sysctls::Sysctls {
        conntrack: config.proxy.conntrack.settings(),
        route_localnet: config.proxy.localhost_node_ports,
    });
    let proxy = ProxySubsystem::new(proxy, view, health, sysctls, listen::host_addresses);
    metrics.proxy.set(proxy.metrics.clone());
    Ok(proxy)
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut config = Config::load_or_default(args.cluster.config.as_deref())?
        .with_api_server(args.cluster.api_server.as_deref())?;
    config.check_bootstrap(&ApiDiscovery::of_process(args.cluster.kubeconfig.is_some()))?;
    if config.proxy.enabled {
        nodus_proxy::kernel::check_running().map_err(anyhow::Error::msg)?;
    }
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
        match args.allow_http_api {
            true => watch::PlainHttp::Allowed,
            false => watch::PlainHttp::Refused,
        },
    )
    .await?;
    let state = args
        .state_dir
        .as_deref()
        .or(config.state_dir.as_deref())
        .and_then(|dir| StateDir::new(dir, &node_name));
    // Before binding anything: a running nodus for this node hands its sockets over.
    let inherited = match &state {
        Some(state) => take_over(state).await,
        None => Sockets::default(),
    };
    for failure in crate::preflight::check_host(&config, !inherited.dns.is_empty()) {
        tracing::error!(
            check = %failure,
            "start-up check failed; what needs it is retried until the host allows it"
        );
    }
    let metrics = Arc::new(Metrics::default());
    let http = http::serve(
        config.http_addr,
        inherited.http,
        config.status_from_anywhere,
        http::limits(&config.cluster_cidrs),
        metrics.clone(),
    )
    .await?;
    tracing::info!(node = %node_name, http_addr = %http.addr, "nodus starting");

    let set = WatchSet {
        page_size: config.watch_page_size,
        all_nodes: config.mesh.enabled,
        node_name: node_name.clone(),
        // The proxy drops their unallocated addresses; DNS answers their reverse names.
        service_cidrs: config.proxy.enabled || config.dns.enabled,
        local_pods: config.dns.enabled && config.dns.autopath,
        namespaces: config.dns.enabled,
        policy: config.policy.enabled,
    };
    let (items, watched) = watch::watch_all(&client, &set);
    let restored = state.as_ref().and_then(StateDir::restore);
    let mut feed = match restored {
        Some((view, restored)) => {
            let counts = view.counts();
            tracing::info!(
                services = counts.services,
                endpoints = counts.endpoints,
                nodes = counts.nodes,
                bytes = restored.bytes,
                took = ?restored.took,
                saved_unix_ms = status::unix_ms(restored.saved),
                "restored the view saved before; DNS and the mesh serve from it, stale, until \
                 the API's lists replace it"
            );
            metrics.set_counts(&counts);
            metrics.view_stale.store(true, Relaxed);
            let _ = metrics.status.restored.set(restored);
            let feed = Feed::new(view, metrics.clone(), watched);
            feed.mark_restored();
            feed
        }
        None => Feed::new(View::new(&node_name), metrics.clone(), watched),
    };
    let mut saver = state
        .clone()
        .map(|state| Saver::new(state, feed.reader(), metrics.clone()));
    let mut subsystems: Vec<Box<dyn Subsystem>> = Vec::new();
    let starts = metrics.status.starts.clone();
    // Started before the first list, and retried in the background if they cannot start:
    // a DNS port taken or a mesh that cannot make its device leaves the proxy working.
    let dns_handover: Arc<Latest<nodus_dns::server::Handover>> = Arc::default();
    if config.dns.enabled {
        let (config, view, metrics) = (config.clone(), feed.reader(), metrics.clone());
        let inherited = Arc::new(Mutex::new(inherited.dns));
        let handover = dns_handover.clone();
        let client = client.clone();
        let start = move || {
            let (config, view, metrics) = (config.clone(), view.clone(), metrics.clone());
            let client = client.clone();
            let inherited = std::mem::take(
                &mut *inherited
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            );
            let handover = handover.clone();
            async move {
                let server = start_dns(&config, view, client, &metrics, inherited).await?;
                handover.set(Arc::new(server.handover()));
                Ok(server)
            }
        };
        subsystems.push(retry::start_supervised("dns", starts.clone(), start).await);
    }
    if config.mesh.enabled {
        let (config, view, metrics) = (config.clone(), feed.reader(), metrics.clone());
        let client = client.clone();
        let start = move || {
            let (config, view, metrics) = (config.clone(), view.clone(), metrics.clone());
            let client = client.clone();
            async move { start_mesh(&config, view, client, &metrics).await }
        };
        subsystems.push(retry::start_supervised("mesh", starts.clone(), start).await);
    }
    // The mesh alone still needs the table, for its egress masquerade.
    if config.programs_table() {
        let (config, view, metrics) = (config.clone(), feed.reader(), metrics.clone());
        let start = move || {
            let started = start_proxy(&config, view.clone(), &metrics);
            async move { started }
        };
        subsystems.push(retry::start_supervised("proxy", starts.clone(), start).await);
    }
    if let Some(program) = args.on_change.clone() {
        let timeout = Duration::from_secs(args.on_change_timeout);
        subsystems.push(Box::new(OnChange::start(
            program,
            timeout,
            feed.reader(),
            metrics.clone(),
        )));
    }
    let _ = metrics.status.setup.set(board::Setup {
        node: node_name.clone(),
        proxy: config.proxy.enabled,
        egress_only_table: !config.proxy.enabled && config.programs_table(),
        dns: config.dns.enabled,
        mesh: config.mesh.enabled,
        on_change: args.on_change.as_ref().map(|p| p.display().to_string()),
    });
    tracing::info!(
        subsystems = ?subsystems.iter().map(|s| s.name()).collect::<Vec<_>>(),
        "subsystems started"
    );

    if feed.is_stale() {
        let restored = Applied {
            initial_sync: true,
            stale: true,
            ..Applied::default()
        };
        let view = feed.read();
        for subsystem in &mut subsystems {
            subsystem.after_batch(&view, &restored);
        }
    }

    let items = futures::stream::select(items, ticks(CHECK_PERIOD));
    // New pods wait in nodus-cni until they are isolated: its requests join the items.
    let claims = match config.policy.gate() {
        Some(path) => match gate::listen(path) {
            Ok(listener) => Some(gate::claims(listener).map(WatchItem::Sandbox)),
            Err(error) => {
                let error = format!("{error:#}");
                tracing::error!(%error, "no isolation gate: nodus-cni's ADD fails until it is fixed (pods fail closed)");
                metrics.status.view.error(error);
                None
            }
        },
        None => None,
    };
    let items = futures::stream::select(items, futures::stream::iter(claims).flatten());
    let reader = feed.reader();
    let successors = state.as_ref().and_then(|state| {
        let listening = state
            .create()
            .context("creating the state directory")
            .and_then(|()| handover::listen(&state.handover_path()));
        match listening {
            Ok(listener) => Some(listener),
            Err(error) => {
                let error = format!("{error:#}");
                tracing::warn!(%error, "no handover: a restart will not take these sockets over");
                None
            }
        }
    });
    let mut signals = signals::ShutdownSignals::install()?;
    let lameduck = Duration::from_secs(config.lameduck_seconds);
    let ending = {
        let drive = feed.drive(items, |feed, applied| {
            feed.metrics.run_loop.beat();
            if !feed.is_complete() && !applied.stale {
                feed.answer_sandboxes(false);
                return ControlFlow::Continue(());
            }
            if let Some(saver) = &mut saver {
                saver.after_batch(applied);
            }
            if applied.initial_sync
                && !applied.stale
                && feed.metrics.view_stale.swap(false, Relaxed)
            {
                tracing::info!("the API's lists replaced the restored view");
            }
            if !applied.stale && (applied.initial_sync || !applied.changes.is_empty()) {
                feed.metrics.status.view.synced(applied.took);
            }
            let view = feed.read();
            let leaving = view.this_node().is_some_and(|node| node.leaving);
            if leaving != feed.metrics.node_leaving.swap(leaving, Relaxed) {
                match leaving {
                    true => tracing::warn!(
                        "this Node is being deleted or tainted for removal: /healthz answers 503 \
                     so that load balancers drain it"
                    ),
                    false => tracing::info!("this Node is no longer leaving: /healthz answers 200"),
                }
            }
            for subsystem in &mut subsystems {
                subsystem.after_batch(&view, applied);
            }
            let ready = subsystems.iter().all(|s| s.is_ready());
            if ready != feed.metrics.ready.swap(ready, Relaxed) && ready {
                let counts = view.counts();
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
            drop(view);
            // The pods nodus-cni waits on are isolated once the proxy, which enforces
            // policies, is in step (a proxy that failed to start isolates nothing).
            let isolated = subsystems
                .iter()
                .any(|s| s.name() == "proxy" && s.is_ready());
            feed.answer_sandboxes(isolated && !applied.stale);
            ControlFlow::Continue(())
        });
        tokio::pin!(drive);
        let mut draining: Option<Pin<Box<tokio::time::Sleep>>> = None;
        loop {
            tokio::select! {
                () = &mut drive => anyhow::bail!("the watch streams ended"),
                signal = signals.recv() => {
                    if signal != "SIGTERM" || draining.is_some() || lameduck.is_zero() {
                        break Ending::Signal(signal);
                    }
                    metrics.lameduck.store(true, Relaxed);
                    tracing::info!(
                        ?lameduck,
                        "SIGTERM: lameduck; still serving but not ready, and a successor may take \
                         the sockets over"
                    );
                    draining = Some(Box::pin(tokio::time::sleep(lameduck)));
                }
                () = async {
                    match draining.as_mut() {
                        Some(sleep) => sleep.await,
                        None => std::future::pending().await,
                    }
                } => break Ending::Signal("SIGTERM"),
                successor = async {
                    match &successors {
                        Some(listener) => handover::next_successor(listener).await,
                        None => std::future::pending().await,
                    }
                } => {
                    let sockets = Sockets {
                        http: http.hand_over().unwrap_or_default(),
                        dns: dns_handover
                            .get()
                            .map(|dns| dns.sockets().unwrap_or_default())
                            .unwrap_or_default(),
                    };
                    let (state, reader, metrics) = (state.clone(), reader.clone(), metrics.clone());
                    let handed = tokio::task::spawn_blocking(move || {
                        // The successor restores what this process knows now.
                        if let Some(state) = state {
                            state.save(&reader, &metrics);
                        }
                        successor.hand_over(&sockets)
                    })
                    .await
                    .map_err(anyhow::Error::from)
                    .and_then(|handed| handed);
                    match handed {
                        Ok(()) => break Ending::HandedOver { draining: draining.is_some() },
                        Err(error) => tracing::warn!(
                            error = %format!("{error:#}"),
                            "a successor asked for the sockets and did not take them; serving on"
                        ),
                    }
                }
            }
        }
    };
    match ending {
        Ending::Signal(signal) => {
            if let Some(saver) = &mut saver {
                saver.flush().await;
            }
            match metrics.status.device_ends_with_process.load(Relaxed) {
                true => tracing::info!(
                    signal,
                    "exiting; the dataplane stays in place but for the embedded WireGuard \
                     device, which ends with the process"
                ),
                false => tracing::info!(signal, "exiting; the dataplane stays in place"),
            }
        }
        Ending::HandedOver { draining } => {
            // The successor serves the sockets and owns the dataplane and the saved view:
            // this process stops touching them (DNS's threads stop reading, the sockets
            // stay open there), and only waits to be told to go.
            http.stop();
            drop(subsystems);
            tracing::info!("handed the sockets and the dataplane over to the next process");
            if !draining {
                let signal = signals.recv().await;
                tracing::info!(signal, "exiting after the handover");
            }
        }
    }
    Ok(())
}

/// How the serving loop ended.
enum Ending {
    Signal(&'static str),
    /// The next process took the sockets; `draining`: SIGTERM came already.
    HandedOver {
        draining: bool,
    },
}

/// The sockets of a running nodus for this node, which hands them over, if one runs.
async fn take_over(state: &StateDir) -> Sockets {
    let path = state.handover_path();
    let taken = tokio::task::spawn_blocking(move || handover::take_over(&path)).await;
    match taken.map_err(anyhow::Error::from).and_then(|taken| taken) {
        Ok(Some(sockets)) => {
            tracing::info!(
                http = sockets.http.len(),
                dns = sockets.dns.len(),
                "took the sockets over from the running nodus; it stops serving"
            );
            sockets
        }
        Ok(None) => Sockets::default(),
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), "the running nodus did not hand its sockets over; starting without them");
            Sockets::default()
        }
    }
}
