//! Forwarding names outside the cluster zone to the node's upstream resolvers, with a small
//! cache.
//!
//! Upstreams come from a resolv.conf (the host's by default), minus nodus's own addresses,
//! so that a node whose resolv.conf points at nodus does not loop. Each question is tried on
//! each upstream in turn: over UDP, again over TCP when the answer is truncated, and on to
//! the next upstream after a timeout. When every upstream fails the client gets SERVFAIL.
//! Answers are cached by question (name, type and class) for their TTL; negative answers
//! for the SOA's minimum (RFC 2308); both at most for a configured time (kubeadm's `cache
//! 30`), which also caps the TTLs clients are given. The cache is capped in entries and in
//! the wire size of the cached answers. At most `max_concurrent` questions are upstream at
//! once; past that a question is refused, as CoreDNS's forward plugin answers past its
//! `max_concurrent`.
//!
//! An upstream can still lead back to nodus (a node resolver that forwards to the cluster
//! DNS, a NodeLocal-style cache): every miss would then circle until it times out. At start,
//! as CoreDNS's `loop` plugin does, each upstream is asked a random name only this process
//! knows ([`Forwarder::probe_for_loops`]); if that name arrives at our own server
//! ([`Forwarder::is_loop_probe`]), the upstream is left out from then on, with one error in
//! the log that names it.

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Room for the largest UDP answer an upstream may send.
const UDP_BUFFER: usize = 4096;
/// How long a loop probe's name is watched for after it was sent: a loop may take a few
/// hops through caches that wait for their own upstreams.
const LOOP_PROBE_WINDOW: Duration = Duration::from_secs(10);

/// How the forwarder is set up.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    pub upstreams: Vec<SocketAddr>,
    /// How long one upstream gets before the next is tried.
    pub timeout: Duration,
    pub cache_entries: usize,
    /// A cap on the wire size of the cached answers.
    pub cache_bytes: usize,
    /// Questions upstream at once; more are refused.
    pub max_concurrent: usize,
    /// Longest time an answer is cached, and the largest TTL a client is given for it.
    pub max_ttl: u32,
    /// The same for a denial (NXDOMAIN or NODATA).
    pub max_denial_ttl: u32,
}

/// The nameservers of a resolv.conf, on port 53, without `exclude` (nodus's own listeners).
pub fn upstreams_from_resolv_conf(
    path: &Path,
    exclude: &[SocketAddr],
) -> std::io::Result<Vec<SocketAddr>> {
    let text = std::fs::read_to_string(path)?;
    Ok(parse_resolv_conf(&text, exclude, interface_index))
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

/// What came back for a question.
#[derive(Clone, Debug)]
pub struct Forwarded {
    pub rcode: ResponseCode,
    pub answers: Vec<Record>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
}

impl Forwarded {
    /// Every record of every section.
    fn records_mut(&mut self) -> impl Iterator<Item = &mut Record> {
        self.answers
            .iter_mut()
            .chain(self.authorities.iter_mut())
            .chain(self.additionals.iter_mut())
    }
}

/// What came of a question.
#[derive(Debug)]
pub enum Resolution {
    Answered(Forwarded),
    /// No upstream answered: SERVFAIL.
    Failed,
    /// Too many questions were upstream already: REFUSED.
    Refused,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    name: Name,
    qtype: RecordType,
    qclass: DNSClass,
}

struct CacheEntry {
    answer: Forwarded,
    stored: Instant,
    expires: Instant,
    bytes: usize,
    /// Its place in `Cache::order`.
    seq: u64,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<CacheKey, CacheEntry>,
    /// Insertion order, for evicting the oldest entry when a cap is reached. A removed or
    /// replaced entry leaves its place behind (its `seq` no longer matches) rather than
    /// being searched for: removal is O(1), and the stale places are skipped when evicting
    /// or swept once they outnumber the entries.
    order: VecDeque<(u64, CacheKey)>,
    next_seq: u64,
    bytes: usize,
}

/// Counters for the metrics endpoint.
#[derive(Default)]
pub struct ForwardStats {
    pub forwarded: AtomicU64,
    pub cache_hits: AtomicU64,
    pub failures: AtomicU64,
    /// Questions refused over `max_concurrent`.
    pub refused: AtomicU64,
}

pub struct Forwarder {
    config: ForwardConfig,
    cache: Mutex<Cache>,
    /// Questions upstream now.
    in_flight: AtomicUsize,
    pub stats: ForwardStats,
    /// Per upstream (in `config.upstreams`' order): it sent a loop probe back to us.
    looping: Box<[AtomicBool]>,
    /// The loop probes being watched for, each with its upstream's index.
    probes: Mutex<Vec<(Name, usize)>>,
    /// Whether any probe is watched for: the check on every forwarded name is one load.
    probing: AtomicBool,
}

/// One question upstream, counted in `in_flight` until dropped.
struct InFlight<'f>(&'f AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// The TTL an answer is cached for: the smallest record TTL, or for a negative answer the
/// SOA's minimum (bounded by the SOA's own TTL), as RFC 2308 says; at most `max_ttl` and
/// `max_denial_ttl` (kubeadm's Corefile: `cache 30`, both 30 s).
pub fn cache_ttl(answer: &Forwarded, max_ttl: u32, max_denial_ttl: u32) -> Option<u32> {
    // REFUSED, NOTIMP and the like say something about the upstream, not the name.
    if !matches!(answer.rcode, ResponseCode::NoError | ResponseCode::NXDomain) {
        return None;
    }
    let negative = answer.rcode == ResponseCode::NXDomain || answer.answers.is_empty();
    if negative {
        let soa = answer.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(soa) => Some(soa.minimum.min(r.ttl)),
            _ => None,
        })?;
        return Some(soa.min(max_denial_ttl));
    }
    if answer.rcode != ResponseCode::NoError {
        return None;
    }
    answer
        .answers
        .iter()
        .map(|r| r.ttl)
        .min()
        .map(|ttl| ttl.min(max_ttl))
}

