//! A failure as the CNI specification reports it: a code, a message and details.

/// The error codes of the CNI specification this plugin uses; 100 and up are its own.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENVIRONMENT: u32 = 4;
    pub const IO: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    /// `STATUS`: the plugin cannot take `ADD`s now (the node's agent is not there).
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// The kernel refused or did not answer a change to links, addresses or routes.
    pub const KERNEL: u32 = 100;
    /// The node's agent did not confirm that the pod's NetworkPolicy isolation is in
    /// place: the pod is not started (it fails closed), and the runtime tries again.
    pub const POLICY_PENDING: u32 = 101;
}

/// A failure as CNI reports it: a code, a message and details.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub code: u32,
    pub message: String,
    pub details: String,
}

impl Error {
    pub fn new(code: u32, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
            details: String::new(),
        }
    }

    pub(crate) fn environment(message: impl Into<String>) -> Error {
        Error::new(code::INVALID_ENVIRONMENT, message)
    }

    pub(crate) fn version(message: impl Into<String>) -> Error {
        Error::new(code::INCOMPATIBLE_VERSION, message)
    }

    pub(crate) fn decode(message: impl Into<String>) -> Error {
        Error::new(code::DECODE, message)
    }

    pub(crate) fn config(message: impl Into<String>) -> Error {
        Error::new(code::INVALID_CONFIG, message)
    }

    pub(crate) fn kernel(message: impl Into<String>) -> Error {
        Error::new(code::KERNEL, message)
    }
}
