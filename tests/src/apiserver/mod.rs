//! An in-process stand-in for kube-apiserver, faithful enough for kube-rs watchers and kubectl.
//!
//! No real API server can be installed in the test bed, so this serves the handful of kinds a
//! node agent reads (core/v1 `namespaces`, `nodes`, `pods`, `services`, `configmaps`;
//! `discovery.k8s.io/v1` `endpointslices`) over plain HTTP/1.1, storing objects
//! schema-agnostically as JSON. What it implements like upstream:
//!
//! - one global resourceVersion; every write bumps it; creates fill `uid`,
//!   `creationTimestamp`, `generation` (bumped when anything outside `metadata`/`status`
//!   changes) and the namespace from the path; `generateName`; no-op writes change nothing;
//! - list with `limit`/`continue` (later pages are served at the first page's revision,
//!   rebuilt from the event log), `resourceVersion` + `resourceVersionMatch`
//!   (`NotOlderThan`, `Exact`), label selectors and per-kind field selectors (an unsupported
//!   field is 400);
//! - watch with resume after a revision, synthetic `ADDED` for the current state when
//!   starting from `0`/nothing, periodic `BOOKMARK`s, `timeoutSeconds`, selectors (objects
//!   modified into or out of a selection become `ADDED`/`DELETED`), a bounded event log whose
//!   overrun gives HTTP 200 plus an `ERROR` event with a 410 Status, and watch-list
//!   (`sendInitialEvents`) with its `k8s.io/initial-events-end` bookmark, or its 1.33
//!   rejection when [`ApiServerConfig::watch_list`] is off;
//! - create/update/patch/delete with upstream's status codes and `metav1.Status` errors,
//!   resourceVersion preconditions (409 Conflict), `dryRun=All`, and `/status` subresources
//!   (writes to the main resource keep `.status`; writes to `/status` change only `.status`).
//!
//! What is simplified, on purpose:
//!
//! - **Patches.** Strategic merge patch is a merge patch that merges lists of objects by the
//!   merge keys upstream declares for these kinds (from a built-in table, no OpenAPI) and
//!   honours kubectl's `$` directives. Server-side apply (`application/apply-patch+yaml`) is
//!   an upsert plus merge patch: there is no field ownership, `managedFields`, or conflict
//!   detection, and `force` is ignored. JSON patch is supported.
//! - **Deletes** are immediate: no graceful deletion, finalizers or owner-reference
//!   garbage collection; `propagationPolicy` is ignored. Deleting a namespace deletes its
//!   contents at once.
//! - **No admission or defaulting**: no namespace-existence check (writes into a missing
//!   namespace succeed), no ClusterIP allocation, no schema validation (`fieldValidation`
//!   is accepted and ignored), and `status` given on create is kept.
//! - **Lists with `resourceVersion=0`** are answered like upstream's watch cache: the whole
//!   current state, ignoring `limit`. With `resourceVersion=N` and no `Exact`, the current
//!   state is served (upstream may serve a cached state at least as new as `N`).
//!   `remainingItemCount` is never set.
//! - **Continue tokens and `Exact` lists** work while the revision is still in the event log
//!   ([`ApiServerConfig::history`] events); older ones give 410 Expired, like a compacted
//!   etcd.
//! - **Discovery** is legacy (unaggregated) only, and `/openapi/*` is 404, so `kubectl apply`
//!   needs `--validate=false`. Responses are JSON only (no `Table`, no protobuf); kubectl
//!   prints lists as `NAME AGE`.
//! - No TLS or authentication, and no RBAC beyond [`Store::forbid`], which makes a verb
//!   (PATCH, list, watch) on a resource answer 403 as a missing RBAC rule would. Accepted patches are
//!   recorded with their media type and `fieldManager` ([`Store::patches`]).

mod discovery;
mod error;
mod http;
mod kubeconfig;
mod meta;
mod patch;
mod query;
mod registry;
mod selector;
mod store;
mod watch;

use std::time::Duration;

pub use error::ApiError;
pub use http::{ServerHandle, serve};
pub use kubeconfig::{CONTEXT, write_kubeconfig};
pub use query::WATCH_LIST_FORBIDDEN;
pub use store::{PatchRecord, Store};

/// Knobs of a [`Store`] and the servers serving it.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Events kept for watch resumption, continue tokens and `Exact` lists.
    pub history: usize,
    /// How often a watch with `allowWatchBookmarks=true` gets a `BOOKMARK`.
    pub bookmark_interval: Duration,
    /// Whether watch-list (`sendInitialEvents`) is served; off answers 422 like a 1.33 server.
    pub watch_list: bool,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        ApiServerConfig {
            history: 10_000,
            bookmark_interval: Duration::from_secs(5),
            watch_list: true,
        }
    }
}

/// A stand-in server bound to an ephemeral port on 127.0.0.1, serving a fresh store; handy
/// for tests. Use [`serve`] to choose the listener or share a [`Store`].
pub struct ApiServer;

impl ApiServer {
    /// Serves `store` on a new ephemeral port on 127.0.0.1.
    pub async fn start(store: Store) -> anyhow::Result<ServerHandle> {
        use anyhow::Context as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding 127.0.0.1:0")?;
        serve(store, listener).await
    }
}