impl Cache {
    fn get(&mut self, key: &CacheKey, now: Instant) -> Option<Forwarded> {
        let entry = self.entries.get(key)?;
        if entry.expires <= now {
            self.remove(key);
            return None;
        }
        let elapsed = now.duration_since(entry.stored).as_secs() as u32;
        let mut answer = entry.answer.clone();
        for record in answer.records_mut() {
            record.ttl = record.ttl.saturating_sub(elapsed);
        }
        Some(answer)
    }

    fn remove(&mut self, key: &CacheKey) {
        if let Some(old) = self.entries.remove(key) {
            self.bytes -= old.bytes;
        }
    }

    /// Whether a place in `order` is still its entry's, not one left behind.
    fn is_current(entries: &HashMap<CacheKey, CacheEntry>, seq: u64, key: &CacheKey) -> bool {
        entries.get(key).is_some_and(|entry| entry.seq == seq)
    }

    /// Removes the oldest entry; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((seq, key)) = self.order.pop_front() {
            if Cache::is_current(&self.entries, seq, &key) {
                self.remove(&key);
                return true;
            }
        }
        false
    }

    fn insert(
        &mut self,
        key: CacheKey,
        answer: Forwarded,
        bytes: usize,
        ttl: u32,
        config: &ForwardConfig,
        now: Instant,
    ) {
        if ttl == 0 || config.cache_entries == 0 || bytes > config.cache_bytes {
            return;
        }
        self.remove(&key);
        while (self.entries.len() >= config.cache_entries
            || self.bytes + bytes > config.cache_bytes)
            && self.evict_oldest()
        {}
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += bytes;
        self.order.push_back((seq, key.clone()));
        self.entries.insert(
            key,
            CacheEntry {
                answer,
                stored: now,
                expires: now + Duration::from_secs(u64::from(ttl)),
                bytes,
                seq,
            },
        );
        if self.order.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.order
                .retain(|(seq, key)| Cache::is_current(entries, *seq, key));
        }
    }
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

impl Forwarder {
    pub fn new(config: ForwardConfig) -> Forwarder {
        Forwarder {
            looping: config
                .upstreams
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
            config,
            cache: Mutex::new(Cache::default()),
            in_flight: AtomicUsize::new(0),
            stats: ForwardStats::default(),
            probes: Mutex::new(Vec::new()),
            probing: AtomicBool::new(false),
        }
    }

    /// Upstreams found to send our questions back to us.
    pub fn looping_upstreams(&self) -> Vec<SocketAddr> {
        self.config
            .upstreams
            .iter()
            .zip(&self.looping)
            .filter(|(_, looping)| looping.load(Relaxed))
            .map(|(upstream, _)| *upstream)
            .collect()
    }

