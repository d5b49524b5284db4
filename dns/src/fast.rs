//! The UDP fast path: the common questions about the cluster zone answered straight from
//! the packet bytes into a caller's buffer, without hickory's message types and without
//! allocating.
//!
//! It takes a query only when it is sure of it: one question of class IN, opcode QUERY, no
//! records but an optional well-formed OPT, no trailing bytes, a name in the cluster zone,
//! and an answer [`crate::lookup::common`] decides (misses, names without records, a
//! ClusterIP service's addresses and SRV). Everything else (and any answer that would not
//! fit, which hickory truncates) returns `None` and takes the full path, which gives the
//! same answers for what the fast path takes (`tests/fast_path.rs` compares them).
//!
//! The reply is what the full path sends, field by field: the question copied verbatim (its
//! case kept), AA, RD and CD as asked, the SOA in the authority section of negative
//! answers, an OPT with our payload size when the query had one. Names are compressed
//! against the question where the bytes match exactly, so case is never borrowed from it.

use crate::lookup::{
    Common, MAX_LABELS, MAX_UDP_PAYLOAD, ServiceSrv, Target, Zone, classify, cluster_addresses,
    common,
};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{RData, RecordType};
use nodus_view::View;
use std::net::IpAddr;

/// What the fast path wrote, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub len: usize,
    pub qtype: RecordType,
    pub rcode: ResponseCode,
}

const HEADER: usize = 12;
/// A name's wire form is at most 255 bytes, so it has at most 127 labels.
const MAX_NAME_LABELS: usize = 127;
const CLASS_IN: u16 = 1;
const TYPE_OPT: u16 = 41;
/// EDNS options hickory parses (and may reject) rather than carrying them as bytes: NSID,
/// DAU and client subnet. A query with one takes the full path.
const PARSED_OPTIONS: [u16; 3] = [3, 5, 8];

/// The question, where it lies in the packet.
struct Question<'p> {
    packet: &'p [u8],
    /// Offset of each label's length byte.
    labels: [u16; MAX_NAME_LABELS],
    count: usize,
    /// Offset just past the question (name, type and class).
    end: usize,
    qtype: u16,
}

impl Question<'_> {
    fn label(&self, index: usize) -> &[u8] {
        let at = usize::from(self.labels[index]);
        &self.packet[at + 1..at + 1 + usize::from(self.packet[at])]
    }
}

/// Reads the question name at offset 12; `None` for a pointer, an extended label type or an
/// overlong name (hickory rejects those, and a query never needs them).
fn read_question(packet: &[u8]) -> Option<Question<'_>> {
    let mut question = Question {
        packet,
        labels: [0; MAX_NAME_LABELS],
        count: 0,
        end: 0,
        qtype: 0,
    };
    let mut at = HEADER;
    loop {
        let len = *packet.get(at)?;
        if len == 0 {
            break;
        }
        if len & 0xC0 != 0 || question.count == MAX_NAME_LABELS {
            return None;
        }
        question.labels[question.count] = u16::try_from(at).ok()?;
        question.count += 1;
        at += 1 + usize::from(len);
    }
    // The terminating zero counts towards the 255 bytes.
    if at + 1 - HEADER > 255 {
        return None;
    }
    question.qtype = read_u16(packet, at + 1)?;
    if read_u16(packet, at + 3)? != CLASS_IN {
        return None;
    }
    question.end = at + 5;
    Some(question)
}

fn read_u16(packet: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*packet.get(at)?, *packet.get(at + 1)?]))
}

/// The requester's OPT: its UDP payload size and the DO bit.
#[derive(Clone, Copy)]
struct Opt {
    payload: u16,
    dnssec_ok: bool,
}

/// The requester's OPT when the rest of the packet is exactly one well-formed OPT record of
/// version 0; `None` for anything else (a later version is the full path's BADVERS).
fn read_opt(packet: &[u8], at: usize) -> Option<Opt> {
    // Root owner, type OPT, class = payload size, TTL = extended rcode, version and flags.
    if *packet.get(at)? != 0 || read_u16(packet, at + 1)? != TYPE_OPT {
        return None;
    }
    if *packet.get(at + 6)? != 0 {
        return None;
    }
    let opt = Opt {
        payload: read_u16(packet, at + 3)?.clamp(512, MAX_UDP_PAYLOAD),
        dnssec_ok: *packet.get(at + 7)? & 0x80 != 0,
    };
    let rdlength = usize::from(read_u16(packet, at + 9)?);
    let mut option = at + 11;
    let end = option + rdlength;
    if end != packet.len() {
        return None;
    }
    while option < end {
        let code = read_u16(packet, option)?;
        let len = usize::from(read_u16(packet, option + 2)?);
        if PARSED_OPTIONS.contains(&code) {
            return None;
        }
        option += 4 + len;
    }
    (option == end).then_some(opt)
}

