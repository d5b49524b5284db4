//! The node view: what every Service means on this node.
//!
//! nodus watches the API server once and keeps Services, EndpointSlices and Nodes here in a
//! compact form ([`model`]), decoded lean from the wire ([`wire`], [`decode`]). The rules of
//! [`resolve`] turn it into per-port endpoint sets for this node, the same answer for the
//! proxy, DNS, the mesh and external backends ([`output`]). Pure code: no I/O, no runtime.

pub mod decode;
pub mod intern;
pub mod model;
pub mod output;
pub mod resolve;
mod reverse;
pub mod view;
pub mod wire;

pub use decode::InvalidObject;
pub use intern::{Interner, Sym};
pub use view::{ApplyReport, ChangeSet, Counts, Kind, ServiceName, ServiceView, Update, View};

/// The view shared between the watch loop (its only writer) and the servers that answer
/// from it (DNS, health checks).
pub type SharedView = std::sync::Arc<std::sync::RwLock<View>>;
