//! Response-rate limiting per client address, as BIND's and NSD's RRL do it: a UDP
//! client's source can be forged, so a flood of queries "from" a victim would make DNS a
//! reflector. Each client address has a token bucket of
//! [`RateLimitSettings::responses_per_second`]; over it, responses are dropped, and every
//! [`RateLimitSettings::slip`]-th one is sent truncated instead (TC, no records), so that a
//! real client asks again over TCP, whose source cannot be forged, and is never cut off.
//!
//! Per address, not per /24 as an authoritative server facing the Internet keys it: here
//! the clients are a node's pods, which share a /24 and which nobody outside can forge
//! (they sit behind their veths), so a prefix's bucket would let one busy pod get its
//! neighbours' answers dropped. Loopback is not limited: it cannot be forged from outside
//! the host. TCP is not limited. The table holds at most [`MAX_CLIENTS`]; idle buckets
//! are forgotten first, and while none is idle every new client shares one bucket (of
//! one client's rate), so that filling the table never turns the limit off.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// Clients tracked at once; beyond, once idle ones are gone, new clients share the
/// overflow bucket.
pub const MAX_CLIENTS: usize = 16_384;

/// The key of the bucket new clients share while the table is full: `ffff:…:ffff`, which
/// no client sends from.
const OVERFLOW: (bool, u128) = (false, u128::MAX);

/// What the limit allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitSettings {
    /// Responses per second to one client address, and the burst allowed; 0 turns
    /// limiting off.
    pub responses_per_second: u32,
    /// Every `slip`-th response over the limit goes out truncated; 0 drops them all.
    pub slip: u32,
}

impl Default for RateLimitSettings {
    /// High enough for the busiest pod (a request through a search path costs up to 5
    /// queries), low enough to bound what a forged flood gets.
    fn default() -> RateLimitSettings {
        RateLimitSettings {
            responses_per_second: 10_000,
            slip: 2,
        }
    }
}

/// What to do with one response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Send,
    /// Send it truncated: header and question, TC set, no records.
    Slip,
    Drop,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
    over: u32,
}

/// The limiter; shared by every listener.
#[derive(Debug)]
pub struct RateLimit {
    settings: RateLimitSettings,
    buckets: Mutex<HashMap<(bool, u128), Bucket>>,
}

impl RateLimit {
    pub fn new(settings: RateLimitSettings) -> RateLimit {
        RateLimit {
            settings,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict for one response to `client` at `now`, and whether it was judged in
    /// the bucket new clients share while the table is full of clients that are not idle.
    pub fn check(&self, client: IpAddr, now: Instant) -> (Verdict, bool) {
        let mut shared = false;
        let verdict = self.judge(client, now, &mut shared);
        (verdict, shared)
    }

    fn judge(&self, client: IpAddr, now: Instant, shared: &mut bool) -> Verdict {
        let rate = self.settings.responses_per_second;
        if rate == 0 || client.to_canonical().is_loopback() {
            return Verdict::Send;
        }
        let rate = f64::from(rate);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let mut key = key_of(client);
        if !buckets.contains_key(&key) && buckets.len() >= MAX_CLIENTS {
            // A bucket refilled to the brim is idle: forget those.
            buckets.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.refilled).as_secs_f64() * rate < rate
            });
            if buckets.len() >= MAX_CLIENTS {
                key = OVERFLOW;
                *shared = true;
            }
        }
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: rate,
            refilled: now,
            over: 0,
        });
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            bucket.over = 0;
            return Verdict::Send;
        }
        bucket.over = bucket.over.wrapping_add(1);
        match self.settings.slip {
            0 => Verdict::Drop,
            slip if bucket.over.is_multiple_of(slip) => Verdict::Slip,
            _ => Verdict::Drop,
        }
    }
}

