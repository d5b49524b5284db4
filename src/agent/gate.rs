//! The isolation gate's listener (`policy.cni_socket`): nodus-cni's `ADD` of a pod asks
//! here, with the addresses the IPAM plugin gave it, and is answered once the pod's
//! NetworkPolicy isolation is in the kernel ([`nodus_cni::gate`] has the format and the
//! plugin's side). Each request joins the watch items as a [`Claim`]; the feed takes it
//! into the view with the next batch, and answers after the subsystems have synced it.
//!
//! The socket is root's alone (mode 0600); a connection sends one line of at most
//! [`nodus_cni::gate::LINE_MAX`] bytes within [`READ_TIMEOUT`], at most
//! [`CONNECTIONS_MAX`] wait at once, and one that waits longer than the plugin does is
//! answered and closed.

use anyhow::Context;
use futures::Stream;
use nodus_cni::gate::{GateReply, GateRequest, LINE_MAX, WAIT};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc, oneshot};

/// How long a client has to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests waiting at once; one pod start is one request, so this is far above what a
/// node starts concurrently.
const CONNECTIONS_MAX: usize = 64;

/// A pod's addresses from nodus-cni, and where its answer goes.
#[derive(Debug)]
pub struct Claim {
    pub request: GateRequest,
    reply: oneshot::Sender<GateReply>,
}

impl Claim {
    /// Answers the plugin: the pod is isolated (or no policy selects it), or why not.
    pub fn answer(self, outcome: Result<(), String>) {
        // The plugin may have given up; nothing waits for the answer then.
        let _ = self.reply.send(outcome.into());
    }

    /// The plugin stopped waiting.
    pub fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

/// The claims of every connection `listener` accepts.
pub fn claims(listener: UnixListener) -> impl Stream<Item = Claim> {
    let (sender, receiver) = mpsc::channel(CONNECTIONS_MAX);
    tokio::spawn(async move {
        let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "accepting a nodus-cni connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::warn!(
                    "more than {CONNECTIONS_MAX} pods waiting for isolation; one refused"
                );
                continue;
            };
            let sender = sender.clone();
            tokio::spawn(async move {
                if let Err(error) = serve(stream, sender).await {
                    tracing::warn!(%error, "a nodus-cni request failed");
                }
                drop(slot);
            });
        }
    });
    futures::stream::unfold(receiver, |mut receiver| async move {
        let claim = receiver.recv().await?;
        Some((claim, receiver))
    })
}

async fn serve(stream: UnixStream, claims: mpsc::Sender<Claim>) -> anyhow::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(LINE_MAX as u64));
    let read = tokio::time::timeout(READ_TIMEOUT, reader.read_line(&mut line))
        .await
        .context("no request in time")?
        .context("reading the request")?;
    // Closed without a word: nodus-cni's STATUS, asking only whether the agent is there.
    if read == 0 {
        return Ok(());
    }
    let reply = match serde_json::from_str::<GateRequest>(&line) {
        Ok(request) => {
            let (reply, answer) = oneshot::channel();
            claims
                .send(Claim { request, reply })
                .await
                .context("the agent is stopping")?;
            tokio::time::timeout(WAIT, answer)
                .await
                .unwrap_or_else(|_| {
                    Ok(Err("the agent did not isolate the pod in time".to_string()).into())
                })
                .context("the agent dropped the request")?
        }
        Err(error) => Err(format!("not a request: {error}")).into(),
    };
    let mut text = serde_json::to_vec(&reply)?;
    text.push(b'\n');
    write.write_all(&text).await.context("answering")?;
    Ok(())
}
