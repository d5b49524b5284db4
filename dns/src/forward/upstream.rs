//! One upstream resolver: where its address comes from (a resolv.conf), how a question is
//! put to it (UDP, then TCP when truncated), what its reply must be to be taken, and what
//! is known of it (whether it answers, whether it loops back to us, what it answered).

use super::{Dnssec, Forwarded};
use crate::codes::{RCODES, rcode_index};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use nodus_prom::Histogram;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Room for the largest UDP answer an upstream may send.
const UDP_BUFFER: usize = 4096;
/// Failures in a row after which an upstream is down, as CoreDNS's `max_fails 2`.
pub(crate) const MAX_FAILS: u32 = 2;
/// Upper bounds of the upstream latency histogram, in seconds (CoreDNS's forward plugin
/// alerts at a p99 of 4 s).
const LATENCY_BUCKETS: [f64; 8] = [0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 4.0];

/// The nameservers of a resolv.conf's `text`, on port 53, without `exclude` (nodus's own
/// listeners).
pub fn upstreams_from_resolv_conf(text: &str, exclude: &[SocketAddr]) -> Vec<SocketAddr> {
    parse_resolv_conf(text, exclude, interface_index)
}

/// The index of the network interface `name`, from sysfs.
fn interface_index(name: &str) -> Option<u32> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// One `nameserver` address: a link-local IPv6 address keeps its zone (`fe80::1%eth0`, by
/// interface name or index), without which it cannot be reached.
fn nameserver(text: &str, interface_index: &impl Fn(&str) -> Option<u32>) -> Option<SocketAddr> {
    let (address, zone) = match text.split_once('%') {
        Some((address, zone)) => (address, Some(zone)),
        None => (text, None),
    };
    match address.parse::<IpAddr>().ok()? {
        IpAddr::V6(v6) if v6.is_unicast_link_local() => {
            let Some(zone) = zone else {
                tracing::warn!(
                    nameserver = text,
                    "a link-local nameserver without its interface (fe80::1%eth0) cannot be reached; left out"
                );
                return None;
            };
            let scope = zone.parse().ok().or_else(|| interface_index(zone));
            let Some(scope) = scope else {
                tracing::warn!(nameserver = text, "no such interface; left out");
                return None;
            };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                v6, 53, 0, scope,
            )))
        }
        ip => Some(SocketAddr::new(ip, 53)),
    }
}

pub(crate) fn parse_resolv_conf(
    text: &str,
    exclude: &[SocketAddr],
    interface_index: impl Fn(&str) -> Option<u32>,
) -> Vec<SocketAddr> {
    // A wildcard listener (`0.0.0.0:53`) is reached through loopback; any other upstream
    // is someone else's server.
    let is_ours = |ip: IpAddr| {
        exclude.iter().any(|ours| {
            ours.port() == 53
                && (ours.ip() == ip || (ours.ip().is_unspecified() && ip.is_loopback()))
        })
    };
    text.lines()
        .filter_map(|line| line.split('#').next()?.strip_prefix("nameserver"))
        .filter_map(|rest| nameserver(rest.trim(), &interface_index))
        .filter(|upstream| !is_ours(upstream.ip()))
        .collect()
}

/// An upstream's address with what is known of it.
pub struct Upstream {
    pub addr: SocketAddr,
    /// Failures in a row (no reply in time, or none at all); any reply resets it. At
    /// [`MAX_FAILS`] the upstream is down: tried after those that are up, and health-checked
    /// until it answers.
    fails: AtomicU32,
    /// It sent a loop probe back to us: never asked again.
    looping: AtomicBool,
    pub stats: UpstreamStats,
}

/// What one upstream was asked and answered, for CoreDNS's `coredns_proxy_*` series.
pub struct UpstreamStats {
    /// Questions put to it, answered or not.
    pub requests: AtomicU64,
    /// The time replies took, by their response code ([`RCODES`]).
    pub latency: [Histogram<{ LATENCY_BUCKETS.len() }>; RCODES.len()],
    pub healthcheck_failures: AtomicU64,
}

/// Why one upstream gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("timed out")]
    Timeout,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("malformed answer: {0}")]
    Malformed(String),
}

impl Upstream {
    pub(crate) fn new(addr: SocketAddr) -> Upstream {
        Upstream {
            addr,
            fails: AtomicU32::new(0),
            looping: AtomicBool::new(false),
            stats: UpstreamStats {
                requests: AtomicU64::new(0),
                latency: [const { Histogram::new(LATENCY_BUCKETS) }; RCODES.len()],
                healthcheck_failures: AtomicU64::new(0),
            },
        }
    }

    pub fn is_down(&self) -> bool {
        self.fails.load(Relaxed) >= MAX_FAILS
    }

    pub fn is_looping(&self) -> bool {
        self.looping.load(Relaxed)
    }

    /// Marks it as leading back to us; true the first time.
    pub(crate) fn mark_looping(&self) -> bool {
        !self.looping.swap(true, Relaxed)
    }

