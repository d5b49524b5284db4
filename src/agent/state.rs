//! What nodus keeps across restarts in `state_dir`: the last whole view, so that a restart
//! that cannot reach the API server still answers DNS and keeps the mesh's peers (warm
//! start). The view is saved after the initial lists, then at most every
//! [`SAVE_PERIOD`] while it changes, and once more on the way out; each save replaces the
//! file whole ([`nodus_durable::replace`]).
//!
//! Files carry the node's name: two agents for different nodes (a test bed) may share
//! a directory, and an agent never reads another node's view.

use crate::agent::board::Restored;
use crate::agent::metrics::Metrics;
use nodus_view::{Applied, View, ViewReader};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How often the view is saved at most while it changes: at 10,000 services a save
/// writes about 1 MiB, which an SD card should not take every few seconds.
pub const SAVE_PERIOD: Duration = Duration::from_secs(30);

/// The buffer a save streams through.
const SAVE_BUFFER: usize = 64 << 10;

/// The oldest saved view a start uses. Its answers are served as the cluster's until the
/// lists replace them, so a week-old file would hand out reassigned addresses; RFC 8767
/// caps stale DNS data at one to three days.
pub const SAVED_VIEW_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The state directory of one node's agent.
#[derive(Clone, Debug)]
pub struct StateDir {
    dir: PathBuf,
    node: String,
}

impl StateDir {
    /// `None` when the node's name cannot name a file (a Node name never has a `/`).
    pub fn new(dir: &Path, node: &str) -> Option<StateDir> {
        let usable = !node.is_empty() && !node.contains('/') && !node.starts_with('.');
        usable.then(|| StateDir {
            dir: dir.to_path_buf(),
            node: node.to_string(),
        })
    }

    pub fn view_path(&self) -> PathBuf {
        self.dir.join(format!("view-{}", self.node))
    }

    /// While a start restores the saved view it is under this name: a view that kills
    /// the process as it is read (out of memory, say) is not read again by the next start.
    fn restoring_path(&self) -> PathBuf {
        self.dir.join(format!("view-{}.restoring", self.node))
    }

    /// The view saved for this node, if there is one that can be used (not older than
    /// [`SAVED_VIEW_MAX_AGE`], not one a start died reading); why not is logged.
    pub fn restore(&self) -> Option<(View, Restored)> {
        let (saved, restoring) = (self.view_path(), self.restoring_path());
        if std::fs::remove_file(&restoring).is_ok() {
            tracing::warn!(path = %restoring.display(), "the last start ended while restoring this saved view; not using it");
        }
        match std::fs::rename(&saved, &restoring) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                tracing::warn!(path = %saved.display(), %error, "cannot take the saved view; starting without it");
                return None;
            }
        }
        let restored = self.read(&restoring);
        // Restored (or refused) whole: the file goes back for the next start.
        if let Err(error) = std::fs::rename(&restoring, &saved) {
            tracing::warn!(path = %saved.display(), %error, "cannot put the saved view back");
        }
        restored
    }

    /// The saved view as it is, for a command that inspects it beside a running agent
    /// (which may be restoring or saving it): read in place, never moved.
    pub fn peek(&self) -> Option<(View, Restored)> {
        self.read(&self.view_path())
    }

    fn read(&self, path: &Path) -> Option<(View, Restored)> {
        let started = Instant::now();
        let read = std::fs::metadata(path).and_then(|meta| {
            if meta.len() > nodus_view::view::SNAPSHOT_MAX_BYTES as u64 {
                Err(std::io::Error::other(format!(
                    "{} bytes, more than a saved view may take",
                    meta.len()
                )))
            } else {
                Ok((std::fs::read(path)?, meta.modified()?))
            }
        });
        let (bytes, saved) = match read {
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot read the saved view; starting without it");
                return None;
            }
        };
        // A time in the future (a clock set back) counts as now.
        let age = saved.elapsed().unwrap_or_default();
        if age > SAVED_VIEW_MAX_AGE {
            tracing::warn!(path = %path.display(), age_hours = age.as_secs() / 3600, "the saved view is older than a day; starting without it");
            return None;
        }
        match View::restore(&self.node, &bytes) {
            Ok(view) => Some((
                view,
                Restored {
                    saved,
                    bytes: bytes.len() as u64,
                    took: started.elapsed(),
                },
            )),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "not using the saved view; starting without it");
                None
            }
        }
    }

    /// Where a successor asks this process for its sockets ([`crate::agent::handover`]).
    pub fn handover_path(&self) -> PathBuf {
        self.dir.join(format!("handover-{}.sock", self.node))
    }

    /// Makes the directory (0700: the view names every service and node) if needed.
    pub fn create(&self) -> std::io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
    }

    /// Saves the view now, whatever [`Saver`] last did. The encoding streams into the
    /// file through a small buffer, holding the view's read lock, but never a copy of the
    /// whole: at 10,000 services a copy would be 1.2 MiB the allocator keeps afterwards.
    pub fn save(&self, reader: &ViewReader, metrics: &Metrics) {
        let started = Instant::now();
        let path = self.view_path();
        let mut bytes = 0;
        let saved = self
            .create()
            .map_err(|error| format!("creating {}: {error}", self.dir.display()))
            .and_then(|()| {
                nodus_durable::replace_with(&path, &path.with_extension("tmp"), 0o600, |file| {
                    let mut out = std::io::BufWriter::with_capacity(SAVE_BUFFER, file);
                    bytes = reader
                        .read()
                        .save_to(&mut out)
                        .map_err(std::io::Error::other)?;
                    out.flush()
                })
                .map_err(|error| error.to_string())
            });
        match saved {
            Ok(()) => {
                metrics.view_saved(bytes as u64);
                tracing::debug!(path = %path.display(), bytes, took = ?started.elapsed(), "view saved");
            }
            Err(error) => {
                metrics.view_save_failed();
                tracing::warn!(%error, "the view could not be saved; a restart without the API would start empty");
                metrics.status.view.error(error);
            }
        }
    }
}

