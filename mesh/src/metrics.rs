//! The mesh's series on `/metrics`, kept in atomics that the agent updates after each sync
//! and each device poll, so that rendering never waits on the device.

use crate::backend::DeviceState;
use crate::key::Key;
use nodus_prom::{ConstGauge, Counter, Exported, Families, Gauge, Heartbeat};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

/// A handshake younger than this counts as recent: WireGuard rekeys every two minutes
/// while traffic flows and drops a session after three.
pub const RECENT_HANDSHAKE: Duration = Duration::from_secs(180);

/// Whether a handshake at `at` is younger than [`RECENT_HANDSHAKE`] at `now`.
pub fn is_recent(at: Option<SystemTime>, now: SystemTime) -> bool {
    at.and_then(|t| now.duration_since(t).ok())
        .is_some_and(|age| age < RECENT_HANDSHAKE)
}

/// The most peers `nodus status` lists, those without a recent handshake first.
pub const STATUS_PEERS_MAX: usize = 256;

/// One peer as `nodus status` lists it (and `/status` serves it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerStatus {
    pub node: String,
    pub endpoint: Option<SocketAddr>,
    pub last_handshake_unix_s: Option<u64>,
    pub received_bytes: u64,
    pub sent_bytes: u64,
}

#[derive(Default)]
pub struct MeshMetrics {
    peers: Gauge,
    peers_recent_handshake: Gauge,
    /// Bytes through the tunnel since nodus started: each poll adds what every peer's
    /// counters grew by, so that a peer that leaves takes nothing away.
    rx_bytes: Counter,
    tx_bytes: Counter,
    /// Each peer's counters at the last poll.
    peer_bytes: Mutex<BTreeMap<Key, (u64, u64)>>,
    /// The peers as the last poll found them, for `nodus status`.
    peer_table: Mutex<Vec<PeerStatus>>,
    routes: Gauge,
    /// Unix seconds of the last change made to the device or routes; 0 before any.
    last_change: AtomicU64,
    peer_changes: Counter,
    sync_failures: Counter,
    device_recreations: Counter,
    /// Unix milliseconds of the last sync that succeeded, changed or not; 0 before any.
    last_sync_ms: AtomicU64,
    last_sync_micros: AtomicU64,
    last_error: Mutex<Option<(SystemTime, String)>>,
    /// The mesh's loop went round, for the agent's liveness check.
    pub heartbeat: Heartbeat,
}

/// The mesh as `nodus status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct MeshStatus {
    pub peers: u64,
    pub peers_recent_handshake: u64,
    pub routes: u64,
    pub last_sync: Option<SystemTime>,
    pub last_sync_duration: Duration,
    pub failures: u64,
    pub last_error: Option<(SystemTime, String)>,
    /// At most [`STATUS_PEERS_MAX`], those without a recent handshake first.
    pub peers_listed: Vec<PeerStatus>,
}

/// A count as a gauge's value.
fn gauge(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Now, in seconds since the epoch.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl MeshMetrics {
    /// Records what a device poll returned; `names` are the nodes the peers stand for.
    pub fn observe(&self, state: &DeviceState, now: SystemTime, names: &BTreeMap<Key, Box<str>>) {
        let recent = state
            .peers
            .values()
            .filter(|p| is_recent(p.last_handshake, now))
            .count();
        self.peers.set(gauge(state.peers.len()));
        self.peers_recent_handshake.set(gauge(recent));
        if let Ok(mut last) = self.peer_bytes.lock() {
            let (mut rx, mut tx) = (0, 0);
            for (key, peer) in &state.peers {
                let (old_rx, old_tx) = last.get(key).copied().unwrap_or_default();
                // A counter that went down belongs to a peer made again: all of it is new.
                rx += peer.rx_bytes.checked_sub(old_rx).unwrap_or(peer.rx_bytes);
                tx += peer.tx_bytes.checked_sub(old_tx).unwrap_or(peer.tx_bytes);
            }
            self.rx_bytes.inc_by(rx);
            self.tx_bytes.inc_by(tx);
            *last = state
                .peers
                .iter()
                .map(|(key, peer)| (*key, (peer.rx_bytes, peer.tx_bytes)))
                .collect();
        }
        // Sorted by reference, so that only the rows listed are built, not one per peer.
        let mut order: Vec<(bool, std::borrow::Cow<'_, str>, &crate::backend::PeerState)> = state
            .peers
            .iter()
            .map(|(key, peer)| {
                let node = names.get(key).map_or_else(
                    || std::borrow::Cow::Owned(key.to_base64()),
                    |name| std::borrow::Cow::Borrowed(&**name),
                );
                (is_recent(peer.last_handshake, now), node, peer)
            })
            .collect();
        order.sort_unstable_by(|(a_recent, a, _), (b_recent, b, _)| {
            (a_recent, a).cmp(&(b_recent, b))
        });
        let table = order
            .into_iter()
            .take(STATUS_PEERS_MAX)
            .map(|(_, node, peer)| PeerStatus {
                node: node.into_owned(),
                endpoint: peer.peer.endpoint,
                last_handshake_unix_s: peer
                    .last_handshake
                    .and_then(|at| at.duration_since(SystemTime::UNIX_EPOCH).ok())
                    .map(|since| since.as_secs()),
                received_bytes: peer.rx_bytes,
                sent_bytes: peer.tx_bytes,
            })
            .collect();
        if let Ok(mut listed) = self.peer_table.lock() {
            *listed = table;
        }
    }

    /// Records a sync that took `took`, changed `peer_changes` peers and left `peers`
    /// peers and `routes` routes.
    pub fn synced(
        &self,
        took: Duration,
        peer_changes: usize,
        changed: bool,
        peers: usize,
        routes: usize,
    ) {
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_sync_ms.store(now_ms, Relaxed);
        self.last_sync_micros
            .store(took.as_micros() as u64, Relaxed);
        self.peers.set(gauge(peers));
        self.routes.set(gauge(routes));
        self.peer_changes.inc_by(peer_changes as u64);
        if changed {
            self.last_change.store(unix_now(), Relaxed);
        }
    }

    pub fn sync_failed(&self, error: &impl std::fmt::Display) {
        self.sync_failures.inc();
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some((SystemTime::now(), error.to_string()));
        }
    }

    pub fn device_recreated(&self) {
        self.device_recreations.inc();
    }

    pub fn status(&self) -> MeshStatus {
        let last_sync_ms = self.last_sync_ms.load(Relaxed);
        MeshStatus {
            peers: self.peers.get().unsigned_abs(),
            peers_recent_handshake: self.peers_recent_handshake.get().unsigned_abs(),
            routes: self.routes.get().unsigned_abs(),
            last_sync: (last_sync_ms > 0)
                .then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(last_sync_ms)),
            last_sync_duration: Duration::from_micros(self.last_sync_micros.load(Relaxed)),
            failures: self.sync_failures.get(),
            last_error: self.last_error.lock().ok().and_then(|last| last.clone()),
            peers_listed: self
                .peer_table
                .lock()
                .map(|table| table.clone())
                .unwrap_or_default(),
        }
    }
}

