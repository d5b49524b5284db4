//! The agent's HTTP endpoints: `/healthz`, `/readyz`, `/metrics` and `/status`.

use crate::agent::metrics::Metrics;
use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tokio::net::TcpListener;

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

fn route(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "method not allowed\n".into(),
        );
    }
    match req.uri().path() {
        "/healthz" | "/livez" => respond(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" if metrics.ready.load(Relaxed) => respond(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "initial view not applied yet\n".into(),
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
        _ => respond(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
    }
}

/// Binds `addr` now (so a busy port fails start-up) and serves in the background.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the HTTP address {addr}"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(error) => {
                    tracing::warn!(%error, "accepting an HTTP connection");
                    continue;
                }
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let response = route(&metrics, &req);
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
}
