//! Named and anonymous sets and maps, and their elements.
//!
//! A map is a set with data: a verdict (`vmap`) or values. Keys may be concatenations;
//! the kernel then needs to know the field lengths (`NFTA_SET_DESC_CONCAT`), and an
//! interval set of concatenations (the `pipapo` backend) takes each range as one element
//! with `KEY_END`, whereas a one-field interval set (`rbtree`) takes the start and the
//! exclusive end as two elements, the second flagged `INTERVAL_END`. [`Element`] hides
//! that difference.

use std::fmt;
use std::time::Duration;

use super::attr::Attr;
use super::sys;
use super::types::{DataType, Fields, Tuple, Verdict, millis};

/// How a rule or an element message names a set: by name, plus the batch-local id for a
/// set created in the same batch (anonymous sets get their name from the kernel, so the
/// id is the only way to reach them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetRef {
    name: String,
    id: Option<u32>,
    /// Element messages name the set by id alone (see [`SetRef::created`]).
    id_only: bool,
}

impl SetRef {
    pub fn named(name: impl Into<String>) -> SetRef {
        SetRef {
            name: name.into(),
            id: None,
            id_only: false,
        }
    }

    pub(crate) fn with_id(name: impl Into<String>, id: u32) -> SetRef {
        SetRef {
            name: name.into(),
            id: Some(id),
            id_only: false,
        }
    }

    /// For a set this batch really creates (it did not exist before): element messages
    /// then carry only its id. The kernel looks a name up first, by walking the table's
    /// list of sets, so with thousands of per-service maps a name costs a walk per
    /// message, while an id is found among the batch's own transactions. A set that
    /// already existed has no transaction in the batch, so it must keep its name.
    pub fn created(self) -> SetRef {
        SetRef {
            id_only: self.id.is_some(),
            ..self
        }
    }

    pub(crate) fn id_only(&self) -> bool {
        self.id_only
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> Option<u32> {
        self.id
    }
}

/// What a map maps to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SetData {
    /// A verdict map (`vmap`): `accept`, `drop`, `jump`/`goto` chain.
    Verdict,
    /// A data map, e.g. `ipv4_addr . inet_service` for a DNAT target.
    Value(Fields),
}

/// The set flags that express intent; `map` and `concat` follow from the types.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SetFlags {
    /// Elements can only be given when the set is created.
    pub constant: bool,
    /// Elements may be ranges.
    pub interval: bool,
    /// Elements may expire (with the set's default timeout or their own).
    pub timeout: bool,
    /// The packet path may add elements (`update @set { … }`); nft calls it `dynamic`.
    pub dynamic: bool,
}

/// A named set or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Set {
    pub name: String,
    pub key: Fields,
    pub data: Option<SetData>,
    pub flags: SetFlags,
    /// Default element timeout (needs `flags.timeout`).
    pub timeout: Option<Duration>,
    /// Maximum number of elements (`size`); dynamic sets want one.
    pub size: Option<u32>,
    /// Every element counts the packets a lookup finds it for (nft's `counter` in a set).
    pub counter: bool,
}

impl Set {
    /// A set of `key`s.
    pub fn new(name: impl Into<String>, key: impl Into<Fields>) -> Set {
        Set {
            name: name.into(),
            key: key.into(),
            data: None,
            flags: SetFlags::default(),
            timeout: None,
            size: None,
            counter: false,
        }
    }

    /// A verdict map from `key`.
    pub fn verdict_map(name: impl Into<String>, key: impl Into<Fields>) -> Set {
        Set {
            data: Some(SetData::Verdict),
            ..Set::new(name, key)
        }
    }

    /// A data map from `key` to `data`.
    pub fn data_map(
        name: impl Into<String>,
        key: impl Into<Fields>,
        data: impl Into<Fields>,
    ) -> Set {
        Set {
            data: Some(SetData::Value(data.into())),
            ..Set::new(name, key)
        }
    }

    pub fn with_counter(mut self) -> Set {
        self.counter = true;
        self
    }

    pub fn with_flags(mut self, flags: SetFlags) -> Set {
        self.flags = flags;
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Set {
        self.flags.timeout = true;
        self.timeout = Some(timeout);
        self
    }

    pub fn with_size(mut self, size: u32) -> Set {
        self.size = Some(size);
        self
    }

    /// "set" or "map", for messages.
    pub fn noun(&self) -> &'static str {
        if self.data.is_some() { "map" } else { "set" }
    }

