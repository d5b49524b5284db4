//! The nodus test bed: a real Kubernetes control plane built from its published modules, a
//! stand-in for the Kubernetes API server (for the faults a real one cannot be made to
//! show), network namespaces as nodes and pods, and the pieces the scale bench and the
//! sandbox share.

pub mod apiserver;
pub mod bench;
pub mod control_plane;
pub mod dig;
pub mod fixtures;
pub mod heap;
pub mod interrupt;
pub mod kubelet;
pub mod netns;
pub mod nft_commits;
pub mod nodus_image;
pub mod probe;
pub mod runtime;
pub mod sandbox;
pub mod scale;
