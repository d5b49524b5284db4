//! Health-check node ports (checklist H.50, H.51): for each LoadBalancer service with
//! `externalTrafficPolicy: Local`, an HTTP server on its `healthCheckNodePort` tells the
//! load balancer whether this node has a ready endpoint of the service.
//!
//! The answer is computed from the view at request time, like kube-proxy's: **200** with
//! the count of local ready endpoints, or **503** when there is none (endpoints that are
//! only terminating count as none, so the load balancer drains the node). The body is
//! kube-proxy's JSON, and `X-Load-Balancing-Endpoint-Weight` carries the count. A port that
//! cannot be bound is logged and skipped; proxying goes on.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode, service::service_fn};
use hyper_util::rt::TokioIo;
use nodus_view::model::{ServiceType, TrafficPolicy};
use nodus_view::{ChangeSet, ServiceName, View, ViewReader};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use tokio::task::JoinHandle;

/// The health-check node port `namespace/name` needs on this view, if any.
pub fn health_check_port(view: &View, namespace: &str, name: &str) -> Option<u16> {
    let service = view.service(namespace, name)?.service?;
    (service.type_ == ServiceType::LoadBalancer
        && service.external_policy == TrafficPolicy::Local
        && service.health_check_node_port != 0
        && service.proxy_name.is_empty()
        && !service.headless)
        .then_some(service.health_check_node_port)
}

/// Ready endpoints of `namespace/name` on this node, counted once per address.
pub fn local_ready_endpoints(view: &View, namespace: &str, name: &str) -> usize {
    let node = view.node_context();
    let Some(service) = view.service(namespace, name) else {
        return 0;
    };
    let local: HashSet<IpAddr> = service
        .slices
        .iter()
        .flat_map(|slice| slice.endpoints())
        .filter(|e| !node.name.is_empty() && e.node == node.name && e.is_ready())
        .map(|e| e.addr)
        .collect();
    local.len()
}

fn respond(view: &ViewReader, service: &ServiceName) -> Response<Full<Bytes>> {
    let count = local_ready_endpoints(&view.read(), &service.namespace, &service.name);
    let body = serde_json::json!({
        "service": {"namespace": service.namespace, "name": service.name},
        "localEndpoints": count,
        "serviceProxyHealthy": true,
    })
    .to_string();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = match count {
        0 => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    };
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if let Ok(weight) = count.to_string().parse() {
        headers.insert("X-Load-Balancing-Endpoint-Weight", weight);
    }
    response
}

struct Served {
    service: ServiceName,
    task: JoinHandle<()>,
}

/// The health-check servers, opened and closed as services come and go.
pub struct HealthChecks {
    view: ViewReader,
    bind: IpAddr,
    served: HashMap<u16, Served>,
}

impl Drop for HealthChecks {
    fn drop(&mut self) {
        for served in self.served.values() {
            served.task.abort();
        }
    }
}

impl HealthChecks {
    /// Servers will listen on `bind` (kube-proxy listens on every address by default).
    pub fn new(view: ViewReader, bind: IpAddr) -> HealthChecks {
        HealthChecks {
            view,
            bind,
            served: HashMap::new(),
        }
    }

    /// The ports being served, for tests and metrics.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.served.keys().copied().collect();
        ports.sort();
        ports
    }

    /// Brings the servers in line with the services in `changes`, or with every service
    /// when `changes` is `None` (at start), as `view` has them. Must run inside a tokio
    /// runtime.
    pub fn update(&mut self, view: &View, changes: Option<&ChangeSet>) {
        let wanted: Vec<(ServiceName, Option<u16>)> = {
            let names: Vec<ServiceName> = match changes {
                Some(changes) => changes.services.iter().cloned().collect(),
                None => view
                    .services()
                    .map(|s| ServiceName {
                        namespace: s.namespace.to_string(),
                        name: s.name.to_string(),
                    })
                    .collect(),
            };
            names
                .into_iter()
                .map(|name| {
                    let port = health_check_port(view, &name.namespace, &name.name);
                    (name, port)
                })
                .collect()
        };
        for (service, port) in wanted {
            // A server this service no longer wants (or wants on another port) goes.
            let stale: Vec<u16> = self
                .served
                .iter()
                .filter(|(p, s)| s.service == service && Some(**p) != port)
                .map(|(p, _)| *p)
                .collect();
            for p in stale {
                if let Some(old) = self.served.remove(&p) {
                    old.task.abort();
                }
            }
            let Some(port) = port else { continue };
            if self.served.contains_key(&port) {
                continue;
            }
            match self.listen(port, &service) {
                Ok(task) => {
                    self.served.insert(port, Served { service, task });
                }
                Err(error) => tracing::warn!(
                    port,
                    service = %format!("{}/{}", service.namespace, service.name),
                    %error,
                    "cannot serve a health-check node port; proxying continues"
                ),
            }
        }
    }

    fn listen(&self, port: u16, service: &ServiceName) -> std::io::Result<JoinHandle<()>> {
        let listener = std::net::TcpListener::bind(SocketAddr::new(self.bind, port))?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let view = self.view.clone();
        let service = service.clone();
        Ok(tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (view, service) = (view.clone(), service.clone());
                tokio::spawn(async move {
                    let handler = service_fn(move |_request| {
                        let response = respond(&view, &service);
                        async move { Ok::<_, std::convert::Infallible>(response) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), handler)
                        .await;
                });
            }
        }))
    }
}
