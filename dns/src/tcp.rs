//! The TCP listener: DNS messages framed by a two-byte length (RFC 1035 §4.2.2), answered
//! in order, one at a time per connection, through [`ClusterDns::answer_message`].
//!
//! What one client may hold is bounded (RFC 7766 §6.2): [`CONNECTIONS`] open in all and
//! [`PER_CLIENT`] from one address, over which a connection is closed as soon as it is
//! accepted; a connection idle for [`IDLE`] (between messages, or within one) is closed.

use crate::handler::ClusterDns;
use hickory_server::net::xfer::Protocol;
use nodus_limits::{ConnectionCaps, Slot};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::timeout;

/// Open connections on every address together.
pub const CONNECTIONS: usize = 256;
/// Open connections from one client address: a resolver pipelines over a few.
pub const PER_CLIENT: usize = 16;
/// How long a connection may wait for a client's next message, or for the rest of one.
pub const IDLE: Duration = Duration::from_secs(10);

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

async fn serve_connection(
    mut stream: TcpStream,
    client: SocketAddr,
    handler: ClusterDns,
    _slot: Slot,
) {
    let _ = stream.set_nodelay(true);
    loop {
        let mut length = [0u8; 2];
        if !matches!(
            timeout(IDLE, stream.read_exact(&mut length)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let mut message = vec![0; usize::from(u16::from_be_bytes(length))];
        if !matches!(
            timeout(IDLE, stream.read_exact(&mut message)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let Some(reply) = handler.answer_message(message, client, Protocol::Tcp).await else {
            continue;
        };
        let Ok(length) = u16::try_from(reply.len()) else {
            continue;
        };
        let mut framed = Vec::with_capacity(2 + reply.len());
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(&reply);
        if !matches!(timeout(IDLE, stream.write_all(&framed)).await, Ok(Ok(()))) {
            return;
        }
    }
}
