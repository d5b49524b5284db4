//! [`lookup`] asked directly, without sockets: each answer rule of the module against the
//! view the crate's other tests answer from (`tests/fixture`: the example cluster plus a few
//! services made for the rules it does not show). Records are compared in their text form,
//! `<owner> <ttl> IN <type> <data>`, so owner case, TTLs and data are all checked.

use super::*;
use nodus_view::{Update, ViewReader, ViewWriter};
use std::sync::LazyLock;

#[path = "../../tests/fixture/mod.rs"]
mod fixture;

/// The fixture view, built once: lookups only read it.
static VIEW: LazyLock<ViewWriter> = LazyLock::new(fixture::view);

/// The zone the integration tests serve: `cluster.local`, TTL 5.
struct Cluster {
    view: ViewReader,
    zone: Zone,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster::with_pods(PodRecords::Disabled)
    }

    fn with_pods(pods: PodRecords) -> Cluster {
        Cluster {
            view: VIEW.reader(),
            zone: Zone::new("cluster.local", 5, pods).expect("zone"),
        }
    }

    fn outcome(&self, name: &str, qtype: RecordType) -> Outcome {
        let view = self.view.read();
        // Names from the wire are fully qualified.
        let mut qname = Name::from_ascii(name).expect("query name");
        qname.set_fqdn(true);
        lookup(&view, &self.zone, &qname, qtype)
    }

    /// The authoritative answer; a question the zone does not take fails the test.
    fn ask(&self, name: &str, qtype: RecordType) -> Answer {
        match self.outcome(name, qtype) {
            Outcome::Authoritative(answer) => answer,
            Outcome::NotOurs => panic!("{name} {qtype}: not ours"),
        }
    }

    /// NXDOMAIN, no records, the zone's SOA in the authority section.
    fn assert_nxdomain(&self, name: &str, qtype: RecordType) {
        let answer = self.ask(name, qtype);
        assert_eq!(answer.rcode, ResponseCode::NXDomain, "{name} {qtype}");
        self.assert_negative(name, qtype, &answer);
    }

    /// NODATA: NOERROR, no records, the zone's SOA in the authority section.
    fn assert_nodata(&self, name: &str, qtype: RecordType) {
        let answer = self.ask(name, qtype);
        assert_eq!(answer.rcode, ResponseCode::NoError, "{name} {qtype}");
        self.assert_negative(name, qtype, &answer);
    }

    fn assert_negative(&self, name: &str, qtype: RecordType, answer: &Answer) {
        assert_eq!(lines(&answer.answers), no_lines(), "{name} {qtype}");
        assert_eq!(lines(&answer.additionals), no_lines(), "{name} {qtype}");
        assert_eq!(
            lines(&answer.authority),
            [self.zone.soa().to_string()],
            "{name} {qtype}"
        );
    }
}

/// Records in their text form, in the answer's order.
fn lines(records: &[Record]) -> Vec<String> {
    records.iter().map(ToString::to_string).collect()
}

/// Records in their text form, sorted: for sections whose order is not a rule.
fn sorted(records: &[Record]) -> Vec<String> {
    let mut lines = lines(records);
    lines.sort();
    lines
}

fn no_lines() -> Vec<String> {
    Vec::new()
}

// ClusterIP services: A, AAAA, ANY (spec rules 2 to 4).

#[test]
fn cluster_ip_service_a_is_its_ipv4_cluster_ip() {
    let answer = Cluster::new().ask("web.default.svc.cluster.local", RecordType::A);
    assert_eq!(answer.rcode, ResponseCode::NoError);
    assert_eq!(
        lines(&answer.answers),
        ["web.default.svc.cluster.local. 5 IN A 10.96.0.20"]
    );
    assert_eq!(lines(&answer.authority), no_lines());
    assert_eq!(lines(&answer.additionals), no_lines());
}

#[test]
fn cluster_ip_service_aaaa_is_its_ipv6_cluster_ip() {
    let answer = Cluster::new().ask("web.default.svc.cluster.local", RecordType::AAAA);
    assert_eq!(answer.rcode, ResponseCode::NoError);
    assert_eq!(
        lines(&answer.answers),
        ["web.default.svc.cluster.local. 5 IN AAAA fd00:96::20"]
    );
    assert_eq!(lines(&answer.authority), no_lines());
}

