//! The subscription socket's format: JSON lines both ways, documented in
//! `docs/backends.md` so that a client in any language needs nothing else.
//!
//! The client sends one line, [`Hello`]. The agent then sends, for as long as the client
//! reads: a [`Control::Snapshot`] line followed by every service and node, or (when the
//! hello's `since` is still in the journal) only what changed after it; then one
//! [`Control::Synced`] line after every batch's lines. Service and node lines are
//! `nodus view --watch`'s ([`nodus_view::output::ChangeLine`]). A client cut off is sent
//! [`Control::Error`] when the socket still takes it, and closed.

use serde::{Deserialize, Serialize};

/// The longest hello line the agent reads.
pub const HELLO_MAX: usize = 1024;

/// The client's one line.
#[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The last batch the client finished (its last `Synced` line), to be sent only what
    /// changed after it. Absent: a snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Since>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Since {
    /// The `epoch` of the snapshot the client started from.
    pub epoch: String,
    pub seq: u64,
}

/// The agent's lines that are not a service or node.
#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "kind")]
pub enum Control {
    /// Everything follows: drop what you held. `epoch` names this agent process's
    /// numbering; `node` is the node whose view it is.
    Snapshot {
        epoch: String,
        seq: u64,
        node: String,
    },
    /// Every change up to batch `seq` has been sent.
    Synced { seq: u64 },
    /// Why the agent closes the connection.
    Error { reason: String },
}

impl Control {
    pub fn write(&self, out: &mut Vec<u8>) {
        // A plain struct of strings and numbers: serialising it cannot fail.
        if serde_json::to_writer(&mut *out, self).is_ok() {
            out.push(b'\n');
        }
    }
}

/// Any line from the agent, as far as a client needs to tell them apart: its kind, and
/// for a service or node its name (the object is left unparsed).
#[derive(Debug, Deserialize)]
pub struct AnyLine {
    pub kind: String,
    #[serde(default)]
    pub seq: u64,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub epoch: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub object: Option<serde::de::IgnoredAny>,
}
