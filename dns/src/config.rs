//! DNS's section of the configuration file (`dns:`): CoreDNS's Corefile options under
//! nodus's names, and the checks that only need this section and the cluster's facts.

use crate::forward::{self, Name, stub_domain};
use crate::hosts::Hosts;
use crate::lookup::PodRecords;
use crate::rate::RateLimitSettings;
use nodus_view::config::{Cluster, Invalid, check};
use nodus_view::model::Cidr;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The cluster DNS server.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub enabled: bool,
    /// UDP and TCP addresses to answer on.
    pub listen: Vec<SocketAddr>,
    /// Clients allowed besides loopback, every Node's addresses and pod CIDRs (those the
    /// view holds) and `cluster_cidrs`; everyone else gets REFUSED.
    pub allow: Vec<Cidr>,
    /// TTL of cluster records, and the SOA minimum (how long misses are cached).
    pub ttl: u32,
    /// `<a-b-c-d>.<ns>.pod.<zone>` records: `disabled` or `insecure` (as in CoreDNS).
    pub pod_records: PodRecordsConfig,
    /// Names outside the zone go to this file's nameservers (nodus's own addresses skipped).
    pub resolv_conf: PathBuf,
    /// How long one upstream gets before the next is tried.
    pub forward_timeout_ms: u64,
    /// Caps of the forwarding cache: answers, and their wire size.
    pub cache_entries: usize,
    pub cache_bytes: usize,
    /// Longest time, in seconds, a forwarded answer is cached and the largest TTL clients
    /// are given for it (kubeadm's Corefile: `cache 30`).
    pub cache_max_ttl: u32,
    /// The same for a denial (NXDOMAIN or NODATA).
    pub cache_max_denial_ttl: u32,
    /// Questions upstream at once; more are refused (CoreDNS's `max_concurrent`).
    pub forward_max_concurrent: usize,
    /// In which order upstreams are asked: `random` (CoreDNS's default), `round_robin` or
    /// `sequential`. Those that are down are asked last whatever the policy.
    pub forward_policy: ForwardPolicy,
    /// Stub domains: the names of a zone go to its own upstreams (`10.0.0.5`,
    /// `10.0.0.5:8600`), the longest zone first.
    pub forward_zones: BTreeMap<String, Vec<String>>,
    /// Seconds a failure of every upstream is remembered: retries get SERVFAIL (or a stale
    /// answer) at once instead of waiting on dead upstreams again (CoreDNS: `servfail 5s`).
    pub cache_servfail_ttl: u32,
    /// Seconds past its TTL an answer is served, with a TTL of 30 s, while every upstream
    /// fails (RFC 8767); 0 never.
    pub cache_serve_stale: u32,
    /// The cluster's DNS ConfigMap, `namespace/name`, whose `stubDomains` and
    /// `upstreamNameservers` are used as kube-dns and NodeLocal DNSCache use them; empty: none.
    pub config_map: String,
    /// One query in this many is logged at info level (client, name, type, transport, rcode,
    /// time), as CoreDNS's `log` plugin; 1 logs every query, 0 none.
    pub query_log_one_in: u32,
    /// Host records answered before the upstreams, as hosts-file lines (`10.0.0.1 registry.lan`);
    /// CoreDNS's `hosts` plugin.
    pub hosts: Vec<String>,
    /// A hosts file read with them, and again whenever it changes (k3s's `NodeHosts`).
    pub hosts_file: Option<PathBuf>,
    /// Walk the search list of this node's `ClusterFirst` pods for them (autopath): the
    /// first question of an outside name gets a CNAME to the name of the list that exists.
    /// Needs this node's Pods (list and watch); the node's search domains come from
    /// `resolv_conf`, the file kubelet gives pods too.
    pub autopath: bool,
    /// Fresh answers after which a name is fetched again in the last tenth of its TTL, so
    /// that popular names never miss (CoreDNS's `prefetch`); 0 never.
    pub cache_prefetch: u32,
    /// Threads answering UDP on each listen address, each on its own `SO_REUSEPORT` socket.
    pub udp_threads: usize,
    /// UDP responses per second to one client prefix (/24, /56); 0 turns limiting off.
    pub rate_limit: u32,
    /// Every `rate_limit_slip`-th response over the limit is sent truncated; 0 drops all.
    pub rate_limit_slip: u32,
    /// The proxy sends the cluster DNS Service's ClusterIP:53 to this node's listener.
    pub serve_cluster_dns_ip: bool,
    /// That Service, `namespace/name`.
    pub cluster_dns_service: String,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum ForwardPolicy {
    Sequential,
    #[default]
    Random,
    RoundRobin,
}

