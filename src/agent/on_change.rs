//! `nodus run --on-change PROGRAM`: an external backend, as KPNG allowed, without gRPC.
//!
//! After every batch that changes something, PROGRAM runs with the changed services and
//! nodes on stdin, one JSON line each in `nodus view --watch`'s format (everything after the
//! initial sync, or after this node's own labels change). It is one subscriber of the view
//! ([`crate::agent::subscribe`]): batches that arrive while the program runs are caught up
//! with its next run, each name once. A run that fails or overruns its timeout is logged
//! and its changes go with the next run, after a backoff; one that falls behind what the
//! journal keeps is handed everything.

use crate::agent::metrics::Metrics;
use crate::agent::subscribe::journal::Work;
use crate::agent::subscribe::walk::Walk;
use crate::agent::subscribe::{Attached, Hub};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// The longest wait before a failed run is retried.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Starts the task that runs `program` after every batch `hub` numbers; it ends when the
/// returned handle is dropped.
pub fn start(
    program: PathBuf,
    timeout: Duration,
    hub: &Arc<Hub>,
    metrics: Arc<Metrics>,
) -> OnChange {
    let runner = Runner {
        attached: hub.attach("--on-change".into()),
        hub: hub.clone(),
        program,
        timeout,
        metrics,
    };
    OnChange(tokio::spawn(runner.run()))
}

/// The running `--on-change` task.
pub struct OnChange(tokio::task::JoinHandle<()>);

impl Drop for OnChange {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Runner {
    hub: Arc<Hub>,
    attached: Attached,
    program: PathBuf,
    timeout: Duration,
    metrics: Arc<Metrics>,
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
        let mut batches = self.hub.batches();
        let mut sent = None;
        loop {
            let Some((input, seq)) = self.input(sent) else {
                if batches.changed().await.is_err() {
                    return;
                }
                continue;
            };
            let start = Instant::now();
            match self.run_once(&input).await {
                Ok(status) => {
                    backoff = Duration::ZERO;
                    sent = Some(seq);
                    self.attached.entry.sent.store(seq, Relaxed);
                    self.metrics.status.on_change.synced(start.elapsed());
                    tracing::info!(program = %self.program.display(), %status, took = ?start.elapsed(), bytes = input.len(), "--on-change program ran");
                }
                Err(error) => {
                    self.metrics.status.on_change.failed(&error);
                    backoff = (backoff * 2).clamp(Duration::from_secs(1), MAX_BACKOFF);
                    tracing::warn!(program = %self.program.display(), %error, retry_in = ?backoff, "--on-change program failed; its changes go with the next run");
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// The JSON lines of what changed after batch `sent`, read from the view as it is now,
    /// and the batch they bring the program up to; `None` when nothing did.
    fn input(&self, sent: Option<u64>) -> Option<(Vec<u8>, u64)> {
        let work = match self.hub.work(sent) {
            // Behind what the journal keeps: everything, as after the initial sync.
            Work::Behind => self.hub.work(None),
            work => work,
        };
        let view = self.hub.view().read();
        let mut walk = Walk::start(work, &view)?;
        // Its stdin is the object lines alone: `nodus view --watch`'s format.
        let mut out = Vec::new();
        let (lines, _) = walk.render(&view, &mut out, usize::MAX);
        self.attached.entry.lines.fetch_add(lines, Relaxed);
        self.attached
            .entry
            .bytes
            .fetch_add(out.len() as u64, Relaxed);
        Some((out, walk.seq()))
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
