//! The subscription socket (`subscribe.socket`, by default in the state directory): who
//! may connect, and one task per subscriber that sends it its work.
//!
//! The socket is root's (mode 0600), or root's and one group's (0660) with
//! `subscribe.group`; without a group a connection from another user is refused as well,
//! should the mode have been changed. At most `max_subscribers` are served at once. A
//! client has [`HELLO_TIMEOUT`] to send its hello of at most [`HELLO_MAX`] bytes. A chunk
//! the socket does not take within [`WRITE_TIMEOUT`], or a subscriber that falls behind
//! what the journal keeps, is cut off.

use super::journal::Work;
use super::protocol::{Control, HELLO_MAX, Hello};
use super::walk::Walk;
use super::{Attached, Config, Hub};
use crate::agent::unix_socket;
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

/// How long a client has to send its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one chunk may wait for the client to read it.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The bytes rendered under one read of the view, and written at once.
pub const CHUNK: usize = 64 * 1024;

/// Listens at the configured socket and serves subscribers from `hub` until dropped.
pub fn serve(
    config: &Config,
    socket: &Path,
    hub: Arc<Hub>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (mode, group) = match config.group {
        Some(gid) => (0o660, Some(gid)),
        None => (0o600, None),
    };
    let listener = unix_socket::listen(socket, mode)?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(socket, None, Some(gid))
            .with_context(|| format!("giving {} to group {gid}", socket.display()))?;
    }
    tracing::info!(socket = %socket.display(), "serving the view to subscribers");
    let slots = Arc::new(Semaphore::new(config.max_subscribers));
    Ok(tokio::spawn(accept(listener, hub, slots, group.is_some())))
}

async fn accept(listener: UnixListener, hub: Arc<Hub>, slots: Arc<Semaphore>, group: bool) {
    loop {
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accepting a subscriber");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let who = match stream.peer_cred() {
            Ok(cred) if cred.uid() == 0 || group => {
                format!("uid {} pid {}", cred.uid(), cred.pid().unwrap_or(0))
            }
            Ok(cred) => {
                refuse(
                    &hub,
                    &mut stream,
                    format!("uid {} may not subscribe", cred.uid()),
                )
                .await;
                continue;
            }
            Err(error) => {
                refuse(&hub, &mut stream, format!("no peer credentials: {error}")).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            let reason = "too many subscribers; try again later".to_string();
            refuse(&hub, &mut stream, reason).await;
            continue;
        };
        let hub = hub.clone();
        tokio::spawn(async move {
            let _slot = slot;
            subscriber(stream, hub, who).await;
        });
    }
}

/// Tells the client why, without waiting for it, and counts the refusal.
async fn refuse(hub: &Hub, stream: &mut UnixStream, reason: String) {
    tracing::warn!(%reason, "refusing a subscriber");
    hub.stats.refused.fetch_add(1, Relaxed);
    let mut line = Vec::new();
    Control::Error { reason }.write(&mut line);
    let _ = tokio::time::timeout(Duration::from_millis(100), stream.write_all(&line)).await;
}

/// Reads the hello line: what the client finished before, if anything.
async fn hello(stream: &mut UnixStream) -> Result<Hello, String> {
    let mut line = String::new();
    let mut reader = BufReader::new(stream).take(HELLO_MAX as u64 + 1);
    match tokio::time::timeout(HELLO_TIMEOUT, reader.read_line(&mut line)).await {
        Err(_) => Err(format!("no hello within {HELLO_TIMEOUT:?}")),
        Ok(Err(error)) => Err(format!("reading the hello: {error}")),
        Ok(Ok(_)) if !line.ends_with('\n') => Err(format!(
            "the hello is one line of at most {HELLO_MAX} bytes"
        )),
        Ok(Ok(_)) => serde_json::from_str(&line).map_err(|error| format!("a bad hello: {error}")),
    }
}

