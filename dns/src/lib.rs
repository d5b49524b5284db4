//! Cluster DNS: the Kubernetes DNS specification 1.1.0 answered from the node view.
//!
//! [`subsystem`] is the front door: [`start`] builds DNS from its configuration section
//! ([`config`]). [`lookup`] is the protocol: a question in, records out, computed from the
//! view at query time. [`forward`] sends every other name upstream, with a cache.
//! [`handler`] is the one request pipeline every message goes through: its front (rate
//! limit, allow-list, the fast path of [`fast`], which answers the common questions from
//! the packet bytes), the full path with both, and its end (metrics, query log).
//! [`server`] puts it on TCP through [`tcp`] and on UDP through [`udp`].

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
