//! The mesh's section of the configuration file (`mesh:`), and the [`MeshSettings`] it
//! becomes.

use crate::MeshSettings;
use crate::backend::BackendKind;
use crate::plan::EndpointChoice;
use nodus_view::config::{Cluster, Invalid, check};
use nodus_view::model::{Cidr, Family};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The WireGuard pod network. When on, nodus watches every Node rather than only its own.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub enabled: bool,
    /// The WireGuard device's name (unique on the host for the userspace backends).
    pub interface: String,
    pub listen_port: u16,
    /// The private key (created on first start, mode 0600, directory 0700).
    pub key_file: PathBuf,
    /// `auto`, `kernel`, `wireguard-go` (alias `userspace`) or `embedded`.
    pub backend: Backend,
    /// The `wireguard-go` backend's daemon.
    pub wireguard_go: PathBuf,
    /// Which node address peers use as endpoint when a node has both: `ipv4` or `ipv6`.
    pub endpoint_family: EndpointFamily,
    /// Which address of its Node each node publishes for peers: `internal` (its
    /// InternalIP), `external` (its ExternalIP where it has one: nodes on other sites, or
    /// behind a one-to-one NAT) or `learned` (where its peers see its packets come from,
    /// as they report it, else what it published last, else its InternalIP: a node behind
    /// a NAT that maps its port alike for every destination). A Node's
    /// `nodus.dev/force-endpoint` annotation (`IP` or `IP:port`, set by the operator)
    /// wins over all.
    pub endpoint: Endpoint,
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
    pub node_cidrs: Vec<Cidr>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            enabled: false,
            interface: "nodus-wg".into(),
            listen_port: 51820,
            key_file: PathBuf::from("/var/lib/nodus/wireguard.key"),
            backend: Backend::Auto,
            wireguard_go: PathBuf::from("wireguard-go"),
            endpoint_family: EndpointFamily::Ipv4,
            endpoint: Endpoint::Internal,
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
pub enum Backend {
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
pub enum Endpoint {
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

impl Config {
    /// Whether nodus's table masquerades pod traffic leaving the cluster: the mesh is the
    /// pod network, and `masquerade` is on.
    pub fn egress_masquerade(&self) -> bool {
        self.enabled && self.masquerade
    }

    /// The section's own rules; `cluster`: a mesh routes pod CIDRs only inside the
    /// cluster's ranges, so it needs them.
    pub fn validate(&self, cluster: &Cluster) -> Result<(), Invalid> {
        check(
            !self.interface.is_empty()
                && self.interface.len() <= 15
                && !self.interface.contains('/'),
            || {
                format!(
                    "mesh.interface: {:?} is not a link name (1 to 15 bytes)",
                    self.interface
                )
            },
        )?;
        check(self.listen_port > 0, || {
            "mesh.listen_port: must be at least 1".into()
        })?;
        if let Some(mtu) = self.mtu {
            check((1280..=65535).contains(&mtu), || {
                format!("mesh.mtu: {mtu} is outside 1280..=65535")
            })?;
        }
        check(!self.enabled || !cluster.cluster_cidrs.is_empty(), || {
            "mesh.enabled needs cluster_cidrs, the cluster's pod ranges (kubeadm's \
             networking.podSubnet, k3s's --cluster-cidr): a peer's pod CIDRs are routed only \
             inside them, so that no Node can claim another range"
                .into()
        })
    }

    /// The mesh's settings; `policy_socket`: the isolation gate nodus-cni waits on.
    pub fn settings(&self, cluster: &Cluster, policy_socket: Option<&Path>) -> MeshSettings {
        MeshSettings {
            interface: self.interface.clone(),
            listen_port: self.listen_port,
            key_file: self.key_file.clone(),
            backend: match self.backend {
                Backend::Auto => BackendKind::Auto,
                Backend::Kernel => BackendKind::Kernel,
                Backend::WireguardGo => BackendKind::WireguardGo,
                Backend::Embedded => BackendKind::Embedded,
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
            cluster_cidrs: cluster.cluster_cidrs.clone(),
            node_cidrs: self.node_cidrs.clone(),
            endpoint: match self.endpoint {
                Endpoint::Internal => EndpointChoice::Internal,
                Endpoint::External => EndpointChoice::External,
                Endpoint::Learned => EndpointChoice::Learned,
            },
            persistent_keepalive: self.persistent_keepalive,
        }
    }
}
