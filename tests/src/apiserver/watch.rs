//! Watch streams: one task per watch, following the store's event log and writing
//! newline-delimited `{"type":…,"object":…}` events into a chunked response body.
//!
//! A watch never blocks writers: it reads the log under the store lock in bounded batches and
//! serializes outside it. A watch that falls behind the log (or resumes from before it) gets
//! upstream's HTTP 200 plus one `ERROR` event with a 410 Status, which is what makes kube-rs
//! relist.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::query::{Filter, WatchOptions};
use super::registry::{self, ResourceId};
use super::store::{Event, EventType, Store, WatchFrom};

/// Upstream picks a random timeout in [30 min, 60 min) when the client gives none.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);
/// Log entries read per lock acquisition.
const BATCH: usize = 1000;
/// Flush the output buffer once it holds this much.
const CHUNK: usize = 64 * 1024;

/// A response body: a whole buffer, or the chunks a watch task sends.
#[derive(Debug)]
pub(crate) enum ResponseBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ResponseBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ResponseBody::Stream(rx) => rx.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, ResponseBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ResponseBody::Full(None) => SizeHint::with_exact(0),
            ResponseBody::Stream(_) => SizeHint::default(),
        }
    }
}

/// What a watch request asked for, after routing.
#[derive(Debug)]
pub(crate) struct WatchSpec {
    pub res: ResourceId,
    pub opts: WatchOptions,
    pub from: WatchFrom,
    /// Watch-list: end the initial events with an `initial-events-end` bookmark.
    pub initial_events_end: bool,
}

/// How the open watches are to end, each time `generation` changes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WatchEnd {
    pub(crate) generation: u64,
    /// In the middle of an event rather than between two.
    pub(crate) mid_object: bool,
}

/// Spawns the watch task and returns the body it feeds. `drop_rx` ends the stream when the
/// server's drop-watches generation changes or the server goes away.
pub(crate) fn start(
    store: Store,
    spec: WatchSpec,
    drop_rx: watch::Receiver<WatchEnd>,
) -> ResponseBody {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(run(store, spec, tx, drop_rx));
    ResponseBody::Stream(rx)
}

/// Buffers event lines and sends them as body chunks.
struct Out {
    tx: mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl Out {
    fn event(&mut self, kind: &str, object: &Value) {
        self.buf.extend_from_slice(b"{\"type\":\"");
        self.buf.extend_from_slice(kind.as_bytes());
        self.buf.extend_from_slice(b"\",\"object\":");
        // Serializing a Value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.buf, object);
        self.buf.extend_from_slice(b"}\n");
    }

    fn bookmark(&mut self, res: ResourceId, rv: u64, initial_events_end: bool) {
        let def = registry::def(res);
        let mut object = json!({
            "kind": def.kind,
            "apiVersion": def.api_version,
            "metadata": {"resourceVersion": rv.to_string(), "creationTimestamp": null},
        });
        if initial_events_end {
            object["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        self.event("BOOKMARK", &object);
    }

    fn expired(&mut self, message: &str) {
        let status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "Expired",
            "code": 410,
        });
        self.event("ERROR", &status);
    }

    /// Sends what is buffered; false once the client has gone.
    async fn flush(&mut self) -> bool {
        if self.buf.is_empty() {
            return !self.tx.is_closed();
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.tx.send(chunk).await.is_ok()
    }

    async fn flush_if_full(&mut self) -> bool {
        if self.buf.len() >= CHUNK {
            self.flush().await
        } else {
            true
        }
    }
}

/// The event a watcher with `filter` sees for `e`, if any. An object modified into the
/// selection is ADDED, one modified out of it is DELETED (with its previous content and the
/// event's revision), as upstream's watch cache does.
fn translate(e: &Event, filter: &Filter) -> Option<(EventType, Arc<Value>)> {
    let ns = e.key.0.as_str();
    let now = filter.matches(ns, &e.object);
    match e.kind {
        EventType::Added | EventType::Deleted => now.then(|| (e.kind, e.object.clone())),
        EventType::Modified => {
            let before = e.old.as_ref().is_some_and(|o| filter.matches(ns, o));
            match (before, now) {
                (true, true) => Some((EventType::Modified, e.object.clone())),
                (false, true) => Some((EventType::Added, e.object.clone())),
                (true, false) => {
                    let mut gone = e.old.as_deref().cloned().unwrap_or(Value::Null);
                    if let Some(meta) = gone.get_mut("metadata").and_then(Value::as_object_mut) {
                        meta.insert("resourceVersion".into(), Value::String(e.rv.to_string()));
                    }
                    Some((EventType::Deleted, Arc::new(gone)))
                }
                (false, false) => None,
            }
        }
    }
}

async fn run(
    store: Store,
    spec: WatchSpec,
    tx: mpsc::Sender<Bytes>,
    mut drop_rx: watch::Receiver<WatchEnd>,
) {
    let WatchSpec {
        res,
        opts,
        from,
        initial_events_end,
    } = spec;
    let deadline = Instant::now() + opts.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let interval = store
        .config()
        .bookmark_interval
        .max(Duration::from_millis(10));
    let mut rv_rx = store.subscribe();
    rv_rx.borrow_and_update();
    let mut out = Out {
        tx,
        buf: Vec::new(),
    };

    let (initial, mut cursor) = match store.watch_start(res, from, &opts.filter) {
        Ok(start) => start,
        Err(error) => {
            out.event("ERROR", &error.to_status());
            out.flush().await;
            return;
        }
    };
    for obj in &initial {
        out.event("ADDED", obj);
        if !out.flush_if_full().await {
            return;
        }
    }
    drop(initial);
    if initial_events_end {
        out.bookmark(res, cursor, true);
    }
    if !out.flush().await {
        return;
    }

    let mut next_bookmark = Instant::now() + interval;
    loop {
        rv_rx.borrow_and_update();
        let more = match store.events_after(res, cursor, BATCH) {
            Ok((events, new_cursor, more)) => {
                for e in &events {
                    if let Some((kind, obj)) = translate(e, &opts.filter) {
                        out.event(kind.as_str(), &obj);
                        if !out.flush_if_full().await {
                            return;
                        }
                    }
                }
                cursor = new_cursor;
                more
            }
            Err(message) => {
                out.expired(&message);
                out.flush().await;
                return;
            }
        };
        if opts.allow_bookmarks && Instant::now() >= next_bookmark {
            out.bookmark(res, cursor, false);
            next_bookmark = Instant::now() + interval;
        }
        if !out.flush().await {
            return;
        }
        if more {
            continue;
        }
        tokio::select! {
            _ = out.tx.closed() => return,
            // A new drop generation, or the server is gone.
            _ = drop_rx.changed() => {
                if drop_rx.borrow().mid_object {
                    out.buf.extend_from_slice(
                        br#"{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"#,
                    );
                    out.flush().await;
                }
                return;
            }
            () = tokio::time::sleep_until(deadline) => {
                if opts.allow_bookmarks {
                    out.bookmark(res, cursor, false);
                    out.flush().await;
                }
                return;
            }
            changed = rv_rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep_until(next_bookmark), if opts.allow_bookmarks => {}
        }
    }
}
