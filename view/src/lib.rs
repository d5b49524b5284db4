//! The node view: what every Service means on this node.
//!
//! nodus watches the API server once and keeps Services, EndpointSlices, Nodes and this
//! node's Pods here in a compact form ([`model`]), decoded lean from the wire ([`wire`],
//! [`decode`]). The rules of
//! [`resolve`] turn it into per-port endpoint sets for this node, the same answer for the
//! proxy, DNS, the mesh and external backends ([`output`]). The process shares it through
//! one writer and many readers ([`shared`]), and every subsystem consumes it through one
//! contract ([`subsystem`]). Pure code: no I/O, no runtime.

#![forbid(unsafe_code)]

pub mod config;
pub mod decode;
pub mod intern;
pub mod model;
pub mod output;
pub mod policy;
pub mod ranges;
pub mod resolve;
mod reverse;
pub mod shared;
pub mod subsystem;
pub mod view;
pub mod wire;

pub use decode::InvalidObject;
pub use intern::{Interner, Sym};
pub use shared::{ViewReader, ViewWriter};
pub use subsystem::{Applied, Subsystem};
pub use view::{
    ApplyReport, ChangeSet, Counts, Kind, LocalPodView, ServiceName, ServiceRef, ServiceView,
    SnapshotError, Update, View,
};
