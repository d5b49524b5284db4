//! The HTTP/1.1 front end: accept loops, request routing, and the REST verbs on top of the
//! [`Store`].
//!
//! Every failure is answered with a `metav1.Status` body; nothing a client sends can panic a
//! handler.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::discovery;
use super::error::ApiError;
use super::patch::{self, PatchType};
use super::query::{ListOptions, Query, WatchOptions};
use super::registry::{self, ResourceId};
use super::selector::FieldSelector;
use super::store::PatchRecord;
use super::store::{Store, WatchFrom};
use super::watch::{self as watch_stream, ResponseBody, WatchEnd, WatchSpec};

/// Request bodies larger than this get 413 (upstream's limit is 3 MiB per object).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// State shared by every connection of one server.
struct Ctx {
    store: Store,
    /// Bumped by `drop_watches` and `cut_watches_mid_object`; every watch task ends when
    /// it changes.
    drop_tx: watch::Sender<WatchEnd>,
    addr: SocketAddr,
}

/// Connection tasks. Dropping the set aborts them, which closes their sockets.
type Connections = Arc<Mutex<JoinSet<()>>>;

/// A running server. Dropping it stops accepting and closes connections (without waiting);
/// [`ServerHandle::shutdown`] does the same and waits until the port is free.
pub struct ServerHandle {
    addr: SocketAddr,
    ctx: Arc<Ctx>,
    acceptors: Mutex<JoinSet<()>>,
    connections: Connections,
    runtime: tokio::runtime::Handle,
}

/// Serves `store` on `listener` until the returned handle is shut down or dropped.
pub async fn serve(store: Store, listener: TcpListener) -> anyhow::Result<ServerHandle> {
    let addr = listener
        .local_addr()
        .context("reading the listener's address")?;
    let (drop_tx, _) = watch::channel(WatchEnd::default());
    let handle = ServerHandle {
        addr,
        ctx: Arc::new(Ctx {
            store,
            drop_tx,
            addr,
        }),
        acceptors: Mutex::new(JoinSet::new()),
        connections: Arc::new(Mutex::new(JoinSet::new())),
        runtime: tokio::runtime::Handle::current(),
    };
    handle.spawn_acceptor(listener);
    Ok(handle)
}

impl ServerHandle {
    /// `http://ADDR` of the first listener.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn store(&self) -> &Store {
        &self.ctx.store
    }

    /// Also accepts connections on `listener` (e.g. one bound inside a network namespace).
    pub fn add_listener(&self, listener: std::net::TcpListener) -> anyhow::Result<()> {
        listener
            .set_nonblocking(true)
            .context("making the listener non-blocking")?;
        let _guard = self.runtime.enter();
        let listener = TcpListener::from_std(listener).context("registering the listener")?;
        self.spawn_acceptor(listener);
        Ok(())
    }

    /// Also accepts connections on `addr` inside network namespace `ns` (the address of a
    /// test bed underlay, so that nodus processes in node namespaces reach the server).
    pub fn listen_in(&self, ns: &crate::netns::Netns, addr: SocketAddr) -> anyhow::Result<()> {
        let listener = ns
            .enter(|| std::net::TcpListener::bind(addr))?
            .with_context(|| format!("binding {addr} in {}", ns.name()))?;
        self.add_listener(listener)
    }

    fn spawn_acceptor(&self, listener: TcpListener) {
        let ctx = self.ctx.clone();
        let connections = self.connections.clone();
        self.acceptors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spawn_on(accept_loop(listener, ctx, connections), &self.runtime);
    }

    /// Ends every open watch stream now; clients see the response end and re-watch.
    pub fn drop_watches(&self) {
        self.ctx.drop_tx.send_modify(|end| {
            end.generation += 1;
            end.mid_object = false;
        });
    }

    /// Ends every open watch stream in the middle of an event: its first bytes, then the
    /// end of the response, as a connection lost mid-transfer leaves it.
    pub fn cut_watches_mid_object(&self) {
        self.ctx.drop_tx.send_modify(|end| {
            end.generation += 1;
            end.mid_object = true;
        });
    }

    /// Stops accepting, closes every connection, and returns once the ports are free.
    pub async fn shutdown(self) {
        let mut acceptors = std::mem::take(
            &mut *self
                .acceptors
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        acceptors.shutdown().await;
        let mut connections = std::mem::take(
            &mut *self
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        connections.shutdown().await;
        self.drop_watches();
    }
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>, connections: Connections) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        let mut set = connections.lock().unwrap_or_else(PoisonError::into_inner);
        while set.try_join_next().is_some() {}
        set.spawn(async move {
            let service = service_fn(move |req| {
                let ctx = ctx.clone();
                async move { Ok::<_, Infallible>(handle(&ctx, req).await) }
            });
            let result = http1::Builder::new()
                .timer(TokioTimer::new())
                .keep_alive(true)
                // Idle keep-alive connections stay open: closing them races with clients
                // reusing them.
                .header_read_timeout(None)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = result {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
}

fn json_response(code: StatusCode, body: &Value) -> Response<ResponseBody> {
    bytes_response(
        code,
        Bytes::from(serde_json::to_vec(body).unwrap_or_default()),
    )
}

fn bytes_response(code: StatusCode, body: Bytes) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::Full(Some(body)));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error_response(e: &ApiError) -> Response<ResponseBody> {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &e.to_status())
}

async fn handle(ctx: &Ctx, req: Request<Incoming>) -> Response<ResponseBody> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let result = route(ctx, req).await;
    match result {
        Ok(resp) => {
            tracing::debug!("{method} {path} -> {}", resp.status());
            resp
        }
        Err(e) => {
            tracing::debug!("{method} {path} -> {} {}", e.code, e.message);
            error_response(&e)
        }
    }
}

