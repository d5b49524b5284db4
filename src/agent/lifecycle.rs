//! The process's life, in one place: what it is now (ready, serving a restored view,
//! draining its node, in lameduck), and how it ends.
//!
//! ```text
//! start ─▶ restored view (stale) ─▶ lists complete ─▶ ready ⇄ not ready
//!                                                          │
//!          SIGTERM ─▶ lameduck (serving, not ready) ───────┤
//!          a successor asks ─▶ sockets handed over ────────┼─▶ ended
//!          SIGINT, or SIGTERM without lameduck ────────────┘
//! ```
//!
//! The view is saved after batches ([`Saver`]) and once more on the way out, so that the
//! next process (a restart, or the successor that takes the sockets) serves from it.

use crate::agent::handover::{self, Sockets, Successor};
use crate::agent::http::HttpServer;
use crate::agent::metrics::{Latest, Metrics};
use crate::agent::process::ProcessState;
use crate::agent::signals::ShutdownSignals;
use crate::agent::state::{Saver, StateDir};
use nodus_view::ViewReader;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// How the serving loop ended.
pub enum Ending {
    Signal(&'static str),
    /// The next process took the sockets; `draining`: SIGTERM came already.
    HandedOver {
        draining: bool,
    },
}

/// What a successor is given: the listening sockets, and the view saved just before.
pub struct Handing {
    pub state: Option<StateDir>,
    pub reader: ViewReader,
    pub metrics: Arc<Metrics>,
    pub dns: Arc<Latest<nodus_dns::server::Handover>>,
    /// Where successors ask; none without a state directory (or when it cannot be made).
    successors: Option<tokio::net::UnixListener>,
}

impl Handing {
    pub fn new(
        state: Option<StateDir>,
        reader: ViewReader,
        metrics: Arc<Metrics>,
        dns: Arc<Latest<nodus_dns::server::Handover>>,
    ) -> Handing {
        let successors = state.as_ref().and_then(|state| {
            let listening = state
                .create()
                .map_err(anyhow::Error::from)
                .and_then(|()| handover::listen(&state.handover_path()));
            match listening {
                Ok(listener) => Some(listener),
                Err(error) => {
                    let error = format!("{error:#}");
                    tracing::warn!(%error, "no handover: a restart will not take these sockets over");
                    None
                }
            }
        });
        Handing {
            state,
            reader,
            metrics,
            dns,
            successors,
        }
    }

    /// The next successor that asks for the sockets.
    async fn successor(&self) -> Successor {
        match &self.successors {
            Some(listener) => handover::next_successor(listener).await,
            None => std::future::pending().await,
        }
    }

    /// Hands the sockets and the view to `successor`; whether it took them.
    async fn hand_over(&self, successor: Successor, http: &HttpServer) -> bool {
        let sockets = Sockets {
            http: http.hand_over().unwrap_or_default(),
            dns: self
                .dns
                .get()
                .map(|dns| dns.sockets().unwrap_or_default())
                .unwrap_or_default(),
        };
        let (state, reader, metrics) = (
            self.state.clone(),
            self.reader.clone(),
            self.metrics.clone(),
        );
        let handed = tokio::task::spawn_blocking(move || {
            // The successor restores what this process knows now.
            if let Some(state) = state {
                state.save(&reader, &metrics);
            }
            successor.hand_over(&sockets)
        })
        .await
        .map_err(anyhow::Error::from)
        .and_then(|handed| handed);
        match handed {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(
                    error = %format!("{error:#}"),
                    "a successor asked for the sockets and did not take them; serving on"
                );
                false
            }
        }
    }
}

/// Serves while `drive` feeds the subsystems, until a signal or a successor ends it.
/// SIGTERM with a `lameduck` period first serves it out, not ready, so that a successor
/// can take the sockets over meanwhile.
pub async fn serve(
    drive: impl Future<Output = ()>,
    signals: &mut ShutdownSignals,
    lameduck: Duration,
    process: &ProcessState,
    handing: &Handing,
    http: &HttpServer,
) -> anyhow::Result<Ending> {
    tokio::pin!(drive);
    let mut draining: Option<Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            () = &mut drive => anyhow::bail!("the watch streams ended"),
            signal = signals.recv() => {
                if signal != "SIGTERM" || draining.is_some() || lameduck.is_zero() {
                    return Ok(Ending::Signal(signal));
                }
                process.enter_lameduck();
                tracing::info!(
                    ?lameduck,
                    "SIGTERM: lameduck; still serving but not ready, and a successor may take \
                     the sockets over"
                );
                draining = Some(Box::pin(tokio::time::sleep(lameduck)));
            }
            () = async {
                match draining.as_mut() {
                    Some(sleep) => sleep.await,
                    None => std::future::pending().await,
                }
            } => return Ok(Ending::Signal("SIGTERM")),
            successor = handing.successor() => {
                if handing.hand_over(successor, http).await {
                    return Ok(Ending::HandedOver { draining: draining.is_some() });
                }
            }
        }
    }
}

/// The way out: the view saved, or (handed over) everything left to the successor.
/// `subsystems` is dropped here, after which this process touches nothing.
pub async fn finish<T>(
    ending: Ending,
    saver: Option<&mut Saver>,
    http: &HttpServer,
    subsystems: T,
    signals: &mut ShutdownSignals,
    device_ends_with_process: bool,
) {
    match ending {
        Ending::Signal(signal) => {
            if let Some(saver) = saver {
                saver.flush().await;
            }
            if device_ends_with_process {
                tracing::info!(
                    signal,
                    "exiting; the dataplane stays in place but for the embedded WireGuard \
                     device, which ends with the process"
                );
            } else {
                tracing::info!(signal, "exiting; the dataplane stays in place");
            }
        }
        Ending::HandedOver { draining } => {
            // The successor serves the sockets and owns the dataplane and the saved view:
            // this process stops touching them (DNS's threads stop reading, the sockets
            // stay open there), and only waits to be told to go.
            http.stop();
            drop(subsystems);
            tracing::info!("handed the sockets and the dataplane over to the next process");
            if !draining {
                let signal = signals.recv().await;
                tracing::info!(signal, "exiting after the handover");
            }
        }
    }
}