    /// What an exchange says of its health: any reply means it is up; silence or an error
    /// of the socket counts a failure.
    pub(crate) fn record_health<T>(&self, outcome: &Result<T, UpstreamError>) {
        match outcome {
            Ok(_) | Err(UpstreamError::Malformed(_)) => {
                if self.fails.swap(0, Relaxed) >= MAX_FAILS {
                    tracing::info!(upstream = %self.addr, "upstream answers again");
                }
            }
            Err(UpstreamError::Timeout | UpstreamError::Io(_)) => {
                if self.fails.fetch_add(1, Relaxed) + 1 == MAX_FAILS {
                    tracing::warn!(
                        upstream = %self.addr,
                        "upstream does not answer; asked after the others until a health check gets an answer"
                    );
                }
            }
        }
    }

    /// Puts `query` to this upstream, with the client's DNSSEC bits: its answer (SERVFAIL
    /// included) and the answer's size on the wire.
    pub(crate) async fn ask(
        &self,
        query: &Query,
        dnssec: Dnssec,
        timeout: Duration,
    ) -> Result<(Forwarded, usize), UpstreamError> {
        let started = Instant::now();
        self.stats.requests.fetch_add(1, Relaxed);
        let outcome = self.exchange(query, dnssec, timeout).await;
        self.record_health(&outcome);
        if let Ok((answer, _)) = &outcome {
            self.stats.latency[rcode_index(answer.rcode)].observe(started.elapsed());
        }
        outcome
    }

    /// Sends a loop probe: neither counted as a question nor taken as a sign of health, and
    /// its answer does not matter.
    pub(crate) async fn probe(&self, query: &Query, timeout: Duration) {
        let _ = self.exchange(query, Dnssec::default(), timeout).await;
    }

    /// A health check: any reply to `. NS` in time means the upstream is up again.
    pub(crate) async fn check_health(&self, timeout: Duration) {
        let query = Query::query(Name::root(), RecordType::NS);
        let outcome = self.exchange(&query, Dnssec::default(), timeout).await;
        if outcome.is_err() {
            self.stats.healthcheck_failures.fetch_add(1, Relaxed);
        }
        self.record_health(&outcome);
    }

    async fn exchange(
        &self,
        query: &Query,
        dnssec: Dnssec,
        timeout: Duration,
    ) -> Result<(Forwarded, usize), UpstreamError> {
        let id: u16 = random_u64() as u16;
        let mut message = Message::new(id, MessageType::Query, OpCode::Query);
        message.metadata.recursion_desired = true;
        message.metadata.checking_disabled = dnssec.checking_disabled;
        // We understand AD (RFC 6840 §5.7): a validating upstream tells us what it proved.
        message.metadata.authentic_data = true;
        message.add_query(query.clone());
        // Room for answers up to the flag-day size, so fewer of them fall back to TCP.
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        edns.set_dnssec_ok(dnssec.ok);
        message.set_edns(edns);
        let bytes = message
            .to_vec()
            .map_err(|e| UpstreamError::Malformed(e.to_string()))?;
        let upstream = self.addr;
        let ours = |datagram: &[u8]| check(datagram, id, query).is_ok();
        let datagram = tokio::time::timeout(timeout, udp_exchange(upstream, &bytes, ours))
            .await
            .map_err(|_| UpstreamError::Timeout)??;
        match read_answer(&datagram, id, query)? {
            Reply::Truncated => {
                let full = tokio::time::timeout(timeout, tcp_exchange(upstream, &bytes))
                    .await
                    .map_err(|_| UpstreamError::Timeout)??;
                match read_answer(&full, id, query)? {
                    Reply::Answer(answer) => Ok((answer, full.len())),
                    Reply::Truncated => Err(UpstreamError::Malformed("truncated over TCP".into())),
                }
            }
            Reply::Answer(answer) => Ok((answer, datagram.len())),
        }
    }
}

/// What an upstream's message says.
#[derive(Debug)]
pub enum Reply {
    Answer(Forwarded),
    /// Truncated: ask again over TCP.
    Truncated,
}

/// Reads an upstream's reply to our question `query` with id `id`: the answer, or that it
/// was truncated. Anything else (not our question, bytes that do not parse) is an error.
pub fn read_answer(bytes: &[u8], id: u16, query: &Query) -> Result<Reply, UpstreamError> {
    let answer = check(bytes, id, query)?;
    if answer.metadata.truncation {
        return Ok(Reply::Truncated);
    }
    Ok(Reply::Answer(Forwarded {
        rcode: answer.metadata.response_code,
        authentic_data: answer.metadata.authentic_data,
        answers: answer.answers,
        authorities: answer.authorities,
        additionals: answer
            .additionals
            .into_iter()
            .filter(|r| r.record_type() != RecordType::OPT)
            .collect(),
    }))
}

