//! The agent's HTTP endpoints: `/livez`, `/healthz` ([`health`]), `/readyz`, `/metrics` and `/status`, served
//! with [`nodus_http`]'s caps and timeouts. `/status` holds error texts (paths, addresses,
//! the API's messages), so it answers loopback only unless the configuration opens it.

use crate::agent::health;
use crate::agent::metrics::Metrics;
use anyhow::Context;
use hyper::{Method, Request, Response, StatusCode, body::Incoming};
use nodus_http::{Body, Limits, respond};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

fn route(
    metrics: &Metrics,
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
            let verdict = match livez {
                true => health::livez(metrics),
                false => health::healthz(metrics),
            };
            metrics.health_answered(livez, verdict.is_ok());
            match verdict {
                Ok(()) => respond(StatusCode::OK, TEXT, "ok\n"),
                Err(why) => respond(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
            }
        }
        "/readyz" if metrics.ready.load(Relaxed) => respond(StatusCode::OK, TEXT, "ok\n"),
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
            serde_json::to_string(&crate::agent::status::status(metrics)).unwrap_or_default(),
        ),
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        _ => respond(StatusCode::NOT_FOUND, TEXT, "not found\n"),
    }
}

/// Binds `addr` now (so a busy port fails start-up; the IPv4 wildcard is bound for IPv6
/// too) and serves in the background; returns the first address bound.
pub async fn serve(
    addr: SocketAddr,
    status_from_anywhere: bool,
    metrics: Arc<Metrics>,
) -> anyhow::Result<SocketAddr> {
    let listeners =
        nodus_http::bind(addr).with_context(|| format!("binding the HTTP address {addr}"))?;
    let bound = listeners[0].local_addr()?;
    for listener in listeners {
        let metrics = metrics.clone();
        nodus_http::serve(listener, Limits::default(), move |req, client| {
            route(&metrics, status_from_anywhere, req, client)
        });
    }
    Ok(bound)
}
