//! The forwarding cache: answers by question for their TTL, past it for serve-stale, and
//! failures for a moment, capped in entries and in wire bytes.

use super::{Dnssec, ForwardConfig, Forwarded};
use hickory_proto::op::{Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The TTL of an answer served stale, as RFC 8767 recommends.
const STALE_TTL: u32 = 30;
/// What a remembered failure is counted as in the byte cap, besides its name.
const FAILURE_BYTES: usize = 32;

/// A question as the cache tells them apart: DNSSEC records (DO) and unchecked answers (CD)
/// are other answers.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    pub(crate) name: Name,
    qtype: RecordType,
    qclass: DNSClass,
    dnssec: Dnssec,
}

impl CacheKey {
    pub(crate) fn new(query: &Query, dnssec: Dnssec) -> CacheKey {
        CacheKey {
            name: query.name().to_lowercase(),
            qtype: query.query_type(),
            qclass: query.query_class(),
            dnssec,
        }
    }
}

struct CacheEntry {
    /// None: only a failure is remembered.
    answer: Option<Arc<Forwarded>>,
    stored: Instant,
    /// Seconds it is fresh for.
    ttl: u32,
    /// Until then, the upstreams are not asked again: the answer is served stale, or
    /// SERVFAIL without one.
    failed_until: Option<Instant>,
    /// Fresh answers given since it was stored, for prefetching.
    hits: u32,
    prefetching: bool,
    bytes: usize,
    /// Its place in `Cache::order`.
    seq: u64,
}

impl CacheEntry {
    /// An answer that says the name or type does not exist.
    fn is_denial(&self) -> bool {
        self.answer
            .as_ref()
            .is_some_and(|answer| answer.is_denial())
    }
}

/// What the cache holds for a question.
pub(crate) enum Cached {
    /// An answer within its TTL (the TTLs aged); `prefetch` when it is popular and about
    /// to expire: fetch it again now, in the background.
    Fresh {
        answer: Forwarded,
        prefetch: bool,
    },
    /// The upstreams failed a moment ago: the answer past its TTL to serve, or SERVFAIL.
    Failing(Option<Forwarded>),
    /// An answer past its TTL: ask the upstreams, and serve this if they fail.
    Stale(Forwarded),
    Miss,
}

#[derive(Default)]
pub(crate) struct Cache {
    entries: HashMap<CacheKey, CacheEntry>,
    /// Insertion order, for evicting the oldest entry when a cap is reached. A removed or
    /// replaced entry leaves its place behind (its `seq` no longer matches) rather than
    /// being searched for: removal is O(1), and the stale places are skipped when evicting
    /// or swept once they outnumber the entries.
    order: VecDeque<(u64, CacheKey)>,
    next_seq: u64,
    pub(crate) bytes: usize,
    /// Entries that hold a denial, for metrics.
    pub(crate) denials: usize,
}

/// The TTL an answer is cached for: the smallest record TTL, or for a negative answer the
/// SOA's minimum (bounded by the SOA's own TTL), as RFC 2308 says; at most `max_ttl` and
/// `max_denial_ttl` (kubeadm's Corefile: `cache 30`, both 30 s).
pub fn cache_ttl(answer: &Forwarded, max_ttl: u32, max_denial_ttl: u32) -> Option<u32> {
    // REFUSED, NOTIMP and the like say something about the upstream, not the name.
    if !matches!(answer.rcode, ResponseCode::NoError | ResponseCode::NXDomain) {
        return None;
    }
    if answer.is_denial() {
        let soa = answer.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(soa) => Some(soa.minimum.min(r.ttl)),
            _ => None,
        })?;
        return Some(soa.min(max_denial_ttl));
    }
    answer
        .answers
        .iter()
        .map(|r| r.ttl)
        .min()
        .map(|ttl| ttl.min(max_ttl))
}

/// `answer` as a client gets it `elapsed` seconds after it was stored.
fn aged(answer: &Forwarded, elapsed: u32) -> Forwarded {
    let mut answer = answer.clone();
    for record in answer.records_mut() {
        record.ttl = record.ttl.saturating_sub(elapsed);
    }
    answer
}

/// `answer` served past its TTL.
fn stale(answer: &Forwarded) -> Forwarded {
    let mut answer = answer.clone();
    for record in answer.records_mut() {
        record.ttl = STALE_TTL;
    }
    answer
}

