//! The DNS server: [`crate::lookup`] behind hickory-server's TCP listener and our UDP
//! listener ([`crate::udp`]).
//!
//! hickory-server parses requests, frames TCP, limits sizes and truncates; this module
//! turns a request into a lookup and the lookup into a response. UDP datagrams the fast
//! path ([`crate::fast`]) does not take come here through [`ClusterDns::answer_datagram`],
//! which runs them as hickory-server's own UDP loop would.

use crate::forward::{Forwarder, Resolution};
use crate::lookup::{Answer, Outcome, Zone, lookup};
use crate::metrics::DnsMetrics;
use crate::udp::UdpListener;
use hickory_server::Server;
use hickory_server::net::NetError;
use hickory_server::net::runtime::{Time, TokioTime};
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::Query;
use hickory_server::proto::op::{
    Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::{RData, Record, RecordType};
use hickory_server::proto::serialize::binary::{
    BinDecodable, BinDecoder, BinEncodable, BinEncoder,
};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder};
use nodus_view::SharedView;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The UDP payload we accept and advertise: the DNS flag day 2020 value, which avoids IP
/// fragmentation.
pub const MAX_UDP_PAYLOAD: u16 = 1232;
/// An idle TCP connection is closed after this long.
const TCP_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers the cluster zone from the view, and forwards the rest. Clones share everything.
#[derive(Clone)]
pub struct ClusterDns {
    pub(crate) view: SharedView,
    pub(crate) zone: Arc<Zone>,
    forwarder: Option<Arc<Forwarder>>,
    pub(crate) metrics: Arc<DnsMetrics>,
    /// Set once the view holds every initial list. Until then a name the view lacks may
    /// only be missing from it: misses get SERVFAIL (which resolvers retry) rather than an
    /// NXDOMAIN they would cache, as CoreDNS does before it syncs.
    pub(crate) synced: Arc<AtomicBool>,
}

impl ClusterDns {
    pub fn new(view: SharedView, zone: Zone, forwarder: Option<Arc<Forwarder>>) -> ClusterDns {
        ClusterDns {
            metrics: Arc::new(DnsMetrics::new(forwarder.clone())),
            synced: Arc::default(),
            view,
            zone: Arc::new(zone),
            forwarder,
        }
    }

    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    pub fn view(&self) -> &SharedView {
        &self.view
    }

    /// Set once the view is complete (see the field); the fuzz target sets it.
    pub fn synced(&self) -> &AtomicBool {
        &self.synced
    }

    /// The full path for one UDP datagram, as hickory-server's UDP loop runs it: no reply to
    /// a packet without a header nor to a response, FORMERR to one that does not parse, and
    /// otherwise the handler's answer within the payload size the requester can take
    /// (truncated, with TC, when it does not fit).
    pub async fn answer_datagram(&self, packet: Vec<u8>, src: SocketAddr) -> Option<Vec<u8>> {
        let header = Header::read(&mut BinDecoder::new(&packet)).ok()?;
        let request = match Request::from_bytes(packet, src, Protocol::Udp) {
            Ok(request) => request,
            Err(_) => {
                let mut metadata = Metadata::response_from_request(&header.metadata);
                metadata.response_code = ResponseCode::FormErr;
                self.metrics
                    .answered(None, ResponseCode::FormErr, Duration::ZERO);
                return encode_header(metadata);
            }
        };
        if request.metadata.message_type == MessageType::Response {
            return None;
        }
        let reply = Capture::default();
        self.handle_request::<_, TokioTime>(&request, reply.clone())
            .await;
        reply.0.lock().unwrap_or_else(|p| p.into_inner()).take()
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

/// Keeps the encoded response for [`ClusterDns::answer_datagram`], sized as hickory-server
/// sizes a UDP response: the OPT's payload, or 512 bytes without EDNS.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Option<Vec<u8>>>>);

#[async_trait::async_trait]
impl ResponseHandler for Capture {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let max = response.edns().map_or(512, Edns::max_payload);
        let id = response.metadata().id;
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(max);
        let info = match response.destructive_emit(&mut encoder) {
            Ok(info) => info,
            Err(error) => {
                // What hickory-server sends when a response cannot be encoded.
                tracing::debug!(%error, "encoding a DNS response");
                let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
                metadata.response_code = ResponseCode::ServFail;
                bytes = encode_header(metadata).unwrap_or_default();
                ResponseInfo::from(Header {
                    metadata,
                    counts: HeaderCounts::default(),
                })
            }
        };
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(bytes);
        Ok(info)
    }
}

impl ClusterDns {
    /// An ExternalName's CNAME to a name outside the zone: stub resolvers do not follow
    /// it, so the target's records are fetched upstream and appended (spec rule 14).
    async fn chase_outside(&self, answer: &mut Answer, query: &Query) {
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
        if let Resolution::Answered(upstream) = forwarder.resolve(&chased).await {
            answer.rcode = upstream.rcode;
            answer.answers.extend(upstream.answers);
        }
    }
}

#[async_trait::async_trait]
impl RequestHandler for ClusterDns {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let started = Instant::now();
        let mut metadata = Metadata::response_from_request(&request.metadata);
        // Our OPT advertises what we accept, never more than the client does.
        let edns = request.edns.as_ref().map(|theirs| {
            let mut ours = Edns::new();
            ours.set_max_payload(theirs.max_payload().clamp(512, MAX_UDP_PAYLOAD));
            ours
        });
        let builder = MessageResponseBuilder::new(&request.queries, edns.as_ref());
        let info = match request.request_info() {
            Err(_) => Err(ResponseCode::FormErr),
            Ok(_) if request.metadata.op_code != OpCode::Query => Err(ResponseCode::NotImp),
            Ok(info) => Ok(info),
        };
        let result = match info {
            Err(code) => {
                metadata.response_code = code;
                response_handle
                    .send_response(builder.build_no_records(metadata))
                    .await
            }
            Ok(info) => {
                let query = info.query.original();
                let outcome = {
                    let view = self
                        .view
                        .read()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    lookup(&view, &self.zone, query.name(), query.query_type())
                };
                match outcome {
                    Outcome::Authoritative(answer)
                        if !self.synced.load(Relaxed)
                            && (answer.rcode == ResponseCode::NXDomain
                                || answer.answers.is_empty()) =>
                    {
                        metadata.response_code = ResponseCode::ServFail;
                        response_handle
                            .send_response(builder.build_no_records(metadata))
                            .await
                    }
                    Outcome::Authoritative(mut answer) => {
                        self.chase_outside(&mut answer, query).await;
                        metadata.authoritative = true;
                        metadata.response_code = answer.rcode;
                        response_handle
                            .send_response(builder.build(
                                metadata,
                                answer.answers.iter(),
                                answer.authority.iter(),
                                std::iter::empty(),
                                answer.additionals.iter(),
                            ))
                            .await
                    }
                    Outcome::NotOurs => match &self.forwarder {
                        // Without upstreams, refuse, as a non-recursive server does.
                        None => {
                            metadata.response_code = ResponseCode::Refused;
                            response_handle
                                .send_response(builder.build_no_records(metadata))
                                .await
                        }
                        Some(forwarder) => {
                            metadata.recursion_available = true;
                            match forwarder.resolve(query).await {
                                Resolution::Answered(answer) => {
                                    metadata.response_code = answer.rcode;
                                    response_handle
                                        .send_response(builder.build(
                                            metadata,
                                            answer.answers.iter(),
                                            answer.authorities.iter(),
                                            std::iter::empty(),
                                            answer.additionals.iter(),
                                        ))
                                        .await
                                }
                                Resolution::Failed => {
                                    metadata.response_code = ResponseCode::ServFail;
                                    response_handle
                                        .send_response(builder.build_no_records(metadata))
                                        .await
                                }
                                Resolution::Refused => {
                                    metadata.response_code = ResponseCode::Refused;
                                    response_handle
                                        .send_response(builder.build_no_records(metadata))
                                        .await
                                }
                            }
                        }
                    },
                }
            }
        };
        let qtype = request.request_info().ok().map(|i| i.query.query_type());
        let info = result.unwrap_or_else(|error| {
            tracing::debug!(%error, "sending a DNS response");
            let mut failed = Metadata::response_from_request(&request.metadata);
            failed.response_code = ResponseCode::ServFail;
            ResponseInfo::from(Header {
                metadata: failed,
                counts: HeaderCounts::default(),
            })
        });
        self.metrics
            .answered(qtype, info.response_code, started.elapsed());
        info
    }
}

