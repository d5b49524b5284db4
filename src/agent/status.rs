//! `/status`: what each subsystem is doing, as JSON for `nodus status` and people.
//!
//! Counters live in the metrics; this adds what Prometheus does not keep: when each
//! subsystem last synced, how long that took, and its last error.

use crate::agent::board::Board;
use crate::agent::metrics::Metrics;
use crate::agent::process::ProcessState;
use crate::agent::subscribe::Hub;
use nodus_mesh::metrics::{MeshStatus, PeerStatus};
use nodus_prom::Track;
use nodus_proxy::apply::RefusedPod;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A subsystem's line from its tracker's record.
fn report(name: &str, track: Track) -> SubsystemStatus {
    SubsystemStatus {
        name: name.into(),
        enabled: true,
        synced: track.synced,
        objects: BTreeMap::new(),
        last_sync_unix_ms: track.last_sync.map(unix_ms),
        last_sync_duration_ms: track.last_duration.map(|d| d.as_secs_f64() * 1e3),
        errors: track.errors,
        last_error: track.last_error.as_ref().map(|(_, e)| e.clone()),
        last_error_unix_ms: track.last_error.map(|(at, _)| unix_ms(at)),
        detail: None,
    }
}

/// `/status`.
#[derive(Debug, Deserialize, Serialize)]
pub struct Status {
    pub version: String,
    pub node: String,
    pub started_unix_ms: u64,
    pub ready: bool,
    pub subsystems: Vec<SubsystemStatus>,
    /// The mesh's peers (at most 256, those without a recent handshake first).
    #[serde(default)]
    pub mesh_peers: Vec<PeerStatus>,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct SubsystemStatus {
    pub name: String,
    pub enabled: bool,
    pub synced: bool,
    pub objects: BTreeMap<String, u64>,
    pub last_sync_unix_ms: Option<u64>,
    pub last_sync_duration_ms: Option<f64>,
    pub errors: u64,
    pub last_error: Option<String>,
    pub last_error_unix_ms: Option<u64>,
    /// One more fact worth a glance (where DNS listens, which program runs on change).
    pub detail: Option<String>,
}

impl SubsystemStatus {
    /// Enabled but not running: its start failed and is being retried.
    fn not_started(name: &str, board: &Board) -> SubsystemStatus {
        SubsystemStatus {
            enabled: true,
            last_error: board.starts.pending(name),
            detail: Some("not started; retrying".into()),
            ..SubsystemStatus::disabled(name, None)
        }
    }