impl Cache {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// What is held for `key` at `now`; an entry past every use is removed.
    pub(crate) fn lookup(
        &mut self,
        key: &CacheKey,
        now: Instant,
        config: &ForwardConfig,
    ) -> Cached {
        let Some(entry) = self.entries.get_mut(key) else {
            return Cached::Miss;
        };
        let age = now.saturating_duration_since(entry.stored);
        let fresh_for = Duration::from_secs(u64::from(entry.ttl));
        let failing = entry.failed_until.is_some_and(|until| now < until);
        match &entry.answer {
            Some(answer) if age < fresh_for => {
                entry.hits = entry.hits.saturating_add(1);
                // The last tenth of its TTL (at least a second), as CoreDNS's prefetch.
                let left = fresh_for - age;
                let prefetch = config.prefetch_hits > 0
                    && entry.hits >= config.prefetch_hits
                    && left <= (fresh_for / 10).max(Duration::from_secs(1))
                    && !std::mem::replace(&mut entry.prefetching, true);
                let answer = aged(answer, age.as_secs() as u32);
                Cached::Fresh { answer, prefetch }
            }
            answer => {
                let servable = answer.as_ref().filter(|_| {
                    age < fresh_for + Duration::from_secs(u64::from(config.serve_stale))
                });
                match (failing, servable) {
                    (true, servable) => Cached::Failing(servable.map(|a| stale(a))),
                    (false, Some(answer)) => Cached::Stale(stale(answer)),
                    (false, None) => {
                        self.remove(key);
                        Cached::Miss
                    }
                }
            }
        }
    }

    fn remove(&mut self, key: &CacheKey) {
        if let Some(old) = self.entries.remove(key) {
            self.bytes -= old.bytes;
            self.denials -= usize::from(old.is_denial());
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

    /// Stores `answer` for `ttl` seconds.
    pub(crate) fn insert(
        &mut self,
        key: CacheKey,
        answer: Forwarded,
        bytes: usize,
        ttl: u32,
        config: &ForwardConfig,
        now: Instant,
    ) {
        if ttl == 0 {
            return;
        }
        let entry = CacheEntry {
            answer: Some(Arc::new(answer)),
            stored: now,
            ttl,
            failed_until: None,
            hits: 0,
            prefetching: false,
            bytes,
            seq: 0,
        };
        self.place(key, entry, config);
    }

    /// Remembers that the upstreams failed for `key`, for `config.failure_ttl` seconds:
    /// until then it is answered from here (stale or SERVFAIL) without asking them again.
    pub(crate) fn remember_failure(&mut self, key: CacheKey, config: &ForwardConfig, now: Instant) {
        if config.failure_ttl == 0 {
            return;
        }
        let until = now + Duration::from_secs(u64::from(config.failure_ttl));
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.failed_until = Some(until);
            return;
        }
        let entry = CacheEntry {
            answer: None,
            stored: now,
            ttl: 0,
            failed_until: Some(until),
            hits: 0,
            prefetching: false,
            bytes: key.name.len() + FAILURE_BYTES,
            seq: 0,
        };
        self.place(key, entry, config);
    }

    /// Puts `entry` in, evicting the oldest entries for room.
    fn place(&mut self, key: CacheKey, mut entry: CacheEntry, config: &ForwardConfig) {
        if config.cache_entries == 0 || entry.bytes > config.cache_bytes {
            return;
        }
        self.remove(&key);
        while (self.entries.len() >= config.cache_entries
            || self.bytes + entry.bytes > config.cache_bytes)
            && self.evict_oldest()
        {}
        entry.seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += entry.bytes;
        self.denials += usize::from(entry.is_denial());
        self.order.push_back((entry.seq, key.clone()));
        self.entries.insert(key, entry);
        if self.order.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.order
                .retain(|(seq, key)| Cache::is_current(entries, *seq, key));
        }
    }

