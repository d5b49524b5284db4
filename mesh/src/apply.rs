//! Brings the device, its addresses and routes, and the CNI file in step with a plan.
//!
//! On start the agent reads what the kernel already has (the device's key, port and peers,
//! the routes through it) and from then on only sends differences: one peer added,
//! updated or removed at a time, so that a restart, or a change to one node, leaves every
//! other session alone.

use crate::Error;
use crate::backend::{BackendKind, Device, DeviceState};
use crate::conflist;
use crate::key::{Key, KeyPair};
use crate::links::{Link, Links};
use crate::metrics::MeshMetrics;
use crate::metrics::is_recent;
use crate::plan::{
    Desired, EndpointChoice, Peer, PeerChange, PlanSettings, peer_changes, set_changes,
};
use nodus_view::model::{Cidr, Family};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The MTU assumed under the tunnel when the underlay link cannot be found.
const FALLBACK_UNDERLAY_MTU: u32 = 1500;

/// The mesh's settings, from the `mesh:` section of the configuration.
#[derive(Clone, Debug)]
pub struct MeshSettings {
    pub interface: String,
    pub listen_port: u16,
    pub key_file: PathBuf,
    pub backend: BackendKind,
    /// The `wireguard-go` backend's daemon.
    pub wireguard_go: PathBuf,
    pub endpoint_family: Family,
    /// A fixed device MTU; `None` takes the underlay's minus `mtu_overhead`.
    pub mtu: Option<u32>,
    pub mtu_overhead: u32,
    pub cni_conflist: PathBuf,
    /// Where the runtime finds the conflist's plugins, asked which versions they read.
    pub cni_bin_dir: PathBuf,
    /// The isolation gate nodus-cni's `ADD` waits on (policies enforced), in the conflist.
    pub policy_socket: Option<PathBuf>,
    /// The cluster's pod ranges; every peer's pod CIDRs must lie inside them.
    pub cluster_cidrs: Vec<Cidr>,
    /// Where node addresses may lie; empty for anywhere.
    pub node_cidrs: Vec<Cidr>,
    /// Which of its addresses this node publishes.
    pub endpoint: EndpointChoice,
    /// Seconds between keepalives to each peer; 0 for none.
    pub persistent_keepalive: u16,
}

/// What one sync changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub peer_changes: usize,
    pub routes_added: usize,
    pub routes_removed: usize,
    pub addresses_changed: usize,
    pub link_set: bool,
    pub cni_written: bool,
    pub took: Duration,
}

impl SyncReport {
    pub fn changed(&self) -> bool {
        self.peer_changes + self.routes_added + self.routes_removed + self.addresses_changed > 0
            || self.link_set
            || self.cni_written
    }
}

/// What a poll of the device found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// The device is there and was read.
    Read,
    /// The device had vanished (its link deleted, or its daemon gone with its TUN) and was
    /// created again, empty: the next sync programs it whole.
    Recreated,
}

pub struct Mesh {
    settings: MeshSettings,
    keys: KeyPair,
    /// `None` after the device vanished and opening it again failed.
    device: Option<Device>,
    /// The backend in use, kept to open the same one again.
    backend: BackendKind,
    links: Links,
    /// What the device and kernel hold, as last read or written.
    peers: BTreeMap<Key, Peer>,
    routes: BTreeSet<Cidr>,
    addresses: BTreeSet<Cidr>,
    /// The endpoints of live sessions, as the device learned them from the peers' packets:
    /// kept over the planned ones (see [`peer_changes`]).
    learned: BTreeMap<Key, SocketAddr>,
    /// The node each peer stands for, as last planned (for `nodus status`).
    peer_nodes: BTreeMap<Key, Box<str>>,
    /// The conflist's version, as the plugins in `cni_bin_dir` read it at start.
    cni_version: &'static str,
    pub metrics: Arc<MeshMetrics>,
}

impl Mesh {
    /// The endpoints of live sessions, as the device last reported them.
    pub fn learned(&self) -> &BTreeMap<Key, SocketAddr> {
        &self.learned
    }

