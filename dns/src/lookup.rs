//! Answers for the cluster zone, computed from the node view at query time.
//!
//! This is the Kubernetes DNS-Based Service Discovery specification 1.1.0 and CoreDNS's
//! behaviour around it (`research/dns.md`): a query name is classified by its labels, then
//! answered by looking the service up in the view (a hash lookup), or the address up in the
//! view's reverse index. Nothing is stored twice and nothing is scanned, so a miss costs
//! the same as a hit. Pure code: no sockets here.

use crate::autopath::NodeSearch;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use nodus_view::model::{Cidr, Family, Protocol, Service, ServiceType};
use nodus_view::{ServiceView, View};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The schema version the `dns-version` TXT record announces.
pub const SCHEMA_VERSION: &str = "1.1.0";
/// TTL of the `dns-version` record, as in the specification's example and CoreDNS.
const SCHEMA_TTL: u32 = 28_800;
/// The Service whose cluster IPs are the zone's name server (`ns.dns.<zone>`).
const DNS_SERVICE: (&str, &str) = ("kube-system", "kube-dns");
/// The UDP payload we accept and advertise: the DNS flag day 2020 value, which avoids IP
/// fragmentation. Both paths clamp the requester's EDNS payload size to it.
pub const MAX_UDP_PAYLOAD: u16 = 1232;

/// Whether `<a-b-c-d>.<ns>.pod.<zone>` names are answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodRecords {
    /// Every pod name is NXDOMAIN (CoreDNS's default).
    #[default]
    Disabled,
    /// Any well-formed dashed address is answered without checking that the pod exists.
    Insecure,
}

/// The cluster zone and how it is answered.
#[derive(Clone, Debug)]
pub struct Zone {
    /// Lower case, fully qualified.
    origin: Name,
    soa_name: Name,
    /// Built once: every negative answer carries it, and misses are most queries.
    soa: Record,
    /// The SOAs of `in-addr.arpa.` and `ip6.arpa.`, for negative answers about reverse
    /// names nodus owns (as CoreDNS, authoritative for both, answers).
    reverse_soas: [Record; 2],
    ttl: u32,
    pods: PodRecords,
    /// Configured cluster ranges (pods and services) besides those the view knows: reverse
    /// names inside them are answered here, never asked upstream.
    cluster_ranges: Vec<Cidr>,
    /// Autopath's node search domains ([`crate::autopath`]); None when it is off.
    autopath: Option<NodeSearch>,
}

/// `<origin> SOA ns.dns.<origin> hostmaster.<origin>`, as CoreDNS writes it for each zone.
fn soa_record(origin: &Name, ttl: u32, serial: u32) -> Result<Record, hickory_proto::ProtoError> {
    Ok(Record::from_rdata(
        origin.clone(),
        ttl,
        RData::SOA(SOA::new(
            Name::from_ascii("ns.dns")?.append_domain(origin)?,
            Name::from_ascii("hostmaster")?.append_domain(origin)?,
            serial,
            7200,
            1800,
            86400,
            ttl,
        )),
    ))
}

