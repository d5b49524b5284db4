//! What `/status` adds to the counters: what the agent was started with, and the last
//! sync and error of the view and of the `--on-change` backend (each subsystem crate
//! keeps its own).

use nodus_prom::Tracker;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::SystemTime;

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

/// The agent's status board, part of the agent's metrics so that every part reaches it.
pub struct Board {
    pub started: SystemTime,
    pub setup: OnceLock<Setup>,
    pub view: Tracker,
    pub on_change: Tracker,
}

impl Default for Board {
    fn default() -> Self {
        Board {
            started: SystemTime::now(),
            setup: OnceLock::new(),
            view: Tracker::default(),
            on_change: Tracker::default(),
        }
    }
}
