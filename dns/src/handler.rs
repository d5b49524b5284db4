//! The one request pipeline: every UDP datagram and every TCP message, whichever listener
//! read it, goes through the same three steps of [`ClusterDns`].
//!
//! 1. **Front** ([`ClusterDns::front`]): over UDP the rate limit ([`crate::rate`]), then
//!    the allow-list ([`crate::allow`]), then the fast path ([`crate::fast`]), which answers
//!    the common questions from the packet bytes without allocating.
//! 2. **Full path** ([`ClusterDns::answer_message`]), for the rest: the message parsed with
//!    hickory-proto, a lookup ([`crate::lookup`]), the host records or a forwarded question
//!    ([`crate::forward`]) decided as a [`Reply`], and one encoding within the size the
//!    requester takes.
//! 3. **End** ([`ClusterDns::answered`]): every answer, from either path, counted in the
//!    metrics and sampled into the query log, once.
//!
//! The listeners that call it (`udp`, `tcp`, `server`) come after it: nothing here knows
//! them.

use crate::allow::{AllowList, AllowedPrefixes};
use crate::autopath::{self, Walked};
use crate::fast;
use crate::forward::{Dnssec, Forwarder, Resolution};
use crate::hosts::HostsSource;
use crate::lookup::{Answer, MAX_UDP_PAYLOAD, Outcome, Zone, lookup};
use crate::metrics::{DnsMetrics, Transport};
use crate::querylog::QueryLog;
use crate::rate::Verdict;
use crate::rate::{RateLimit, RateLimitSettings};
use hickory_proto::op::{
    Edns, Header, HeaderCounts, Message, MessageType, Metadata, OpCode, Query, ResponseCode,
    emit_message_parts,
};
use hickory_proto::rr::rdata::CNAME;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncodable, BinEncoder};
use nodus_view::{View, ViewReader};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

/// What the allow-list is built from besides the view: the prefixes allowed whatever it
/// holds, and this host's addresses.
#[derive(Debug, Default)]
struct AllowInputs {
    prefixes: AllowedPrefixes,
    host: Vec<IpAddr>,
}

/// Answers the cluster zone from the view, and forwards the rest. Clones share everything.
#[derive(Clone)]
pub struct ClusterDns {
    /// Until the view is whole (complete, or restored from disk), a name it lacks may only
    /// be missing from it: misses get SERVFAIL (which resolvers retry) rather than an
    /// NXDOMAIN they would cache, as CoreDNS does before it syncs.
    pub(crate) view: ViewReader,
    /// Who may ask ([`crate::allow`]), rebuilt when Nodes or this host's addresses change.
    pub(crate) allow: Arc<RwLock<Arc<AllowList>>>,
    /// What it is built from besides the view.
    allow_inputs: Arc<Mutex<AllowInputs>>,
    pub(crate) zone: Arc<Zone>,
    forwarder: Option<Arc<Forwarder>>,
    /// Host records, asked before the upstreams ([`crate::hosts`]).
    hosts: Option<Arc<HostsSource>>,
    pub(crate) metrics: Arc<DnsMetrics>,
    /// UDP responses per client prefix ([`crate::rate`]).
    pub(crate) rate: Arc<RateLimit>,
    /// Which queries are logged ([`crate::querylog`]).
    pub(crate) query_log: Arc<QueryLog>,
}

/// What a batch of messages shares at the front of the pipeline ([`ClusterDns::at_front`]).
pub(crate) struct AtFront<'v> {
    view: Option<RwLockReadGuard<'v, View>>,
    allow: Arc<AllowList>,
    arrived: Instant,
}

/// Where the front of the pipeline sends a message.
pub(crate) enum Front {
    /// Answered into the caller's buffer (`len` bytes).
    Answered(fast::Reply),
    /// Nothing goes back: over the rate limit, without a slip.
    Dropped,
    /// The full path answers it; `allowed`: the client is on the allow-list.
    Full { allowed: bool },
}

/// One answered message, as the end of the pipeline records it.
#[derive(Clone, Copy)]
pub(crate) struct Answered<'p> {
    pub src: SocketAddr,
    pub tcp: bool,
    pub qtype: RecordType,
    pub rcode: ResponseCode,
    /// The query, parsed again only for the query log.
    pub query: &'p [u8],
}

