//! What the pod source check dropped (`skeleton::pod_source_check`): the counters of its
//! counted sets, read back from the kernel.

use super::{Error, Proxy};
use crate::nft::Table;
use crate::plan::{PodDrop, TABLE};

impl Proxy {
    /// Packets the pod source check dropped, per kind, since its sets were made (they stay
    /// through syncs and restarts of the agent); nothing without the check.
    pub fn pod_drops(&mut self) -> Result<Vec<(PodDrop, u64)>, Error> {
        if self.config.pod_link_group.is_none() {
            return Ok(Vec::new());
        }
        let table = Table::inet(TABLE);
        let mut drops = Vec::with_capacity(PodDrop::ALL.len());
        for drop in PodDrop::ALL {
            let set = drop.set();
            let packets = self
                .socket
                .list_elements(&table, &set)
                .map_err(Error::netlink(format!("reading the counter of {set}")))?
                .iter()
                .filter_map(|element| element.packets)
                .sum();
            drops.push((drop, packets));
        }
        Ok(drops)
    }
}
