//! What one client may hold of a listener: open connections in all and per client
//! address. Every listener nodus runs on a node (the HTTP endpoints, the health-check node
//! ports, DNS over TCP) takes a [`Slot`] for each connection it accepts and closes the
//! connection at once when none is left, so that a slow or hostile client on the node's
//! network holds at most its share and the kubelet's probe or a pod's query still gets in.
//! An eighth of the places is kept for the node itself (loopback, and a client whose
//! address is the one it connected to: the node's own, as kubelet's probe of a
//! host-network pod comes): pods holding every other place cannot starve the liveness
//! probe. Clients in the cluster's pod ranges ([`Tenants`]) together hold at most half of
//! the places, so that a load balancer's probe of a health-check node port, or a scraper
//! on another host, still gets in while pods hold all they may. [`accept`] is the accept
//! loop every such listener runs.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Connections closed over a cap since start, by listener (what [`accept`] calls it).
static REFUSED: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// Connections closed over a cap since start, by listener: the process exports them as
/// `nodus_connections_refused_total{listener}`.
pub fn refused() -> Vec<(&'static str, u64)> {
    let refused = REFUSED.lock().unwrap_or_else(|e| e.into_inner());
    refused
        .iter()
        .map(|(what, count)| (*what, *count))
        .collect()
}

/// One more connection closed over a cap of `what`; warned of at the 1st, 2nd, 4th… of
/// each listener, so that a client that keeps trying cannot fill the log.
fn count_refusal(what: &'static str, client: SocketAddr) {
    let total = {
        let mut refused = REFUSED.lock().unwrap_or_else(|e| e.into_inner());
        let count = refused.entry(what).or_default();
        *count += 1;
        *count
    };
    if total.is_power_of_two() {
        tracing::warn!(%client, total, "{what} connections over a cap closed (per client, for pods together, or in all)");
    }
}

