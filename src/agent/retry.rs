//! A subsystem that cannot start is retried with backoff while the others run: a DNS
//! port that systemd-resolved holds, a key directory that is full or a WireGuard device
//! that cannot be made must not take the proxy down with them. Until it starts it is not
//! ready, and `/status` and `nodus_subsystem_start_failures_total` say why.

use crate::agent::board::Starts;
use nodus_view::{Applied, ChangeSet, Subsystem, View};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// The first wait after a failed start; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A subsystem being started in the background, standing in for it until it runs.
pub struct Retried<S> {
    name: &'static str,
    running: Option<S>,
    arriving: oneshot::Receiver<S>,
}

impl<S: Subsystem + Send + 'static> Retried<S> {
    /// Starts `start` again after each failure, with backoff, recording failures in
    /// `starts` under `name`. `first` is the error of the attempt already made.
    pub fn spawn<F, Fut>(
        name: &'static str,
        first: anyhow::Error,
        starts: Arc<Starts>,
        mut start: F,
    ) -> Retried<S>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<S>> + Send,
    {
        let (sender, arriving) = oneshot::channel();
        tokio::spawn(async move {
            let mut error = first;
            let mut backoff = FIRST_BACKOFF;
            loop {
                starts.failed(name, format!("{error:#}"));
                tracing::error!(subsystem = name, error = %format!("{error:#}"), retry_in = ?backoff, "cannot start; the others run meanwhile");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                match start().await {
                    Ok(subsystem) => {
                        starts.started(name);
                        tracing::info!(subsystem = name, "started after all");
                        let _ = sender.send(subsystem);
                        return;
                    }
                    Err(next) => error = next,
                }
            }
        });
        Retried {
            name,
            running: None,
            arriving,
        }
    }
}

/// Starts a subsystem with `start`; if that fails, retries it in the background.
pub async fn start_or_retry<S, F, Fut>(
    name: &'static str,
    starts: Arc<Starts>,
    mut start: F,
) -> Box<dyn Subsystem>
where
    S: Subsystem + Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<S>> + Send,
{
    match start().await {
        Ok(subsystem) => Box::new(subsystem),
        Err(error) => Box::new(Retried::spawn(name, error, starts, start)),
    }
}

impl<S: Subsystem> Subsystem for Retried<S> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn after_batch(&mut self, view: &View, applied: &Applied) {
        if let Some(running) = &mut self.running {
            return running.after_batch(view, applied);
        }
        let Ok(mut started) = self.arriving.try_recv() else {
            return;
        };
        // It missed the batch that completed (or restored) the view: to it, this one does.
        started.after_batch(
            view,
            &Applied {
                changes: ChangeSet::default(),
                initial_sync: true,
                stale: applied.stale,
                took: applied.took,
            },
        );
        self.running = Some(started);
    }

    fn is_ready(&self) -> bool {
        self.running.as_ref().is_some_and(Subsystem::is_ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what it was given.
    struct Probe(Vec<bool>);

    impl Subsystem for Probe {
        fn name(&self) -> &'static str {
            "probe"
        }
        fn after_batch(&mut self, _view: &View, applied: &Applied) {
            self.0.push(applied.initial_sync);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_start_is_retried_and_then_sees_the_whole_view() {
        let starts = Arc::new(Starts::default());
        let mut attempts = 0;
        let mut retried = Retried::spawn(
            "probe",
            anyhow::anyhow!("port 53 is taken"),
            starts.clone(),
            move || {
                attempts += 1;
                let attempt = attempts;
                async move {
                    match attempt {
                        1 => anyhow::bail!("still taken"),
                        _ => Ok(Probe(Vec::new())),
                    }
                }
            },
        );
        let view = View::new("node-a");
        let batch = Applied::default();
        retried.after_batch(&view, &batch);
        assert!(!retried.is_ready());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(starts.pending("probe").as_deref(), Some("port 53 is taken"));
        tokio::time::sleep(FIRST_BACKOFF).await;
        assert_eq!(starts.pending("probe").as_deref(), Some("still taken"));
        tokio::time::sleep(FIRST_BACKOFF * 2).await;
        assert_eq!(starts.pending("probe"), None);
        retried.after_batch(&view, &batch);
        retried.after_batch(&view, &batch);
        assert!(retried.is_ready());
        let Some(Probe(seen)) = &retried.running else {
            panic!("started");
        };
        assert_eq!(seen, &[true, false], "caught up, then batch by batch");
        let mut text = String::new();
        starts.render(&mut text);
        assert!(
            text.contains("nodus_subsystem_start_failures_total{subsystem=\"probe\"} 2"),
            "{text}"
        );
    }
}
