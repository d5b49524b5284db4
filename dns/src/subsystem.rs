//! DNS inside `nodus run` ([`start`]): the zone, the forwarder and the listeners built
//! from the `dns:` section, and the [`Subsystem`] that keeps them in step with the view.

use crate::allow::AllowedPrefixes;
use crate::autopath::NodeSearch;
use crate::config::Config;
use crate::forward::{ForwardConfig, Forwarder, Name, upstreams_from_resolv_conf};
use crate::handler::ClusterDns;
use crate::hosts::HostsSource;
use crate::kube_dns::{ConfigMapRoutes, Routes};
use crate::listen::{self, Listen};
use crate::lookup::Zone;
use crate::rate::RateLimitSettings;
use crate::server::{BoundSockets, DnsServer, serve_planned};
use nodus_limits::Tenants;
use nodus_view::config::Cluster;
use nodus_view::{Applied, Subsystem, View, ViewReader};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Why DNS could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cluster_domain {domain:?}: {source}")]
    Zone {
        domain: String,
        source: hickory_proto::ProtoError,
    },
    #[error("reading this host's addresses: {0}")]
    HostAddresses(std::io::Error),
    #[error("binding DNS on {listen:?}: {source}")]
    Bind {
        listen: Vec<SocketAddr>,
        source: std::io::Error,
    },
}

/// DNS's front door: binds every `listen` address (or serves on the sockets `inherited`
/// from the process before) and answers from `view` as `config` says, for as long as the
/// returned server lives. Until the view is complete it answers from what it has.
pub async fn start(
    config: &Config,
    cluster: &Cluster,
    view: ViewReader,
    inherited: BTreeMap<SocketAddr, BoundSockets>,
) -> Result<DnsServer, StartError> {
    // Read once: its nameservers are the upstreams, its search line the node's domains.
    let resolv_conf = std::fs::read_to_string(&config.resolv_conf);
    let zone = zone(config, cluster, resolv_conf.as_deref().ok())?;
    // A wildcard that another resolver on the node keeps from binding becomes each of the
    // host's addresses, and that resolver stays an upstream.
    let plan = listen::plan(&config.listen);
    let host = if plan.iter().any(|l| matches!(l, Listen::EachAddress(_))) {
        listen::host_addresses().map_err(StartError::HostAddresses)?
    } else {
        Vec::new()
    };
    let own = listen::own_addresses(&plan, &host);
    let routes = configured_routes(config, cluster, &resolv_conf, &own);
    let forwarder = forwarder(config, &routes);
    let mut handler = ClusterDns::new(view, zone, forwarder.clone())
        .with_rate_limit(RateLimitSettings {
            responses_per_second: config.rate_limit,
            slip: config.rate_limit_slip,
        })
        .with_query_log(config.query_log_one_in);
    if !config.hosts.is_empty() || config.hosts_file.is_some() {
        handler = handler.with_hosts(HostsSource::new(
            config.hosts.clone(),
            config.hosts_file.clone(),
        ));
    }
    let pods = match &cluster.cluster_cidrs[..] {
        [] => Tenants::default(),
        ranges => {
            let ranges = ranges.to_vec();
            Tenants::within(move |client| ranges.iter().any(|range| range.contains(client)))
        }
    };
    let mut server = serve_planned(handler, &plan, config.udp_threads, inherited, pods)
        .await
        .map_err(|source| StartError::Bind {
            listen: config.listen.clone(),
            source,
        })?;
    server.allow(AllowedPrefixes {
        cluster: cluster.cluster_cidrs.clone(),
        extra: config.allow.clone(),
    });
    if let (Some(forwarder), Some(_)) = (forwarder, config.config_map()) {
        server.follow_config_map(ConfigMapRoutes::new(forwarder, routes, &cluster.domain));
    }
    tracing::info!(listen = ?server.addrs, zone = %cluster.domain, "DNS serving");
    Ok(server)
}

