//! The configuration file: one YAML document, one section per subsystem.
//!
//! Unknown keys are errors that name the key and its line, because a misspelt key that is
//! silently ignored is the worst kind of configuration bug on a node agent. Command-line
//! flags override the file.

use anyhow::Context;
use nodus_view::model::Cidr;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:10256";
/// The configuration schema this nodus reads.
pub const API_VERSION: &str = "nodus.dev/v1alpha1";
pub const KIND: &str = "NodusConfiguration";

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The schema of this file: [`API_VERSION`]. A file without it is read as that
    /// version; another version is refused, so that a file written for a newer nodus is
    /// never half-understood.
    #[serde(rename = "apiVersion")]
    pub api_version: Option<String>,
    /// [`KIND`], when given.
    pub kind: Option<String>,
    /// The DNS zone of the cluster.
    pub cluster_domain: String,
    /// Pod address ranges of the whole cluster; empty means "from the Nodes' pod CIDRs",
    /// which the mesh does not accept.
    #[serde(deserialize_with = "cidrs")]
    pub cluster_cidrs: Vec<Cidr>,
    /// Service address ranges, for clusters without ServiceCIDR objects (Kubernetes before
    /// 1.33): DNS is authoritative for their reverse names, as for the ServiceCIDRs'.
    #[serde(deserialize_with = "cidrs")]
    pub service_cidrs: Vec<Cidr>,
    /// The API server's URL, overriding kubeconfig and in-cluster discovery: the proxy
    /// cannot depend on the `kubernetes` Service that it programs itself.
    pub api_server: Option<String>,
    /// Where `/healthz`, `/readyz`, `/metrics` and `/status` are served.
    pub http_addr: SocketAddr,
    /// Whether `/status` (with its error texts) answers clients other than loopback.
    pub status_from_anywhere: bool,
    /// Objects per list page while (re)listing: smaller pages lower peak memory.
    pub watch_page_size: u32,
    /// What outlives the process: the last whole view, which a restart that cannot reach
    /// the API server serves from, and the socket a successor takes the listening sockets
    /// over by. `null` keeps nothing.
    pub state_dir: Option<PathBuf>,
    /// After SIGTERM, how long nodus keeps serving (not ready) for a successor to take its
    /// sockets over before it exits. 0 exits at once.
    pub lameduck_seconds: u64,
    pub proxy: ProxyConfig,
    pub dns: DnsConfig,
    pub mesh: MeshConfig,
    pub policy: PolicyConfig,
}

/// NetworkPolicy enforcement for this node's pods, in the proxy's table. Off by default;
/// `deploy/` turns it on.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Watch every Pod, Namespace and NetworkPolicy, and enforce the policies (needs
    /// `proxy.enabled`).
    pub enabled: bool,
    /// Where nodus-cni's `ADD` asks for a new pod's isolation and waits for it (written in
    /// the conflist), so that no container of a pod starts before its policies apply.
    pub cni_socket: PathBuf,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            enabled: false,
            cni_socket: PathBuf::from("/run/nodus/cni.sock"),
        }
    }
}

impl PolicyConfig {
    /// The isolation gate's socket, when policies are enforced.
    pub fn gate(&self) -> Option<&Path> {
        self.enabled.then_some(self.cni_socket.as_path())
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            api_version: None,
            kind: None,
            cluster_domain: "cluster.local".into(),
            cluster_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            api_server: None,
            http_addr: DEFAULT_HTTP_ADDR.parse().expect("valid default address"),
            status_from_anywhere: false,
            watch_page_size: 100,
            state_dir: Some(PathBuf::from("/var/lib/nodus")),
            lameduck_seconds: 0,
            proxy: ProxyConfig::default(),
            dns: DnsConfig::default(),
            mesh: MeshConfig::default(),
            policy: PolicyConfig::default(),
        }
    }
}

/// The service proxy. Off by default, so that `nodus run` on a workstation never takes
/// over the host's nftables; `deploy/` turns it on.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    pub enabled: bool,
    /// Where health-check node ports listen (every address, as kube-proxy does).
    pub health_check_address: IpAddr,
    /// kube-proxy's `masqueradeAll`: every connection to a ClusterIP is masqueraded, not
    /// only those from outside the pod network.
    pub masquerade_all: bool,
    /// kube-proxy's `masqueradeBit`: the bit of the packet mark (0 to 31) that flags a
    /// connection for masquerade. No other program on the node may use it.
    pub masquerade_bit: u8,
    /// kube-proxy's `conntrack` settings.
    pub conntrack: ConntrackConfig,
    /// kube-proxy's `detectLocalMode`: how pod traffic is told from other traffic.
    pub detect_local_mode: DetectLocalMode,
    /// kube-proxy's `detectLocal`: the interface of the two interface modes.
    pub detect_local: DetectLocalConfig,
    /// kube-proxy's `nodePortAddresses`: `[primary]` (the default: the node's primary
    /// addresses), or ranges of this host's addresses that accept NodePorts
    /// (`0.0.0.0/0` and `::/0` for all).
    #[serde(deserialize_with = "node_port_addresses")]
    pub node_port_addresses: nodus_proxy::plan::NodePortAddresses,
    /// NodePorts on 127.0.0.1 as well, for this host's clients (iptables mode's
    /// `localhost-nodeports`; nftables mode has none): sets `route_localnet` and drops
    /// packets to 127.0.0.0/8 that arrive from other machines.
    pub localhost_node_ports: bool,
}

