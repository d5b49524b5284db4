//! Kernel tests of the nf_tables layer, each in a fresh network namespace.
//!
//! The reference for every ruleset is nft itself: the same ruleset written as nft text is
//! loaded with `nft -f` into a second namespace, and both are listed with `nft list
//! table`. Equal listings mean our bytecode reads back exactly as nft's does.

#![allow(
    clippy::too_many_lines,
    reason = "a test or bench reads as one story, top to bottom"
)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::Duration;

use nodus_proxy::nft::expr::{
    self, CmpOp, CtDirection, CtKey, DynsetOp, FibFlags, IcmpxCode, MetaKey, NatFlags, NumgenKind,
    RTN_LOCAL, Reject, ct_state,
};
use nodus_proxy::nft::{
    AnonymousSet, Batch, Chain, ChainType, DataType, Element, Error, Expr, Field, Fields, Hook,
    ListedData, Register, Rule, Set, SetFlags, SetRef, Socket, Table, Value, Verdict, priority,
};
use nodus_testbed::netns::{self, Netns};

const TABLE: &str = "nodus";

fn table() -> Table {
    Table::inet(TABLE)
}

/// Kernel tests need root (namespaces, nf_tables); elsewhere they pass vacuously.
/// Runs `f` with a socket opened inside `ns`.
fn with_socket<T: Send>(ns: &Netns, f: impl FnOnce(&mut Socket) -> T + Send) -> T {
    ns.enter(|| {
        let mut socket = Socket::open().expect("opening the nf_tables socket");
        f(&mut socket)
    })
    .expect("entering the namespace")
}

/// `nft list table inet nodus` in `ns`, with handles and counter values removed and
/// whitespace normalised.
fn list_table(ns: &Netns) -> String {
    let text = ns
        .exec("nft", &["list", "table", "inet", TABLE])
        .expect("nft list table");
    normalise(&text)
}

