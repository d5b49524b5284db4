//! DNS metrics: requests by type, responses by code, latency, forwarding and the cache;
//! nodus's own names, and CoreDNS's ([`DnsMetrics::render_coredns`]) so that the dashboards
//! and alerts of a cluster that ran CoreDNS keep working.

use crate::autopath::Walked;
use crate::codes::{RCODES, rcode_index};
use crate::forward::Forwarder;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use nodus_prom::{Histogram, family, sample, single};
use std::net::SocketAddr;
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

/// The labels CoreDNS puts on its series for kubeadm's server block `.:53`.
const COREDNS_SERVER: &str = "server=\"dns://:53\",zone=\".\"";
const COREDNS_CACHE: &str = "server=\"dns://:53\",zones=\".\"";

/// A family of CoreDNS's cache split by its `type` label: `success` (of `all`) and `denial`.
/// The two counters are read one after the other, so the difference saturates.
fn coredns_cache_types(
    out: &mut String,
    (name, kind): (&str, &str),
    help: &str,
    all: u64,
    denials: u64,
) {
    family(out, name, kind, help);
    for (type_, count) in [
        ("success", all.saturating_sub(denials)),
        ("denial", denials),
    ] {
        sample(
            out,
            name,
            &format!("{COREDNS_CACHE},type=\"{type_}\""),
            count,
        );
    }
}

/// How a request came (CoreDNS's `proto` and `family` labels).
#[derive(Clone, Copy, Debug)]
pub struct Transport {
    pub tcp: bool,
    pub ipv6: bool,
}

impl Transport {
    /// A request from `client`, over TCP or UDP.
    pub fn of(client: SocketAddr, tcp: bool) -> Transport {
        Transport {
            tcp,
            ipv6: client.ip().to_canonical().is_ipv6(),
        }
    }

    const ALL: usize = 4;

    fn index(self) -> usize {
        usize::from(self.tcp) * 2 + usize::from(self.ipv6)
    }

    /// CoreDNS's labels for the transport of `index`.
    fn labels(index: usize) -> &'static str {
        [
            "proto=\"udp\",family=\"1\"",
            "proto=\"udp\",family=\"2\"",
            "proto=\"tcp\",family=\"1\"",
            "proto=\"tcp\",family=\"2\"",
        ][index]
    }
}