/// The cluster's zone, authoritative for the reverse names of its ranges, walking the
/// search lists of this node's pods when `autopath` is on (`resolv_conf`: the node's
/// resolv.conf, whose search line holds the node's own domains).
fn zone(config: &Config, cluster: &Cluster, resolv_conf: Option<&str>) -> Result<Zone, StartError> {
    let zone = Zone::new(&cluster.domain, config.ttl, config.pod_records.into())
        .map_err(|source| StartError::Zone {
            domain: cluster.domain.clone(),
            source,
        })?
        .with_cluster_ranges([&cluster.cluster_cidrs[..], &cluster.service_cidrs[..]].concat());
    if !config.autopath {
        return Ok(zone);
    }
    // Unreadable, it has no search domains (and no upstreams, which is reported).
    let node_search = NodeSearch::from_resolv_conf(resolv_conf.unwrap_or_default(), zone.origin());
    let domains: Vec<String> = node_search.domains().iter().map(Name::to_string).collect();
    tracing::info!(
        node_search = %domains.join(" "),
        "autopath walks the search lists of this node's pods"
    );
    Ok(zone.with_autopath(node_search))
}

/// The upstreams of the configuration: the nameservers of `resolv_conf` (as read),
/// leaving out those that are nodus itself (`own`), and the stub domains.
fn configured_routes(
    config: &Config,
    cluster: &Cluster,
    resolv_conf: &std::io::Result<String>,
    own: &[SocketAddr],
) -> Routes {
    let path = config.resolv_conf.display();
    let upstreams = match resolv_conf {
        Ok(text) => {
            let upstreams = upstreams_from_resolv_conf(text, own);
            if upstreams.is_empty() {
                tracing::warn!(%path, "no upstream nameserver; names outside the zone are refused");
            } else {
                tracing::info!(?upstreams, "forwarding names outside the cluster zone");
            }
            upstreams
        }
        Err(error) => {
            tracing::warn!(%path, %error, "cannot read upstreams; names outside the zone are refused");
            Vec::new()
        }
    };
    Routes {
        upstreams,
        // Checked with the rest of the configuration at start.
        zones: config.stub_domains(&cluster.domain).unwrap_or_default(),
    }
}

/// The forwarder for names outside the zone, to `routes`. Without a usable upstream nodus
/// still serves the zone, and refuses the rest.
fn forwarder(config: &Config, routes: &Routes) -> Option<Arc<Forwarder>> {
    if routes.upstreams.is_empty() && routes.zones.is_empty() {
        return None;
    }
    Some(Arc::new(Forwarder::new(ForwardConfig {
        upstreams: routes.upstreams.clone(),
        zones: routes.zones.clone(),
        policy: config.forward_policy.into(),
        timeout: Duration::from_millis(config.forward_timeout_ms),
        cache_entries: config.cache_entries,
        cache_bytes: config.cache_bytes,
        max_concurrent: config.forward_max_concurrent,
        max_ttl: config.cache_max_ttl,
        max_denial_ttl: config.cache_max_denial_ttl,
        failure_ttl: config.cache_servfail_ttl,
        serve_stale: config.cache_serve_stale,
        prefetch_hits: config.cache_prefetch,
    })))
}

/// DNS reads the view at query time; a batch that changed Nodes changes who may ask, and
/// one that changed the cluster's DNS ConfigMap where other names go. It is ready once
/// bound (misses are SERVFAIL until the view is whole: complete, or restored).
impl Subsystem for DnsServer {
    fn name(&self) -> &'static str {
        "dns"
    }

    fn after_batch(&mut self, view: &View, applied: &Applied) {
        if applied.initial_sync || !applied.changes.nodes.is_empty() {
            self.handler.rebuild_allow_list(view, None, None);
        }
        if let Some(routes) = &mut self.config_map
            && (applied.initial_sync || applied.changes.dns_config_map)
        {
            routes.follow(view.dns_config_map());
        }
    }
}
