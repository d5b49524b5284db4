//! The DNS server's listeners: UDP ([`crate::udp`]) and TCP ([`crate::tcp`]) on every
//! address ([`crate::listen`]), both answering through one [`ClusterDns`]
//! ([`crate::handler`]).

use crate::allow::AllowedPrefixes;
use crate::forward::Forwarder;
use crate::handler::ClusterDns;
use crate::kube_dns::ConfigMapRoutes;
use crate::listen::{self, Listen};
use crate::lookup::Zone;
use crate::metrics::DnsMetrics;
use crate::tcp::{self, TcpListener};
use crate::udp::UdpListener;
use nodus_limits::{ConnectionCaps, Tenants};
use nodus_view::ViewReader;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a followed wildcard looks at the host's addresses again.
const FOLLOW_PERIOD: Duration = Duration::from_secs(2);

/// Both transports on one address.
struct Listener {
    udp: UdpListener,
    _tcp: TcpListener,
    /// A copy of the TCP socket's descriptor, to hand over.
    tcp_socket: std::net::TcpListener,
}

/// The sockets of one address, bound by one process and served by the next: a restart
/// that hands them over loses no query, since the kernel queues what arrives meanwhile
/// on the same sockets.
#[derive(Debug)]
pub struct BoundSockets {
    pub udp: Vec<std::net::UdpSocket>,
    pub tcp: std::net::TcpListener,
}

type Listeners = Arc<Mutex<BTreeMap<SocketAddr, Listener>>>;

/// A running DNS server: it serves until dropped.
pub struct DnsServer {
    /// Held: every listener serves until the server drops.
    listeners: Listeners,
    pub metrics: Arc<DnsMetrics>,
    pub(crate) handler: ClusterDns,
    /// The addresses bound at start (a port 0 in the configuration is resolved here).
    pub addrs: Vec<SocketAddr>,
    handed_over: Arc<AtomicBool>,
    /// Tasks that serve this server and stop with it: the one following the host (the
    /// listeners of a followed wildcard, the allow-list, the hosts file) and the one
    /// looking after the upstreams (loop probes, health checks).
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The forwarder's routes, following the cluster's DNS ConfigMap in the view.
    pub(crate) config_map: Option<ConfigMapRoutes>,
}

impl DnsServer {
    /// Lets the forwarder follow the cluster's DNS ConfigMap, from the next batch on.
    pub fn follow_config_map(&mut self, routes: ConfigMapRoutes) {
        self.config_map = Some(routes);
    }

    /// The handler behind both paths, for tests that compare them.
    pub fn handler(&self) -> &ClusterDns {
        &self.handler
    }

    /// Lets clients from `prefixes` ask too (the cluster CIDRs, `dns.allow`), besides
    /// loopback, this host's addresses and the Nodes' addresses (and without cluster
    /// CIDRs their pod CIDRs), which follow the view.
    pub fn allow(&mut self, prefixes: AllowedPrefixes) {
        let view = self.handler.view().clone();
        self.handler
            .rebuild_allow_list(&view.read(), Some(prefixes), None);
    }

    /// What hands this server's sockets to the next process.
    pub fn handover(&self) -> Handover {
        Handover {
            listeners: self.listeners.clone(),
            handed_over: self.handed_over.clone(),
        }
    }
}

/// Hands a server's sockets to the next process, which serves them with
/// [`serve_planned`]'s `inherited`.
#[derive(Clone)]
pub struct Handover {
    listeners: Listeners,
    handed_over: Arc<AtomicBool>,
}

