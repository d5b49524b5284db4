//! End-to-end tests: the real `nodus` binary against the API-server stand-in over HTTP.

mod agent;
mod cni;
mod deploy;
mod dns;
mod faults;
mod mesh;
mod operate;
mod policy;
mod proxy;
mod proxy_packets;
mod sandbox;
mod support;
mod upgrade;
mod view;