    /// `NFT_MSG_NEWSET` attributes; `anonymous` sets are constant and named by the kernel
    /// from the `__set%d`/`__map%d` template in `name`.
    pub(crate) fn attrs(&self, table: &str, id: u32, anonymous: bool) -> Vec<Attr> {
        let mut flags = 0;
        let set_flags = [
            (anonymous, sys::NFT_SET_ANONYMOUS),
            (self.flags.constant || anonymous, sys::NFT_SET_CONSTANT),
            (self.flags.interval, sys::NFT_SET_INTERVAL),
            (self.data.is_some(), sys::NFT_SET_MAP),
            (self.flags.timeout, sys::NFT_SET_TIMEOUT),
            (self.flags.dynamic, sys::NFT_SET_EVAL),
            // Only the pipapo backend (interval + concatenation) needs to be told.
            (
                self.flags.interval && self.key.is_concat(),
                sys::NFT_SET_CONCAT,
            ),
        ];
        for (set, bit) in set_flags {
            if set {
                flags |= bit;
            }
        }
        let mut attrs = vec![
            Attr::string(sys::NFTA_SET_TABLE, table),
            Attr::string(sys::NFTA_SET_NAME, &self.name),
            Attr::u32(sys::NFTA_SET_FLAGS, flags),
            Attr::u32(sys::NFTA_SET_KEY_TYPE, self.key.nft_type()),
            Attr::u32(sys::NFTA_SET_KEY_LEN, len_u32(self.key.byte_len())),
        ];
        match &self.data {
            None => {}
            Some(SetData::Verdict) => {
                // The kernel sizes verdict data itself and wants no length.
                attrs.push(Attr::u32(sys::NFTA_SET_DATA_TYPE, sys::NFT_DATA_VERDICT));
            }
            Some(SetData::Value(data)) => {
                attrs.push(Attr::u32(sys::NFTA_SET_DATA_TYPE, data.nft_type()));
                attrs.push(Attr::u32(sys::NFTA_SET_DATA_LEN, len_u32(data.byte_len())));
            }
        }
        attrs.push(Attr::u32(sys::NFTA_SET_ID, id));
        if let Some(timeout) = self.timeout {
            attrs.push(Attr::u64(sys::NFTA_SET_TIMEOUT, millis(timeout)));
        }
        let mut desc = Vec::new();
        if let Some(size) = self.size {
            desc.push(Attr::u32(sys::NFTA_SET_DESC_SIZE, size));
        }
        // The kernel takes field lengths only together with NFT_SET_CONCAT (and refuses
        // them otherwise); like nft, we send both only for interval concatenations.
        if self.flags.interval && self.key.is_concat() {
            let fields = self
                .key
                .fields()
                .iter()
                .map(|field| {
                    Attr::nested(
                        sys::NFTA_LIST_ELEM,
                        vec![Attr::u32(
                            sys::NFTA_SET_FIELD_LEN,
                            len_u32(field.byte_len()),
                        )],
                    )
                })
                .collect();
            desc.push(Attr::nested(sys::NFTA_SET_DESC_CONCAT, fields));
        }
        if !desc.is_empty() {
            attrs.push(Attr::nested(sys::NFTA_SET_DESC, desc));
        }
        if let Some(userdata) = self.userdata() {
            attrs.push(Attr::bytes(sys::NFTA_SET_USERDATA, userdata));
        }
        if self.counter {
            // The kernel gives each element added without expressions of its own a copy.
            attrs.push(Attr::nested(
                sys::NFTA_SET_EXPR,
                vec![
                    Attr::string(sys::NFTA_EXPR_NAME, "counter"),
                    Attr::nested(sys::NFTA_EXPR_DATA, Vec::new()),
                ],
            ));
        }
        attrs
    }

