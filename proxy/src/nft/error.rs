//! Errors of the nf_tables layer, with enough context to act on them.

use std::io;

/// An errno from the kernel, shown with its name and description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub fn io_error(self) -> io::Error {
        io::Error::from_raw_os_error(self.0)
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (errno {})", self.io_error(), self.0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{operation} on the nf_tables netlink socket: {source}")]
    Io {
        operation: &'static str,
        #[source]
        source: io::Error,
    },

    /// The kernel refused a message of a batch; the batch was not applied.
    #[error(
        "the kernel refused `{message}`: {errno}{}{}",
        kernel_message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default(),
        if *further_refusals > 0 { format!("; {further_refusals} later message(s) refused as well") } else { String::new() }
    )]
    Refused {
        /// Our description of the refused message, e.g.
        /// `add element to service-ips: 10.96.0.1 . tcp . 80 : goto svc-a`.
        message: String,
        errno: Errno,
        /// The extended-ack text, when the kernel gave one.
        kernel_message: Option<String>,
        /// Often consequences of the first refusal (objects it would have created).
        further_refusals: usize,
    },

    /// A request outside a batch (a query) failed.
    #[error("{request}: {errno}")]
    Request { request: String, errno: Errno },

    /// The kernel's replies did not add up; the outcome of the batch is unknown and the
    /// ruleset should be read back (or rebuilt).
    #[error("incomplete replies to {request}: {detail}")]
    Incomplete { request: String, detail: String },

    #[error("malformed reply to {request}: {detail}")]
    Malformed { request: String, detail: String },
}

impl Error {
    pub(crate) fn io(operation: &'static str, source: io::Error) -> Error {
        Error::Io { operation, source }
    }

    /// The errno the kernel answered with, if this is a refusal.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Refused { errno, .. } | Error::Request { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// Whether the kernel answered that the object asked for does not exist.
    pub fn is_missing(&self) -> bool {
        self.errno() == Some(Errno(libc::ENOENT))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