/// kube-proxy's `detectLocalMode` values, spelled as kube-proxy spells them.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
pub enum DetectLocalMode {
    /// `cluster_cidrs`, or without them this node's pod CIDRs.
    #[default]
    #[serde(rename = "ClusterCIDR")]
    ClusterCidr,
    #[serde(rename = "NodeCIDR")]
    NodeCidr,
    BridgeInterface,
    InterfaceNamePrefix,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DetectLocalConfig {
    /// For `BridgeInterface`: the bridge pods are attached to (`cni0`).
    pub bridge_interface: String,
    /// For `InterfaceNamePrefix`: how the names of pods' interfaces start (`veth`).
    pub interface_name_prefix: String,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            enabled: false,
            health_check_address: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            masquerade_all: false,
            masquerade_bit: nodus_proxy::plan::DEFAULT_MASQUERADE_MARK.trailing_zeros() as u8,
            conntrack: ConntrackConfig::default(),
            detect_local_mode: DetectLocalMode::default(),
            detect_local: DetectLocalConfig::default(),
            node_port_addresses: nodus_proxy::plan::NodePortAddresses::Primary,
            localhost_node_ports: false,
        }
    }
}

/// kube-proxy's `conntrack.maxPerCore`, `min`, `tcpEstablishedTimeout` and
/// `tcpCloseWaitTimeout` (in seconds), with its defaults; 0 leaves a setting alone.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConntrackConfig {
    pub max_per_core: u32,
    pub min: u32,
    pub tcp_established_timeout_seconds: u32,
    pub tcp_close_wait_timeout_seconds: u32,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        let defaults = nodus_proxy::sysctls::ConntrackSettings::default();
        ConntrackConfig {
            max_per_core: defaults.max_per_core,
            min: defaults.min,
            tcp_established_timeout_seconds: defaults.tcp_established_timeout_seconds,
            tcp_close_wait_timeout_seconds: defaults.tcp_close_wait_timeout_seconds,
        }
    }
}

impl ConntrackConfig {
    pub fn settings(&self) -> nodus_proxy::sysctls::ConntrackSettings {
        nodus_proxy::sysctls::ConntrackSettings {
            max_per_core: self.max_per_core,
            min: self.min,
            tcp_established_timeout_seconds: self.tcp_established_timeout_seconds,
            tcp_close_wait_timeout_seconds: self.tcp_close_wait_timeout_seconds,
        }
    }
}

/// The cluster DNS server.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    pub enabled: bool,
    /// UDP and TCP addresses to answer on.
    pub listen: Vec<SocketAddr>,
    /// Clients allowed besides loopback, every Node's addresses and pod CIDRs (those the
    /// view holds) and `cluster_cidrs`; everyone else gets REFUSED.
    #[serde(deserialize_with = "cidrs")]
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

impl DnsConfig {
    /// `config_map` split into namespace and name; None when it is empty.
    pub fn config_map(&self) -> Option<(&str, &str)> {
        namespaced(&self.config_map)
    }
    /// `forward_zones` read: none may hold the cluster domain, which the view answers.
    pub fn stub_domains(
        &self,
        cluster_domain: &str,
    ) -> anyhow::Result<Vec<(nodus_dns::forward::Name, Vec<SocketAddr>)>> {
        self.forward_zones
            .iter()
            .map(|(zone, upstreams)| {
                nodus_dns::forward::stub_domain(zone, upstreams, cluster_domain)
                    .map_err(|error| anyhow::anyhow!("dns.forward_zones: {error}"))
            })
            .collect()
    }

    /// `cluster_dns_service` split into namespace and name.
    pub fn cluster_dns_service(&self) -> Option<(&str, &str)> {
        namespaced(&self.cluster_dns_service)
    }
}