pub struct DnsMetrics {
    /// By query type, and by transport.
    requests: [[AtomicU64; Transport::ALL]; QTYPES.len()],
    responses: [AtomicU64; RCODES.len()],
    latency: Histogram<{ LATENCY_BUCKETS.len() }>,
    forwarder: Option<Arc<Forwarder>>,
    /// Responses over the rate limit ([`crate::rate`]): dropped, and sent truncated.
    rate_limited: [AtomicU64; 2],
    /// Autopath walks by how they ended ([`Walked`]).
    walks: [AtomicU64; Walked::ALL.len()],
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
            walks: Default::default(),
        }
    }

    /// One answered request (a request without a single question counts under `other`);
    /// its time is observed with its batch's ([`DnsMetrics::observed`]).
    pub fn counted(&self, qtype: RecordType, transport: Transport, rcode: ResponseCode) {
        self.requests[qtype_index(qtype)][transport.index()].fetch_add(1, Relaxed);
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

    pub fn walked(&self, walked: Walked) {
        self.walks[walked as usize].fetch_add(1, Relaxed);
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the exposition: one family after another"
    )]
    pub fn render(&self, out: &mut String) {
        family(
            out,
            "nodus_dns_requests_total",
            "counter",
            "DNS requests by query type.",
        );
        for (qtype, counts) in QTYPES.iter().zip(&self.requests) {
            sample(
                out,
                "nodus_dns_requests_total",
                &format!("qtype=\"{qtype}\""),
                counts.iter().map(|c| c.load(Relaxed)).sum::<u64>(),
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
        family(
            out,
            "nodus_dns_autopath_total",
            "counter",
            "Questions of a pod's search list walked by the server (autopath), by outcome.",
        );
        for (walked, count) in Walked::ALL.iter().zip(&self.walks) {
            let labels = format!("result=\"{}\"", walked.as_str());
            sample(
                out,
                "nodus_dns_autopath_total",
                &labels,
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
                "nodus_dns_upstreams_down",
                "gauge",
                "Upstreams that failed twice in a row and have not answered a health check since.",
                forwarder.upstreams().iter().filter(|u| u.is_down()).count(),
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

    /// The same counts under CoreDNS's names and labels (its `metrics`, `cache` and
    /// `forward` plugins), as kubeadm's Corefile serves them. Series that never counted
    /// are left out, as CoreDNS leaves them out.
    #[expect(
        clippy::too_many_lines,
        reason = "the exposition: one family after another"
    )]
    pub fn render_coredns(&self, out: &mut String) {
        family(
            out,
            "coredns_dns_requests_total",
            "counter",
            "Counter of DNS requests made per zone, protocol and family.",
        );
        for (qtype, counts) in QTYPES.iter().zip(&self.requests) {
            for (transport, count) in counts.iter().enumerate() {
                let count = count.load(Relaxed);
                if count > 0 {
                    let transport = Transport::labels(transport);
                    let labels = format!("{COREDNS_SERVER},{transport},type=\"{qtype}\"");
                    sample(out, "coredns_dns_requests_total", &labels, count);
                }
            }
        }
        family(
            out,
            "coredns_dns_responses_total",
            "counter",
            "Counter of response status codes.",
        );
        for (rcode, count) in RCODES.iter().zip(&self.responses) {
            let count = count.load(Relaxed);
            if count > 0 {
                let labels = format!("{COREDNS_SERVER},rcode=\"{rcode}\"");
                sample(out, "coredns_dns_responses_total", &labels, count);
            }
        }
        family(
            out,
            "coredns_autopath_success_total",
            "counter",
            "Counter of requests that did autopath.",
        );
        sample(
            out,
            "coredns_autopath_success_total",
            "server=\"dns://:53\"",
            self.walks[Walked::Answered as usize].load(Relaxed),
        );
        family(
            out,
            "coredns_dns_request_duration_seconds",
            "histogram",
            "Histogram of the time (in seconds) each request took.",
        );
        self.latency
            .samples(out, "coredns_dns_request_duration_seconds", COREDNS_SERVER);
        let Some(forwarder) = &self.forwarder else {
            return;
        };
        let stats = &forwarder.stats;
        let (entries, denials) = forwarder.cache_entries_and_denials();
        coredns_cache_types(
            out,
            ("coredns_cache_entries", "gauge"),
            "The number of elements in the cache.",
            entries as u64,
            denials as u64,
        );
        coredns_cache_types(
            out,
            ("coredns_cache_hits_total", "counter"),
            "The count of cache hits.",
            stats.cache_hits.load(Relaxed),
            stats.cache_denial_hits.load(Relaxed),
        );
        for (name, help, count) in [
            (
                "coredns_cache_misses_total",
                "The count of cache misses.",
                &stats.cache_misses,
            ),
            (
                "coredns_cache_served_stale_total",
                "The number of requests served from stale cache entries.",
                &stats.served_stale,
            ),
            (
                "coredns_cache_prefetch_total",
                "The number of times the cache has prefetched a cached item.",
                &stats.prefetches,
            ),
        ] {
            family(out, name, "counter", help);
            sample(out, name, COREDNS_CACHE, count.load(Relaxed));
        }
        let upstreams = forwarder.upstreams();
        family(
            out,
            "coredns_proxy_request_duration_seconds",
            "histogram",
            "Histogram of the time each request took.",
        );
        for upstream in &upstreams {
            for (rcode, latency) in RCODES.iter().zip(&upstream.stats.latency) {
                if latency.count() > 0 {
                    let labels = format!(
                        "proxy_name=\"forward\",to=\"{}\",rcode=\"{rcode}\"",
                        upstream.addr
                    );
                    latency.samples(out, "coredns_proxy_request_duration_seconds", &labels);
                }
            }
        }
        family(
            out,
            "coredns_proxy_healthcheck_failures_total",
            "counter",
            "Count of failed health checks per upstream.",
        );
        for upstream in &upstreams {
            let labels = format!("proxy_name=\"forward\",to=\"{}\"", upstream.addr);
            let failures = upstream.stats.healthcheck_failures.load(Relaxed);
            sample(
                out,
                "coredns_proxy_healthcheck_failures_total",
                &labels,
                failures,
            );
        }
        single(
            out,
            "coredns_forward_healthcheck_broken_total",
            "counter",
            "Counter of the number of complete failures of the health checks.",
            stats.all_down.load(Relaxed),
        );
        single(
            out,
            "coredns_forward_max_concurrent_rejects_total",
            "counter",
            "Counter of the number of queries rejected because the concurrent queries were at maximum.",
            stats.refused.load(Relaxed),
        );
    }
}
