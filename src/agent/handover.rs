//! A restart that loses no DNS query: the running process hands its listening sockets
//! (DNS's UDP and TCP on every address, the HTTP endpoints) to the next one over a unix
//! socket in the state directory. Both then hold the same kernel sockets, so what arrives
//! while one stops and the other starts waits in their queues instead of being refused.
//!
//! The exchange, each step bounded by [`TIMEOUT`]:
//! 1. the successor connects to `handover-<node>.sock` and writes [`HELLO`];
//! 2. the running process saves its view (which the successor then restores: DNS answers
//!    from it at once) and sends one message: a length-prefixed JSON [`Header`] saying
//!    what each descriptor is, the descriptors attached (`SCM_RIGHTS`);
//! 3. the successor answers [`TAKEN`] once it holds them; only then does the running
//!    process stop its subsystems, leaving the dataplane to the successor.
//!
//! A successor that finds no socket, or a process that does not answer, starts as if
//! alone.

#![allow(unsafe_code)] // sendmsg and recvmsg with SCM_RIGHTS, each block with its SAFETY comment

use anyhow::Context;
use nodus_dns::server::BoundSockets;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const HELLO: &[u8] = b"nodus handover 1\n";
pub const TAKEN: &[u8] = b"taken\n";
/// How long either side waits for the other at each step.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The kernel's cap on descriptors in one message (`SCM_MAX_FD`).
const MAX_FDS: usize = 253;
const MAX_HEADER: usize = 64 << 10;

/// What the descriptors of a handover are, in their order: the HTTP listeners, then per
/// DNS address its UDP sockets and its TCP listener.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub http: usize,
    /// Each address with its number of UDP sockets.
    pub dns: Vec<(SocketAddr, usize)>,
}

/// The sockets handed over.
#[derive(Debug, Default)]
pub struct Sockets {
    pub http: Vec<TcpListener>,
    pub dns: BTreeMap<SocketAddr, BoundSockets>,
}

impl Sockets {
    fn header(&self) -> Header {
        Header {
            http: self.http.len(),
            dns: self
                .dns
                .iter()
                .map(|(addr, bound)| (*addr, bound.udp.len()))
                .collect(),
        }
    }

    fn raw_fds(&self) -> Vec<RawFd> {
        let mut fds: Vec<RawFd> = self.http.iter().map(AsRawFd::as_raw_fd).collect();
        for bound in self.dns.values() {
            fds.extend(bound.udp.iter().map(AsRawFd::as_raw_fd));
            fds.push(bound.tcp.as_raw_fd());
        }
        fds
    }

    /// The sockets `header` describes, from `fds` in its order.
    fn from_parts(header: Header, fds: Vec<OwnedFd>) -> anyhow::Result<Sockets> {
        let expected = header.http + header.dns.iter().map(|(_, udp)| udp + 1).sum::<usize>();
        anyhow::ensure!(
            expected == fds.len(),
            "the header names {expected} descriptors, {} came",
            fds.len()
        );
        let mut fds = fds.into_iter();
        let mut next = || fds.next().context("a descriptor missing");
        let mut sockets = Sockets::default();
        for _ in 0..header.http {
            sockets.http.push(TcpListener::from(next()?));
        }
        for (addr, udp) in header.dns {
            let udp = (0..udp)
                .map(|_| next().map(UdpSocket::from))
                .collect::<anyhow::Result<_>>()?;
            let tcp = TcpListener::from(next()?);
            sockets.dns.insert(addr, BoundSockets { udp, tcp });
        }
        Ok(sockets)
    }
}

/// Takes the sockets of the process listening at `path`, if one is (blocking; the
/// successor's side). `Ok(None)`: nobody there.
pub fn take_over(path: &Path) -> anyhow::Result<Option<Sockets>> {
    let mut stream = match UnixStream::connect(path) {
        Ok(stream) => stream,
        Err(error)
            if matches!(
                error.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(error) => return Err(error).context(format!("connecting to {}", path.display())),
    };
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    stream.write_all(HELLO).context("asking for the sockets")?;
    let (header, fds) = receive(&mut stream).context("receiving the sockets")?;
    let header: Header = serde_json::from_slice(&header).context("reading the header")?;
    let sockets = Sockets::from_parts(header, fds)?;
    stream.write_all(TAKEN).context("confirming")?;
    Ok(Some(sockets))
}

/// Listens at `path` for a successor (the running process's side): whatever was there (a
/// socket of the process before, which handed over to this one) is replaced.
pub fn listen(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    crate::agent::unix_socket::listen(path, 0o600)
}

/// A successor that asked for the sockets.
pub struct Successor(UnixStream);

/// Waits for the next successor that says [`HELLO`] within [`TIMEOUT`].
pub async fn next_successor(listener: &tokio::net::UnixListener) -> Successor {
    use tokio::io::AsyncReadExt;
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            // Out of descriptors, say: try again shortly rather than spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut hello = [0u8; HELLO.len()];
        let said = tokio::time::timeout(TIMEOUT, stream.read_exact(&mut hello)).await;
        if !matches!(said, Ok(Ok(_))) || hello != HELLO {
            tracing::warn!("a connection to the handover socket did not ask for the sockets");
            continue;
        }
        match stream.into_std().and_then(|stream| {
            stream.set_nonblocking(false)?;
            stream.set_read_timeout(Some(TIMEOUT))?;
            stream.set_write_timeout(Some(TIMEOUT))?;
            Ok(stream)
        }) {
            Ok(stream) => return Successor(stream),
            Err(error) => tracing::warn!(%error, "a successor's connection failed"),
        }
    }
}