    /// nft's annotations: the kernel ignores them, but `nft list` reads host-order keys
    /// and data (marks, `numgen` results) as big-endian without them. The format is
    /// libnftnl's udata: type byte, length byte, value.
    fn userdata(&self) -> Option<Vec<u8>> {
        if let Some(userdata) = self
            .data
            .as_ref()
            .and_then(|data| endpoint_map_userdata(&self.key, data))
        {
            return Some(userdata);
        }
        let mut userdata = Vec::new();
        let mut annotate = |kind: u8| {
            userdata.extend_from_slice(&[kind, 4]);
            userdata.extend_from_slice(&sys::NFT_BYTEORDER_HOST_ENDIAN.to_ne_bytes());
        };
        if self.key.is_host_order() {
            annotate(sys::NFTNL_UDATA_SET_KEYBYTEORDER);
        }
        if let Some(SetData::Value(data)) = &self.data
            && data.is_host_order()
        {
            annotate(sys::NFTNL_UDATA_SET_DATABYTEORDER);
        }
        (!userdata.is_empty()).then_some(userdata)
    }
}

/// The annotation nft 1.0.6 writes for `typeof numgen random mod 2 : ip daddr . th
/// dport` (or `ip6 daddr`), and for `typeof ip daddr . meta l4proto . th dport . numgen
/// random mod 2 : ip daddr . th dport`. An `integer` key has no type name `nft list`
/// could print, so it prints the map's type from this; with it, a map we program lists
/// exactly like one nft loaded from `nodus proxy render`.
fn endpoint_map_userdata(key: &Fields, data: &SetData) -> Option<Vec<u8>> {
    let SetData::Value(fields) = data else {
        return None;
    };
    let (proto, field) = match fields.fields() {
        [DataType::Ipv4Addr, DataType::InetService] => (sys::NFT_PROTO_IP, sys::NFT_IPHDR_DADDR),
        [DataType::Ipv6Addr, DataType::InetService] => (sys::NFT_PROTO_IP6, sys::NFT_IP6HDR_DADDR),
        _ => return None,
    };
    let typeof_expr = |kind: u32, attrs: Vec<u8>| {
        [
            udata_u32(sys::NFTNL_UDATA_SET_TYPEOF_EXPR, kind),
            udata(sys::NFTNL_UDATA_SET_TYPEOF_DATA, &attrs),
        ]
        .concat()
    };
    let payload = |proto: u32, field: u32| {
        typeof_expr(
            sys::NFT_EXPR_TYPE_PAYLOAD,
            [udata_u32(0, proto), udata_u32(1, field)].concat(),
        )
    };
    let concat = |items: &[Vec<u8>]| {
        let items: Vec<u8> = (0u8..)
            .zip(items)
            .flat_map(|(index, item)| udata(index, item))
            .collect();
        typeof_expr(sys::NFT_EXPR_TYPE_CONCAT, items)
    };
    // numgen: type random, modulus 2, offset 0.
    let numgen = typeof_expr(
        sys::NFT_EXPR_TYPE_NUMGEN,
        [udata_u32(0, 1), udata_u32(1, 2), udata_u32(2, 0)].concat(),
    );
    let address = payload(proto, field);
    let port = payload(sys::NFT_PROTO_TH, sys::NFT_THDR_DPORT);
    let (key_order, key_typeof) = match key.fields() {
        [DataType::Integer32] => (sys::NFT_BYTEORDER_HOST_ENDIAN, numgen),
        [
            address_type,
            DataType::InetProto,
            DataType::InetService,
            DataType::Integer32,
        ] if *address_type == fields.fields()[0] => {
            let l4proto = typeof_expr(sys::NFT_EXPR_TYPE_META, udata_u32(0, sys::NFT_META_L4PROTO));
            // A concatenation's byte order is its fields' own.
            (0, concat(&[address.clone(), l4proto, port.clone(), numgen]))
        }
        _ => return None,
    };
    Some(
        [
            udata_u32(sys::NFTNL_UDATA_SET_KEYBYTEORDER, key_order),
            udata_u32(sys::NFTNL_UDATA_SET_DATABYTEORDER, 0),
            udata(sys::NFTNL_UDATA_SET_KEY_TYPEOF, &key_typeof),
            udata(sys::NFTNL_UDATA_SET_DATA_TYPEOF, &concat(&[address, port])),
            udata_u32(sys::NFTNL_UDATA_SET_DATA_INTERVAL, 0),
        ]
        .concat(),
    )
}

/// One libnftnl udata item: type byte, length byte, value.
fn udata(kind: u8, value: &[u8]) -> Vec<u8> {
    let mut item = vec![kind, u8::try_from(value.len()).unwrap_or(u8::MAX)];
    item.extend_from_slice(value);
    item
}