impl Exported for MeshMetrics {
    fn export(&self, families: &mut Families<'_>) -> std::fmt::Result {
        families.one(
            "nodus_mesh_peers",
            "WireGuard peers on the device.",
            &self.peers,
        )?;
        families.one(
            "nodus_mesh_peers_recent_handshake",
            "Peers whose last handshake is under 180 seconds old.",
            &self.peers_recent_handshake,
        )?;
        families.labelled(
            "nodus_mesh_bytes",
            "Bytes through the tunnel since nodus started, over every peer it had.",
            [
                ([("direction", "received")], self.rx_bytes.clone()),
                ([("direction", "sent")], self.tx_bytes.clone()),
            ],
        )?;
        families.one(
            "nodus_mesh_routes",
            "Routes to remote pod CIDRs through the device.",
            &self.routes,
        )?;
        let last = self.last_change.load(Relaxed);
        if last > 0 {
            let since = unix_now().saturating_sub(last);
            families.one(
                "nodus_mesh_seconds_since_last_change",
                "Seconds since the mesh last changed a peer, route, address or the CNI file.",
                &ConstGauge::new(i64::try_from(since).unwrap_or(i64::MAX)),
            )?;
        }
        families.one(
            "nodus_mesh_peer_changes",
            "Per-peer additions, updates and removals made.",
            &self.peer_changes,
        )?;
        families.one(
            "nodus_mesh_sync_failures",
            "Mesh syncs that failed (each is retried).",
            &self.sync_failures,
        )?;
        families.one(
            "nodus_mesh_device_recreations",
            "Times the device had vanished (deleted, or its daemon gone) and was created again.",
            &self.device_recreations,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PeerState;
    use crate::key::Key;
    use crate::plan::Peer;

    #[test]
    fn recent_handshakes_are_counted_and_bytes_only_grow() {
        let now = SystemTime::now();
        let peer = |age: Option<u64>, rx, tx| PeerState {
            peer: Peer::default(),
            last_handshake: age.map(|a| now - Duration::from_secs(a)),
            rx_bytes: rx,
            tx_bytes: tx,
        };
        let state = |peers: Vec<(u8, PeerState)>| DeviceState {
            private_key: None,
            listen_port: 51820,
            peers: peers.into_iter().map(|(k, p)| (Key([k; 32]), p)).collect(),
        };
        let names = BTreeMap::from([
            (Key([1; 32]), "node-1".into()),
            (Key([2; 32]), "node-2".into()),
        ]);
        let metrics = std::sync::Arc::new(MeshMetrics::default());
        metrics.observe(
            &state(vec![
                (1, peer(Some(5), 100, 10)),
                (2, peer(Some(600), 1, 2)),
                (3, peer(None, 0, 0)),
            ]),
            now,
            &names,
        );
        metrics.synced(Duration::from_millis(2), 3, true, 3, 4);
        let rendered = || nodus_prom::render(metrics.clone());
        let text = rendered();
        for line in [
            "nodus_mesh_peers 3",
            "nodus_mesh_peers_recent_handshake 1",
            "nodus_mesh_bytes_total{direction=\"received\"} 101",
            "nodus_mesh_bytes_total{direction=\"sent\"} 12",
            "nodus_mesh_routes 4",
            "nodus_mesh_seconds_since_last_change 0",
            "nodus_mesh_peer_changes_total 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        // Peer 1 leaves, peer 2 grows and peer 3 is made again: the totals never drop.
        metrics.observe(
            &state(vec![(2, peer(Some(600), 11, 2)), (3, peer(None, 5, 0))]),
            now,
            &names,
        );
        let text = rendered();
        assert!(
            text.contains("nodus_mesh_bytes_total{direction=\"received\"} 116"),
            "{text}"
        );
        assert!(
            text.contains("nodus_mesh_bytes_total{direction=\"sent\"} 12"),
            "{text}"
        );
        // Those without a recent handshake first; a peer without a known node by its key.
        let listed = metrics.status().peers_listed;
        assert_eq!(listed.len(), 2);
        let nodes: Vec<&str> = listed.iter().map(|p| p.node.as_str()).collect();
        assert_eq!(nodes, [Key([3; 32]).to_base64().as_str(), "node-2"]);
        assert_eq!(listed[1].received_bytes, 11);
    }
}
