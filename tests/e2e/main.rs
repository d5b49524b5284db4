//! End-to-end tests: the real `nodus` binary against a real control plane
//! (`control_plane.rs`) and against the API-server stand-in.

#![allow(
    clippy::too_many_lines,
    reason = "a test or bench reads as one story, top to bottom"
)]

mod agent;
mod cni;
mod control_plane;
mod deploy;
mod dns;
mod faults;
mod mesh;
mod migration;
mod operate;
mod policy;
mod proxy;
mod proxy_packets;
mod real_nodes;
mod sandbox;
mod subscribe;
mod support;
mod upgrade;
mod view;