/// A parsed resource path.
#[derive(Debug)]
struct Target {
    res: ResourceId,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
    /// The legacy `/…/watch/…` prefix.
    watch_prefix: bool,
}

/// Parses the part after `/api/v1` or `/apis/{group}/{version}`.
fn parse_target(group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let (watch_prefix, rest) = match rest {
        ["watch", tail @ ..] => (true, tail),
        _ => (false, rest),
    };
    let namespaced_kind = |plural: &str| {
        registry::by_plural(group, version, plural).filter(|&id| registry::def(id).namespaced)
    };
    let (res, namespace, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if namespaced_kind(plural).is_some() => (
            namespaced_kind(plural).ok_or_else(ApiError::no_route)?,
            Some((*ns).to_owned()),
            tail,
        ),
        [plural, tail @ ..] => {
            let id = registry::by_plural(group, version, plural).ok_or_else(ApiError::no_route)?;
            // A namespaced kind outside a namespace is only a collection (all namespaces).
            if registry::def(id).namespaced && !tail.is_empty() {
                return Err(ApiError::no_route());
            }
            (id, None, tail)
        }
        [] => return Err(ApiError::no_route()),
    };
    let (name, status) = match tail {
        [] => (None, false),
        [name] => (Some((*name).to_owned()), false),
        [name, "status"] if registry::def(res).has_status => (Some((*name).to_owned()), true),
        _ => return Err(ApiError::no_route()),
    };
    if name.as_deref().is_some_and(str::is_empty) || namespace.as_deref().is_some_and(str::is_empty)
    {
        return Err(ApiError::no_route());
    }
    Ok(Target {
        res,
        namespace,
        name,
        status,
        watch_prefix,
    })
}