fn normalise(text: &str) -> String {
    text.lines()
        .map(|line| {
            let mut words: Vec<&str> = line.split_whitespace().collect();
            // `counter packets N bytes M` → `counter`
            if let Some(at) = words.iter().position(|w| *w == "counter")
                && words.get(at + 1) == Some(&"packets")
            {
                words.drain(at + 1..(at + 5).min(words.len()));
            }
            words.join(" ")
        })
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Loads `nft_text` with `nft -f` into a fresh namespace and lists it: the reference.
fn nft_reference(nft_text: &str) -> String {
    let ns = Netns::new("ref").expect("reference namespace");
    let path = std::env::temp_dir().join(format!("{}.nft", ns.name()));
    std::fs::write(&path, nft_text).expect("writing the reference ruleset");
    let loaded = ns.exec("nft", &["-f", path.to_str().expect("utf-8 path")]);
    let _ = std::fs::remove_file(&path);
    loaded.expect("nft -f of the reference ruleset");
    list_table(&ns)
}

fn ipv4(a: u8, b: u8, c: u8, d: u8) -> Value {
    Value::Ipv4(Ipv4Addr::new(a, b, c, d))
}

fn service_key_v4() -> Fields {
    Fields::new([
        DataType::Ipv4Addr,
        DataType::InetProto,
        DataType::InetService,
    ])
}

fn service_key_v6() -> Fields {
    Fields::new([
        DataType::Ipv6Addr,
        DataType::InetProto,
        DataType::InetService,
    ])
}

fn service_element(ip: Value, port: u16, verdict: Verdict) -> Element {
    Element::new(vec![ip, Value::TCP, Value::InetService(port)]).with_verdict(verdict)
}

fn rule(chain: &str, parts: impl IntoIterator<Item = Vec<Expr>>) -> Rule {
    Rule::new(chain, parts.into_iter().flatten())
}

fn verdict(v: Verdict) -> Vec<Expr> {
    vec![Expr::Verdict(v)]
}

fn l4proto_tcp() -> Vec<Expr> {
    vec![
        Field::L4Proto.load(Register::FIRST),
        expr::cmp_eq(Register::FIRST, vec![libc::IPPROTO_TCP as u8]),
    ]
}

/// The kube-proxy-shaped ruleset the read-back test builds, as nft text.
const FULL_RULESET: &str = r#"
table inet nodus {
  map service-ips {
    type ipv4_addr . inet_proto . inet_service : verdict
    elements = { 10.96.0.1 . tcp . 80 : goto svc-a, 10.96.0.2 . tcp . 443 : jump svc-b }
  }
  map service-ips6 {
    type ipv6_addr . inet_proto . inet_service : verdict
    elements = { fd00:96::1 . tcp . 80 : goto svc-b }
  }
  map dnat-targets {
    type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
    elements = { 10.96.0.3 . tcp . 80 : 10.244.1.5 . 8080 }
  }
  set affinity-a {
    type ipv4_addr
    size 65535
    flags dynamic,timeout
    timeout 3h
  }
  set source-ranges {
    type ipv4_addr
    flags interval
    elements = { 10.0.0.0/8, 192.168.1.1-192.168.1.9 }
  }
  chain nat-prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    jump services
  }
  chain nat-output {
    type nat hook output priority -100; policy accept;
    jump services
  }
  chain nat-postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    jump masquerading
  }
  chain filter-input {
    type filter hook input priority -110; policy accept;
    ct state new counter
    iifname "lo" oifname != "eth0" accept
    ct original ip daddr 192.0.2.1 drop
    ip saddr != @source-ranges limit rate 10/second
    meta l4proto tcp reject with tcp reset
    ip daddr 192.0.2.2 reject
    reject with icmpx port-unreachable
  }
  chain services {
    ip daddr . meta l4proto . th dport vmap @service-ips
    ip6 daddr . meta l4proto . th dport vmap @service-ips6
    fib daddr type local counter
  }
  chain svc-a {
    ip saddr @affinity-a goto ep-a
    numgen random mod 2 vmap { 0 : goto ep-a, 1 : goto ep-b }
  }
  chain svc-b {
    meta l4proto tcp dnat ip6 to [fd00::5]:8080
  }
  chain ep-a {
    ip saddr 10.244.1.5 jump mark-for-masquerade
    update @affinity-a { ip saddr }
    meta l4proto tcp dnat ip to 10.244.1.5:8080
  }
  chain ep-b {
    meta l4proto tcp dnat ip to 10.244.2.9:8080
  }
  chain mark-for-masquerade {
    meta mark set meta mark | 0x00004000
  }
  chain masquerading {
    meta mark & 0x00004000 == 0x00000000 return
    meta mark set meta mark ^ 0x00004000
    masquerade fully-random
  }
}
"#;