/// What a request gets, decided before anything is encoded or sent.
enum Reply {
    /// A response code without records: a request we do not answer, a miss before the
    /// view is whole, or a name to forward without upstreams.
    Code(ResponseCode),
    /// An authoritative answer from the cluster zone (AA).
    Zone(Answer),
    /// The zone's answer from a view restored from disk that the lists have not confirmed
    /// yet: the same records, without AA, since they may be up to a day old.
    Restored(Answer),
    /// What forwarding got (RA).
    Forwarded(Resolution),
}

impl Reply {
    fn rcode(&self) -> ResponseCode {
        match self {
            Reply::Code(code) => *code,
            Reply::Zone(answer) | Reply::Restored(answer) => answer.rcode,
            Reply::Forwarded(Resolution::Answered(upstream)) => upstream.rcode,
            Reply::Forwarded(Resolution::Failed) => ResponseCode::ServFail,
            Reply::Forwarded(Resolution::Refused) => ResponseCode::Refused,
        }
    }

    /// The answer section, when the reply has records.
    fn answers_mut(&mut self) -> Option<&mut Vec<Record>> {
        match self {
            Reply::Zone(answer) | Reply::Restored(answer) => Some(&mut answer.answers),
            Reply::Forwarded(Resolution::Answered(upstream)) => Some(&mut upstream.answers),
            _ => None,
        }
    }

    /// The answer's addresses in a random order, as kubeadm's Corefile ends in
    /// `loadbalance`: clients that take the first address spread over all of them.
    fn shuffle_addresses(&mut self) {
        if let Some(answers) = self.answers_mut() {
            shuffle_addresses(answers);
        }
    }
}

/// Shuffles the A and AAAA records of `records` among their own positions: a CNAME chain
/// before them stays in front.
fn shuffle_addresses(records: &mut [Record]) {
    let positions: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r.record_type(), RecordType::A | RecordType::AAAA))
        .map(|(i, _)| i)
        .collect();
    // Fisher-Yates over the positions.
    for last in (1..positions.len()).rev() {
        let pick = (crate::forward::random_u64() % (last as u64 + 1)) as usize;
        records.swap(positions[last], positions[pick]);
    }
}

impl ClusterDns {
    pub fn new(view: ViewReader, zone: Zone, forwarder: Option<Arc<Forwarder>>) -> ClusterDns {
        ClusterDns {
            metrics: Arc::new(DnsMetrics::new(forwarder.clone())),
            allow: Arc::new(RwLock::new(Arc::new(AllowList::new(&[])))),
            allow_inputs: Arc::default(),
            view,
            zone: Arc::new(zone),
            forwarder,
            hosts: None,
            rate: Arc::new(RateLimit::new(RateLimitSettings::default())),
            query_log: Arc::default(),
        }
    }

    /// The same, with `settings` for UDP responses instead of the defaults.
    pub fn with_rate_limit(mut self, settings: RateLimitSettings) -> ClusterDns {
        self.rate = Arc::new(RateLimit::new(settings));
        self
    }

    /// The same, logging one query in `every` (none with 0).
    pub fn with_query_log(mut self, every: u32) -> ClusterDns {
        self.query_log = Arc::new(QueryLog::new(every));
        self
    }

    /// The same, answering the names of `hosts` before asking the upstreams.
    pub fn with_hosts(mut self, hosts: HostsSource) -> ClusterDns {
        self.hosts = Some(Arc::new(hosts));
        self
    }

    /// A TCP connection closed because its client does not read: counted, and warned of
    /// (the cap is the client's, not the server's, but an operator should see it).
    pub(crate) fn tcp_closed(&self, why: crate::metrics::TcpClosed) {
        let total = self.metrics.tcp_closed(why);
        // At the 1st, 2nd, 4th, 8th… only: a client that keeps doing it cannot fill the log.
        if total.is_power_of_two() {
            tracing::warn!(
                ?why,
                total,
                "DNS TCP connections closed: their clients do not read their replies"
            );
        }
    }

    /// Reads the hosts file again if it changed.
    pub(crate) fn reload_hosts(&self) {
        if let Some(hosts) = &self.hosts {
            hosts.reload();
        }
    }

    pub(crate) fn forwarder(&self) -> Option<&Arc<Forwarder>> {
        self.forwarder.as_ref()
    }

    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    pub fn view(&self) -> &ViewReader {
        &self.view
    }

