//! Subsystems fail alone. One that cannot start is retried with backoff while the others
//! run: a DNS port that systemd-resolved holds, a key directory that is full or a WireGuard
//! device that cannot be made must not take the proxy down with them. One that panics (in
//! the run loop, or its own task ending) is dropped and started again the same way: a bug
//! that one hostile input reaches costs that subsystem a restart, not the node its proxy,
//! DNS and mesh. Until it runs it is not ready, and `/status`,
//! `nodus_subsystem_start_failures_total` and `nodus_subsystem_panics_total` say why.

use crate::agent::board::Starts;
use nodus_view::{Applied, ChangeSet, Subsystem, View};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// The first wait after a failed start; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A subsystem under supervision, with the means to start it again.
pub struct Supervised<S, F> {
    name: &'static str,
    starts: Arc<Starts>,
    state: State<S, F>,
}

enum State<S, F> {
    Running(S, F),
    /// Being started in the background; the starter comes back with it.
    Starting(oneshot::Receiver<(S, F)>),
}

/// What a panic said, for the log and `/status`.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Starts `start` again after each failure, with backoff, recording failures in `starts`
/// under `name`; `first` is why it is not running now. The subsystem comes back with its
/// starter.
fn restart<S, F, Fut>(
    name: &'static str,
    first: anyhow::Error,
    starts: Arc<Starts>,
    mut start: F,
) -> oneshot::Receiver<(S, F)>
where
    S: Subsystem + Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<S>> + Send,
{
    let (sender, arriving) = oneshot::channel();
    tokio::spawn(async move {
        let mut error = first;
        let mut backoff = FIRST_BACKOFF;
        loop {
            starts.failed(name, format!("{error:#}"));
            tracing::error!(subsystem = name, error = %format!("{error:#}"), retry_in = ?backoff, "not running; the others run meanwhile");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            match start().await {
                Ok(subsystem) => {
                    starts.started(name);
                    tracing::info!(subsystem = name, "started after all");
                    let _ = sender.send((subsystem, start));
                    return;
                }
                Err(next) => error = next,
            }
        }
    });
    arriving
}

/// Starts a subsystem with `start` and supervises it: a failed start is retried in the
/// background, and so is a panic later.
pub async fn start_supervised<S, F, Fut>(
    name: &'static str,
    starts: Arc<Starts>,
    mut start: F,
) -> Box<dyn Subsystem>
where
    S: Subsystem + Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<S>> + Send,
{
    let state = match start().await {
        Ok(subsystem) => State::Running(subsystem, start),
        Err(error) => State::Starting(restart(name, error, starts.clone(), start)),
    };
    Box::new(Supervised {
        name,
        starts,
        state,
    })
}

impl<S, F, Fut> Supervised<S, F>
where
    S: Subsystem + Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<S>> + Send,
{
    /// Hands `applied` to the running subsystem; whether it panicked, and why.
    fn hand(subsystem: &mut S, view: &View, applied: &Applied) -> Option<String> {
        catch_unwind(AssertUnwindSafe(|| subsystem.after_batch(view, applied)))
            .err()
            .map(|payload| format!("panicked: {}", panic_message(&*payload)))
            .or_else(|| (!subsystem.is_alive()).then(|| "its task ended".to_string()))
    }
}