/// Builds [`FULL_RULESET`] through our layer, in one batch.
fn full_ruleset_batch() -> Batch {
    let mut batch = Batch::new(table());
    batch.add_table();
    let chains = [
        Chain::base(
            "nat-prerouting",
            ChainType::Nat,
            Hook::Prerouting,
            priority::DSTNAT,
        ),
        Chain::base("nat-output", ChainType::Nat, Hook::Output, priority::DSTNAT),
        Chain::base(
            "nat-postrouting",
            ChainType::Nat,
            Hook::Postrouting,
            priority::SRCNAT,
        ),
        Chain::base(
            "filter-input",
            ChainType::Filter,
            Hook::Input,
            priority::DSTNAT - 10,
        ),
        Chain::regular("services"),
        Chain::regular("svc-a"),
        Chain::regular("svc-b"),
        Chain::regular("ep-a"),
        Chain::regular("ep-b"),
        Chain::regular("mark-for-masquerade"),
        Chain::regular("masquerading"),
    ];
    for chain in &chains {
        batch.add_chain(chain);
    }

    let service_ips = batch.add_set(&Set::verdict_map("service-ips", service_key_v4()));
    batch.add_elements(
        &service_ips,
        &[
            service_element(ipv4(10, 96, 0, 1), 80, Verdict::goto("svc-a")),
            service_element(ipv4(10, 96, 0, 2), 443, Verdict::jump("svc-b")),
        ],
    );
    let service_ips6 = batch.add_set(&Set::verdict_map("service-ips6", service_key_v6()));
    batch.add_elements(
        &service_ips6,
        &[service_element(
            Value::Ipv6("fd00:96::1".parse().expect("address")),
            80,
            Verdict::goto("svc-b"),
        )],
    );
    let dnat_targets = batch.add_set(&Set::data_map(
        "dnat-targets",
        service_key_v4(),
        Fields::new([DataType::Ipv4Addr, DataType::InetService]),
    ));
    batch.add_elements(
        &dnat_targets,
        &[
            Element::new(vec![ipv4(10, 96, 0, 3), Value::TCP, Value::InetService(80)])
                .with_value(vec![ipv4(10, 244, 1, 5), Value::InetService(8080)]),
        ],
    );
    let affinity = batch.add_set(
        &Set::new("affinity-a", DataType::Ipv4Addr)
            .with_flags(SetFlags {
                dynamic: true,
                ..SetFlags::default()
            })
            .with_timeout(Duration::from_secs(3 * 3600))
            .with_size(65535),
    );
    let source_ranges = batch.add_set(&Set::new("source-ranges", DataType::Ipv4Addr).with_flags(
        SetFlags {
            interval: true,
            ..SetFlags::default()
        },
    ));
    batch.add_elements(
        &source_ranges,
        &[
            Element::range(ipv4(10, 0, 0, 0), ipv4(10, 255, 255, 255)),
            Element::range(ipv4(192, 168, 1, 1), ipv4(192, 168, 1, 9)),
        ],
    );

    for base in ["nat-prerouting", "nat-output"] {
        batch.add_rule(&rule(base, [verdict(Verdict::jump("services"))]));
    }
    batch.add_rule(&rule(
        "nat-postrouting",
        [verdict(Verdict::jump("masquerading"))],
    ));

    batch.add_rule(&rule(
        "filter-input",
        [expr::match_ct_state(ct_state::NEW), vec![Expr::Counter]],
    ));
    batch.add_rule(&rule(
        "filter-input",
        [
            vec![
                Expr::MetaLoad {
                    key: MetaKey::IifName,
                    dreg: Register::FIRST,
                },
                expr::cmp_eq(Register::FIRST, expr::ifname_bytes("lo")),
                Expr::MetaLoad {
                    key: MetaKey::OifName,
                    dreg: Register::FIRST,
                },
                Expr::Cmp {
                    sreg: Register::FIRST,
                    op: CmpOp::Neq,
                    data: expr::ifname_bytes("eth0"),
                },
            ],
            verdict(Verdict::Accept),
        ],
    ));
    batch.add_rule(&rule(
        "filter-input",
        [
            vec![
                Expr::CtLoad {
                    key: CtKey::DstIp,
                    direction: Some(CtDirection::Original),
                    dreg: Register::FIRST,
                },
                expr::cmp_eq(Register::FIRST, vec![192, 0, 2, 1]),
            ],
            verdict(Verdict::Drop),
        ],
    ));
    batch.add_rule(&rule(
        "filter-input",
        [
            expr::load_concat(&[Field::IpSaddr]),
            vec![
                Expr::Lookup {
                    set: source_ranges.clone(),
                    sreg: Register::FIRST,
                    dreg: None,
                    inverted: true,
                },
                Expr::Limit {
                    rate: 10,
                    per: Duration::from_secs(1),
                    burst: 5,
                    bytes: false,
                    inverted: false,
                },
            ],
        ],
    ));
    batch.add_rule(&rule(
        "filter-input",
        [l4proto_tcp(), vec![Expr::Reject(Reject::TcpReset)]],
    ));
    batch.add_rule(&rule(
        "filter-input",
        [
            expr::match_fields(&[Field::IpDaddr], CmpOp::Eq, &ipv4(192, 0, 2, 2).into()),
            vec![Expr::Reject(Reject::Icmp {
                code: expr::ICMP_PORT_UNREACHABLE,
            })],
        ],
    ));
    batch.add_rule(&rule(
        "filter-input",
        [vec![Expr::Reject(Reject::Icmpx(
            IcmpxCode::PortUnreachable,
        ))]],
    ));

    let lookup_verdict = |set: &SetRef| Expr::Lookup {
        set: set.clone(),
        sreg: Register::FIRST,
        dreg: Some(Register::VERDICT),
        inverted: false,
    };
    batch.add_rule(&rule(
        "services",
        [
            expr::load_concat(&[Field::IpDaddr, Field::L4Proto, Field::ThDport]),
            vec![lookup_verdict(&service_ips)],
        ],
    ));
    batch.add_rule(&rule(
        "services",
        [
            expr::load_concat(&[Field::Ip6Daddr, Field::L4Proto, Field::ThDport]),
            vec![lookup_verdict(&service_ips6)],
        ],
    ));
    batch.add_rule(&rule(
        "services",
        [
            expr::match_fib_type(FibFlags::DADDR, RTN_LOCAL),
            vec![Expr::Counter],
        ],
    ));

    batch.add_rule(&rule(
        "svc-a",
        [
            expr::load_concat(&[Field::IpSaddr]),
            vec![Expr::Lookup {
                set: affinity.clone(),
                sreg: Register::FIRST,
                dreg: None,
                inverted: false,
            }],
            verdict(Verdict::goto("ep-a")),
        ],
    ));
    let endpoints = batch.add_anonymous_set(&AnonymousSet::numgen_vmap([
        Verdict::goto("ep-a"),
        Verdict::goto("ep-b"),
    ]));
    batch.add_rule(&rule(
        "svc-a",
        [vec![
            Expr::Numgen {
                kind: NumgenKind::Random,
                modulus: 2,
                offset: 0,
                dreg: Register::FIRST,
            },
            lookup_verdict(&endpoints),
        ]],
    ));
    batch.add_rule(&rule(
        "svc-b",
        [
            l4proto_tcp(),
            expr::dnat_to(Value::Ipv6("fd00::5".parse().expect("address")), Some(8080)),
        ],
    ));

    batch.add_rule(&rule(
        "ep-a",
        [
            expr::match_fields(&[Field::IpSaddr], CmpOp::Eq, &ipv4(10, 244, 1, 5).into()),
            verdict(Verdict::jump("mark-for-masquerade")),
        ],
    ));
    batch.add_rule(&rule(
        "ep-a",
        [
            expr::load_concat(&[Field::IpSaddr]),
            vec![Expr::Dynset {
                set: affinity,
                op: DynsetOp::Update,
                key: Register::FIRST,
                data: None,
                timeout: None,
            }],
        ],
    ));
    batch.add_rule(&rule(
        "ep-a",
        [
            l4proto_tcp(),
            expr::dnat_to(ipv4(10, 244, 1, 5), Some(8080)),
        ],
    ));
    batch.add_rule(&rule(
        "ep-b",
        [
            l4proto_tcp(),
            expr::dnat_to(ipv4(10, 244, 2, 9), Some(8080)),
        ],
    ));

    batch.add_rule(&rule("mark-for-masquerade", [expr::mark_or(0x4000)]));
    batch.add_rule(&rule(
        "masquerading",
        [
            expr::match_mark_bits(0x4000, CmpOp::Eq, 0),
            verdict(Verdict::Return),
        ],
    ));
    batch.add_rule(&rule("masquerading", [expr::mark_xor(0x4000)]));
    batch.add_rule(&rule(
        "masquerading",
        [vec![Expr::Masquerade {
            flags: NatFlags::FULLY_RANDOM,
        }]],
    ));
    batch
}

