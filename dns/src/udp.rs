//! The UDP listener: a thread of its own per address, blocking in `recvmmsg` for a batch of
//! queries, answering what the fast path ([`crate::fast`]) takes into buffers reused from
//! batch to batch, and sending those replies together with one `sendmmsg`. The read lock on
//! the view is taken once per batch, and nothing is allocated per query.
//!
//! Each datagram goes through the request pipeline's front ([`ClusterDns::front`]). Every
//! other datagram (names to forward, reverse names, headless services, anything unusual,
//! and everything until the view is whole) is copied to the runtime and answered there by
//! the full path, [`ClusterDns::answer_message`]; its reply goes out on the same socket
//! without blocking the runtime.
//!
//! Every reply leaves from the address its query was sent to. A wildcard socket gets each
//! datagram's destination (`IP_PKTINFO`, `IPV6_PKTINFO`) and sends it back as the reply's
//! source, so that it answers correctly for an address held on `lo` or a dummy interface,
//! where routing would pick another source and the client would drop the reply; a socket
//! bound to one address needs nothing of the kind.
//!
//! Why a thread rather than a task: the runtime is current-thread without the proxy, and
//! shares its workers with the watch and the proxy with it; a blocking socket read in
//! batches answers more queries per CPU than one readiness wake-up per datagram.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use crate::fast;
use crate::handler::{Answered, ClusterDns, Front};
use crate::lookup::MAX_UDP_PAYLOAD;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Datagrams taken per `recvmmsg`.
const BATCH: usize = 32;
/// The largest query read, as hickory-server reads them; longer ones are dropped.
const RECEIVE_BUFFER: usize = 4096;
const SEND_BUFFER: usize = MAX_UDP_PAYLOAD as usize;
/// Datagrams waiting for the full path; more are dropped, as a full socket buffer would.
const FULL_PATH_QUEUE: usize = 1024;
/// How long a blocked read waits before looking at the stop flag again.
const WAKE_UP: Duration = Duration::from_millis(500);