async fn route(ctx: &Ctx, req: Request<Incoming>) -> Result<Response<ResponseBody>, ApiError> {
    let path = req.uri().path().to_owned();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let get_only = |value: Option<Value>| -> Result<Response<ResponseBody>, ApiError> {
        if req.method() != Method::GET {
            return Err(ApiError::method_not_allowed(req.method().as_str()));
        }
        value
            .map(|v| json_response(StatusCode::OK, &v))
            .ok_or_else(ApiError::no_route)
    };
    match segments.as_slice() {
        ["version"] => get_only(Some(discovery::version())),
        ["healthz" | "livez" | "readyz", ..] => {
            Ok(bytes_response(StatusCode::OK, Bytes::from_static(b"ok")))
        }
        ["api"] => get_only(Some(discovery::core_versions(&ctx.addr.to_string()))),
        ["apis"] => get_only(Some(discovery::group_list())),
        ["api", "v1"] => get_only(discovery::resource_list("", "v1")),
        ["apis", group] => get_only(discovery::api_group(group)),
        ["apis", group, version] => get_only(discovery::resource_list(group, version)),
        ["api", "v1", rest @ ..] => {
            let target = parse_target("", "v1", rest)?;
            resource(ctx, target, req).await
        }
        ["apis", group, version, rest @ ..] => {
            let target = parse_target(group, version, rest)?;
            resource(ctx, target, req).await
        }
        _ => Err(ApiError::no_route()),
    }
}

async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ApiError::too_large(format!("reading the request body: {e}")))
}

fn content_type(req: &Request<Incoming>) -> String {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned()
}

/// Decodes a POST/PUT body: JSON, or YAML when the client says so. Protobuf is not served.
fn decode_object(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    match media {
        "" | "application/json" | "*/*" => patch::decode_body(body, false),
        "application/yaml" | "application/x-yaml" | "text/yaml" => patch::decode_body(body, true),
        other => Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json, application/yaml (got {other:?})"
        ))),
    }
}

fn list_body(
    res: ResourceId,
    items: &[Arc<Value>],
    rv: u64,
    continue_token: Option<&str>,
) -> Bytes {
    let def = registry::def(res);
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(token) = continue_token {
        meta["continue"] = json!(token);
    }
    let head = json!({"kind": def.list_kind, "apiVersion": def.api_version, "metadata": meta});
    // Written by hand to avoid cloning every item into one big Value.
    let mut out = serde_json::to_vec(&head).unwrap_or_default();
    out.pop(); // the closing brace
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, &**item);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

async fn resource(
    ctx: &Ctx,
    target: Target,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let store = &ctx.store;
    let def = registry::def(target.res);
    let query = Query::parse(req.uri().query());
    let ns = target.namespace.as_deref();
    let method = req.method().clone();
    let watching = target.watch_prefix || query.bool("watch")?.unwrap_or(false);

    match (&method, target.name.as_deref()) {
        (&Method::GET, _) if watching => watch(ctx, &target, &query, ns),
        (&Method::GET, None) => {
            store.count("list");
            store.authorize("list", def, "")?;
            let opts = ListOptions::parse(&query, def, ns)?;
            let page = store.list(target.res, &opts)?;
            let body = list_body(
                target.res,
                &page.items,
                page.rv,
                page.continue_token.as_deref(),
            );
            Ok(bytes_response(StatusCode::OK, body))
        }
        (&Method::GET, Some(name)) => {
            store.count("get");
            let obj = store.get_object(target.res, ns, name)?;
            Ok(json_response(StatusCode::OK, &obj))
        }
        (&Method::POST, None) if !target.status => {
            store.count("create");
            if def.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed("POST"));
            }
            let dry_run = query.dry_run()?;
            let ct = content_type(&req);
            let obj = decode_object(&ct, &read_body(req.into_body()).await?)?;
            let created = store.create(target.res, ns, obj, dry_run)?;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (&Method::PUT, Some(name)) => {
            store.count("update");
            let dry_run = query.dry_run()?;
            let name = name.to_owned();
            let ct = content_type(&req);
            let obj = decode_object(&ct, &read_body(req.into_body()).await?)?;
            let updated = store.update(target.res, ns, &name, obj, target.status, dry_run)?;
            Ok(json_response(StatusCode::OK, &updated))
        }
        (&Method::PATCH, Some(name)) => patch_object(ctx, &target, &query, name, req).await,
        (&Method::DELETE, Some(name)) if !target.status => {
            delete_object(ctx, &target, &query, name, req).await
        }
        (&Method::DELETE, None) => {
            store.count("deletecollection");
            let filter = query.filter(def, ns)?;
            let (items, rv) = store.delete_collection(target.res, &filter, query.dry_run()?)?;
            Ok(bytes_response(
                StatusCode::OK,
                list_body(target.res, &items, rv, None),
            ))
        }
        _ => Err(ApiError::method_not_allowed(method.as_str())),
    }
}

