//! What each subsystem is doing, for people: `/status` (JSON, served by the agent) and
//! `nodus status` (asks a running agent and prints one screen).
//!
//! Counters live in [`Metrics`]; this module adds what Prometheus does not keep: when each
//! subsystem last synced, how long that took, and its last error.

use crate::metrics::Metrics;
use anyhow::Context;
use nodus_mesh::metrics::MeshStatus;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The last sync and the last error of one subsystem.
#[derive(Default)]
pub struct Tracker(Mutex<Track>);

#[derive(Clone, Default)]
struct Track {
    synced: bool,
    last_sync: Option<SystemTime>,
    last_duration: Option<Duration>,
    errors: u64,
    last_error: Option<(SystemTime, String)>,
}

impl Track {
    fn note_error(&mut self, error: impl std::fmt::Display) {
        self.errors += 1;
        self.last_error = Some((SystemTime::now(), error.to_string()));
    }
}

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Track> {
        // A panic elsewhere while holding it leaves plain data behind: use it as it is.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn synced(&self, took: Duration) {
        let mut track = self.lock();
        track.synced = true;
        track.last_sync = Some(SystemTime::now());
        track.last_duration = Some(took);
    }

    /// An error that leaves the subsystem out of step until its next sync.
    pub fn failed(&self, error: impl std::fmt::Display) {
        let mut track = self.lock();
        track.synced = false;
        track.note_error(error);
    }

    /// An error after which the subsystem is still in step (a skipped object, a retried
    /// watch, a backend program that failed).
    pub fn error(&self, error: impl std::fmt::Display) {
        self.lock().note_error(error);
    }

    fn report(&self, name: &str) -> Subsystem {
        let track = self.lock().clone();
        Subsystem {
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
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the agent was started with; set once at start-up.
pub struct Setup {
    pub node: String,
    pub proxy: bool,
    /// The proxy is off but the table carries the mesh's egress masquerade.
    pub egress_only_table: bool,
    pub dns: Option<Vec<SocketAddr>>,
    pub mesh: bool,
    pub on_change: Option<String>,
}

/// The agent's status board, part of [`Metrics`] so that every subsystem reaches it.
pub struct Board {
    started: SystemTime,
    pub setup: OnceLock<Setup>,
    pub view: Tracker,
    pub proxy: Tracker,
    pub on_change: Tracker,
}

impl Default for Board {
    fn default() -> Self {
        Board {
            started: SystemTime::now(),
            setup: OnceLock::new(),
            view: Tracker::default(),
            proxy: Tracker::default(),
            on_change: Tracker::default(),
        }
    }
}

/// `/status`.
#[derive(Debug, Deserialize, Serialize)]
pub struct Status {
    pub version: String,
    pub node: String,
    pub started_unix_ms: u64,
    pub ready: bool,
    pub subsystems: Vec<Subsystem>,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct Subsystem {
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

impl Subsystem {
    fn disabled(name: &str, detail: Option<&str>) -> Subsystem {
        Subsystem {
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
pub fn status(metrics: &Metrics) -> Status {
    let board = &metrics.status;
    let setup = board.setup.get();
    let mut view = board.view.report("view");
    view.objects = metrics
        .view_objects()
        .into_iter()
        .map(|(kind, n)| (kind.to_string(), n))
        .collect();
    let mut subsystems = vec![view];
    subsystems.push(match setup {
        Some(setup) if setup.proxy => {
            let mut proxy = board.proxy.report("proxy");
            proxy
                .objects
                .insert("service".into(), metrics.proxy_services_programmed());
            proxy
        }
        Some(setup) if setup.egress_only_table => {
            let mut table = board.proxy.report("proxy");
            table.detail = Some("off; the table holds only the mesh's egress masquerade".into());
            table
        }
        _ => Subsystem::disabled("proxy", None),
    });
    subsystems.push(match setup.and_then(|s| s.dns.as_ref()) {
        // DNS answers from the view itself: it is in step whenever the view is.
        Some(addrs) => Subsystem {
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
            ..Subsystem::disabled("dns", None)
        },
        None => Subsystem::disabled("dns", None),
    });
    subsystems.push(match (setup.filter(|s| s.mesh), metrics.mesh.get()) {
        (Some(_), Some(mesh)) => mesh_subsystem(&mesh.status()),
        _ => Subsystem::disabled("mesh", None),
    });
    if let Some(program) = setup.and_then(|s| s.on_change.as_ref()) {
        let mut on_change = board.on_change.report("on-change");
        on_change.detail = Some(program.clone());
        subsystems.push(on_change);
    }
    Status {
        version: env!("CARGO_PKG_VERSION").into(),
        node: setup.map(|s| s.node.clone()).unwrap_or_default(),
        started_unix_ms: unix_ms(board.started),
        ready: metrics.ready.load(Relaxed),
        subsystems,
    }
}

/// The mesh from its own record: synced once a sync succeeded after the last failure.
fn mesh_subsystem(mesh: &MeshStatus) -> Subsystem {
    let failed_since = match (&mesh.last_error, mesh.last_sync) {
        (Some((failed, _)), Some(synced)) => *failed > synced,
        (Some(_), None) => true,
        (None, _) => false,
    };
    Subsystem {
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

/// "3.2 s ago", "4 min ago".
fn ago(now: u64, then: u64) -> String {
    let seconds = now.saturating_sub(then) as f64 / 1e3;
    match seconds {
        s if s < 60.0 => format!("{s:.1} s ago"),
        s if s < 3600.0 => format!("{:.0} min ago", s / 60.0),
        s => format!("{:.1} h ago", s / 3600.0),
    }
}

/// One screen for people.
pub fn render(status: &Status, now: SystemTime) -> String {
    use std::fmt::Write;
    let now = unix_ms(now);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "nodus {} on node {}, started {}, {}",
        status.version,
        status.node,
        ago(now, status.started_unix_ms),
        if status.ready { "ready" } else { "NOT READY" }
    );
    let _ = writeln!(
        out,
        "\n{:<10} {:<10} {:<52} {:<22} ERRORS",
        "SUBSYSTEM", "STATE", "OBJECTS", "LAST SYNC (TOOK)"
    );
    for s in &status.subsystems {
        let state = match (s.enabled, s.synced) {
            (false, _) => "off",
            (true, true) => "synced",
            (true, false) => "NOT SYNCED",
        };
        let objects = s
            .objects
            .iter()
            .map(|(kind, n)| match n {
                1 => format!("1 {kind}"),
                n => format!("{n} {kind}s"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let last = match (s.last_sync_unix_ms, s.last_sync_duration_ms) {
            (Some(at), Some(ms)) => format!("{} ({ms:.1} ms)", ago(now, at)),
            (Some(at), None) => ago(now, at),
            _ => "-".into(),
        };
        let errors = match s.enabled {
            true => s.errors.to_string(),
            false => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<10} {:<10} {:<52} {:<22} {errors}",
            s.name, state, objects, last
        );
    }
    out.push('\n');
    for s in &status.subsystems {
        if let Some(detail) = &s.detail {
            let _ = writeln!(out, "{}: {detail}", s.name);
        }
        if let (Some(error), Some(at)) = (&s.last_error, s.last_error_unix_ms) {
            let _ = writeln!(out, "{}: last error {}: {error}", s.name, ago(now, at));
        }
    }
    out
}

/// `nodus status`: asks the agent at `addr` and prints its one-screen summary.
pub fn print(addr: SocketAddr) -> anyhow::Result<()> {
    let (code, body) = nodus_testbed::probe::http_get(addr, "/status", Duration::from_secs(5))
        .with_context(|| format!("asking nodus at {addr} (is it running? --http-addr)"))?;
    anyhow::ensure!(code == 200, "{addr}/status answered {code}: {body}");
    let status: Status =
        serde_json::from_str(&body).with_context(|| format!("{addr}/status is not a status"))?;
    print!("{}", render(&status, SystemTime::now()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_mesh::metrics::MeshMetrics;
    use std::sync::Arc;

    #[test]
    fn a_failed_sync_shows_until_the_next_one_succeeds() {
        let tracker = Tracker::default();
        tracker.synced(Duration::from_millis(3));
        tracker.failed("netlink: Operation not permitted");
        let report = tracker.report("proxy");
        assert!(!report.synced);
        assert_eq!(report.errors, 1);
        assert_eq!(
            report.last_error.as_deref(),
            Some("netlink: Operation not permitted")
        );
        tracker.synced(Duration::from_millis(2));
        let report = tracker.report("proxy");
        assert!(report.synced);
        assert_eq!(report.errors, 1, "errors count, they are not reset");
        assert_eq!(report.last_sync_duration_ms, Some(2.0));
    }

    #[test]
    fn the_mesh_line_counts_peers_and_shows_a_failure_until_the_next_sync() {
        let metrics = Metrics::default();
        let _ = metrics.status.setup.set(Setup {
            node: "node-1".into(),
            proxy: false,
            egress_only_table: true,
            dns: None,
            mesh: true,
            on_change: None,
        });
        let mesh = Arc::new(MeshMetrics::default());
        let _ = metrics.mesh.set(mesh.clone());
        mesh.synced(Duration::from_millis(4), 2, true, 2, 3);
        let text = render(&status(&metrics), SystemTime::now());
        assert!(
            text.contains("mesh       synced     2 peers, 0 recent handshakes, 3 routes"),
            "{text}"
        );
        assert!(text.contains("(4.0 ms)"), "{text}");
        assert!(text.contains("the mesh's egress masquerade"), "{text}");
        std::thread::sleep(Duration::from_millis(2));
        mesh.sync_failed(&"setting the link up: Operation not permitted");
        let text = render(&status(&metrics), SystemTime::now());
        assert!(text.contains("mesh       NOT SYNCED"), "{text}");
        assert!(text.contains("mesh: last error"), "{text}");
        std::thread::sleep(Duration::from_millis(2));
        mesh.synced(Duration::from_millis(1), 0, false, 2, 3);
        assert!(render(&status(&metrics), SystemTime::now()).contains("mesh       synced"));
    }

    #[test]
    fn the_screen_names_every_subsystem_and_the_last_error() {
        let metrics = Metrics::default();
        let _ = metrics.status.setup.set(Setup {
            node: "node-1".into(),
            proxy: true,
            egress_only_table: false,
            dns: Some(vec!["127.0.0.1:53".parse().expect("addr")]),
            mesh: false,
            on_change: None,
        });
        metrics.status.view.synced(Duration::from_micros(300));
        metrics.status.proxy.failed("the kernel refused the batch");
        let text = render(&status(&metrics), SystemTime::now());
        assert!(text.contains("on node node-1"), "{text}");
        assert!(text.contains("NOT READY"), "{text}");
        for line in [
            "view       synced",
            "proxy      NOT SYNCED",
            "mesh       off",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        assert!(text.contains("answering on 127.0.0.1:53"), "{text}");
        assert!(
            text.contains("proxy: last error 0.0 s ago: the kernel refused the batch"),
            "{text}"
        );
    }
}
