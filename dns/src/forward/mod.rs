//! Forwarding names outside the cluster zone to upstream resolvers, with a cache.
//!
//! Upstreams come from a resolv.conf (the host's by default), minus nodus's own addresses,
//! so that a node whose resolv.conf points at nodus does not loop; stub domains
//! ([`ForwardConfig::zones`]) send the names of a zone to upstreams of their own. A question
//! goes to one upstream after another in the order of the [`Policy`], those that are up
//! first ([`upstream`]): over UDP, again over TCP when the answer is truncated, and on to
//! the next after a timeout or a SERVFAIL. An upstream that fails twice in a row is down:
//! asked last, and health-checked in the background until it answers. With a single
//! upstream, a lost datagram is asked again once.
//!
//! Answers are cached ([`cache`]) by question, DO and CD bits included, for their TTL, at
//! most for a configured time (kubeadm's `cache 30`), which also caps the TTLs clients are
//! given. When every upstream fails the client gets SERVFAIL, remembered for a few seconds
//! so that a dead uplink is not asked again by every retry; an answer past its TTL is
//! served instead within the serve-stale window (RFC 8767). A popular answer near its end
//! is fetched again in the background (prefetch). At most `max_concurrent` questions are
//! upstream at once; past that a question is refused, as CoreDNS's forward plugin does.
//!
//! The DNSSEC bits of the client are passed on: DO brings the signatures, CD turns the
//! upstream's validation off, and the upstream's AD is relayed.
//!
//! An upstream can still lead back to nodus (a node resolver that forwards to the cluster
//! DNS, a NodeLocal-style cache): every miss would then circle until it times out. At start,
//! and again whenever the upstreams or stub domains change (the cluster's DNS ConfigMap),
//! as CoreDNS's `loop` plugin does, each upstream is asked a random name only this process
//! knows (`probe_for_loops`); if that name arrives at our own server
//! ([`Forwarder::is_loop_probe`]), the upstream is left out from then on, with one error in
//! the log that names it.

mod cache;
mod model;
mod upstream;

pub use cache::cache_ttl;
use cache::{Cache, CacheKey, Cached};
pub use model::{Dnssec, ForwardConfig, Forwarded, Policy, Resolution};
#[cfg(test)]
pub(crate) use upstream::parse_resolv_conf;
pub(crate) use upstream::random_u64;
pub use upstream::{
    Reply, Upstream, UpstreamError, UpstreamStats, read_answer, upstreams_from_resolv_conf,
};

use hickory_proto::op::{Query, ResponseCode};
pub use hickory_proto::rr::Name;
use hickory_proto::rr::RecordType;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a loop probe's name is watched for after it was sent: a loop may take a few
/// hops through caches that wait for their own upstreams.
const LOOP_PROBE_WINDOW: Duration = Duration::from_secs(10);
/// How often an upstream that is down is checked, as CoreDNS's `health_check 0.5s`.
const HEALTH_CHECK_PERIOD: Duration = Duration::from_millis(500);

/// Counters for the metrics endpoint.
#[derive(Default)]
pub struct ForwardStats {
    pub forwarded: AtomicU64,
    pub cache_hits: AtomicU64,
    /// Of the hits, those that were denials (NXDOMAIN, NODATA).
    pub cache_denial_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub failures: AtomicU64,
    /// Questions refused over `max_concurrent`.
    pub refused: AtomicU64,
    /// Answers served past their TTL because the upstreams failed.
    pub served_stale: AtomicU64,
    pub prefetches: AtomicU64,
    /// Questions for which every upstream was down.
    pub all_down: AtomicU64,
}

/// The upstreams of a zone, or of every other name.
type Group = Box<[Arc<Upstream>]>;

/// Which upstreams answer which names.
struct Routes {
    default: Group,
    /// Stub domains, longest first: a name goes to the first zone that holds it.
    zones: Box<[(Name, Group)]>,
}

impl Routes {
    /// Routes to `upstreams` and `zones`, keeping what is known of an address already in
    /// `before`.
    fn new(upstreams: &[SocketAddr], zones: &[(Name, Vec<SocketAddr>)], before: &Routes) -> Routes {
        let mut known: Vec<Arc<Upstream>> = before.all();
        let mut upstreams_of = |addrs: &[SocketAddr]| -> Group {
            addrs
                .iter()
                .map(|addr| match known.iter().find(|u| u.addr == *addr) {
                    Some(upstream) => upstream.clone(),
                    None => {
                        let upstream = Arc::new(Upstream::new(*addr));
                        known.push(upstream.clone());
                        upstream
                    }
                })
                .collect()
        };
        let default = upstreams_of(upstreams);
        let mut zones: Vec<(Name, Group)> = zones
            .iter()
            .map(|(zone, addrs)| (zone.to_lowercase(), upstreams_of(addrs)))
            .collect();
        zones.sort_by_key(|(zone, _)| std::cmp::Reverse(zone.num_labels()));
        Routes {
            default,
            zones: zones.into(),
        }
    }

