//! DNS metrics: requests by type, responses by code, latency, forwarding and the cache;
//! nodus's own names, and CoreDNS's ([`DnsMetrics::render_coredns`]) so that the dashboards
//! and alerts of a cluster that ran CoreDNS keep working.

use crate::autopath::Walked;
use crate::codes::{RCODES, rcode_index};
use crate::forward::Forwarder;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use nodus_prom::{ConstCounter, ConstGauge, Counter, Exported, Families, Histogram};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
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
const COREDNS_SERVER: [(&str, &str); 2] = [("server", "dns://:53"), ("zone", ".")];
const COREDNS_CACHE: [(&str, &str); 2] = [("server", "dns://:53"), ("zones", ".")];

/// The series of a CoreDNS cache family split by its `type` label: `success` (of `all`)
/// and `denial`. The two counts are read one after the other, so the difference saturates.
fn coredns_cache_types(all: u64, denials: u64) -> [([(&'static str, &'static str); 3], u64); 2] {
    [
        ("success", all.saturating_sub(denials)),
        ("denial", denials),
    ]
    .map(|(type_, count)| {
        let [server, zones] = COREDNS_CACHE;
        ([server, zones, ("type", type_)], count)
    })
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

    /// CoreDNS's `proto` and `family` for the transport of `index`.
    fn labels(index: usize) -> [(&'static str, &'static str); 2] {
        let proto = if index >= 2 { "tcp" } else { "udp" };
        let family = if index % 2 == 1 { "2" } else { "1" };
        [("proto", proto), ("family", family)]
    }
}

pub struct DnsMetrics {
    /// By query type, and by transport.
    requests: [[Counter; Transport::ALL]; QTYPES.len()],
    responses: [Counter; RCODES.len()],
    latency: Histogram<{ LATENCY_BUCKETS.len() }>,
    forwarder: Option<Arc<Forwarder>>,
    /// Responses over the rate limit ([`crate::rate`]): dropped, and sent truncated.
    rate_limited: [Counter; 2],
    /// Responses judged in the bucket new clients share while the rate table is full.
    rate_table_full: Counter,
    /// Autopath walks by how they ended ([`Walked`]).
    walks: [Counter; Walked::ALL.len()],
    /// TCP connections closed for a client that does not read, by [`TcpClosed`].
    tcp_closed: [Counter; 2],
}

/// Why a TCP connection was closed before its client did ([`crate::tcp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpClosed {
    /// A reply found no room in its connection's or its address's budget in time: the
    /// client does not read what it asked for.
    NoRoom,
    /// A reply could not be written in time.
    WriteTimeout,
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
            rate_table_full: Counter::default(),
            walks: Default::default(),
            tcp_closed: Default::default(),
        }
    }

    /// One answered request (a request without a single question counts under `other`);
    /// its time is observed with its batch's ([`DnsMetrics::observed`]).
    pub fn counted(&self, qtype: RecordType, transport: Transport, rcode: ResponseCode) {
        self.requests[qtype_index(qtype)][transport.index()].inc();
        self.responses[rcode_index(rcode)].inc();
    }

    /// `count` requests answered together in `took`, from receipt to the send.
    pub fn observed(&self, took: Duration, count: u64) {
        self.latency.observe_many(took, count);
    }

    /// One response over the rate limit: dropped, or sent truncated (`slipped`).
    pub fn rate_limited(&self, slipped: bool) {
        self.rate_limited[usize::from(slipped)].inc();
    }

    /// One response judged in the shared bucket: the rate table is full; warned of at
    /// the 1st, 2nd, 4th… so that a flood cannot fill the log.
    pub fn rate_table_full(&self) {
        self.rate_table_full.inc();
        let total = self.rate_table_full.get();
        if total.is_power_of_two() {
            tracing::warn!(
                total,
                clients = crate::rate::MAX_CLIENTS,
                "the DNS rate limit's table is full of active clients: new ones share one bucket"
            );
        }
    }

    pub fn walked(&self, walked: Walked) {
        self.walks[walked as usize].inc();
    }

    /// A TCP connection closed because its client does not read its replies; how many
    /// were, for either reason.
    pub fn tcp_closed(&self, why: TcpClosed) -> u64 {
        self.tcp_closed[why as usize].inc();
        self.tcp_closed.iter().map(Counter::get).sum()
    }
}