#[test]
fn any_is_answered_with_one_rrset_only() {
    // RFC 8482: not both families, although the name has both.
    let answer = Cluster::new().ask("dual.default.svc.cluster.local", RecordType::ANY);
    assert_eq!(
        lines(&answer.answers),
        ["dual.default.svc.cluster.local. 5 IN A 10.96.0.40"]
    );
    let v6_only = Cluster::new().ask("dual.default.svc.cluster.local", RecordType::AAAA);
    assert_eq!(
        v6_only.answers.len(),
        1,
        "AAAA still answers the other family"
    );
}

#[test]
fn single_stack_service_has_no_data_for_the_other_family() {
    Cluster::new().assert_nodata("api.shop.svc.cluster.local", RecordType::AAAA);
}

#[test]
fn other_types_on_a_cluster_ip_service_are_no_data() {
    let cluster = Cluster::new();
    for qtype in [
        RecordType::TXT,
        RecordType::CNAME,
        RecordType::PTR,
        RecordType::Unknown(65000),
    ] {
        cluster.assert_nodata("web.default.svc.cluster.local", qtype);
    }
}

// Headless services (spec rules 8 to 10).

#[test]
fn headless_service_a_lists_its_ready_endpoints() {
    let answer = Cluster::new().ask("db.shop.svc.cluster.local", RecordType::A);
    assert_eq!(answer.rcode, ResponseCode::NoError);
    assert_eq!(
        sorted(&answer.answers),
        [
            "db.shop.svc.cluster.local. 5 IN A 10.244.2.30",
            "db.shop.svc.cluster.local. 5 IN A 10.244.3.30",
        ]
    );
    assert_eq!(lines(&answer.authority), no_lines());
}

#[test]
fn headless_service_leaves_out_endpoints_that_are_not_ready() {
    let answer = Cluster::new().ask("many.default.svc.cluster.local", RecordType::A);
    let addresses: Vec<String> = answer.answers.iter().map(|r| r.data.to_string()).collect();
    assert_eq!(addresses.len(), 60, "{addresses:?}");
    assert!(addresses.contains(&"10.244.9.1".to_string()));
    assert!(addresses.contains(&"10.244.9.60".to_string()));
    assert!(!addresses.contains(&"10.244.9.200".to_string()));
}

#[test]
fn headless_service_without_ready_endpoints_does_not_exist() {
    let cluster = Cluster::new();
    for qtype in [RecordType::A, RecordType::AAAA, RecordType::SRV] {
        cluster.assert_nxdomain("empty-headless.default.svc.cluster.local", qtype);
    }
}

#[test]
fn headless_service_of_one_family_has_no_data_for_the_other() {
    Cluster::new().assert_nodata("db.shop.svc.cluster.local", RecordType::AAAA);
}

#[test]
fn publish_not_ready_addresses_publishes_every_endpoint() {
    let view = fixture::view();
    let report = view.write().apply([
        Update::Service(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "late", "namespace": "default"},
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": true,
                         "ports": [{"name": "http", "port": 80}]}
            }))
            .expect("service"),
        ),
        Update::EndpointSlice(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "late-1", "namespace": "default",
                             "labels": {"kubernetes.io/service-name": "late"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
                "endpoints": [
                    {"addresses": ["10.244.8.1"]},
                    {"addresses": ["10.244.8.2"], "conditions": {"ready": false}}
                ]
            }))
            .expect("slice"),
        ),
    ]);
    assert!(report.invalid.is_empty(), "{:?}", report.invalid);
    let cluster = Cluster {
        view: view.reader(),
        ..Cluster::new()
    };
    let answer = cluster.ask("late.default.svc.cluster.local", RecordType::A);
    assert_eq!(
        sorted(&answer.answers),
        [
            "late.default.svc.cluster.local. 5 IN A 10.244.8.1",
            "late.default.svc.cluster.local. 5 IN A 10.244.8.2",
        ]
    );
}

// Endpoint hostnames of headless services (spec rule 11).