#[test]
fn full_ruleset_reads_back_as_nft_wrote_it() {
    netns::require_root();
    let ns = Netns::new("full").expect("namespace");
    let batch = full_ruleset_batch();
    with_socket(&ns, |socket| socket.commit(&batch)).expect("commit");
    let ours = list_table(&ns);
    let reference = nft_reference(FULL_RULESET);
    assert_eq!(ours, reference, "ours:\n{ours}\n\nnft's:\n{reference}");
}

/// A table with a verdict map `service-ips`, chains `svc-a`, `svc-b` and a dispatch rule.
fn small_table_batch() -> (Batch, SetRef) {
    let mut batch = Batch::new(table());
    batch.add_table();
    batch.add_chain(&Chain::base(
        "nat-prerouting",
        ChainType::Nat,
        Hook::Prerouting,
        priority::DSTNAT,
    ));
    batch.add_chain(&Chain::regular("svc-a"));
    batch.add_chain(&Chain::regular("svc-b"));
    let map = batch.add_set(&Set::verdict_map("service-ips", service_key_v4()));
    batch.add_elements(
        &map,
        &[service_element(
            ipv4(10, 96, 0, 1),
            80,
            Verdict::goto("svc-a"),
        )],
    );
    batch.add_rule(&rule(
        "nat-prerouting",
        [
            expr::load_concat(&[Field::IpDaddr, Field::L4Proto, Field::ThDport]),
            vec![Expr::Lookup {
                set: map.clone(),
                sreg: Register::FIRST,
                dreg: Some(Register::VERDICT),
                inverted: false,
            }],
        ],
    ));
    (batch, SetRef::named("service-ips"))
}

