//! The TCP listener: DNS messages framed by a two-byte length (RFC 1035 §4.2.2), each
//! answered through [`ClusterDns::answer_stream`] as soon as it is read, up to
//! [`PIPELINED`] at once per connection, the replies sent in the order they are ready
//! (RFC 7766 §6.2.1.1).
//!
//! What one client may hold is bounded (RFC 7766 §6.2): [`CONNECTIONS`] open in all and
//! [`PER_CLIENT`] from one address (pods, when the cluster's ranges are known, half of
//! them together), over which a connection is closed as soon as it is accepted; a
//! connection idle for [`IDLE`] (between messages, or within one) is closed. Replies
//! waiting to be written take room in a budget of bytes, [`CONNECTION_REPLY_BYTES`] per
//! connection and [`LISTENER_REPLY_BYTES`] per address: a client that stops reading
//! holds no more than its connection's share, and a reply that finds no room within
//! [`WRITE_TIMEOUT`], or cannot be written within it, closes the connection
//! (`nodus_dns_tcp_connections_closed_total{reason}`).

use crate::handler::ClusterDns;
use crate::metrics::TcpClosed;
use nodus_limits::{ConnectionCaps, Slot};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
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
/// Bytes of replies one connection may have waiting to be written: two of the largest.
pub const CONNECTION_REPLY_BYTES: usize = 128 * 1024;
/// Bytes of replies every connection of one address may have waiting together.
pub const LISTENER_REPLY_BYTES: usize = 8 * 1024 * 1024;
/// How long a reply may wait for room, or for its client to take it (miekg/dns's write
/// timeout), before the connection is closed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

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
    let listener_room = Arc::new(Semaphore::new(LISTENER_REPLY_BYTES));
    loop {
        let (stream, client, slot) = nodus_limits::accept(&listener, &caps, "DNS").await;
        while connections.try_join_next().is_some() {}
        let room = Room {
            connection: Arc::new(Semaphore::new(CONNECTION_REPLY_BYTES)),
            listener: listener_room.clone(),
        };
        connections.spawn(serve_connection(
            stream,
            client,
            handler.clone(),
            room,
            slot,
        ));
    }
}

/// The budgets of reply bytes a connection's replies wait in.
struct Room {
    connection: Arc<Semaphore>,
    listener: Arc<Semaphore>,
}

/// Room taken by one reply until it is written.
struct Taken(#[expect(dead_code, reason = "held, not read")] [OwnedSemaphorePermit; 2]);

impl Room {
    /// Room for `reply` in both budgets, within [`WRITE_TIMEOUT`]; `None` closes the
    /// connection: its budget is closed, so every reply waiting for room gives up.
    async fn take(&self, reply: &[u8]) -> Option<Taken> {
        let bytes = u32::try_from(reply.len()).unwrap_or(u32::MAX);
        let both = async {
            let mine = self
                .connection
                .clone()
                .acquire_many_owned(bytes)
                .await
                .ok()?;
            let shared = self.listener.clone().acquire_many_owned(bytes).await.ok()?;
            Some(Taken([mine, shared]))
        };
        let taken = timeout(WRITE_TIMEOUT, both).await.ok().flatten();
        if taken.is_none() {
            self.connection.close();
        }
        taken
    }
}

/// Reads the messages of one connection and answers each in a task of its own (RFC 7766
/// §6.2.1.1: a client may pipeline, and a slow forwarded name must not hold back the
/// zone's answers behind it), at most [`PIPELINED`] at once; the replies go out as they are
/// ready, each with its query's ID.
async fn serve_connection(
    stream: TcpStream,
    client: SocketAddr,
    handler: ClusterDns,
    room: Room,
    _slot: Slot,
) {
    let _ = stream.set_nodelay(true);
    let (mut reader, writer) = stream.into_split();
    let (replies, outgoing) = mpsc::channel(PIPELINED);
    let room = Arc::new(room);
    // Dropping this task (the listener closed) drops the set: the writer and every answer.
    let mut tasks = JoinSet::new();
    tasks.spawn(write_replies(
        writer,
        outgoing,
        room.clone(),
        handler.clone(),
    ));
    let in_flight = Arc::new(Semaphore::new(PIPELINED));
    while let Some(message) = read_message(&mut reader).await {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        if replies.is_closed() || room.connection.is_closed() {
            break;
        }
        let (handler, replies, room) = (handler.clone(), replies.clone(), room.clone());
        tasks.spawn(async move {
            if let Some(mut reply) = handler.answer_stream(message, client).await {
                // Encoded in a buffer that doubled: keep what the reply uses.
                reply.shrink_to_fit();
                match room.take(&reply).await {
                    Some(taken) => {
                        let _ = replies.send((reply, taken)).await;
                    }
                    None => handler.tcp_closed(TcpClosed::NoRoom),
                }
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

/// Writes each reply after its length, until every sender is gone or the client stops
/// reading; a reply's room is given back once it is written.
async fn write_replies(
    mut writer: OwnedWriteHalf,
    mut outgoing: mpsc::Receiver<(Vec<u8>, Taken)>,
    room: Arc<Room>,
    handler: ClusterDns,
) {
    while let Some((reply, taken)) = outgoing.recv().await {
        let Ok(length) = u16::try_from(reply.len()) else {
            continue;
        };
        let write = async {
            writer.write_all(&length.to_be_bytes()).await?;
            writer.write_all(&reply).await
        };
        if !matches!(timeout(WRITE_TIMEOUT, write).await, Ok(Ok(()))) {
            handler.tcp_closed(TcpClosed::WriteTimeout);
            room.connection.close();
            return;
        }
        drop(taken);
    }
}