impl Zone {
    pub fn new(
        domain: &str,
        ttl: u32,
        pods: PodRecords,
    ) -> Result<Zone, hickory_proto::ProtoError> {
        let mut origin = Name::from_ascii(domain)?.to_lowercase();
        origin.set_fqdn(true);
        let soa_name = Name::from_ascii("ns.dns")?.append_domain(&origin)?;
        // The serial is the start time: answers are computed, so there is no zone version
        // to count, and secondaries never transfer this zone.
        let serial = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() as u32);
        let reverse_soas = [
            soa_record(&Name::from_ascii("in-addr.arpa.")?, ttl, serial)?,
            soa_record(&Name::from_ascii("ip6.arpa.")?, ttl, serial)?,
        ];
        Ok(Zone {
            soa: soa_record(&origin, ttl, serial)?,
            soa_name,
            reverse_soas,
            origin,
            ttl,
            pods,
            cluster_ranges: Vec::new(),
            autopath: None,
        })
    }

    /// The zone, also authoritative for reverse names inside `ranges` (the configured
    /// `cluster_cidrs` and `service_cidrs`).
    pub fn with_cluster_ranges(mut self, ranges: Vec<Cidr>) -> Zone {
        self.cluster_ranges = ranges;
        self
    }

    /// Whether `ip` lies in the cluster: a configured range, a ServiceCIDR or a Node's pod
    /// range. Reverse names of such addresses that nothing holds are NXDOMAIN here: asking
    /// upstream would tell outside resolvers the cluster's addresses.
    fn in_cluster(&self, view: &View, ip: IpAddr) -> bool {
        self.cluster_ranges.iter().any(|cidr| cidr.contains(ip))
            || view.in_service_cidrs(ip)
            || view
                .nodes()
                .any(|(_, node)| node.pod_cidrs.iter().any(|cidr| cidr.contains(ip)))
    }

    /// The zone, walking the search lists of this node's `ClusterFirst` pods for them, with
    /// `node_search` after the cluster's own domains ([`crate::autopath`]).
    pub fn with_autopath(mut self, node_search: NodeSearch) -> Zone {
        self.autopath = Some(node_search);
        self
    }

    pub fn autopath(&self) -> Option<&NodeSearch> {
        self.autopath.as_ref()
    }

    pub fn origin(&self) -> &Name {
        &self.origin
    }

    pub fn ttl(&self) -> u32 {
        self.ttl
    }

    /// The SOA that negative answers carry in their authority section; its minimum is the
    /// TTL, so resolvers cache misses exactly as long as hits.
    pub fn soa(&self) -> &Record {
        &self.soa
    }

    /// The SOA of the reverse zone that holds `ip`'s PTR name.
    fn reverse_soa(&self, ip: IpAddr) -> Record {
        self.reverse_soas[usize::from(ip.is_ipv6())].clone()
    }

    /// `<svc>.<ns>.svc.<zone>.`
    fn service_name(&self, namespace: &str, service: &str) -> Option<Name> {
        Name::from_labels([service, namespace, "svc"])
            .ok()?
            .append_domain(&self.origin)
            .ok()
    }
}

/// The answer to one question.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub rcode: ResponseCode,
    pub answers: Vec<Record>,
    /// The SOA of a negative answer, or the NS of the apex.
    pub authority: Vec<Record>,
    pub additionals: Vec<Record>,
}

/// What the server does with a question.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An authoritative answer from the cluster zone.
    Authoritative(Answer),
    /// The name is not in the cluster zone (nor a reverse name nodus knows): forward it.
    NotOurs,
}

/// What a query name means in the cluster zone.
#[derive(Clone, Copy, Debug)]
pub enum Target<'q> {
    Apex,
    SchemaVersion,
    NameServer,
    /// A name that exists but holds no records (`svc.<zone>`, an existing `<ns>.svc.<zone>`).
    Empty,
    Service {
        namespace: &'q str,
        service: &'q str,
    },
    Endpoint {
        namespace: &'q str,
        service: &'q str,
        endpoint: &'q str,
    },
    Port {
        namespace: &'q str,
        service: &'q str,
        port: PortQuery<'q>,
    },
    Pod {
        address: IpAddr,
    },
    Missing,
}

/// What `labels` (lower case, below the zone, as [`relative_labels`] gives them) name.
pub fn classify<'q>(view: &View, zone: &Zone, labels: &'q [&'q str]) -> Target<'q> {
    match labels {
        [] => Target::Apex,
        ["dns-version"] => Target::SchemaVersion,
        ["ns", "dns"] => Target::NameServer,
        ["svc"] | ["pod"] => Target::Empty,
        [namespace, "svc"] if view.has_namespace(namespace) => Target::Empty,
        // With pod records disabled CoreDNS answers NXDOMAIN for every name below `pod`.
        [namespace, "pod"]
            if zone.pods == PodRecords::Insecure && view.has_namespace(namespace) =>
        {
            Target::Empty
        }
        [service, namespace, "svc"] => Target::Service { namespace, service },
        [endpoint, service, namespace, "svc"] => Target::Endpoint {
            namespace,
            service,
            endpoint,
        },
        [port, protocol, service, namespace, "svc"] => Target::Port {
            namespace,
            service,
            port: PortQuery {
                name: port.strip_prefix('_').unwrap_or(port),
                protocol: protocol.strip_prefix('_').unwrap_or(protocol),
            },
        },
        // CoreDNS answers any dashed address, but only in a namespace that exists.
        [dashed, namespace, "pod"]
            if zone.pods == PodRecords::Insecure && view.has_namespace(namespace) =>
        {
            parse_dashed(dashed).map_or(Target::Missing, |address| Target::Pod { address })
        }
        _ => Target::Missing,
    }
}

/// The `_port._proto` labels of an SRV question. A label that is only `_` leaves its part
/// empty, which matches any port name or protocol, as CoreDNS's `matchPortAndProtocol` does:
/// an unnamed port is matched only so, on the bare service name or `_._proto` (spec rule 5
/// names only named ports; CoreDNS answers the others there too, and clients such as Go's
/// `LookupSRV("", "", name)` rely on it).
#[derive(Clone, Copy, Debug)]
pub struct PortQuery<'q> {
    name: &'q str,
    protocol: &'q str,
}

