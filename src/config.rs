//! The configuration file: one YAML document, one section per subsystem.
//!
//! Unknown keys are errors that name the key and its line, because a misspelt key that is
//! silently ignored is the worst kind of configuration bug on a node agent. Command-line
//! flags override the file.

use anyhow::Context;
use nodus_proxy::config::Neighbours;
use nodus_proxy::plan::LocalDns;
use nodus_view::config::Cluster;
use nodus_view::model::Cidr;
use serde::Deserialize;
use std::net::SocketAddr;
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
    pub cluster_cidrs: Vec<Cidr>,
    /// Service address ranges, for clusters without ServiceCIDR objects (Kubernetes before
    /// 1.33): DNS is authoritative for their reverse names, as for the ServiceCIDRs'.
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
    pub proxy: nodus_proxy::config::Config,
    pub dns: nodus_dns::config::Config,
    pub mesh: nodus_mesh::config::Config,
    pub policy: PolicyConfig,
    /// The node view served to other programs on this node.
    pub subscribe: crate::agent::subscribe::Config,
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
    /// Name each NetworkPolicy (namespace and name) in `nodus_policy_denied_packets`.
    /// `/metrics` answers every client, every pod of the node included, so by default the
    /// drops are counted per direction only: no tenant learns another's policy names.
    pub metrics_names: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            enabled: false,
            cni_socket: PathBuf::from("/run/nodus/cni.sock"),
            metrics_names: false,
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
            proxy: Default::default(),
            dns: Default::default(),
            mesh: Default::default(),
            policy: PolicyConfig::default(),
            subscribe: Default::default(),
        }
    }
}

impl Config {
    /// The cluster's facts that the subsystems share.
    pub fn cluster(&self) -> Cluster {
        Cluster {
            domain: self.cluster_domain.clone(),
            cluster_cidrs: self.cluster_cidrs.clone(),
            service_cidrs: self.service_cidrs.clone(),
        }
    }

    /// What the proxy's table carries from the other sections: the mesh's egress
    /// masquerade, the cluster DNS Service sent to this node's DNS, NetworkPolicy.
    pub fn proxy_neighbours(&self) -> Neighbours {
        let dns = &self.dns;
        Neighbours {
            egress_masquerade: self.mesh.egress_masquerade(),
            local_dns: dns
                .cluster_dns_service()
                .filter(|_| dns.enabled && dns.serve_cluster_dns_ip)
                .map(|(namespace, name)| LocalDns {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    port: dns.listen.first().map_or(53, |addr| addr.port()),
                }),
            network_policy: self.policy.enabled,
            // nodus-cni puts every pod link it makes in this group, with the mesh or
            // without it: a node with no such link matches nothing there.
            pod_link_group: Some(nodus_cni::link::POD_LINK_GROUP),
        }
    }

    /// The proxy's planner settings, as the running proxy has them.
    pub fn proxy_settings(&self) -> nodus_proxy::plan::ProxySettings {
        self.proxy
            .settings(&self.cluster(), &self.proxy_neighbours())
    }

    /// Whether nodus programs its nftables table at all: for the service proxy, or for
    /// the egress masquerade alone.
    pub fn programs_table(&self) -> bool {
        self.proxy.programs_table(&self.proxy_neighbours())
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
        let cluster = self.cluster();
        self.proxy.validate()?;
        self.dns.validate(&cluster)?;
        self.mesh.validate(&cluster)?;
        self.subscribe.validate()?;
        // What joins two sections.
        anyhow::ensure!(
            !self.policy.enabled || self.proxy.enabled,
            "policy.enabled: NetworkPolicy is enforced in the proxy's table; set proxy.enabled too"
        );
        anyhow::ensure!(
            !self.dns.serve_cluster_dns_ip || (self.dns.enabled && self.proxy.enabled),
            "dns.serve_cluster_dns_ip needs dns.enabled and proxy.enabled: the proxy sends the \
             cluster DNS Service's ClusterIP to this node's DNS"
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
    use nodus_dns::config::{ForwardPolicy, PodRecordsConfig};
    use nodus_mesh::config::{Backend as MeshBackend, EndpointFamily};

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
        assert!(config.mesh.egress_masquerade() && config.programs_table());
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