/// A reply being written into a fixed buffer; every write fails once it is full.
struct Writer<'b> {
    buf: &'b mut [u8],
    len: usize,
    /// Where the zone's name was written in full, once it was.
    zone_at: Option<u16>,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) -> Option<()> {
        self.buf
            .get_mut(self.len..self.len + bytes.len())?
            .copy_from_slice(bytes);
        self.len += bytes.len();
        Some(())
    }

    fn u16(&mut self, value: u16) -> Option<()> {
        self.put(&value.to_be_bytes())
    }

    fn set_u16(&mut self, at: usize, value: u16) {
        self.buf[at..at + 2].copy_from_slice(&value.to_be_bytes());
    }

    fn offset(&self) -> Option<u16> {
        u16::try_from(self.len).ok().filter(|o| *o < 0x4000)
    }

    fn pointer(&mut self, to: u16) -> Option<()> {
        self.u16(0xC000 | to)
    }

    /// `prefix` then the zone, pointing into the question where its labels are the same
    /// bytes (so the question's case is never borrowed), else to the zone written earlier.
    fn name(&mut self, prefix: &[&[u8]], zone: &Zone, question: &Question<'_>) -> Option<()> {
        let zone_labels = zone.origin().num_labels() as usize;
        let question_zone = question.count.checked_sub(zone_labels)?;
        let zone_same = zone
            .origin()
            .iter()
            .enumerate()
            .all(|(i, label)| question.label(question_zone + i) == label);
        if zone_same {
            // The longest tail of `prefix` the question ends with.
            for skip in 0..=prefix.len() {
                let tail = &prefix[skip..];
                let Some(first) = question_zone.checked_sub(tail.len()) else {
                    continue;
                };
                if tail
                    .iter()
                    .enumerate()
                    .all(|(i, label)| question.label(first + i) == *label)
                {
                    self.labels(&prefix[..skip])?;
                    return self.pointer(question.labels[first]);
                }
            }
        }
        self.labels(prefix)?;
        match self.zone_at {
            Some(at) => self.pointer(at),
            None => {
                self.zone_at = self.offset();
                self.zone(zone)
            }
        }
    }

    /// The zone's labels and the root.
    fn zone(&mut self, zone: &Zone) -> Option<()> {
        for label in zone.origin().iter() {
            self.labels(&[label])?;
        }
        self.put(&[0])
    }

    fn labels(&mut self, labels: &[&[u8]]) -> Option<()> {
        for label in labels {
            self.put(&[u8::try_from(label.len()).ok().filter(|l| *l <= 63)?])?;
            self.put(label)?;
        }
        Some(())
    }

    /// Type, class IN and TTL of a record whose owner is already written, then a length
    /// to fill in once the data is: returns where the length goes.
    fn record_header(&mut self, rtype: RecordType, ttl: u32) -> Option<usize> {
        self.u16(u16::from(rtype))?;
        self.u16(CLASS_IN)?;
        self.put(&ttl.to_be_bytes())?;
        let at = self.len;
        self.u16(0)?;
        Some(at)
    }

    fn end_record(&mut self, length_at: usize) -> Option<()> {
        let rdlength = u16::try_from(self.len - length_at - 2).ok()?;
        self.set_u16(length_at, rdlength);
        Some(())
    }

    /// An A or AAAA record; `owner` points at a name already written.
    fn address(&mut self, owner: u16, ttl: u32, ip: IpAddr) -> Option<()> {
        self.pointer(owner)?;
        let (rtype, bytes): (RecordType, &[u8]) = match &ip {
            IpAddr::V4(v4) => (RecordType::A, &v4.octets()),
            IpAddr::V6(v6) => (RecordType::AAAA, &v6.octets()),
        };
        let at = self.record_header(rtype, ttl)?;
        self.put(bytes)?;
        self.end_record(at)
    }
}