impl PortQuery<'_> {
    /// Every port: SRV asked of the bare service name.
    const ANY: PortQuery<'static> = PortQuery {
        name: "",
        protocol: "",
    };

    fn matches(&self, name: &str, protocol: Protocol) -> bool {
        (self.name.is_empty() || name.eq_ignore_ascii_case(self.name))
            && (self.protocol.is_empty()
                || protocol_label(protocol).eq_ignore_ascii_case(self.protocol))
    }
}

/// The answers most questions get, decided without building records: misses, names that
/// hold no records, and a ClusterIP service's addresses or SRV records. [`lookup`] turns
/// them into records; the UDP fast path ([`crate::fast`]) writes them straight into the
/// reply, so both paths answer from this one decision.
#[derive(Clone, Copy)]
pub enum Common<'a> {
    /// NXDOMAIN, with the zone's SOA.
    NxDomain,
    /// NOERROR without records, with the zone's SOA.
    NoData,
    /// The service's cluster IPs of `family` (of both for ANY); at least one.
    Addresses {
        service: &'a Service,
        family: Option<Family>,
    },
    /// One SRV per matching named port, with the cluster IPs as additional records.
    Srv(ServiceSrv<'a>),
}

/// SRV records of a ClusterIP service: every target is `<name>.<namespace>.svc.<zone>`.
#[derive(Clone, Copy)]
pub struct ServiceSrv<'a> {
    /// Lower case, as the question had them.
    pub namespace: &'a str,
    pub name: &'a str,
    pub service: &'a Service,
    view: &'a View,
    ports: PortQuery<'a>,
}

impl<'a> ServiceSrv<'a> {
    pub fn ports(&self) -> impl Iterator<Item = u16> + use<'a> {
        let (strings, query) = (self.view.strings(), self.ports);
        self.service
            .ports
            .iter()
            .filter(move |p| query.matches(strings.resolve(p.name), p.protocol))
            .map(|p| p.port)
    }

    pub fn weight(&self) -> u16 {
        srv_weight(self.ports().count())
    }
}

/// The cluster IPs of `service` in `family` (all of them when `None`).
pub fn cluster_addresses(
    service: &Service,
    family: Option<Family>,
) -> impl Iterator<Item = IpAddr> + '_ {
    service
        .cluster_ips
        .iter()
        .copied()
        .filter(move |ip| family.is_none_or(|f| f == Family::of(*ip)))
}

/// A ClusterIP service's answer to `qtype`; `None` for headless and ExternalName services.
fn cluster_ip_service<'a>(
    view: &'a View,
    service: &'a Service,
    namespace: &'a str,
    name: &'a str,
    qtype: RecordType,
) -> Option<Common<'a>> {
    if service.headless || service.type_ == ServiceType::ExternalName {
        return None;
    }
    let family = match qtype {
        RecordType::SRV => {
            return Some(service_srv(view, service, namespace, name, PortQuery::ANY));
        }
        // One RRset for ANY (RFC 8482, see [`lookup`]): the first cluster IP's family.
        RecordType::ANY => service.cluster_ips.first().map(|ip| Family::of(*ip)),
        _ => match family_of_query(qtype) {
            Some(family) => Some(family),
            None => return Some(Common::NoData),
        },
    };
    Some(match cluster_addresses(service, family).next() {
        Some(_) => Common::Addresses { service, family },
        None => Common::NoData,
    })
}