#[test]
fn refused_batch_applies_nothing_and_names_the_refused_element() {
    netns::require_root();
    let ns = Netns::new("fail").expect("namespace");
    let (setup, map) = small_table_batch();
    with_socket(&ns, |socket| socket.commit(&setup)).expect("setup commit");
    let before = list_table(&ns);

    // A new chain, two good elements and one whose verdict names a missing chain.
    let mut batch = Batch::new(table());
    batch.add_chain(&Chain::regular("svc-c"));
    batch.add_elements(
        &map,
        &[
            service_element(ipv4(10, 96, 0, 5), 80, Verdict::goto("svc-b")),
            service_element(ipv4(10, 96, 0, 7), 80, Verdict::goto("missing-chain")),
            service_element(ipv4(10, 96, 0, 9), 80, Verdict::goto("svc-a")),
        ],
    );
    let (generation_before, result, generation_after) = with_socket(&ns, |socket| {
        let before = socket.generation().expect("generation");
        let result = socket.commit(&batch);
        (before, result, socket.generation().expect("generation"))
    });
    let error = result.expect_err("a verdict to a missing chain must be refused");
    let Error::Refused { message, errno, .. } = &error else {
        panic!("expected a refusal, got {error}");
    };
    assert_eq!(
        message,
        "add element to service-ips: 10.96.0.7 . tcp . 80 : goto missing-chain"
    );
    assert_eq!(errno.0, libc::ENOENT, "{error}");
    assert_eq!(
        generation_before, generation_after,
        "nothing may be committed"
    );
    assert_eq!(
        list_table(&ns),
        before,
        "the refused batch must leave no trace"
    );

    // `create element` of an existing key is refused with EEXIST, and named.
    let mut duplicate = Batch::new(table());
    duplicate.create_elements(
        &map,
        &[service_element(
            ipv4(10, 96, 0, 1),
            80,
            Verdict::goto("svc-a"),
        )],
    );
    let error = with_socket(&ns, |socket| socket.commit(&duplicate))
        .expect_err("a duplicate element must be refused");
    assert_eq!(error.errno().map(|e| e.0), Some(libc::EEXIST), "{error}");
    assert!(
        error
            .to_string()
            .contains("create element to service-ips: 10.96.0.1 . tcp . 80 : goto svc-a"),
        "{error}"
    );
    assert_eq!(list_table(&ns), before);
}