    fn empty() -> Routes {
        Routes {
            default: Box::new([]),
            zones: Box::new([]),
        }
    }

    /// The upstreams for `name` (lowercase).
    fn for_name(&self, name: &Name) -> &[Arc<Upstream>] {
        self.zones
            .iter()
            .find(|(zone, _)| zone.zone_of(name))
            .map_or(&self.default, |(_, upstreams)| upstreams)
    }

    /// Every upstream once.
    fn all(&self) -> Vec<Arc<Upstream>> {
        let mut all: Vec<Arc<Upstream>> = Vec::new();
        let every = self
            .default
            .iter()
            .chain(self.zones.iter().flat_map(|(_, u)| u.iter()));
        for upstream in every {
            if !all.iter().any(|u| Arc::ptr_eq(u, upstream)) {
                all.push(upstream.clone());
            }
        }
        all
    }
}

pub struct Forwarder {
    config: ForwardConfig,
    routes: RwLock<Arc<Routes>>,
    cache: Mutex<Cache>,
    /// Questions upstream now, in all and per client.
    in_flight: Mutex<InFlightCounts>,
    /// Where the next round-robin question starts.
    next: AtomicUsize,
    pub stats: ForwardStats,
    /// The loop probes being watched for, each with its upstream and until when.
    probes: Mutex<Vec<LoopProbe>>,
    /// Whether any probe is watched for: the check on every forwarded name is one load.
    probing: AtomicBool,
    /// Wakes the loop prober when the upstreams were replaced.
    upstreams_changed: tokio::sync::Notify,
}

/// A random name asked of `upstream`, watched for at our own server until `until`.
struct LoopProbe {
    name: Name,
    upstream: Arc<Upstream>,
    until: Instant,
}

/// The share of the questions upstream one client may hold: an eighth. One pod asking
/// for names of a black-holed zone (each holds its place for the upstreams' timeouts)
/// then cannot take every place and get every pod's outside names refused.
const CLIENT_SHARE: usize = 8;

#[derive(Default)]
struct InFlightCounts {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
}

/// One question upstream for `client`, counted until dropped.
struct InFlight<'f> {
    counts: &'f Mutex<InFlightCounts>,
    client: IpAddr,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.total -= 1;
        if let Some(count) = counts.per_client.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                counts.per_client.remove(&self.client);
            }
        }
    }
}

impl Forwarder {
    pub fn new(config: ForwardConfig) -> Forwarder {
        let routes = Routes::new(&config.upstreams, &config.zones, &Routes::empty());
        Forwarder {
            config,
            routes: RwLock::new(Arc::new(routes)),
            cache: Mutex::new(Cache::default()),
            in_flight: Mutex::default(),
            next: AtomicUsize::new(0),
            stats: ForwardStats::default(),
            probes: Mutex::new(Vec::new()),
            probing: AtomicBool::new(false),
            upstreams_changed: tokio::sync::Notify::new(),
        }
    }

