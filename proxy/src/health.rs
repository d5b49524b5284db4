//! Health-check node ports (checklist H.50, H.51): for each LoadBalancer service with
//! `externalTrafficPolicy: Local`, an HTTP server on its `healthCheckNodePort` tells the
//! load balancer whether this node has a ready endpoint of the service.
//!
//! The answer is computed from the view at request time, like kube-proxy's: **200** with
//! the count of local ready endpoints, or **503** when there is none (endpoints that are
//! only terminating count as none, so the load balancer drains the node) or when the proxy
//! is unhealthy (a sync owed for over a minute: its rules may be stale). The body is
//! kube-proxy's JSON, and `X-Load-Balancing-Endpoint-Weight` carries the count. A port that
//! cannot be bound is logged and skipped; proxying goes on. The servers are
//! [`nodus_http`]'s, with its caps and timeouts, on both families for a wildcard address.

use crate::metrics::ProxyMetrics;
use hyper::{Response, StatusCode};
use nodus_http::{Body, Limits};
use nodus_view::model::{ServiceType, TrafficPolicy};
use nodus_view::{ChangeSet, ServiceName, View, ViewReader};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The health-check node port `namespace/name` needs on this view, if any.
pub fn health_check_port(view: &View, namespace: &str, name: &str) -> Option<u16> {
    let service = view.service(namespace, name)?.service?;
    (service.type_ == ServiceType::LoadBalancer
        && service.external_policy == TrafficPolicy::Local
        && service.health_check_node_port != 0
        && !service.not_proxied()
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
        .filter(|slice| !slice.headless)
        .flat_map(|slice| slice.endpoints())
        .filter(|e| !node.name.is_empty() && e.node == node.name && e.is_ready())
        .map(|e| e.addr)
        .collect();
    local.len()
}

fn respond(view: &ViewReader, proxy: &ProxyMetrics, service: &ServiceName) -> Response<Body> {
    let count = local_ready_endpoints(&view.read(), &service.namespace, &service.name);
    let healthy = proxy.is_healthy();
    let body = serde_json::json!({
        "service": {"namespace": service.namespace, "name": service.name},
        "localEndpoints": count,
        "serviceProxyHealthy": healthy,
    })
    .to_string();
    let status = if count > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut response = nodus_http::respond(status, "application/json", body);
    if let Ok(weight) = count.to_string().parse() {
        response
            .headers_mut()
            .insert("X-Load-Balancing-Endpoint-Weight", weight);
    }
    response
}

struct Served {
    service: ServiceName,
    /// One server per family bound.
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Where the health-check servers listen, and what each allows.
#[derive(Clone, Debug)]
pub struct HealthListen {
    /// kube-proxy listens on every address by default.
    pub bind: IpAddr,
    /// With the cluster's pod ranges as tenants, so that pods cannot hold the places a
    /// load balancer's probe needs.
    pub limits: Limits,
}

/// The health-check servers, opened and closed as services come and go.
pub struct HealthChecks {
    view: ViewReader,
    /// Whether the proxy is healthy: a node whose rules are stale is drained too.
    proxy: Arc<ProxyMetrics>,
    listen: HealthListen,
    served: HashMap<u16, Served>,
}

impl HealthChecks {
    pub fn new(view: ViewReader, proxy: Arc<ProxyMetrics>, listen: HealthListen) -> HealthChecks {
        HealthChecks {
            view,
            proxy,
            listen,
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
                self.served.remove(&p);
            }
            let Some(port) = port else { continue };
            if self.served.contains_key(&port) {
                continue;
            }
            match self.listen(port, &service) {
                Ok(tasks) => {
                    self.served.insert(port, Served { service, tasks });
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

    fn listen(&self, port: u16, service: &ServiceName) -> std::io::Result<Vec<JoinHandle<()>>> {
        let listeners = nodus_http::bind(SocketAddr::new(self.listen.bind, port))?;
        Ok(listeners
            .into_iter()
            .map(|listener| {
                let (view, proxy, service) =
                    (self.view.clone(), self.proxy.clone(), service.clone());
                nodus_http::serve(
                    listener,
                    self.listen.limits.clone(),
                    move |_request, _client| respond(&view, &proxy, &service),
                )
            })
            .collect())
    }
}
