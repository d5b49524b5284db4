//! The view saved whole, for a restart that cannot reach the API server: DNS answers and
//! the mesh keeps its peers from the last complete view until a fresh list replaces it.
//!
//! The format is the compact model itself, not the wire objects: slice names are only
//! hashes in the view, and the model is ten times smaller than its JSON. Version 2:
//!
//! ```text
//! magic "nodusvw\x02" · name-hash check (u64) · node name
//! · services: count, then per entry its namespace, name, service (if any) and slices
//! · nodes: count, then per node its name and fields
//! · ServiceCIDRs: count, then per object its name and ranges
//! · FNV-1a 64 of every byte before it
//! ```
//!
//! Version 1, which has no ServiceCIDRs, is still read: a new build restarts from what
//! the old one saved.
//!
//! Integers are LEB128 varints (signed ones zigzag), addresses their octets behind a
//! family byte. An interned string is written the first time it occurs and referred to by
//! its index after that, so a node name shared by 10,000 endpoints costs one or two bytes
//! each. Reading checks every length against what remains and every tag against its
//! range: a damaged file is refused, never trusted in part.

use super::{ChangeSet, View};
use crate::decode::hash_name;
use crate::intern::{Interner, Sym};
use crate::model::{
    Cidr, ClusterIps, Endpoint, EndpointExtra, Endpoints, Family, LoadBalancerIngress, Node,
    NodeAddress, NodeAddressKind, Protocol, Service, ServiceExtra, ServicePort, ServiceType, Slice,
    SlicePort, TrafficDistribution, TrafficPolicy,
};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Version 4 adds a Service's `headless` label (a flag bit); version 3 the Node's
/// readiness (a flag bit); version 2 the ServiceCIDRs.
const MAGIC: &[u8; 8] = b"nodusvw\x04";
const MAGIC_V3: &[u8; 8] = b"nodusvw\x03";
const MAGIC_V2: &[u8; 8] = b"nodusvw\x02";
const MAGIC_V1: &[u8; 8] = b"nodusvw\x01";
/// What slice names hash to differs between builds of the standard library; a snapshot
/// from a build whose hashes differ would not match the slices a fresh list delivers.
const HASH_CHECK: &str = "nodus view snapshot";
/// The largest snapshot read or written: 10,000 services × 10 endpoints × 100 nodes take
/// about 2 MB.
pub const MAX_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("not a nodus view snapshot (or another version of the format)")]
    Magic,
    #[error("saved by a build that hashes names differently")]
    Incompatible,
    #[error("the checksum does not match: the file is damaged")]
    Checksum,
    #[error("saved for node {saved:?}, not {node:?}")]
    OtherNode { saved: String, node: String },
    #[error("damaged at byte {at}: {what}")]
    Damaged { at: usize, what: &'static str },
    #[error("{0} bytes, more than the {MAX_BYTES} a snapshot may take")]
    TooLarge(usize),
    #[error("writing: {0}")]
    Write(String),
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a 64 of `bytes`, continued from `hash`.
fn fnv1a_from(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_from(FNV_OFFSET, bytes)
}

/// Where a snapshot goes as it is encoded: summed and counted on the way, so that no copy
/// of the whole is ever held. The first failure stops the writing and is kept.
struct Sink<'w> {
    out: &'w mut dyn Write,
    sum: u64,
    len: usize,
    error: Option<SnapshotError>,
}

impl<'w> Sink<'w> {
    fn new(out: &'w mut dyn Write) -> Sink<'w> {
        Sink {
            out,
            sum: FNV_OFFSET,
            len: 0,
            error: None,
        }
    }

    fn push(&mut self, byte: u8) {
        self.extend_from_slice(&[byte]);
    }

    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.sum = fnv1a_from(self.sum, bytes);
        self.len += bytes.len();
        if self.error.is_some() {
            return;
        }
        if self.len > MAX_BYTES {
            self.error = Some(SnapshotError::TooLarge(self.len));
        } else if let Err(error) = self.out.write_all(bytes) {
            self.error = Some(SnapshotError::Write(error.to_string()));
        }
    }

    /// The bytes written, or the first failure.
    fn finish(self) -> Result<usize, SnapshotError> {
        match self.error {
            Some(SnapshotError::TooLarge(_)) => Err(SnapshotError::TooLarge(self.len)),
            Some(error) => Err(error),
            None => Ok(self.len),
        }
    }
}