impl Successor {
    /// Sends `sockets` and waits for the successor to confirm (blocking). Until it
    /// returns `Ok`, this process keeps serving.
    pub fn hand_over(mut self, sockets: &Sockets) -> anyhow::Result<()> {
        let header = serde_json::to_vec(&sockets.header())?;
        send(&self.0, &header, &sockets.raw_fds()).context("sending the sockets")?;
        let mut taken = [0u8; TAKEN.len()];
        self.0
            .read_exact(&mut taken)
            .context("waiting for the successor to take them")?;
        anyhow::ensure!(taken == TAKEN, "the successor did not confirm");
        Ok(())
    }
}

fn iovec(buffer: &mut [u8]) -> libc::iovec {
    libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    }
}

/// A message over the one buffer `iov` points at, with `control` (a buffer aligned for
/// `cmsghdr`, and how many of its bytes to use) for descriptors.
fn message_over(iov: &mut libc::iovec, control: Option<(&mut [u64], usize)>) -> libc::msghdr {
    // SAFETY: msghdr is a plain C struct; all-zero is valid (no name, no flags).
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = iov;
    message.msg_iovlen = 1;
    if let Some((control, len)) = control {
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = len;
    }
    message
}

fn send(stream: &UnixStream, header: &[u8], fds: &[RawFd]) -> anyhow::Result<()> {
    anyhow::ensure!(header.len() <= MAX_HEADER, "the header is too long");
    anyhow::ensure!(
        fds.len() <= MAX_FDS,
        "{} sockets, more than one message carries",
        fds.len()
    );
    let mut data = (header.len() as u32).to_le_bytes().to_vec();
    data.extend_from_slice(header);
    let fd_bytes = size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    // u64s: the control buffer must be aligned for a cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = iovec(&mut data);
    let control = (!fds.is_empty()).then_some((&mut control[..], space));
    let message = message_over(&mut iov, control);
    if !fds.is_empty() {
        // SAFETY: the control buffer holds CMSG_SPACE(fd_bytes) aligned bytes, so the
        // first header and its data fit; the descriptors are copied into it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&raw const message);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                fd_bytes,
            );
        }
    }
    // SAFETY: the message points at buffers that live until the call returns.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &raw const message, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // The descriptors went with the first byte; the rest is plain data.
    let sent = sent as usize;
    let mut stream = stream;
    stream.write_all(&data[sent..])?;
    Ok(())
}

fn receive(stream: &mut UnixStream) -> anyhow::Result<(Vec<u8>, Vec<OwnedFd>)> {
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut data = vec![0u8; 4 + MAX_HEADER];
    let mut iov = iovec(&mut data);
    let mut message = message_over(&mut iov, Some((&mut control[..], space)));
    // SAFETY: the buffers live until the call returns; descriptors arrive close-on-exec.
    let received =
        unsafe { libc::recvmsg(stream.as_raw_fd(), &raw mut message, libc::MSG_CMSG_CLOEXEC) };
    if received < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled the control buffer and set its length; each header is
    // read within it, and each descriptor it carries is now this process's to own.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&raw const message);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..bytes / size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&raw const message, cmsg);
        }
    }
    anyhow::ensure!(
        message.msg_flags & libc::MSG_CTRUNC == 0,
        "descriptors were cut off"
    );
    let mut received = received as usize;
    while received < 4 {
        let n = stream.read(&mut data[received..4])?;
        anyhow::ensure!(n > 0, "the connection closed early");
        received += n;
    }
    let len = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
    anyhow::ensure!(len <= MAX_HEADER, "a header of {len} bytes");
    if received < 4 + len {
        stream.read_exact(&mut data[received..4 + len])?;
    }
    data.truncate(4 + len);
    data.drain(..4);
    Ok((data, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_pass_whole_and_serve_in_the_taker() {
        let dir = std::env::temp_dir().join(format!("nodus-handover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("handover.sock");
        assert!(take_over(&path).expect("nobody there").is_none());

        let udp = UdpSocket::bind("127.0.0.1:0").expect("udp");
        let addr = udp.local_addr().expect("addr");
        let tcp = TcpListener::bind(addr).expect("tcp");
        let http = TcpListener::bind("127.0.0.1:0").expect("http");
        let http_addr = http.local_addr().expect("addr");
        let offered = Sockets {
            http: vec![http],
            dns: BTreeMap::from([(
                addr,
                BoundSockets {
                    udp: vec![udp],
                    tcp,
                },
            )]),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime.block_on(async { listen(&path) }).expect("listen");
        let taker = std::thread::spawn({
            let path = path.clone();
            move || take_over(&path)
        });
        let successor = runtime.block_on(next_successor(&listener));
        successor.hand_over(&offered).expect("handed over");
        let taken = taker.join().expect("thread").expect("taken").expect("some");
        assert_eq!(taken.http[0].local_addr().expect("addr"), http_addr);
        let bound = &taken.dns[&addr];
        // A datagram sent now reaches the taker's copy of the same socket.
        let client = UdpSocket::bind("127.0.0.1:0").expect("client");
        client.send_to(b"query", addr).expect("send");
        drop(offered);
        let mut buffer = [0u8; 16];
        let (n, _) = bound.udp[0].recv_from(&mut buffer).expect("receive");
        assert_eq!(&buffer[..n], b"query");
        assert_eq!(bound.tcp.local_addr().expect("addr"), addr);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_header_that_names_other_descriptors_is_refused() {
        let header = Header {
            http: 1,
            dns: vec![("127.0.0.1:53".parse().expect("addr"), 2)],
        };
        assert!(Sockets::from_parts(header, Vec::new()).is_err());
    }
}