#[test]
fn endpoint_hostname_is_its_address() {
    let cluster = Cluster::new();
    let answer = cluster.ask("db-0.db.shop.svc.cluster.local", RecordType::A);
    assert_eq!(answer.rcode, ResponseCode::NoError);
    assert_eq!(
        lines(&answer.answers),
        ["db-0.db.shop.svc.cluster.local. 5 IN A 10.244.2.30"]
    );
    let answer = cluster.ask("db-1.db.shop.svc.cluster.local", RecordType::ANY);
    assert_eq!(
        lines(&answer.answers),
        ["db-1.db.shop.svc.cluster.local. 5 IN A 10.244.3.30"]
    );
}

#[test]
fn endpoint_without_hostname_is_named_by_its_dashed_address() {
    let answer = Cluster::new().ask("10-244-9-7.many.default.svc.cluster.local", RecordType::A);
    assert_eq!(
        lines(&answer.answers),
        ["10-244-9-7.many.default.svc.cluster.local. 5 IN A 10.244.9.7"]
    );
}

#[test]
fn unknown_or_unready_endpoint_names_are_nxdomain() {
    let cluster = Cluster::new();
    for name in [
        "db-9.db.shop.svc.cluster.local",
        "10-244-9-200.many.default.svc.cluster.local",
        "db-0.missing.shop.svc.cluster.local",
    ] {
        cluster.assert_nxdomain(name, RecordType::A);
    }
}

#[test]
fn endpoint_of_the_other_family_is_no_data() {
    Cluster::new().assert_nodata("db-0.db.shop.svc.cluster.local", RecordType::AAAA);
}

// SRV (spec rule 5 and, for headless services, rule 12).

#[test]
fn srv_for_a_named_port_of_a_cluster_ip_service() {
    let answer = Cluster::new().ask("_http._tcp.web.default.svc.cluster.local", RecordType::SRV);
    assert_eq!(answer.rcode, ResponseCode::NoError);
    assert_eq!(
        lines(&answer.answers),
        [
            "_http._tcp.web.default.svc.cluster.local. 5 IN SRV 0 100 80 web.default.svc.cluster.local."
        ]
    );
    assert_eq!(
        lines(&answer.additionals),
        [
            "web.default.svc.cluster.local. 5 IN A 10.96.0.20",
            "web.default.svc.cluster.local. 5 IN AAAA fd00:96::20",
        ]
    );
    assert_eq!(lines(&answer.authority), no_lines());
}

#[test]
fn srv_needs_the_port_name_and_protocol_to_match() {
    let cluster = Cluster::new();
    for name in [
        "_http._udp.web.default.svc.cluster.local",
        "_https._tcp.web.default.svc.cluster.local",
        "_http._tcp.missing.default.svc.cluster.local",
        "_http._tcp.docs.shop.svc.cluster.local",
    ] {
        cluster.assert_nxdomain(name, RecordType::SRV);
    }
}

#[test]
fn port_names_asked_for_another_type_are_no_data() {
    let cluster = Cluster::new();
    cluster.assert_nodata("_http._tcp.web.default.svc.cluster.local", RecordType::A);
    cluster.assert_nodata("_pg._tcp.db.shop.svc.cluster.local", RecordType::A);
}

#[test]
fn bare_service_srv_lists_every_named_port() {
    let answer = Cluster::new().ask("api.shop.svc.cluster.local", RecordType::SRV);
    assert_eq!(
        lines(&answer.answers),
        [
            "api.shop.svc.cluster.local. 5 IN SRV 0 50 80 api.shop.svc.cluster.local.",
            "api.shop.svc.cluster.local. 5 IN SRV 0 50 9000 api.shop.svc.cluster.local.",
        ]
    );
    assert_eq!(
        lines(&answer.additionals),
        ["api.shop.svc.cluster.local. 5 IN A 10.96.0.30"]
    );
}

/// As CoreDNS: the bare name has an SRV record for every port, unnamed ones too, while
/// `_port._proto` with a name matches named ports only.
#[test]
fn bare_service_srv_includes_unnamed_ports() {
    let cluster = Cluster::new();
    let answer = cluster.ask("dual.default.svc.cluster.local", RecordType::SRV);
    assert_eq!(
        lines(&answer.answers),
        [
            "dual.default.svc.cluster.local. 5 IN SRV 0 50 80 dual.default.svc.cluster.local.",
            "dual.default.svc.cluster.local. 5 IN SRV 0 50 81 dual.default.svc.cluster.local."
        ]
    );
    let any_tcp = cluster.ask("_._tcp.dual.default.svc.cluster.local", RecordType::SRV);
    assert_eq!(any_tcp.answers.len(), 2, "{:?}", lines(&any_tcp.answers));
    let named = cluster.ask(
        "_metrics._tcp.dual.default.svc.cluster.local",
        RecordType::SRV,
    );
    assert_eq!(
        named.rcode,
        ResponseCode::NXDomain,
        "{:?}",
        lines(&named.answers)
    );
}