/// Serves one UDP address until dropped.
pub struct UdpListener {
    sockets: Vec<Arc<UdpSocket>>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// The sockets were handed to the next process: stopping must not shut them down,
    /// since a shutdown acts on the socket, which it now reads too.
    handed_over: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl UdpListener {
    /// Binds `addr` and starts answering on it with `threads` threads, each on its own
    /// socket (`SO_REUSEPORT` spreads clients over them); needs a tokio runtime for the full
    /// path.
    pub fn bind(
        addr: SocketAddr,
        threads: usize,
        handler: ClusterDns,
        handed_over: Arc<AtomicBool>,
    ) -> io::Result<UdpListener> {
        Self::serve(bind_sockets(addr, threads)?, handler, handed_over)
    }

    /// Answers on `sockets`, bound to one address by [`UdpListener::bind`] here or in the
    /// process before (which handed them over), one thread each.
    pub fn serve(
        sockets: Vec<UdpSocket>,
        handler: ClusterDns,
        handed_over: Arc<AtomicBool>,
    ) -> io::Result<UdpListener> {
        let first = sockets
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no UDP socket"))?;
        let addr = first.local_addr()?;
        let sockets: Vec<Arc<UdpSocket>> = sockets.into_iter().map(Arc::new).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let (full_path, queue) = mpsc::channel(FULL_PATH_QUEUE);
        // Any of the sockets sends from the same address and port.
        tokio::spawn(full_path_loop(queue, sockets[0].clone(), handler.clone()));
        let mut threads = Vec::new();
        for (i, socket) in sockets.iter().enumerate() {
            let (socket, stop) = (socket.clone(), stop.clone());
            let (handler, full_path) = (handler.clone(), full_path.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("dns-udp-{}-{i}", addr.port()))
                    .spawn(move || {
                        // A panic answering a batch (a bug that a packet reaches) costs that
                        // batch, not the socket: the loop starts again with fresh buffers.
                        while catch_unwind(AssertUnwindSafe(|| {
                            fast_loop(&socket, &handler, &full_path, &stop)
                        }))
                        .is_err()
                        {
                            tracing::error!("the DNS UDP loop panicked; it serves on");
                        }
                    })?,
            );
        }
        Ok(UdpListener {
            sockets,
            addr,
            stop,
            handed_over,
            threads,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Copies of the sockets' descriptors, for the next process.
    pub fn duplicate(&self) -> io::Result<Vec<UdpSocket>> {
        self.sockets.iter().map(|s| s.try_clone()).collect()
    }
}

/// `threads` UDP sockets bound to `addr` (with `SO_REUSEPORT` when more than one), set up
/// for [`UdpListener::serve`]: a read timeout, and the destination of each datagram on a
/// wildcard.
fn bind_sockets(addr: SocketAddr, threads: usize) -> io::Result<Vec<UdpSocket>> {
    let mut sockets = Vec::new();
    let mut addr = addr;
    for _ in 0..threads.max(1) {
        let socket = match threads {
            1 => UdpSocket::bind(addr)?,
            _ => bind_reuse_port(addr)?,
        };
        socket.set_read_timeout(Some(WAKE_UP))?;
        // A socket bound to one address replies from it anyway.
        if addr.ip().is_unspecified() {
            receive_destinations(&socket, addr)?;
        }
        // Port 0 picks a port once; the other sockets share it.
        addr = socket.local_addr()?;
        sockets.push(socket);
    }
    Ok(sockets)
}

impl Drop for UdpListener {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        // Sockets handed over keep serving in the next process: each thread stops within
        // its read timeout, answering what it has read.
        if !self.handed_over.load(Relaxed) {
            for socket in &self.sockets {
                // Wakes a blocked `recvmmsg` at once (Linux does so even for unconnected
                // sockets); the read timeout bounds the wait where it does not.
                // SAFETY: shutdown on a descriptor this listener owns and keeps open.
                unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_RD) };
            }
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A UDP socket bound with `SO_REUSEPORT`, so that several can share `addr`.
fn bind_reuse_port(addr: SocketAddr) -> io::Result<UdpSocket> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket calls; the descriptor is owned by the UdpSocket at once.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let socket = UdpSocket::from_raw_fd(fd);
        let on: libc::c_int = 1;
        if libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEPORT,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
        let (name, len) = sockaddr_of(addr);
        if libc::bind(fd, (&raw const name).cast(), len) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(socket)
    }
}

/// A query for the full path: the packet, its source, the address it was sent to, and
/// whether the front found its source on the allow-list.
type Datagram = (Vec<u8>, SocketAddr, Option<Local>, bool);

/// Answers the datagrams the fast path left, each in its own task (forwarding waits on
/// upstreams), and sends the replies without blocking.
async fn full_path_loop(
    mut queue: mpsc::Receiver<Datagram>,
    socket: Arc<UdpSocket>,
    handler: ClusterDns,
) {
    while let Some((packet, src, local, allowed)) = queue.recv().await {
        let (socket, handler) = (socket.clone(), handler.clone());
        tokio::spawn(async move {
            if let Some(reply) = handler.answer_message(packet, src, false, allowed).await {
                send_now(&socket, &reply, src, local);
            }
        });
    }
}

/// One datagram from `local`, never blocking: a full socket buffer drops it, as the
/// network may.
fn send_now(socket: &UdpSocket, packet: &[u8], to: SocketAddr, local: Option<Local>) {
    let (mut name, name_len) = sockaddr_of(to);
    let mut iov = libc::iovec {
        iov_base: packet.as_ptr().cast_mut().cast(),
        iov_len: packet.len(),
    };
    let mut control = Control::default();
    // SAFETY: all-zero is a valid msghdr; every pointer set below outlives the call.
    let mut header: libc::msghdr = unsafe { zeroed() };
    header.msg_name = (&raw mut name).cast();
    header.msg_namelen = name_len;
    header.msg_iov = &raw mut iov;
    header.msg_iovlen = 1;
    set_source(&mut header, &mut control, local);
    // SAFETY: the header points at buffers valid for the lengths given; sendmsg only reads.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &raw const header, libc::MSG_DONTWAIT) };
    if sent < 0 {
        tracing::debug!(error = %io::Error::last_os_error(), %to, "sending a DNS reply");
    }
}

/// The address a datagram was sent to, and the interface it came in on (a link-local
/// address needs it to be used as a source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Local {
    ip: IpAddr,
    interface: u32,
}