    /// Loads the key, opens (or adopts) the device and reads what the kernel has.
    pub async fn start(settings: MeshSettings, metrics: Arc<MeshMetrics>) -> Result<Mesh, Error> {
        let keys = KeyPair::load_or_create(&settings.key_file)?;
        let device = Device::open(
            settings.backend,
            &settings.interface,
            &settings.wireguard_go,
        )
        .await?;
        let mut mesh = Mesh {
            keys,
            backend: device.backend(),
            device: Some(device),
            links: Links::new()?,
            peers: BTreeMap::new(),
            routes: BTreeSet::new(),
            addresses: BTreeSet::new(),
            learned: BTreeMap::new(),
            peer_nodes: BTreeMap::new(),
            cni_version: conflist::chain_version(&settings.cni_bin_dir),
            metrics,
            settings,
        };
        mesh.take_identity().await?;
        tracing::info!(
            device = %mesh.settings.interface,
            backend = mesh.backend(),
            public_key = %mesh.keys.public,
            peers = mesh.peers.len(),
            routes = mesh.routes.len(),
            cni_version = mesh.cni_version,
            "mesh device ready"
        );
        Ok(mesh)
    }

    pub fn interface(&self) -> &str {
        &self.settings.interface
    }

    pub fn public_key(&self) -> &Key {
        &self.keys.public
    }

