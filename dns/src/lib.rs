//! Cluster DNS: the Kubernetes DNS specification 1.1.0 answered from the node view.
//!
//! [`lookup`] is the protocol: a question in, records out, computed from the view at query
//! time. [`forward`] sends every other name upstream, with a cache. [`handler`] answers a
//! request with both, as hickory-server's request handler. [`server`] puts the handler on
//! TCP through [`tcp`] and on UDP through [`udp`], whose fast path ([`fast`]) answers the
//! common questions from the packet bytes and leaves the rest to the handler.

pub mod allow;
pub mod autopath;
mod codes;
pub mod config;
pub mod fast;
pub mod forward;
pub mod handler;
pub mod hosts;
pub mod kube_dns;
pub mod listen;
pub mod lookup;
pub mod metrics;
pub mod querylog;
pub mod rate;
pub mod server;
pub mod subsystem;
pub mod tcp;
mod udp;

pub use lookup::{PodRecords, Zone};
pub use subsystem::start;