/// Room for one `IP_PKTINFO` or `IPV6_PKTINFO` control message, aligned for `cmsghdr`.
#[derive(Clone, Copy, Default)]
struct Control([u64; 8]);

/// Asks the kernel to say, with each datagram, which address it was sent to.
fn receive_destinations(socket: &UdpSocket, addr: SocketAddr) -> io::Result<()> {
    let (level, option) = match addr {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_PKTINFO),
        SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO),
    };
    let on: libc::c_int = 1;
    // SAFETY: setsockopt with an int option on a socket this listener owns.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            option,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match set {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The destination of a received datagram, from its control messages.
fn destination_of(header: &libc::msghdr) -> Option<Local> {
    // SAFETY: the kernel filled `msg_control` up to `msg_controllen`; the CMSG macros walk
    // it within those bounds, and each message is read according to its level and type.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(header);
        while !cmsg.is_null() {
            let data = libc::CMSG_DATA(cmsg);
            match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                    let info = data.cast::<libc::in_pktinfo>().read_unaligned();
                    return Some(Local {
                        ip: IpAddr::V4(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr))),
                        interface: info.ipi_ifindex as u32,
                    });
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                    let info = data.cast::<libc::in6_pktinfo>().read_unaligned();
                    return Some(Local {
                        ip: IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)),
                        interface: info.ipi6_ifindex,
                    });
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(header, cmsg);
        }
    }
    None
}

/// Makes `header` send from `local` (nothing when unknown: routing picks the source).
fn set_source(header: &mut libc::msghdr, control: &mut Control, local: Option<Local>) {
    let Some(local) = local else {
        header.msg_control = std::ptr::null_mut();
        header.msg_controllen = 0;
        return;
    };
    let (level, kind, len) = match local.ip {
        IpAddr::V4(_) => (
            libc::IPPROTO_IP,
            libc::IP_PKTINFO,
            size_of::<libc::in_pktinfo>(),
        ),
        IpAddr::V6(_) => (
            libc::IPPROTO_IPV6,
            libc::IPV6_PKTINFO,
            size_of::<libc::in6_pktinfo>(),
        ),
    };
    header.msg_control = control.0.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE and CMSG_LEN are pure arithmetic; `Control` has room for either
    // message (64 bytes against at most 40), aligned for cmsghdr, so the header and data
    // written through CMSG_FIRSTHDR and CMSG_DATA stay inside it.
    unsafe {
        header.msg_controllen = libc::CMSG_SPACE(len as u32) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(header);
        (*cmsg).cmsg_level = level;
        (*cmsg).cmsg_type = kind;
        (*cmsg).cmsg_len = libc::CMSG_LEN(len as u32) as usize;
        let data = libc::CMSG_DATA(cmsg);
        match local.ip {
            IpAddr::V4(ip) => {
                // The interface stays 0: routing picks it, and `ipi_spec_dst` the source.
                let mut info: libc::in_pktinfo = zeroed();
                info.ipi_spec_dst.s_addr = u32::from(ip).to_be();
                data.cast::<libc::in_pktinfo>().write_unaligned(info);
            }
            IpAddr::V6(ip) => {
                let mut info: libc::in6_pktinfo = zeroed();
                info.ipi6_addr.s6_addr = ip.octets();
                if ip.segments()[0] & 0xffc0 == 0xfe80 {
                    info.ipi6_ifindex = local.interface;
                }
                data.cast::<libc::in6_pktinfo>().write_unaligned(info);
            }
        }
    }
}