fn udata_u32(kind: u8, value: u32) -> Vec<u8> {
    udata(kind, &value.to_ne_bytes())
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// An anonymous constant set or map, created with its elements and bound to the rule
/// that uses it (`numgen random mod 2 vmap { 0 : goto a, 1 : goto b }`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AnonymousSet {
    pub key: Fields,
    pub data: Option<SetData>,
    pub interval: bool,
    pub elements: Vec<Element>,
}

impl AnonymousSet {
    /// A verdict map keyed by `numgen` results 0..N, one verdict per result.
    pub fn numgen_vmap(verdicts: impl IntoIterator<Item = Verdict>) -> AnonymousSet {
        let elements = verdicts
            .into_iter()
            .zip(0u32..)
            .map(|(verdict, index)| {
                Element::new(super::types::Value::Integer32(index)).with_verdict(verdict)
            })
            .collect();
        AnonymousSet {
            key: DataType::Integer32.into(),
            data: Some(SetData::Verdict),
            interval: false,
            elements,
        }
    }

    pub(crate) fn as_set(&self) -> Set {
        let name = if self.data.is_some() {
            "__map%d"
        } else {
            "__set%d"
        };
        Set {
            flags: SetFlags {
                interval: self.interval,
                ..SetFlags::default()
            },
            data: self.data.clone(),
            ..Set::new(name, self.key.clone())
        }
    }
}

/// What an element maps to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ElementData {
    Verdict(Verdict),
    Value(Tuple),
}

impl fmt::Display for ElementData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElementData::Verdict(verdict) => write!(f, "{verdict}"),
            ElementData::Value(value) => write!(f, "{value}"),
        }
    }
}

/// One set or map element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Element {
    pub key: Tuple,
    /// The inclusive end of a range, in interval sets.
    pub key_end: Option<Tuple>,
    pub data: Option<ElementData>,
    /// Overrides the set's default timeout.
    pub timeout: Option<Duration>,
}

impl Element {
    pub fn new(key: impl Into<Tuple>) -> Element {
        Element {
            key: key.into(),
            key_end: None,
            data: None,
            timeout: None,
        }
    }

    /// The range `key ..= end`.
    pub fn range(key: impl Into<Tuple>, end: impl Into<Tuple>) -> Element {
        Element {
            key_end: Some(end.into()),
            ..Element::new(key)
        }
    }

    pub fn with_verdict(mut self, verdict: Verdict) -> Element {
        self.data = Some(ElementData::Verdict(verdict));
        self
    }

