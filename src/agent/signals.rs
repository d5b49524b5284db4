//! SIGTERM and SIGINT: how `nodus run` (and the sandbox) learn that they should stop.

use anyhow::Context;

/// SIGTERM and SIGINT, caught from the moment this is made (inside a tokio runtime) instead
/// of ending the process. nodus never tears its dataplane down on exit: a restart must not
/// drop traffic.
pub struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    pub fn install() -> anyhow::Result<ShutdownSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(ShutdownSignals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// The name of the next signal caught.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
