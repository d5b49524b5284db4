//! The nftables service proxy: kube-proxy's semantics, planned from the node view and
//! programmed into the kernel over nf_tables netlink.

pub mod apply;
pub mod config;
pub mod health;
pub mod kernel;
pub mod leftovers;
pub mod metrics;
pub mod nft;
pub mod plan;
pub mod subsystem;
pub mod sysctls;