/// The client's address as a bucket's key: an IPv4 one (also when mapped into IPv6) as
/// its number below 2^32, which no IPv6 client other than those in `::/96` shares.
fn key_of(client: IpAddr) -> (bool, u128) {
    match client.to_canonical() {
        IpAddr::V4(v4) => (true, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (false, u128::from(v6)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limit(responses_per_second: u32, slip: u32) -> RateLimit {
        RateLimit::new(RateLimitSettings {
            responses_per_second,
            slip,
        })
    }

    #[test]
    fn a_client_gets_its_rate_then_every_second_response_slips() {
        let limit = limit(10, 2);
        let now = Instant::now();
        let client: IpAddr = "10.244.1.7".parse().expect("ip");
        let verdicts: Vec<Verdict> = (0..14).map(|_| limit.check(client, now).0).collect();
        assert!(
            verdicts[..10].iter().all(|v| *v == Verdict::Send),
            "{verdicts:?}"
        );
        assert_eq!(
            verdicts[10..],
            [Verdict::Drop, Verdict::Slip, Verdict::Drop, Verdict::Slip],
        );
        // A neighbour in the same /24 (a pod beside it) has its own bucket, and so does
        // the same address in IPv6.
        for other in ["10.244.1.200", "fd00::10.244.1.7", "::ffff:10.244.1.8"] {
            let other: IpAddr = other.parse().expect("ip");
            assert_eq!(limit.check(other, now).0, Verdict::Send, "{other}");
        }
        assert_ne!(
            limit.check("::ffff:10.244.1.7".parse().expect("ip"), now).0,
            Verdict::Send,
            "a mapped address is the IPv4 client"
        );
        // Tokens come back with time: 10 a second.
        let later = now + Duration::from_millis(300);
        let sent = (0..10)
            .filter(|_| limit.check(client, later).0 == Verdict::Send)
            .count();
        assert_eq!(sent, 3);
    }

    #[test]
    fn loopback_and_a_zero_rate_are_never_limited() {
        let now = Instant::now();
        let tight = limit(1, 0);
        for _ in 0..100 {
            assert_eq!(
                tight.check("127.0.0.1".parse().expect("ip"), now).0,
                Verdict::Send
            );
            assert_eq!(
                tight.check("::1".parse().expect("ip"), now).0,
                Verdict::Send
            );
        }
        assert_eq!(
            tight.check("10.0.0.1".parse().expect("ip"), now).0,
            Verdict::Send
        );
        assert_eq!(
            tight.check("10.0.0.1".parse().expect("ip"), now).0,
            Verdict::Drop
        );
        let off = limit(0, 2);
        assert!(
            (0..100).all(|_| off.check("10.0.0.1".parse().expect("ip"), now).0 == Verdict::Send)
        );
    }

    #[test]
    fn the_table_is_bounded_and_forgets_idle_prefixes_first() {
        let limit = limit(5, 2);
        let now = Instant::now();
        for i in 0..MAX_CLIENTS as u32 {
            limit.check(IpAddr::from((0x0a00_0000 + i).to_be_bytes()), now);
        }
        let (stranger, another) = (IpAddr::from([11, 0, 0, 1]), IpAddr::from([11, 0, 0, 2]));
        // Full, none idle yet: new clients share one bucket of one client's rate, and
        // it is counted; the limit does not turn off.
        let shared = (0..20)
            .filter(|i| {
                let client = if i % 2 == 0 { stranger } else { another };
                limit.check(client, now).0 == Verdict::Send
            })
            .count();
        assert_eq!(shared, 5);
        assert!(limit.check(stranger, now).1, "judged in the shared bucket");
        // A second later every bucket is full again: idle, forgotten, and the stranger
        // gets a bucket of its own.
        let later = now + Duration::from_secs(1);
        let sent = (0..20)
            .filter(|_| limit.check(stranger, later).0 == Verdict::Send)
            .count();
        assert_eq!(sent, 5);
        assert!(limit.buckets.lock().expect("lock").len() < MAX_CLIENTS);
    }
}