/// An answer is ours only if it echoes our id and our question: it is cached under that
/// question, so a reply to anything else must never be taken.
fn check(bytes: &[u8], id: u16, query: &Query) -> Result<Message, UpstreamError> {
    let message = Message::from_vec(bytes).map_err(|e| UpstreamError::Malformed(e.to_string()))?;
    let same_question = matches!(message.queries.as_slice(), [q]
        if q.name().to_lowercase() == query.name().to_lowercase()
            && q.query_type() == query.query_type()
            && q.query_class() == query.query_class());
    if message.metadata.id != id
        || message.metadata.message_type != MessageType::Response
        || !same_question
    {
        return Err(UpstreamError::Malformed(
            "not the answer to our query".into(),
        ));
    }
    Ok(message)
}

/// A number an off-path attacker cannot guess cheaply (query ids), without a random crate:
/// the hasher's per-process random keys over a counter.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    static STATE: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let state = STATE.get_or_init(RandomState::new);
    state.hash_one(COUNTER.fetch_add(1, Relaxed))
}

/// Sends `query` to `upstream` and returns the first datagram `ours` takes: a late reply
/// to an earlier query on a reused port, or a forged one, is read past, not taken as the
/// exchange's failure (RFC 5452 §9.1; CoreDNS reads on until the id matches).
async fn udp_exchange(
    upstream: SocketAddr,
    query: &[u8],
    ours: impl Fn(&[u8]) -> bool,
) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = match upstream {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = tokio::net::UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(query).await?;
    let mut buffer = vec![0u8; UDP_BUFFER];
    loop {
        let n = socket.recv(&mut buffer).await?;
        if ours(&buffer[..n]) {
            buffer.truncate(n);
            return Ok(buffer);
        }
    }
}

async fn tcp_exchange(upstream: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = tokio::net::TcpStream::connect(upstream).await?;
    let length = u16::try_from(query.len()).map_err(|_| std::io::Error::other("query too long"))?;
    stream.write_all(&length.to_be_bytes()).await?;
    stream.write_all(query).await?;
    let mut prefix = [0u8; 2];
    stream.read_exact(&mut prefix).await?;
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
    stream.read_exact(&mut answer).await?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that first sends a stray datagram, then echoes the query back as the
    /// answer: the exchange takes the second.
    #[tokio::test]
    async fn a_stray_datagram_is_read_past_not_taken_as_a_failure() {
        let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = upstream.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let mut buffer = [0u8; 512];
            let (n, client) = upstream.recv_from(&mut buffer).await.expect("query");
            upstream.send_to(b"stray", client).await.expect("stray");
            upstream
                .send_to(&buffer[..n], client)
                .await
                .expect("answer");
        });
        let ours = |datagram: &[u8]| datagram != b"stray";
        let answer = udp_exchange(addr, b"question", ours)
            .await
            .expect("exchange");
        assert_eq!(answer, b"question");
        server.await.expect("server");
    }

    #[test]
    fn a_wildcard_listener_skips_only_loopback_upstreams() {
        let text = "nameserver 10.0.0.2\nnameserver 127.0.0.53\n";
        let ours: SocketAddr = "0.0.0.0:53".parse().expect("addr");
        assert_eq!(
            parse_resolv_conf(text, &[ours], |_| None),
            ["10.0.0.2:53".parse::<SocketAddr>().expect("addr")]
        );
    }

    #[test]
    fn resolv_conf_skips_our_own_addresses() {
        let text = "search example.org\nnameserver 10.0.0.2 # primary\nnameserver 127.0.0.1\n\
                    nameserver fe80::1%eth0\n# nameserver 9.9.9.9\noptions ndots:2\n";
        let ours: SocketAddr = "127.0.0.1:53".parse().expect("addr");
        let index = |name: &str| (name == "eth0").then_some(7);
        let upstreams = parse_resolv_conf(text, &[ours], index);
        assert_eq!(
            upstreams,
            [
                "10.0.0.2:53".parse::<SocketAddr>().expect("addr"),
                "[fe80::1%7]:53".parse().expect("addr")
            ]
        );
        // By index; and without a zone, or with an unknown interface, left out.
        let text = "nameserver fe80::2%3\nnameserver fe80::3\nnameserver fe80::4%wlan9\n\
                    nameserver fd00::53\n";
        assert_eq!(
            parse_resolv_conf(text, &[], index),
            [
                "[fe80::2%3]:53".parse::<SocketAddr>().expect("addr"),
                "[fd00::53]:53".parse().expect("addr")
            ]
        );
    }

    #[test]
    fn an_upstream_is_down_after_failures_in_a_row_and_up_after_any_reply() {
        let upstream = Upstream::new("192.0.2.53:53".parse().expect("addr"));
        let timeout: Result<(), _> = Err(UpstreamError::Timeout);
        upstream.record_health(&timeout);
        assert!(!upstream.is_down(), "one failure");
        upstream.record_health(&Ok(()));
        upstream.record_health(&timeout);
        assert!(!upstream.is_down(), "a reply between resets the count");
        upstream.record_health(&timeout);
        assert!(upstream.is_down());
        upstream.record_health(&Err::<(), _>(UpstreamError::Malformed("x".into())));
        assert!(
            !upstream.is_down(),
            "a reply, even a bad one, means it is there"
        );
    }
}
