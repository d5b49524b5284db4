//! The netlink socket: committing batches and reading state back.
//!
//! A [`Socket`] belongs to the network namespace of the thread that opened it, for its
//! whole life; tests open one inside a test namespace. All calls are blocking and
//! synchronous: the kernel processes a batch inside our `sendmsg`, so its replies are
//! queued by the time we read them. A generation query sent right after the batch is
//! answered after them, which tells us when we have seen every reply, and gives the
//! generation the commit produced.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR,
    NetlinkBuffer, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::nftables::{GenAttribute, NfTablesMessage};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner};

use super::attr::{self, Attr};
use super::batch::{Batch, Request, ctnetlink_type, encode_message, nftables_type};
use super::conntrack::UdpEntry;
use super::error::{Errno, Error, Result};
use super::object;
use super::object::Table;
use super::sys;
use super::types::Verdict;
use nodus_view::model::Family;

/// Replies are read into a buffer this large; kernel datagrams (acks, dump parts) are
/// far smaller.
const RECEIVE_BUFFER: usize = 256 * 1024;
/// How long to wait for a reply before declaring the exchange broken.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Receive-queue room per acknowledged message: an ack is a small skb, but the queue is
/// charged its truesize (about 1 KiB with `NETLINK_CAP_ACK`).
const RECEIVE_ROOM_PER_ACK: usize = 1024;
/// Attributes of an `NLMSG_ERROR` extended ack (`enum nlmsgerr_attrs`).
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLMSGERR_ATTR_OFFS: u16 = 2;
/// `nlmsghdr` and `nfgenmsg`, before a message's attributes.
const NFNETLINK_HEADERS: usize = 16 + 4;
/// First sequence number of queries; batches use 0..=N.
const FIRST_QUERY_SEQUENCE: u32 = 0x4000_0000;

/// A `NETLINK_NETFILTER` socket in the network namespace of the thread that opened it.
pub struct Socket {
    socket: netlink_sys::Socket,
    receive_buffer: Vec<u8>,
    next_query_sequence: u32,
    /// Buffer sizes already granted, so each commit only grows them.
    send_buffer_size: usize,
    receive_buffer_size: usize,
}

/// One message read from the socket.
struct Reply {
    sequence: u32,
    message_type: u16,
    flags: u16,
    bytes: Vec<u8>,
}

/// What an `NLMSG_ERROR` says.
struct ErrorReply {
    /// 0 for an acknowledgement.
    errno: i32,
    message: Option<String>,
    /// Byte offset of the offending attribute within the refused message.
    offset: Option<u32>,
}

/// An element as the kernel lists it: raw key and data bytes, to compare with
/// [`super::Tuple::to_bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedElement {
    pub key: Vec<u8>,
    pub key_end: Option<Vec<u8>>,
    pub data: Option<ListedData>,
    /// Set for the closing element of a one-field interval.
    pub interval_end: bool,
    /// Remaining lifetime of an element with a timeout.
    pub expires_in: Option<Duration>,
    /// Packets counted, in a set with counters.
    pub packets: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListedData {
    Value(Vec<u8>),
    Verdict(Verdict),
}