fn service_srv<'a>(
    view: &'a View,
    service: &'a Service,
    namespace: &'a str,
    name: &'a str,
    ports: PortQuery<'a>,
) -> Common<'a> {
    let srv = ServiceSrv {
        namespace,
        name,
        service,
        view,
        ports,
    };
    match srv.ports().next() {
        Some(_) => Common::Srv(srv),
        None => Common::NoData,
    }
}

/// Whether `service` has a port matching `query`: `_port._proto` names exist only then.
fn has_port(view: &View, service: &Service, query: PortQuery<'_>) -> bool {
    let strings = view.strings();
    service.type_ != ServiceType::ExternalName
        && service
            .ports
            .iter()
            .any(|p| query.matches(strings.resolve(p.name), p.protocol))
}

/// The common answer for `target`, or `None` when it needs the full resolver: headless
/// and ExternalName services, endpoint and pod names, the apex and the other fixed names.
pub fn common<'a>(view: &'a View, target: &Target<'a>, qtype: RecordType) -> Option<Common<'a>> {
    match *target {
        Target::Missing => Some(Common::NxDomain),
        Target::Empty => Some(Common::NoData),
        Target::Service { namespace, service } => match find_service(view, namespace, service) {
            None => Some(Common::NxDomain),
            Some((_, found)) => cluster_ip_service(view, found, namespace, service, qtype),
        },
        Target::Port {
            namespace,
            service,
            port,
        } => match find_service(view, namespace, service) {
            None => Some(Common::NxDomain),
            // A headless service's port names are its endpoints' (its slices'), which a
            // selectorless service's slices may name differently: the full resolver.
            Some((_, found)) if found.headless => None,
            Some((_, found)) if !has_port(view, found, port) => Some(Common::NxDomain),
            Some((_, found)) => Some(match qtype {
                RecordType::SRV => service_srv(view, found, namespace, service, port),
                _ => Common::NoData,
            }),
        },
        Target::Endpoint {
            namespace, service, ..
        } => find_service(view, namespace, service)
            .is_none()
            .then_some(Common::NxDomain),
        _ => None,
    }
}

/// `10-244-1-7` or `fd00-10--7` back to an address.
fn parse_dashed(label: &str) -> Option<IpAddr> {
    if label.matches('-').count() == 3 && !label.contains("--") {
        label
            .replace('-', ".")
            .parse::<Ipv4Addr>()
            .ok()
            .map(IpAddr::V4)
    } else {
        label
            .replace('-', ":")
            .parse::<Ipv6Addr>()
            .ok()
            .map(IpAddr::V6)
    }
}

/// The generated hostname of an endpoint without one: its address with dashes, as CoreDNS
/// writes it (a label may not start or end with a dash, so a `0` pads it).
pub fn dashed(ip: IpAddr) -> String {
    let mut label = ip.to_string().replace(['.', ':'], "-");
    if label.ends_with('-') {
        label.push('0');
    }
    if label.starts_with('-') {
        label.insert(0, '0');
    }
    label
}