impl View {
    /// The whole view, encoded in memory: for tests and benchmarks; the agent streams it
    /// to its file with [`View::save_to`].
    pub fn save(&self) -> Result<Vec<u8>, SnapshotError> {
        let mut bytes = Vec::new();
        self.save_to(&mut bytes)?;
        Ok(bytes)
    }

    /// The whole view, encoded into `out` as it goes (give it a buffered writer); the
    /// number of bytes written. The caller holds the view (a read lock) meanwhile: at
    /// 10,000 services about 8 ms of encoding.
    pub fn save_to(&self, out: &mut dyn Write) -> Result<usize, SnapshotError> {
        let mut w = Writer {
            out: Sink::new(out),
            strings: &self.strings,
            table: vec![0; self.strings.slots()],
            written: 0,
        };
        w.out.extend_from_slice(MAGIC);
        w.out
            .extend_from_slice(&hash_name(HASH_CHECK).to_le_bytes());
        w.text(self.node_name());
        w.len(self.services.len());
        for (key, entry) in &self.services {
            w.sym(key.namespace);
            w.sym(key.name);
            match &entry.service {
                Some(service) => {
                    w.u8(1);
                    w.service(service);
                }
                None => w.u8(0),
            }
            w.len(entry.slices.len());
            for slice in &entry.slices {
                w.slice(slice);
            }
        }
        w.len(self.nodes.len());
        for (name, node) in &self.nodes {
            w.sym(*name);
            w.node(node);
        }
        w.len(self.service_cidrs.len());
        for (name, cidrs) in &self.service_cidrs {
            w.text(name);
            w.cidrs(cidrs);
        }
        let sum = w.out.sum;
        w.out.extend_from_slice(&sum.to_le_bytes());
        w.out.finish()
    }

    /// The view `bytes` hold, for the node `node_name`. It is a whole view but an old
    /// one: the caller treats it as stale until the API's lists replace it.
    pub fn restore(node_name: &str, bytes: &[u8]) -> Result<View, SnapshotError> {
        if bytes.len() > MAX_BYTES {
            return Err(SnapshotError::TooLarge(bytes.len()));
        }
        let body_len = bytes
            .len()
            .checked_sub(8)
            .filter(|&n| n >= MAGIC.len() + 8)
            .ok_or(SnapshotError::Magic)?;
        let has_service_cidrs = match &bytes[..MAGIC.len()] {
            magic if magic == MAGIC || magic == MAGIC_V3 || magic == MAGIC_V2 => true,
            magic if magic == MAGIC_V1 => false,
            _ => return Err(SnapshotError::Magic),
        };
        let (body, sum) = bytes.split_at(body_len);
        if sum != fnv1a(body).to_le_bytes() {
            return Err(SnapshotError::Checksum);
        }
        let mut r = Reader {
            bytes: body,
            at: MAGIC.len(),
            table: Vec::new(),
        };
        if r.u64()? != hash_name(HASH_CHECK) {
            return Err(SnapshotError::Incompatible);
        }
        let saved = r.text()?;
        if saved != node_name {
            return Err(SnapshotError::OtherNode {
                saved: saved.to_string(),
                node: node_name.to_string(),
            });
        }
        let mut view = View::new(node_name);
        let mut changes = ChangeSet::default();
        for _ in 0..r.count(3)? {
            let namespace = r.sym_text()?;
            let name = r.sym_text()?;
            if r.flag()? {
                let service = r.service(&mut view.strings)?;
                view.put_service(namespace, name, service, &mut changes);
            }
            for _ in 0..r.count(12)? {
                let slice = r.slice(&mut view.strings)?;
                view.put_slice(namespace, name, slice, &mut changes);
            }
            // What the restore touched is everything; nobody reads it.
            changes = ChangeSet::default();
        }
        for _ in 0..r.count(7)? {
            let name = r.sym_text()?;
            let node = r.node(&mut view.strings)?;
            view.put_node(name.to_string(), node, &mut changes);
        }
        if has_service_cidrs {
            for _ in 0..r.count(2)? {
                let name = r.text()?;
                let cidrs = r.cidrs()?;
                view.put_service_cidr(name.into(), cidrs, &mut changes);
            }
        }
        if r.at != body.len() {
            return Err(r.damaged("bytes after the last ServiceCIDR"));
        }
        Ok(view)
    }
}

struct Writer<'a> {
    out: Sink<'a>,
    strings: &'a Interner,
    /// Per interner slot, 0 for a string not written yet, else its index in the file + 1:
    /// 4 bytes a slot rather than a hash map's 24 an entry.
    table: Vec<u32>,
    written: u32,
}