    /// The clients allowed now.
    pub fn allow_list(&self) -> Arc<AllowList> {
        self.allow
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Rebuilds who may ask from `view` (the handler's own), with `prefixes` or this
    /// host's addresses replaced when given.
    pub(crate) fn rebuild_allow_list(
        &self,
        view: &View,
        prefixes: Option<AllowedPrefixes>,
        host: Option<Vec<IpAddr>>,
    ) {
        let mut inputs = self
            .allow_inputs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(prefixes) = prefixes {
            inputs.prefixes = prefixes;
        }
        if let Some(host) = host {
            inputs.host = host;
        }
        let allow = AllowList::from_view(view, &inputs.prefixes, &inputs.host);
        *self
            .allow
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(allow);
    }

    /// This host's addresses as the allow-list has them.
    pub(crate) fn allowed_host(&self) -> Vec<IpAddr> {
        self.allow_inputs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .host
            .clone()
    }

    /// What a client outside the allow-list gets: REFUSED, or SERVFAIL (which resolvers
    /// retry) while the view, and so the list of Nodes, is not whole.
    pub(crate) fn not_allowed(&self) -> ResponseCode {
        if self.view.is_whole() {
            ResponseCode::Refused
        } else {
            ResponseCode::ServFail
        }
    }

    /// What a batch of messages shares at the front: the view (once it is complete: the
    /// fast path answers with AA, which a view restored from disk does not earn), the
    /// allow-list, and the time the batch arrived.
    pub(crate) fn at_front(&self) -> AtFront<'_> {
        AtFront {
            view: self.view.is_complete().then(|| self.view.read()),
            allow: self.allow_list(),
            arrived: Instant::now(),
        }
    }

    /// The front of the pipeline, for every message: over UDP the rate limit (a slip is
    /// answered truncated), then the allow-list, then the fast path ([`crate::fast`]),
    /// which answers the common questions into `out` without allocating. What it does not
    /// answer goes on to the full path ([`ClusterDns::answer_message`]).
    pub(crate) fn front(
        &self,
        at: &AtFront<'_>,
        packet: &[u8],
        src: SocketAddr,
        tcp: bool,
        out: &mut [u8],
    ) -> Front {
        if !tcp {
            let (verdict, shared) = self.rate.check(src.ip(), at.arrived);
            if shared {
                self.metrics.rate_table_full();
            }
            match verdict {
                Verdict::Send => {}
                Verdict::Drop => {
                    self.metrics.rate_limited(false);
                    return Front::Dropped;
                }
                Verdict::Slip => {
                    self.metrics.rate_limited(true);
                    return fast::truncated(packet, out).map_or(Front::Dropped, Front::Answered);
                }
            }
        }
        let allowed = at.allow.contains(src.ip());
        let fast = at
            .view
            .as_ref()
            .filter(|_| allowed && !tcp)
            .and_then(|view| fast::answer(view, &self.zone, src.ip(), packet, out));
        match fast {
            Some(reply) => Front::Answered(reply),
            None => Front::Full { allowed },
        }
    }

    /// The end of the pipeline, for every answered message whichever path answered it:
    /// counted, and logged when sampled. `took`: from the batch's arrival to the send.
    pub(crate) fn answered<'p>(
        &self,
        done: impl ExactSizeIterator<Item = Answered<'p>>,
        took: Duration,
    ) {
        let count = done.len() as u64;
        for answered in done {
            let transport = Transport::of(answered.src, answered.tcp);
            self.metrics
                .counted(answered.qtype, transport, answered.rcode);
            if self.query_log.sampled()
                && let Some(question) = Message::from_vec(answered.query)
                    .ok()
                    .and_then(|message| message.queries.into_iter().next())
            {
                let (src, tcp) = (answered.src, answered.tcp);
                let qtype = question.query_type();
                QueryLog::log(src, question.name(), qtype, tcp, answered.rcode, took);
            }
        }
        self.metrics.observed(took, count);
    }

    /// The pipeline for one TCP message: its front is the allow-list alone (no rate
    /// limit, and no fast path, whose replies are sized for UDP), then the full path.
    pub(crate) async fn answer_stream(&self, packet: Vec<u8>, src: SocketAddr) -> Option<Vec<u8>> {
        self.answer_checked(packet, src, true).await
    }

    /// The full path for one UDP datagram, past the front's rate limit and fast path (for
    /// tests and fuzzing that compare the two paths).
    pub async fn answer_datagram(&self, packet: Vec<u8>, src: SocketAddr) -> Option<Vec<u8>> {
        self.answer_checked(packet, src, false).await
    }

