//! Backends that subscribe to the running agent: one watch of the API server, any number
//! of consumers of the node view (KPNG's `to-api`, as JSON lines over a Unix socket).
//!
//! The [`Publisher`] is a subsystem like the others: after every batch it numbers what
//! changed in the [`journal`] (names only) and wakes the subscribers. Each subscriber
//! walks its own work ([`walk`]): a snapshot, or what changed since the batch it last
//! finished, read from the view as it is when sent. A subscriber costs one chunk buffer
//! and its list of names; one that falls out of the journal's reach is cut off
//! ([`server`]) and must resync, and nothing it does holds the feed back. The socket's
//! format is [`protocol`]; `--on-change` is one more subscriber ([`crate::agent::on_change`]).

pub mod journal;
pub mod protocol;
pub mod server;
pub mod walk;

use journal::{Journal, Work};
use nodus_prom::{ConstCounter, ConstGauge, Exported, Families};
use nodus_view::{Applied, Subsystem, View, ViewReader};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};
use tokio::sync::watch;

/// The configuration's `subscribe` section.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Serve the view to subscribers at the socket.
    pub enabled: bool,
    /// The Unix socket subscribers connect to [default: `view-<node>.sock` in the state
    /// directory, beside the handover socket; none without a state directory].
    pub socket: Option<PathBuf>,
    /// A group (by number) whose members may subscribe too; without it, root only. The
    /// state directory is root's alone, so a group needs a `socket` outside it.
    pub group: Option<u32>,
    /// Subscribers connected at once; one more is told so and closed.
    pub max_subscribers: usize,
}

/// The most `max_subscribers` may be: each one is a task, a buffer and a walk.
pub const MAX_SUBSCRIBERS_LIMIT: usize = 64;

impl Default for Config {
    fn default() -> Self {
        Config {
            enabled: true,
            socket: None,
            group: None,
            max_subscribers: 8,
        }
    }
}

impl Config {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=MAX_SUBSCRIBERS_LIMIT).contains(&self.max_subscribers),
            "subscribe.max_subscribers must be between 1 and {MAX_SUBSCRIBERS_LIMIT}"
        );
        anyhow::ensure!(
            self.socket
                .as_ref()
                .is_none_or(|socket| socket.is_absolute()),
            "subscribe.socket must be an absolute path"
        );
        anyhow::ensure!(
            self.group.is_none() || self.socket.is_some(),
            "subscribe.group needs subscribe.socket: the state directory, where the socket \
             is by default, is root's alone (try /run/nodus/view.sock)"
        );
        Ok(())
    }

    /// Where the socket is for `node`'s agent keeping its state in `state_dir`.
    pub fn socket_path(&self, state_dir: Option<&Path>, node: &str) -> Option<PathBuf> {
        self.socket
            .clone()
            .or_else(|| state_dir.map(|dir| dir.join(format!("view-{node}.sock"))))
    }
}

/// What every subscriber reads from: the journal, the view and the latest batch number.
pub struct Hub {
    /// This process's numbering, as subscribers name it to resume.
    epoch: String,
    journal: Mutex<Journal>,
    latest: watch::Sender<u64>,
    view: ViewReader,
    pub stats: Stats,
}

impl Hub {
    pub fn new(view: ViewReader) -> Arc<Hub> {
        // Unique enough that a subscriber never mistakes another process's numbers.
        let started = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let epoch = format!("{:x}-{:x}", std::process::id(), started);
        Arc::new(Hub {
            journal: Mutex::new(Journal::new()),
            epoch,
            latest: watch::Sender::new(0),
            view,
            stats: Stats::default(),
        })
    }

    fn journal(&self) -> MutexGuard<'_, Journal> {
        // Names and numbers: a panic while holding it leaves nothing half-done.
        self.journal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn view(&self) -> &ViewReader {
        &self.view
    }

    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    pub fn work(&self, sent: Option<u64>) -> Work {
        self.journal().work(sent)
    }

