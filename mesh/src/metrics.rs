//! The mesh's series on `/metrics`, kept in atomics that the agent updates after each sync
//! and each device poll, so that rendering never waits on the device.

use crate::backend::DeviceState;
use nodus_prom::{Heartbeat, family, sample, single};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

/// A handshake younger than this counts as recent: WireGuard rekeys every two minutes
/// while traffic flows and drops a session after three.
pub const RECENT_HANDSHAKE: Duration = Duration::from_secs(180);

#[derive(Default)]
pub struct MeshMetrics {
    peers: AtomicU64,
    peers_recent_handshake: AtomicU64,
    rx_bytes: AtomicU64,
    tx_bytes: AtomicU64,
    routes: AtomicU64,
    /// Unix seconds of the last change made to the device or routes; 0 before any.
    last_change: AtomicU64,
    peer_changes: AtomicU64,
    sync_failures: AtomicU64,
    device_recreations: AtomicU64,
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
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl MeshMetrics {
    /// Records what a device poll returned.
    pub fn observe(&self, state: &DeviceState, now: SystemTime) {
        let recent = state
            .peers
            .values()
            .filter(|p| {
                p.last_handshake
                    .and_then(|t| now.duration_since(t).ok())
                    .is_some_and(|age| age < RECENT_HANDSHAKE)
            })
            .count();
        self.peers.store(state.peers.len() as u64, Relaxed);
        self.peers_recent_handshake.store(recent as u64, Relaxed);
        self.rx_bytes
            .store(state.peers.values().map(|p| p.rx_bytes).sum(), Relaxed);
        self.tx_bytes
            .store(state.peers.values().map(|p| p.tx_bytes).sum(), Relaxed);
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
        self.peers.store(peers as u64, Relaxed);
        self.routes.store(routes as u64, Relaxed);
        self.peer_changes.fetch_add(peer_changes as u64, Relaxed);
        if changed {
            self.last_change.store(unix_now(), Relaxed);
        }
    }

    pub fn sync_failed(&self, error: &impl std::fmt::Display) {
        self.sync_failures.fetch_add(1, Relaxed);
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some((SystemTime::now(), error.to_string()));
        }
    }

    pub fn device_recreated(&self) {
        self.device_recreations.fetch_add(1, Relaxed);
    }

    pub fn status(&self) -> MeshStatus {
        let last_sync_ms = self.last_sync_ms.load(Relaxed);
        MeshStatus {
            peers: self.peers.load(Relaxed),
            peers_recent_handshake: self.peers_recent_handshake.load(Relaxed),
            routes: self.routes.load(Relaxed),
            last_sync: (last_sync_ms > 0)
                .then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(last_sync_ms)),
            last_sync_duration: Duration::from_micros(self.last_sync_micros.load(Relaxed)),
            failures: self.sync_failures.load(Relaxed),
            last_error: self.last_error.lock().ok().and_then(|last| last.clone()),
        }
    }

    pub fn render(&self, out: &mut String) {
        single(
            out,
            "nodus_mesh_peers",
            "gauge",
            "WireGuard peers on the device.",
            self.peers.load(Relaxed),
        );
        single(
            out,
            "nodus_mesh_peers_recent_handshake",
            "gauge",
            "Peers whose last handshake is under 180 seconds old.",
            self.peers_recent_handshake.load(Relaxed),
        );
        family(
            out,
            "nodus_mesh_peer_bytes",
            "gauge",
            "Bytes through the tunnel, summed over the current peers.",
        );
        for (direction, value) in [("received", &self.rx_bytes), ("sent", &self.tx_bytes)] {
            sample(
                out,
                "nodus_mesh_peer_bytes",
                &format!("direction=\"{direction}\""),
                value.load(Relaxed),
            );
        }
        single(
            out,
            "nodus_mesh_routes",
            "gauge",
            "Routes to remote pod CIDRs through the device.",
            self.routes.load(Relaxed),
        );
        let last = self.last_change.load(Relaxed);
        if last > 0 {
            single(
                out,
                "nodus_mesh_seconds_since_last_change",
                "gauge",
                "Seconds since the mesh last changed a peer, route, address or the CNI file.",
                unix_now().saturating_sub(last),
            );
        }
        single(
            out,
            "nodus_mesh_peer_changes_total",
            "counter",
            "Per-peer additions, updates and removals made.",
            self.peer_changes.load(Relaxed),
        );
        single(
            out,
            "nodus_mesh_sync_failures_total",
            "counter",
            "Mesh syncs that failed (each is retried).",
            self.sync_failures.load(Relaxed),
        );
        single(
            out,
            "nodus_mesh_device_recreations_total",
            "counter",
            "Times the device had vanished (deleted, or its daemon gone) and was created again.",
            self.device_recreations.load(Relaxed),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PeerState;
    use crate::key::Key;
    use crate::plan::Peer;

    #[test]
    fn recent_handshakes_and_bytes_are_summed() {
        let now = SystemTime::now();
        let peer = |age: Option<u64>, rx, tx| PeerState {
            peer: Peer {
                endpoint: None,
                allowed_ips: Vec::new(),
            },
            last_handshake: age.map(|a| now - Duration::from_secs(a)),
            rx_bytes: rx,
            tx_bytes: tx,
        };
        let state = DeviceState {
            private_key: None,
            listen_port: 51820,
            peers: [
                (Key([1; 32]), peer(Some(5), 100, 10)),
                (Key([2; 32]), peer(Some(600), 1, 2)),
                (Key([3; 32]), peer(None, 0, 0)),
            ]
            .into(),
        };
        let metrics = MeshMetrics::default();
        metrics.observe(&state, now);
        metrics.synced(Duration::from_millis(2), 3, true, 3, 4);
        let mut text = String::new();
        metrics.render(&mut text);
        for line in [
            "nodus_mesh_peers 3",
            "nodus_mesh_peers_recent_handshake 1",
            "nodus_mesh_peer_bytes{direction=\"received\"} 101",
            "nodus_mesh_peer_bytes{direction=\"sent\"} 12",
            "nodus_mesh_routes 4",
            "nodus_mesh_seconds_since_last_change 0",
            "nodus_mesh_peer_changes_total 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }
}
