//! The WireGuard device, from one of three backends: kernel WireGuard configured over
//! generic netlink, `wireguard-go` (a daemon nodus starts), or boringtun embedded in nodus;
//! the two userspace ones are driven over the same UAPI socket. All take the same per-peer
//! changes and report the same state; none is ever asked to replace the whole peer set,
//! which would reset every session.

pub mod embedded;
pub mod kernel;
pub mod uapi;
pub mod wireguard_go;

use crate::Error;
use crate::key::{Key, KeyPair};
use crate::plan::{Peer, PeerChange};
use embedded::EmbeddedDevice;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

/// Which implementation runs the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Kernel WireGuard if the `wireguard` link type exists; else `wireguard-go` if it is
    /// running or installed (a restart keeps sessions); else the embedded device.
    Auto,
    Kernel,
    WireguardGo,
    Embedded,
}

impl BackendKind {
    /// The backend's name, as `mesh.backend` spells it.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Kernel => "kernel",
            BackendKind::WireguardGo => "wireguard-go",
            BackendKind::Embedded => "embedded",
        }
    }
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
    WireguardGo(uapi::UapiDevice),
    Embedded(EmbeddedDevice),
}

impl Device {
    /// Opens the device `name`, creating it if needed.
    pub async fn open(kind: BackendKind, name: &str, wireguard_go: &Path) -> Result<Device, Error> {
        match kind {
            BackendKind::Kernel => Ok(Device::Kernel(kernel::KernelDevice::open(name).await?)),
            BackendKind::WireguardGo => Ok(Device::WireguardGo(
                wireguard_go::open(name, wireguard_go).await?,
            )),
            BackendKind::Embedded => Ok(Device::Embedded(EmbeddedDevice::create(name).await?)),
            BackendKind::Auto => match kernel::KernelDevice::open(name).await {
                Ok(device) => Ok(Device::Kernel(device)),
                Err(error) => {
                    let daemon = wireguard_go::running(name).await.is_some()
                        || wireguard_go::find(wireguard_go).is_some();
                    let chosen = if daemon { "wireguard-go" } else { "embedded" };
                    tracing::info!(%error, backend = chosen, "no kernel WireGuard");
                    if daemon {
                        Ok(Device::WireguardGo(
                            wireguard_go::open(name, wireguard_go).await?,
                        ))
                    } else {
                        Ok(Device::Embedded(EmbeddedDevice::create(name).await?))
                    }
                }
            },
        }
    }

    /// The backend that runs it, to open the same one again.
    pub fn backend(&self) -> BackendKind {
        match self {
            Device::Kernel(_) => BackendKind::Kernel,
            Device::WireguardGo(_) => BackendKind::WireguardGo,
            Device::Embedded(_) => BackendKind::Embedded,
        }
    }

    pub async fn state(&mut self) -> Result<DeviceState, Error> {
        match self {
            Device::Kernel(d) => d.state().await,
            Device::WireguardGo(d) | Device::Embedded(EmbeddedDevice { uapi: d, .. }) => {
                d.state().await
            }
        }
    }

    /// Sets the private key and port, leaving the peers alone.
    pub async fn set_identity(&mut self, keys: &KeyPair, port: u16) -> Result<(), Error> {
        match self {
            Device::Kernel(d) => d.set_identity(keys.private(), port).await,
            Device::WireguardGo(d) | Device::Embedded(EmbeddedDevice { uapi: d, .. }) => {
                d.set_identity(keys.private(), port).await
            }
        }
    }

    /// Applies per-peer changes (batched into as few messages as the backend allows).
    pub async fn apply(&mut self, changes: &[PeerChange]) -> Result<(), Error> {
        if changes.is_empty() {
            return Ok(());
        }
        match self {
            Device::Kernel(d) => d.apply(changes).await,
            Device::WireguardGo(d) | Device::Embedded(EmbeddedDevice { uapi: d, .. }) => {
                d.apply(changes).await
            }
        }
    }
}