impl Socket {
    /// Opens a socket in the current thread's network namespace.
    pub fn open() -> Result<Socket> {
        let mut socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_NETFILTER)
            .map_err(|e| Error::io("opening", e))?;
        socket.bind_auto().map_err(|e| Error::io("binding", e))?;
        // Acks echo only the request header, not the whole (possibly large) message.
        socket
            .set_cap_ack(true)
            .map_err(|e| Error::io("enabling NETLINK_CAP_ACK", e))?;
        // Ask for the offending attribute's offset and the kernel's explanation.
        socket
            .set_ext_ack(true)
            .map_err(|e| Error::io("enabling NETLINK_EXT_ACK", e))?;
        set_receive_timeout(&socket, REPLY_TIMEOUT)?;
        Ok(Socket {
            socket,
            receive_buffer: Vec::with_capacity(RECEIVE_BUFFER),
            next_query_sequence: FIRST_QUERY_SEQUENCE,
            send_buffer_size: 0,
            receive_buffer_size: 0,
        })
    }

    /// Commits `batch` atomically and returns the ruleset generation after it.
    ///
    /// On [`Error::Refused`] nothing of the batch was applied.
    pub fn commit(&mut self, batch: &Batch) -> Result<u32> {
        if batch.is_empty() {
            return self.generation();
        }
        self.discard_stale_replies()?;
        let end = batch.end_message();
        let total = batch.bytes().len() + end.len();
        // The whole batch must travel in one datagram: the kernel only commits a batch
        // that begins and ends within one sendmsg.
        self.grow_buffer(
            libc::SO_SNDBUFFORCE,
            libc::SO_SNDBUF,
            total + 64 * 1024,
            true,
        )?;
        let room = batch.acknowledged_messages() * RECEIVE_ROOM_PER_ACK + RECEIVE_BUFFER;
        self.grow_buffer(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, room, false)?;
        self.send_vectored(&[batch.bytes(), &end])?;

        let generation_sequence = self.send_generation_query()?;
        let mut acknowledged = 0;
        let mut refusals: Vec<(u32, ErrorReply)> = Vec::new();
        let generation = loop {
            let replies = self.receive().map_err(|error| match error {
                Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOBUFS) => {
                    Error::Incomplete {
                        request: "a batch".into(),
                        detail: "replies were dropped (ENOBUFS); the batch may or may not \
                                 have been applied"
                            .into(),
                    }
                }
                other => other,
            })?;
            let mut generation = None;
            for reply in replies {
                if reply.sequence == generation_sequence {
                    generation = Some(parse_generation(&reply)?);
                } else if reply.message_type == NLMSG_ERROR
                    && (1..batch.end_sequence()).contains(&reply.sequence)
                {
                    let error = parse_error(&reply, "a batch")?;
                    if error.errno == 0 {
                        acknowledged += 1;
                    } else {
                        refusals.push((reply.sequence, error));
                    }
                }
                // Anything else is not ours to interpret (there should be nothing else).
            }
            if let Some(generation) = generation {
                break generation;
            }
        };

        refusals.sort_by_key(|(sequence, _)| *sequence);
        if let Some((sequence, first)) = refusals.first() {
            let further_refusals = refusals.len() - 1;
            return Err(Error::Refused {
                message: batch.describe(*sequence, first.offset),
                errno: Errno(first.errno.abs()),
                kernel_message: first.message.clone(),
                further_refusals,
            });
        }
        if acknowledged != batch.acknowledged_messages() {
            return Err(Error::Incomplete {
                request: "a batch".into(),
                detail: format!(
                    "{acknowledged} of {} messages acknowledged",
                    batch.acknowledged_messages()
                ),
            });
        }
        Ok(generation)
    }

    /// The current ruleset generation; it changes with every committed batch.
    pub fn generation(&mut self) -> Result<u32> {
        self.discard_stale_replies()?;
        let sequence = self.send_generation_query()?;
        loop {
            for reply in self.receive()? {
                if reply.sequence == sequence {
                    return parse_generation(&reply);
                }
            }
        }
    }

    /// Whether `table` exists.
    pub fn table_exists(&mut self, table: &Table) -> Result<bool> {
        let attrs = [Attr::string(sys::NFTA_TABLE_NAME, &table.name)];
        let request = format!("get table {} {}", table.family.name(), table.name);
        let replies = self.query(sys::NFT_MSG_GETTABLE, table, 0, &attrs, &request)?;
        match replies {
            Ok(_) => Ok(true),
            Err(Errno(libc::ENOENT)) => Ok(false),
            Err(errno) => Err(Error::Request { request, errno }),
        }
    }

    /// Deletes `table`, with everything in it, if it exists; whether it did.
    pub fn delete_table_if_exists(&mut self, table: &Table) -> Result<bool> {
        if !self.table_exists(table)? {
            return Ok(false);
        }
        let mut batch = Batch::new(table.clone());
        batch.delete_table();
        self.commit(&batch)?;
        Ok(true)
    }

    /// The elements of set or map `set` in `table`.
    pub fn list_elements(&mut self, table: &Table, set: &str) -> Result<Vec<ListedElement>> {
        let mut elements = Vec::new();
        self.each_element(table, set, |element| elements.push(element))?;
        Ok(elements)
    }

    /// Calls `each` for every element of set or map `set` in `table`, as the dump arrives,
    /// one datagram at a time: reading a map of 100,000 elements holds one datagram and
    /// what `each` keeps, not the whole dump twice.
    pub fn each_element(
        &mut self,
        table: &Table,
        set: &str,
        mut each: impl FnMut(ListedElement),
    ) -> Result<()> {
        let attrs = [
            Attr::string(sys::NFTA_SET_ELEM_LIST_TABLE, &table.name),
            Attr::string(sys::NFTA_SET_ELEM_LIST_SET, set),
        ];
        let request = format!("list elements of {set}");
        // Parsed by hand: netlink-packet-netfilter 0.4 formats the whole buffer into an
        // error context for every attribute it parses, which is quadratic (12 s for 20k
        // elements).
        self.query_each(
            sys::NFT_MSG_GETSETELEM,
            table,
            NLM_F_DUMP,
            &attrs,
            &request,
            |reply| {
                let body = reply.bytes.get(NFNETLINK_HEADERS..).unwrap_or_default();
                let Some(list) = attr::find(body, sys::NFTA_SET_ELEM_LIST_ELEMENTS) else {
                    return;
                };
                for (kind, element) in attr::parse(list) {
                    if kind == sys::NFTA_LIST_ELEM {
                        each(listed_element(element));
                    }
                }
            },
        )?
        .map_err(|errno| Error::Request {
            request: request.clone(),
            errno,
        })
    }

    /// The names of the chains of `table` that `keep` accepts. The dump is read one
    /// datagram at a time and only kept names are stored, so listing a table of 100,000
    /// chains to find a few leftovers costs little memory.
    pub fn list_chains(
        &mut self,
        table: &Table,
        keep: impl FnMut(&str) -> bool,
    ) -> Result<Vec<String>> {
        let attrs = [Attr::string(sys::NFTA_CHAIN_TABLE, &table.name)];
        self.list_names(
            sys::NFT_MSG_GETCHAIN,
            table,
            &attrs,
            sys::NFTA_CHAIN_NAME,
            "list chains",
            keep,
        )
    }

    /// The number of chains of `table`, counted as the dump arrives (nothing is stored).
    pub fn count_chains(&mut self, table: &Table) -> Result<usize> {
        let mut count = 0;
        self.list_chains(table, |_| {
            count += 1;
            false
        })?;
        Ok(count)
    }

    /// The number of rules of `chain` in `table`, from a dump the kernel filters by chain.
    pub fn count_rules(&mut self, table: &Table, chain: &str) -> Result<usize> {
        let attrs = [
            Attr::string(sys::NFTA_RULE_TABLE, &table.name),
            Attr::string(sys::NFTA_RULE_CHAIN, chain),
        ];
        let request = format!("list rules of {chain}");
        let mut count = 0;
        self.query_each(
            sys::NFT_MSG_GETRULE,
            table,
            NLM_F_DUMP,
            &attrs,
            &request,
            |reply| {
                let body = reply.bytes.get(NFNETLINK_HEADERS..).unwrap_or_default();
                let in_chain = attr::find(body, sys::NFTA_RULE_CHAIN)
                    .is_some_and(|name| nul_terminated(name) == Some(chain));
                if names_table(body, table) && in_chain {
                    count += 1;
                }
            },
        )?
        .map_err(|errno| Error::Request {
            request: request.clone(),
            errno,
        })?;
        Ok(count)
    }

    /// Calls `each` for every rule of `table`, in each chain's order: its chain, its
    /// comment, and whether it picks a key with `numgen … mod N offset K` and looks it up
    /// in a map (a dispatch to N endpoints at keys K…K+N−1). The dump is read one datagram
    /// at a time and nothing is stored here, so that reading the rules of 20,000 chains
    /// costs what `each` keeps.
    pub fn each_rule(&mut self, table: &Table, mut each: impl FnMut(ListedRule<'_>)) -> Result<()> {
        let attrs = [Attr::string(sys::NFTA_RULE_TABLE, &table.name)];
        let request = "list rules";
        self.query_each(
            sys::NFT_MSG_GETRULE,
            table,
            NLM_F_DUMP,
            &attrs,
            request,
            |reply| {
                let body = reply.bytes.get(NFNETLINK_HEADERS..).unwrap_or_default();
                if !names_table(body, table) {
                    return;
                }
                let (Some(chain), Some(expressions)) = (
                    attr::find(body, sys::NFTA_RULE_CHAIN).and_then(nul_terminated),
                    attr::find(body, sys::NFTA_RULE_EXPRESSIONS),
                ) else {
                    return;
                };
                let comment =
                    attr::find(body, sys::NFTA_RULE_USERDATA).and_then(object::comment_of_userdata);
                let mut numgen = None;
                let mut dispatch = None;
                for (kind, expression) in attr::parse(expressions) {
                    if kind != sys::NFTA_LIST_ELEM {
                        continue;
                    }
                    let name = attr::find(expression, sys::NFTA_EXPR_NAME).and_then(nul_terminated);
                    let data = attr::find(expression, sys::NFTA_EXPR_DATA).unwrap_or_default();
                    match name {
                        Some("numgen") => {
                            let number =
                                |kind| attr::find(data, kind).filter(|v| v.len() >= 4).map(be_u32);
                            numgen = number(sys::NFTA_NG_MODULUS)
                                .map(|modulus| (modulus, number(sys::NFTA_NG_OFFSET).unwrap_or(0)));
                        }
                        Some("lookup") => {
                            let map =
                                attr::find(data, sys::NFTA_LOOKUP_SET).and_then(nul_terminated);
                            if let (Some((modulus, offset)), Some(map), None) =
                                (numgen, map, &dispatch)
                            {
                                dispatch = Some(Dispatch {
                                    map,
                                    offset,
                                    modulus,
                                });
                            }
                        }
                        _ => {}
                    }
                }
                each(ListedRule {
                    chain,
                    comment,
                    dispatch,
                });
            },
        )?
        .map_err(|errno| Error::Request {
            request: request.into(),
            errno,
        })
    }

    /// The names of the named sets and maps of `table` that `keep` accepts; anonymous
    /// sets (`__set0`, `__map3`) are listed too, as the kernel names them.
    pub fn list_sets(
        &mut self,
        table: &Table,
        keep: impl FnMut(&str) -> bool,
    ) -> Result<Vec<String>> {
        let attrs = [Attr::string(sys::NFTA_SET_TABLE, &table.name)];
        self.list_names(
            sys::NFT_MSG_GETSET,
            table,
            &attrs,
            sys::NFTA_SET_NAME,
            "list sets",
            keep,
        )
    }

    fn list_names(
        &mut self,
        message: u8,
        table: &Table,
        attrs: &[Attr],
        name_attr: u16,
        request: &str,
        mut keep: impl FnMut(&str) -> bool,
    ) -> Result<Vec<String>> {
        let mut names = Vec::new();
        let outcome = self.query_each(message, table, NLM_F_DUMP, attrs, request, |reply| {
            let body = reply.bytes.get(NFNETLINK_HEADERS..).unwrap_or_default();
            // The kernel filters a chain dump by family only: every other table's chains
            // of the family come too (firewalld's `inet firewalld`, say).
            if !names_table(body, table) {
                return;
            }
            if let Some(name) = attr::find(body, name_attr) {
                let name = name.split(|&b| b == 0).next().unwrap_or_default();
                let name = String::from_utf8_lossy(name);
                if keep(&name) {
                    names.push(name.into_owned());
                }
            }
        })?;
        outcome.map_err(|errno| Error::Request {
            request: request.to_string(),
            errno,
        })?;
        Ok(names)
    }

    /// Sends one request and gathers its replies until its acknowledgement or the end of
    /// the dump: the data messages, or the errno the kernel answered with.
    fn query(
        &mut self,
        message: u8,
        table: &Table,
        extra_flags: u16,
        attrs: &[Attr],
        request: &str,
    ) -> Result<Result<Vec<Reply>, Errno>> {
        let mut messages = Vec::new();
        let outcome = self.query_each(message, table, extra_flags, attrs, request, |reply| {
            messages.push(reply);
        })?;
        Ok(outcome.map(|()| messages))
    }

    /// Like [`Socket::query`], handing each data message to `each` as it arrives.
    fn query_each(
        &mut self,
        message: u8,
        table: &Table,
        extra_flags: u16,
        attrs: &[Attr],
        request: &str,
        each: impl FnMut(Reply),
    ) -> Result<Result<(), Errno>> {
        let message = Request {
            message_type: nftables_type(message),
            family: table.family.nfproto(),
            version: sys::NFNETLINK_V0,
            res_id: 0,
            attrs,
        };
        self.exchange(message, extra_flags, request, each)
    }

    /// Every UDP conntrack entry of `family`, handed to `each` as the dump arrives.
    pub fn udp_conntrack_entries(
        &mut self,
        family: Family,
        mut each: impl FnMut(UdpEntry),
    ) -> Result<()> {
        let request = "dump the conntrack table";
        let attrs = UdpEntry::dump_attrs();
        let message = Request {
            message_type: ctnetlink_type(sys::IPCTNL_MSG_CT_GET),
            family: match family {
                Family::V4 => libc::AF_INET as u8,
                Family::V6 => libc::AF_INET6 as u8,
            },
            version: sys::NFNETLINK_V0,
            res_id: 0,
            attrs: &attrs,
        };
        self.exchange(message, NLM_F_DUMP, request, |reply| {
            let body = reply.bytes.get(NFNETLINK_HEADERS..).unwrap_or_default();
            if let Some(entry) = UdpEntry::parse(body) {
                each(entry);
            }
        })?
        .map_err(|errno| Error::Request {
            request: request.into(),
            errno,
        })
    }

    /// Deletes one conntrack entry by its exact tuple: `false` when it was gone already
    /// (it timed out, or another program deleted it).
    pub fn delete_conntrack_entry(&mut self, entry: &UdpEntry) -> Result<bool> {
        let attrs = entry.delete_attrs();
        let message = Request {
            message_type: ctnetlink_type(sys::IPCTNL_MSG_CT_DELETE),
            family: entry.family_number(),
            version: sys::NFNETLINK_V0,
            res_id: 0,
            attrs: &attrs,
        };
        let request = format!("delete the conntrack entry of the {entry}");
        match self.exchange(message, 0, &request, |_| {})? {
            Ok(()) => Ok(true),
            Err(Errno(errno)) if errno == libc::ENOENT => Ok(false),
            Err(errno) => Err(Error::Request { request, errno }),
        }
    }

    /// Sends one request and gathers its replies until its acknowledgement or the end of
    /// the dump.
    fn exchange(
        &mut self,
        message: Request<'_>,
        extra_flags: u16,
        request: &str,
        mut each: impl FnMut(Reply),
    ) -> Result<Result<(), Errno>> {
        self.discard_stale_replies()?;
        let sequence = self.allocate_query_sequence();
        let mut bytes = Vec::new();
        encode_message(
            &mut bytes,
            sequence,
            NLM_F_REQUEST | netlink_packet_core::NLM_F_ACK | extra_flags,
            message,
        );
        self.send_vectored(&[&bytes])?;
        let is_dump = extra_flags & NLM_F_DUMP == NLM_F_DUMP;
        loop {
            for reply in self.receive()? {
                if reply.sequence != sequence {
                    continue;
                }
                match reply.message_type {
                    NLMSG_ERROR => {
                        let error = parse_error(&reply, request)?;
                        if error.errno != 0 {
                            return Ok(Err(Errno(error.errno.abs())));
                        }
                        if !is_dump {
                            return Ok(Ok(()));
                        }
                    }
                    NLMSG_DONE => return Ok(Ok(())),
                    _ => each(reply),
                }
            }
        }
    }

    fn allocate_query_sequence(&mut self) -> u32 {
        let sequence = self.next_query_sequence;
        self.next_query_sequence = self
            .next_query_sequence
            .checked_add(1)
            .unwrap_or(FIRST_QUERY_SEQUENCE);
        sequence
    }

    fn send_generation_query(&mut self) -> Result<u32> {
        let sequence = self.allocate_query_sequence();
        let mut bytes = Vec::new();
        encode_message(
            &mut bytes,
            sequence,
            NLM_F_REQUEST,
            Request {
                message_type: nftables_type(sys::NFT_MSG_GETGEN),
                family: 0,
                version: sys::NFNETLINK_V0,
                res_id: 0,
                attrs: &[],
            },
        );
        self.send_vectored(&[&bytes])?;
        Ok(sequence)
    }

    /// Sends `parts` as one datagram.
    fn send_vectored(&self, parts: &[&[u8]]) -> Result<()> {
        let iovecs: Vec<libc::iovec> = parts
            .iter()
            .map(|part| libc::iovec {
                iov_base: part.as_ptr().cast_mut().cast(),
                iov_len: part.len(),
            })
            .collect();
        // SAFETY: an all-zero msghdr is valid (no address, no control data).
        let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
        header.msg_iov = iovecs.as_ptr().cast_mut();
        // `size_t` on glibc, `int` on musl; a handful of parts fits either.
        header.msg_iovlen = iovecs.len() as _;
        let expected: usize = parts.iter().map(|part| part.len()).sum();
        // SAFETY: the iovecs point into `parts`, which outlive the call, and the kernel
        // only reads them.
        let sent = unsafe { libc::sendmsg(self.socket.as_raw_fd(), &header, 0) };
        if sent < 0 {
            return Err(Error::io("sending", io::Error::last_os_error()));
        }
        if sent as usize != expected {
            return Err(Error::io(
                "sending",
                io::Error::other(format!("sent {sent} of {expected} bytes")),
            ));
        }
        Ok(())
    }

    /// Reads one datagram and splits it into messages.
    fn receive(&mut self) -> Result<Vec<Reply>> {
        self.receive_with_flags(0)
    }

    fn receive_with_flags(&mut self, flags: libc::c_int) -> Result<Vec<Reply>> {
        self.receive_buffer.clear();
        let capacity = self.receive_buffer.capacity();
        let received = self
            .socket
            .recv(&mut self.receive_buffer, flags | libc::MSG_TRUNC)
            .map_err(|e| Error::io("receiving", e))?;
        if received > capacity {
            return Err(Error::Malformed {
                request: "a reply".into(),
                detail: format!("a {received}-byte datagram exceeds the {capacity}-byte buffer"),
            });
        }
        split_messages(&self.receive_buffer)
    }

    /// Drops replies a previous, interrupted exchange left in the queue, so their
    /// sequence numbers cannot be mistaken for this exchange's.
    fn discard_stale_replies(&mut self) -> Result<()> {
        loop {
            match self.receive_with_flags(libc::MSG_DONTWAIT) {
                Ok(_) => continue,
                Err(Error::Io { source, .. })
                    if source.kind() == io::ErrorKind::WouldBlock
                        || source.raw_os_error() == Some(libc::ENOBUFS) =>
                {
                    return Ok(());
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Raises a socket buffer to at least `size`, past `net.core.[rw]mem_max` when we
    /// have CAP_NET_ADMIN (which programming nf_tables needs anyway).
    fn grow_buffer(
        &mut self,
        forced: libc::c_int,
        plain: libc::c_int,
        size: usize,
        send: bool,
    ) -> Result<()> {
        let current = if send {
            self.send_buffer_size
        } else {
            self.receive_buffer_size
        };
        if size <= current {
            return Ok(());
        }
        // The kernel doubles the value it is given to account for its bookkeeping.
        let value = libc::c_int::try_from(size.div_ceil(2)).unwrap_or(libc::c_int::MAX);
        let fd = self.socket.as_raw_fd();
        if setsockopt_int(fd, forced, value).is_err() {
            setsockopt_int(fd, plain, value)
                .map_err(|e| Error::io("sizing the socket buffer", e))?;
        }
        if send {
            self.send_buffer_size = size;
        } else {
            self.receive_buffer_size = size;
        }
        Ok(())
    }
}

fn setsockopt_int(fd: libc::c_int, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and its size is passed along.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set_receive_timeout(socket: &netlink_sys::Socket, timeout: Duration) -> Result<()> {
    let value = libc::timeval {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: 0,
    };
    // SAFETY: `value` is a live timeval and its size is passed along.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&value as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::io(
            "setting the receive timeout",
            io::Error::last_os_error(),
        ))
    }
}

fn split_messages(bytes: &[u8]) -> Result<Vec<Reply>> {
    let mut replies = Vec::new();
    let mut offset = 0;
    while offset < bytes.len() {
        let buffer =
            NetlinkBuffer::new_checked(&bytes[offset..]).map_err(|e| Error::Malformed {
                request: "a reply".into(),
                detail: e.to_string(),
            })?;
        let len = buffer.length() as usize;
        replies.push(Reply {
            sequence: buffer.sequence_number(),
            message_type: buffer.message_type(),
            flags: buffer.flags(),
            bytes: bytes[offset..offset + len].to_vec(),
        });
        offset += len.div_ceil(4) * 4;
    }
    Ok(replies)
}

/// Parses an `NLMSG_ERROR`: errno, then the echoed request (just its header when
/// `NLM_F_CAPPED`), then extended-ack attributes when `NLM_F_ACK_TLVS`.
fn parse_error(reply: &Reply, request: &str) -> Result<ErrorReply> {
    let malformed = |detail: &str| Error::Malformed {
        request: request.to_string(),
        detail: detail.to_string(),
    };
    let payload = reply
        .bytes
        .get(16..)
        .ok_or_else(|| malformed("short error message"))?;
    let errno = payload
        .get(0..4)
        .and_then(|bytes| bytes.try_into().ok())
        .map(i32::from_ne_bytes)
        .ok_or_else(|| malformed("error message without errno"))?;
    let echoed_len = payload
        .get(4..8)
        .and_then(|bytes| bytes.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or_else(|| malformed("error message without the request header"))?
        as usize;
    let mut error = ErrorReply {
        errno,
        message: None,
        offset: None,
    };
    if reply.flags & NLM_F_ACK_TLVS == 0 {
        return Ok(error);
    }
    let echoed = if reply.flags & NLM_F_CAPPED != 0 {
        16
    } else {
        echoed_len
    };
    let mut position = 4 + echoed.div_ceil(4) * 4;
    while position + 4 <= payload.len() {
        let len = usize::from(u16::from_ne_bytes([
            payload[position],
            payload[position + 1],
        ]));
        let kind = u16::from_ne_bytes([payload[position + 2], payload[position + 3]]);
        let Some(value) = payload.get(position + 4..position + len.max(4)) else {
            break;
        };
        match kind {
            NLMSGERR_ATTR_MSG => {
                let text = value.split(|&b| b == 0).next().unwrap_or_default();
                error.message = Some(String::from_utf8_lossy(text).into_owned());
            }
            NLMSGERR_ATTR_OFFS => {
                error.offset = value.try_into().ok().map(u32::from_ne_bytes);
            }
            _ => {}
        }
        position += len.max(4).div_ceil(4) * 4;
    }
    Ok(error)
}

/// Whether a chain, set or rule message (their table attribute is the first, 1) belongs
/// to `table`.
/// A rule as [`Socket::each_rule`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedRule<'r> {
    pub chain: &'r str,
    pub comment: Option<&'r str>,
    pub dispatch: Option<Dispatch<'r>>,
}

/// The endpoint pick of a dispatch rule: `numgen random mod N offset K` looked up in `map`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatch<'r> {
    pub map: &'r str,
    pub offset: u32,
    pub modulus: u32,
}

/// A NUL-terminated string attribute.
fn nul_terminated(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes.split(|&b| b == 0).next()?).ok()
}