    fn disabled(name: &str, detail: Option<&str>) -> SubsystemStatus {
        SubsystemStatus {
            name: name.into(),
            enabled: false,
            synced: false,
            objects: BTreeMap::new(),
            last_sync_unix_ms: None,
            last_sync_duration_ms: None,
            errors: 0,
            last_error: None,
            last_error_unix_ms: None,
            detail: detail.map(str::to_string),
        }
    }
}

/// The status as `/status` serves it.
pub fn status(metrics: &Metrics, process: &ProcessState) -> Status {
    let board = &metrics.status;
    let setup = board.setup.get();
    let mut view = report("view", board.view.snapshot());
    view.objects = metrics
        .view_objects()
        .into_iter()
        .map(|(kind, n)| (kind.to_string(), n))
        .collect();
    if process.is_view_stale()
        && let Some(restored) = board.restored.get()
    {
        view.detail = Some(format!(
            "stale: restored from the view saved at {} ms since the epoch, until the API's \
             lists replace it",
            unix_ms(restored.saved)
        ));
    }
    let mut subsystems = vec![view];
    let proxy = metrics.proxy.get();
    let proxy_track = proxy
        .as_ref()
        .map(|p| p.status.snapshot())
        .unwrap_or_default();
    let pending = |name| board.starts.pending(name).is_some();
    subsystems.push(match setup {
        Some(setup) if setup.programs_table() && pending("proxy") => {
            SubsystemStatus::not_started("proxy", board)
        }
        Some(setup) if setup.proxy => {
            let mut line = report("proxy", proxy_track);
            let programmed = proxy.as_ref().map_or(0, |p| p.services_programmed());
            line.objects.insert("service".into(), programmed);
            if let Some(policy) = proxy.as_ref().and_then(|p| p.policy_enforcement()) {
                line.objects
                    .insert("isolated pod".into(), policy.isolated_pods as u64);
                line.objects
                    .insert("pod failing closed".into(), policy.refused.len() as u64);
                line.detail = refused_pods(&policy.refused);
            }
            line
        }
        Some(setup) if setup.egress_only_table => {
            let mut line = report("proxy", proxy_track);
            line.detail = Some("off; the table holds only the mesh's egress masquerade".into());
            line
        }
        _ => SubsystemStatus::disabled("proxy", None),
    });
    subsystems.push(match (setup.filter(|s| s.dns), board.dns_addrs.get()) {
        // DNS answers from the view itself: it is in step whenever the view is.
        (Some(_), Some(addrs)) if !pending("dns") => SubsystemStatus {
            synced: subsystems[0].synced,
            last_sync_unix_ms: subsystems[0].last_sync_unix_ms,
            detail: Some(format!(
                "answering on {}",
                addrs
                    .iter()
                    .map(SocketAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            enabled: true,
            ..SubsystemStatus::disabled("dns", None)
        },
        (Some(_), _) => SubsystemStatus::not_started("dns", board),
        _ => SubsystemStatus::disabled("dns", None),
    });
    let mut mesh_peers = Vec::new();
    subsystems.push(match (setup.filter(|s| s.mesh), metrics.mesh.get()) {
        (Some(_), Some(mesh)) if !pending("mesh") => {
            let status = mesh.status();
            let line = mesh_subsystem(&status);
            mesh_peers = status.peers_listed;
            line
        }
        (Some(_), _) => SubsystemStatus::not_started("mesh", board),
        _ => SubsystemStatus::disabled("mesh", None),
    });
    if let Some(program) = setup.and_then(|s| s.on_change.as_ref()) {
        let mut on_change = report("on-change", board.on_change.snapshot());
        on_change.detail = Some(program.clone());
        subsystems.push(on_change);
    }
    if let Some(hub) = metrics.subscribe.get() {
        subsystems.push(subscribers(&hub, board));
    }
    Status {
        version: env!("CARGO_PKG_VERSION").into(),
        node: setup.map(|s| s.node.clone()).unwrap_or_default(),
        started_unix_ms: unix_ms(board.started),
        ready: process.is_ready(),
        subsystems,
        mesh_peers,
    }
}

/// The view's subscribers: how many, and each one's lag in batches.
fn subscribers(hub: &Hub, board: &Board) -> SubsystemStatus {
    const LISTED: usize = 8;
    let (_, listed) = hub.subscribers();
    let stats = &hub.stats;
    let mut line = report("subscribe", board.subscribe.snapshot());
    line.synced = listed.iter().all(|s| s.lag == 0);
    line.objects = BTreeMap::from([
        ("subscriber".to_string(), listed.len() as u64),
        ("cut off".to_string(), stats.cut_off.load(Relaxed)),
        ("refused".to_string(), stats.refused.load(Relaxed)),
    ]);
    let each: Vec<String> = listed
        .iter()
        .take(LISTED)
        .map(|s| {
            format!(
                "{} (since {} ms): {} batches behind, {} lines, {} bytes",
                s.who,
                unix_ms(s.connected),
                s.lag,
                s.lines,
                s.bytes
            )
        })
        .collect();
    line.detail = (!each.is_empty()).then(|| each.join("; "));
    line
}

/// Pods failing closed, as the proxy's detail: at most a few, with the kernel's reason.
fn refused_pods(refused: &[RefusedPod]) -> Option<String> {
    const LISTED: usize = 8;
    let listed: Vec<String> = refused
        .iter()
        .take(LISTED)
        .map(|pod| format!("{:?}: {}", pod.addresses, pod.reason))
        .collect();
    (!listed.is_empty()).then(|| {
        format!(
            "{} pods failing closed, their allowances refused by the kernel: {}{}",
            refused.len(),
            listed.join("; "),
            if refused.len() > LISTED { "; …" } else { "" }
        )
    })
}

/// The mesh from its own record: synced once a sync succeeded after the last failure.
fn mesh_subsystem(mesh: &MeshStatus) -> SubsystemStatus {
    let failed_since = match (&mesh.last_error, mesh.last_sync) {
        (Some((failed, _)), Some(synced)) => *failed > synced,
        (Some(_), None) => true,
        (None, _) => false,
    };
    SubsystemStatus {
        name: "mesh".into(),
        enabled: true,
        synced: mesh.last_sync.is_some() && !failed_since,
        objects: BTreeMap::from([
            ("peer".to_string(), mesh.peers),
            ("recent handshake".to_string(), mesh.peers_recent_handshake),
            ("route".to_string(), mesh.routes),
        ]),
        last_sync_unix_ms: mesh.last_sync.map(unix_ms),
        last_sync_duration_ms: mesh
            .last_sync
            .map(|_| mesh.last_sync_duration.as_secs_f64() * 1e3),
        errors: mesh.failures,
        last_error: mesh.last_error.as_ref().map(|(_, e)| e.clone()),
        last_error_unix_ms: mesh.last_error.as_ref().map(|(at, _)| unix_ms(*at)),
        detail: None,
    }
}