    pub fn with_value(mut self, value: impl Into<Tuple>) -> Element {
        self.data = Some(ElementData::Value(value.into()));
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Element {
        self.timeout = Some(timeout);
        self
    }

    /// The `NFTA_LIST_ELEM` nests for this element inside `NFTA_SET_ELEM_LIST_ELEMENTS`:
    /// one, or two for a one-field range (start, then exclusive end flagged as such).
    pub(crate) fn attrs(&self) -> Vec<Attr> {
        let mut start = vec![self.key.data_attr(sys::NFTA_SET_ELEM_KEY)];
        let mut end_marker = None;
        if let Some(key_end) = &self.key_end {
            if self.key.0.len() > 1 {
                start.push(key_end.data_attr(sys::NFTA_SET_ELEM_KEY_END));
            } else if let Some(after) = key_end.0.first().and_then(|value| value.successor()) {
                // A range up to the top of the type needs no end marker.
                end_marker = Some(Attr::nested(
                    sys::NFTA_LIST_ELEM,
                    vec![
                        Tuple::from(after).data_attr(sys::NFTA_SET_ELEM_KEY),
                        Attr::u32(sys::NFTA_SET_ELEM_FLAGS, sys::NFT_SET_ELEM_INTERVAL_END),
                    ],
                ));
            }
        }
        match &self.data {
            None => {}
            Some(ElementData::Verdict(verdict)) => {
                start.push(verdict.data_attr(sys::NFTA_SET_ELEM_DATA));
            }
            Some(ElementData::Value(value)) => {
                start.push(value.data_attr(sys::NFTA_SET_ELEM_DATA));
            }
        }
        if let Some(timeout) = self.timeout {
            start.push(Attr::u64(sys::NFTA_SET_ELEM_TIMEOUT, millis(timeout)));
        }
        let mut attrs = vec![Attr::nested(sys::NFTA_LIST_ELEM, start)];
        attrs.extend(end_marker);
        attrs
    }

    /// Only the key, for deletions.
    pub(crate) fn key_attrs(&self) -> Vec<Attr> {
        Element {
            key: self.key.clone(),
            key_end: self.key_end.clone(),
            data: None,
            timeout: None,
        }
        .attrs()
    }
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)?;
        if let Some(end) = &self.key_end {
            write!(f, "-{end}")?;
        }
        if let Some(timeout) = self.timeout {
            write!(f, " timeout {}s", timeout.as_secs())?;
        }
        if let Some(data) = &self.data {
            write!(f, " : {data}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::attr::encode;
    use crate::nft::types::Value;
    use std::net::Ipv4Addr;

    fn service_ips() -> Set {
        Set::verdict_map(
            "service-ips",
            Fields::new([
                DataType::Ipv4Addr,
                DataType::InetProto,
                DataType::InetService,
            ]),
        )
    }

    #[test]
    fn verdict_map_with_concatenated_key() {
        // nft --debug=netlink: `service-ips t 8` (flags NFT_SET_MAP), key type 29453,
        // key length 12, data type NFT_DATA_VERDICT; no field lengths (not an interval).
        let attrs = service_ips().attrs("t", 1, false);
        assert!(!encode(&attrs).windows(4).any(|w| w == [44, 0, 9, 0x80]));
        // As an interval set it is a pipapo set: NFT_SET_CONCAT and lengths 4, 1, 2.
        let interval = service_ips().with_flags(SetFlags {
            interval: true,
            ..SetFlags::default()
        });
        let bytes = encode(&interval.attrs("t", 1, false));
        let expected_tail = [
            vec![44, 0, 9, 0x80], // NFTA_SET_DESC
            vec![40, 0, 2, 0x80], // NFTA_SET_DESC_CONCAT
            vec![12, 0, 1, 0x80, 8, 0, 1, 0, 0, 0, 0, 4],
            vec![12, 0, 1, 0x80, 8, 0, 1, 0, 0, 0, 0, 1],
            vec![12, 0, 1, 0x80, 8, 0, 1, 0, 0, 0, 0, 2],
        ]
        .concat();
        assert!(bytes.ends_with(&expected_tail), "{bytes:?}");
        assert!(attrs.contains(&Attr::u32(sys::NFTA_SET_FLAGS, sys::NFT_SET_MAP)));
        assert!(
            interval
                .attrs("t", 1, false)
                .contains(&Attr::u32(sys::NFTA_SET_FLAGS, 0x8c))
        );
        assert!(attrs.contains(&Attr::u32(sys::NFTA_SET_KEY_TYPE, 29453)));
        assert!(attrs.contains(&Attr::u32(sys::NFTA_SET_KEY_LEN, 12)));
        assert!(attrs.contains(&Attr::u32(sys::NFTA_SET_DATA_TYPE, 0xffff_ff00)));
    }

    #[test]
    fn dynamic_timeout_set_flags() {
        // `aff t 30 timeout 10800000ms`: NFT_SET_TIMEOUT | NFT_SET_EVAL.
        let set = Set::new("aff", DataType::Ipv4Addr)
            .with_flags(SetFlags {
                dynamic: true,
                ..SetFlags::default()
            })
            .with_timeout(Duration::from_secs(3 * 3600));
        let attrs = set.attrs("t", 1, false);
        assert!(attrs.contains(&Attr::u32(sys::NFTA_SET_FLAGS, 0x30)));
        assert!(attrs.contains(&Attr::u64(sys::NFTA_SET_TIMEOUT, 10_800_000)));
    }

    #[test]
    fn anonymous_numgen_vmap() {
        // `__map%d t b`: anonymous | constant | map; keys 0 and 1 in host order.
        let anon = AnonymousSet::numgen_vmap([Verdict::goto("a"), Verdict::goto("b")]);
        let attrs = anon.as_set().attrs("t", 7, true);
        assert!(attrs.contains(&Attr::u32(sys::NFTA_SET_FLAGS, 0xb)));
        assert!(attrs.contains(&Attr::string(sys::NFTA_SET_NAME, "__map%d")));
        assert_eq!(anon.elements[1].key.to_bytes(), 1u32.to_ne_bytes());
        // Key byte order annotated as host order for `nft list`.
        let mut userdata = vec![0, 4];
        userdata.extend_from_slice(&1u32.to_ne_bytes());
        assert!(attrs.contains(&Attr::bytes(sys::NFTA_SET_USERDATA, userdata)));
    }

    #[test]
    fn element_with_verdict() {
        let element = Element::new(vec![
            Value::Ipv4(Ipv4Addr::new(10, 96, 0, 1)),
            Value::TCP,
            Value::InetService(80),
        ])
        .with_verdict(Verdict::goto("svc-a"));
        let bytes = encode(&element.attrs());
        let expected = [
            vec![52, 0, 1, 0x80],                                     // NFTA_LIST_ELEM
            vec![20, 0, 1, 0x80, 16, 0, 1, 0],                        // KEY { VALUE
            vec![10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0],              //   12 bytes }
            vec![28, 0, 2, 0x80, 24, 0, 2, 0x80],                     // DATA { VERDICT {
            vec![8, 0, 1, 0, 0xff, 0xff, 0xff, 0xfc],                 //   CODE goto
            vec![10, 0, 2, 0, b's', b'v', b'c', b'-', b'a', 0, 0, 0], // CHAIN }}
        ]
        .concat();
        assert_eq!(bytes, expected);
        assert_eq!(element.to_string(), "10.96.0.1 . tcp . 80 : goto svc-a");
    }

    /// The bytes a dump of `nft --debug=mnl` shows in hex, spaces ignored.
    fn hex(text: &str) -> Vec<u8> {
        text.replace(' ', "")
            .as_bytes()
            .chunks(2)
            .map(|pair| {
                u8::from_str_radix(std::str::from_utf8(pair).expect("hex"), 16).expect("hex")
            })
            .collect()
    }

    #[test]
    fn endpoint_maps_carry_the_typeof_annotation_nft_writes() {
        // `nft --debug=mnl` for `map m { typeof numgen random mod 2 : ip daddr . th
        // dport; }`, nft 1.0.6 on x86_64: NFTA_SET_USERDATA.
        let expected = "00040100000001040000000003 1a000417000000011200040100000001040200000002040000000004340004 0d000000012c0014000407000000010c00040c0000000104 0c000000011400040700000001 0c00040b0000000104020000000604 00000000";
        let expected = hex(expected);
        let map = Set::data_map(
            "m",
            DataType::Integer32,
            Fields::new([DataType::Ipv4Addr, DataType::InetService]),
        );
        assert_eq!(map.userdata(), Some(expected));
    }

    #[test]
    fn port_endpoint_maps_carry_the_typeof_annotation_nft_writes() {
        // `nft --debug=mnl` for `map m { typeof ip daddr . meta l4proto . th dport .
        // numgen random mod 2 : ip daddr . th dport; }`, nft 1.0.6: NFTA_SET_USERDATA.
        let expected = "000400000000010400000000036000040d00000001580014000407000000010c00040c00000001040c000000010e00040900000001060004100000000214000407000000010c00040b000000010402000000031a0004170000000112000401000000010402000000020400000000043400040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000010c00040b0000000104020000000604000000000000";
        let expected = hex(expected);
        let map = Set::data_map(
            "m",
            Fields::new([
                DataType::Ipv4Addr,
                DataType::InetProto,
                DataType::InetService,
                DataType::Integer32,
            ]),
            Fields::new([DataType::Ipv4Addr, DataType::InetService]),
        );
        // The attribute is 170 bytes; the dump shows its padding too.
        assert_eq!(map.userdata().as_deref(), Some(&expected[..170]));
    }

    #[test]
    fn one_field_range_becomes_start_and_end_marker() {
        // nft: `element 0000000a : ... [end] element 0000000b : 1 [end]` for 10.0.0.0/8.
        let element = Element::range(
            Value::Ipv4(Ipv4Addr::new(10, 0, 0, 0)),
            Value::Ipv4(Ipv4Addr::new(10, 255, 255, 255)),
        );
        let attrs = element.attrs();
        assert_eq!(attrs.len(), 2);
        let end = encode(&attrs[1..]);
        assert_eq!(
            end,
            [
                vec![24, 0, 1, 0x80, 12, 0, 1, 0x80, 8, 0, 1, 0, 11, 0, 0, 0],
                vec![8, 0, 3, 0, 0, 0, 0, 1],
            ]
            .concat()
        );
    }
}