fn protocol_label(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn address_record(name: Name, ttl: u32, ip: IpAddr) -> Record {
    let rdata = match ip {
        IpAddr::V4(a) => RData::A(A(a)),
        IpAddr::V6(a) => RData::AAAA(AAAA(a)),
    };
    Record::from_rdata(name, ttl, rdata)
}

fn family_of_query(qtype: RecordType) -> Option<Family> {
    match qtype {
        RecordType::A => Some(Family::V4),
        RecordType::AAAA => Some(Family::V6),
        _ => None,
    }
}

/// A backend of a headless service as DNS sees it: a published address and its name.
struct Published {
    ip: IpAddr,
    hostname: String,
    /// The endpoint's port for each of the slice's named ports.
    ports: Vec<(String, Protocol, u16)>,
}

/// The endpoints a headless service publishes: ready ones, or all of them under
/// `publishNotReadyAddresses`; de-duplicated by address across slices.
fn published(view: &View, svc: &ServiceView<'_>, service: &Service) -> Vec<Published> {
    let strings = view.strings();
    let mut out: Vec<Published> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for slice in svc.slices {
        let ports: Vec<(String, Protocol, u16)> = slice
            .ports
            .iter()
            .filter(|p| !p.name.is_empty())
            .map(|p| (strings.resolve(p.name).to_string(), p.protocol, p.port))
            .collect();
        for endpoint in slice.endpoints() {
            if !(endpoint.is_ready() || service.publish_not_ready_addresses) {
                continue;
            }
            if !seen.insert(endpoint.addr) {
                continue;
            }
            out.push(Published {
                ip: endpoint.addr,
                hostname: endpoint
                    .hostname()
                    .map_or_else(|| dashed(endpoint.addr), str::to_string),
                ports: ports.clone(),
            });
        }
    }
    out
}

/// Answers one question about the cluster zone. `qname` keeps the client's case; owner
/// names in the answer use it, so that 0x20-randomising resolvers accept the reply.
///
/// `ANY` is answered minimally (RFC 8482): one RRset of the name, never every type it
/// has, so that an `ANY` is no larger than the largest single question and gains nothing
/// as an amplifier.
pub fn lookup(view: &View, zone: &Zone, qname: &Name, qtype: RecordType) -> Outcome {
    match lookup_every_type(view, zone, qname, qtype) {
        Outcome::Authoritative(mut answer) if qtype == RecordType::ANY => {
            if let Some(first) = answer.answers.first().map(Record::record_type) {
                answer.answers.retain(|r| r.record_type() == first);
            }
            Outcome::Authoritative(answer)
        }
        outcome => outcome,
    }
}

fn lookup_every_type(view: &View, zone: &Zone, qname: &Name, qtype: RecordType) -> Outcome {
    let lower = qname.to_lowercase();
    if let Some(ip) = reverse_address(&lower) {
        return reverse(view, zone, qname, qtype, ip);
    }
    if !zone.origin.zone_of(&lower) {
        return Outcome::NotOurs;
    }
    let mut buffer = [""; MAX_LABELS];
    let labels = relative_labels(&lower, zone, &mut buffer);
    let mut resolver = Resolver {
        view,
        zone,
        answer: Answer::default(),
    };
    resolver.answer_target(classify(view, zone, labels), qname, qtype);
    Outcome::Authoritative(resolver.finish())
}

/// A service whose spec the view has; slices alone do not make a name exist.
fn find_service<'v>(
    view: &'v View,
    namespace: &str,
    name: &str,
) -> Option<(ServiceView<'v>, &'v Service)> {
    let svc = view.service(namespace, name)?;
    let service = svc.service?;
    Some((svc, service))
}

/// More labels below the zone than any cluster name has (`_port._proto.svc.ns.svc` is 5).
pub(crate) const MAX_LABELS: usize = 6;

/// The labels of `lower` below the zone, in a caller's buffer: this runs for every query,
/// so it does not allocate. Names deeper than any cluster name come back with one label
/// too many, which matches nothing.
fn relative_labels<'n>(
    lower: &'n Name,
    zone: &Zone,
    buffer: &'n mut [&'n str; MAX_LABELS],
) -> &'n [&'n str] {
    // Counted by iterating: `num_labels` leaves out a leading `*`, which `iter` yields.
    let relative = lower
        .iter()
        .count()
        .saturating_sub(zone.origin.iter().count());
    let mut n = 0;
    for label in lower.iter().take(relative.min(MAX_LABELS)) {
        buffer[n] = std::str::from_utf8(label).unwrap_or("");
        n += 1;
    }
    &buffer[..n]
}

struct Resolver<'a> {
    view: &'a View,
    zone: &'a Zone,
    answer: Answer,
}