/// The receive and send buffers and the message headers pointing into them, set up once.
struct Batch {
    received: Box<[u8]>,
    replies: Box<[u8]>,
    sources: Box<[libc::sockaddr_storage; BATCH]>,
    destinations: Box<[libc::sockaddr_storage; BATCH]>,
    receive_iov: Box<[libc::iovec; BATCH]>,
    send_iov: Box<[libc::iovec; BATCH]>,
    receive_control: Box<[Control; BATCH]>,
    send_control: Box<[Control; BATCH]>,
    receive: Box<[libc::mmsghdr; BATCH]>,
    send: Box<[libc::mmsghdr; BATCH]>,
}

impl Batch {
    fn new() -> Batch {
        let mut batch = Batch {
            received: vec![0; BATCH * RECEIVE_BUFFER].into_boxed_slice(),
            replies: vec![0; BATCH * SEND_BUFFER].into_boxed_slice(),
            sources: zeroed_box(),
            destinations: zeroed_box(),
            receive_iov: zeroed_box(),
            send_iov: zeroed_box(),
            receive_control: Box::new([Control::default(); BATCH]),
            send_control: Box::new([Control::default(); BATCH]),
            receive: zeroed_box(),
            send: zeroed_box(),
        };
        for i in 0..BATCH {
            batch.receive_iov[i] = libc::iovec {
                iov_base: batch.received[i * RECEIVE_BUFFER..].as_mut_ptr().cast(),
                iov_len: RECEIVE_BUFFER,
            };
            batch.send_iov[i] = libc::iovec {
                iov_base: batch.replies[i * SEND_BUFFER..].as_mut_ptr().cast(),
                iov_len: 0,
            };
            let receive = &mut batch.receive[i].msg_hdr;
            receive.msg_name = (&raw mut batch.sources[i]).cast();
            receive.msg_iov = &raw mut batch.receive_iov[i];
            receive.msg_iovlen = 1;
            receive.msg_control = batch.receive_control[i].0.as_mut_ptr().cast();
            let send = &mut batch.send[i].msg_hdr;
            send.msg_name = (&raw mut batch.destinations[i]).cast();
            send.msg_iov = &raw mut batch.send_iov[i];
            send.msg_iovlen = 1;
        }
        batch
    }

