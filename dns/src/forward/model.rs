//! What forwarding is about: the settings, the DNSSEC bits of a question, and what came
//! back.

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, Record};
use std::net::SocketAddr;
use std::time::Duration;

/// In which order a question's upstreams are asked (CoreDNS's `policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// As listed: the first is asked first.
    Sequential,
    /// A random order for each question (CoreDNS's default).
    #[default]
    Random,
    /// Each question starts at the next upstream.
    RoundRobin,
}

/// How the forwarder is set up.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    /// Upstreams for every name that no zone of `zones` holds.
    pub upstreams: Vec<SocketAddr>,
    /// Stub domains: the names of a zone go to its own upstreams (the longest zone wins).
    pub zones: Vec<(Name, Vec<SocketAddr>)>,
    pub policy: Policy,
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
    /// Seconds a failure of every upstream is remembered (CoreDNS's cache: `servfail 5s`).
    pub failure_ttl: u32,
    /// Seconds past its TTL an answer may be served while the upstreams fail; 0 never.
    pub serve_stale: u32,
    /// Fresh answers after which an answer is fetched again near its end; 0 never.
    pub prefetch_hits: u32,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        ForwardConfig {
            upstreams: Vec::new(),
            zones: Vec::new(),
            policy: Policy::Random,
            timeout: Duration::from_secs(2),
            cache_entries: 10_000,
            cache_bytes: 1 << 20,
            max_concurrent: 1000,
            max_ttl: 30,
            max_denial_ttl: 30,
            failure_ttl: 5,
            serve_stale: 0,
            prefetch_hits: 0,
        }
    }
}

/// The DNSSEC bits of a question, passed upstream and part of the cache key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Dnssec {
    /// DO (RFC 3225): the client wants the signatures.
    pub ok: bool,
    /// CD (RFC 4035): the client validates itself.
    pub checking_disabled: bool,
}

/// What came back for a question.
#[derive(Clone, Debug)]
pub struct Forwarded {
    pub rcode: ResponseCode,
    /// The upstream validated the answer (AD).
    pub authentic_data: bool,
    pub answers: Vec<Record>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
}

impl Forwarded {
    /// NXDOMAIN or NODATA.
    pub fn is_denial(&self) -> bool {
        self.rcode == ResponseCode::NXDomain || self.answers.is_empty()
    }

    /// Every record of every section.
    pub(crate) fn records_mut(&mut self) -> impl Iterator<Item = &mut Record> {
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
