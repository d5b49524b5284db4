//! `nodus run --on-change PROGRAM`: an external backend, as KPNG allowed, without gRPC.
//!
//! After every batch that changes something, PROGRAM runs with the changed services and
//! nodes on stdin, one JSON line each in `nodus view --watch`'s format (everything after the
//! initial sync, or after this node's own labels change). The feed only merges names into a
//! pending set and never waits: one task runs the program, and batches that arrive while
//! it runs are coalesced into its next run. A run that fails or overruns its timeout is
//! logged and its changes go with the next run, after a backoff.

use crate::agent::metrics::Metrics;
use nodus_view::output::{everything, write_change_lines};
use nodus_view::{Applied, ChangeSet, Subsystem, View, ViewReader};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

/// The longest wait before a failed run is retried.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Pending {
    /// Everything, rather than `changes`.
    all: bool,
    changes: ChangeSet,
}

impl Pending {
    fn merge(&mut self, all: bool, changes: &ChangeSet) {
        self.all |= all || changes.this_node;
        self.changes
            .services
            .extend(changes.services.iter().cloned());
        self.changes.nodes.extend(changes.nodes.iter().cloned());
    }

    fn is_empty(&self) -> bool {
        !self.all && self.changes.is_empty()
    }
}

/// The feed's side: queue what a batch changed.
pub struct OnChange {
    pending: Arc<Mutex<Pending>>,
    wake: Arc<Notify>,
}

impl OnChange {
    /// Starts the task that runs `program`, reading changed objects from `view`.
    pub fn start(
        program: PathBuf,
        timeout: Duration,
        view: ViewReader,
        metrics: Arc<Metrics>,
    ) -> OnChange {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let wake = Arc::new(Notify::new());
        let runner = Runner {
            program,
            timeout,
            view,
            metrics,
            pending: pending.clone(),
            wake: wake.clone(),
        };
        tokio::spawn(runner.run());
        OnChange { pending, wake }
    }
}

impl Subsystem for OnChange {
    fn name(&self) -> &'static str {
        "on-change"
    }

    /// Queues the batch's changes (everything after the initial sync). Never waits for a
    /// run. A view restored from disk is not handed to the program: it waits for the lists.
    fn after_batch(&mut self, _view: &View, applied: &Applied) {
        if applied.stale || (!applied.initial_sync && applied.changes.is_empty()) {
            return;
        }
        lock(&self.pending).merge(applied.initial_sync, &applied.changes);
        self.wake.notify_one();
    }
}

fn lock(pending: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    // Only names: a panic while holding it cannot leave them inconsistent.
    pending
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Runner {
    program: PathBuf,
    timeout: Duration,
    view: ViewReader,
    metrics: Arc<Metrics>,
    pending: Arc<Mutex<Pending>>,
    wake: Arc<Notify>,
}

#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("cannot start: {0}")]
    Spawn(std::io::Error),
    #[error("writing its input: {0}")]
    Input(std::io::Error),
    #[error("still running after {0:?}; killed")]
    Timeout(Duration),
    #[error("waiting for it: {0}")]
    Wait(std::io::Error),
    #[error("exited with {0}")]
    Failed(ExitStatus),
}

impl Runner {
    async fn run(self) {
        let mut backoff = Duration::ZERO;
        loop {
            self.wake.notified().await;
            loop {
                let batch = std::mem::take(&mut *lock(&self.pending));
                if batch.is_empty() {
                    break;
                }
                let input = match self.input(&batch) {
                    Ok(input) => input,
                    Err(error) => {
                        tracing::error!(%error, "rendering the changes for --on-change");
                        break;
                    }
                };
                let start = Instant::now();
                match self.run_once(&input).await {
                    Ok(status) => {
                        backoff = Duration::ZERO;
                        self.metrics.status.on_change.synced(start.elapsed());
                        tracing::info!(program = %self.program.display(), %status, took = ?start.elapsed(), bytes = input.len(), "--on-change program ran");
                    }
                    Err(error) => {
                        self.metrics.status.on_change.failed(&error);
                        backoff = (backoff * 2).clamp(Duration::from_secs(1), MAX_BACKOFF);
                        tracing::warn!(program = %self.program.display(), %error, retry_in = ?backoff, "--on-change program failed; its changes go with the next run");
                        lock(&self.pending).merge(batch.all, &batch.changes);
                        tokio::time::sleep(backoff).await;
                    }
                }
            }
        }
    }

    /// The JSON lines for `batch`, read from the view as it is now.
    fn input(&self, batch: &Pending) -> std::io::Result<Vec<u8>> {
        let view = self.view.read();
        let mut out = Vec::new();
        if batch.all {
            write_change_lines(&view, &everything(&view), &mut out)?
        } else {
            write_change_lines(&view, &batch.changes, &mut out)?
        }
        Ok(out)
    }

    async fn run_once(&self, input: &[u8]) -> Result<ExitStatus, RunError> {
        let mut child = tokio::process::Command::new(&self.program)
            .stdin(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(RunError::Spawn)?;
        let mut stdin = child.stdin.take();
        let finished = tokio::time::timeout(self.timeout, async {
            if let Some(mut pipe) = stdin.take() {
                match pipe.write_all(input).await {
                    // A program may stop reading once it has what it wants.
                    Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
                        return Err(RunError::Input(error));
                    }
                    _ => drop(pipe),
                }
            }
            child.wait().await.map_err(RunError::Wait)
        })
        .await;
        match finished {
            Ok(Ok(status)) if status.success() => Ok(status),
            Ok(Ok(status)) => Err(RunError::Failed(status)),
            Ok(Err(error)) => Err(error),
            Err(_) => {
                let _ = child.kill().await;
                Err(RunError::Timeout(self.timeout))
            }
        }
    }
}