impl Resolver<'_> {
    fn nxdomain(&mut self) {
        self.answer.rcode = ResponseCode::NXDomain;
    }

    fn finish(mut self) -> Answer {
        if self.answer.answers.is_empty() && self.answer.authority.is_empty() {
            // NXDOMAIN and NODATA both carry the SOA, for negative caching (RFC 2308).
            self.answer.authority.push(self.zone.soa().clone());
        }
        self.answer
    }

    fn answer_target(&mut self, target: Target<'_>, qname: &Name, qtype: RecordType) {
        if let Some(common) = common(self.view, &target, qtype) {
            return self.push(common, qname);
        }
        let ttl = self.zone.ttl;
        match target {
            // `common` answers both.
            Target::Missing | Target::Empty => {}
            Target::Apex => match qtype {
                RecordType::SOA => {
                    let mut soa = self.zone.soa().clone();
                    soa.name = qname.clone();
                    self.answer.answers.push(soa);
                }
                RecordType::NS => {
                    self.answer.answers.push(Record::from_rdata(
                        qname.clone(),
                        ttl,
                        RData::NS(NS(self.zone.soa_name.clone())),
                    ));
                    let glue = self.name_server_ips();
                    for ip in glue {
                        self.answer.additionals.push(address_record(
                            self.zone.soa_name.clone(),
                            ttl,
                            ip,
                        ));
                    }
                }
                _ => {}
            },
            Target::SchemaVersion => {
                if matches!(qtype, RecordType::TXT | RecordType::ANY) {
                    self.answer.answers.push(Record::from_rdata(
                        qname.clone(),
                        SCHEMA_TTL,
                        RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_string()])),
                    ));
                }
            }
            Target::NameServer => {
                if let Some(family) = family_of_query(qtype) {
                    for ip in self.name_server_ips() {
                        if Family::of(ip) == family {
                            self.answer
                                .answers
                                .push(address_record(qname.clone(), ttl, ip));
                        }
                    }
                }
            }
            Target::Service { namespace, service } => {
                self.service(namespace, service, qname, qtype, 0)
            }
            Target::Endpoint {
                namespace,
                service,
                endpoint,
            } => self.endpoint(namespace, service, endpoint, qname, qtype),
            Target::Port {
                namespace,
                service,
                port,
            } => self.port(namespace, service, port, qname, qtype),
            Target::Pod { address } => {
                if family_of_query(qtype) == Some(Family::of(address)) || qtype == RecordType::ANY {
                    self.answer
                        .answers
                        .push(address_record(qname.clone(), ttl, address));
                }
            }
        }
    }

    fn name_server_ips(&self) -> Vec<IpAddr> {
        self.view
            .service(DNS_SERVICE.0, DNS_SERVICE.1)
            .and_then(|s| s.service)
            .map(|s| s.cluster_ips.to_vec())
            .unwrap_or_default()
    }

    /// `depth` bounds CNAME chasing inside the zone.
    fn service(&mut self, namespace: &str, name: &str, qname: &Name, qtype: RecordType, depth: u8) {
        let ttl = self.zone.ttl;
        let view = self.view;
        let Some((svc, service)) = find_service(view, namespace, name) else {
            return self.nxdomain();
        };
        if service.type_ == ServiceType::ExternalName {
            return self.external_name(service, qname, qtype, depth);
        }
        if !service.headless {
            if let Some(common) = cluster_ip_service(view, service, namespace, name, qtype) {
                self.push(common, qname);
            }
            return;
        }
        let backends = published(view, &svc, service);
        if backends.is_empty() {
            // Spec rule 10: a headless service with no ready endpoints does not exist.
            return self.nxdomain();
        }
        match qtype {
            RecordType::A | RecordType::AAAA | RecordType::ANY => {
                for b in &backends {
                    if family_of_query(qtype).is_none_or(|f| f == Family::of(b.ip)) {
                        self.answer
                            .answers
                            .push(address_record(qname.clone(), ttl, b.ip));
                    }
                }
            }
            RecordType::SRV => {
                let Some(own) = self.zone.service_name(namespace, name) else {
                    return;
                };
                self.headless_srv(&backends, &own, qname, PortQuery::ANY);
            }
            _ => {}
        }
    }

    /// Adds a [`Common`] answer's records.
    fn push(&mut self, common: Common<'_>, qname: &Name) {
        let ttl = self.zone.ttl;
        match common {
            Common::NxDomain => self.nxdomain(),
            Common::NoData => {}
            Common::Addresses { service, family } => {
                for ip in cluster_addresses(service, family) {
                    self.answer
                        .answers
                        .push(address_record(qname.clone(), ttl, ip));
                }
            }
            Common::Srv(srv) => {
                let Some(own) = self.zone.service_name(srv.namespace, srv.name) else {
                    return;
                };
                let weight = srv.weight();
                for port in srv.ports() {
                    self.answer.answers.push(Record::from_rdata(
                        qname.clone(),
                        ttl,
                        RData::SRV(SRV::new(0, weight, port, own.clone())),
                    ));
                }
                for ip in cluster_addresses(srv.service, None) {
                    self.answer
                        .additionals
                        .push(address_record(own.clone(), ttl, ip));
                }
            }
        }
    }

    fn external_name(&mut self, service: &Service, qname: &Name, qtype: RecordType, depth: u8) {
        let ttl = self.zone.ttl;
        let Some(target) = service
            .external_name()
            .and_then(|n| Name::from_ascii(n).ok())
            .map(|mut n| {
                n.set_fqdn(true);
                n
            })
        else {
            return;
        };
        if qtype == RecordType::SRV {
            return;
        }
        self.answer.answers.push(Record::from_rdata(
            qname.clone(),
            ttl,
            RData::CNAME(CNAME(target.clone())),
        ));
        if qtype == RecordType::CNAME || depth >= 8 {
            return;
        }
        // Chase a target inside the zone (a service, an endpoint's or a pod's name), as
        // CoreDNS does; outside it the resolver follows.
        let lower = target.to_lowercase();
        if self.zone.origin.zone_of(&lower) {
            let mut buffer = [""; MAX_LABELS];
            let labels = relative_labels(&lower, self.zone, &mut buffer);
            let before = self.answer.rcode;
            match classify(self.view, self.zone, labels) {
                // Through `service`, which counts the depth of a chain of ExternalNames.
                Target::Service { namespace, service } => {
                    self.service(namespace, service, &target, qtype, depth + 1)
                }
                chased => self.answer_target(chased, &target, qtype),
            }
            // The CNAME itself exists even when its target does not.
            self.answer.rcode = before;
        }
    }

    fn headless_srv(
        &mut self,
        backends: &[Published],
        own: &Name,
        qname: &Name,
        wanted: PortQuery<'_>,
    ) {
        let ttl = self.zone.ttl;
        let mut targets: Vec<(Name, u16, IpAddr)> = Vec::new();
        for b in backends {
            let Some(target) = Name::from_labels([b.hostname.as_str()])
                .ok()
                .and_then(|h| h.append_domain(own).ok())
            else {
                continue;
            };
            for (name, protocol, port) in &b.ports {
                if wanted.matches(name, *protocol) {
                    targets.push((target.clone(), *port, b.ip));
                }
            }
        }
        let mut distinct: Vec<(&Name, u16)> = targets.iter().map(|(n, p, _)| (n, *p)).collect();
        distinct.sort();
        distinct.dedup();
        let weight = srv_weight(distinct.len());
        for (target, port) in &distinct {
            self.answer.answers.push(Record::from_rdata(
                qname.clone(),
                ttl,
                RData::SRV(SRV::new(0, weight, *port, (*target).clone())),
            ));
        }
        for (target, _, ip) in &targets {
            let record = address_record(target.clone(), ttl, *ip);
            if !self.answer.additionals.contains(&record) {
                self.answer.additionals.push(record);
            }
        }
    }

    fn endpoint(
        &mut self,
        namespace: &str,
        name: &str,
        endpoint: &str,
        qname: &Name,
        qtype: RecordType,
    ) {
        let ttl = self.zone.ttl;
        let view = self.view;
        let Some((svc, service)) = find_service(view, namespace, name) else {
            return self.nxdomain();
        };
        let matching: Vec<IpAddr> = published(view, &svc, service)
            .into_iter()
            .filter(|b| b.hostname.eq_ignore_ascii_case(endpoint))
            .map(|b| b.ip)
            .collect();
        if matching.is_empty() {
            return self.nxdomain();
        }
        for ip in matching {
            if family_of_query(qtype).is_some_and(|f| f == Family::of(ip))
                || qtype == RecordType::ANY
            {
                self.answer
                    .answers
                    .push(address_record(qname.clone(), ttl, ip));
            }
        }
    }

    /// A `_port._proto` name of a headless service (`common` answers the rest).
    fn port(
        &mut self,
        namespace: &str,
        name: &str,
        port: PortQuery<'_>,
        qname: &Name,
        qtype: RecordType,
    ) {
        let view = self.view;
        let Some((svc, service)) = find_service(view, namespace, name) else {
            return self.nxdomain();
        };
        let Some(own) = self.zone.service_name(namespace, name) else {
            return self.nxdomain();
        };
        let backends = published(view, &svc, service);
        if backends.is_empty() {
            // Spec rule 10 holds below the service name too.
            return self.nxdomain();
        }
        // The name exists when an endpoint has the port (spec rule 12, as CoreDNS reads
        // it: the endpoints' ports, not the Service's).
        let has_port = backends.iter().any(|b| {
            b.ports
                .iter()
                .any(|(name, protocol, _)| port.matches(name, *protocol))
        });
        if !has_port {
            return self.nxdomain();
        }
        if qtype == RecordType::SRV {
            self.headless_srv(&backends, &own, qname, port);
        }
    }
}