    /// Asks every upstream a random name of its own and watches for those names for
    /// [`LOOP_PROBE_WINDOW`]; run once the server listens. The answers do not matter.
    pub async fn probe_for_loops(&self) {
        let probes: Vec<(Name, usize)> = (0..self.config.upstreams.len())
            .filter_map(|i| Some((loop_probe_name()?, i)))
            .collect();
        *self.probes.lock().unwrap_or_else(|p| p.into_inner()) = probes.clone();
        self.probing.store(true, Relaxed);
        for (name, i) in &probes {
            let probe = Query::query(name.clone(), RecordType::HINFO);
            let _ = self.ask(self.config.upstreams[*i], probe).await;
        }
        tokio::time::sleep(LOOP_PROBE_WINDOW).await;
        self.probing.store(false, Relaxed);
        self.probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Whether `name`, asked of our server, is one of our loop probes come back: its
    /// upstream is left out from now on (logged once), and the question is not forwarded.
    pub fn is_loop_probe(&self, name: &Name) -> bool {
        if !self.probing.load(Relaxed) {
            return false;
        }
        let probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
        let lower = name.to_lowercase();
        let Some(&(_, i)) = probes.iter().find(|(probe, _)| *probe == lower) else {
            return false;
        };
        if !self.looping[i].swap(true, Relaxed) {
            tracing::error!(
                upstream = %self.config.upstreams[i],
                "forwarding loop: this upstream sends the questions nodus forwards back to \
                 nodus; it is left out. Point resolv.conf (dns.resolv_conf) at a resolver \
                 that does not forward to the cluster DNS"
            );
        }
        true
    }

    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.config.upstreams
    }

    /// Entries and wire bytes in the cache, for metrics.
    pub fn cache_size(&self) -> (usize, usize) {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        (cache.entries.len(), cache.bytes)
    }

    /// Answers `query` from the cache or the upstreams.
    pub async fn resolve(&self, query: &Query) -> Resolution {
        let key = CacheKey {
            name: query.name().to_lowercase(),
            qtype: query.query_type(),
            qclass: query.query_class(),
        };
        let now = Instant::now();
        if let Some(hit) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key, now)
        {
            self.stats.cache_hits.fetch_add(1, Relaxed);
            return Resolution::Answered(hit);
        }
        let Some(_slot) = self.take_slot() else {
            self.stats.refused.fetch_add(1, Relaxed);
            return Resolution::Refused;
        };
        self.stats.forwarded.fetch_add(1, Relaxed);
        let usable = self
            .config
            .upstreams
            .iter()
            .zip(&self.looping)
            .filter(|(_, looping)| !looping.load(Relaxed));
        for (upstream, _) in usable {
            match self.ask(*upstream, query.clone()).await {
                Ok((mut answer, wire_size)) => {
                    let config = &self.config;
                    if let Some(ttl) = cache_ttl(&answer, config.max_ttl, config.max_denial_ttl) {
                        // As CoreDNS's cache: no client is told to keep an answer longer
                        // than it is kept here.
                        for record in answer.records_mut() {
                            record.ttl = record.ttl.min(ttl);
                        }
                        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
                            key,
                            answer.clone(),
                            wire_size,
                            ttl,
                            &self.config,
                            Instant::now(),
                        );
                    }
                    return Resolution::Answered(answer);
                }
                Err(error) => {
                    tracing::debug!(%upstream, %error, name = %query.name(), "upstream failed")
                }
            }
        }
        self.stats.failures.fetch_add(1, Relaxed);
        Resolution::Failed
    }

    /// A place among the `max_concurrent` questions upstream, if one is free.
    fn take_slot(&self) -> Option<InFlight<'_>> {
        self.in_flight
            .fetch_update(Relaxed, Relaxed, |n| {
                (n < self.config.max_concurrent).then_some(n + 1)
            })
            .ok()
            .map(|_| InFlight(&self.in_flight))
    }

    /// The upstream's answer and its size on the wire.
    async fn ask(
        &self,
        upstream: SocketAddr,
        query: Query,
    ) -> Result<(Forwarded, usize), UpstreamError> {
        let id: u16 = rand_id();
        let mut message = Message::new(id, MessageType::Query, OpCode::Query);
        message.metadata.recursion_desired = true;
        message.add_query(query.clone());
        let query = &query;
        // Room for answers up to the flag-day size, so fewer of them fall back to TCP.
        let mut edns = hickory_proto::op::Edns::new();
        edns.set_max_payload(1232);
        message.set_edns(edns);
        let bytes = message
            .to_vec()
            .map_err(|e| UpstreamError::Malformed(e.to_string()))?;
        let datagram = tokio::time::timeout(self.config.timeout, udp_exchange(upstream, &bytes))
            .await
            .map_err(|_| UpstreamError::Timeout)??;
        match read_answer(&datagram, id, query)? {
            Upstream::Truncated => {
                let full =
                    tokio::time::timeout(self.config.timeout, tcp_exchange(upstream, &bytes))
                        .await
                        .map_err(|_| UpstreamError::Timeout)??;
                match read_answer(&full, id, query)? {
                    Upstream::Answer(answer) => Ok((answer, full.len())),
                    Upstream::Truncated => {
                        Err(UpstreamError::Malformed("truncated over TCP".into()))
                    }
                }
            }
            Upstream::Answer(answer) => Ok((answer, datagram.len())),
        }
    }
}