impl Writer<'_> {
    fn u8(&mut self, value: u8) {
        self.out.push(value);
    }

    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.out.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.out.push(value as u8);
    }

    fn len(&mut self, len: usize) {
        self.varint(len as u64);
    }

    fn i64(&mut self, value: i64) {
        self.varint(((value << 1) ^ (value >> 63)) as u64);
    }

    fn flag(&mut self, value: bool) {
        self.u8(u8::from(value));
    }

    fn text(&mut self, text: &str) {
        self.len(text.len());
        self.out.extend_from_slice(text.as_bytes());
    }

    fn optional_text(&mut self, text: Option<&str>) {
        self.flag(text.is_some());
        if let Some(text) = text {
            self.text(text);
        }
    }

    /// 0 and the text the first time, the index + 1 after that.
    fn sym(&mut self, sym: Sym) {
        match self.table[sym.slot()] {
            0 => {
                self.written += 1;
                self.table[sym.slot()] = self.written;
                self.varint(0);
                self.text(self.strings.resolve(sym));
            }
            index => self.varint(index.into()),
        }
    }

    fn syms(&mut self, syms: &[Sym]) {
        self.len(syms.len());
        for &sym in syms {
            self.sym(sym);
        }
    }

    fn ip(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(v4) => {
                self.u8(4);
                self.out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                self.u8(6);
                self.out.extend_from_slice(&v6.octets());
            }
        }
    }

    fn ips(&mut self, ips: &[IpAddr]) {
        self.len(ips.len());
        for &ip in ips {
            self.ip(ip);
        }
    }

    fn cidrs(&mut self, cidrs: &[Cidr]) {
        self.len(cidrs.len());
        for cidr in cidrs {
            self.ip(cidr.addr);
            self.u8(cidr.prefix);
        }
    }

    fn service(&mut self, s: &Service) {
        self.u8(s.type_ as u8);
        self.flag(s.headless);
        self.ips(&s.cluster_ips);
        self.len(s.ports.len());
        for port in &s.ports {
            self.sym(port.name);
            self.u8(port.protocol as u8);
            self.varint(port.port.into());
            self.varint(port.node_port.into());
        }
        self.u8(s.external_policy as u8);
        self.u8(s.internal_policy as u8);
        self.u8(s.traffic_distribution as u8);
        self.flag(s.publish_not_ready_addresses);
        self.varint(s.affinity_timeout.into());
        self.varint(s.health_check_node_port.into());
        self.flag(s.extra.is_some());
        if let Some(extra) = &s.extra {
            self.ips(&extra.external_ips);
            self.len(extra.load_balancer_ingress.len());
            for ingress in &extra.load_balancer_ingress {
                self.ip(ingress.ip);
                self.flag(ingress.proxy_mode);
            }
            self.cidrs(&extra.load_balancer_source_ranges);
            self.optional_text(extra.external_name.as_deref());
            self.u8(u8::from(extra.proxy_name.is_some()) | u8::from(extra.headless_label) << 1);
            if let Some(name) = extra.proxy_name {
                self.sym(name);
            }
            self.i64(extra.created);
        }
    }

    fn slice(&mut self, s: &Slice) {
        self.out.extend_from_slice(&s.name_hash.to_le_bytes());
        self.flag(s.headless);
        self.len(s.ports.len());
        for port in &s.ports {
            self.sym(port.name);
            self.u8(port.protocol as u8);
            self.varint(port.port.into());
        }
        self.u8(s.family() as u8);
        self.len(s.endpoints.len());
        for endpoint in s.endpoints() {
            match endpoint.addr {
                IpAddr::V4(v4) => self.out.extend_from_slice(&v4.octets()),
                IpAddr::V6(v6) => self.out.extend_from_slice(&v6.octets()),
            }
            self.u8(endpoint.conditions);
            self.sym(endpoint.node);
            self.sym(endpoint.zone);
        }
        self.len(s.extras.len());
        for (index, extra) in s.extras.iter() {
            self.varint((*index).into());
            self.optional_text(extra.hostname.as_deref());
            self.optional_text(extra.pod.as_deref());
            self.syms(&extra.for_zones);
            self.syms(&extra.for_nodes);
        }
    }

    fn node(&mut self, n: &Node) {
        self.len(n.addresses.len());
        for address in &n.addresses {
            self.u8(address.kind as u8);
            self.ip(address.address);
        }
        self.cidrs(&n.pod_cidrs);
        self.sym(n.zone);
        self.len(n.annotations.len());
        for (key, value) in &n.annotations {
            self.text(key);
            self.text(value);
        }
        self.i64(n.created);
        self.u8(u8::from(n.leaving) | u8::from(n.ready) << 1);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The interned strings read so far, by their index in the file.
    table: Vec<&'a str>,
}