impl Handover {
    /// Copies of every listener's sockets. From now on, stopping the server leaves them
    /// serving in the process that takes them.
    pub fn sockets(&self) -> std::io::Result<BTreeMap<SocketAddr, BoundSockets>> {
        self.handed_over.store(true, Relaxed);
        lock(&self.listeners)
            .iter()
            .map(|(addr, listener)| {
                Ok((
                    *addr,
                    BoundSockets {
                        udp: listener.udp.duplicate()?,
                        tcp: listener.tcp_socket.try_clone()?,
                    },
                ))
            })
            .collect()
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn lock(listeners: &Listeners) -> std::sync::MutexGuard<'_, BTreeMap<SocketAddr, Listener>> {
    // Only listeners: a panic while holding it leaves nothing half done.
    listeners
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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

/// What every listener of one server shares: the handler, the UDP threads per address, and
/// the caps on TCP connections, which hold across all its addresses.
#[derive(Clone)]
struct Shared {
    handler: ClusterDns,
    udp_threads: usize,
    tcp_caps: ConnectionCaps,
    /// Sockets the process before handed over, by address, until an address takes them.
    inherited: Arc<Mutex<BTreeMap<SocketAddr, BoundSockets>>>,
    handed_over: Arc<AtomicBool>,
}

/// Binds UDP and TCP on one address. Port 0 lets the kernel pick the UDP port and TCP takes
/// the same one, which another process may already hold for TCP: then a fresh port is
/// tried, a few times.
async fn bind(addr: SocketAddr, shared: &Shared) -> std::io::Result<(SocketAddr, Listener)> {
    let Shared {
        handler,
        udp_threads,
        tcp_caps,
        inherited,
        handed_over,
    } = shared;
    let adopted = inherited
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .remove(&addr);
    if let Some(BoundSockets { udp, tcp }) = adopted {
        let udp = UdpListener::serve(udp, handler.clone(), handed_over.clone())?;
        let tcp_socket = tcp.try_clone()?;
        tcp.set_nonblocking(true)?;
        let tcp = tokio::net::TcpListener::from_std(tcp)?;
        let server = TcpListener::serve(tcp, handler.clone(), tcp_caps.clone());
        tracing::info!(%addr, "DNS serving on the sockets the process before handed over");
        return Ok((
            addr,
            Listener {
                udp,
                _tcp: server,
                tcp_socket,
            },
        ));
    }
    const EPHEMERAL_ATTEMPTS: usize = 8;
    let mut attempt = 1;
    loop {
        let udp = UdpListener::bind(addr, *udp_threads, handler.clone(), handed_over.clone())?;
        match tokio::net::TcpListener::bind(udp.local_addr()).await {
            Ok(tcp) => {
                let tcp_socket = std::net::TcpListener::from(tcp.as_fd().try_clone_to_owned()?);
                let server = TcpListener::serve(tcp, handler.clone(), tcp_caps.clone());
                let bound = udp.local_addr();
                return Ok((
                    bound,
                    Listener {
                        udp,
                        _tcp: server,
                        tcp_socket,
                    },
                ));
            }
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
    let plan = listen::plan(listen);
    let handler = ClusterDns::new(view, zone, forwarder);
    serve_planned(
        handler,
        &plan,
        udp_threads,
        BTreeMap::new(),
        Tenants::default(),
    )
    .await
}

/// Serves `plan` ([`listen::plan`]): a fixed address that cannot be bound is an error; a
/// followed wildcard binds what it can of the host's addresses now, and follows them. An
/// address whose sockets are `inherited` (from the process before) serves on them.
///
/// `pods` tells pods' addresses from others for the TCP listeners' caps: pods hold at most
/// half the connections together, so that the node and other clients keep theirs.
pub async fn serve_planned(
    handler: ClusterDns,
    plan: &[Listen],
    udp_threads: usize,
    inherited: BTreeMap<SocketAddr, BoundSockets>,
    pods: Tenants,
) -> std::io::Result<DnsServer> {
    let handed_over = Arc::new(AtomicBool::new(false));
    let shared = Shared {
        handler: handler.clone(),
        udp_threads,
        tcp_caps: ConnectionCaps::new(tcp::CONNECTIONS, tcp::PER_CLIENT).with_tenants(pods),
        inherited: Arc::new(Mutex::new(inherited)),
        handed_over: handed_over.clone(),
    };
    let mut bound = BTreeMap::new();
    for listen in plan {
        if let Listen::Fixed(addr) = listen {
            let (addr, listener) = bind(*addr, &shared).await?;
            bound.insert(addr, listener);
        }
    }
    let followed: Vec<Listen> = plan
        .iter()
        .filter(|l| matches!(l, Listen::EachAddress(_)))
        .copied()
        .collect();
    for listen in &followed {
        if let Listen::EachAddress(wildcard) = listen {
            tracing::warn!(%wildcard, "another server holds an address of this port; listening on each address of this host instead, and following them");
        }
    }
    let listeners: Listeners = Arc::new(Mutex::new(bound));
    let mut following = Following {
        followed,
        listeners: listeners.clone(),
        shared: shared.clone(),
        unbindable: BTreeSet::new(),
    };
    following.step().await?;
    let addrs = lock(&listeners).keys().copied().collect();
    // What no address took (the configuration changed) is closed.
    shared
        .inherited
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clear();
    let follower = tokio::spawn(async move {
        loop {
            tokio::time::sleep(FOLLOW_PERIOD).await;
            if let Err(error) = following.step().await {
                tracing::warn!(%error, "reading this host's addresses failed");
            }
        }
    });
    let mut tasks = vec![follower];
    if let Some(forwarder) = handler.forwarder().cloned() {
        tasks.push(tokio::spawn(
            async move { forwarder.watch_upstreams().await },
        ));
    }
    Ok(DnsServer {
        listeners,
        metrics: handler.metrics.clone(),
        handler,
        addrs,
        handed_over,
        tasks,
        config_map: None,
    })
}

/// What follows the host: the listeners of the followed wildcards, the host's addresses in
/// the allow-list (local clients use them as sources), and the hosts file.
struct Following {
    followed: Vec<Listen>,
    listeners: Listeners,
    shared: Shared,
    /// Addresses that could not be bound (another server's, or one still tentative):
    /// logged once, tried again each step.
    unbindable: BTreeSet<SocketAddr>,
}

impl Following {
    async fn step(&mut self) -> std::io::Result<()> {
        self.shared.handler.reload_hosts();
        let host = listen::host_addresses()?;
        if !self.followed.is_empty() {
            self.follow_listeners(&host).await;
        }
        if host != self.shared.handler.allowed_host() {
            let view = self.shared.handler.view().clone();
            self.shared
                .handler
                .rebuild_allow_list(&view.read(), None, Some(host));
        }
        Ok(())
    }

    /// Brings the listeners of the followed wildcards in line with `host`.
    async fn follow_listeners(&mut self, host: &[std::net::IpAddr]) {
        let wanted = listen::addresses(&self.followed, host);
        let is_followed = |addr: &SocketAddr| {
            self.followed.iter().any(|listen| {
                matches!(listen, Listen::EachAddress(wildcard)
                    if wildcard.port() == addr.port() && wildcard.is_ipv4() == addr.is_ipv4())
            })
        };
        let new: Vec<SocketAddr> = {
            let mut current = lock(&self.listeners);
            let gone: Vec<SocketAddr> = current
                .keys()
                .filter(|addr| is_followed(addr) && !wanted.contains(addr))
                .copied()
                .collect();
            for addr in gone {
                current.remove(&addr);
                tracing::info!(%addr, "the address went; not listening on it");
            }
            wanted
                .iter()
                .filter(|addr| !current.contains_key(addr))
                .copied()
                .collect()
        };
        for addr in new {
            match bind(addr, &self.shared).await {
                Ok((addr, listener)) => {
                    self.unbindable.remove(&addr);
                    lock(&self.listeners).insert(addr, listener);
                    tracing::info!(%addr, "DNS listening on a new address");
                }
                Err(error) => {
                    if self.unbindable.insert(addr) {
                        tracing::info!(%addr, %error, "not listening on this address");
                    }
                }
            }
        }
    }
}