/// A count as a gauge's value.
fn gauge(count: usize) -> ConstGauge {
    ConstGauge::new(i64::try_from(count).unwrap_or(i64::MAX))
}

impl Exported for DnsMetrics {
    fn export(&self, families: &mut Families<'_>) -> fmt::Result {
        self.export_own(families)?;
        if let Some(forwarder) = &self.forwarder {
            export_forwarding(forwarder, families)?;
        }
        self.export_coredns(families)
    }
}

impl DnsMetrics {
    fn export_own(&self, families: &mut Families<'_>) -> fmt::Result {
        families.labelled(
            "nodus_dns_requests",
            "DNS requests by query type.",
            QTYPES.iter().zip(&self.requests).map(|(qtype, counts)| {
                let count = counts.iter().map(Counter::get).sum::<u64>();
                ([("qtype", *qtype)], ConstCounter::new(count))
            }),
        )?;
        families.labelled(
            "nodus_dns_responses",
            "DNS responses by response code.",
            RCODES
                .iter()
                .zip(&self.responses)
                .map(|(rcode, count)| ([("rcode", *rcode)], count.clone())),
        )?;
        families.labelled(
            "nodus_dns_rate_limited",
            "UDP responses over a client address's rate: dropped, or sent truncated (slip).",
            ["drop", "slip"]
                .iter()
                .zip(&self.rate_limited)
                .map(|(action, count)| ([("action", *action)], count.clone())),
        )?;
        families.one(
            "nodus_dns_rate_limit_table_full",
            "UDP responses judged in the bucket new clients share because the rate limit's table holds 16,384 clients, none idle.",
            &self.rate_table_full,
        )?;
        families.labelled(
            "nodus_dns_tcp_connections_closed",
            "TCP connections closed because the client does not read its replies: a reply found no room in the connection's or the address's budget of reply bytes (no-room), or could not be written (write-timeout), within 2 s.",
            ["no-room", "write-timeout"]
                .iter()
                .zip(&self.tcp_closed)
                .map(|(reason, count)| ([("reason", *reason)], count.clone())),
        )?;
        families.labelled(
            "nodus_dns_autopath",
            "Questions of a pod's search list walked by the server (autopath), by outcome.",
            Walked::ALL
                .iter()
                .zip(&self.walks)
                .map(|(walked, count)| ([("result", walked.as_str())], count.clone())),
        )?;
        families.one(
            "nodus_dns_request_duration_seconds",
            "Time from a request's arrival to its response being handed to the socket.",
            &self.latency,
        )
    }

    /// The same counts under CoreDNS's names and labels (its `metrics`, `cache` and
    /// `forward` plugins), as kubeadm's Corefile serves them. Series that never counted
    /// are left out, as CoreDNS leaves them out.
    fn export_coredns(&self, families: &mut Families<'_>) -> fmt::Result {
        families.labelled(
            "coredns_dns_requests",
            "Counter of DNS requests made per zone, protocol and family.",
            QTYPES
                .iter()
                .zip(&self.requests)
                .flat_map(|(qtype, counts)| {
                    counts
                        .iter()
                        .enumerate()
                        .filter(|(_, count)| count.get() > 0)
                        .map(|(transport, count)| {
                            let [server, zone] = COREDNS_SERVER;
                            let [proto, family] = Transport::labels(transport);
                            (
                                [server, zone, proto, family, ("type", *qtype)],
                                count.clone(),
                            )
                        })
                }),
        )?;
        families.labelled(
            "coredns_dns_responses",
            "Counter of response status codes.",
            RCODES
                .iter()
                .zip(&self.responses)
                .filter(|(_, count)| count.get() > 0)
                .map(|(rcode, count)| {
                    let [server, zone] = COREDNS_SERVER;
                    ([server, zone, ("rcode", *rcode)], count.clone())
                }),
        )?;
        families.labelled(
            "coredns_autopath_success",
            "Counter of requests that did autopath.",
            [(
                [("server", "dns://:53")],
                self.walks[Walked::Answered as usize].clone(),
            )],
        )?;
        families.labelled(
            "coredns_dns_request_duration_seconds",
            "Histogram of the time (in seconds) each request took.",
            [(COREDNS_SERVER, &self.latency)],
        )?;
        if let Some(forwarder) = &self.forwarder {
            export_coredns_forwarding(forwarder, families)?;
        }
        Ok(())
    }
}