type Read<T> = Result<T, SnapshotError>;

impl<'a> Reader<'a> {
    fn damaged(&self, what: &'static str) -> SnapshotError {
        SnapshotError::Damaged { at: self.at, what }
    }

    fn take(&mut self, n: usize) -> Read<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| self.damaged("truncated"))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u8(&mut self) -> Read<u8> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Read<u64> {
        let bytes = self.take(8)?;
        let mut array = [0; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_le_bytes(array))
    }

    fn varint(&mut self) -> Read<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.damaged("an integer longer than 64 bits"))
    }

    fn bounded<T: TryFrom<u64>>(&mut self, what: &'static str) -> Read<T> {
        let value = self.varint()?;
        T::try_from(value).map_err(|_| self.damaged(what))
    }

    fn i64(&mut self) -> Read<i64> {
        let value = self.varint()?;
        Ok((value >> 1) as i64 ^ -((value & 1) as i64))
    }

    fn flag(&mut self) -> Read<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.damaged("a flag that is neither 0 nor 1")),
        }
    }

    /// A count of items that take at least `min_size` bytes each, so that a damaged count
    /// cannot make the reader allocate more than the file could hold.
    fn count(&mut self, min_size: usize) -> Read<usize> {
        let count: usize = self.bounded("a count")?;
        match count.checked_mul(min_size) {
            Some(size) if size <= self.bytes.len() - self.at => Ok(count),
            _ => Err(self.damaged("a count larger than the file")),
        }
    }

    fn text(&mut self) -> Read<&'a str> {
        let len = self.count(1)?;
        let at = self.at;
        std::str::from_utf8(self.take(len)?).map_err(|_| SnapshotError::Damaged {
            at,
            what: "text that is not UTF-8",
        })
    }

    fn optional_text(&mut self) -> Read<Option<Box<str>>> {
        if self.flag()? {
            Ok(Some(self.text()?.into()))
        } else {
            Ok(None)
        }
    }

    /// Where an interned string sits in the table, reading it the first time.
    fn string_index(&mut self) -> Read<usize> {
        match self.bounded::<usize>("a string index")? {
            0 => {
                let text = self.text()?;
                self.table.push(text);
                Ok(self.table.len() - 1)
            }
            index if index <= self.table.len() => Ok(index - 1),
            _ => Err(self.damaged("a string index not yet defined")),
        }
    }

    /// The text of an interned string, without interning it.
    fn sym_text(&mut self) -> Read<&'a str> {
        let index = self.string_index()?;
        Ok(self.table[index])
    }

    /// An interned string, taking one reference in `strings` as the view's own decoding does.
    fn sym(&mut self, strings: &mut Interner) -> Read<Sym> {
        let index = self.string_index()?;
        Ok(strings.intern(self.table[index]))
    }

    fn syms(&mut self, strings: &mut Interner) -> Read<Box<[Sym]>> {
        let count = self.count(1)?;
        (0..count).map(|_| self.sym(strings)).collect()
    }

    fn ip(&mut self) -> Read<IpAddr> {
        match self.u8()? {
            4 => self.v4().map(IpAddr::V4),
            6 => self.v6().map(IpAddr::V6),
            _ => Err(self.damaged("an address family")),
        }
    }

    fn v4(&mut self) -> Read<Ipv4Addr> {
        let octets: [u8; 4] = self
            .take(4)?
            .try_into()
            .map_err(|_| self.damaged("an IPv4 address"))?;
        Ok(Ipv4Addr::from(octets))
    }

    fn v6(&mut self) -> Read<Ipv6Addr> {
        let octets: [u8; 16] = self
            .take(16)?
            .try_into()
            .map_err(|_| self.damaged("an IPv6 address"))?;
        Ok(Ipv6Addr::from(octets))
    }

    fn ips(&mut self) -> Read<Box<[IpAddr]>> {
        let count = self.count(5)?;
        (0..count).map(|_| self.ip()).collect()
    }

    fn cidrs(&mut self) -> Read<Box<[Cidr]>> {
        let count = self.count(6)?;
        (0..count)
            .map(|_| {
                let addr = self.ip()?;
                let prefix = self.u8()?;
                let max = match addr {
                    IpAddr::V4(_) => 32,
                    IpAddr::V6(_) => 128,
                };
                if prefix <= max {
                    Ok(Cidr { addr, prefix })
                } else {
                    Err(self.damaged("a prefix longer than its address"))
                }
            })
            .collect()
    }

    /// A byte that indexes `values`.
    fn tag<T: Copy>(&mut self, values: &[T], what: &'static str) -> Read<T> {
        let tag = usize::from(self.u8()?);
        values.get(tag).copied().ok_or_else(|| self.damaged(what))
    }

    fn protocol(&mut self) -> Read<Protocol> {
        self.tag(
            &[Protocol::Tcp, Protocol::Udp, Protocol::Sctp],
            "a protocol",
        )
    }

    fn traffic_policy(&mut self) -> Read<TrafficPolicy> {
        self.tag(
            &[TrafficPolicy::Cluster, TrafficPolicy::Local],
            "a traffic policy",
        )
    }

    fn service(&mut self, strings: &mut Interner) -> Read<Service> {
        use ServiceType::{ClusterIP, ExternalName, LoadBalancer, NodePort};
        let type_ = self.tag(
            &[ClusterIP, NodePort, LoadBalancer, ExternalName],
            "a service type",
        )?;
        let headless = self.flag()?;
        let cluster_ips = ClusterIps::new(&self.ips()?)
            .ok_or_else(|| self.damaged("more than two cluster IPs"))?;
        let count = self.count(4)?;
        let ports = (0..count)
            .map(|_| {
                Ok(ServicePort {
                    name: self.sym(strings)?,
                    protocol: self.protocol()?,
                    port: self.bounded("a port")?,
                    node_port: self.bounded("a node port")?,
                })
            })
            .collect::<Read<_>>()?;
        let external_policy = self.traffic_policy()?;
        let internal_policy = self.traffic_policy()?;
        use TrafficDistribution::{PreferClose, PreferSameNode, PreferSameZone, Unset};
        let traffic_distribution = self.tag(
            &[Unset, PreferClose, PreferSameZone, PreferSameNode],
            "a traffic distribution",
        )?;
        let publish_not_ready_addresses = self.flag()?;
        let affinity_timeout = self.bounded("an affinity timeout")?;
        let health_check_node_port = self.bounded("a health-check node port")?;
        let extra = if self.flag()? {
            Some(Box::new(self.service_extra(strings)?))
        } else {
            None
        };
        Ok(Service {
            type_,
            headless,
            cluster_ips,
            ports,
            external_policy,
            internal_policy,
            traffic_distribution,
            publish_not_ready_addresses,
            affinity_timeout,
            health_check_node_port,
            extra,
        })
    }

    fn slice(&mut self, strings: &mut Interner) -> Read<Slice> {
        let name_hash = self.u64()?;
        let headless = self.flag()?;
        let count = self.count(3)?;
        let ports = (0..count)
            .map(|_| {
                Ok(SlicePort {
                    name: self.sym(strings)?,
                    protocol: self.protocol()?,
                    port: self.bounded("a port")?,
                })
            })
            .collect::<Read<_>>()?;
        let family = self.tag(&Family::ALL, "an address family")?;
        let endpoints = match family {
            Family::V4 => {
                let count = self.count(7)?;
                Endpoints::V4(
                    (0..count)
                        .map(|_| self.endpoint(Self::v4, strings))
                        .collect::<Read<_>>()?,
                )
            }
            Family::V6 => {
                let count = self.count(19)?;
                Endpoints::V6(
                    (0..count)
                        .map(|_| self.endpoint(Self::v6, strings))
                        .collect::<Read<_>>()?,
                )
            }
        };
        let count = self.count(5)?;
        let mut extras: Vec<(u32, EndpointExtra)> = Vec::with_capacity(count);
        for _ in 0..count {
            let index: u32 = self.bounded("an endpoint index")?;
            // The view finds extras by binary search, in the endpoints' order.
            if index as usize >= endpoints.len() || extras.last().is_some_and(|(i, _)| *i >= index)
            {
                return Err(self.damaged("endpoint extras out of order"));
            }
            let extra = EndpointExtra {
                hostname: self.optional_text()?,
                pod: self.optional_text()?,
                for_zones: self.syms(strings)?,
                for_nodes: self.syms(strings)?,
            };
            extras.push((index, extra));
        }
        Ok(Slice {
            name_hash,
            headless,
            ports,
            endpoints,
            extras: extras.into(),
        })
    }

    fn endpoint<A>(
        &mut self,
        addr: fn(&mut Self) -> Read<A>,
        strings: &mut Interner,
    ) -> Read<Endpoint<A>> {
        let addr = addr(self)?;
        let conditions = self.u8()?;
        if conditions > 7 {
            return Err(self.damaged("endpoint conditions"));
        }
        Ok(Endpoint {
            addr,
            conditions,
            node: self.sym(strings)?,
            zone: self.sym(strings)?,
        })
    }

    fn service_extra(&mut self, strings: &mut Interner) -> Read<ServiceExtra> {
        let external_ips = self.ips()?;
        let count = self.count(6)?;
        let load_balancer_ingress = (0..count)
            .map(|_| {
                Ok(LoadBalancerIngress {
                    ip: self.ip()?,
                    proxy_mode: self.flag()?,
                })
            })
            .collect::<Read<_>>()?;
        let load_balancer_source_ranges = self.cidrs()?;
        let external_name = self.optional_text()?;
        // Before version 4 a flag (0 or 1): whether it has a proxy name.
        let labels = self.u8()?;
        if labels > 3 {
            return Err(self.damaged("service label flags above 3"));
        }
        let proxy_name = if labels & 1 != 0 {
            Some(self.sym(strings)?)
        } else {
            None
        };
        Ok(ServiceExtra {
            external_ips,
            load_balancer_ingress,
            load_balancer_source_ranges,
            external_name,
            proxy_name,
            headless_label: labels & 2 != 0,
            created: self.i64()?,
        })
    }

    fn node(&mut self, strings: &mut Interner) -> Read<Node> {
        let count = self.count(6)?;
        let addresses = (0..count)
            .map(|_| {
                Ok(NodeAddress {
                    kind: self.tag(
                        &[NodeAddressKind::InternalIP, NodeAddressKind::ExternalIP],
                        "a node address type",
                    )?,
                    address: self.ip()?,
                })
            })
            .collect::<Read<_>>()?;
        let pod_cidrs = self.cidrs()?;
        let zone = self.sym(strings)?;
        let count = self.count(2)?;
        let annotations = (0..count)
            .map(|_| Ok((self.text()?.into(), self.text()?.into())))
            .collect::<Read<_>>()?;
        let created = self.i64()?;
        // Before version 3 a flag (0 or 1): whether it is leaving.
        let flags = self.u8()?;
        if flags > 3 {
            return Err(self.damaged("node flags above 3"));
        }
        Ok(Node {
            addresses,
            pod_cidrs,
            zone,
            annotations,
            created,
            leaving: flags & 1 != 0,
            ready: flags & 2 != 0,
            // Not saved: the mesh, the only reader, waits for the lists.
            ready_changed: i64::MIN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Kind, Update, wire};

    fn update(json: serde_json::Value) -> Update {
        match json["kind"].as_str() {
            Some("Service") => Update::Service(serde_json::from_value(json).expect("service")),
            Some("EndpointSlice") => {
                Update::EndpointSlice(serde_json::from_value(json).expect("slice"))
            }
            Some("ServiceCIDR") => {
                Update::ServiceCidr(serde_json::from_value(json).expect("service cidr"))
            }
            _ => Update::Node(serde_json::from_value::<Box<wire::Node>>(json).expect("node")),
        }
    }

    /// A view that uses every field the format carries.
    fn varied() -> View {
        let mut view = View::new("node-a");
        let objects = serde_json::json!([
            {"kind": "Service", "metadata": {"name": "web", "namespace": "shop",
                "creationTimestamp": "2024-01-02T03:04:05Z",
                "labels": {"service.kubernetes.io/service-proxy-name": ""}},
             "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.10", "fd00::10"],
                "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"},
                          {"name": "dns", "port": 53, "protocol": "UDP"}],
                "externalIPs": ["192.0.2.7"], "loadBalancerSourceRanges": ["198.51.100.0/24"],
                "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Local",
                "healthCheckNodePort": 31000, "trafficDistribution": "PreferClose",
                "publishNotReadyAddresses": true, "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}},
             "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9", "ipMode": "Proxy"}]}}},
            {"kind": "Service", "metadata": {"name": "out", "namespace": "shop"},
             "spec": {"type": "ExternalName", "externalName": "example.org"}},
            {"kind": "Service", "metadata": {"name": "no-proxy", "namespace": "shop",
                "labels": {"service.kubernetes.io/headless": ""}},
             "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": 80}]}},
            {"kind": "EndpointSlice", "metadata": {"name": "web-v4", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web",
                           "service.kubernetes.io/headless": ""}},
             "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
             "endpoints": [
                {"addresses": ["10.244.1.5"], "nodeName": "node-a", "zone": "z1",
                 "conditions": {"ready": true}},
                {"addresses": ["10.244.2.6"], "nodeName": "node-b", "zone": "z2",
                 "hostname": "web-1", "targetRef": {"kind": "Pod", "name": "web-1"},
                 "conditions": {"ready": false, "serving": true, "terminating": true},
                 "hints": {"forZones": [{"name": "z2"}], "forNodes": [{"name": "node-b"}]}}]},
            {"kind": "EndpointSlice", "metadata": {"name": "web-v6", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
             "addressType": "IPv6", "ports": [{"port": 8080}],
             "endpoints": [{"addresses": ["fd00:244::5"], "nodeName": "node-a"}]},
            {"kind": "EndpointSlice", "metadata": {"name": "orphan-1", "namespace": "other",
                "labels": {"kubernetes.io/service-name": "orphan"}},
             "addressType": "IPv4", "ports": [{"port": 1}],
             "endpoints": [{"addresses": ["10.244.3.1"], "nodeName": "node-c"}]},
            {"kind": "Node", "metadata": {"name": "node-a",
                "creationTimestamp": "2023-05-06T07:08:09Z",
                "labels": {"topology.kubernetes.io/zone": "z1"},
                "annotations": {"nodus.dev/wireguard-public-key": "key-a",
                                "nodus.dev/wireguard-port": "51820"}},
             "spec": {"podCIDRs": ["10.244.1.0/24", "fd00:244:1::/64"],
                      "taints": [{"key": "ToBeDeletedByClusterAutoscaler"}]},
             "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.1"},
                                      {"type": "ExternalIP", "address": "2001:db8::1"}]}},
            {"kind": "Node", "metadata": {"name": "node-b"},
             "spec": {"podCIDR": "10.244.2.0/24"},
             "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.2"}],
                        "conditions": [{"type": "Ready", "status": "True"}]}},
            {"kind": "ServiceCIDR", "metadata": {"name": "kubernetes"},
             "spec": {"cidrs": ["10.96.0.0/16", "fd00:96::/112"]}},
            {"kind": "ServiceCIDR", "metadata": {"name": "extra"},
             "spec": {"cidrs": ["10.97.0.0/24"]}}
        ]);
        let report = view.apply(
            objects
                .as_array()
                .expect("array")
                .iter()
                .cloned()
                .map(update),
        );
        assert!(report.invalid.is_empty(), "{:?}", report.invalid);
        view
    }

    /// Each entry and node written alone, strings spelled out: the same for two views
    /// that hold the same, whatever their interners' numbering.
    fn canonical(view: &View) -> Vec<Vec<u8>> {
        let mut entries = Vec::new();
        let encoded = |write: &mut dyn FnMut(&mut Writer<'_>)| {
            let mut bytes = Vec::new();
            let mut w = Writer {
                out: Sink::new(&mut bytes),
                strings: &view.strings,
                table: vec![0; view.strings.slots()],
                written: 0,
            };
            write(&mut w);
            drop(w);
            bytes
        };
        for (key, entry) in &view.services {
            entries.push(encoded(&mut |w| {
                w.sym(key.namespace);
                w.sym(key.name);
                if let Some(service) = &entry.service {
                    w.service(service);
                }
                for slice in &entry.slices {
                    w.slice(slice);
                }
            }));
        }
        for (name, node) in &view.nodes {
            entries.push(encoded(&mut |w| {
                w.sym(*name);
                w.node(node);
            }));
        }
        for (name, cidrs) in &view.service_cidrs {
            entries.push(encoded(&mut |w| {
                w.text(name);
                w.cidrs(cidrs);
            }));
        }
        entries.sort();
        entries
    }

    #[test]
    fn a_view_comes_back_whole() {
        let view = varied();
        let bytes = view.save().expect("save");
        let restored = View::restore("node-a", &bytes).expect("restore");
        assert_eq!(canonical(&restored), canonical(&view));
        assert_eq!(restored.counts(), view.counts());
        let shown =
            |v: &View| serde_json::to_string(&crate::output::resolve_view(v)).expect("json");
        assert_eq!(shown(&restored), shown(&view));
        assert_eq!(
            restored
                .services_by_ip("10.244.2.6".parse().expect("ip"))
                .count(),
            1,
            "the reverse index is rebuilt"
        );
        assert!(restored.this_node().is_some_and(|n| n.leaving && !n.ready));
        assert!(
            restored
                .node("node-b")
                .is_some_and(|n| n.ready && !n.leaving)
        );
        assert_eq!(restored.service_cidrs().len(), 3);
        let not_proxied = |v: &View, name: &str| {
            v.service("shop", name)
                .and_then(|s| s.service)
                .is_some_and(Service::not_proxied)
        };
        assert!(not_proxied(&restored, "no-proxy"), "the headless label");
        assert!(not_proxied(&restored, "web"), "the proxy name");
        assert!(!not_proxied(&restored, "out"));
    }

    #[test]
    fn a_version_1_snapshot_is_read_without_service_cidrs() {
        let mut view = varied();
        view.service_cidrs.clear();
        let mut bytes = view.save().expect("save");
        bytes[..MAGIC_V1.len()].copy_from_slice(MAGIC_V1);
        // Version 1 ends after the nodes: drop the empty ServiceCIDR count, sum again.
        bytes.truncate(bytes.len() - 9);
        let sum = fnv1a(&bytes).to_le_bytes();
        bytes.extend_from_slice(&sum);
        let restored = View::restore("node-a", &bytes).expect("restore");
        assert_eq!(canonical(&restored), canonical(&view));
        assert!(restored.service_cidrs().is_empty());
    }

    #[test]
    fn a_fresh_list_replaces_the_restored_view_and_every_string_is_freed() {
        let bytes = varied().save().expect("save");
        let mut view = View::restore("node-a", &bytes).expect("restore");
        // The API's lists deliver nothing: everything restored is swept.
        let relist: Vec<Update> = Kind::ALL
            .iter()
            .flat_map(|&kind| [Update::RelistStarted(kind), Update::RelistDone(kind)])
            .collect();
        let report = view.apply(relist);
        assert!(report.changes.services.len() >= 3);
        assert_eq!(view.counts().services, 0);
        assert_eq!(view.counts().nodes, 0);
        assert!(report.changes.service_cidrs);
        assert!(view.service_cidrs().is_empty());
        assert_eq!(view.strings().len(), 1, "only the node's own name is left");
    }

    #[test]
    fn a_relisted_slice_replaces_its_restored_self() {
        let bytes = varied().save().expect("save");
        let mut view = View::restore("node-a", &bytes).expect("restore");
        let slice = serde_json::json!({"kind": "EndpointSlice",
            "metadata": {"name": "web-v6", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv6", "ports": [{"port": 8080}],
            "endpoints": [{"addresses": ["fd00:244::9"], "nodeName": "node-b"}]});
        view.apply([
            Update::RelistStarted(Kind::EndpointSlice),
            update(slice),
            Update::RelistDone(Kind::EndpointSlice),
        ]);
        let web = view.service("shop", "web").expect("web");
        assert_eq!(web.slices.len(), 1, "the other restored slice is swept");
        let addrs: Vec<IpAddr> = web.slices[0].endpoints().map(|e| e.addr).collect();
        assert_eq!(addrs, ["fd00:244::9".parse::<IpAddr>().expect("ip")]);
    }

    #[test]
    fn damage_is_refused_and_never_panics() {
        let bytes = varied().save().expect("save");
        for len in 0..bytes.len() {
            assert!(
                View::restore("node-a", &bytes[..len]).is_err(),
                "cut at {len}"
            );
        }
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x41;
            assert!(View::restore("node-a", &damaged).is_err(), "byte {at}");
            // With the checksum made to match, the reader itself must refuse or cope.
            let body = damaged.len() - 8;
            let sum = fnv1a(&damaged[..body]).to_le_bytes();
            damaged[body..].copy_from_slice(&sum);
            let _ = View::restore("node-a", &damaged);
        }
        assert_eq!(
            View::restore("node-b", &bytes).err(),
            Some(SnapshotError::OtherNode {
                saved: "node-a".into(),
                node: "node-b".into()
            })
        );
        assert_eq!(
            View::restore("node-a", b"not a snapshot at all").err(),
            Some(SnapshotError::Magic)
        );
    }
}