/// A watch of a collection, or of one object (a watch with a name field selector).
fn watch(
    ctx: &Ctx,
    target: &Target,
    query: &Query,
    ns: Option<&str>,
) -> Result<Response<ResponseBody>, ApiError> {
    let store = &ctx.store;
    let def = registry::def(target.res);
    if target.status {
        return Err(ApiError::no_route());
    }
    store.count("watch");
    store.authorize("watch", def, "")?;
    let mut opts = WatchOptions::parse(query, def, ns, store.config().watch_list)?;
    if let Some(name) = &target.name {
        // Watching one object is a watch with a name field selector.
        let mut selector = query.get("fieldSelector").unwrap_or("").to_owned();
        if !selector.is_empty() {
            selector.push(',');
        }
        selector.push_str(&format!("metadata.name={name}"));
        opts.filter.field = FieldSelector::parse(&selector, def)?;
    }
    let current = || WatchFrom::After(store.resource_version());
    let (from, initial_events_end) = match (opts.send_initial_events, opts.resource_version) {
        (Some(true), _) => (WatchFrom::Current, true),
        (Some(false), None | Some(0)) => (current(), false),
        (None, None | Some(0)) => (WatchFrom::Current, false),
        (_, Some(rv)) => (WatchFrom::After(rv), false),
    };
    let spec = WatchSpec {
        res: target.res,
        opts,
        from,
        initial_events_end,
    };
    let body = watch_stream::start(store.clone(), spec, ctx.drop_tx.subscribe());
    let mut resp = Response::new(body);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

/// A patch of any type, server-side apply included, through the admission the store
/// records.
async fn patch_object(
    ctx: &Ctx,
    target: &Target,
    query: &Query,
    name: &str,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let (store, ns) = (&ctx.store, target.namespace.as_deref());
    let def = registry::def(target.res);
    store.count("patch");
    let dry_run = query.dry_run()?;
    let ty = PatchType::from_content_type(&content_type(&req))?;
    if ty == PatchType::Apply && query.get("fieldManager").is_none_or(str::is_empty) {
        return Err(ApiError::invalid(
            def.kind,
            name,
            "fieldManager: Required value: is required for apply patch",
        ));
    }
    let name = name.to_owned();
    store.admit_patch(
        def,
        PatchRecord {
            resource: def.plural.to_owned(),
            name: name.clone(),
            content_type: content_type(&req),
            field_manager: query.get("fieldManager").map(str::to_owned),
        },
    )?;
    let body = read_body(req.into_body()).await?;
    let patch = patch::decode_body(&body, ty == PatchType::Apply)?;
    let (obj, created) = store.patch(target.res, ns, &name, ty, &patch, target.status, dry_run)?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(code, &obj))
}

/// A delete, with the DeleteOptions that matter here: preconditions and dryRun
/// (propagationPolicy and grace periods are accepted and ignored: deletion is immediate).
async fn delete_object(
    ctx: &Ctx,
    target: &Target,
    query: &Query,
    name: &str,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let (store, ns) = (&ctx.store, target.namespace.as_deref());
    store.count("delete");
    let name = name.to_owned();
    let mut dry_run = query.dry_run()?;
    let body = read_body(req.into_body()).await?;
    // DeleteOptions: only preconditions and dryRun matter here; propagationPolicy
    // and grace periods are accepted and ignored (deletion is immediate).
    let options = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        patch::decode_body(&body, false)?
    };
    if options
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|d| d.iter().any(|v| v == "All"))
    {
        dry_run = true;
    }
    let uid = options
        .pointer("/preconditions/uid")
        .and_then(Value::as_str);
    let rv = options
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str);
    let deleted = store.delete_object(target.res, ns, &name, uid, rv, dry_run)?;
    Ok(json_response(StatusCode::OK, &deleted))
}