    /// Where a subscriber may resume, see [`Journal::resume_at`]: numbers from another
    /// process (another epoch) mean nothing here.
    pub fn resume_at(&self, since: &protocol::Since) -> Option<u64> {
        if since.epoch != self.epoch {
            return None;
        }
        self.journal().resume_at(since.seq)
    }

    /// The last batch's number, and the subscribers now with their lag behind it.
    pub fn subscribers(&self) -> (u64, Vec<Listed>) {
        let last = self.journal().last();
        (last, self.stats.list(last))
    }

    /// Wakes on every numbered batch.
    pub fn batches(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// A subscriber, counted until the handle is dropped.
    pub fn attach(self: &Arc<Hub>, who: String) -> Attached {
        self.journal().attach();
        let entry = Arc::new(Entry {
            who,
            connected: SystemTime::now(),
            sent: AtomicU64::new(0),
            lines: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        });
        let id = self.stats.next_id.fetch_add(1, Relaxed);
        self.stats.lock().insert(id, entry.clone());
        Attached {
            hub: self.clone(),
            id,
            entry,
        }
    }
}

/// One attached subscriber; detached when dropped.
pub struct Attached {
    hub: Arc<Hub>,
    id: u64,
    pub entry: Arc<Entry>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.hub.stats.lock().remove(&self.id);
        self.hub.journal().detach(Instant::now());
    }
}

/// One subscriber, for `/status` and the metrics.
pub struct Entry {
    /// Who it is: `uid 0 pid 1234`, or `--on-change`.
    pub who: String,
    pub connected: SystemTime,
    /// The last batch it was sent whole.
    pub sent: AtomicU64,
    pub lines: AtomicU64,
    pub bytes: AtomicU64,
}

/// The subscribers now, and what happened to those before.
#[derive(Default)]
pub struct Stats {
    subscribers: Mutex<BTreeMap<u64, Arc<Entry>>>,
    next_id: AtomicU64,
    /// Connections taken, refused (over the cap, a bad hello, not allowed) and cut off
    /// (behind the journal, or not reading).
    pub connected: AtomicU64,
    pub refused: AtomicU64,
    pub cut_off: AtomicU64,
}

/// One subscriber as `/status` lists it.
pub struct Listed {
    pub who: String,
    pub connected: SystemTime,
    pub lag: u64,
    pub lines: u64,
    pub bytes: u64,
}

impl Stats {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Entry>>> {
        self.subscribers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The subscribers, each with its lag in batches behind `last`.
    pub fn list(&self, last: u64) -> Vec<Listed> {
        self.lock()
            .values()
            .map(|entry| Listed {
                who: entry.who.clone(),
                connected: entry.connected,
                lag: last.saturating_sub(entry.sent.load(Relaxed)),
                lines: entry.lines.load(Relaxed),
                bytes: entry.bytes.load(Relaxed),
            })
            .collect()
    }
}

impl Exported for Hub {
    fn export(&self, families: &mut Families<'_>) -> std::fmt::Result {
        let (last, listed) = self.subscribers();
        families.one(
            "nodus_subscription_batch",
            "The number of the last batch of changes given to subscribers.",
            &ConstGauge::new(last as i64),
        )?;
        families.one(
            "nodus_subscribers",
            "Subscribers of the node view now (the socket's and --on-change).",
            &ConstGauge::new(listed.len() as i64),
        )?;
        families.one(
            "nodus_subscribers_max_lag_batches",
            "Batches the furthest-behind subscriber has not been sent whole yet.",
            &ConstGauge::new(listed.iter().map(|l| l.lag).max().unwrap_or(0) as i64),
        )?;
        for (name, help, counter) in [
            (
                "nodus_subscribers_connected",
                "Subscriptions taken at the socket.",
                &self.stats.connected,
            ),
            (
                "nodus_subscribers_refused",
                "Subscriptions refused: over the cap, not allowed, or a bad hello.",
                &self.stats.refused,
            ),
            (
                "nodus_subscribers_cut_off",
                "Subscribers cut off: behind what the journal keeps, or not reading.",
                &self.stats.cut_off,
            ),
        ] {
            families.one(name, help, &ConstCounter::new(counter.load(Relaxed)))?;
        }
        Ok(())
    }
}

/// The subsystem that numbers every batch for the subscribers; it stops serving the
/// socket when dropped.
pub struct Publisher {
    hub: Arc<Hub>,
    server: Option<tokio::task::JoinHandle<()>>,
    /// This node's zone as the lines were last resolved with: the one fact of this node
    /// that every service's line depends on (its topology hints). A change of anything
    /// else of this node (the mesh's own key annotation, say) is its own line's alone.
    zone: Option<String>,
}

impl Publisher {
    /// Numbers batches in `hub`, and serves them at `socket` when there is one. A socket
    /// that cannot be made is reported and leaves `--on-change` served.
    pub fn start(
        config: &Config,
        socket: Option<&Path>,
        hub: Arc<Hub>,
    ) -> (Publisher, Option<anyhow::Error>) {
        let (server, error) = match socket.map(|socket| server::serve(config, socket, hub.clone()))
        {
            Some(Ok(server)) => (Some(server), None),
            Some(Err(error)) => (None, Some(error)),
            None => (None, None),
        };
        let zone = None;
        (Publisher { hub, server, zone }, error)
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(server) = &self.server {
            server.abort();
        }
    }
}

impl Subsystem for Publisher {
    fn name(&self) -> &'static str {
        "subscribe"
    }