fn names_table(body: &[u8], table: &Table) -> bool {
    attr::find(body, sys::NFTA_CHAIN_TABLE)
        .is_some_and(|name| nul_terminated(name) == Some(table.name.as_str()))
}

fn parse_generation(reply: &Reply) -> Result<u32> {
    const REQUEST: &str = "get generation";
    if reply.message_type == NLMSG_ERROR {
        let error = parse_error(reply, REQUEST)?;
        return Err(Error::Request {
            request: REQUEST.into(),
            errno: Errno(error.errno.abs()),
        });
    }
    let message = NetlinkMessage::<NetfilterMessage>::deserialize(&reply.bytes).map_err(|e| {
        Error::Malformed {
            request: REQUEST.into(),
            detail: e.to_string(),
        }
    })?;
    if let NetlinkPayload::InnerMessage(NetfilterMessage {
        inner: NetfilterMessageInner::NfTables(NfTablesMessage::NewGen(generation)),
        ..
    }) = message.payload
    {
        for attribute in generation.attributes {
            if let GenAttribute::Id(id) = attribute {
                return Ok(id);
            }
        }
    }
    Err(Error::Malformed {
        request: REQUEST.into(),
        detail: "no NFTA_GEN_ID in the reply".into(),
    })
}

fn listed_element(attributes: &[u8]) -> ListedElement {
    let value_of = |nest: &[u8]| attr::find(nest, sys::NFTA_DATA_VALUE).map(<[u8]>::to_vec);
    let mut element = ListedElement {
        key: Vec::new(),
        key_end: None,
        data: None,
        interval_end: false,
        expires_in: None,
        packets: None,
    };
    for (kind, value) in attr::parse(attributes) {
        match kind {
            sys::NFTA_SET_ELEM_KEY => element.key = value_of(value).unwrap_or_default(),
            sys::NFTA_SET_ELEM_KEY_END => element.key_end = value_of(value),
            sys::NFTA_SET_ELEM_DATA => {
                element.data = match attr::find(value, sys::NFTA_DATA_VERDICT) {
                    Some(verdict) => listed_verdict(verdict).map(ListedData::Verdict),
                    None => value_of(value).map(ListedData::Value),
                };
            }
            sys::NFTA_SET_ELEM_FLAGS => {
                element.interval_end = be_u32(value) & sys::NFT_SET_ELEM_INTERVAL_END != 0;
            }
            sys::NFTA_SET_ELEM_EXPR => element.packets = counted_packets(value),
            sys::NFTA_SET_ELEM_EXPRESSIONS => {
                element.packets = attr::parse(value)
                    .into_iter()
                    .filter(|(kind, _)| *kind == sys::NFTA_LIST_ELEM)
                    .find_map(|(_, expression)| counted_packets(expression));
            }
            sys::NFTA_SET_ELEM_EXPIRATION => {
                element.expires_in = value
                    .try_into()
                    .ok()
                    .map(|bytes| Duration::from_millis(u64::from_be_bytes(bytes)));
            }
            _ => {}
        }
    }
    element
}