/// A running DNS server: it serves until dropped.
pub struct DnsServer {
    _tcp: Server<ClusterDns>,
    _udp: Vec<UdpListener>,
    pub metrics: Arc<DnsMetrics>,
    /// Set it once the view is complete; until then misses are SERVFAIL.
    pub synced: Arc<AtomicBool>,
    handler: ClusterDns,
    /// The bound addresses (a port 0 in the configuration is resolved here).
    pub addrs: Vec<SocketAddr>,
}

impl DnsServer {
    /// The handler behind both paths, for tests that compare them.
    pub fn handler(&self) -> &ClusterDns {
        &self.handler
    }
}

/// Binds UDP and TCP on every address and serves until the returned server is dropped,
/// with one UDP thread per address.
pub async fn serve(
    view: SharedView,
    zone: Zone,
    forwarder: Option<Arc<Forwarder>>,
    listen: &[SocketAddr],
) -> std::io::Result<DnsServer> {
    serve_with_threads(view, zone, forwarder, listen, 1).await
}

/// Binds UDP and TCP on one address. Port 0 lets the kernel pick the UDP port and TCP takes
/// the same one, which another process may already hold for TCP: then a fresh port is
/// tried, a few times.
async fn bind_pair(
    addr: SocketAddr,
    udp_threads: usize,
    handler: &ClusterDns,
) -> std::io::Result<(UdpListener, tokio::net::TcpListener)> {
    const EPHEMERAL_ATTEMPTS: usize = 8;
    let mut attempt = 1;
    loop {
        let udp = UdpListener::bind(addr, udp_threads, handler.clone())?;
        match tokio::net::TcpListener::bind(udp.local_addr()).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e)
                if addr.port() == 0
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && attempt < EPHEMERAL_ATTEMPTS =>
            {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// As [`serve`], with `udp_threads` threads per UDP address, each on its own socket.
pub async fn serve_with_threads(
    view: SharedView,
    zone: Zone,
    forwarder: Option<Arc<Forwarder>>,
    listen: &[SocketAddr],
    udp_threads: usize,
) -> std::io::Result<DnsServer> {
    let handler = ClusterDns::new(view, zone, forwarder);
    let mut server = Server::new(handler.clone());
    let mut udp = Vec::new();
    let mut bound = Vec::new();
    for addr in listen {
        let (listener, tcp) = bind_pair(*addr, udp_threads, &handler).await?;
        let addr = listener.local_addr();
        server.register_listener(tcp, TCP_TIMEOUT, 64);
        udp.push(listener);
        bound.push(addr);
    }
    Ok(DnsServer {
        _tcp: server,
        _udp: udp,
        metrics: handler.metrics.clone(),
        synced: handler.synced.clone(),
        handler,
        addrs: bound,
    })
}
