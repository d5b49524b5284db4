//! The WireGuard device: kernel WireGuard configured over generic netlink, or `wireguard-go`
//! driven over its UAPI socket. Both take the same per-peer changes and report the same
//! state; neither is ever asked to replace the whole peer set, which would reset every
//! session.

pub mod kernel;
pub mod uapi;

use crate::Error;
use crate::key::{Key, KeyPair};
use crate::plan::{Peer, PeerChange};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

/// Which implementation runs the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Kernel WireGuard if the module is there, else userspace.
    Auto,
    Kernel,
    Userspace,
}

/// A peer as the device reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerState {
    pub peer: Peer,
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// What the device holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceState {
    pub private_key: Option<Key>,
    pub listen_port: u16,
    pub peers: BTreeMap<Key, PeerState>,
}

/// The device of one backend.
pub enum Device {
    Kernel(kernel::KernelDevice),
    Userspace(uapi::UserspaceDevice),
}

impl Device {
    /// Opens the device `name`, creating it if needed; `Auto` takes the kernel when it can.
    pub async fn open(kind: BackendKind, name: &str, wireguard_go: &Path) -> Result<Device, Error> {
        match kind {
            BackendKind::Kernel => Ok(Device::Kernel(kernel::KernelDevice::open(name).await?)),
            BackendKind::Userspace => Ok(Device::Userspace(
                uapi::UserspaceDevice::open(name, wireguard_go).await?,
            )),
            BackendKind::Auto => match kernel::KernelDevice::open(name).await {
                Ok(device) => Ok(Device::Kernel(device)),
                Err(error) => {
                    tracing::info!(%error, "no kernel WireGuard; using the userspace backend");
                    Ok(Device::Userspace(
                        uapi::UserspaceDevice::open(name, wireguard_go).await?,
                    ))
                }
            },
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Device::Kernel(_) => "kernel",
            Device::Userspace(_) => "userspace",
        }
    }

    pub async fn state(&mut self) -> Result<DeviceState, Error> {
        match self {
            Device::Kernel(d) => d.state().await,
            Device::Userspace(d) => d.state().await,
        }
    }

    /// Sets the private key and port, leaving the peers alone.
    pub async fn set_identity(&mut self, keys: &KeyPair, port: u16) -> Result<(), Error> {
        match self {
            Device::Kernel(d) => d.set_identity(keys.private(), port).await,
            Device::Userspace(d) => d.set_identity(keys.private(), port).await,
        }
    }

    /// Applies per-peer changes (batched into as few messages as the backend allows).
    pub async fn apply(&mut self, changes: &[PeerChange]) -> Result<(), Error> {
        if changes.is_empty() {
            return Ok(());
        }
        match self {
            Device::Kernel(d) => d.apply(changes).await,
            Device::Userspace(d) => d.apply(changes).await,
        }
    }
}
