//! The TCP listener: DNS messages framed by a two-byte length (RFC 1035 §4.2.2), each
//! answered through [`ClusterDns::answer_stream`] as soon as it is read, up to
//! [`PIPELINED`] at once per connection, the replies sent in the order they are ready
//! (RFC 7766 §6.2.1.1).
//!
//! What one client may hold is bounded (RFC 7766 §6.2): [`CONNECTIONS`] open in all and
//! [`PER_CLIENT`] from one address, over which a connection is closed as soon as it is
//! accepted; a connection idle for [`IDLE`] (between messages, or within one) is closed.

use crate::handler::ClusterDns;
use nodus_limits::{ConnectionCaps, Slot};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::timeout;

/// Open connections on every address together.
pub const CONNECTIONS: usize = 256;
/// Open connections from one client address: a resolver pipelines over a few.
pub const PER_CLIENT: usize = 16;
/// How long a connection may wait for a client's next message, or for the rest of one.
pub const IDLE: Duration = Duration::from_secs(10);
/// Questions of one connection answered at once; a client that pipelines more waits for
/// a reply before the next is read.
pub const PIPELINED: usize = 16;

/// Serves one TCP address until dropped; dropping it closes every connection it accepted.
pub struct TcpListener {
    task: JoinHandle<()>,
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TcpListener {
    /// Serves `listener` in the background, its connections counted in `caps` (shared by
    /// every address of the server, made with [`CONNECTIONS`] and [`PER_CLIENT`]); needs a
    /// tokio runtime.
    pub fn serve(
        listener: tokio::net::TcpListener,
        handler: ClusterDns,
        caps: ConnectionCaps,
    ) -> TcpListener {
        TcpListener {
            task: tokio::spawn(accept(listener, handler, caps)),
        }
    }
}

async fn accept(listener: tokio::net::TcpListener, handler: ClusterDns, caps: ConnectionCaps) {
    // Aborting this task drops the set, and with it every connection.
    let mut connections = JoinSet::new();
    loop {
        let (stream, client, slot) = nodus_limits::accept(&listener, &caps, "DNS").await;
        while connections.try_join_next().is_some() {}
        connections.spawn(serve_connection(stream, client, handler.clone(), slot));
    }
}

/// Reads the messages of one connection and answers each in a task of its own (RFC 7766
/// §6.2.1.1: a client may pipeline, and a slow forwarded name must not hold back the
/// zone's answers behind it), at most [`PIPELINED`] at once; the replies go out as they are
/// ready, each with its query's ID.
async fn serve_connection(stream: TcpStream, client: SocketAddr, handler: ClusterDns, _slot: Slot) {
    let _ = stream.set_nodelay(true);
    let (mut reader, writer) = stream.into_split();
    let (replies, outgoing) = mpsc::channel(PIPELINED);
    // Dropping this task (the listener closed) drops the set: the writer and every answer.
    let mut tasks = JoinSet::new();
    tasks.spawn(write_replies(writer, outgoing));
    let in_flight = Arc::new(Semaphore::new(PIPELINED));
    while let Some(message) = read_message(&mut reader).await {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        if replies.is_closed() {
            break;
        }
        let (handler, replies) = (handler.clone(), replies.clone());
        tasks.spawn(async move {
            if let Some(reply) = handler.answer_stream(message, client).await {
                let _ = replies.send(reply).await;
            }
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    // The answers under way are still sent; the writer ends when the last one has been.
    drop(replies);
    while tasks.join_next().await.is_some() {}
}

/// The next message, or `None` when the client closed, sent garbage of no length, or
/// went quiet for [`IDLE`].
async fn read_message(reader: &mut OwnedReadHalf) -> Option<Vec<u8>> {
    let mut length = [0u8; 2];
    timeout(IDLE, reader.read_exact(&mut length))
        .await
        .ok()?
        .ok()?;
    let mut message = vec![0; usize::from(u16::from_be_bytes(length))];
    timeout(IDLE, reader.read_exact(&mut message))
        .await
        .ok()?
        .ok()?;
    Some(message)
}

/// Frames and writes each reply, until every sender is gone or the client stops reading.
async fn write_replies(mut writer: OwnedWriteHalf, mut outgoing: mpsc::Receiver<Vec<u8>>) {
    while let Some(reply) = outgoing.recv().await {
        let Ok(length) = u16::try_from(reply.len()) else {
            continue;
        };
        let mut framed = Vec::with_capacity(2 + reply.len());
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(&reply);
        if !matches!(timeout(IDLE, writer.write_all(&framed)).await, Ok(Ok(()))) {
            return;
        }
    }
}
