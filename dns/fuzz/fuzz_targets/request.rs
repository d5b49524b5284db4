//! Fuzzes the DNS request path: any bytes as a UDP datagram, answered by the full path
//! (hickory-proto's parser and nodus's handler, as the UDP listener runs it) and by the
//! fast path from a small view. Nothing may panic, and whatever the fast path answers must
//! parse and equal the full path's answer.

#![no_main]

use hickory_proto::op::Message;
use libfuzzer_sys::fuzz_target;
use nodus_dns::handler::ClusterDns;
use nodus_dns::{PodRecords, Zone, fast};
use nodus_view::{Update, View, ViewWriter, wire};
use std::sync::LazyLock;

static HANDLER: LazyLock<ClusterDns> = LazyLock::new(|| {
    let mut view = View::new("node-1");
    let objects = serde_json::json!([
        {"kind": "Service", "metadata": {"name": "web", "namespace": "default"},
         "spec": {"clusterIPs": ["10.96.0.20", "fd00::20"], "ports": [{"name": "http", "port": 80}]}},
        {"kind": "Service", "metadata": {"name": "db", "namespace": "default"},
         "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}},
        {"kind": "Service", "metadata": {"name": "ext", "namespace": "default"},
         "spec": {"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}}
    ]);
    let mut updates: Vec<Update> = Vec::new();
    for object in objects.as_array().into_iter().flatten() {
        if let Ok(service) = serde_json::from_value::<Box<wire::Service>>(object.clone()) {
            updates.push(Update::Service(service));
        }
    }
    if let Ok(slice) = serde_json::from_value::<Box<wire::EndpointSlice>>(serde_json::json!({
        "metadata": {"name": "db-1", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "db", "service.kubernetes.io/headless": ""}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.5"], "hostname": "db-0"}, {"addresses": ["10.244.1.6"]}],
        "ports": [{"name": "pg", "protocol": "TCP", "port": 5432}]
    })) {
        updates.push(Update::EndpointSlice(slice));
    }
    view.apply(updates);
    let zone = Zone::new("cluster.local", 5, PodRecords::Insecure).expect("static zone");
    let view = ViewWriter::new(view);
    view.mark_complete();
    ClusterDns::new(view.reader(), zone, None)
});

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
});

fuzz_target!(|data: &[u8]| {
    let src = "127.0.0.1:5353".parse().expect("addr");
    let full = RUNTIME.block_on(HANDLER.answer_datagram(data.to_vec(), src));
    let view = HANDLER.view().read();
    let mut out = [0u8; 1232];
    if let Some(reply) = fast::answer(&view, HANDLER.zone(), src.ip(), data, &mut out) {
        let fast = Message::from_vec(&out[..reply.len]).expect("the fast path's reply parses");
        let full = full.expect("the full path answers what the fast path answers");
        let full = Message::from_vec(&full).expect("the full path's reply parses");
        assert_eq!(fast, full, "the paths disagree on {data:?}");
    }
});