/// Saves the view after the batches that change it, at most every [`SAVE_PERIOD`], on
/// a blocking thread (the encoding holds the view's read lock for some milliseconds).
pub struct Saver {
    state: Arc<StateDir>,
    reader: ViewReader,
    metrics: Arc<Metrics>,
    /// The view changed since the last save.
    dirty: bool,
    last: Option<Instant>,
    running: Option<JoinHandle<()>>,
}

impl Saver {
    pub fn new(state: StateDir, reader: ViewReader, metrics: Arc<Metrics>) -> Saver {
        Saver {
            state: Arc::new(state),
            reader,
            metrics,
            dirty: false,
            last: None,
            running: None,
        }
    }

    /// After every batch (and tick): saves when the complete view changed and the last
    /// save is old enough. A restored view is not saved again: it is what the file holds.
    pub fn after_batch(&mut self, applied: &Applied) {
        self.dirty |= applied.initial_sync || !applied.changes.is_empty();
        if !self.dirty || applied.stale || !self.reader.is_complete() {
            return;
        }
        if self
            .running
            .as_ref()
            .is_some_and(|task| !task.is_finished())
            || self.last.is_some_and(|at| at.elapsed() < SAVE_PERIOD)
        {
            return;
        }
        self.dirty = false;
        self.last = Some(Instant::now());
        let (state, reader, metrics) = (
            self.state.clone(),
            self.reader.clone(),
            self.metrics.clone(),
        );
        self.running = Some(tokio::task::spawn_blocking(move || {
            state.save(&reader, &metrics)
        }));
    }

    /// Saves what changed since the last save, now: on the way out.
    pub async fn flush(&mut self) {
        if let Some(task) = self.running.take() {
            let _ = task.await;
        }
        if !self.dirty || !self.reader.is_complete() {
            return;
        }
        self.dirty = false;
        let (state, reader, metrics) = (
            self.state.clone(),
            self.reader.clone(),
            self.metrics.clone(),
        );
        let _ = tokio::task::spawn_blocking(move || state.save(&reader, &metrics)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_view::ViewWriter;

    #[test]
    fn a_saved_view_is_restored_for_its_node_only() {
        let dir = std::env::temp_dir().join(format!("nodus-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = StateDir::new(&dir, "node-a").expect("a usable name");
        assert!(state.restore().is_none(), "nothing saved yet");
        let writer = ViewWriter::new(View::new("node-a"));
        writer.mark_complete();
        let metrics = Arc::new(Metrics::default());
        state.save(&writer.reader(), &metrics);
        let (view, restored) = state.restore().expect("restored");
        assert_eq!(view.node_name(), "node-a");
        assert_eq!(
            restored.bytes,
            std::fs::metadata(state.view_path()).expect("file").len()
        );
        assert!(
            crate::agent::metrics::render(&metrics, &Arc::default())
                .contains("nodus_view_saves_total 1")
        );
        let other = StateDir::new(&dir, "node-b").expect("a usable name");
        assert!(other.restore().is_none(), "another node's file is not read");
        // A view older than a day is not used; nor is one a start died reading.
        let file = std::fs::File::options()
            .write(true)
            .open(state.view_path())
            .expect("the saved view");
        let two_days_ago = std::time::SystemTime::now() - 2 * SAVED_VIEW_MAX_AGE;
        file.set_modified(two_days_ago).expect("an old time");
        assert!(state.restore().is_none(), "too old");
        file.set_modified(std::time::SystemTime::now())
            .expect("now");
        assert!(state.restore().is_some(), "and put back for the next start");
        std::fs::rename(state.view_path(), state.restoring_path()).expect("as a crash leaves it");
        assert!(state.restore().is_none(), "a start died reading it");
        assert!(!state.restoring_path().exists());
        // A damaged file is refused, and the agent starts without it.
        std::fs::write(state.view_path(), b"nodusvw\x01 and then garbage").expect("damage");
        assert!(state.restore().is_none());
        assert!(StateDir::new(&dir, "../escape").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