    /// The full path for a message whose sender the allow-list is asked about now.
    async fn answer_checked(&self, packet: Vec<u8>, src: SocketAddr, tcp: bool) -> Option<Vec<u8>> {
        let allowed = self.allow_list().contains(src.ip());
        self.answer_message(packet, src, tcp, allowed).await
    }

    /// The full path, for what the front did not answer: no reply to a packet without a
    /// header nor to a response, FORMERR to one that does not parse, and otherwise the
    /// reply within the size the requester takes (over UDP its OPT's payload, or 512
    /// bytes, truncated with TC when it does not fit; over TCP up to 65,535 bytes).
    pub(crate) async fn answer_message(
        &self,
        packet: Vec<u8>,
        src: SocketAddr,
        tcp: bool,
        allowed: bool,
    ) -> Option<Vec<u8>> {
        let arrived = Instant::now();
        let header = Header::read(&mut BinDecoder::new(&packet)).ok()?;
        let (bytes, qtype, rcode) = match Message::from_vec(&packet) {
            Err(_) => {
                let mut metadata = Metadata::response_from_request(&header.metadata);
                metadata.response_code = ResponseCode::FormErr;
                (
                    encode_header(metadata)?,
                    RecordType::Unknown(0),
                    ResponseCode::FormErr,
                )
            }
            Ok(request) if request.metadata.message_type == MessageType::Response => return None,
            Ok(request) => {
                let mut reply = self.respond(&request, src, allowed).await;
                reply.shuffle_addresses();
                let (bytes, rcode) = encode(&request, &reply, tcp);
                let qtype = request
                    .queries
                    .first()
                    .map_or(RecordType::Unknown(0), Query::query_type);
                (bytes, qtype, rcode)
            }
        };
        let answered = Answered {
            src,
            tcp,
            qtype,
            rcode,
            query: &packet,
        };
        self.answered(std::iter::once(answered), arrived.elapsed());
        Some(bytes)
    }

    /// The reply to `request` from `src`: REFUSED to our own loop probe come back, to a
    /// client not `allowed` (SERVFAIL until the view is whole), FORMERR without a single
    /// question, NOTIMP for other opcodes, BADVERS for an EDNS version after 0 (RFC
    /// 6891), REFUSED for zone transfers (as CoreDNS), then the zone's answer, or the
    /// upstreams' for a name outside it.
    async fn respond(&self, request: &Message, src: SocketAddr, allowed: bool) -> Reply {
        // Our own loop probe, come back through an upstream (whichever address it comes
        // from, even before the allow-list knows this host): not forwarded again.
        let loop_probe = |forwarder: &Arc<Forwarder>| {
            request
                .queries
                .first()
                .is_some_and(|query| forwarder.is_loop_probe(query.name()))
        };
        if self.forwarder.as_ref().is_some_and(loop_probe) {
            return Reply::Code(ResponseCode::Refused);
        }
        if !allowed {
            return Reply::Code(self.not_allowed());
        }
        let query = match &request.queries[..] {
            [_] if request.metadata.op_code != OpCode::Query => {
                return Reply::Code(ResponseCode::NotImp);
            }
            [_] if request.edns.as_ref().is_some_and(|edns| edns.version() > 0) => {
                return Reply::Code(ResponseCode::BADVERS);
            }
            [query] => query,
            _ => return Reply::Code(ResponseCode::FormErr),
        };

        let dnssec = Dnssec {
            ok: request
                .edns
                .as_ref()
                .is_some_and(|edns| edns.flags().dnssec_ok),
            checking_disabled: request.metadata.checking_disabled,
        };
        if matches!(query.query_type(), RecordType::AXFR | RecordType::IXFR) {
            return Reply::Code(ResponseCode::Refused);
        }
        // The zone and the host records hold class IN only: another class about the zone
        // is refused, about any other name forwarded.
        let internet = query.query_class() == DNSClass::IN;
        if !internet && self.zone.origin().zone_of(&query.name().to_lowercase()) {
            return Reply::Code(ResponseCode::Refused);
        }
        let client = src.ip();
        let reply = self.answer(query, dnssec, client).await;
        let missed =
            matches!(&reply, Reply::Zone(answer) if answer.rcode == ResponseCode::NXDomain);
        let path = self
            .zone
            .autopath()
            .filter(|_| missed)
            .and_then(|node_search| {
                let origin = self.zone.origin();
                autopath::search_after(&self.view.read(), node_search, origin, client, query.name())
            });
        match path {
            Some(path) => self
                .walk(query, path, dnssec, client)
                .await
                .unwrap_or(reply),
            None => reply,
        }
    }

