//! The agent's HTTP endpoints: `/livez`, `/healthz` ([`health`]), `/readyz`, `/metrics` and `/status`, served
//! with [`nodus_http`]'s caps and timeouts. `/status` holds error texts (paths, addresses,
//! the API's messages), so it answers loopback only unless the configuration opens it.

use crate::agent::health;
use crate::agent::metrics::Metrics;
use crate::agent::process::ProcessState;
use crate::config::Config;
use anyhow::Context;
use hyper::{Method, Request, Response, StatusCode, body::Incoming};
use nodus_http::{Body, Limits, Tenants, respond};
use nodus_view::model::Cidr;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use tokio::task::JoinHandle;

fn route(
    metrics: &Arc<Metrics>,
    process: &Arc<ProcessState>,
    status_from_anywhere: bool,
    req: &Request<Incoming>,
    client: SocketAddr,
) -> Response<Body> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, TEXT, "method not allowed\n");
    }
    match req.uri().path() {
        path @ ("/healthz" | "/livez") => {
            let livez = path == "/livez";
            let verdict = if livez {
                health::livez(metrics)
            } else {
                health::healthz(metrics, process)
            };
            metrics.health_answered(livez, verdict.is_ok());
            match verdict {
                Ok(()) => respond(StatusCode::OK, TEXT, "ok\n"),
                Err(why) => respond(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
            }
        }
        "/readyz" if process.is_lameduck() => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "shutting down: serving out the lameduck period\n",
        ),
        "/readyz" if process.is_ready() => respond(StatusCode::OK, TEXT, "ok\n"),
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "initial view not applied yet\n",
        ),
        "/status" if !status_from_anywhere && !client.ip().to_canonical().is_loopback() => respond(
            StatusCode::FORBIDDEN,
            TEXT,
            "/status answers loopback only (run `nodus status` on the node, or set \
                 status_from_anywhere: true)\n",
        ),
        "/status" => respond(
            StatusCode::OK,
            "application/json",
            serde_json::to_string(&crate::agent::status::status(metrics, process))
                .unwrap_or_default(),
        ),
        "/metrics" => respond(
            StatusCode::OK,
            nodus_prom::CONTENT_TYPE,
            crate::agent::metrics::render(metrics, process),
        ),
        _ => respond(StatusCode::NOT_FOUND, TEXT, "not found\n"),
    }
}

/// The agent's HTTP server, serving in the background until stopped.
pub struct HttpServer {
    /// The first address bound.
    pub addr: SocketAddr,
    /// Copies of the listening sockets' descriptors, to hand over.
    sockets: Vec<std::net::TcpListener>,
    tasks: Vec<JoinHandle<()>>,
}

impl HttpServer {
    /// Copies of the listening sockets, for the next process.
    pub fn hand_over(&self) -> std::io::Result<Vec<std::net::TcpListener>> {
        self.sockets.iter().map(|s| s.try_clone()).collect()
    }

    /// Stops accepting; the sockets live on in the process they were handed to.
    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What every HTTP listener of the node allows (this one and the health-check node
/// ports): the defaults, with the clients in `cluster_cidrs` (the pods) holding at most
/// half of the places together. Without `cluster_cidrs` pods are not told apart.
pub fn limits(cluster_cidrs: &[Cidr]) -> Limits {
    let tenants = match cluster_cidrs {
        [] => Tenants::default(),
        ranges => {
            let ranges = ranges.to_vec();
            Tenants::within(move |client| ranges.iter().any(|range| range.contains(client)))
        }
    };
    Limits {
        tenants,
        ..Limits::default()
    }
}

/// Binds `config.http_addr` now (so a busy port fails start-up; the IPv4 wildcard is
/// bound for IPv6 too), or serves on the sockets the process before handed over
/// (`inherited`) when they are bound to it, and serves in the background.
pub async fn serve(
    config: &Config,
    inherited: Vec<std::net::TcpListener>,
    limits: Limits,
    metrics: &Arc<Metrics>,
    process: &Arc<ProcessState>,
) -> anyhow::Result<HttpServer> {
    let (addr, status_from_anywhere) = (config.http_addr, config.status_from_anywhere);
    let same = inherited
        .first()
        .and_then(|s| s.local_addr().ok())
        .is_some_and(|bound| bound == addr);
    let listeners = if same {
        inherited
            .into_iter()
            .map(|socket| {
                socket.set_nonblocking(true)?;
                tokio::net::TcpListener::from_std(socket)
            })
            .collect::<std::io::Result<Vec<_>>>()
            .context("serving HTTP on the sockets handed over")?
    } else {
        nodus_http::bind(addr).with_context(|| format!("binding the HTTP address {addr}"))?
    };
    let bound = listeners[0].local_addr()?;
    let mut sockets = Vec::new();
    let mut tasks = Vec::new();
    for listener in listeners {
        sockets.push(std::net::TcpListener::from(
            listener.as_fd().try_clone_to_owned()?,
        ));
        let (metrics, process) = (metrics.clone(), process.clone());
        tasks.push(nodus_http::serve(
            listener,
            limits.clone(),
            move |req, client| route(&metrics, &process, status_from_anywhere, req, client),
        ));
    }
    Ok(HttpServer {
        addr: bound,
        sockets,
        tasks,
    })
}
