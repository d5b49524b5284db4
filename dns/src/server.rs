//! The DNS server: [`crate::lookup`] behind hickory-server's UDP and TCP listeners.
//!
//! hickory-server owns the sockets, the message framing, EDNS size limits and truncation;
//! this module only turns a request into a lookup and the lookup into a response.

use crate::forward::Forwarder;
use crate::lookup::{Answer, Outcome, Zone, lookup};
use crate::metrics::DnsMetrics;
use hickory_server::Server;
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::Query;
use hickory_server::proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::{RData, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use nodus_view::SharedView;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The UDP payload we accept and advertise: the DNS flag day 2020 value, which avoids IP
/// fragmentation.
pub const MAX_UDP_PAYLOAD: u16 = 1232;
/// An idle TCP connection is closed after this long.
const TCP_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers the cluster zone from the view, and forwards the rest.
pub struct ClusterDns {
    view: SharedView,
    zone: Zone,
    forwarder: Option<Arc<Forwarder>>,
    metrics: Arc<DnsMetrics>,
    /// Set once the view holds every initial list. Until then a name the view lacks may
    /// only be missing from it: misses get SERVFAIL (which resolvers retry) rather than an
    /// NXDOMAIN they would cache, as CoreDNS does before it syncs.
    synced: Arc<AtomicBool>,
}

impl ClusterDns {
    pub fn new(view: SharedView, zone: Zone, forwarder: Option<Arc<Forwarder>>) -> ClusterDns {
        ClusterDns {
            metrics: Arc::new(DnsMetrics::new(forwarder.clone())),
            synced: Arc::default(),
            view,
            zone,
            forwarder,
        }
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
        if let Some(upstream) = forwarder.resolve(&chased).await {
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
                                Some(answer) => {
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
                                None => {
                                    metadata.response_code = ResponseCode::ServFail;
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

/// A running DNS server: it serves on the runtime that started it until dropped.
pub struct DnsServer {
    _server: Server<ClusterDns>,
    pub metrics: Arc<DnsMetrics>,
    /// Set it once the view is complete; until then misses are SERVFAIL.
    pub synced: Arc<AtomicBool>,
    /// The bound addresses (a port 0 in the configuration is resolved here).
    pub addrs: Vec<SocketAddr>,
}

/// Binds UDP and TCP on every address and serves until the returned server is dropped.
pub async fn serve(
    view: SharedView,
    zone: Zone,
    forwarder: Option<Arc<Forwarder>>,
    listen: &[SocketAddr],
) -> std::io::Result<DnsServer> {
    let handler = ClusterDns::new(view, zone, forwarder);
    let metrics = handler.metrics.clone();
    let synced = handler.synced.clone();
    let mut server = Server::new(handler);
    let mut bound = Vec::new();
    for addr in listen {
        let udp = tokio::net::UdpSocket::bind(addr).await?;
        // Port 0 picks one port for UDP; TCP takes the same one.
        let addr = udp.local_addr()?;
        let tcp = tokio::net::TcpListener::bind(addr).await?;
        server.register_socket(udp);
        server.register_listener(tcp, TCP_TIMEOUT, 64);
        bound.push(addr);
    }
    Ok(DnsServer {
        _server: server,
        metrics,
        synced,
        addrs: bound,
    })
}