/// The forwarder's and its cache's families under nodus's names.
fn export_forwarding(forwarder: &Forwarder, families: &mut Families<'_>) -> fmt::Result {
    let stats = &forwarder.stats;
    for (name, help, count) in [
        (
            "nodus_dns_forwarded",
            "Questions sent upstream.",
            &stats.forwarded,
        ),
        (
            "nodus_dns_forward_failures",
            "Questions no upstream answered.",
            &stats.failures,
        ),
        (
            "nodus_dns_forward_refused",
            "Questions refused because max_concurrent were upstream already.",
            &stats.refused,
        ),
        (
            "nodus_dns_cache_hits",
            "Forwarded questions answered from the cache.",
            &stats.cache_hits,
        ),
    ] {
        families.one(name, help, &ConstCounter::new(count.load(Relaxed)))?;
    }
    families.one(
        "nodus_dns_upstreams_down",
        "Upstreams that failed twice in a row and have not answered a health check since.",
        &gauge(forwarder.upstreams().iter().filter(|u| u.is_down()).count()),
    )?;
    families.one(
        "nodus_dns_upstreams_looping",
        "Upstreams left out because they sent our loop probe back to us.",
        &gauge(forwarder.looping_upstreams().len()),
    )?;
    let (entries, bytes) = forwarder.cache_size();
    families.one(
        "nodus_dns_cache_entries",
        "Answers in the forwarding cache.",
        &gauge(entries),
    )?;
    families.one(
        "nodus_dns_cache_bytes",
        "Wire size of the answers in the forwarding cache.",
        &gauge(bytes),
    )
}

/// The forwarder's and its cache's families under CoreDNS's names.
fn export_coredns_forwarding(forwarder: &Forwarder, families: &mut Families<'_>) -> fmt::Result {
    let stats = &forwarder.stats;
    let (entries, denials) = forwarder.cache_entries_and_denials();
    families.labelled(
        "coredns_cache_entries",
        "The number of elements in the cache.",
        coredns_cache_types(entries as u64, denials as u64)
            .map(|(labels, count)| (labels, gauge(count as usize))),
    )?;
    families.labelled(
        "coredns_cache_hits",
        "The count of cache hits.",
        coredns_cache_types(
            stats.cache_hits.load(Relaxed),
            stats.cache_denial_hits.load(Relaxed),
        )
        .map(|(labels, count)| (labels, ConstCounter::new(count))),
    )?;
    for (name, help, count) in [
        (
            "coredns_cache_misses",
            "The count of cache misses.",
            &stats.cache_misses,
        ),
        (
            "coredns_cache_served_stale",
            "The number of requests served from stale cache entries.",
            &stats.served_stale,
        ),
        (
            "coredns_cache_prefetch",
            "The number of times the cache has prefetched a cached item.",
            &stats.prefetches,
        ),
    ] {
        families.labelled(
            name,
            help,
            [(COREDNS_CACHE, ConstCounter::new(count.load(Relaxed)))],
        )?;
    }
    let upstreams = forwarder.upstreams();
    let to: Vec<String> = upstreams.iter().map(|u| u.addr.to_string()).collect();
    families.labelled(
        "coredns_proxy_request_duration_seconds",
        "Histogram of the time each request took.",
        upstreams.iter().zip(&to).flat_map(|(upstream, to)| {
            RCODES
                .iter()
                .zip(&upstream.stats.latency)
                .filter(|(_, latency)| latency.count() > 0)
                .map(move |(rcode, latency)| {
                    (
                        [
                            ("proxy_name", "forward"),
                            ("to", to.as_str()),
                            ("rcode", *rcode),
                        ],
                        latency,
                    )
                })
        }),
    )?;
    families.labelled(
        "coredns_proxy_healthcheck_failures",
        "Count of failed health checks per upstream.",
        upstreams.iter().zip(&to).map(|(upstream, to)| {
            (
                [("proxy_name", "forward"), ("to", to.as_str())],
                ConstCounter::new(upstream.stats.healthcheck_failures.load(Relaxed)),
            )
        }),
    )?;
    families.one(
        "coredns_forward_healthcheck_broken",
        "Counter of the number of complete failures of the health checks.",
        &ConstCounter::new(stats.all_down.load(Relaxed)),
    )?;
    families.one(
        "coredns_forward_max_concurrent_rejects",
        "Counter of the number of queries rejected because the concurrent queries were at maximum.",
        &ConstCounter::new(stats.refused.load(Relaxed)),
    )
}