    pub(crate) fn clear(&mut self) {
        *self = Cache {
            next_seq: self.next_seq,
            ..Cache::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::Record;
    use hickory_proto::rr::rdata::A;

    fn config() -> ForwardConfig {
        ForwardConfig {
            cache_entries: 3,
            max_ttl: 30,
            max_denial_ttl: 30,
            failure_ttl: 5,
            serve_stale: 60,
            prefetch_hits: 3,
            ..ForwardConfig::default()
        }
    }

    fn key(name: &str) -> CacheKey {
        CacheKey::new(
            &Query::query(Name::from_ascii(name).expect("name"), RecordType::A),
            Dnssec::default(),
        )
    }

    fn address(ttl: u32) -> Forwarded {
        Forwarded {
            rcode: ResponseCode::NoError,
            authentic_data: false,
            answers: vec![Record::from_rdata(
                Name::from_ascii("a.").expect("name"),
                ttl,
                RData::A(A::new(192, 0, 2, 1)),
            )],
            authorities: vec![],
            additionals: vec![],
        }
    }

    fn ttl_of(cached: Cached) -> Option<u32> {
        match cached {
            Cached::Fresh { answer, .. }
            | Cached::Stale(answer)
            | Cached::Failing(Some(answer)) => Some(answer.answers[0].ttl),
            Cached::Failing(None) | Cached::Miss => None,
        }
    }

    #[test]
    fn the_cache_evicts_the_oldest_and_keeps_its_order_bounded() {
        let config = config();
        let now = Instant::now();
        let mut cache = Cache::default();
        for name in ["a.", "b.", "c."] {
            cache.insert(key(name), address(30), 10, 30, &config, now);
        }
        // Stored again, `a.` is the newest: `b.` goes first.
        cache.insert(key("a."), address(30), 10, 30, &config, now);
        cache.insert(key("d."), address(30), 10, 30, &config, now);
        let held = |cache: &mut Cache, name: &str| {
            matches!(cache.lookup(&key(name), now, &config), Cached::Fresh { .. })
        };
        assert!(!held(&mut cache, "b."));
        for name in ["a.", "c.", "d."] {
            assert!(held(&mut cache, name), "{name}");
        }
        assert_eq!(cache.bytes, 30);
        // A key stored over and over leaves stale places, swept as they pile up.
        for _ in 0..1000 {
            cache.insert(key("a."), address(30), 10, 30, &config, now);
        }
        assert!(cache.order.len() <= 2 * cache.entries.len() + 65);
        assert_eq!(cache.entries.len(), 3);
        assert_eq!(cache.bytes, 30);
    }

    #[test]
    fn answers_age_then_go_stale_then_go() {
        let config = config();
        let now = Instant::now();
        let at = |seconds| now + Duration::from_secs(seconds);
        let mut cache = Cache::default();
        cache.insert(key("a."), address(20), 10, 20, &config, now);
        assert_eq!(ttl_of(cache.lookup(&key("a."), at(5), &config)), Some(15));
        assert!(matches!(
            cache.lookup(&key("a."), at(25), &config),
            Cached::Stale(_)
        ));
        // The upstreams failed: served stale, with RFC 8767's TTL, until the failure is
        // forgotten; then asked again (stale to fall back on) until the stale window ends.
        cache.remember_failure(key("a."), &config, at(25));
        assert_eq!(
            ttl_of(cache.lookup(&key("a."), at(29), &config)),
            Some(STALE_TTL)
        );
        assert!(matches!(
            cache.lookup(&key("a."), at(31), &config),
            Cached::Stale(_)
        ));
        assert!(matches!(
            cache.lookup(&key("a."), at(81), &config),
            Cached::Miss
        ));
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.bytes, 0);
    }

    #[test]
    fn a_failure_without_an_answer_is_servfail_for_a_moment() {
        let config = config();
        let now = Instant::now();
        let mut cache = Cache::default();
        cache.remember_failure(key("b."), &config, now);
        assert!(matches!(
            cache.lookup(&key("b."), now + Duration::from_secs(4), &config),
            Cached::Failing(None)
        ));
        assert!(matches!(
            cache.lookup(&key("b."), now + Duration::from_secs(5), &config),
            Cached::Miss
        ));
        let never = ForwardConfig {
            failure_ttl: 0,
            ..config
        };
        cache.remember_failure(key("b."), &never, now);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_popular_answer_is_prefetched_once_near_its_end() {
        let config = config();
        let now = Instant::now();
        let at = |seconds| now + Duration::from_secs(seconds);
        let mut cache = Cache::default();
        cache.insert(key("a."), address(30), 10, 30, &config, now);
        let prefetch = |cached| matches!(cached, Cached::Fresh { prefetch: true, .. });
        assert!(!prefetch(cache.lookup(&key("a."), at(1), &config)));
        assert!(!prefetch(cache.lookup(&key("a."), at(2), &config)));
        assert!(
            !prefetch(cache.lookup(&key("a."), at(3), &config)),
            "not yet near its end"
        );
        assert!(prefetch(cache.lookup(&key("a."), at(28), &config)));
        assert!(!prefetch(cache.lookup(&key("a."), at(29), &config)), "once");
        let off = ForwardConfig {
            prefetch_hits: 0,
            ..config
        };
        cache.insert(key("a."), address(30), 10, 30, &off, now);
        for second in 1..30 {
            assert!(!prefetch(cache.lookup(&key("a."), at(second), &off)));
        }
    }

    #[test]
    fn dnssec_bits_are_other_questions() {
        let config = config();
        let now = Instant::now();
        let mut cache = Cache::default();
        cache.insert(key("a."), address(30), 10, 30, &config, now);
        let query = Query::query(Name::from_ascii("a.").expect("name"), RecordType::A);
        let with_do = CacheKey::new(
            &query,
            Dnssec {
                ok: true,
                checking_disabled: false,
            },
        );
        assert!(matches!(cache.lookup(&with_do, now, &config), Cached::Miss));
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
            authentic_data: false,
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