    /// Waits for at least one datagram and takes up to [`BATCH`].
    fn receive(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        for message in self.receive.iter_mut() {
            message.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            message.msg_hdr.msg_flags = 0;
            message.msg_hdr.msg_controllen = size_of::<Control>();
        }
        // SAFETY: every header points into buffers this batch owns, with their lengths.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                self.receive.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    /// Sends the first `count` replies.
    fn send(&mut self, socket: &UdpSocket, count: usize) {
        let mut sent = 0;
        while sent < count {
            // SAFETY: as in `receive`; `sent < count <= BATCH`.
            let n = unsafe {
                libc::sendmmsg(
                    socket.as_raw_fd(),
                    self.send.as_mut_ptr().add(sent),
                    (count - sent) as u32,
                    0,
                )
            };
            match usize::try_from(n) {
                Ok(n) => sent += n,
                Err(_) => {
                    let error = io::Error::last_os_error();
                    if error.kind() != io::ErrorKind::Interrupted {
                        // This reply cannot go (an unreachable source, say): skip it.
                        tracing::debug!(%error, "sending DNS replies");
                        sent += 1;
                    }
                }
            }
        }
    }
}

/// A boxed C struct (or array of them) of all zeroes.
fn zeroed_box<T: Copy>() -> Box<T> {
    // SAFETY: only used for plain C structs (and arrays of them), for which all-zero is a
    // valid value (null pointers, zero lengths).
    Box::new(unsafe { zeroed() })
}

/// Reads batches until stopped: each datagram through the pipeline's front
/// ([`ClusterDns::front`]); what it answers goes out in one `sendmmsg` and is recorded at
/// the pipeline's end, the rest is queued for the full path.
fn fast_loop(
    socket: &UdpSocket,
    handler: &ClusterDns,
    full_path: &mpsc::Sender<Datagram>,
    stop: &AtomicBool,
) {
    let mut batch = Batch::new();
    // Each reply, the index of its query in the batch, and its client.
    let mut answered = [(
        fast::Reply {
            len: 0,
            qtype: hickory_proto::rr::RecordType::A,
            rcode: hickory_proto::op::ResponseCode::NoError,
        },
        0,
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
    ); BATCH];
    while !stop.load(Relaxed) {
        let received = match batch.receive(socket) {
            Ok(n) => n,
            Err(error) => {
                if !matches!(
                    error.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                ) && !stop.load(Relaxed)
                {
                    tracing::warn!(%error, "receiving DNS queries");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
        };
        let started = Instant::now();
        let mut replies = 0;
        {
            let at = handler.at_front();
            for i in 0..received {
                let header = &batch.receive[i];
                let Some(src) = socket_addr(&batch.sources[i], header.msg_hdr.msg_namelen)
                    .filter(|src| respondable(*src))
                else {
                    continue;
                };
                if header.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                    continue;
                }
                let len = header.msg_len as usize;
                let packet = &batch.received[i * RECEIVE_BUFFER..i * RECEIVE_BUFFER + len];
                let out = &mut batch.replies[replies * SEND_BUFFER..(replies + 1) * SEND_BUFFER];
                match handler.front(&at, packet, src, false, out) {
                    Front::Answered(reply) => {
                        batch.send_iov[replies].iov_len = reply.len;
                        batch.destinations[replies] = batch.sources[i];
                        batch.send[replies].msg_hdr.msg_namelen = header.msg_hdr.msg_namelen;
                        set_source(
                            &mut batch.send[replies].msg_hdr,
                            &mut batch.send_control[replies],
                            destination_of(&header.msg_hdr),
                        );
                        answered[replies] = (reply, i, src);
                        replies += 1;
                    }
                    Front::Dropped => {}
                    Front::Full { allowed } => {
                        // A full queue drops the datagram; the client asks again.
                        let local = destination_of(&header.msg_hdr);
                        let _ = full_path.try_send((packet.to_vec(), src, local, allowed));
                    }
                }
            }
        }
        batch.send(socket, replies);
        let done = answered[..replies].iter().map(|&(reply, i, src)| Answered {
            src,
            tcp: false,
            qtype: reply.qtype,
            rcode: reply.rcode,
            query: &batch.received[i * RECEIVE_BUFFER..][..batch.receive[i].msg_len as usize],
        });
        handler.answered(done, started.elapsed());
    }
}

/// hickory-server's rule: never answer port 0 or an unspecified or broadcast address.
fn respondable(src: SocketAddr) -> bool {
    src.port() != 0
        && !src.ip().is_unspecified()
        && !matches!(src.ip(), IpAddr::V4(v4) if v4.is_broadcast())
}

fn socket_addr(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match i32::from(storage.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let v4 =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)),
                u16::from_be(v4.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let v6 = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(v6.sin6_addr.s6_addr),
                u16::from_be(v6.sin6_port),
                v6.sin6_flowinfo,
                v6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let out = unsafe { &mut *(&raw mut storage).cast::<libc::sockaddr_in>() };
            out.sin_family = libc::AF_INET as libc::sa_family_t;
            out.sin_port = v4.port().to_be();
            out.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let out = unsafe { &mut *(&raw mut storage).cast::<libc::sockaddr_in6>() };
            out.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            out.sin6_port = v6.port().to_be();
            out.sin6_addr.s6_addr = v6.ip().octets();
            out.sin6_flowinfo = v6.flowinfo();
            out.sin6_scope_id = v6.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_survive_the_c_form() {
        for addr in ["10.1.2.3:5353", "[fd00::1%3]:53"] {
            let addr: SocketAddr = addr.parse().expect("addr");
            let (storage, len) = sockaddr_of(addr);
            assert_eq!(socket_addr(&storage, len), Some(addr));
        }
    }
}