/// `namespace/name` split in two.
fn namespaced(text: &str) -> Option<(&str, &str)> {
    text.split_once('/').filter(|(namespace, name)| {
        !namespace.is_empty() && !name.is_empty() && !name.contains('/')
    })
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum ForwardPolicy {
    Sequential,
    #[default]
    Random,
    RoundRobin,
}

impl From<ForwardPolicy> for nodus_dns::forward::Policy {
    fn from(value: ForwardPolicy) -> Self {
        match value {
            ForwardPolicy::Sequential => nodus_dns::forward::Policy::Sequential,
            ForwardPolicy::Random => nodus_dns::forward::Policy::Random,
            ForwardPolicy::RoundRobin => nodus_dns::forward::Policy::RoundRobin,
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

impl From<PodRecordsConfig> for nodus_dns::PodRecords {
    fn from(value: PodRecordsConfig) -> Self {
        match value {
            PodRecordsConfig::Disabled => nodus_dns::PodRecords::Disabled,
            PodRecordsConfig::Insecure => nodus_dns::PodRecords::Insecure,
        }
    }
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
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
            rate_limit: nodus_dns::rate::RateLimitSettings::default().responses_per_second,
            rate_limit_slip: nodus_dns::rate::RateLimitSettings::default().slip,
            serve_cluster_dns_ip: false,
            cluster_dns_service: "kube-system/kube-dns".into(),
        }
    }
}

/// The WireGuard pod network. When on, nodus watches every Node rather than only its own.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MeshConfig {
    pub enabled: bool,
    /// The WireGuard device's name (unique on the host for the userspace backends).
    pub interface: String,
    pub listen_port: u16,
    /// The private key (created on first start, mode 0600, directory 0700).
    pub key_file: PathBuf,
    /// `auto`, `kernel`, `wireguard-go` (alias `userspace`) or `embedded`.
    pub backend: MeshBackend,
    /// The `wireguard-go` backend's daemon.
    pub wireguard_go: PathBuf,
    /// Which node address peers use as endpoint when a node has both: `ipv4` or `ipv6`.
    pub endpoint_family: EndpointFamily,
    /// Which address of its Node each node publishes for peers: `internal` (its
    /// InternalIP), `external` (its ExternalIP where it has one: nodes on other sites, or
    /// behind a one-to-one NAT) or `learned` (where its peers see its packets come from,
    /// as they report it, else what it published last, else its InternalIP: a node behind
    /// a NAT that maps its port alike for every destination). A Node's `nodus.dev/force-endpoint` annotation (`IP` or
    /// `IP:port`, set by the operator) wins over all.
    pub endpoint: MeshEndpoint,
    /// Seconds between keepalives to each peer; 0 for none. They keep the mapping of a NAT
    /// in front of a node open, so that peers can reach a node that cannot be reached
    /// first (WireGuard's recommended 25 s; k3s's WireGuard backend does the same).
    pub persistent_keepalive: u16,
    /// A fixed device MTU; unset takes the underlay link's MTU minus `mtu_overhead`.
    pub mtu: Option<u32>,
    pub mtu_overhead: u32,
    /// The CNI configuration written for kubelet.
    pub cni_conflist: PathBuf,
    /// The runtime's CNI plugin directory, where the conflist's plugins must be (the init
    /// container's `install-cni` puts them there). Only checked: nodus never writes it.
    pub cni_bin_dir: PathBuf,
    /// Pod traffic to destinations outside the cluster leaves with the node's address.
    pub masquerade: bool,
    /// The ranges node addresses lie in. A peer's node addresses are accepted as sources
    /// from its tunnel (replies to NodePorts that it un-NATs); with ranges set, only its
    /// addresses inside them, so that a node cannot list an address that an `ipBlock`
    /// allows and send from it. Empty: every address its Node lists.
    #[serde(deserialize_with = "cidrs")]
    pub node_cidrs: Vec<Cidr>,
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig {
            enabled: false,
            interface: "nodus-wg".into(),
            listen_port: 51820,
            key_file: PathBuf::from("/var/lib/nodus/wireguard.key"),
            backend: MeshBackend::Auto,
            wireguard_go: PathBuf::from("wireguard-go"),
            endpoint_family: EndpointFamily::Ipv4,
            endpoint: MeshEndpoint::Internal,
            persistent_keepalive: 25,
            mtu: None,
            mtu_overhead: 80,
            // `00-`: runtimes take the first file by name, and a `10-flannel.conflist` or
            // `10-calico.conflist` left behind must not win.
            cni_conflist: PathBuf::from("/etc/cni/net.d/00-nodus.conflist"),
            cni_bin_dir: PathBuf::from("/opt/cni/bin"),
            masquerade: true,
            node_cidrs: Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum MeshBackend {
    /// The kernel if the `wireguard` link type exists, else `wireguard-go` if it runs or is
    /// installed, else the embedded device.
    #[default]
    Auto,
    Kernel,
    /// Named `userspace` before the embedded backend came.
    #[serde(rename = "wireguard-go", alias = "userspace")]
    WireguardGo,
    Embedded,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum MeshEndpoint {
    #[default]
    Internal,
    External,
    Learned,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum EndpointFamily {
    #[default]
    Ipv4,
    Ipv6,
}

impl MeshConfig {
    /// The mesh's settings; `policy_socket`: the isolation gate nodus-cni waits on.
    pub fn settings(
        &self,
        cluster_cidrs: &[Cidr],
        policy_socket: Option<&Path>,
    ) -> nodus_mesh::MeshSettings {
        use nodus_mesh::backend::BackendKind;
        use nodus_view::model::Family;
        nodus_mesh::MeshSettings {
            interface: self.interface.clone(),
            listen_port: self.listen_port,
            key_file: self.key_file.clone(),
            backend: match self.backend {
                MeshBackend::Auto => BackendKind::Auto,
                MeshBackend::Kernel => BackendKind::Kernel,
                MeshBackend::WireguardGo => BackendKind::WireguardGo,
                MeshBackend::Embedded => BackendKind::Embedded,
            },
            wireguard_go: self.wireguard_go.clone(),
            endpoint_family: match self.endpoint_family {
                EndpointFamily::Ipv4 => Family::V4,
                EndpointFamily::Ipv6 => Family::V6,
            },
            mtu: self.mtu,
            mtu_overhead: self.mtu_overhead,
            cni_conflist: self.cni_conflist.clone(),
            cni_bin_dir: self.cni_bin_dir.clone(),
            policy_socket: policy_socket.map(Path::to_path_buf),
            cluster_cidrs: cluster_cidrs.to_vec(),
            node_cidrs: self.node_cidrs.clone(),
            endpoint: match self.endpoint {
                MeshEndpoint::Internal => nodus_mesh::plan::EndpointChoice::Internal,
                MeshEndpoint::External => nodus_mesh::plan::EndpointChoice::External,
                MeshEndpoint::Learned => nodus_mesh::plan::EndpointChoice::Learned,
            },
            persistent_keepalive: self.persistent_keepalive,
        }
    }
}

fn cidrs<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Cidr>, D::Error> {
    Vec::<String>::deserialize(deserializer)?
        .iter()
        .map(|text| text.parse().map_err(serde::de::Error::custom))
        .collect()
}

/// `[primary]`, `[]` or CIDRs; `primary` among CIDRs is refused, as kube-proxy does.
fn node_port_addresses<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<nodus_proxy::plan::NodePortAddresses, D::Error> {
    use nodus_proxy::plan::NodePortAddresses;
    let entries = Vec::<String>::deserialize(deserializer)?;
    if entries.is_empty() || entries == ["primary"] {
        return Ok(NodePortAddresses::Primary);
    }
    entries
        .iter()
        .map(|text| match text.as_str() {
            "primary" => Err(serde::de::Error::custom(
                "`primary` stands alone: it cannot be mixed with CIDRs",
            )),
            _ => text.parse().map_err(serde::de::Error::custom),
        })
        .collect::<Result<Vec<Cidr>, D::Error>>()
        .map(NodePortAddresses::Cidrs)
}

impl Config {
    /// Whether nodus's table masquerades pod traffic leaving the cluster: the mesh is the
    /// pod network, and `mesh.masquerade` is on.
    pub fn egress_masquerade(&self) -> bool {
        self.mesh.enabled && self.mesh.masquerade
    }

    /// Whether nodus programs its nftables table at all: for the service proxy, or for
    /// the egress masquerade alone.
    pub fn programs_table(&self) -> bool {
        self.proxy.enabled || self.egress_masquerade()
    }

    pub fn parse(yaml: &str) -> anyhow::Result<Config> {
        if yaml.trim().is_empty() {
            return Ok(Config::default());
        }
        // serde-saphyr's errors name the line and column, and quote the line.
        let config: Config = serde_saphyr::from_str(yaml)?;
        config.validate()?;
        Ok(config)
    }

    /// The file at `path`, or the defaults without one.
    pub fn load_or_default(path: Option<&Path>) -> anyhow::Result<Config> {
        path.map_or_else(|| Ok(Config::default()), Config::load)
    }

    /// The proxy's settings. With the proxy off and the mesh's egress masquerade on,
    /// nodus's table carries that masquerade alone: another proxy serves Services.
    pub fn proxy_settings(&self) -> nodus_proxy::plan::ProxyConfig {
        use nodus_proxy::plan::{LocalDetector, LocalDns, TableScope};
        let dns = &self.dns;
        let local_dns = dns
            .cluster_dns_service()
            .filter(|_| dns.enabled && dns.serve_cluster_dns_ip)
            .map(|(namespace, name)| LocalDns {
                namespace: namespace.to_string(),
                name: name.to_string(),
                port: dns.listen.first().map_or(53, |addr| addr.port()),
            });
        let scope = match self.proxy.enabled || !self.egress_masquerade() {
            true => TableScope::Services,
            false => TableScope::EgressOnly,
        };
        nodus_proxy::plan::ProxyConfig {
            scope,
            cluster_cidrs: self.cluster_cidrs.clone(),
            masquerade_mark: 1 << self.proxy.masquerade_bit,
            masquerade_all: self.proxy.masquerade_all,
            egress_masquerade: self.egress_masquerade(),
            local_dns,
            local_detector: match self.proxy.detect_local_mode {
                DetectLocalMode::ClusterCidr => LocalDetector::ClusterCidr,
                DetectLocalMode::NodeCidr => LocalDetector::NodeCidr,
                DetectLocalMode::BridgeInterface => {
                    LocalDetector::BridgeInterface(self.proxy.detect_local.bridge_interface.clone())
                }
                DetectLocalMode::InterfaceNamePrefix => LocalDetector::InterfaceNamePrefix(
                    self.proxy.detect_local.interface_name_prefix.clone(),
                ),
            },
            node_port_addresses: self.proxy.node_port_addresses.clone(),
            localhost_node_ports: self.proxy.localhost_node_ports,
            network_policy: self.policy.enabled,
            interface_addresses: Vec::new(),
        }
    }

    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading configuration {}", path.display()))?;
        Config::parse(&text).with_context(|| format!("invalid configuration {}", path.display()))
    }

    fn validate(&self) -> anyhow::Result<()> {
        if let Some(version) = &self.api_version {
            anyhow::ensure!(
                version == API_VERSION,
                "apiVersion: {version:?} is not a version this nodus reads ({API_VERSION}); \
                 it was written for another release"
            );
        }
        if let Some(kind) = &self.kind {
            anyhow::ensure!(kind == KIND, "kind: {kind:?} is not {KIND}");
        }
        anyhow::ensure!(
            !self.cluster_domain.is_empty() && !self.cluster_domain.starts_with('.'),
            "cluster_domain: {:?} is not a domain name",
            self.cluster_domain
        );
        anyhow::ensure!(
            self.watch_page_size > 0,
            "watch_page_size: must be at least 1"
        );
        anyhow::ensure!(
            !self.policy.enabled || self.proxy.enabled,
            "policy.enabled: NetworkPolicy is enforced in the proxy's table; set proxy.enabled too"
        );
        anyhow::ensure!(
            self.dns.ttl <= 3600,
            "dns.ttl: {} is over 3600 seconds",
            self.dns.ttl
        );
        anyhow::ensure!(
            !self.dns.enabled || !self.dns.listen.is_empty(),
            "dns.listen: at least one address is needed while dns.enabled is true"
        );
        anyhow::ensure!(
            self.dns.forward_timeout_ms > 0,
            "dns.forward_timeout_ms: must be at least 1"
        );
        let mesh = &self.mesh;
        anyhow::ensure!(
            !mesh.interface.is_empty()
                && mesh.interface.len() <= 15
                && !mesh.interface.contains('/'),
            "mesh.interface: {:?} is not a link name (1 to 15 bytes)",
            mesh.interface
        );
        anyhow::ensure!(mesh.listen_port > 0, "mesh.listen_port: must be at least 1");
        if let Some(mtu) = mesh.mtu {
            anyhow::ensure!(
                (1280..=65535).contains(&mtu),
                "mesh.mtu: {mtu} is outside 1280..=65535"
            );
        }
        anyhow::ensure!(
            self.dns.forward_max_concurrent > 0,
            "dns.forward_max_concurrent: must be at least 1"
        );
        anyhow::ensure!(
            self.dns.cluster_dns_service().is_some(),
            "dns.cluster_dns_service: {:?} is not namespace/name",
            self.dns.cluster_dns_service
        );
        anyhow::ensure!(
            !self.dns.serve_cluster_dns_ip || (self.dns.enabled && self.proxy.enabled),
            "dns.serve_cluster_dns_ip needs dns.enabled and proxy.enabled: the proxy sends the \
             cluster DNS Service's ClusterIP to this node's DNS"
        );
        anyhow::ensure!(
            self.proxy.masquerade_bit <= 31,
            "proxy.masquerade_bit: {} is not a bit of the 32-bit packet mark (0 to 31)",
            self.proxy.masquerade_bit
        );
        let (key, interface) = match self.proxy.detect_local_mode {
            DetectLocalMode::BridgeInterface => (
                "bridge_interface",
                &self.proxy.detect_local.bridge_interface,
            ),
            DetectLocalMode::InterfaceNamePrefix => (
                "interface_name_prefix",
                &self.proxy.detect_local.interface_name_prefix,
            ),
            DetectLocalMode::ClusterCidr | DetectLocalMode::NodeCidr => ("", &String::new()),
        };
        anyhow::ensure!(
            key.is_empty()
                || (!interface.is_empty()
                    && interface.len() < 16
                    && !interface.contains(['/', ' ', '"'])),
            "proxy.detect_local.{key}: {interface:?} is not an interface name (1 to 15 bytes) \
             that proxy.detect_local_mode {:?} needs",
            self.proxy.detect_local_mode
        );
        anyhow::ensure!(
            (1..=64).contains(&self.dns.udp_threads),
            "dns.udp_threads: {} is not between 1 and 64",
            self.dns.udp_threads
        );
        anyhow::ensure!(
            self.dns.cache_servfail_ttl <= 300,
            "dns.cache_servfail_ttl: {} is over 300 seconds",
            self.dns.cache_servfail_ttl
        );
        anyhow::ensure!(
            self.dns.cache_serve_stale <= 3 * 86400,
            "dns.cache_serve_stale: {} is over three days (RFC 8767's longest)",
            self.dns.cache_serve_stale
        );
        self.dns.stub_domains(&self.cluster_domain)?;
        anyhow::ensure!(
            self.dns.config_map.is_empty() || self.dns.config_map().is_some(),
            "dns.config_map: {:?} is not namespace/name (or empty for none)",
            self.dns.config_map
        );
        for line in &self.dns.hosts {
            let (_, skipped) = nodus_dns::hosts::Hosts::parse([line.as_str()]);
            anyhow::ensure!(
                skipped == 0,
                "dns.hosts: {line:?} is not a hosts-file line (`10.0.0.1 registry.lan [alias…]`)"
            );
        }
        anyhow::ensure!(
            !self.mesh.enabled || !self.cluster_cidrs.is_empty(),
            "mesh.enabled needs cluster_cidrs, the cluster's pod ranges (kubeadm's \
             networking.podSubnet, k3s's --cluster-cidr): a peer's pod CIDRs are routed only \
             inside them, so that no Node can claim another range"
        );
        if let Some(url) = &self.api_server {
            check_api_server(url)?;
        }
        Ok(())
    }

    /// Replaces `api_server` with `--api-server` (`NODUS_API_SERVER`) when given; an empty
    /// value, as a DaemonSet's unset variable reads, changes nothing.
    pub fn with_api_server(mut self, flag: Option<&str>) -> anyhow::Result<Config> {
        if let Some(url) = flag.filter(|url| !url.is_empty()) {
            check_api_server(url).context("--api-server (NODUS_API_SERVER)")?;
            self.api_server = Some(url.to_string());
        }
        Ok(self)
    }

    /// Refuses a proxy that could reach the API server only through the `kubernetes`
    /// Service, which it programs itself: on a new node, or after a reboot (the table
    /// does not survive one), nothing would program that Service, and nodus would wait
    /// for itself forever.
    pub fn check_bootstrap(&self, discovery: &ApiDiscovery) -> anyhow::Result<()> {
        if !self.proxy.enabled || self.api_server.is_some() || discovery.reaches_api_directly() {
            return Ok(());
        }
        anyhow::bail!(
            "api_server: proxy.enabled needs the API server's own address, not the \
             `kubernetes` Service's cluster IP that the in-cluster account uses: nodus \
             programs that Service itself, so a new or rebooted node could never reach the \
             API. Set `api_server` (or --api-server, NODUS_API_SERVER): kubeadm's \
             controlPlaneEndpoint, https://127.0.0.1:6443 on a k3s server, Talos's KubePrism \
             https://localhost:7445; or name a kubeconfig on the host (--kubeconfig)"
        )
    }
}

/// How the process would find the API server when `api_server` is unset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiDiscovery {
    /// A kubeconfig is named: `--kubeconfig` or `$KUBECONFIG`.
    pub kubeconfig: bool,
    /// `$KUBERNETES_SERVICE_HOST`, the in-cluster account's address.
    pub service_host: Option<String>,
    /// `$KUBERNETES_PORT` (`tcp://10.96.0.1:443`), which kubelet sets from the
    /// `kubernetes` Service beside `$KUBERNETES_SERVICE_HOST`. A DaemonSet that sets
    /// `KUBERNETES_SERVICE_HOST` itself (as Cilium's does) leaves this one alone.
    pub service_port: Option<String>,
}

impl ApiDiscovery {
    pub fn of_process(kubeconfig_flag: bool) -> ApiDiscovery {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        ApiDiscovery {
            kubeconfig: kubeconfig_flag || var("KUBECONFIG").is_some(),
            service_host: var("KUBERNETES_SERVICE_HOST"),
            service_port: var("KUBERNETES_PORT"),
        }
    }

    /// A kubeconfig, or an in-cluster address other than the one kubelet gave from the
    /// `kubernetes` Service.
    fn reaches_api_directly(&self) -> bool {
        let cluster_ip = self.service_port.as_deref().and_then(|port| {
            let address = port.strip_prefix("tcp://")?;
            let (host, _) = address.rsplit_once(':')?;
            Some(host.trim_start_matches('[').trim_end_matches(']'))
        });
        self.kubeconfig
            || self
                .service_host
                .as_deref()
                .is_some_and(|host| Some(host) != cluster_ip)
    }
}

/// An `http(s)://` URL whose host is not the placeholder the deploy files ship.
fn check_api_server(url: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        url.starts_with("https://") || url.starts_with("http://"),
        "api_server: {url:?} must be an http:// or https:// URL"
    );
    let host = url
        .split_once("://")
        .map_or("", |(_, rest)| rest.split(['/', ':']).next().unwrap_or(""));
    anyhow::ensure!(
        !host.ends_with(".invalid"),
        "api_server: {url:?} is the deploy files' placeholder: set the API server's address"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_all_defaults() {
        assert_eq!(Config::parse("").expect("valid"), Config::default());
        assert_eq!(Config::parse("{}").expect("valid"), Config::default());
        // kubeadm's Corefile: `pods insecure`.
        assert_eq!(
            Config::default().dns.pod_records,
            PodRecordsConfig::Insecure
        );
    }

    #[test]
    fn sections_parse() {
        let config = Config::parse(
            "cluster_domain: example.org\ncluster_cidrs: [10.244.0.0/16, 'fd00:10::/56']\n\
             proxy:\n  enabled: false\ndns:\n  enabled: false\n  listen: ['127.0.0.1:5353']\n  pod_records: insecure\n\
             mesh:\n  enabled: true\n  backend: userspace\n  endpoint_family: ipv6\n  mtu: 1400\n",
        )
        .expect("valid");
        assert_eq!(config.cluster_domain, "example.org");
        assert_eq!(config.cluster_cidrs.len(), 2);
        // `userspace`, the old name, still means wireguard-go.
        assert_eq!(config.mesh.backend, MeshBackend::WireguardGo);
        assert_eq!(config.mesh.endpoint_family, EndpointFamily::Ipv6);
        assert_eq!(config.mesh.mtu, Some(1400));
        assert_eq!(config.mesh.listen_port, 51820);
        assert!(config.egress_masquerade() && config.programs_table());
        assert_eq!(
            config.dns.listen,
            vec!["127.0.0.1:5353".parse().expect("addr")]
        );
    }

    #[test]
    fn kube_proxy_masquerade_settings_reach_the_proxy() {
        let config = Config::parse(
            "proxy:\n  enabled: true\n  masquerade_all: true\n  masquerade_bit: 15\n",
        )
        .expect("valid");
        let settings = config.proxy_settings();
        assert!(settings.masquerade_all);
        assert_eq!(settings.masquerade_mark, 0x8000);
        let defaults = Config::parse("proxy:\n  enabled: true\n").expect("valid");
        assert_eq!(
            defaults.proxy_settings().masquerade_mark,
            nodus_proxy::plan::DEFAULT_MASQUERADE_MARK
        );
        let error = Config::parse("proxy:\n  masquerade_bit: 32\n").expect_err("bit 32");
        assert!(
            format!("{error:#}").contains("proxy.masquerade_bit"),
            "{error:#}"
        );
    }

    #[test]
    fn kube_proxy_conntrack_settings_have_its_defaults_and_zero_turns_one_off() {
        let defaults = Config::parse("proxy:\n  enabled: true\n").expect("valid");
        assert_eq!(
            defaults.proxy.conntrack.settings(),
            nodus_proxy::sysctls::ConntrackSettings::default()
        );
        let config = Config::parse(
            "proxy:\n  conntrack:\n    max_per_core: 0\n    tcp_close_wait_timeout_seconds: 60\n",
        )
        .expect("valid");
        let settings = config.proxy.conntrack.settings();
        assert_eq!(settings.max(4), 0);
        assert_eq!(settings.tcp_close_wait_timeout_seconds, 60);
        assert_eq!(settings.tcp_established_timeout_seconds, 86_400);
        assert!(Config::parse("proxy:\n  conntrack:\n    maxPerCore: 1\n").is_err());
    }

    #[test]
    fn the_local_traffic_detector_takes_kube_proxys_modes_and_needs_its_interface() {
        use nodus_proxy::plan::LocalDetector;
        let detector = |yaml: &str| Config::parse(yaml).map(|c| c.proxy_settings().local_detector);
        assert_eq!(detector("").expect("valid"), LocalDetector::ClusterCidr);
        assert_eq!(
            detector("proxy:\n  detect_local_mode: NodeCIDR\n").expect("valid"),
            LocalDetector::NodeCidr
        );
        assert_eq!(
            detector(
                "proxy:\n  detect_local_mode: InterfaceNamePrefix\n  detect_local:\n    interface_name_prefix: veth\n"
            )
            .expect("valid"),
            LocalDetector::InterfaceNamePrefix("veth".into())
        );
        let error =
            detector("proxy:\n  detect_local_mode: BridgeInterface\n").expect_err("no bridge");
        assert!(
            format!("{error:#}").contains("proxy.detect_local.bridge_interface"),
            "{error:#}"
        );
        assert!(detector("proxy:\n  detect_local_mode: Bridge\n").is_err());
    }

    #[test]
    fn node_port_addresses_are_primary_or_ranges() {
        use nodus_proxy::plan::NodePortAddresses;
        let addresses =
            |yaml: &str| Config::parse(yaml).map(|c| c.proxy_settings().node_port_addresses);
        assert_eq!(addresses("").expect("valid"), NodePortAddresses::Primary);
        assert_eq!(
            addresses("proxy:\n  node_port_addresses: [primary]\n").expect("valid"),
            NodePortAddresses::Primary
        );
        assert_eq!(
            addresses("proxy:\n  node_port_addresses: [10.0.0.0/8, \"::/0\"]\n").expect("valid"),
            NodePortAddresses::Cidrs(vec![
                "10.0.0.0/8".parse().expect("cidr"),
                "::/0".parse().expect("cidr")
            ])
        );
        let error =
            addresses("proxy:\n  node_port_addresses: [primary, 10.0.0.0/8]\n").expect_err("mixed");
        assert!(format!("{error:#}").contains("primary"), "{error:#}");
        assert!(addresses("proxy:\n  node_port_addresses: [10.0.0.300/8]\n").is_err());
        let localhost = Config::parse("proxy:\n  localhost_node_ports: true\n").expect("valid");
        assert!(localhost.proxy_settings().localhost_node_ports);
    }

    #[test]
    fn the_table_is_programmed_for_the_proxy_or_the_meshs_egress() {
        let table = |yaml: &str| Config::parse(yaml).expect("valid").programs_table();
        assert!(!table(""));
        assert!(table("proxy:\n  enabled: true\n"));
        assert!(table(
            "cluster_cidrs: [10.0.0.0/8]\nmesh:\n  enabled: true\n"
        ));
        assert!(!table(
            "cluster_cidrs: [10.0.0.0/8]\nmesh:\n  enabled: true\n  masquerade: false\n"
        ));
        assert!(!table("mesh:\n  masquerade: true\n"));
    }

    #[test]
    fn unknown_keys_name_the_key_and_line() {
        let err = Config::parse("cluster_domain: a.b\ndns:\n  enabled: false\n  lisen: []\n")
            .expect_err("unknown key");
        let text = format!("{err:#}");
        assert!(
            text.contains("line 4 column 3: unknown field `lisen`"),
            "{text}"
        );

        let err = Config::parse("# nodus\ncluster_domain: a.b\nclusterdomain: c\n")
            .expect_err("unknown key");
        let text = format!("{err:#}");
        assert!(
            text.contains("line 3 column 1: unknown field `clusterdomain`"),
            "{text}"
        );

        let err = Config::parse("clusterdomain: c\n").expect_err("unknown key");
        let text = format!("{err:#}");
        assert!(
            text.contains("line 1 column 1: unknown field `clusterdomain`"),
            "{text}"
        );

        let err = Config::parse("mesh:\n  enabled: true\n  key_dir: /x\n").expect_err("unknown");
        let without_ranges = Config::parse("mesh:\n  enabled: true\n").expect_err("no ranges");
        assert!(
            format!("{without_ranges:#}").contains("mesh.enabled needs cluster_cidrs"),
            "{without_ranges:#}"
        );
        let text = format!("{err:#}");
        assert!(
            text.contains("line 3 column 3: unknown field `key_dir`"),
            "{text}"
        );
    }

    #[test]
    fn the_schema_version_is_checked_when_given() {
        let config = Config::parse(
            "apiVersion: nodus.dev/v1alpha1\nkind: NodusConfiguration\ncluster_domain: a.b\n",
        )
        .expect("valid");
        assert_eq!(config.cluster_domain, "a.b");
        let error = Config::parse("apiVersion: nodus.dev/v2\n").expect_err("newer schema");
        assert!(
            format!("{error:#}").contains("apiVersion: \"nodus.dev/v2\""),
            "{error:#}"
        );
        assert!(Config::parse("apiVersion: nodus.dev/v1alpha1\nkind: ConfigMap\n").is_err());
    }

    #[test]
    fn a_proxy_needs_an_api_server_that_is_not_its_own_service() {
        let proxy = Config::parse("proxy:\n  enabled: true\n").expect("valid");
        // kubelet's variables in a pod: the address is the `kubernetes` Service's.
        let in_cluster = ApiDiscovery {
            kubeconfig: false,
            service_host: Some("10.96.0.1".into()),
            service_port: Some("tcp://10.96.0.1:443".into()),
        };
        let error = proxy
            .check_bootstrap(&in_cluster)
            .expect_err("chicken and egg");
        assert!(
            format!("{error:#}").starts_with("api_server: "),
            "{error:#}"
        );
        assert!(proxy.check_bootstrap(&ApiDiscovery::default()).is_err());
        // The DaemonSet set KUBERNETES_SERVICE_HOST itself, a kubeconfig is named, or the
        // file or the flag names the server.
        let direct = ApiDiscovery {
            service_host: Some("192.168.1.10".into()),
            ..in_cluster.clone()
        };
        proxy.check_bootstrap(&direct).expect("a direct address");
        let kubeconfig = ApiDiscovery {
            kubeconfig: true,
            ..in_cluster.clone()
        };
        proxy.check_bootstrap(&kubeconfig).expect("a kubeconfig");
        let flagged = proxy
            .clone()
            .with_api_server(Some("https://10.0.0.1:6443"))
            .expect("valid");
        flagged.check_bootstrap(&in_cluster).expect("the flag");
        // An empty variable is no flag; the placeholder and other schemes are refused.
        assert!(
            proxy
                .clone()
                .with_api_server(Some(""))
                .expect("unset")
                .api_server
                .is_none()
        );
        assert!(
            proxy
                .clone()
                .with_api_server(Some("https://control-plane.invalid:6443"))
                .is_err()
        );
        assert!(Config::parse("api_server: https://control-plane.invalid:6443\n").is_err());
        // Without the proxy the Service is someone else's.
        Config::default()
            .check_bootstrap(&in_cluster)
            .expect("no proxy");
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(Config::parse("cluster_cidrs: [10.0.0.0/40]").is_err());
        assert!(Config::parse("service_cidrs: [10.96.0.0/33]").is_err());
        assert!(Config::parse("http_addr: nowhere").is_err());
        assert!(Config::parse("api_server: ftp://x").is_err());
        assert!(Config::parse("dns:\n  ttl: 4000\n").is_err());
        assert!(Config::parse("dns:\n  udp_threads: 0\n").is_err());
        assert!(Config::parse("dns:\n  serve_cluster_dns_ip: true\n").is_err());
        assert!(Config::parse("dns:\n  cluster_dns_service: kube-dns\n").is_err());
        let served = Config::parse("proxy:\n  enabled: true\ndns:\n  serve_cluster_dns_ip: true\n")
            .expect("valid");
        assert_eq!(
            served.dns.cluster_dns_service(),
            Some(("kube-system", "kube-dns"))
        );
        assert!(Config::parse("dns:\n  forward_max_concurrent: 0\n").is_err());
        let policy_alone = Config::parse("policy:\n  enabled: true\n").expect_err("refused");
        assert!(
            format!("{policy_alone:#}").contains("proxy.enabled"),
            "{policy_alone:#}"
        );
        let policy =
            Config::parse("proxy:\n  enabled: true\npolicy:\n  enabled: true\n").expect("valid");
        assert!(policy.proxy_settings().network_policy);
        let threads = Config::parse("dns:\n  udp_threads: 2\n").expect("valid");
        assert_eq!(threads.dns.udp_threads, 2);
        assert!(Config::parse("dns:\n  listen: []\n").is_err());
        assert!(Config::parse("dns:\n  pod_records: verified\n").is_err());
        let stubs = Config::parse(
            "dns:\n  forward_policy: round_robin\n  forward_zones:\n    consul: ['10.0.0.3:8600']\n\
             \x20   corp.example.: [10.0.0.5, 'fd00::5']\n",
        )
        .expect("valid");
        assert_eq!(stubs.dns.forward_policy, ForwardPolicy::RoundRobin);
        let zones = stubs.dns.stub_domains("cluster.local").expect("valid");
        assert_eq!(zones.len(), 2);
        assert_eq!(zones[0].0.to_ascii(), "consul.");
        assert_eq!(
            zones[0].1,
            ["10.0.0.3:8600".parse::<SocketAddr>().expect("addr")]
        );
        for (yaml, names) in [
            (
                "dns:\n  forward_zones:\n    svc.cluster.local: [10.0.0.3]\n",
                "cluster domain",
            ),
            ("dns:\n  forward_zones:\n    consul: []\n", "no upstream"),
            (
                "dns:\n  forward_zones:\n    consul: [dns.example]\n",
                "not an address",
            ),
            ("dns:\n  forward_policy: fastest\n", "forward_policy"),
            ("dns:\n  hosts: ['registry.lan 10.0.0.1']\n", "dns.hosts"),
            ("dns:\n  cache_serve_stale: 999999\n", "cache_serve_stale"),
        ] {
            let error = format!("{:#}", Config::parse(yaml).expect_err(yaml));
            assert!(error.contains(names), "{yaml}: {error}");
        }
        assert!(Config::parse("mesh:\n  interface: a-name-far-too-long\n").is_err());
        assert!(Config::parse("mesh:\n  backend: boringtun\n").is_err());
        for (text, backend) in [
            ("wireguard-go", MeshBackend::WireguardGo),
            ("embedded", MeshBackend::Embedded),
            ("kernel", MeshBackend::Kernel),
            ("auto", MeshBackend::Auto),
        ] {
            let config = Config::parse(&format!("mesh:\n  backend: {text}\n")).expect(text);
            assert_eq!(config.mesh.backend, backend);
        }
        assert!(Config::parse("mesh:\n  mtu: 500\n").is_err());
    }
}