/// Serves one subscriber until it leaves or is cut off.
async fn subscriber(mut stream: UnixStream, hub: Arc<Hub>, who: String) {
    let hello = match hello(&mut stream).await {
        Ok(hello) => hello,
        Err(reason) => return refuse(&hub, &mut stream, reason).await,
    };
    hub.stats.connected.fetch_add(1, Relaxed);
    let attached = hub.attach(who);
    let mut sent = hello.since.as_ref().and_then(|since| hub.resume_at(since));
    if let Some(seq) = sent {
        attached.entry.sent.store(seq, Relaxed);
    }
    tracing::info!(who = %attached.entry.who, resumed = ?sent, "subscriber connected");
    let (mut reading, mut writing) = stream.into_split();
    let mut batches = hub.batches();
    let mut buffer = Vec::with_capacity(CHUNK + CHUNK / 4);
    let ended = loop {
        match send_work(&hub, &attached, &mut writing, &mut buffer, sent).await {
            Ok(Some(seq)) => {
                sent = Some(seq);
                continue;
            }
            Ok(None) => {}
            Err(ended) => break ended,
        }
        // Up to date: wait for the next batch, or for the client to go.
        let mut byte = [0u8; 1];
        tokio::select! {
            changed = batches.changed() => if changed.is_err() {
                break Ended::Left("the agent is stopping".into());
            },
            read = reading.read(&mut byte) => break match read {
                Ok(0) | Err(_) => Ended::Left("closed by the client".into()),
                Ok(_) => Ended::CutOff("the client sent more than its hello".into()),
            },
        }
    };
    match ended {
        Ended::Left(why) => {
            tracing::info!(who = %attached.entry.who, %why, "subscriber left");
        }
        Ended::CutOff(reason) => {
            tracing::warn!(who = %attached.entry.who, %reason, "subscriber cut off");
            hub.stats.cut_off.fetch_add(1, Relaxed);
            buffer.clear();
            Control::Error { reason }.write(&mut buffer);
            let write = writing.write_all(&buffer);
            let _ = tokio::time::timeout(Duration::from_millis(100), write).await;
        }
    }
}

enum Ended {
    Left(String),
    CutOff(String),
}

/// Sends what the subscriber needs after `sent`, and returns the batch it then has (none
/// when it was up to date).
async fn send_work(
    hub: &Hub,
    attached: &Attached,
    writing: &mut tokio::net::unix::OwnedWriteHalf,
    buffer: &mut Vec<u8>,
    sent: Option<u64>,
) -> Result<Option<u64>, Ended> {
    let work = hub.work(sent);
    if work == Work::Behind {
        let reason = "fell behind what the agent keeps: reconnect for a snapshot";
        return Err(Ended::CutOff(reason.into()));
    }
    buffer.clear();
    let mut walk = {
        let view = hub.view().read();
        let Some(walk) = Walk::start(work, &view) else {
            return Ok(None);
        };
        if let Some(header) = walk.header(hub.epoch(), &view) {
            header.write(buffer);
        }
        walk
    };
    loop {
        let (lines, done) = walk.render(&hub.view().read(), buffer, CHUNK);
        if done {
            Control::Synced { seq: walk.seq() }.write(buffer);
        }
        attached.entry.lines.fetch_add(lines, Relaxed);
        attached.entry.bytes.fetch_add(buffer.len() as u64, Relaxed);
        match tokio::time::timeout(WRITE_TIMEOUT, writing.write_all(buffer)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(Ended::Left(format!("writing: {error}"))),
            Err(_) => {
                let reason = format!("did not read for {WRITE_TIMEOUT:?}");
                return Err(Ended::CutOff(reason));
            }
        }
        buffer.clear();
        // One very large service grew it: give that back rather than keep it per subscriber.
        buffer.shrink_to(CHUNK + CHUNK / 4);
        if done {
            attached.entry.sent.store(walk.seq(), Relaxed);
            return Ok(Some(walk.seq()));
        }
    }
}