    fn routes(&self) -> Arc<Routes> {
        self.routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the upstreams and the stub domains (the cluster's DNS ConfigMap changed).
    /// What is known of an address kept stays; the cache is emptied, since its answers came
    /// from the upstreams before. The upstreams are probed for loops again
    /// ([`Forwarder::watch_upstreams`]).
    pub fn set_upstreams(&self, upstreams: &[SocketAddr], zones: &[(Name, Vec<SocketAddr>)]) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        *routes = Arc::new(Routes::new(upstreams, zones, &routes));
        drop(routes);
        self.cache().clear();
        // A permit is kept if the prober is busy sending: it probes again right after.
        self.upstreams_changed.notify_one();
    }

    /// Every upstream, for metrics and status.
    pub fn upstreams(&self) -> Vec<Arc<Upstream>> {
        self.routes().all()
    }

    /// Upstreams found to send our questions back to us.
    pub fn looping_upstreams(&self) -> Vec<SocketAddr> {
        self.upstreams()
            .iter()
            .filter(|u| u.is_looping())
            .map(|u| u.addr)
            .collect()
    }

    /// Looks after the upstreams for as long as the server runs: the loop probes at start
    /// and after every change of the upstreams, and a health check of each upstream that
    /// is down every [`HEALTH_CHECK_PERIOD`].
    pub async fn watch_upstreams(&self) {
        let loop_probes = async {
            loop {
                self.probe_for_loops().await;
                tokio::select! {
                    () = self.upstreams_changed.notified() => {}
                    () = tokio::time::sleep(LOOP_PROBE_WINDOW) => {
                        self.forget_expired_probes();
                        self.upstreams_changed.notified().await;
                    }
                }
            }
        };
        let health_checks = async {
            loop {
                tokio::time::sleep(HEALTH_CHECK_PERIOD).await;
                let mut checks = tokio::task::JoinSet::new();
                for upstream in self.upstreams().into_iter().filter(|u| u.is_down()) {
                    let timeout = self.config.timeout;
                    checks.spawn(async move { upstream.check_health(timeout).await });
                }
                while checks.join_next().await.is_some() {}
            }
        };
        tokio::join!(loop_probes, health_checks);
    }

    fn loop_probes(&self) -> std::sync::MutexGuard<'_, Vec<LoopProbe>> {
        self.probes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks every upstream a random name of its own, watched for [`LOOP_PROBE_WINDOW`]
    /// from now (with those of earlier rounds still in their windows). The answers do not
    /// matter.
    async fn probe_for_loops(&self) {
        let until = Instant::now() + LOOP_PROBE_WINDOW;
        let round: Vec<(Name, Arc<Upstream>)> = self
            .upstreams()
            .into_iter()
            .filter_map(|u| Some((loop_probe_name()?, u)))
            .collect();
        self.forget_expired_probes();
        self.loop_probes()
            .extend(round.iter().map(|(name, upstream)| LoopProbe {
                name: name.clone(),
                upstream: upstream.clone(),
                until,
            }));
        self.probing.store(true, Relaxed);
        for (name, upstream) in &round {
            let probe = Query::query(name.clone(), RecordType::HINFO);
            upstream.probe(&probe, self.config.timeout).await;
        }
    }

    fn forget_expired_probes(&self) {
        let now = Instant::now();
        let mut probes = self.loop_probes();
        probes.retain(|probe| probe.until > now);
        self.probing.store(!probes.is_empty(), Relaxed);
    }

    /// Whether `name`, asked of our server, is one of our loop probes come back: its
    /// upstream is left out from now on (logged once), and the question is not forwarded.
    pub fn is_loop_probe(&self, name: &Name) -> bool {
        if !self.probing.load(Relaxed) {
            return false;
        }
        let probes = self.loop_probes();
        let lower = name.to_lowercase();
        let Some(LoopProbe { upstream, .. }) = probes.iter().find(|probe| probe.name == lower)
        else {
            return false;
        };
        if upstream.mark_looping() {
            tracing::error!(
                upstream = %upstream.addr,
                "forwarding loop: this upstream sends the questions nodus forwards back to \
                 nodus; it is left out. Point resolv.conf (dns.resolv_conf) at a resolver \
                 that does not forward to the cluster DNS"
            );
        }
        true
    }

    /// Entries and wire bytes in the cache, for metrics.
    pub fn cache_size(&self) -> (usize, usize) {
        let cache = self.cache();
        (cache.len(), cache.bytes)
    }

    /// Entries in the cache, and of them those that hold a denial (NXDOMAIN, NODATA), read
    /// together.
    pub fn cache_entries_and_denials(&self) -> (usize, usize) {
        let cache = self.cache();
        (cache.len(), cache.denials)
    }

    /// Answers `query` from the cache or the upstreams, asked for `client`.
    pub async fn resolve(
        self: &Arc<Self>,
        query: &Query,
        dnssec: Dnssec,
        client: IpAddr,
    ) -> Resolution {
        let key = CacheKey::new(query, dnssec);
        let cached = self.cache().lookup(&key, Instant::now(), &self.config);
        let stale = match cached {
            Cached::Fresh { answer, prefetch } => {
                self.stats.cache_hits.fetch_add(1, Relaxed);
                if answer.is_denial() {
                    self.stats.cache_denial_hits.fetch_add(1, Relaxed);
                }
                if prefetch {
                    self.prefetch(key, query.clone(), dnssec, client);
                }
                return Resolution::Answered(answer);
            }
            Cached::Failing(stale) => {
                self.stats.cache_hits.fetch_add(1, Relaxed);
                return self.failed(stale);
            }
            Cached::Stale(stale) => Some(stale),
            Cached::Miss => None,
        };
        // Only stub domains, and a name outside them: refused, as a non-recursive server.
        // (Such a name is never cached: a change of routes empties the cache.)
        let routes = self.routes();
        let upstreams = routes.for_name(&key.name);
        if upstreams.is_empty() {
            return Resolution::Refused;
        }
        self.stats.cache_misses.fetch_add(1, Relaxed);
        let Some(_slot) = self.take_slot(client) else {
            self.stats.refused.fetch_add(1, Relaxed);
            return Resolution::Refused;
        };
        self.stats.forwarded.fetch_add(1, Relaxed);
        match self.ask_upstreams(upstreams, query, dnssec).await {
            Some((answer, wire_size)) => Resolution::Answered(self.store(key, answer, wire_size)),
            None => {
                self.stats.failures.fetch_add(1, Relaxed);
                self.cache()
                    .remember_failure(key, &self.config, Instant::now());
                self.failed(stale)
            }
        }
    }

    /// What a client gets when the upstreams fail: the answer past its TTL, or SERVFAIL.
    fn failed(&self, stale: Option<Forwarded>) -> Resolution {
        match stale {
            Some(answer) => {
                self.stats.served_stale.fetch_add(1, Relaxed);
                Resolution::Answered(answer)
            }
            None => Resolution::Failed,
        }
    }

    /// Caches `answer` as long as it may be, and gives it back with its TTLs capped to that:
    /// as CoreDNS's cache, no client is told to keep an answer longer than it is kept here.
    fn store(&self, key: CacheKey, mut answer: Forwarded, wire_size: usize) -> Forwarded {
        let config = &self.config;
        if let Some(ttl) = cache_ttl(&answer, config.max_ttl, config.max_denial_ttl) {
            for record in answer.records_mut() {
                record.ttl = record.ttl.min(ttl);
            }
            self.cache()
                .insert(key, answer.clone(), wire_size, ttl, config, Instant::now());
        }
        answer
    }

    /// Fetches a popular answer again before it expires, in the background, when a place
    /// upstream is free (counted to `client`, whose question found it about to expire).
    fn prefetch(self: &Arc<Self>, key: CacheKey, query: Query, dnssec: Dnssec, client: IpAddr) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let forwarder = self.clone();
        runtime.spawn(async move {
            let Some(_slot) = forwarder.take_slot(client) else {
                return;
            };
            forwarder.stats.prefetches.fetch_add(1, Relaxed);
            let routes = forwarder.routes();
            let upstreams = routes.for_name(&key.name);
            if let Some((answer, wire_size)) =
                forwarder.ask_upstreams(upstreams, &query, dnssec).await
            {
                forwarder.store(key, answer, wire_size);
            }
        });
    }

