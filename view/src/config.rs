//! What every subsystem's configuration section shares: the facts about the whole
//! cluster from the configuration's top level, and how a section says that a value of
//! it cannot be used.

use crate::model::Cidr;

/// The cluster's facts that several subsystems need, from the top of the configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cluster {
    /// The DNS zone of the cluster (`cluster.local`).
    pub domain: String,
    /// Pod address ranges of the whole cluster; empty: the Nodes' pod CIDRs.
    pub cluster_cidrs: Vec<Cidr>,
    /// Service address ranges, for clusters without ServiceCIDR objects.
    pub service_cidrs: Vec<Cidr>,
}

/// A value of a configuration section that cannot be used; the message names the key.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct Invalid(pub String);

/// `Ok` when `holds`, else the message as [`Invalid`].
pub fn check(holds: bool, message: impl FnOnce() -> String) -> Result<(), Invalid> {
    if holds {
        Ok(())
    } else {
        Err(Invalid(message()))
    }
}