/// Answers `packet` into `out` if the fast path can; `None` leaves it to the full path.
/// A truncated reply to the query in `packet` (its header and question, QR and TC set, no
/// records) written into `out`: what a client over the rate limit gets instead of the answer
/// ([`crate::rate`]), so that it asks again over TCP. `None` for anything but a query with
/// one question this parser reads.
pub fn truncated(packet: &[u8], out: &mut [u8]) -> Option<Reply> {
    let header = packet.get(..HEADER)?;
    if header[2] & 0x80 != 0 || read_u16(header, 4)? != 1 {
        return None;
    }
    let question = read_question(packet)?;
    let reply = out.get_mut(..question.end)?;
    reply.copy_from_slice(&packet[..question.end]);
    // QR and TC; the opcode and RD as asked; no RA, NOERROR; one question, no records.
    reply[2] = (reply[2] & 0x79) | 0x82;
    reply[3] = 0;
    reply[6..12].fill(0);
    Some(Reply {
        len: question.end,
        qtype: RecordType::from(question.qtype),
        rcode: ResponseCode::NoError,
    })
}

/// `client` sent the packet: a miss in its own namespace may be the first name of its
/// search list, which autopath walks on the full path.
pub fn answer(
    view: &View,
    zone: &Zone,
    client: IpAddr,
    packet: &[u8],
    out: &mut [u8],
) -> Option<Reply> {
    let Query {
        header,
        flags,
        codes,
        question,
        opt,
    } = Query::read(packet)?;
    let qtype = RecordType::from(question.qtype);

    // The labels below the zone, lower-cased, as `lookup` sees them.
    let zone_labels = zone.origin().num_labels() as usize;
    if zone_labels == 0 {
        return None;
    }
    let relative = question.count.checked_sub(zone_labels)?;
    if question.count > 0
        && question
            .label(question.count - 1)
            .eq_ignore_ascii_case(b"arpa")
    {
        return None;
    }
    for (i, label) in zone.origin().iter().enumerate() {
        if !question.label(relative + i).eq_ignore_ascii_case(label) {
            return None;
        }
    }
    let mut lower = [0u8; 255];
    let mut label_bytes = [(0usize, 0usize); MAX_LABELS];
    let taken = relative.min(MAX_LABELS);
    let mut used = 0;
    for (i, slot) in label_bytes.iter_mut().enumerate().take(taken) {
        let label = question.label(i);
        lower[used..used + label.len()].copy_from_slice(label);
        lower[used..used + label.len()].make_ascii_lowercase();
        *slot = (used, used + label.len());
        used += label.len();
    }
    let mut strs = [""; MAX_LABELS];
    for (slot, (from, to)) in strs.iter_mut().zip(&label_bytes).take(taken) {
        *slot = std::str::from_utf8(&lower[*from..*to]).unwrap_or("");
    }
    let target: Target<'_> = classify(view, zone, &strs[..taken]);
    let decided = common(view, &target, qtype)?;
    if matches!(decided, Common::NxDomain) && first_of_search_list(view, zone, client, &question) {
        return None;
    }

    let max = opt
        .map_or(512, |opt| usize::from(opt.payload))
        .min(out.len());
    let mut w = Writer {
        buf: &mut out[..max],
        len: 0,
        zone_at: None,
    };
    let rcode = match decided {
        Common::NxDomain => ResponseCode::NXDomain,
        _ => ResponseCode::NoError,
    };
    w.put(&header[..2])?;
    // QR and AA, RD as asked; CD as asked; RA clear; the rcode (all fit in four bits).
    w.put(&[
        0x84 | (flags & 0x01),
        (codes & 0x10) | u16::from(rcode) as u8,
    ])?;
    w.put(&[0, 1, 0, 0, 0, 0, 0, 0])?;
    w.put(&packet[HEADER..question.end])?;
    write_sections(&mut w, zone, &question, decided, opt)?;
    Some(Reply {
        len: w.len,
        qtype,
        rcode,
    })
}

/// A query as the fast path takes it: one question, no records but an optional OPT.
struct Query<'p> {
    header: &'p [u8],
    flags: u8,
    codes: u8,
    question: Question<'p>,
    opt: Option<Opt>,
}