    /// The first answer of `upstreams` (those of `query`'s name), asked in the policy's
    /// order, those that are up first; a SERVFAIL is passed over like silence.
    async fn ask_upstreams(
        &self,
        upstreams: &[Arc<Upstream>],
        query: &Query,
        dnssec: Dnssec,
    ) -> Option<(Forwarded, usize)> {
        for upstream in self.order(upstreams) {
            match upstream.ask(query, dnssec, self.config.timeout).await {
                Ok((answer, _)) if answer.rcode == ResponseCode::ServFail => {
                    tracing::debug!(upstream = %upstream.addr, name = %query.name(), "upstream answered SERVFAIL");
                }
                Ok(answer) => return Some(answer),
                Err(error) => {
                    tracing::debug!(upstream = %upstream.addr, %error, name = %query.name(), "upstream failed");
                }
            }
        }
        None
    }

    /// The upstreams to ask, in order: the policy's order with those that are up first,
    /// without those that loop; a single upstream twice, for a lost datagram.
    fn order(&self, upstreams: &[Arc<Upstream>]) -> Vec<Arc<Upstream>> {
        let mut order: Vec<Arc<Upstream>> = upstreams
            .iter()
            .filter(|u| !u.is_looping())
            .cloned()
            .collect();
        match self.config.policy {
            Policy::Sequential => {}
            Policy::Random => {
                for last in (1..order.len()).rev() {
                    let pick = (random_u64() % (last as u64 + 1)) as usize;
                    order.swap(last, pick);
                }
            }
            Policy::RoundRobin if !order.is_empty() => {
                let start = self.next.fetch_add(1, Relaxed) % order.len();
                order.rotate_left(start);
            }
            Policy::RoundRobin => {}
        }
        // A stable sort: the policy's order holds among those up, and among those down.
        order.sort_by_key(|u| u.is_down());
        if order.first().is_some_and(|u| u.is_down()) {
            self.stats.all_down.fetch_add(1, Relaxed);
        }
        if let [only] = order.as_slice() {
            order.push(only.clone());
        }
        order
    }

