//! The WireGuard pod network: one device per node, every other node a peer.
//!
//! - [`plan`] (pure): the node view → desired peers, routes, device addresses and the
//!   annotations to publish, and the per-peer deltas between two states.
//! - [`conflist`]: the CNI conflist for kubelet (pure content, atomic write), and the
//!   plugins it chains.
//! - [`key`]: the node's key pair and its file.
//! - [`config`]: the `mesh:` section of the configuration, and the settings it becomes.
//! - [`backend`]: the WireGuard device: kernel (generic netlink), `wireguard-go` or
//!   boringtun embedded in nodus (both driven over the UAPI socket).
//! - [`links`]: the device's link, addresses and routes over rtnetlink.
//! - [`apply`]: brings the kernel in step with a plan, per-peer deltas only.
//! - [`subsystem`]: [`start`], the task that runs the mesh inside `nodus run`.
//! - [`publish`]: the node's own annotations, patched into the API.
//! - [`cleanup`]: `nodus cleanup`'s part: the device and the conflist.
//! - [`metrics`]: the mesh's series on `/metrics`.

pub mod apply;
pub mod backend;
pub mod cleanup;
pub mod config;
pub mod conflist;
pub mod key;
pub mod links;
pub mod metrics;
pub mod plan;
pub mod publish;
pub mod subsystem;

pub use apply::{Mesh, MeshSettings};
pub use key::Key;
pub use subsystem::{MeshSubsystem, start};

/// An error of the mesh, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{context}: {source}")]
    Netlink {
        context: String,
        source: rtnetlink::Error,
    },
    #[error("{context}: {message}")]
    Device { context: String, message: String },
}

impl From<nodus_durable::Error> for Error {
    fn from(error: nodus_durable::Error) -> Error {
        Error::Io {
            context: error.context,
            source: error.source,
        }
    }
}

impl Error {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }

    pub(crate) fn netlink(context: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> Error {
        let context = context.into();
        move |source| Error::Netlink { context, source }
    }

    pub(crate) fn device(context: impl Into<String>, message: impl ToString) -> Error {
        Error::Device {
            context: context.into(),
            message: message.to_string(),
        }
    }
}
