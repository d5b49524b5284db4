//! What one client may hold of a listener: open connections in all and per client
//! address. Every listener nodus runs on a node (the HTTP endpoints, the health-check node
//! ports, DNS over TCP) takes a [`Slot`] for each connection it accepts and closes the
//! connection at once when none is left, so that a slow or hostile client on the node's
//! network holds at most its share and the kubelet's probe or a pod's query still gets in.
//! [`accept`] is the accept loop every such listener runs.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// The next connection on `listener` that fits under `caps`, with its place. One over a
/// cap is closed as it arrives, so its client learns at once. An accept error (out of
/// descriptors, say) is logged and retried after a pause: the port never closes for it.
/// `what` names the listener in the log.
pub async fn accept(
    listener: &TcpListener,
    caps: &ConnectionCaps,
    what: &str,
) -> (TcpStream, SocketAddr, Slot) {
    loop {
        match listener.accept().await {
            Ok((stream, client)) => match caps.take(client.ip()) {
                Some(slot) => return (stream, client, slot),
                None => tracing::debug!(%client, "{what} connection over the cap closed"),
            },
            Err(error) => {
                tracing::warn!(%error, "accepting a {what} connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Open connections, counted in all and per client address; clones share the counts.
#[derive(Clone, Debug)]
pub struct ConnectionCaps {
    total: usize,
    per_client: usize,
    open: Arc<Mutex<Open>>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
}

impl ConnectionCaps {
    /// At most `total` connections open, and `per_client` from one address.
    pub fn new(total: usize, per_client: usize) -> ConnectionCaps {
        ConnectionCaps {
            total,
            per_client,
            open: Arc::default(),
        }
    }

    /// A place for one more connection from `client`, or `None` over a cap. The place is
    /// given back when the slot is dropped.
    pub fn take(&self, client: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let from_client = open.per_client.get(&client).copied().unwrap_or(0);
        if open.total >= self.total || from_client >= self.per_client {
            return None;
        }
        open.total += 1;
        open.per_client.insert(client, from_client + 1);
        Some(Slot {
            open: self.open.clone(),
            client,
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
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total -= 1;
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

    #[test]
    fn each_client_gets_its_share_and_the_total_is_bounded() {
        let caps = ConnectionCaps::new(3, 2);
        let (a, b, c) = (
            IpAddr::from([10, 0, 0, 1]),
            IpAddr::from([10, 0, 0, 2]),
            IpAddr::from([10, 0, 0, 3]),
        );
        let first = caps.take(a).expect("a's first");
        let second = caps.take(a).expect("a's second");
        assert!(caps.take(a).is_none(), "a's share is 2");
        let third = caps.take(b).expect("b's first");
        assert!(caps.take(c).is_none(), "3 in all");
        drop(first);
        assert!(caps.take(c).is_some(), "a place came back");
        drop((second, third));
        assert_eq!(caps.open(), 0);
        let again: Vec<Slot> = [a, a, b]
            .into_iter()
            .filter_map(|ip| caps.take(ip))
            .collect();
        assert_eq!(again.len(), 3);
    }
}