impl<S, F, Fut> Subsystem for Supervised<S, F>
where
    S: Subsystem + Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<S>> + Send,
{
    fn name(&self) -> &'static str {
        self.name
    }

    fn after_batch(&mut self, view: &View, applied: &Applied) {
        let failed = match &mut self.state {
            State::Running(subsystem, _) => Self::hand(subsystem, view, applied),
            State::Starting(arriving) => {
                let Ok((mut started, start)) = arriving.try_recv() else {
                    return;
                };
                // It missed the batches since the view completed (or was restored): to
                // it, this one does.
                let caught_up = Applied {
                    changes: ChangeSet::default(),
                    initial_sync: true,
                    stale: applied.stale,
                    took: applied.took,
                };
                let failed = Self::hand(&mut started, view, &caught_up);
                self.state = State::Running(started, start);
                failed
            }
        };
        let Some(why) = failed else {
            return;
        };
        self.starts.panicked(self.name);
        // A closed channel stands in until the restart's own replaces it.
        let placeholder = oneshot::channel().1;
        if let State::Running(subsystem, start) =
            std::mem::replace(&mut self.state, State::Starting(placeholder))
        {
            // Whatever it held goes now, before a new one is made; a panic in its drop
            // changes nothing.
            let _ = catch_unwind(AssertUnwindSafe(|| drop(subsystem)));
            let error = anyhow::anyhow!("{why}; starting it again");
            self.state = State::Starting(restart(self.name, error, self.starts.clone(), start));
        }
    }

    fn is_ready(&self) -> bool {
        match &self.state {
            State::Running(subsystem, _) => subsystem.is_ready(),
            State::Starting(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records what it is given in `seen`; panics on its batch numbered `panic_at`.
    struct Probe {
        seen: Arc<Mutex<Vec<bool>>>,
        batches: usize,
        panic_at: Option<usize>,
    }

    impl Subsystem for Probe {
        fn name(&self) -> &'static str {
            "probe"
        }
        fn after_batch(&mut self, _view: &View, applied: &Applied) {
            self.seen
                .lock()
                .expect("not poisoned")
                .push(applied.initial_sync);
            self.batches += 1;
            if Some(self.batches) == self.panic_at {
                panic!("a bug in the probe");
            }
        }
    }

    fn probe(seen: &Arc<Mutex<Vec<bool>>>, panic_at: Option<usize>) -> Probe {
        Probe {
            seen: seen.clone(),
            batches: 0,
            panic_at,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_start_is_retried_and_then_sees_the_whole_view() {
        let starts = Arc::new(Starts::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let mut attempts = 0;
        let mut supervised = start_supervised("probe", starts.clone(), move || {
            attempts += 1;
            let attempt = attempts;
            let probe = probe(&record, None);
            async move {
                match attempt {
                    1 => anyhow::bail!("port 53 is taken"),
                    2 => anyhow::bail!("still taken"),
                    _ => Ok(probe),
                }
            }
        })
        .await;
        let view = View::new("node-a");
        let batch = Applied::default();
        supervised.after_batch(&view, &batch);
        assert!(!supervised.is_ready());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(starts.pending("probe").as_deref(), Some("port 53 is taken"));
        tokio::time::sleep(FIRST_BACKOFF).await;
        assert_eq!(starts.pending("probe").as_deref(), Some("still taken"));
        tokio::time::sleep(FIRST_BACKOFF * 2).await;
        assert_eq!(starts.pending("probe"), None);
        supervised.after_batch(&view, &batch);
        supervised.after_batch(&view, &batch);
        assert!(supervised.is_ready());
        assert_eq!(
            *seen.lock().expect("not poisoned"),
            [true, false],
            "caught up, then batch by batch"
        );
        let text = nodus_prom::render(starts.clone());
        assert!(
            text.contains("nodus_subsystem_start_failures_total{subsystem=\"probe\"} 2"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_restarts_the_subsystem_which_catches_up() {
        let starts = Arc::new(Starts::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let mut made = 0;
        let mut supervised = start_supervised("probe", starts.clone(), move || {
            made += 1;
            // The first one panics on its second batch; the next one does not.
            let probe = probe(&record, (made == 1).then_some(2));
            async move { Ok(probe) }
        })
        .await;
        let view = View::new("node-a");
        let batch = Applied::default();
        supervised.after_batch(&view, &batch);
        assert!(supervised.is_ready());
        supervised.after_batch(&view, &batch);
        assert!(!supervised.is_ready(), "the panicked one is gone");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let pending = starts.pending("probe").unwrap_or_default();
        assert!(
            pending.contains("panicked: a bug in the probe"),
            "{pending}"
        );
        tokio::time::sleep(FIRST_BACKOFF + Duration::from_millis(10)).await;
        supervised.after_batch(&view, &batch);
        assert!(supervised.is_ready(), "started again");
        assert_eq!(
            *seen.lock().expect("not poisoned"),
            [false, false, true],
            "two batches, the panic, then the new one caught up"
        );
        let text = nodus_prom::render(starts.clone());
        assert!(
            text.contains("nodus_subsystem_panics_total{subsystem=\"probe\"} 1"),
            "{text}"
        );
    }
}
