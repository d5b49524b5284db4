//! Cluster DNS: the Kubernetes DNS specification 1.1.0 answered from the node view.
//!
//! [`lookup`] is the protocol: a question in, records out, computed from the view at query
//! time. [`forward`] sends every other name upstream, with a cache. [`server`] puts both on
//! UDP and TCP sockets through hickory-server.

pub mod forward;
pub mod lookup;
pub mod metrics;
pub mod server;

pub use lookup::{PodRecords, Zone};