#[test]
fn elements_are_added_and_deleted_on_an_existing_map() {
    netns::require_root();
    let ns = Netns::new("elem").expect("namespace");
    let (setup, map) = small_table_batch();
    let added = service_element(ipv4(10, 96, 0, 2), 53, Verdict::goto("svc-b"));
    let listed = with_socket(&ns, |socket| {
        socket.commit(&setup).expect("setup commit");
        let mut batch = Batch::new(table());
        batch.add_elements(&map, std::slice::from_ref(&added));
        batch.delete_elements(
            &map,
            &[Element::new(vec![
                ipv4(10, 96, 0, 1),
                Value::TCP,
                Value::InetService(80),
            ])],
        );
        socket.commit(&batch).expect("element update");
        socket
            .list_elements(&table(), "service-ips")
            .expect("listing")
    });
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key, added.key.to_bytes());
    assert_eq!(
        listed[0].data,
        Some(ListedData::Verdict(Verdict::goto("svc-b")))
    );
    assert!(
        list_table(&ns).contains("elements = { 10.96.0.2 . tcp . 53 : goto svc-b }"),
        "{}",
        list_table(&ns)
    );
}

#[test]
fn one_chain_is_flushed_and_rewritten() {
    netns::require_root();
    let ns = Netns::new("flsh").expect("namespace");
    let (mut setup, _) = small_table_batch();
    setup.add_rule(&rule(
        "svc-a",
        [expr::dnat_to(ipv4(10, 244, 1, 5), Some(8080))],
    ));
    setup.add_rule(&rule("svc-b", [vec![Expr::Counter]]));
    with_socket(&ns, |socket| socket.commit(&setup)).expect("setup commit");
    assert!(list_table(&ns).contains("dnat ip to 10.244.1.5:8080"));

    let mut rewrite = Batch::new(table());
    rewrite.flush_chain("svc-a");
    rewrite.add_rule(&rule(
        "svc-a",
        [expr::dnat_to(ipv4(10, 244, 2, 9), Some(9090))],
    ));
    with_socket(&ns, |socket| socket.commit(&rewrite)).expect("rewrite");
    let listing = list_table(&ns);
    assert!(
        listing.contains("chain svc-a {\ndnat ip to 10.244.2.9:9090\n}"),
        "{listing}"
    );
    assert!(!listing.contains("10.244.1.5"), "{listing}");
    assert!(listing.contains("chain svc-b {\ncounter\n}"), "{listing}");
}

#[test]
fn generation_changes_with_each_commit_and_table_existence_is_seen() {
    netns::require_root();
    let ns = Netns::new("gen").expect("namespace");
    let (setup, _) = small_table_batch();
    with_socket(&ns, |socket| {
        assert!(!socket.table_exists(&table()).expect("table query"));
        let before = socket.generation().expect("generation");
        let committed = socket.commit(&setup).expect("commit");
        assert_ne!(committed, before);
        assert_eq!(socket.generation().expect("generation"), committed);
        assert!(socket.table_exists(&table()).expect("table query"));
        let mut delete = Batch::new(table());
        delete.delete_table();
        let after_delete = socket.commit(&delete).expect("delete");
        assert_ne!(after_delete, committed);
        assert!(!socket.table_exists(&table()).expect("table query"));
    });
}

#[test]
fn twenty_thousand_elements_commit_in_one_batch() {
    netns::require_root();
    let ns = Netns::new("big").expect("namespace");
    let (mut batch, map) = small_table_batch();
    let elements: Vec<Element> = (0..20_000u32)
        .map(|i| {
            let [_, _, hi, lo] = i.to_be_bytes();
            service_element(ipv4(10, 97, hi, lo), 80, Verdict::goto("svc-b"))
        })
        .collect();
    batch.add_elements(&map, &elements);
    let (listed, commit_time, list_time) = with_socket(&ns, |socket| {
        let started = std::time::Instant::now();
        socket.commit(&batch).expect("large commit");
        let committed = std::time::Instant::now();
        let listed = socket
            .list_elements(&table(), "service-ips")
            .expect("listing");
        (listed, committed - started, committed.elapsed())
    });
    eprintln!(
        "20,000 elements in {} messages: commit {commit_time:?}, listing {list_time:?}",
        batch.len(),
    );
    let started = std::time::Instant::now();
    ns.exec("nft", &["list", "map", "inet", TABLE, "service-ips"])
        .expect("nft list");
    eprintln!("nft list map: {:?}", started.elapsed());
    assert_eq!(listed.len(), 20_001);
}

