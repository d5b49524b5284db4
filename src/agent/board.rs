//! What `/status` adds to the counters: what the agent was started with, the last sync and
//! error of the view and of the `--on-change` backend (each subsystem crate keeps its
//! own), and the subsystems that failed to start.

use nodus_prom::{ConstCounter, Exported, Families, Tracker};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

/// What the agent was started with; set once at start-up.
pub struct Setup {
    pub node: String,
    pub proxy: bool,
    /// The proxy is off but the table carries the mesh's egress masquerade.
    pub egress_only_table: bool,
    pub dns: bool,
    pub mesh: bool,
    pub on_change: Option<String>,
}

impl Setup {
    /// nodus programs its table: the proxy, or the mesh's egress masquerade alone.
    pub fn programs_table(&self) -> bool {
        self.proxy || self.egress_only_table
    }
}

/// A view restored at start (saved by the process before): when it was saved and what
/// restoring it took.
#[derive(Clone, Copy, Debug)]
pub struct Restored {
    pub saved: SystemTime,
    pub bytes: u64,
    pub took: Duration,
}

/// The agent's status board, part of the agent's metrics so that every part reaches it.
pub struct Board {
    pub started: SystemTime,
    pub setup: OnceLock<Setup>,
    pub view: Tracker,
    pub on_change: Tracker,
    /// The subscription socket's errors (it could not be made).
    pub subscribe: Tracker,
    /// Where DNS answers, once it does.
    pub dns_addrs: OnceLock<Vec<SocketAddr>>,
    /// Subsystems that failed to start.
    pub starts: Arc<Starts>,
    /// The mesh's device is embedded: it ends with the process.
    pub device_ends_with_process: AtomicBool,
    /// The view this process started from, saved by the one before.
    pub restored: OnceLock<Restored>,
}

/// Start failures and panics per subsystem: how many of each, and the last error while it
/// is not running.
#[derive(Default)]
pub struct Starts(Mutex<BTreeMap<&'static str, Record>>);

#[derive(Default)]
struct Record {
    failures: u64,
    panics: u64,
    pending: Option<String>,
}

impl Starts {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Record>> {
        // Plain data: a panic while holding it leaves nothing half-done.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn failed(&self, name: &'static str, error: String) {
        let mut starts = self.lock();
        let entry = starts.entry(name).or_default();
        entry.failures += 1;
        entry.pending = Some(error);
    }

    /// `name` panicked (or its task ended) and is being started again.
    pub fn panicked(&self, name: &'static str) {
        self.lock().entry(name).or_default().panics += 1;
    }

    pub fn started(&self, name: &'static str) {
        if let Some(entry) = self.lock().get_mut(name) {
            entry.pending = None;
        }
    }

    /// Why `name` is not running, if it failed to start or is being started again.
    pub fn pending(&self, name: &str) -> Option<String> {
        self.lock()
            .get(name)
            .and_then(|record| record.pending.clone())
    }
}

impl Exported for Starts {
    fn export(&self, families: &mut Families<'_>) -> std::fmt::Result {
        let starts = self.lock();
        if starts.is_empty() {
            return Ok(());
        }
        for (family, help, count) in [
            (
                "nodus_subsystem_start_failures",
                "Failed starts of a subsystem (each is retried while the others run).",
                (|r: &Record| r.failures) as fn(&Record) -> u64,
            ),
            (
                "nodus_subsystem_panics",
                "Panics of a subsystem (each one is dropped and started again).",
                |r: &Record| r.panics,
            ),
        ] {
            families.labelled(
                family,
                help,
                starts.iter().map(|(name, record)| {
                    ([("subsystem", *name)], ConstCounter::new(count(record)))
                }),
            )?;
        }
        Ok(())
    }
}

impl Default for Board {
    fn default() -> Self {
        Board {
            started: SystemTime::now(),
            setup: OnceLock::new(),
            view: Tracker::default(),
            on_change: Tracker::default(),
            subscribe: Tracker::default(),
            dns_addrs: OnceLock::new(),
            starts: Arc::default(),
            device_ends_with_process: AtomicBool::new(false),
            restored: OnceLock::new(),
        }
    }
}
