//! A sampled query log, as CoreDNS's `log` plugin: one query in N is logged at info level
//! with who asked, what, over which transport, and what they got. Sampling keeps the cost
//! and the volume bounded on a busy node; the counters of [`crate::metrics`] count them all.

use crate::codes::{RCODES, rcode_index};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Default)]
pub struct QueryLog {
    /// One query in this many is logged; 0 none.
    every: u64,
    seen: AtomicU64,
}

impl QueryLog {
    pub fn new(every: u32) -> QueryLog {
        QueryLog {
            every: u64::from(every),
            seen: AtomicU64::new(0),
        }
    }

    /// Whether this query is one to log.
    pub fn sampled(&self) -> bool {
        self.every > 0 && self.seen.fetch_add(1, Relaxed).is_multiple_of(self.every)
    }

    /// Logs one query.
    pub fn log(
        client: SocketAddr,
        name: &dyn std::fmt::Display,
        qtype: RecordType,
        tcp: bool,
        rcode: ResponseCode,
        took: Duration,
    ) {
        // As dig names them (NOERROR), or the number for the rarer codes.
        let rcode = match rcode_index(rcode) {
            index if index < RCODES.len() - 1 => RCODES[index].to_string(),
            _ => u16::from(rcode).to_string(),
        };
        tracing::info!(
            target: "nodus::dns::query",
            %client,
            %name,
            %qtype,
            proto = if tcp { "tcp" } else { "udp" },
            rcode,
            micros = took.as_micros() as u64,
            "query"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_query_in_n_is_sampled() {
        let log = QueryLog::new(3);
        let sampled: Vec<bool> = (0..7).map(|_| log.sampled()).collect();
        assert_eq!(sampled, [true, false, false, true, false, false, true]);
        let off = QueryLog::new(0);
        assert!((0..10).all(|_| !off.sampled()));
    }
}