/// CoreDNS's SRV weight: 100 shared between the records of one priority, at least 1.
fn srv_weight(records: usize) -> u16 {
    (100 / records.max(1)).max(1) as u16
}

/// The address a reverse name (`in-addr.arpa`, `ip6.arpa`) asks about, if it is complete.
pub(crate) fn reverse_address(lower: &Name) -> Option<IpAddr> {
    let labels: Vec<&[u8]> = lower.iter().collect();
    match labels.as_slice() {
        [d, c, b, a, b"in-addr", b"arpa"] => {
            let octet = |l: &[u8]| std::str::from_utf8(l).ok()?.parse::<u8>().ok();
            Some(IpAddr::V4(Ipv4Addr::new(
                octet(a)?,
                octet(b)?,
                octet(c)?,
                octet(d)?,
            )))
        }
        [nibbles @ .., b"ip6", b"arpa"] if nibbles.len() == 32 => {
            let mut value: u128 = 0;
            for nibble in nibbles.iter().rev() {
                let [digit] = nibble else { return None };
                value = value << 4 | u128::from((*digit as char).to_digit(16)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(value)))
        }
        _ => None,
    }
}

/// The name `ip` has as a published endpoint of `svc`, as CoreDNS names it for any
/// service: `<hostname or dashed address>.<svc>.<ns>.svc.<zone>`.
fn endpoint_name(view: &View, zone: &Zone, svc: &ServiceView<'_>, ip: IpAddr) -> Option<Name> {
    let service = svc.service?;
    if service.type_ == ServiceType::ExternalName {
        return None;
    }
    let own = zone.service_name(svc.namespace, svc.name)?;
    published(view, svc, service)
        .into_iter()
        .find(|b| b.ip == ip)
        .and_then(|b| Name::from_labels([b.hostname.as_str()]).ok())
        .and_then(|h| h.append_domain(&own).ok())
}

