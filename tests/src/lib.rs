//! The nodus test bed: a stand-in for the Kubernetes API server, network namespaces as
//! nodes and pods, and the pieces the scale bench and the sandbox share.

pub mod apiserver;
pub mod bench;
pub mod cni;
pub mod netns;
pub mod probe;
pub mod scale;
