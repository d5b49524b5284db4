//! The small HTTP endpoints a node exposes (the agent's `/healthz`, `/readyz`, `/metrics`,
//! `/status`; the proxy's health-check node ports), served so that no client can hold them:
//! a cap on connections in all and per client address, a deadline for a request's headers,
//! and a lifetime for a connection. A node's load balancer and its kubelet probe these
//! ports; a slow or hostile client on the same network must not make them fail.
//!
//! Handlers are plain functions of the request and the client's address: every answer
//! here is computed from memory, so nothing is awaited.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use nodus_limits::ConnectionCaps;
pub use nodus_limits::Tenants;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What one server allows.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Open connections in all; more are closed at once.
    pub connections: usize,
    /// Open connections from one client address; more are closed at once.
    pub per_client: usize,
    /// How long a client has to send a request's headers.
    pub header_timeout: Duration,
    /// How long a connection may stay open, however busy.
    pub lifetime: Duration,
    /// The clients that are pods: together they hold at most half of the connections.
    pub tenants: Tenants,
}

impl Default for Limits {
    /// Room for Prometheus, the kubelet and a load balancer's probes many times over.
    fn default() -> Limits {
        Limits {
            connections: 128,
            per_client: 16,
            header_timeout: Duration::from_secs(5),
            lifetime: Duration::from_secs(120),
            tenants: Tenants::default(),
        }
    }
}

/// A response body.
pub type Body = Full<Bytes>;

/// Binds `addr`, and for the IPv4 wildcard also the IPv6 one (IPv6 only, so that the two
/// coexist): "every address" means both families on a dual-stack node. An IPv6 wildcard
/// that cannot be bound (IPv6 disabled on the node) is left out.
pub fn bind(addr: SocketAddr) -> io::Result<Vec<TcpListener>> {
    let first = listen(addr, false)?;
    // Port 0 picks a port for the first; the second takes the same.
    let port = first.local_addr()?.port();
    let mut listeners = vec![first];
    if addr.ip() == IpAddr::from([0, 0, 0, 0]) {
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
        match listen(v6, true) {
            Ok(listener) => listeners.push(listener),
            Err(error) => tracing::debug!(%error, %v6, "IPv6 wildcard not bound"),
        }
    }
    Ok(listeners)
}

fn listen(addr: SocketAddr, only_v6: bool) -> io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if only_v6 {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Serves `listener` with `handler` until the task is aborted, its connections accepted by
/// [`nodus_limits::accept`].
pub fn serve<F>(listener: TcpListener, limits: Limits, handler: F) -> JoinHandle<()>
where
    F: Fn(&Request<Incoming>, SocketAddr) -> Response<Body> + Clone + Send + Sync + 'static,
{
    let caps = ConnectionCaps::new(limits.connections, limits.per_client)
        .with_tenants(limits.tenants.clone());
    let (header_timeout, lifetime) = (limits.header_timeout, limits.lifetime);
    tokio::spawn(async move {
        loop {
            let (stream, client, slot) = nodus_limits::accept(&listener, &caps, "HTTP").await;
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let response = handler(&request, client);
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    .serve_connection(TokioIo::new(stream), service);
                let _ = tokio::time::timeout(lifetime, connection).await;
                drop(slot);
            });
        }
    })
}

/// A response with `status`, a content type and `body`.
pub fn respond(
    status: hyper::StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests;
