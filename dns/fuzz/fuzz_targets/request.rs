//! Fuzzes the DNS request path: any bytes, parsed as hickory-server parses a datagram, then
//! answered by nodus's handler from a small view, and the answer encoded. Nothing may panic.

#![no_main]

use hickory_server::net::NetError;
use hickory_server::net::runtime::TokioTime;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::serialize::binary::BinEncoder;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use hickory_server::proto::rr::Record;
use libfuzzer_sys::fuzz_target;
use nodus_dns::server::ClusterDns;
use nodus_dns::{PodRecords, Zone};
use nodus_view::{Update, View, wire};
use std::sync::{Arc, LazyLock, RwLock};

#[derive(Clone)]
struct Encode;

#[async_trait::async_trait]
impl ResponseHandler for Encode {
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
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(512);
        Ok(response.destructive_emit(&mut encoder)?)
    }
}

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
    ClusterDns::new(Arc::new(RwLock::new(view)), zone, None)
});

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
});

fuzz_target!(|data: &[u8]| {
    let Ok(request) = Request::from_bytes(data.to_vec(), "127.0.0.1:5353".parse().expect("addr"), Protocol::Udp)
    else {
        return;
    };
    RUNTIME.block_on(HANDLER.handle_request::<_, TokioTime>(&request, Encode));
});