#[test]
fn a_bare_underscore_label_matches_any_port_name_or_protocol() {
    let cluster = Cluster::new();
    let udp = cluster.ask("_._udp.api.shop.svc.cluster.local", RecordType::SRV);
    assert_eq!(
        lines(&udp.answers),
        ["_._udp.api.shop.svc.cluster.local. 5 IN SRV 0 100 9000 api.shop.svc.cluster.local."]
    );
    let http = cluster.ask("_http._.api.shop.svc.cluster.local", RecordType::SRV);
    assert_eq!(
        lines(&http.answers),
        ["_http._.api.shop.svc.cluster.local. 5 IN SRV 0 100 80 api.shop.svc.cluster.local."]
    );
    let any = cluster.ask("_._.api.shop.svc.cluster.local", RecordType::SRV);
    assert_eq!(any.answers.len(), 2, "{:?}", lines(&any.answers));
}

#[test]
fn headless_srv_targets_each_endpoint_hostname() {
    let cluster = Cluster::new();
    for name in [
        "_pg._tcp.db.shop.svc.cluster.local",
        "db.shop.svc.cluster.local",
    ] {
        let answer = cluster.ask(name, RecordType::SRV);
        assert_eq!(answer.rcode, ResponseCode::NoError, "{name}");
        assert_eq!(
            sorted(&answer.answers),
            [
                format!("{name}. 5 IN SRV 0 50 5432 db-0.db.shop.svc.cluster.local."),
                format!("{name}. 5 IN SRV 0 50 5432 db-1.db.shop.svc.cluster.local."),
            ]
        );
        assert_eq!(
            sorted(&answer.additionals),
            [
                "db-0.db.shop.svc.cluster.local. 5 IN A 10.244.2.30",
                "db-1.db.shop.svc.cluster.local. 5 IN A 10.244.3.30",
            ],
            "{name}"
        );
    }
}

#[test]
fn headless_srv_of_generated_hostnames_uses_the_dashed_address() {
    let answer = Cluster::new().ask("_http._tcp.many.default.svc.cluster.local", RecordType::SRV);
    assert_eq!(answer.answers.len(), 60);
    let srv = lines(&answer.answers);
    assert!(
        srv.contains(
            &"_http._tcp.many.default.svc.cluster.local. 5 IN SRV 0 1 8080 10-244-9-7.many.default.svc.cluster.local."
                .to_string()
        ),
        "{srv:?}"
    );
}

/// A selectorless headless service whose two slices name different ports (the upstream
/// e2e spec "DNS should provide DNS for a service with multiple EndpointSlices and no
/// Endpoints"): each port's SRV names its own slice's endpoints, whatever the Service's
/// ports say, as CoreDNS answers.
#[test]
fn headless_srv_names_the_ports_its_slices_name() {
    let cluster = Cluster::new();
    for (port, number, endpoint) in [("http", 80, "10-244-5-1"), ("https", 443, "10-244-5-2")] {
        let name = format!("_{port}._tcp.split.default.svc.cluster.local");
        let answer = cluster.ask(&name, RecordType::SRV);
        assert_eq!(answer.rcode, ResponseCode::NoError, "{name}");
        assert_eq!(
            lines(&answer.answers),
            [format!(
                "{name}. 5 IN SRV 0 100 {number} {endpoint}.split.default.svc.cluster.local."
            )]
        );
        cluster.assert_nodata(&name, RecordType::A);
    }
    cluster.assert_nxdomain("_ftp._tcp.split.default.svc.cluster.local", RecordType::SRV);
    cluster.assert_nxdomain(
        "_https._udp.split.default.svc.cluster.local",
        RecordType::SRV,
    );
}

// PTR (spec rules 6, 7 and 13).