/// What an upstream's message says.
#[derive(Debug)]
pub enum Upstream {
    Answer(Forwarded),
    /// Truncated: ask again over TCP.
    Truncated,
}

/// Reads an upstream's reply to our question `query` with id `id`: the answer to keep and
/// cache, or that it was truncated. Anything else (not our question, a SERVFAIL, bytes
/// that do not parse) is an error, and the next upstream is tried.
pub fn read_answer(bytes: &[u8], id: u16, query: &Query) -> Result<Upstream, UpstreamError> {
    let answer = check(bytes, id, query)?;
    if answer.metadata.truncation {
        return Ok(Upstream::Truncated);
    }
    if answer.metadata.response_code == ResponseCode::ServFail {
        return Err(UpstreamError::Malformed("SERVFAIL".into()));
    }
    Ok(Upstream::Answer(Forwarded {
        rcode: answer.metadata.response_code,
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

/// A query id that an off-path attacker cannot guess cheaply, without a random crate: the
/// hasher's per-process random keys over a counter.
fn rand_id() -> u16 {
    random_u64() as u16
}

pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    static STATE: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let state = STATE.get_or_init(RandomState::new);
    state.hash_one(COUNTER.fetch_add(1, Relaxed))
}

/// A name no one else asks: two random labels under the root, as CoreDNS's loop plugin
/// makes them (an upstream that does not loop gets NXDOMAIN from the root).
fn loop_probe_name() -> Option<Name> {
    Name::from_ascii(format!("{:016x}.{:016x}.", random_u64(), random_u64())).ok()
}

async fn udp_exchange(upstream: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = match upstream {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = tokio::net::UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(query).await?;
    let mut buffer = vec![0u8; UDP_BUFFER];
    let n = socket.recv(&mut buffer).await?;
    buffer.truncate(n);
    Ok(buffer)
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
    fn the_cache_evicts_the_oldest_and_keeps_its_order_bounded() {
        let config = ForwardConfig {
            upstreams: Vec::new(),
            timeout: Duration::from_secs(1),
            cache_entries: 3,
            cache_bytes: 1 << 20,
            max_concurrent: 1,
            max_ttl: 30,
            max_denial_ttl: 30,
        };
        let key = |name: &str| CacheKey {
            name: Name::from_ascii(name).expect("name"),
            qtype: RecordType::A,
            qclass: DNSClass::IN,
        };
        let empty = Forwarded {
            rcode: ResponseCode::NoError,
            answers: vec![],
            authorities: vec![],
            additionals: vec![],
        };
        let now = Instant::now();
        let mut cache = Cache::default();
        for name in ["a.", "b.", "c."] {
            cache.insert(key(name), empty.clone(), 10, 30, &config, now);
        }
        // Stored again, `a.` is the newest: `b.` goes first.
        cache.insert(key("a."), empty.clone(), 10, 30, &config, now);
        cache.insert(key("d."), empty.clone(), 10, 30, &config, now);
        let held = |cache: &mut Cache, name: &str| cache.get(&key(name), now).is_some();
        assert!(!held(&mut cache, "b."));
        for name in ["a.", "c.", "d."] {
            assert!(held(&mut cache, name), "{name}");
        }
        assert_eq!(cache.bytes, 30);
        // A key stored over and over leaves stale places, swept as they pile up.
        for _ in 0..1000 {
            cache.insert(key("a."), empty.clone(), 10, 30, &config, now);
        }
        assert!(cache.order.len() <= 2 * cache.entries.len() + 65);
        assert_eq!(cache.entries.len(), 3);
        assert_eq!(cache.bytes, 30);
    }

    #[test]
    fn negative_answers_are_cached_for_the_soa_minimum() {
        use hickory_proto::rr::rdata::SOA;
        let soa = Record::from_rdata(
            Name::from_ascii("example.org.").expect("name"),
            300,
            RData::SOA(SOA::new(Name::root(), Name::root(), 1, 1, 1, 1, 60)),
        );
        let answer = Forwarded {
            rcode: ResponseCode::NXDomain,
            answers: vec![],
            authorities: vec![soa],
            additionals: vec![],
        };
        assert_eq!(cache_ttl(&answer, 30, 600), Some(60));
        assert_eq!(cache_ttl(&answer, 600, 30), Some(30), "the denial cap");
        let no_soa = Forwarded {
            authorities: vec![],
            ..answer
        };
        assert_eq!(
            cache_ttl(&no_soa, 30, 30),
            None,
            "without a SOA a negative answer is not cached"
        );
    }
}