    /// Numbers the batch. A view restored from disk is not served: subscribers wait for
    /// the lists, as `--on-change` always did.
    fn after_batch(&mut self, view: &View, applied: &Applied) {
        if applied.stale {
            return;
        }
        let mut everything = applied.initial_sync;
        if applied.initial_sync || applied.changes.this_node {
            let zone = view.strings().resolve(view.node_context().zone);
            everything |= self.zone.as_deref() != Some(zone);
            self.zone = Some(zone.to_string());
        }
        let seq = self
            .hub
            .journal()
            .record(&applied.changes, everything, Instant::now());
        self.hub.latest.send_if_modified(|latest| {
            let changed = *latest != seq;
            *latest = seq;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_testbed::fixtures;
    use nodus_view::{Update, ViewWriter};
    use serde_json::json;

    /// This node, with its zone and one annotation.
    fn this_node(zone: &str, annotation: &str) -> Update {
        let mut node = fixtures::node("node-1", json!([]), json!(["10.244.1.0/24"]));
        node["metadata"]["labels"] = json!({"topology.kubernetes.io/zone": zone});
        node["metadata"]["annotations"] = json!({"nodus.dev/wireguard-public-key": annotation});
        Update::Node(serde_json::from_value(node).expect("a Node"))
    }

    #[test]
    fn only_a_zone_change_of_this_node_resends_everything() {
        let writer = ViewWriter::new(View::new("node-1"));
        let hub = Hub::new(writer.reader());
        let _reader = hub.attach("test".into());
        let (mut publisher, _) = Publisher::start(&Config::default(), None, hub.clone());
        let mut batch = |update: Update, initial_sync: bool| {
            let changes = writer.write().apply(vec![update]).changes;
            let applied = Applied {
                changes,
                initial_sync,
                ..Applied::default()
            };
            publisher.after_batch(&writer.read(), &applied);
        };
        batch(this_node("zone-a", "1"), true);
        assert_eq!(hub.work(None), Work::Snapshot { seq: 1 });
        let since = |epoch: &str| protocol::Since {
            epoch: epoch.into(),
            seq: 1,
        };
        assert_eq!(hub.resume_at(&since(hub.epoch())), Some(1));
        assert_eq!(hub.resume_at(&since("another process")), None);
        // The mesh annotating its own Node: that Node's line alone.
        batch(this_node("zone-a", "2"), false);
        assert_eq!(
            hub.work(Some(1)),
            Work::Changes {
                seq: 2,
                services: vec![],
                nodes: vec!["node-1".into()]
            }
        );
        // Its zone: every service's topology may differ.
        batch(this_node("zone-b", "2"), false);
        assert_eq!(hub.work(Some(2)), Work::Snapshot { seq: 3 });
    }
}