    /// The backend in use (never `auto`: that is resolved when the device opens).
    pub fn backend(&self) -> &'static str {
        self.backend.name()
    }

    /// The device is embedded in this process: it ends when nodus exits.
    pub fn device_ends_with_process(&self) -> bool {
        self.backend == BackendKind::Embedded
    }

    fn device(&mut self) -> Result<&mut Device, Error> {
        self.device.as_mut().ok_or_else(|| {
            Error::device(
                format!("device {}", self.settings.interface),
                "gone, and opening it again failed",
            )
        })
    }

    /// Reads what the device holds and gives it our key and port if it has others.
    async fn take_identity(&mut self) -> Result<(), Error> {
        let state = self.refresh().await?;
        if state.private_key != Some(*self.keys.private())
            || state.listen_port != self.settings.listen_port
        {
            let (keys, port) = (self.keys.clone(), self.settings.listen_port);
            self.device()?.set_identity(&keys, port).await?;
        }
        Ok(())
    }

    /// Re-reads the device as [`Mesh::refresh`] does, first creating it again if it has
    /// vanished: deleted by someone, or gone with its `wireguard-go` daemon (the kernel
    /// deletes a TUN link when its last holder exits). A daemon that is there but does not
    /// answer is an error, not a reason to start a second one.
    pub async fn poll(&mut self) -> Result<Poll, Error> {
        if let Some(link) = self.links.find(&self.settings.interface).await?
            && self.device.is_some()
        {
            self.read(link).await?;
            return Ok(Poll::Read);
        }
        // The old device must be gone before the new one is made: an embedded device
        // still serves its socket after its link is deleted, until it is dropped.
        self.device = None;
        self.device = Some(
            Device::open(
                self.backend,
                &self.settings.interface,
                &self.settings.wireguard_go,
            )
            .await?,
        );
        self.take_identity().await?;
        self.metrics.device_recreated();
        Ok(Poll::Recreated)
    }

    pub fn plan_settings(&self) -> PlanSettings {
        PlanSettings {
            listen_port: self.settings.listen_port,
            endpoint_family: self.settings.endpoint_family,
            cluster_cidrs: self.settings.cluster_cidrs.clone(),
            node_cidrs: self.settings.node_cidrs.clone(),
            endpoint: self.settings.endpoint,
            persistent_keepalive: self.settings.persistent_keepalive,
            now: i64::try_from(crate::metrics::unix_now()).unwrap_or(i64::MAX),
        }
    }

    /// What the device holds, as last read or written.
    pub fn held_peers(&self) -> &BTreeMap<Key, Peer> {
        &self.peers
    }

    /// Re-reads the device's peers and the kernel's routes and addresses (so that the next
    /// sync repairs outside changes) and updates the metrics.
    pub async fn refresh(&mut self) -> Result<DeviceState, Error> {
        let link = self.links.link(&self.settings.interface).await?;
        self.read(link).await
    }

    /// [`Mesh::refresh`] of the device's `link`, already looked up.
    async fn read(&mut self, link: Link) -> Result<DeviceState, Error> {
        let state = self.device()?.state().await?;
        self.routes = self.links.routes(link.index).await?;
        self.addresses = self.links.addresses(link.index).await?;
        self.peers = state
            .peers
            .iter()
            .map(|(k, p)| (*k, p.peer.clone()))
            .collect();
        let now = SystemTime::now();
        self.learned = state
            .peers
            .iter()
            .filter(|(_, p)| is_recent(p.last_handshake, now))
            .filter_map(|(k, p)| Some((*k, p.peer.endpoint?)))
            .collect();
        self.metrics.observe(&state, now, &self.peer_nodes);
        Ok(state)
    }

    async fn mtu(&self, own_endpoint: Option<IpAddr>) -> Result<u32, Error> {
        if let Some(mtu) = self.settings.mtu {
            return Ok(mtu);
        }
        let underlay = match own_endpoint {
            Some(ip) => self.links.mtu_of_address(ip).await?,
            None => None,
        };
        Ok(underlay
            .unwrap_or(FALLBACK_UNDERLAY_MTU)
            .saturating_sub(self.settings.mtu_overhead))
    }

    /// Makes the kernel hold `desired`. Stale routes go before their peers and new routes
    /// after theirs, so that no route points into the device without a peer behind it.
    pub async fn sync(&mut self, desired: &Desired) -> Result<SyncReport, Error> {
        let started = Instant::now();
        let mut report = SyncReport::default();
        let mtu = self.mtu(desired.own_endpoint).await?;
        let link = self.links.link(&self.settings.interface).await?;
        if !link.up || link.mtu != Some(mtu) {
            self.links.set_up_with_mtu(link.index, mtu).await?;
            report.link_set = true;
        }
        // Add before removing: deleting the device's last IPv4 address flushes its routes.
        let (add, remove) = set_changes(&self.addresses, &desired.device_addresses);
        for address in &add {
            self.links.add_address(link.index, *address).await?;
            self.addresses.insert(*address);
        }
        for address in &remove {
            self.links.remove_address(link.index, *address).await?;
            self.addresses.remove(address);
        }
        report.addresses_changed = add.len() + remove.len();
        if !remove.is_empty() {
            // Our own first address may have moved: re-read what the kernel kept.
            self.routes = self.links.routes(link.index).await?;
        }

        let (add_routes, remove_routes) = set_changes(&self.routes, &desired.routes);
        for route in &remove_routes {
            self.links.remove_route(link.index, *route).await?;
            self.routes.remove(route);
        }
        let changes = peer_changes(&self.peers, &desired.peers, &self.learned);
        if self.peer_nodes != desired.peer_nodes {
            self.peer_nodes.clone_from(&desired.peer_nodes);
        }
        self.device()?.apply(&changes).await?;
        for change in &changes {
            match change {
                PeerChange::Remove(key) => self.peers.remove(key),
                PeerChange::Upsert(key, peer) => self.peers.insert(*key, peer.clone()),
            };
        }
        for route in &add_routes {
            self.links.add_route(link.index, *route).await?;
            self.routes.insert(*route);
        }
        report.peer_changes = changes.len();
        report.routes_added = add_routes.len();
        report.routes_removed = remove_routes.len();

        if !desired.own_cidrs.is_empty() {
            let content = conflist::conflist(
                &desired.own_cidrs,
                mtu,
                self.settings.policy_socket.as_deref(),
                self.cni_version,
            );
            report.cni_written = conflist::write_if_changed(&self.settings.cni_conflist, &content)?;
        }
        report.took = started.elapsed();
        // Handshakes and byte counts come with the next poll: a dump after every change
        // would cost as much as the change at thousands of peers.
        self.metrics.synced(
            report.took,
            report.peer_changes,
            report.changed(),
            self.peers.len(),
            self.routes.len(),
        );
        Ok(report)
    }
}
