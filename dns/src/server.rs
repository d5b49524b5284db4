//! The DNS server's listeners: hickory-server's TCP listener and our UDP listener
//! ([`crate::udp`]) on every address, both answering through one [`ClusterDns`]
//! ([`crate::handler`]).

use crate::forward::Forwarder;
use crate::handler::ClusterDns;
use crate::lookup::Zone;
use crate::metrics::DnsMetrics;
use crate::udp::UdpListener;
use hickory_server::Server;
use nodus_view::{Applied, Subsystem, View, ViewReader};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// An idle TCP connection is closed after this long.
const TCP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running DNS server: it serves until dropped.
pub struct DnsServer {
    _tcp: Server<ClusterDns>,
    _udp: Vec<UdpListener>,
    pub metrics: Arc<DnsMetrics>,
    handler: ClusterDns,
    /// The bound addresses (a port 0 in the configuration is resolved here).
    pub addrs: Vec<SocketAddr>,
}

impl DnsServer {
    /// The handler behind both paths, for tests that compare them.
    pub fn handler(&self) -> &ClusterDns {
        &self.handler
    }
}

/// DNS reads the view at query time: a batch needs nothing from it, and it is ready
/// once bound (misses are SERVFAIL until the view is complete).
impl Subsystem for DnsServer {
    fn name(&self) -> &'static str {
        "dns"
    }

    fn after_batch(&mut self, _view: &View, _applied: &Applied) {}
}

/// Binds UDP and TCP on every address and serves until the returned server is dropped,
/// with one UDP thread per address.
pub async fn serve(
    view: ViewReader,
    zone: Zone,
    forwarder: Option<Arc<Forwarder>>,
    listen: &[SocketAddr],
) -> std::io::Result<DnsServer> {
    serve_with_threads(view, zone, forwarder, listen, 1).await
}

/// Binds UDP and TCP on one address. Port 0 lets the kernel pick the UDP port and TCP takes
/// the same one, which another process may already hold for TCP: then a fresh port is
/// tried, a few times.
async fn bind_pair(
    addr: SocketAddr,
    udp_threads: usize,
    handler: &ClusterDns,
) -> std::io::Result<(UdpListener, tokio::net::TcpListener)> {
    const EPHEMERAL_ATTEMPTS: usize = 8;
    let mut attempt = 1;
    loop {
        let udp = UdpListener::bind(addr, udp_threads, handler.clone())?;
        match tokio::net::TcpListener::bind(udp.local_addr()).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e)
                if addr.port() == 0
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && attempt < EPHEMERAL_ATTEMPTS =>
            {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// As [`serve`], with `udp_threads` threads per UDP address, each on its own socket.
pub async fn serve_with_threads(
    view: ViewReader,
    zone: Zone,
    forwarder: Option<Arc<Forwarder>>,
    listen: &[SocketAddr],
    udp_threads: usize,
) -> std::io::Result<DnsServer> {
    let handler = ClusterDns::new(view, zone, forwarder);
    let mut server = Server::new(handler.clone());
    let mut udp = Vec::new();
    let mut bound = Vec::new();
    for addr in listen {
        let (listener, tcp) = bind_pair(*addr, udp_threads, &handler).await?;
        let addr = listener.local_addr();
        server.register_listener(tcp, TCP_TIMEOUT, 64);
        udp.push(listener);
        bound.push(addr);
    }
    Ok(DnsServer {
        _tcp: server,
        _udp: udp,
        metrics: handler.metrics.clone(),
        handler,
        addrs: bound,
    })
}