impl<'p> Query<'p> {
    /// A query (QR clear), opcode QUERY, the Z bit clear, one question that is not of a
    /// meta type (OPT, TKEY, TSIG, IXFR, AXFR: for the full path to judge), nothing after
    /// it but an OPT; None for anything else.
    fn read(packet: &'p [u8]) -> Option<Query<'p>> {
        let header = packet.get(..HEADER)?;
        let (flags, codes) = (header[2], header[3]);
        if flags & 0xF8 != 0 || codes & 0x40 != 0 {
            return None;
        }
        let counts = [
            read_u16(header, 4)?,
            read_u16(header, 6)?,
            read_u16(header, 8)?,
            read_u16(header, 10)?,
        ];
        let with_opt = match counts {
            [1, 0, 0, 0] => false,
            [1, 0, 0, 1] => true,
            _ => return None,
        };
        let question = read_question(packet)?;
        let opt = if with_opt {
            Some(read_opt(packet, question.end)?)
        } else if question.end == packet.len() {
            None
        } else {
            return None;
        };
        if matches!(question.qtype, 41 | 249..=252) {
            return None;
        }
        Some(Query {
            header,
            flags,
            codes,
            question,
            opt,
        })
    }
}

/// The answer, authority and additional sections of the reply `decided`, after the
/// header and question `w` holds, with their counts set in the header.
fn write_sections(
    w: &mut Writer<'_>,
    zone: &Zone,
    question: &Question<'_>,
    decided: Common<'_>,
    opt: Option<Opt>,
) -> Option<()> {
    let (mut answers, mut authorities, mut additionals) = (0u16, 0u16, 0u16);
    let ttl = zone.ttl();
    match decided {
        Common::NxDomain | Common::NoData => {
            write_soa(w, zone, question)?;
            authorities += 1;
        }
        Common::Addresses { service, family } => {
            for ip in cluster_addresses(service, family) {
                w.address(HEADER as u16, ttl, ip)?;
                answers += 1;
            }
        }
        Common::Srv(srv) => {
            let target = write_srv(w, zone, &srv, &mut answers)?;
            for ip in cluster_addresses(srv.service, None) {
                w.address(target, ttl, ip)?;
                additionals += 1;
            }
        }
    }
    if let Some(opt) = opt {
        // Root owner, OPT, our payload size, extended rcode 0, version 0, DO as asked, no
        // data.
        w.put(&[0, 0, 41])?;
        w.u16(opt.payload)?;
        w.put(&[0, 0, u8::from(opt.dnssec_ok) << 7, 0, 0, 0])?;
        additionals += 1;
    }
    w.set_u16(6, answers);
    w.set_u16(8, authorities);
    w.set_u16(10, additionals);
    Some(())
}

/// Whether autopath may walk on from the question: it is on, and the question is
/// `X.<ns>.svc.<zone>` from a `ClusterFirst` pod of this node in namespace `ns`
/// ([`crate::autopath::search_after`] decides the rest).
fn first_of_search_list(view: &View, zone: &Zone, client: IpAddr, question: &Question<'_>) -> bool {
    let below_zone = question.count - zone.origin().num_labels() as usize;
    zone.autopath().is_some()
        && below_zone >= 3
        && question.label(below_zone - 1).eq_ignore_ascii_case(b"svc")
        && view.local_pod(client).is_some_and(|pod| {
            pod.pod.cluster_search
                && question
                    .label(below_zone - 2)
                    .eq_ignore_ascii_case(pod.namespace.as_bytes())
        })
}

/// The zone's SOA, as negative answers carry it.
fn write_soa(w: &mut Writer<'_>, zone: &Zone, question: &Question<'_>) -> Option<()> {
    let soa = zone.soa();
    let RData::SOA(data) = &soa.data else {
        return None;
    };
    w.name(&[], zone, question)?;
    let at = w.record_header(RecordType::SOA, soa.ttl)?;
    w.name(&[b"ns", b"dns"], zone, question)?;
    w.name(&[b"hostmaster"], zone, question)?;
    w.put(&data.serial.to_be_bytes())?;
    for value in [data.refresh, data.retry, data.expire] {
        w.put(&value.to_be_bytes())?;
    }
    w.put(&data.minimum.to_be_bytes())?;
    w.end_record(at)
}

/// One SRV per port, each targeting the service's name; returns where that name is, for
/// the additional records' owners.
fn write_srv(
    w: &mut Writer<'_>,
    zone: &Zone,
    srv: &ServiceSrv<'_>,
    answers: &mut u16,
) -> Option<u16> {
    let weight = srv.weight();
    let own: [&[u8]; 3] = [srv.name.as_bytes(), srv.namespace.as_bytes(), b"svc"];
    let mut target = None;
    for port in srv.ports() {
        w.pointer(HEADER as u16)?;
        let at = w.record_header(RecordType::SRV, zone.ttl())?;
        w.put(&[0, 0])?;
        w.u16(weight)?;
        w.u16(port)?;
        // RFC 2782: the target is never compressed; the additional records point at it.
        target = target.or(w.offset());
        w.labels(&own)?;
        w.zone(zone)?;
        w.end_record(at)?;
        *answers += 1;
    }
    target
}