/// The packets of a `counter` expression's attributes; `None` for another expression.
fn counted_packets(expression: &[u8]) -> Option<u64> {
    let name = attr::find(expression, sys::NFTA_EXPR_NAME)?;
    if name.strip_suffix(b"\0").unwrap_or(name) != b"counter" {
        return None;
    }
    let data = attr::find(expression, sys::NFTA_EXPR_DATA)?;
    let packets = attr::find(data, sys::NFTA_COUNTER_PACKETS)?;
    packets.try_into().ok().map(u64::from_be_bytes)
}

fn be_u32(value: &[u8]) -> u32 {
    value.try_into().map(u32::from_be_bytes).unwrap_or_default()
}

fn listed_verdict(attributes: &[u8]) -> Option<Verdict> {
    let code = be_u32(attr::find(attributes, sys::NFTA_VERDICT_CODE)?) as i32;
    let chain = || {
        attr::find(attributes, sys::NFTA_VERDICT_CHAIN).map(|name| {
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(name).into_owned()
        })
    };
    Some(match code {
        sys::NF_ACCEPT => Verdict::Accept,
        sys::NF_DROP => Verdict::Drop,
        sys::NFT_CONTINUE => Verdict::Continue,
        sys::NFT_BREAK => Verdict::Break,
        sys::NFT_RETURN => Verdict::Return,
        sys::NFT_JUMP => Verdict::Jump(chain()?),
        sys::NFT_GOTO => Verdict::Goto(chain()?),
        _ => return None,
    })
}