#[test]
fn ptr_of_a_cluster_ip_names_the_service() {
    let cluster = Cluster::new();
    let v4 = cluster.ask("20.0.96.10.in-addr.arpa", RecordType::PTR);
    assert_eq!(v4.rcode, ResponseCode::NoError);
    assert_eq!(
        lines(&v4.answers),
        ["20.0.96.10.in-addr.arpa. 5 IN PTR web.default.svc.cluster.local."]
    );
    assert_eq!(lines(&v4.authority), no_lines());
    let v6_name = "0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa";
    let v6 = cluster.ask(v6_name, RecordType::PTR);
    assert_eq!(
        lines(&v6.answers),
        [format!(
            "{v6_name}. 5 IN PTR web.default.svc.cluster.local."
        )]
    );
}

#[test]
fn ptr_of_a_headless_endpoint_names_the_endpoint() {
    let cluster = Cluster::new();
    let named = cluster.ask("30.2.244.10.in-addr.arpa", RecordType::PTR);
    assert_eq!(
        lines(&named.answers),
        ["30.2.244.10.in-addr.arpa. 5 IN PTR db-0.db.shop.svc.cluster.local."]
    );
    let generated = cluster.ask("7.9.244.10.in-addr.arpa", RecordType::ANY);
    assert_eq!(
        lines(&generated.answers),
        ["7.9.244.10.in-addr.arpa. 5 IN PTR 10-244-9-7.many.default.svc.cluster.local."]
    );
}

/// A dual-stack headless endpoint with a hostname: both of its addresses name it.
#[test]
fn ptr_of_a_dual_stack_headless_endpoint_names_it_for_both_addresses() {
    let cluster = Cluster::new();
    let v4 = cluster.ask("40.1.244.10.in-addr.arpa", RecordType::PTR);
    assert_eq!(
        lines(&v4.answers),
        ["40.1.244.10.in-addr.arpa. 5 IN PTR pair-0.pair.shop.svc.cluster.local."]
    );
    let v6_name = "0.4.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0.0.4.4.2.0.0.0.d.f.ip6.arpa";
    let v6 = cluster.ask(v6_name, RecordType::PTR);
    assert_eq!(
        lines(&v6.answers),
        [format!(
            "{v6_name}. 5 IN PTR pair-0.pair.shop.svc.cluster.local."
        )]
    );
}

/// As CoreDNS: the endpoints of any service have PTR records, not only headless ones.
#[test]
fn ptr_of_an_endpoint_of_a_cluster_ip_service_names_the_endpoint() {
    let answer = Cluster::new().ask("10.1.244.10.in-addr.arpa", RecordType::PTR);
    assert_eq!(
        lines(&answer.answers),
        ["10.1.244.10.in-addr.arpa. 5 IN PTR 10-244-1-10.web.default.svc.cluster.local."]
    );
}

/// An address of the cluster (a ServiceCIDR, a Node's pod range, a configured range) that
/// nothing holds is NXDOMAIN here: upstream resolvers never hear of it.
#[test]
fn reverse_names_inside_the_cluster_are_answered_here() {
    let cluster = Cluster::new();
    let configured = Cluster {
        view: VIEW.reader(),
        zone: Zone::new("cluster.local", 5, PodRecords::Disabled)
            .expect("zone")
            .with_cluster_ranges(vec!["172.20.0.0/16".parse().expect("cidr")]),
    };
    for (cluster, name) in [
        (&cluster, "99.0.96.10.in-addr.arpa"),
        (&cluster, "99.1.244.10.in-addr.arpa"),
        (
            &cluster,
            "9.9.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.2.0.0.0.4.4.2.0.0.0.d.f.ip6.arpa",
        ),
        (&configured, "1.0.20.172.in-addr.arpa"),
    ] {
        let answer = cluster.ask(name, RecordType::PTR);
        assert_eq!(answer.rcode, ResponseCode::NXDomain, "{name}");
        assert_eq!(lines(&answer.answers), no_lines(), "{name}");
        let [soa] = answer.authority.as_slice() else {
            panic!("{name}: {:?}", lines(&answer.authority));
        };
        assert_eq!(soa.record_type(), RecordType::SOA, "{name}");
    }
    assert_eq!(
        cluster.outcome("1.0.20.172.in-addr.arpa", RecordType::PTR),
        Outcome::NotOurs,
        "not configured, not in the view"
    );
}

