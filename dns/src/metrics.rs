//! DNS metrics: requests by type, responses by code, latency, forwarding and the cache.

use crate::codes::{RCODES, rcode_index};
use crate::forward::Forwarder;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use nodus_prom::{Histogram, family, sample, single};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const QTYPES: [&str; 10] = [
    "A", "AAAA", "SRV", "PTR", "TXT", "SOA", "NS", "CNAME", "ANY", "other",
];
/// Upper bounds of the latency histogram, in seconds: loopback answers take microseconds,
/// forwarded ones milliseconds.
const LATENCY_BUCKETS: [f64; 9] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.025, 0.1, 1.0,
];

pub struct DnsMetrics {
    requests: [AtomicU64; QTYPES.len()],
    responses: [AtomicU64; RCODES.len()],
    latency: Histogram<{ LATENCY_BUCKETS.len() }>,
    forwarder: Option<Arc<Forwarder>>,
    /// Responses over the rate limit ([`crate::rate`]): dropped, and sent truncated.
    rate_limited: [AtomicU64; 2],
}

/// Indexes into [`QTYPES`]; a match, not a search, because every query counts.
fn qtype_index(qtype: RecordType) -> usize {
    match qtype {
        RecordType::A => 0,
        RecordType::AAAA => 1,
        RecordType::SRV => 2,
        RecordType::PTR => 3,
        RecordType::TXT => 4,
        RecordType::SOA => 5,
        RecordType::NS => 6,
        RecordType::CNAME => 7,
        RecordType::ANY => 8,
        _ => QTYPES.len() - 1,
    }
}

impl DnsMetrics {
    pub fn new(forwarder: Option<Arc<Forwarder>>) -> DnsMetrics {
        DnsMetrics {
            requests: Default::default(),
            responses: Default::default(),
            latency: Histogram::new(LATENCY_BUCKETS),
            forwarder,
            rate_limited: Default::default(),
        }
    }

    /// One answered request; `qtype` is `None` when the request had no single question.
    pub fn answered(&self, qtype: Option<RecordType>, rcode: ResponseCode, took: Duration) {
        let q = qtype.map_or(QTYPES.len() - 1, qtype_index);
        self.requests[q].fetch_add(1, Relaxed);
        self.responses[rcode_index(rcode)].fetch_add(1, Relaxed);
        self.latency.observe(took);
    }

    /// One request the UDP fast path answered; its time is observed per batch.
    pub fn counted(&self, qtype: RecordType, rcode: ResponseCode) {
        self.requests[qtype_index(qtype)].fetch_add(1, Relaxed);
        self.responses[rcode_index(rcode)].fetch_add(1, Relaxed);
    }

    /// `count` requests answered together in `took`, from receipt to the send.
    pub fn observed(&self, took: Duration, count: u64) {
        self.latency.observe_many(took, count);
    }

    /// One response over the rate limit: dropped, or sent truncated (`slipped`).
    pub fn rate_limited(&self, slipped: bool) {
        self.rate_limited[usize::from(slipped)].fetch_add(1, Relaxed);
    }

    pub fn render(&self, out: &mut String) {
        family(
            out,
            "nodus_dns_requests_total",
            "counter",
            "DNS requests by query type.",
        );
        for (qtype, count) in QTYPES.iter().zip(&self.requests) {
            sample(
                out,
                "nodus_dns_requests_total",
                &format!("qtype=\"{qtype}\""),
                count.load(Relaxed),
            );
        }
        family(
            out,
            "nodus_dns_responses_total",
            "counter",
            "DNS responses by response code.",
        );
        for (rcode, count) in RCODES.iter().zip(&self.responses) {
            sample(
                out,
                "nodus_dns_responses_total",
                &format!("rcode=\"{rcode}\""),
                count.load(Relaxed),
            );
        }
        family(
            out,
            "nodus_dns_rate_limited_total",
            "counter",
            "UDP responses over a client prefix's rate: dropped, or sent truncated (slip).",
        );
        for (action, count) in ["drop", "slip"].iter().zip(&self.rate_limited) {
            sample(
                out,
                "nodus_dns_rate_limited_total",
                &format!("action=\"{action}\""),
                count.load(Relaxed),
            );
        }
        self.latency.render(
            out,
            "nodus_dns_request_duration_seconds",
            "Time from a request's arrival to its response being handed to the socket.",
        );
        if let Some(forwarder) = &self.forwarder {
            let stats = &forwarder.stats;
            single(
                out,
                "nodus_dns_forwarded_total",
                "counter",
                "Questions sent upstream.",
                stats.forwarded.load(Relaxed),
            );
            single(
                out,
                "nodus_dns_forward_failures_total",
                "counter",
                "Questions no upstream answered.",
                stats.failures.load(Relaxed),
            );
            single(
                out,
                "nodus_dns_forward_refused_total",
                "counter",
                "Questions refused because max_concurrent were upstream already.",
                stats.refused.load(Relaxed),
            );
            single(
                out,
                "nodus_dns_cache_hits_total",
                "counter",
                "Forwarded questions answered from the cache.",
                stats.cache_hits.load(Relaxed),
            );
            single(
                out,
                "nodus_dns_upstreams_looping",
                "gauge",
                "Upstreams left out because they sent our loop probe back to us.",
                forwarder.looping_upstreams().len() as u64,
            );
            let (entries, bytes) = forwarder.cache_size();
            single(
                out,
                "nodus_dns_cache_entries",
                "gauge",
                "Answers in the forwarding cache.",
                entries,
            );
            single(
                out,
                "nodus_dns_cache_bytes",
                "gauge",
                "Wire size of the answers in the forwarding cache.",
                bytes,
            );
        }
    }
}