    /// A place among the `max_concurrent` questions upstream for `client`, if one is
    /// free and the client holds less than its share.
    fn take_slot(&self, client: IpAddr) -> Option<InFlight<'_>> {
        let client = client.to_canonical();
        let share = (self.config.max_concurrent / CLIENT_SHARE).max(1);
        let mut counts = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let held = counts.per_client.get(&client).copied().unwrap_or(0);
        if counts.total >= self.config.max_concurrent || held >= share {
            return None;
        }
        counts.total += 1;
        counts.per_client.insert(client, held + 1);
        Some(InFlight {
            counts: &self.in_flight,
            client,
        })
    }
}

/// An upstream as configured: an address, on port 53 unless it says (`10.0.0.5`,
/// `10.0.0.5:8600`, `fd00::5`, `[fd00::5]:5353`).
pub fn upstream_address(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    text.parse::<SocketAddr>()
        .or_else(|_| text.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| format!("{text:?} is not an address (10.0.0.5, 10.0.0.5:8600, fd00::5)"))
}

/// A stub domain as configured: its zone, and the upstreams its names go to. None may be in
/// `cluster_domain`, which nodus answers from the cluster.
pub fn stub_domain(
    zone: &str,
    upstreams: &[String],
    cluster_domain: &str,
) -> Result<(Name, Vec<SocketAddr>), String> {
    let name = Name::from_ascii(zone)
        .ok()
        .filter(|name| !name.is_root())
        .ok_or_else(|| format!("{zone:?} is not a domain"))?;
    if upstreams.is_empty() {
        return Err(format!("{zone}: no upstream"));
    }
    let upstreams = upstreams
        .iter()
        .map(|upstream| upstream_address(upstream))
        .collect::<Result<_, _>>()
        .map_err(|error| format!("{zone}: {error}"))?;
    let mut name = name.to_lowercase();
    name.set_fqdn(true);
    let cluster = format!("{}.", cluster_domain.trim_end_matches('.').to_lowercase());
    let text = name.to_ascii();
    if text == cluster || text.ends_with(&format!(".{cluster}")) {
        return Err(format!(
            "{zone:?} is in the cluster domain, which nodus answers from the cluster itself"
        ));
    }
    Ok((name, upstreams))
}