#[test]
fn reverse_names_nodus_does_not_own_are_not_ours() {
    let cluster = Cluster::new();
    for name in [
        // An address no service has, outside the cluster.
        "1.1.168.192.in-addr.arpa",
        // A headless endpoint that is not ready, outside every range the view knows.
        "200.9.244.10.in-addr.arpa",
        // Incomplete reverse names.
        "96.10.in-addr.arpa",
        "in-addr.arpa",
    ] {
        assert_eq!(
            cluster.outcome(name, RecordType::PTR),
            Outcome::NotOurs,
            "{name}"
        );
    }
}

#[test]
fn reverse_name_asked_for_another_type_is_no_data_with_the_reverse_zone_soa() {
    let cluster = Cluster::new();
    for (name, zone) in [
        ("20.0.96.10.in-addr.arpa", "in-addr.arpa."),
        (
            "0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa",
            "ip6.arpa.",
        ),
    ] {
        let answer = cluster.ask(name, RecordType::A);
        assert_eq!(answer.rcode, ResponseCode::NoError, "{name}");
        assert_eq!(lines(&answer.answers), no_lines(), "{name}");
        let [soa] = answer.authority.as_slice() else {
            panic!("{name}: {:?}", lines(&answer.authority));
        };
        assert_eq!(soa.record_type(), RecordType::SOA, "{name}");
        assert_eq!(soa.name.to_string(), zone, "{name}");
        assert!(
            soa.data.to_string().starts_with(&format!("ns.dns.{zone} ")),
            "{name}: {soa}"
        );
    }
}

// ExternalName (spec rule 14).

#[test]
fn external_name_is_a_cname_to_its_target() {
    let answer = Cluster::new().ask("docs.shop.svc.cluster.local", RecordType::A);
    assert_eq!(answer.rcode, ResponseCode::NoError);
    assert_eq!(
        lines(&answer.answers),
        ["docs.shop.svc.cluster.local. 5 IN CNAME docs.example.org."]
    );
    assert_eq!(lines(&answer.authority), no_lines());
}

#[test]
fn external_name_inside_the_zone_is_chased() {
    let answer = Cluster::new().ask("inner.shop.svc.cluster.local", RecordType::A);
    assert_eq!(answer.rcode, ResponseCode::NoError);
    assert_eq!(
        lines(&answer.answers),
        [
            "inner.shop.svc.cluster.local. 5 IN CNAME web.default.svc.cluster.local.",
            "web.default.svc.cluster.local. 5 IN A 10.96.0.20",
        ]
    );
}

#[test]
fn external_name_to_an_endpoint_name_is_chased() {
    let answer = Cluster::new().ask("primary.shop.svc.cluster.local", RecordType::A);
    assert_eq!(answer.rcode, ResponseCode::NoError);
    assert_eq!(
        lines(&answer.answers),
        [
            "primary.shop.svc.cluster.local. 5 IN CNAME pair-0.pair.shop.svc.cluster.local.",
            "pair-0.pair.shop.svc.cluster.local. 5 IN A 10.244.1.40",
        ]
    );
    let aaaa = Cluster::new().ask("primary.shop.svc.cluster.local", RecordType::AAAA);
    assert_eq!(
        lines(&aaaa.answers)[1],
        "pair-0.pair.shop.svc.cluster.local. 5 IN AAAA fd00:244:1::40"
    );
}

#[test]
fn cname_question_about_an_external_name_is_not_chased() {
    let answer = Cluster::new().ask("inner.shop.svc.cluster.local", RecordType::CNAME);
    assert_eq!(
        lines(&answer.answers),
        ["inner.shop.svc.cluster.local. 5 IN CNAME web.default.svc.cluster.local."]
    );
}

#[test]
fn external_name_has_no_srv() {
    Cluster::new().assert_nodata("docs.shop.svc.cluster.local", RecordType::SRV);
}

// Negative answers: NXDOMAIN and NODATA, both with the SOA (RFC 2308).

#[test]
fn names_that_do_not_exist_are_nxdomain_with_the_soa() {
    let cluster = Cluster::new();
    for name in [
        "missing.default.svc.cluster.local",
        "web.missing-ns.svc.cluster.local",
        "missing.svc.cluster.local",
        "something.cluster.local",
        "a.b.c.web.default.svc.cluster.local",
        "a.b.c.d.e.f.g.cluster.local",
    ] {
        cluster.assert_nxdomain(name, RecordType::A);
    }
}