impl From<ForwardPolicy> for forward::Policy {
    fn from(value: ForwardPolicy) -> Self {
        match value {
            ForwardPolicy::Sequential => forward::Policy::Sequential,
            ForwardPolicy::Random => forward::Policy::Random,
            ForwardPolicy::RoundRobin => forward::Policy::RoundRobin,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum PodRecordsConfig {
    Disabled,
    /// kubeadm's and k3s's Corefiles say `pods insecure`.
    #[default]
    Insecure,
}

impl From<PodRecordsConfig> for PodRecords {
    fn from(value: PodRecordsConfig) -> Self {
        match value {
            PodRecordsConfig::Disabled => PodRecords::Disabled,
            PodRecordsConfig::Insecure => PodRecords::Insecure,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            enabled: true,
            listen: vec!["127.0.0.1:53".parse().expect("valid default address")],
            allow: Vec::new(),
            ttl: 5,
            pod_records: PodRecordsConfig::Insecure,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            forward_timeout_ms: 2000,
            cache_entries: 10_000,
            cache_bytes: 1 << 20,
            cache_max_ttl: 30,
            cache_max_denial_ttl: 30,
            // kubeadm's Corefile: `forward . /etc/resolv.conf { max_concurrent 1000 }`.
            forward_max_concurrent: 1000,
            forward_policy: ForwardPolicy::Random,
            forward_zones: BTreeMap::new(),
            cache_servfail_ttl: 5,
            // CoreDNS's `serve_stale` duration.
            cache_serve_stale: 3600,
            cache_prefetch: 0,
            autopath: true,
            hosts: Vec::new(),
            hosts_file: None,
            query_log_one_in: 0,
            config_map: "kube-system/kube-dns".into(),
            udp_threads: 1,
            rate_limit: RateLimitSettings::default().responses_per_second,
            rate_limit_slip: RateLimitSettings::default().slip,
            serve_cluster_dns_ip: false,
            cluster_dns_service: "kube-system/kube-dns".into(),
        }
    }
}

impl Config {
    /// `config_map` split into namespace and name; None when it is empty.
    pub fn config_map(&self) -> Option<(&str, &str)> {
        namespaced(&self.config_map)
    }

    /// `forward_zones` read: none may hold the cluster domain, which the view answers.
    pub fn stub_domains(
        &self,
        cluster_domain: &str,
    ) -> Result<Vec<(Name, Vec<SocketAddr>)>, Invalid> {
        self.forward_zones
            .iter()
            .map(|(zone, upstreams)| {
                stub_domain(zone, upstreams, cluster_domain)
                    .map_err(|error| Invalid(format!("dns.forward_zones: {error}")))
            })
            .collect()
    }

    /// `cluster_dns_service` split into namespace and name.
    pub fn cluster_dns_service(&self) -> Option<(&str, &str)> {
        namespaced(&self.cluster_dns_service)
    }

    /// The section's own rules, with the cluster's domain that stub domains may not hold.
    pub fn validate(&self, cluster: &Cluster) -> Result<(), Invalid> {
        check(self.ttl <= 3600, || {
            format!("dns.ttl: {} is over 3600 seconds", self.ttl)
        })?;
        check(!self.enabled || !self.listen.is_empty(), || {
            "dns.listen: at least one address is needed while dns.enabled is true".into()
        })?;
        check(self.forward_timeout_ms > 0, || {
            "dns.forward_timeout_ms: must be at least 1".into()
        })?;
        check(self.forward_max_concurrent > 0, || {
            "dns.forward_max_concurrent: must be at least 1".into()
        })?;
        check(self.cluster_dns_service().is_some(), || {
            format!(
                "dns.cluster_dns_service: {:?} is not namespace/name",
                self.cluster_dns_service
            )
        })?;
        check((1..=64).contains(&self.udp_threads), || {
            format!(
                "dns.udp_threads: {} is not between 1 and 64",
                self.udp_threads
            )
        })?;
        check(self.cache_servfail_ttl <= 300, || {
            format!(
                "dns.cache_servfail_ttl: {} is over 300 seconds",
                self.cache_servfail_ttl
            )
        })?;
        check(self.cache_serve_stale <= 3 * 86400, || {
            format!(
                "dns.cache_serve_stale: {} is over three days (RFC 8767's longest)",
                self.cache_serve_stale
            )
        })?;
        self.stub_domains(&cluster.domain)?;
        check(
            self.config_map.is_empty() || self.config_map().is_some(),
            || {
                format!(
                    "dns.config_map: {:?} is not namespace/name (or empty for none)",
                    self.config_map
                )
            },
        )?;
        for line in &self.hosts {
            let (_, skipped) = Hosts::parse([line.as_str()]);
            check(skipped == 0, || {
                format!(
                    "dns.hosts: {line:?} is not a hosts-file line (`10.0.0.1 registry.lan \
                     [alias…]`)"
                )
            })?;
        }
        Ok(())
    }
}

/// `namespace/name` split in two.
fn namespaced(text: &str) -> Option<(&str, &str)> {
    text.split_once('/').filter(|(namespace, name)| {
        !namespace.is_empty() && !name.is_empty() && !name.contains('/')
    })
}