/// A name no one else asks: two random labels under the root, as CoreDNS's loop plugin
/// makes them (an upstream that does not loop gets NXDOMAIN from the root).
fn loop_probe_name() -> Option<Name> {
    Name::from_ascii(format!("{:016x}.{:016x}.", random_u64(), random_u64())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().expect("addr")).collect()
    }

    #[test]
    fn stub_domains_take_their_names_and_the_longest_zone_wins() {
        let zone = |name: &str| Name::from_ascii(name).expect("name");
        let zones = vec![
            (zone("corp.example."), addrs(&["10.0.0.1:53"])),
            (zone("lab.corp.example."), addrs(&["10.0.0.2:53"])),
            (zone("Consul."), addrs(&["10.0.0.3:8600", "10.0.0.1:53"])),
        ];
        let routes = Routes::new(&addrs(&["192.0.2.53:53"]), &zones, &Routes::empty());
        let to = |name: &str| -> Vec<SocketAddr> {
            routes
                .for_name(&zone(name).to_lowercase())
                .iter()
                .map(|u| u.addr)
                .collect()
        };
        assert_eq!(to("www.corp.example."), addrs(&["10.0.0.1:53"]));
        assert_eq!(to("db.lab.corp.example."), addrs(&["10.0.0.2:53"]));
        assert_eq!(
            to("web.service.CONSUL."),
            addrs(&["10.0.0.3:8600", "10.0.0.1:53"])
        );
        assert_eq!(to("example.org."), addrs(&["192.0.2.53:53"]));
        assert_eq!(to("notcorp.example."), addrs(&["192.0.2.53:53"]));
        // One state per address, shared by every zone that names it.
        assert_eq!(routes.all().len(), 4);
        let again = Routes::new(&addrs(&["10.0.0.1:53"]), &[], &routes);
        assert!(Arc::ptr_eq(
            &again.default[0],
            &routes.for_name(&zone("corp.example."))[0]
        ));
    }

    #[test]
    fn stub_domains_are_read_with_their_ports() {
        let (zone, upstreams) = stub_domain(
            "Consul",
            &[
                "10.0.0.3:8600".into(),
                "fd00::53".into(),
                " 10.0.0.4 ".into(),
            ],
            "cluster.local",
        )
        .expect("valid");
        assert_eq!(zone, Name::from_ascii("consul.").expect("name"));
        assert_eq!(
            upstreams,
            addrs(&["10.0.0.3:8600", "[fd00::53]:53", "10.0.0.4:53"])
        );
        assert!(stub_domain("consul", &[], "cluster.local").is_err());
        assert!(stub_domain(".", &["10.0.0.3".into()], "cluster.local").is_err());
        assert!(stub_domain("a..b", &["10.0.0.3".into()], "cluster.local").is_err());
        let error =
            stub_domain("consul", &["dns.example".into()], "cluster.local").expect_err("a name");
        assert!(
            error.contains("consul") && error.contains("dns.example"),
            "{error}"
        );
        for zone in ["svc.Cluster.Local", "cluster.local."] {
            let error = stub_domain(zone, &["10.0.0.3".into()], "cluster.local").expect_err(zone);
            assert!(error.contains("cluster domain"), "{error}");
        }
        assert!(stub_domain("notcluster.local", &["10.0.0.3".into()], "cluster.local").is_ok());
    }

    #[test]
    fn one_client_holds_only_its_share_of_the_questions_upstream() {
        let forwarder = Forwarder::new(ForwardConfig {
            max_concurrent: 16,
            ..ForwardConfig::default()
        });
        let (busy, quiet) = (IpAddr::from([10, 244, 1, 7]), IpAddr::from([10, 244, 1, 8]));
        let held: Vec<_> = (0..16).filter_map(|_| forwarder.take_slot(busy)).collect();
        assert_eq!(held.len(), 2, "an eighth of 16");
        assert!(
            forwarder.take_slot(quiet).is_some(),
            "its neighbour still asks"
        );
        drop(held);
        assert!(forwarder.take_slot(busy).is_some(), "its places come back");
        let everyone: Vec<_> = (0..20u8)
            .flat_map(|pod| [IpAddr::from([10, 244, 2, pod]); 2])
            .filter_map(|client| forwarder.take_slot(client))
            .collect();
        assert_eq!(everyone.len(), 16, "and the total is bounded");
    }

    #[test]
    fn upstreams_that_are_down_are_asked_last_in_the_policy_order() {
        let forwarder = |policy| {
            Forwarder::new(ForwardConfig {
                upstreams: addrs(&["10.0.0.1:53", "10.0.0.2:53", "10.0.0.3:53"]),
                policy,
                ..ForwardConfig::default()
            })
        };
        let order = |f: &Forwarder| -> Vec<SocketAddr> {
            f.order(&f.routes().default)
                .iter()
                .map(|u| u.addr)
                .collect()
        };
        let sequential = forwarder(Policy::Sequential);
        assert_eq!(
            order(&sequential),
            addrs(&["10.0.0.1:53", "10.0.0.2:53", "10.0.0.3:53"])
        );
        let first = sequential.routes().default[0].clone();
        for _ in 0..upstream::MAX_FAILS {
            first.record_health(&Err::<(), _>(UpstreamError::Timeout));
        }
        assert_eq!(
            order(&sequential),
            addrs(&["10.0.0.2:53", "10.0.0.3:53", "10.0.0.1:53"])
        );
        let round_robin = forwarder(Policy::RoundRobin);
        let starts: Vec<SocketAddr> = (0..4).map(|_| order(&round_robin)[0]).collect();
        assert_eq!(
            starts,
            addrs(&["10.0.0.1:53", "10.0.0.2:53", "10.0.0.3:53", "10.0.0.1:53"])
        );
        let random = forwarder(Policy::Random);
        let firsts: std::collections::BTreeSet<SocketAddr> =
            (0..50).map(|_| order(&random)[0]).collect();
        assert_eq!(firsts.len(), 3, "fifty random orders, {firsts:?} first");
        let single = Forwarder::new(ForwardConfig {
            upstreams: addrs(&["10.0.0.9:53"]),
            ..ForwardConfig::default()
        });
        assert_eq!(order(&single), addrs(&["10.0.0.9:53", "10.0.0.9:53"]));
    }
}