#[test]
fn names_that_exist_without_the_records_asked_are_nodata_with_the_soa() {
    let cluster = Cluster::new();
    for (name, qtype) in [
        ("cluster.local", RecordType::A),
        ("svc.cluster.local", RecordType::A),
        ("default.svc.cluster.local", RecordType::A),
        ("pod.cluster.local", RecordType::A),
        ("web.default.svc.cluster.local", RecordType::TXT),
        ("dns-version.cluster.local", RecordType::A),
        ("ns.dns.cluster.local", RecordType::AAAA),
    ] {
        cluster.assert_nodata(name, qtype);
    }
}

#[test]
fn names_outside_the_zone_are_not_ours() {
    let cluster = Cluster::new();
    for name in [
        "example.org",
        "cluster.local.example.org",
        "xcluster.local",
        "local",
        ".",
    ] {
        assert_eq!(
            cluster.outcome(name, RecordType::A),
            Outcome::NotOurs,
            "{name}"
        );
    }
}

// Case (spec rule 15): owner names keep the question's case.

#[test]
fn owner_names_keep_the_question_case() {
    let cluster = Cluster::new();
    let a = cluster.ask("WEB.Default.SVC.cluster.LOCAL", RecordType::A);
    assert_eq!(
        lines(&a.answers),
        ["WEB.Default.SVC.cluster.LOCAL. 5 IN A 10.96.0.20"]
    );
    let host = cluster.ask("DB-0.Db.Shop.svc.cluster.local", RecordType::A);
    assert_eq!(
        lines(&host.answers),
        ["DB-0.Db.Shop.svc.cluster.local. 5 IN A 10.244.2.30"]
    );
    let ptr = cluster.ask("20.0.96.10.IN-ADDR.arpa", RecordType::PTR);
    assert_eq!(
        lines(&ptr.answers),
        ["20.0.96.10.IN-ADDR.arpa. 5 IN PTR web.default.svc.cluster.local."]
    );
    let soa = cluster.ask("Cluster.LOCAL", RecordType::SOA);
    assert_eq!(soa.answers[0].name.to_string(), "Cluster.LOCAL.");
}

#[test]
fn srv_targets_and_the_soa_are_lower_case_whatever_the_question() {
    let cluster = Cluster::new();
    let srv = cluster.ask("_HTTP._TCP.Web.Default.svc.cluster.local", RecordType::SRV);
    assert_eq!(
        lines(&srv.answers),
        [
            "_HTTP._TCP.Web.Default.svc.cluster.local. 5 IN SRV 0 100 80 web.default.svc.cluster.local."
        ]
    );
    let missing = cluster.ask("Missing.Default.svc.cluster.local", RecordType::A);
    assert_eq!(
        missing.authority[0].name.to_string(),
        "cluster.local.",
        "the SOA's owner is the zone"
    );
}

// The fixed names: dns-version (spec rule 1), the apex, the name server.

#[test]
fn dns_version_is_the_schema_version_in_a_txt_record() {
    let cluster = Cluster::new();
    for qtype in [RecordType::TXT, RecordType::ANY] {
        let answer = cluster.ask("dns-version.cluster.local", qtype);
        assert_eq!(answer.rcode, ResponseCode::NoError);
        assert_eq!(
            lines(&answer.answers),
            ["dns-version.cluster.local. 28800 IN TXT 1.1.0"],
            "{qtype}"
        );
    }
}

#[test]
fn apex_soa_is_the_zone_soa() {
    let cluster = Cluster::new();
    let answer = cluster.ask("cluster.local", RecordType::SOA);
    assert_eq!(answer.rcode, ResponseCode::NoError);
    assert_eq!(lines(&answer.answers), [cluster.zone.soa().to_string()]);
    assert!(
        cluster.zone.soa().to_string().starts_with(
            "cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. "
        ),
        "{}",
        cluster.zone.soa()
    );
    assert!(
        cluster
            .zone
            .soa()
            .to_string()
            .ends_with(" 7200 1800 86400 5"),
        "the minimum is the TTL: {}",
        cluster.zone.soa()
    );
    assert_eq!(lines(&answer.authority), no_lines());
}