    /// The zone's answer to `query`, else the host records', else the upstreams' (asked
    /// for `client`, who may hold only its share of the questions upstream).
    async fn answer(&self, query: &Query, dnssec: Dnssec, client: IpAddr) -> Reply {
        let internet = query.query_class() == DNSClass::IN;
        let outcome = if internet {
            lookup(
                &self.view.read(),
                &self.zone,
                query.name(),
                query.query_type(),
            )
        } else {
            Outcome::NotOurs
        };
        match outcome {
            Outcome::Authoritative(answer)
                if !self.view.is_whole()
                    && (answer.rcode == ResponseCode::NXDomain || answer.answers.is_empty()) =>
            {
                Reply::Code(ResponseCode::ServFail)
            }
            Outcome::Authoritative(mut answer) => {
                self.chase_outside(&mut answer, query, dnssec, client).await;
                if self.view.is_complete() {
                    Reply::Zone(answer)
                } else {
                    Reply::Restored(answer)
                }
            }
            Outcome::NotOurs => {
                let held = self
                    .hosts
                    .as_ref()
                    .filter(|_| internet)
                    .and_then(|hosts| hosts.current().answer(query.name(), query.query_type()));
                if let Some(answer) = held {
                    return Reply::Zone(answer);
                }
                self.forward(query, dnssec, client).await
            }
        }
    }

    /// Autopath ([`crate::autopath`]): the first name of `path` (the asker's search list
    /// after `query`'s name) that is not NXDOMAIN, behind a CNAME from the asked name. None
    /// when every name is NXDOMAIN or an upstream fails on the way: the asked name's own
    /// answer goes out, and the pod walks its list itself.
    async fn walk(
        &self,
        query: &Query,
        path: Vec<Name>,
        dnssec: Dnssec,
        client: IpAddr,
    ) -> Option<Reply> {
        for target in path {
            let mut asked = Query::query(target.clone(), query.query_type());
            asked.set_query_class(query.query_class());
            let mut reply = self.answer(&asked, dnssec, client).await;
            match reply.rcode() {
                ResponseCode::NXDomain => continue,
                ResponseCode::NoError => {
                    if let Reply::Forwarded(Resolution::Answered(upstream)) = &mut reply {
                        // Our CNAME in front is not something the upstream validated.
                        upstream.authentic_data = false;
                    }
                    // As long as the zone's own records: whether the asked name would
                    // lead elsewhere depends on the cluster.
                    let alias = RData::CNAME(CNAME(target));
                    let cname = Record::from_rdata(query.name().clone(), self.zone.ttl(), alias);
                    if let Some(answers) = reply.answers_mut() {
                        answers.insert(0, cname);
                    }
                    self.metrics.walked(Walked::Answered);
                    return Some(reply);
                }
                _ => {
                    self.metrics.walked(Walked::GaveUp);
                    return None;
                }
            }
        }
        self.metrics.walked(Walked::NxDomain);
        None
    }

    /// A name outside the zone and the host records: the upstreams' answer.
    async fn forward(&self, query: &Query, dnssec: Dnssec, client: IpAddr) -> Reply {
        match &self.forwarder {
            // Without upstreams, refuse, as a non-recursive server does.
            None => Reply::Code(ResponseCode::Refused),
            Some(forwarder) => Reply::Forwarded(forwarder.resolve(query, dnssec, client).await),
        }
    }

    /// An ExternalName's CNAME to a name outside the zone: stub resolvers do not follow
    /// it, so the target's records are fetched upstream and appended (spec rule 14).
    async fn chase_outside(
        &self,
        answer: &mut Answer,
        query: &Query,
        dnssec: Dnssec,
        client: IpAddr,
    ) {
        if query.query_type() == RecordType::CNAME {
            return;
        }
        let (Some(forwarder), Some(last)) = (&self.forwarder, answer.answers.last()) else {
            return;
        };
        let RData::CNAME(target) = &last.data else {
            return;
        };
        if self.zone.origin().zone_of(&target.0.to_lowercase()) {
            return;
        }
        let mut chased = Query::query(target.0.clone(), query.query_type());
        chased.set_query_class(query.query_class());
        // Over the forwarding cap, or without an answer, the CNAME stands alone.
        if let Resolution::Answered(upstream) = forwarder.resolve(&chased, dnssec, client).await {
            answer.rcode = upstream.rcode;
            // A denial of the target carries the target zone's SOA (RFC 2308).
            if upstream.answers.is_empty() {
                answer.authority = upstream.authorities;
            }
            answer.answers.extend(upstream.answers);
        }
    }
}