fn reverse(view: &View, zone: &Zone, qname: &Name, qtype: RecordType, ip: IpAddr) -> Outcome {
    let mut targets: Vec<Name> = Vec::new();
    // The index holds cluster IPs and the endpoints of headless services.
    for svc in view.services_by_ip(ip) {
        let Some(service) = svc.service else { continue };
        let target = if service.cluster_ips.contains(&ip) {
            zone.service_name(svc.namespace, svc.name)
        } else {
            endpoint_name(view, zone, &svc, ip)
        };
        targets.extend(target);
    }
    if targets.is_empty() {
        // Endpoints of other services are not indexed (it would cost memory per endpoint
        // for a rare question): they are looked for, a read of every slice.
        targets.extend(
            view.services()
                .filter(|svc| {
                    svc.slices
                        .iter()
                        .any(|s| s.endpoints().any(|e| e.addr == ip))
                })
                .filter_map(|svc| endpoint_name(view, zone, &svc, ip)),
        );
    }
    if targets.is_empty() {
        if !zone.in_cluster(view, ip) {
            return Outcome::NotOurs;
        }
        return Outcome::Authoritative(Answer {
            rcode: ResponseCode::NXDomain,
            authority: vec![zone.reverse_soa(ip)],
            ..Answer::default()
        });
    }
    targets.sort();
    targets.dedup();
    let mut answer = Answer::default();
    if matches!(qtype, RecordType::PTR | RecordType::ANY) {
        answer.answers = targets
            .into_iter()
            .map(|t| Record::from_rdata(qname.clone(), zone.ttl, RData::PTR(PTR(t))))
            .collect();
    } else {
        answer.authority.push(zone.reverse_soa(ip));
    }
    Outcome::Authoritative(answer)
}

#[cfg(test)]
mod tests;