/// Packets: a client namespace reaches a "ClusterIP" whose verdict-map entry jumps to a
/// chain that DNATs to a listener in the node namespace.
#[test]
fn tcp_to_a_service_address_lands_on_the_dnat_target() {
    netns::require_root();
    let node = Netns::new("node").expect("node namespace");
    let client = Netns::new("cli").expect("client namespace");
    netns::veth(&node, "eth0", &client, "eth0").expect("veth");
    node.ip(&["addr", "add", "10.0.0.1/24", "dev", "eth0"])
        .expect("node address");
    client
        .ip(&["addr", "add", "10.0.0.2/24", "dev", "eth0"])
        .expect("client address");
    client
        .ip(&["route", "add", "10.96.0.0/16", "via", "10.0.0.1"])
        .expect("service route");

    let (mut batch, _) = small_table_batch();
    // service-ips has 10.96.0.1 . tcp . 80 : goto svc-a; svc-a DNATs to the node.
    batch.add_rule(&rule(
        "svc-a",
        [l4proto_tcp(), expr::dnat_to(ipv4(10, 0, 0, 1), Some(8080))],
    ));
    with_socket(&node, |socket| socket.commit(&batch)).expect("commit");

    let listener = node
        .enter(|| TcpListener::bind("10.0.0.1:8080"))
        .expect("entering the node")
        .expect("listening");
    std::thread::scope(|scope| {
        let server = scope.spawn(|| {
            let (mut stream, peer) = listener.accept().expect("accept");
            let mut request = [0; 4];
            stream.read_exact(&mut request).expect("read");
            stream.write_all(b"pong").expect("write");
            (request, peer)
        });
        let reply = client
            .enter(|| {
                let address = "10.96.0.1:80".parse().expect("address");
                let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                stream.write_all(b"ping")?;
                let mut reply = [0; 4];
                stream.read_exact(&mut reply)?;
                std::io::Result::Ok(reply)
            })
            .expect("entering the client")
            .expect("connecting to the service address");
        assert_eq!(&reply, b"pong");
        let (request, peer) = server.join().expect("server thread");
        assert_eq!(&request, b"ping");
        assert_eq!(peer.ip(), Ipv4Addr::new(10, 0, 0, 2));
    });
}

/// A NetworkPolicy allowed set: an interval set of concatenations (the `pipapo` backend),
/// each element a box of one range per field, added to the existing set as a partial sync
/// does, and read back as nft writes it.
#[test]
fn boxes_of_ranges_go_into_an_interval_set_of_concatenations() {
    netns::require_root();
    let ns = Netns::new("box").expect("namespace");
    let fields = Fields::new([
        DataType::Ipv4Addr,
        DataType::Ipv4Addr,
        DataType::InetProto,
        DataType::InetService,
    ]);
    let set = Set::new("allowed", fields).with_flags(SetFlags {
        interval: true,
        ..SetFlags::default()
    });
    let element = Element::range(
        vec![
            ipv4(10, 244, 1, 11),
            ipv4(10, 244, 0, 0),
            Value::TCP,
            Value::InetService(8080),
        ],
        vec![
            ipv4(10, 244, 1, 11),
            ipv4(10, 244, 255, 255),
            Value::TCP,
            Value::InetService(8090),
        ],
    );
    with_socket(&ns, |socket| {
        let mut batch = Batch::new(table());
        batch.add_table();
        batch.add_set(&set);
        socket.commit(&batch).expect("set created");
        let mut batch = Batch::new(table());
        batch.add_elements(&SetRef::named("allowed"), std::slice::from_ref(&element));
        socket.commit(&batch).expect("element added");
    });
    assert!(
        list_table(&ns).contains("elements = { 10.244.1.11 . 10.244.0.0/16 . tcp . 8080-8090 }"),
        "{}",
        list_table(&ns)
    );
}