#[test]
fn apex_ns_is_ns_dns_with_kube_dns_as_glue() {
    let answer = Cluster::new().ask("cluster.local", RecordType::NS);
    assert_eq!(
        lines(&answer.answers),
        ["cluster.local. 5 IN NS ns.dns.cluster.local."]
    );
    assert_eq!(
        lines(&answer.additionals),
        ["ns.dns.cluster.local. 5 IN A 10.96.0.10"]
    );
}

#[test]
fn name_server_name_is_the_kube_dns_cluster_ip() {
    let answer = Cluster::new().ask("ns.dns.cluster.local", RecordType::A);
    assert_eq!(
        lines(&answer.answers),
        ["ns.dns.cluster.local. 5 IN A 10.96.0.10"]
    );
}

// Pod records.

#[test]
fn pod_names_are_nxdomain_when_pod_records_are_disabled() {
    let cluster = Cluster::with_pods(PodRecords::Disabled);
    cluster.assert_nxdomain("10-244-1-10.default.pod.cluster.local", RecordType::A);
    cluster.assert_nxdomain("default.pod.cluster.local", RecordType::A);
    cluster.assert_nodata("pod.cluster.local", RecordType::A);
}

#[test]
fn insecure_pod_records_answer_any_dashed_address() {
    let cluster = Cluster::with_pods(PodRecords::Insecure);
    let v4 = cluster.ask("10-244-1-10.default.pod.cluster.local", RecordType::A);
    assert_eq!(
        lines(&v4.answers),
        ["10-244-1-10.default.pod.cluster.local. 5 IN A 10.244.1.10"]
    );
    // No pod has this address: insecure mode does not check.
    let any = cluster.ask("1-2-3-4.shop.pod.cluster.local", RecordType::ANY);
    assert_eq!(
        lines(&any.answers),
        ["1-2-3-4.shop.pod.cluster.local. 5 IN A 1.2.3.4"]
    );
    let v6 = cluster.ask("fd00-244-1--10.default.pod.cluster.local", RecordType::AAAA);
    assert_eq!(
        lines(&v6.answers),
        ["fd00-244-1--10.default.pod.cluster.local. 5 IN AAAA fd00:244:1::10"]
    );
    cluster.assert_nodata("10-244-1-10.default.pod.cluster.local", RecordType::AAAA);
    cluster.assert_nodata("default.pod.cluster.local", RecordType::A);
}

#[test]
fn insecure_pod_records_need_a_dashed_address_in_an_existing_namespace() {
    let cluster = Cluster::with_pods(PodRecords::Insecure);
    cluster.assert_nxdomain("not-an-ip.default.pod.cluster.local", RecordType::A);
    cluster.assert_nxdomain("10-244-1-10.missing-ns.pod.cluster.local", RecordType::A);
    cluster.assert_nxdomain("missing-ns.pod.cluster.local", RecordType::A);
}

// The helpers behind the names.

#[test]
fn dashed_addresses_round_trip() {
    for (ip, label) in [
        ("10.244.1.7", "10-244-1-7"),
        ("fd00:10::7", "fd00-10--7"),
        ("::1", "0--1"),
        ("fd00::", "fd00--0"),
    ] {
        let ip: IpAddr = ip.parse().expect("address");
        assert_eq!(dashed(ip), label);
        assert_eq!(parse_dashed(label), Some(ip), "{label}");
    }
    assert_eq!(parse_dashed("10-244-1"), None);
    assert_eq!(parse_dashed("db-0"), None);
}

#[test]
fn reverse_names_give_their_address_only_when_complete() {
    let parse = |name: &str| reverse_address(&Name::from_ascii(name).expect("name"));
    assert_eq!(
        parse("7.1.244.10.in-addr.arpa."),
        Some("10.244.1.7".parse().expect("v4"))
    );
    assert_eq!(
        parse("0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa."),
        Some("fd00:96::20".parse().expect("v6"))
    );
    for name in [
        "1.244.10.in-addr.arpa.",
        "256.1.244.10.in-addr.arpa.",
        "0.2.ip6.arpa.",
        "x.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa.",
        "web.default.svc.cluster.local.",
    ] {
        assert_eq!(parse(name), None, "{name}");
    }
}

#[test]
fn srv_weight_shares_one_hundred_and_is_at_least_one() {
    assert_eq!(
        [0, 1, 2, 3, 60, 200].map(srv_weight),
        [100, 100, 50, 33, 1, 1]
    );
}
