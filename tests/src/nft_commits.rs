//! The nf_tables commits of a network namespace, as the kernel announces them.
//!
//! A netlink socket in the `NFNLGRP_NFTABLES` group receives an `NFT_MSG_NEWGEN` message
//! at the end of every transaction committed in its namespace. A bench waiting on it
//! learns when rules are in the kernel without asking the agent: asking its `/metrics` in
//! a loop (a thread, a connection and a full render each time) kept one of the machine's
//! two cores from what was being measured. The kernel builds these messages only while a
//! socket listens, so open one after a large sync, not before.

#![allow(unsafe_code)] // netlink syscalls, each block with its SAFETY comment

use crate::netns::Netns;
use anyhow::{Context, bail};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// `NFNLGRP_NFTABLES` (linux/netfilter/nfnetlink.h).
const GROUP_NFTABLES: u32 = 7;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN`: the end of a transaction.
const MSG_NEWGEN: u16 = (10 << 8) | 15;
/// Room for a one-service transaction's announcements many times over; a larger one
/// overflows it, which [`CommitWatch::next_commit`] counts as a commit.
const RECEIVE_BUFFER: libc::c_int = 4 << 20;

/// A listener for the commits of one namespace.
pub struct CommitWatch {
    socket: OwnedFd,
}

impl CommitWatch {
    /// Listens in `ns` from now on.
    pub fn open(ns: &Netns) -> anyhow::Result<CommitWatch> {
        let socket = ns.enter(open_in_current_namespace)??;
        Ok(CommitWatch { socket })
    }

    /// Forgets what was announced until now.
    pub fn drain(&self) {
        let mut buffer = [0u8; 8192];
        // SAFETY: the buffer is valid for its length; MSG_DONTWAIT returns at once when
        // nothing is queued.
        while unsafe {
            libc::recv(
                self.socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                libc::MSG_DONTWAIT,
            )
        } > 0
        {}
    }

    /// Waits up to `limit` for the end of the next transaction; when it was read.
    pub fn next_commit(&self, limit: Duration) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + limit;
        let mut buffer = vec![0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no nf_tables commit within {limit:?}");
            }
            let mut poll = libc::pollfd {
                fd: self.socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let timeout = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&raw mut poll, 1, timeout) } <= 0 {
                continue;
            }
            // SAFETY: the buffer is valid for its length.
            let read = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            let Ok(read) = usize::try_from(read) else {
                let error = std::io::Error::last_os_error();
                match error.raw_os_error() {
                    // Announcements were lost: a transaction large enough to fill the
                    // buffer has been committed, or is being.
                    Some(libc::ENOBUFS) => return Ok(Instant::now()),
                    Some(libc::EAGAIN | libc::EINTR) => continue,
                    _ => return Err(error).context("reading nf_tables announcements"),
                }
            };
            if announces_commit(&buffer[..read]) {
                return Ok(Instant::now());
            }
        }
    }
}

/// Whether one datagram of netlink messages holds a `NEWGEN`.
fn announces_commit(mut datagram: &[u8]) -> bool {
    const HEADER: usize = size_of::<libc::nlmsghdr>();
    while datagram.len() >= HEADER {
        let len = u32::from_ne_bytes([datagram[0], datagram[1], datagram[2], datagram[3]]);
        let kind = u16::from_ne_bytes([datagram[4], datagram[5]]);
        if kind == MSG_NEWGEN {
            return true;
        }
        // Messages are aligned to four bytes.
        let next = (usize::try_from(len).unwrap_or(usize::MAX).max(HEADER) + 3) & !3;
        datagram = datagram.get(next..).unwrap_or_default();
    }
    false
}

fn open_in_current_namespace() -> anyhow::Result<OwnedFd> {
    // SAFETY: plain socket creation; the descriptor is owned from here on.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("opening a netfilter socket");
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = RECEIVE_BUFFER;
    // SAFETY: a c_int option of the size given. As root, past rmem_max.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const size).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    // SAFETY: zeroes are a valid sockaddr_nl; the fields set are its family and groups.
    let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    address.nl_groups = 1 << (GROUP_NFTABLES - 1);
    // SAFETY: a valid sockaddr_nl of the size given.
    let bound = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&raw const address).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if bound != 0 {
        return Err(std::io::Error::last_os_error()).context("joining the nf_tables announcements");
    }
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, payload: usize) -> Vec<u8> {
        let len = 16 + payload;
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&u32::try_from(len).unwrap_or(0).to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.resize(len.next_multiple_of(4), 0);
        bytes
    }

    #[test]
    fn a_newgen_after_other_messages_is_found_and_their_absence_too() {
        let element = message((10 << 8) | 12, 21);
        let mut datagram = element.clone();
        assert!(!announces_commit(&datagram));
        datagram.extend(message(MSG_NEWGEN, 20));
        assert!(announces_commit(&datagram));
        // A truncated header ends the walk.
        assert!(!announces_commit(&element[..10]));
    }

    #[test]
    fn a_commit_in_the_namespace_is_announced_and_none_before_it() -> anyhow::Result<()> {
        let ns = Netns::new("cw")?;
        let watch = CommitWatch::open(&ns)?;
        assert!(watch.next_commit(Duration::from_millis(50)).is_err());
        ns.exec("nft", &["add", "table", "inet", "commitwatch"])?;
        watch.next_commit(Duration::from_secs(5))?;
        watch.drain();
        assert!(watch.next_commit(Duration::from_millis(50)).is_err());
        Ok(())
    }
}
