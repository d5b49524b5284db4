//! The embedded backend: boringtun in nodus's own process, created by
//! `defguard_wireguard_rs`'s userspace `WGApi` (`defguard_boringtun`'s device: a
//! multi-queue TUN, four event-loop threads and the UAPI socket).
//!
//! It needs no external program, so it works from the distroless image on a kernel
//! without WireGuard. The price: the device lives exactly as long as the process. When
//! nodus exits the kernel deletes the TUN link with its addresses and routes, and the next
//! nodus creates a new device, whose peers must handshake again: a short outage of
//! cross-node pod traffic on every restart, which `wireguard-go` (a daemon of its own)
//! avoids.
//!
//! After creation the device serves the same UAPI socket as `wireguard-go`, and nodus
//! drives it with the same client ([`super::uapi`]): per-peer changes only. defguard's
//! `configure_interface` is never called, because it always sends `replace_peers=true`.
//!
//! **Signals.** boringtun's device blocks SIGINT and SIGTERM in the thread that creates it
//! (its worker threads inherit that mask) and reads them from two `signalfd`s, ending the
//! device on either. In nodus, such a signalfd would race tokio's handler for every
//! process-directed SIGTERM (whichever dequeues it first wins), so nodus might keep
//! running with a dead device, or exit leaving the device to a handler that never runs.
//! The device is therefore created on a thread of its own, which ends afterwards: the
//! mask stays with that thread and boringtun's workers, and no nodus thread changes.
//! Then the signalfds the creation opened are retargeted to the empty signal set, so they
//! never wake. A process-directed SIGTERM goes to a thread that does not block it, that
//! is a nodus thread, and only nodus's shutdown sees it.
//!
//! `nodus run` creates the device before it installs its own handlers: a signal during
//! creation still has its default action and ends the process outright, before the
//! signalfds could read it.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use super::uapi::UapiDevice;
use crate::Error;
use defguard_wireguard_rs::{Userspace, WGApi, WireguardInterfaceApi};
use std::collections::BTreeSet;
use std::os::fd::RawFd;

/// What `/proc/self/fd/N` links to for a signalfd.
const SIGNALFD_LINK: &str = "anon_inode:[signalfd]";

/// The running embedded device.
pub struct EmbeddedDevice {
    /// Owns boringtun's device: dropping it ends the device and removes its socket.
    _api: WGApi<Userspace>,
    pub uapi: UapiDevice,
}

impl EmbeddedDevice {
    /// Creates the device `name` in this process. A device of that name that another
    /// process serves (a `wireguard-go` left from the other backend) is an error rather
    /// than something to take the socket from.
    pub async fn create(name: &str) -> Result<EmbeddedDevice, Error> {
        let uapi = UapiDevice::of(name);
        if uapi.state().await.is_ok() {
            return Err(Error::device(
                format!("creating the embedded WireGuard device {name}"),
                format!(
                    "another process serves {} (wireguard-go?): stop it, or set \
                     mesh.backend to wireguard-go",
                    uapi.socket().display()
                ),
            ));
        }
        let (sender, created) = tokio::sync::oneshot::channel();
        let owned = name.to_string();
        std::thread::Builder::new()
            .name("nodus-wg-create".into())
            .spawn(move || {
                let _ = sender.send(create_on_this_thread(&owned));
            })
            .map_err(Error::io("starting the thread that creates the device"))?;
        let api = created.await.map_err(|_| {
            Error::device(
                format!("creating the embedded WireGuard device {name}"),
                "the creating thread panicked",
            )
        })??;
        tracing::info!(device = name, "created the embedded WireGuard device");
        Ok(EmbeddedDevice { _api: api, uapi })
    }
}

/// Creates the device on the calling thread, which keeps boringtun's signal mask, and
/// disarms the signalfds that the creation opened.
fn create_on_this_thread(name: &str) -> Result<WGApi<Userspace>, Error> {
    let context = || format!("creating the embedded WireGuard device {name}");
    let before = signalfds().map_err(Error::io("listing /proc/self/fd"))?;
    let mut api = WGApi::<Userspace>::new(name).map_err(|e| Error::device(context(), e))?;
    // Disarmed even when the creation fails halfway (after the device started, in setting
    // the link up): that device runs until `api` drops.
    let created = api.create_interface();
    let opened: Vec<RawFd> = signalfds()
        .map_err(Error::io("listing /proc/self/fd"))?
        .difference(&before)
        .copied()
        .collect();
    for fd in &opened {
        disarm(*fd).map_err(Error::io(format!("disarming boringtun's signalfd {fd}")))?;
    }
    tracing::debug!(
        signalfds = opened.len(),
        "disarmed boringtun's signal handlers"
    );
    created.map_err(|e| Error::device(context(), e))?;
    Ok(api)
}

/// The process's open signalfds.
fn signalfds() -> std::io::Result<BTreeSet<RawFd>> {
    let mut fds = BTreeSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // An fd closed since the listing has no link any more: not ours to care about.
        if std::fs::read_link(entry.path()).is_ok_and(|link| link.as_os_str() == SIGNALFD_LINK) {
            fds.insert(fd);
        }
    }
    Ok(fds)
}

/// Makes signalfd `fd` read the empty set of signals: it never becomes readable, and
/// never takes a signal from the process.
fn disarm(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: an all-zero sigset_t is a valid value, and sigemptyset initialises it;
    // signalfd(2) on an existing signalfd only replaces its mask.
    let rc = unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::signalfd(fd, &empty, 0)
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disarmed_signalfd_takes_no_signal() {
        // A thread of its own: the signal stays blocked there only.
        std::thread::spawn(|| {
            // SAFETY: plain libc signal-set calls on local values; SIGUSR2 is blocked on
            // this thread only, raised at this thread, and read back from its fds.
            unsafe {
                let mut usr2: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut usr2);
                libc::sigaddset(&mut usr2, libc::SIGUSR2);
                assert_eq!(
                    libc::pthread_sigmask(libc::SIG_BLOCK, &usr2, std::ptr::null_mut()),
                    0
                );
                let armed = libc::signalfd(-1, &usr2, libc::SFD_NONBLOCK);
                let disarmed = libc::signalfd(-1, &usr2, libc::SFD_NONBLOCK);
                assert!(armed >= 0 && disarmed >= 0);
                assert!(signalfds().expect("fds").contains(&disarmed));
                disarm(disarmed).expect("disarm");
                assert_eq!(libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2), 0);
                let mut info = [0u8; 128];
                let mut read = |fd| libc::read(fd, info.as_mut_ptr().cast(), info.len());
                assert_eq!(read(disarmed), -1, "the disarmed fd took the signal");
                assert_eq!(read(armed), 128, "the signal was pending");
                libc::close(armed);
                libc::close(disarmed);
            }
        })
        .join()
        .expect("the test thread");
    }
}