/// The next connection on `listener` that fits under `caps`, with its place. One over a
/// cap is closed as it arrives, so its client learns at once, and counted ([`refused`]).
/// An accept error (out of descriptors, say) is logged and retried after a pause: the
/// port never closes for it. `what` names the listener in the log and the count.
pub async fn accept(
    listener: &TcpListener,
    caps: &ConnectionCaps,
    what: &'static str,
) -> (TcpStream, SocketAddr, Slot) {
    loop {
        match listener.accept().await {
            Ok((stream, client)) => match caps.take(client.ip(), stream.local_addr().ok()) {
                Some(slot) => return (stream, client, slot),
                None => count_refusal(what, client),
            },
            Err(error) => {
                tracing::warn!(%error, "accepting a {what} connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The share of a listener's places only the node itself may take: one in eight.
const RESERVED_SHARE: usize = 8;
/// The share of a listener's places the tenants' pods may hold together: one in two.
const TENANT_SHARE: usize = 2;

/// Which client addresses are tenants' pods: those in the cluster's pod ranges.
#[derive(Clone, Default)]
pub struct Tenants(Option<Arc<dyn Fn(IpAddr) -> bool + Send + Sync>>);

impl Tenants {
    /// The clients `is_pod` says are pods.
    pub fn within(is_pod: impl Fn(IpAddr) -> bool + Send + Sync + 'static) -> Tenants {
        Tenants(Some(Arc::new(is_pod)))
    }

    fn contains(&self, client: IpAddr) -> bool {
        self.0.as_ref().is_some_and(|is_pod| is_pod(client))
    }
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Some(_) => "Tenants(ranges)",
            None => "Tenants(none)",
        })
    }
}

/// Open connections, counted in all, from tenants and per client address; clones share
/// the counts.
#[derive(Clone, Debug)]
pub struct ConnectionCaps {
    total: usize,
    per_client: usize,
    tenants: Tenants,
    open: Arc<Mutex<Open>>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    from_tenants: usize,
    per_client: HashMap<IpAddr, usize>,
}

impl ConnectionCaps {
    /// At most `total` connections open, and `per_client` from one address.
    pub fn new(total: usize, per_client: usize) -> ConnectionCaps {
        ConnectionCaps {
            total,
            per_client,
            tenants: Tenants::default(),
            open: Arc::default(),
        }
    }

    /// With `tenants` holding at most half of the places together.
    pub fn with_tenants(self, tenants: Tenants) -> ConnectionCaps {
        ConnectionCaps { tenants, ..self }
    }

    /// A place for one more connection from `client` to `local` (the address it
    /// connected to), or `None` over a cap. The node itself may take the reserved places;
    /// others only the rest, and tenants only their share of it. The place is given back
    /// when the slot is dropped.
    pub fn take(&self, client: IpAddr, local: Option<SocketAddr>) -> Option<Slot> {
        let client = client.to_canonical();
        let from_node =
            client.is_loopback() || local.is_some_and(|l| l.ip().to_canonical() == client);
        let cap = if from_node {
            self.total
        } else {
            self.total - self.total / RESERVED_SHARE
        };
        let tenant = !from_node && self.tenants.contains(client);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let from_client = open.per_client.get(&client).copied().unwrap_or(0);
        if open.total >= cap
            || from_client >= self.per_client
            || (tenant && open.from_tenants >= self.total / TENANT_SHARE)
        {
            return None;
        }
        open.total += 1;
        open.from_tenants += usize::from(tenant);
        open.per_client.insert(client, from_client + 1);
        Some(Slot {
            open: self.open.clone(),
            client,
            tenant,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

/// One open connection's place under the caps.
#[derive(Debug)]
pub struct Slot {
    open: Arc<Mutex<Open>>,
    client: IpAddr,
    tenant: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total -= 1;
        open.from_tenants -= usize::from(self.tenant);
        if let Some(count) = open.per_client.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.per_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTENER: Option<SocketAddr> = Some(SocketAddr::new(
        IpAddr::V4(std::net::Ipv4Addr::new(192, 168, 1, 1)),
        10256,
    ));

    #[test]
    fn each_client_gets_its_share_and_the_total_is_bounded() {
        let caps = ConnectionCaps::new(3, 2);
        let (a, b, c) = (
            IpAddr::from([10, 0, 0, 1]),
            IpAddr::from([10, 0, 0, 2]),
            IpAddr::from([10, 0, 0, 3]),
        );
        let first = caps.take(a, LISTENER).expect("a's first");
        let second = caps.take(a, LISTENER).expect("a's second");
        assert!(caps.take(a, LISTENER).is_none(), "a's share is 2");
        let third = caps.take(b, LISTENER).expect("b's first");
        assert!(caps.take(c, LISTENER).is_none(), "3 in all");
        drop(first);
        assert!(caps.take(c, LISTENER).is_some(), "a place came back");
        drop((second, third));
        assert_eq!(caps.open(), 0);
        let again: Vec<Slot> = [a, a, b]
            .into_iter()
            .filter_map(|ip| caps.take(ip, LISTENER))
            .collect();
        assert_eq!(again.len(), 3);
    }

    #[test]
    fn the_node_itself_keeps_places_that_pods_cannot_take() {
        let caps = ConnectionCaps::new(16, 2);
        // Seven pods hold two each: 14 of 16, all that is not reserved.
        let pods: Vec<Slot> = (1..=7u8)
            .flat_map(|pod| [IpAddr::from([10, 244, 1, pod]); 2])
            .filter_map(|ip| caps.take(ip, LISTENER))
            .collect();
        assert_eq!(pods.len(), 14);
        assert!(caps.take(IpAddr::from([10, 244, 1, 8]), LISTENER).is_none());
        // The node's own address (kubelet's probe) and loopback still get in.
        let node = caps.take(IpAddr::from([192, 168, 1, 1]), LISTENER);
        let local = caps.take(IpAddr::from([127, 0, 0, 1]), LISTENER);
        assert!(node.is_some() && local.is_some());
        assert!(
            caps.take("::1".parse().expect("ip"), LISTENER).is_none(),
            "16 in all"
        );
    }

    #[test]
    fn pods_hold_half_the_places_and_a_load_balancer_gets_the_rest() {
        let pod_range = |ip: IpAddr| matches!(ip, IpAddr::V4(v4) if v4.octets()[..2] == [10, 244]);
        let caps = ConnectionCaps::new(16, 2).with_tenants(Tenants::within(pod_range));
        let pods: Vec<Slot> = (1..=8u8)
            .flat_map(|pod| [IpAddr::from([10, 244, 1, pod]); 2])
            .filter_map(|ip| caps.take(ip, LISTENER))
            .collect();
        assert_eq!(pods.len(), 8, "pods together hold half of 16");
        // A load balancer's probers, outside the pod ranges, take the rest but the node's.
        let probers: Vec<Slot> = (1..=4u8)
            .flat_map(|prober| [IpAddr::from([35, 191, 0, prober]); 2])
            .filter_map(|ip| caps.take(ip, LISTENER))
            .collect();
        assert_eq!(probers.len(), 6, "14 of 16 may go to others than the node");
        drop(pods);
        assert_eq!(caps.open(), 6);
        assert!(caps.take(IpAddr::from([10, 244, 2, 1]), LISTENER).is_some());
    }
}