/// Encodes `reply` as the response to `request`, within the size the requester takes
/// (over UDP its OPT's payload, or 512 bytes without EDNS; over TCP 65,535): records that
/// do not fit are left out and TC is set. The response code sent comes back with it.
fn encode(request: &Message, reply: &Reply, tcp: bool) -> (Vec<u8>, ResponseCode) {
    // Our OPT advertises what we accept, never more than the client does, and copies the
    // DO bit (RFC 3225).
    let edns = request.edns.as_ref().map(|theirs| {
        let mut ours = Edns::new();
        ours.set_max_payload(theirs.max_payload().clamp(512, MAX_UDP_PAYLOAD));
        ours.set_dnssec_ok(theirs.flags().dnssec_ok);
        ours
    });
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.authoritative = matches!(reply, Reply::Zone(_));
    metadata.recursion_available = matches!(reply, Reply::Forwarded(_));
    // The upstream's AD, to a client that understands it (DO or AD set, RFC 6840 §5.8).
    let understands_ad = request.metadata.authentic_data
        || request
            .edns
            .as_ref()
            .is_some_and(|edns| edns.flags().dnssec_ok);
    metadata.authentic_data = understands_ad
        && matches!(reply, Reply::Forwarded(Resolution::Answered(upstream)) if upstream.authentic_data);
    metadata.response_code = reply.rcode();
    let none: &[Record] = &[];
    let (answers, authority, additionals) = match reply {
        Reply::Zone(answer) | Reply::Restored(answer) => (
            &answer.answers[..],
            &answer.authority[..],
            &answer.additionals[..],
        ),
        Reply::Forwarded(Resolution::Answered(upstream)) => (
            &upstream.answers[..],
            &upstream.authorities[..],
            &upstream.additionals[..],
        ),
        Reply::Code(_) | Reply::Forwarded(_) => (none, none, none),
    };
    let max = if tcp {
        u16::MAX
    } else {
        edns.as_ref().map_or(512, Edns::max_payload)
    };
    let mut bytes = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_max_size(max);
    let emitted = emit_message_parts(
        &metadata,
        &mut request.queries.iter(),
        &mut answers.iter(),
        &mut authority.iter(),
        &mut additionals.iter(),
        edns.as_ref(),
        None,
        &mut encoder,
    );
    // A record that did not fit is rolled back to the offset, but its bytes stay in the
    // vector: the message ends at the offset.
    let end = encoder.offset();
    bytes.truncate(end);
    match emitted {
        Ok(_) => (bytes, metadata.response_code),
        Err(error) => {
            // What a response that cannot be encoded becomes: SERVFAIL, the header alone.
            tracing::debug!(%error, "encoding a DNS response");
            let mut failed = Metadata::new(metadata.id, MessageType::Response, OpCode::Query);
            failed.response_code = ResponseCode::ServFail;
            (
                encode_header(failed).unwrap_or_default(),
                ResponseCode::ServFail,
            )
        }
    }
}

fn encode_header(metadata: Metadata) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(12);
    let header = Header {
        metadata,
        counts: HeaderCounts::default(),
    };
    header.emit(&mut BinEncoder::new(&mut bytes)).ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::Name;
    use hickory_proto::rr::rdata::{A, CNAME};
    use std::net::Ipv4Addr;

    #[test]
    fn shuffling_moves_addresses_only() {
        let name = Name::from_ascii("db.example.org.").expect("name");
        let target = Name::from_ascii("db.internal.example.org.").expect("name");
        let mut records = vec![Record::from_rdata(
            name.clone(),
            5,
            RData::CNAME(CNAME(target.clone())),
        )];
        records.extend((1..=8).map(|i| {
            Record::from_rdata(target.clone(), 5, RData::A(A(Ipv4Addr::new(192, 0, 2, i))))
        }));
        let mut orders = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let mut shuffled = records.clone();
            shuffle_addresses(&mut shuffled);
            assert_eq!(shuffled[0], records[0], "the CNAME stays in front");
            let mut sorted = shuffled[1..].to_vec();
            sorted.sort_by_key(ToString::to_string);
            assert_eq!(sorted, records[1..], "the same addresses");
            orders.insert(shuffled.iter().map(ToString::to_string).collect::<Vec<_>>());
        }
        assert!(orders.len() > 1, "twenty shuffles, one order");
    }
}
