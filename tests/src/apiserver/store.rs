//! The object store: one ordered map per kind, one global resourceVersion, and a bounded event
//! log that serves watches, watch resumption, and consistent paginated lists.
//!
//! Every write bumps the global revision and appends an event carrying the new object and the
//! one it replaced. The log lets the store rebuild the state of a kind at any revision still
//! covered by it (current map, with the pre-image of every key changed since laid over it);
//! that is how later pages of a paginated list stay consistent with the first page, and how
//! `resourceVersionMatch=Exact` lists are answered. A revision older than the log gives
//! 410 Expired, like a compacted etcd.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::Context as _;
use base64::Engine as _;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::ApiServerConfig;
use super::error::ApiError;
use super::meta;
use super::patch::{self, PatchType};
use super::query::{Filter, ListOptions, RvMatch};
use super::registry::{self, NAMESPACES, RESOURCES, ResourceDef, ResourceId};

/// `(namespace, name)`; the namespace is empty for cluster-scoped kinds. Ordering by this key
/// gives lists in upstream's order (etcd key order) and O(page) continue-token seeks.
pub(crate) type Key = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed write.
#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub resource: ResourceId,
    pub kind: EventType,
    pub key: Key,
    /// The object after the write; for `Deleted`, the last state stamped with the deletion RV.
    pub object: Arc<Value>,
    /// The object before the write (`None` for `Added`).
    pub old: Option<Arc<Value>>,
}

#[derive(Debug)]
struct State {
    rv: u64,
    objects: Vec<BTreeMap<Key, Arc<Value>>>,
    log: VecDeque<Arc<Event>>,
    /// Every event with a larger revision is still in `log`.
    log_base: u64,
    /// Set by `force_compaction`: clients may not resume from a smaller revision.
    compacted: u64,
}

impl State {
    /// The oldest revision a client may resume a watch, continue a list, or list exactly at.
    fn resumable_from(&self) -> u64 {
        self.log_base.max(self.compacted)
    }
}

#[derive(Debug)]
struct Inner {
    config: ApiServerConfig,
    state: Mutex<State>,
    /// The latest revision, so watches wake up on writes.
    rv_tx: watch::Sender<u64>,
    counts: Mutex<BTreeMap<String, u64>>,
    /// Verbs on resources (plural) refused with 403, as a missing RBAC rule would.
    forbidden: Mutex<BTreeSet<(String, String)>>,
    patches: Mutex<Vec<PatchRecord>>,
}

/// One PATCH request the server accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchRecord {
    pub resource: String,
    pub name: String,
    /// The request's media type, e.g. `application/merge-patch+json`.
    pub content_type: String,
    pub field_manager: Option<String>,
}

/// The object state of the stand-in. Cheap to clone (an `Arc` inside); a store outlives the
/// servers that serve it, so a test can restart the server on the same state.
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// One page of a list.
#[derive(Debug)]
pub(crate) struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub rv: u64,
    pub continue_token: Option<String>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WatchFrom {
    /// Synthetic `ADDED` events for the current state first.
    Current,
    /// Only events after this revision.
    After(u64),
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    ns: String,
    name: String,
}

/// The initial revision; "0" means "any" to clients, so real revisions start above it.
const FIRST_RV: u64 = 1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the maps half-updated in a way later
    // requests care about, so keep serving rather than poisoning every request.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn set_resource_version(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn invalid_name(def: &ResourceDef, name: &str) -> ApiError {
    ApiError::invalid(
        def.kind,
        name,
        format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist \
             of lower case alphanumeric characters, '-' or '.', and must start and end with an \
             alphanumeric character"
        ),
    )
}

/// Whether `name` is a lowercase RFC 1123 subdomain, as upstream requires for these kinds.
fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 253
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'.')
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// Everything but `metadata` and `status`: what `metadata.generation` tracks.
fn spec_part(obj: &Value) -> Map<String, Value> {
    obj.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks an incoming object against the URL and fills `apiVersion`, `kind`, `namespace`
/// and (when the body has none) `name`. Returns the object and its key; the name may still
/// be empty on create (`generateName`).
fn prepare(
    def: &ResourceDef,
    path_namespace: Option<&str>,
    path_name: Option<&str>,
    mut obj: Value,
) -> Result<(Value, Key), ApiError> {
    let Value::Object(map) = &mut obj else {
        return Err(ApiError::bad_request("the object must be a JSON object"));
    };
    for (field, expected) in [("apiVersion", def.api_version), ("kind", def.kind)] {
        match map.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == expected || s.is_empty() => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({other}) does not match the expected {field} ({expected})"
                )));
            }
        }
        map.insert(field.into(), Value::String(expected.into()));
    }
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(meta) = meta else {
        return Err(ApiError::bad_request("metadata must be an object"));
    };
    let body_name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let name = match path_name {
        Some(p) if !body_name.is_empty() && body_name != p => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({p})"
            )));
        }
        Some(p) => p.to_owned(),
        None => body_name,
    };
    if !name.is_empty() {
        meta.insert("name".into(), Value::String(name.clone()));
    }
    let namespace = if def.namespaced {
        let body_ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
        let ns = match path_namespace {
            Some(p) if !body_ns.is_empty() && body_ns != p => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            Some(p) => p.to_owned(),
            None if body_ns.is_empty() => "default".to_owned(),
            None => body_ns.to_owned(),
        };
        meta.insert("namespace".into(), Value::String(ns.clone()));
        ns
    } else {
        meta.remove("namespace");
        String::new()
    };
    Ok((obj, (namespace, name)))
}

/// Carries server-owned fields from `old` into an update and recomputes `generation`.
///
/// `status_only` takes only `.status` from `new` (the `/status` subresource);
/// `keep_status` ignores `.status` in `new` (the main resource of a kind with a status
/// subresource), as upstream's update strategies do.
/// A write carrying a non-empty `metadata.resourceVersion` must be based on the stored one.
fn check_precondition(
    def: &ResourceDef,
    old: &Value,
    precondition: Option<&str>,
) -> Result<(), ApiError> {
    match precondition {
        Some(rv) if !rv.is_empty() && Some(rv) != meta_str(old, "resourceVersion") => {
            Err(ApiError::conflict(def, meta_str(old, "name").unwrap_or("")))
        }
        _ => Ok(()),
    }
}

fn merge_update(
    def: &ResourceDef,
    old: &Value,
    new: Value,
    status_only: bool,
    keep_status: bool,
) -> Value {
    let mut out = if status_only {
        let mut out = old.clone();
        match new.get("status") {
            Some(s) => out["status"] = s.clone(),
            None => {
                if let Some(m) = out.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        out
    } else {
        let mut out = new;
        if keep_status && def.has_status {
            match (old.get("status"), out.as_object_mut()) {
                (Some(s), Some(m)) => {
                    m.insert("status".into(), s.clone());
                }
                (None, Some(m)) => {
                    m.remove("status");
                }
                _ => {}
            }
        }
        out
    };
    let generation = old
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let generation = if spec_part(old) != spec_part(&out) {
        generation + 1
    } else {
        generation
    };
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["uid", "creationTimestamp", "resourceVersion"] {
            match old.get("metadata").and_then(|m| m.get(field)) {
                Some(v) => meta.insert(field.into(), v.clone()),
                None => meta.remove(field),
            };
        }
        meta.insert("generation".into(), json!(generation));
        meta.remove("managedFields");
    }
    out
}

impl Store {
    pub fn new(config: ApiServerConfig) -> Store {
        let (rv_tx, _) = watch::channel(FIRST_RV);
        Store {
            inner: Arc::new(Inner {
                config,
                state: Mutex::new(State {
                    rv: FIRST_RV,
                    objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
                    log: VecDeque::new(),
                    log_base: FIRST_RV,
                    compacted: 0,
                }),
                rv_tx,
                counts: Mutex::new(BTreeMap::new()),
                forbidden: Mutex::new(BTreeSet::new()),
                patches: Mutex::new(Vec::new()),
            }),
        }
    }

    pub fn config(&self) -> &ApiServerConfig {
        &self.inner.config
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.inner.state).rv
    }

    /// HTTP requests served so far, by verb (`list`, `watch`, `get`, `create`, `update`,
    /// `patch`, `delete`, `deletecollection`). Writes through this API are not counted.
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        lock(&self.inner.counts).clone()
    }

    /// Refuses (or, with `false`, allows again) `verb` (`patch`, `list`, `watch`) on
    /// `plural` with 403 Forbidden.
    pub fn forbid(&self, verb: &str, plural: &str, forbidden: bool) {
        let mut set = lock(&self.inner.forbidden);
        let rule = (verb.to_owned(), plural.to_owned());
        if forbidden {
            set.insert(rule);
        } else {
            set.remove(&rule);
        }
    }

    /// 403 if [`Store::forbid`] refuses `verb` on `def`.
    pub(crate) fn authorize(
        &self,
        verb: &str,
        def: &ResourceDef,
        name: &str,
    ) -> Result<(), ApiError> {
        let rule = (verb.to_owned(), def.plural.to_owned());
        if lock(&self.inner.forbidden).contains(&rule) {
            Err(ApiError::forbidden(verb, def, name))
        } else {
            Ok(())
        }
    }

    /// Every PATCH accepted so far, in order.
    pub fn patches(&self) -> Vec<PatchRecord> {
        lock(&self.inner.patches).clone()
    }

    /// Checks a PATCH against [`Store::forbid`] and records it when allowed.
    pub(crate) fn admit_patch(
        &self,
        def: &ResourceDef,
        record: PatchRecord,
    ) -> Result<(), ApiError> {
        self.authorize("patch", def, &record.name)?;
        lock(&self.inner.patches).push(record);
        Ok(())
    }

    pub(crate) fn count(&self, verb: &str) {
        *lock(&self.inner.counts).entry(verb.to_owned()).or_default() += 1;
    }

    /// Makes every revision a client may hold stale: it bumps the revision (an empty write)
    /// and forbids resuming from anything older, so watch resumes and continue tokens get
    /// 410. Open watches keep streaming; combine with `ServerHandle::drop_watches` to make
    /// clients resume (and relist).
    pub fn force_compaction(&self) {
        let rv = {
            let mut st = lock(&self.inner.state);
            st.rv += 1;
            st.compacted = st.rv;
            st.rv
        };
        self.inner.rv_tx.send_replace(rv);
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.rv_tx.subscribe()
    }

    /// Runs a write under the lock and wakes watches if it committed anything.
    fn write<T>(&self, f: impl FnOnce(&mut State) -> Result<T, ApiError>) -> Result<T, ApiError> {
        let (result, before, after) = {
            let mut st = lock(&self.inner.state);
            let before = st.rv;
            let result = f(&mut st);
            (result, before, st.rv)
        };
        if after != before {
            self.inner.rv_tx.send_replace(after);
        }
        result
    }

    fn push_event(&self, st: &mut State, event: Event) {
        st.log.push_back(Arc::new(event));
        let cap = self.inner.config.history.max(1);
        while st.log.len() > cap {
            if let Some(e) = st.log.pop_front() {
                st.log_base = e.rv;
            }
        }
    }

    fn commit_put(
        &self,
        st: &mut State,
        res: ResourceId,
        key: Key,
        mut obj: Value,
        old: Option<Arc<Value>>,
    ) -> Arc<Value> {
        st.rv += 1;
        set_resource_version(&mut obj, st.rv);
        let obj = Arc::new(obj);
        st.objects[res].insert(key.clone(), obj.clone());
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        let rv = st.rv;
        self.push_event(
            st,
            Event {
                rv,
                resource: res,
                kind,
                key,
                object: obj.clone(),
                old,
            },
        );
        obj
    }

    fn commit_delete(
        &self,
        st: &mut State,
        res: ResourceId,
        key: Key,
        old: Arc<Value>,
    ) -> Arc<Value> {
        st.rv += 1;
        st.objects[res].remove(&key);
        let mut obj = (*old).clone();
        set_resource_version(&mut obj, st.rv);
        let obj = Arc::new(obj);
        let rv = st.rv;
        self.push_event(
            st,
            Event {
                rv,
                resource: res,
                kind: EventType::Deleted,
                key,
                object: obj.clone(),
                old: Some(old),
            },
        );
        obj
    }

    /// Fills server-owned metadata of a new object.
    fn init_metadata(obj: &mut Value) {
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), Value::String(meta::new_uid()));
            meta.insert(
                "creationTimestamp".into(),
                Value::String(meta::now_rfc3339()),
            );
            meta.insert("generation".into(), json!(1));
            meta.remove("resourceVersion");
            meta.remove("managedFields");
            meta.remove("deletionTimestamp");
        }
    }

    /// `POST` on a collection.
    pub(crate) fn create(
        &self,
        res: ResourceId,
        namespace: Option<&str>,
        obj: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let def = registry::def(res);
        let (mut obj, (ns, mut name)) = prepare(def, namespace, None, obj)?;
        let generate = if name.is_empty() {
            meta_str(&obj, "generateName")
                .filter(|g| !g.is_empty())
                .map(str::to_owned)
        } else {
            None
        };
        if name.is_empty() && generate.is_none() {
            return Err(ApiError::invalid(
                def.kind,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
        Self::init_metadata(&mut obj);
        self.write(|st| {
            if let Some(prefix) = &generate {
                // Upstream retries on a clash too; five random characters rarely clash.
                for _ in 0..16 {
                    name = format!("{prefix}{}", meta::name_suffix());
                    if !st.objects[res].contains_key(&(ns.clone(), name.clone())) {
                        break;
                    }
                }
                obj["metadata"]["name"] = Value::String(name.clone());
            }
            if !valid_name(&name) {
                return Err(invalid_name(def, &name));
            }
            let key = (ns.clone(), name.clone());
            if st.objects[res].contains_key(&key) {
                return Err(ApiError::already_exists(def, &name));
            }
            if dry_run {
                return Ok(Arc::new(obj));
            }
            Ok(self.commit_put(st, res, key, obj, None))
        })
    }

    /// `GET` on an object.
    pub(crate) fn get_object(
        &self,
        res: ResourceId,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let def = registry::def(res);
        let key = (namespace.unwrap_or("").to_owned(), name.to_owned());
        lock(&self.inner.state).objects[res]
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))
    }

    /// Replaces an existing object with `new` (already merged with server-owned fields),
    /// skipping no-op writes like upstream.
    fn replace(
        &self,
        st: &mut State,
        res: ResourceId,
        key: Key,
        old: Arc<Value>,
        new: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        if new == *old || dry_run {
            return Ok(if dry_run { Arc::new(new) } else { old });
        }
        Ok(self.commit_put(st, res, key, new, Some(old)))
    }

    /// `PUT` on an object or its `/status`.
    pub(crate) fn update(
        &self,
        res: ResourceId,
        namespace: Option<&str>,
        name: &str,
        obj: Value,
        status_only: bool,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let def = registry::def(res);
        let (obj, key) = prepare(def, namespace, Some(name), obj)?;
        let precondition = meta_str(&obj, "resourceVersion").map(str::to_owned);
        self.write(|st| {
            let old = st.objects[res]
                .get(&key)
                .cloned()
                .ok_or_else(|| ApiError::not_found(def, name))?;
            check_precondition(def, &old, precondition.as_deref())?;
            let new = merge_update(def, &old, obj, status_only, true);
            self.replace(st, res, key, old, new, dry_run)
        })
    }

    /// `PATCH` on an object or its `/status`. Returns the object and whether it was created
    /// (only server-side apply creates).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn patch(
        &self,
        res: ResourceId,
        namespace: Option<&str>,
        name: &str,
        ty: PatchType,
        body: &Value,
        status_only: bool,
        dry_run: bool,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let def = registry::def(res);
        let key = (namespace.unwrap_or("").to_owned(), name.to_owned());
        if ty == PatchType::Apply {
            // Upstream rejects apply configurations without type and name.
            for field in ["apiVersion", "kind"] {
                if body
                    .get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    return Err(ApiError::bad_request(format!(
                        "{field} must be set in an apply configuration"
                    )));
                }
            }
        }
        let precondition = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_owned);
        self.write(|st| {
            let Some(old) = st.objects[res].get(&key).cloned() else {
                if ty != PatchType::Apply || status_only {
                    return Err(ApiError::not_found(def, name));
                }
                // Merging onto nothing drops the nulls an apply configuration may carry.
                let mut fresh = Value::Object(Map::new());
                patch::apply(&mut fresh, PatchType::Merge, body)?;
                let (mut obj, key) = prepare(def, namespace, Some(name), fresh)?;
                if !valid_name(name) {
                    return Err(invalid_name(def, name));
                }
                Self::init_metadata(&mut obj);
                if dry_run {
                    return Ok((Arc::new(obj), true));
                }
                return Ok((self.commit_put(st, res, key, obj, None), true));
            };
            let mut patched = (*old).clone();
            patch::apply(&mut patched, ty, body)?;
            let (patched, key) = prepare(def, namespace, Some(name), patched)?;
            check_precondition(def, &old, precondition.as_deref())?;
            let new = merge_update(def, &old, patched, status_only, true);
            Ok((self.replace(st, res, key, old, new, dry_run)?, false))
        })
    }

    /// `DELETE` on an object. Deletion is immediate (no graceful period, no finalizers);
    /// deleting a namespace first deletes everything in it.
    pub(crate) fn delete_object(
        &self,
        res: ResourceId,
        namespace: Option<&str>,
        name: &str,
        precondition_uid: Option<&str>,
        precondition_rv: Option<&str>,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let def = registry::def(res);
        let key = (namespace.unwrap_or("").to_owned(), name.to_owned());
        self.write(|st| {
            let old = st.objects[res]
                .get(&key)
                .cloned()
                .ok_or_else(|| ApiError::not_found(def, name))?;
            let uid_ok =
                precondition_uid.is_none_or(|u| u.is_empty() || Some(u) == meta_str(&old, "uid"));
            let rv_ok = precondition_rv
                .is_none_or(|r| r.is_empty() || Some(r) == meta_str(&old, "resourceVersion"));
            if !uid_ok || !rv_ok {
                return Err(ApiError::conflict(def, name));
            }
            if dry_run {
                return Ok(old);
            }
            if res == NAMESPACES {
                let namespaced = RESOURCES.iter().enumerate().filter(|(_, d)| d.namespaced);
                for id in namespaced.map(|(id, _)| id) {
                    let doomed: Vec<(Key, Arc<Value>)> = st.objects[id]
                        .range((name.to_owned(), String::new())..)
                        .take_while(|(k, _)| k.0 == name)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    for (k, v) in doomed {
                        self.commit_delete(st, id, k, v);
                    }
                }
            }
            Ok(self.commit_delete(st, res, key, old))
        })
    }

    /// `DELETE` on a collection: deletes every object the filter matches.
    pub(crate) fn delete_collection(
        &self,
        res: ResourceId,
        filter: &Filter,
        dry_run: bool,
    ) -> Result<(Vec<Arc<Value>>, u64), ApiError> {
        let keys: Vec<Key> = {
            let st = lock(&self.inner.state);
            st.objects[res]
                .iter()
                .filter(|(k, v)| filter.matches(&k.0, v))
                .map(|(k, _)| k.clone())
                .collect()
        };
        let mut deleted = Vec::with_capacity(keys.len());
        for (ns, name) in keys {
            let ns = (!ns.is_empty()).then_some(ns);
            match self.delete_object(res, ns.as_deref(), &name, None, None, dry_run) {
                Ok(obj) => deleted.push(obj),
                // Deleted concurrently: fine, it is gone either way.
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok((deleted, self.resource_version()))
    }

    /// Visits the objects of `res` as they were at revision `at`, in key order, starting
    /// after `after`, until `visit` returns false. The caller has checked that `at` is
    /// still covered by the log.
    fn scan_at(
        st: &State,
        res: ResourceId,
        namespace: Option<&str>,
        after: Option<&Key>,
        at: u64,
        mut visit: impl FnMut(&Key, &Arc<Value>) -> bool,
    ) {
        // Pre-images of keys changed since `at`: `None` when the key did not exist then.
        let mut overlay: BTreeMap<&Key, Option<&Arc<Value>>> = BTreeMap::new();
        if at < st.rv {
            let start = st.log.partition_point(|e| e.rv <= at);
            for e in st.log.range(start..).filter(|e| e.resource == res) {
                overlay.entry(&e.key).or_insert(match e.kind {
                    EventType::Added => None,
                    EventType::Modified | EventType::Deleted => e.old.as_ref(),
                });
            }
        }
        let lower = match (after, namespace) {
            (Some(k), _) => Bound::Excluded(k.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_owned(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut current = st.objects[res]
            .range((lower.clone(), Bound::Unbounded))
            .peekable();
        let mut old = overlay
            .iter()
            .filter(|(k, _)| match &lower {
                Bound::Excluded(l) => **k > l,
                Bound::Included(l) => **k >= l,
                Bound::Unbounded => true,
            })
            .map(|(k, v)| (*k, *v))
            .peekable();
        loop {
            let (key, value) = match (current.peek().copied(), old.peek().copied()) {
                (None, None) => break,
                (Some(c), None) => {
                    current.next();
                    (c.0, Some(c.1))
                }
                (None, Some(o)) => {
                    old.next();
                    o
                }
                (Some(c), Some(o)) => match c.0.cmp(o.0) {
                    std::cmp::Ordering::Less => {
                        current.next();
                        (c.0, Some(c.1))
                    }
                    std::cmp::Ordering::Greater => {
                        old.next();
                        o
                    }
                    std::cmp::Ordering::Equal => {
                        current.next();
                        old.next();
                        o
                    }
                },
            };
            if let Some(ns) = namespace {
                match key.0.as_str().cmp(ns) {
                    std::cmp::Ordering::Less => continue,
                    std::cmp::Ordering::Greater => break,
                    std::cmp::Ordering::Equal => {}
                }
            }
            if let Some(value) = value
                && !visit(key, value)
            {
                break;
            }
        }
    }

    fn encode_continue(rv: u64, key: &Key) -> String {
        let token = ContinueToken {
            v: "meta.k8s.io/v1".into(),
            rv,
            ns: key.0.clone(),
            name: key.1.clone(),
        };
        let json = serde_json::to_vec(&token).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    fn decode_continue(token: &str) -> Result<ContinueToken, ApiError> {
        let bad = |why: String| ApiError::bad_request(format!("continue key is not valid: {why}"));
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .map_err(|e| bad(e.to_string()))?;
        let token: ContinueToken =
            serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if token.v != "meta.k8s.io/v1" {
            return Err(bad(format!("unknown version {}", token.v)));
        }
        Ok(token)
    }

    /// A list (one page of it when `limit` is set).
    ///
    /// `resourceVersion=0` (with or without `NotOlderThan`) is served like upstream's watch
    /// cache: the whole current state, ignoring `limit`. Otherwise `limit` is honoured, and
    /// later pages are served at the first page's revision.
    pub(crate) fn list(&self, res: ResourceId, opts: &ListOptions) -> Result<ListPage, ApiError> {
        let st = lock(&self.inner.state);
        let (at, after, limit) = if let Some(token) = &opts.continue_token {
            let token = Self::decode_continue(token)?;
            if token.rv < st.resumable_from() {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter.",
                ));
            }
            (token.rv, Some((token.ns, token.name)), opts.limit)
        } else {
            match (opts.resource_version, opts.rv_match) {
                (None, _) => (st.rv, None, opts.limit),
                (Some(0), _) => (st.rv, None, None),
                (Some(rv), _) if rv > st.rv => {
                    return Err(ApiError::too_large_resource_version(rv, st.rv));
                }
                (Some(rv), Some(RvMatch::Exact)) => {
                    if rv < st.resumable_from() {
                        return Err(ApiError::expired(
                            "The resourceVersion for the provided list is too old.",
                        ));
                    }
                    (rv, None, opts.limit)
                }
                (Some(_), _) => (st.rv, None, opts.limit),
            }
        };
        let namespace = opts.filter.namespace.as_deref();
        let mut items = Vec::new();
        let mut last: Option<Key> = None;
        let mut more = false;
        Self::scan_at(&st, res, namespace, after.as_ref(), at, |key, obj| {
            if !opts.filter.matches(&key.0, obj) {
                return true;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                return false;
            }
            items.push(obj.clone());
            last = Some(key.clone());
            true
        });
        let continue_token = match (more, &last) {
            (true, Some(key)) => Some(Self::encode_continue(at, key)),
            _ => None,
        };
        Ok(ListPage {
            items,
            rv: at,
            continue_token,
        })
    }

    /// Starts a watch: returns the synthetic initial objects (for `WatchFrom::Current`) and
    /// the revision the watch continues after, or the "too old" message of a 410.
    pub(crate) fn watch_start(
        &self,
        res: ResourceId,
        from: WatchFrom,
        filter: &Filter,
    ) -> Result<(Vec<Arc<Value>>, u64), ApiError> {
        let st = lock(&self.inner.state);
        match from {
            WatchFrom::Current => {
                let mut items = Vec::new();
                Self::scan_at(
                    &st,
                    res,
                    filter.namespace.as_deref(),
                    None,
                    st.rv,
                    |key, obj| {
                        if filter.matches(&key.0, obj) {
                            items.push(obj.clone());
                        }
                        true
                    },
                );
                Ok((items, st.rv))
            }
            WatchFrom::After(rv) if rv < st.resumable_from() => Err(ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                st.resumable_from() + 1
            ))),
            // A revision this store never reached: the client saw another history (an
            // API server restored from a backup whose revisions were not bumped).
            WatchFrom::After(rv) if rv > st.rv => {
                Err(ApiError::too_large_resource_version(rv, st.rv))
            }
            WatchFrom::After(rv) => Ok((Vec::new(), rv)),
        }
    }

    /// Events of `res` after `cursor`, scanning at most `max` log entries. Returns them, the
    /// new cursor and whether more are pending; an error (the 410 message) if the log no
    /// longer reaches back to `cursor`.
    pub(crate) fn events_after(
        &self,
        res: ResourceId,
        cursor: u64,
        max: usize,
    ) -> Result<(Vec<Arc<Event>>, u64, bool), String> {
        let st = lock(&self.inner.state);
        if cursor < st.log_base {
            return Err(format!(
                "too old resource version: {cursor} ({})",
                st.log_base + 1
            ));
        }
        let start = st.log.partition_point(|e| e.rv <= cursor);
        let mut events = Vec::new();
        let mut new_cursor = cursor.max(st.rv);
        let mut more = false;
        for (scanned, e) in st.log.range(start..).enumerate() {
            if scanned == max {
                new_cursor = e.rv - 1;
                more = true;
                break;
            }
            if e.resource == res {
                events.push(e.clone());
            }
        }
        Ok((events, new_cursor, more))
    }

    // ----- The library API used by tests and the binary. -----

    fn resolve(api_version: &str, kind: &str) -> anyhow::Result<ResourceId> {
        registry::by_kind(api_version, kind)
            .with_context(|| format!("the stand-in does not serve {api_version} {kind}"))
    }

    /// Creates or replaces an object by `apiVersion`/`kind`/namespace/name, emitting ADDED
    /// or MODIFIED (nothing if it is unchanged). Namespaced objects without a namespace go to
    /// `default`. The whole object is stored as given, `status` included; server-owned
    /// metadata (uid, creationTimestamp, generation, resourceVersion) is filled in.
    pub fn apply_value(&self, obj: Value) -> anyhow::Result<Value> {
        let field = |f: &str| obj.get(f).and_then(Value::as_str).unwrap_or("").to_owned();
        let (api_version, kind) = (field("apiVersion"), field("kind"));
        let res = Self::resolve(&api_version, &kind)?;
        let def = registry::def(res);
        let (mut obj, key) = prepare(def, None, None, obj).context("invalid object")?;
        anyhow::ensure!(
            valid_name(&key.1),
            "invalid or missing metadata.name {:?} for {kind}",
            key.1
        );
        let stored = self
            .write(|st| match st.objects[res].get(&key).cloned() {
                Some(old) => {
                    let new = merge_update(def, &old, obj, false, false);
                    self.replace(st, res, key, old, new, false)
                }
                None => {
                    Self::init_metadata(&mut obj);
                    Ok(self.commit_put(st, res, key, obj, None))
                }
            })
            .with_context(|| format!("storing {kind}"))?;
        Ok((*stored).clone())
    }

    /// Deletes an object, emitting DELETED. Errors if it does not exist.
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> anyhow::Result<()> {
        let res = Self::resolve(api_version, kind)?;
        let namespace = Self::key_namespace(res, namespace);
        self.delete_object(res, namespace, name, None, None, false)
            .with_context(|| format!("deleting {kind} {name}"))?;
        Ok(())
    }

    /// An object by type, namespace (`None` means `default` for namespaced kinds) and name.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let res = Self::resolve(api_version, kind).ok()?;
        let namespace = Self::key_namespace(res, namespace);
        self.get_object(res, namespace, name)
            .ok()
            .map(|o| (*o).clone())
    }

    fn key_namespace(res: ResourceId, namespace: Option<&str>) -> Option<&str> {
        if registry::def(res).namespaced {
            Some(namespace.unwrap_or("default"))
        } else {
            None
        }
    }

    /// Loads multi-document YAML (or JSON) through [`Store::apply_value`]; `kind: List` (or
    /// any `…List` with `items`) is unpacked. Returns the number of objects stored.
    pub fn load_yaml_str(&self, yaml: &str) -> anyhow::Result<usize> {
        let mut count = 0;
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(yaml).context("parsing the YAML documents")?;
        for (i, value) in documents.into_iter().enumerate() {
            if value.is_null() {
                continue;
            }
            let is_list = value
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List"))
                && value.get("items").is_some_and(Value::is_array);
            let objects = if is_list {
                value
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            } else {
                vec![value]
            };
            for obj in objects {
                self.apply_value(obj)
                    .with_context(|| format!("loading YAML document {}", i + 1))?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Loads a YAML file, or every `*.yaml`, `*.yml` and `*.json` file directly in a
    /// directory (in name order). Returns the number of objects stored.
    pub fn load_path(&self, path: &Path) -> anyhow::Result<usize> {
        if path.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(path)
                .with_context(|| format!("reading directory {}", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && p.extension()
                            .and_then(|e| e.to_str())
                            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
                })
                .collect();
            files.sort();
            let mut count = 0;
            for file in files {
                count += self.load_path(&file)?;
            }
            Ok(count)
        } else {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            self.load_yaml_str(&text)
                .with_context(|| format!("loading {}", path.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::query::Query;

    fn svc(name: &str, ns: &str, app: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}, "spec": {"ports": [{"port": 80}]}})
    }

    fn list(store: &Store, query: &str) -> Result<ListPage, ApiError> {
        let def = &RESOURCES[3];
        let opts = ListOptions::parse(&Query::parse(Some(query)), def, None)?;
        store.list(3, &opts)
    }

    #[test]
    fn pages_are_consistent_under_writes() {
        let store = Store::new(ApiServerConfig::default());
        for i in 0..10 {
            store
                .apply_value(svc(&format!("s{i}"), "a", "x"))
                .expect("apply");
        }
        let first = list(&store, "limit=4").expect("list");
        assert_eq!(first.items.len(), 4);
        // Writes after the first page must not show up in later pages.
        store
            .delete("v1", "Service", Some("a"), "s5")
            .expect("delete");
        store.apply_value(svc("s55", "a", "x")).expect("apply");
        store.apply_value(svc("s6", "a", "changed")).expect("apply");
        let mut names: Vec<String> = first
            .items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_owned())
            .collect();
        let mut token = first.continue_token;
        while let Some(t) = token {
            let page = list(&store, &format!("limit=4&continue={t}")).expect("page");
            assert_eq!(page.rv, first.rv);
            for o in &page.items {
                names.push(o["metadata"]["name"].as_str().unwrap_or("").to_owned());
                if o["metadata"]["name"] == "s6" {
                    assert_eq!(o["metadata"]["labels"]["app"], "x");
                }
            }
            token = page.continue_token;
        }
        let expected: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
        assert_eq!(names, expected);
        store.force_compaction();
        let again = list(&store, "limit=4").expect("list");
        let t = again.continue_token.expect("more pages");
        store.force_compaction();
        assert_eq!(
            list(&store, &format!("continue={t}"))
                .map_err(|e| e.code)
                .err(),
            Some(410)
        );
    }

    #[test]
    fn no_op_writes_keep_the_revision() {
        let store = Store::new(ApiServerConfig::default());
        let a = store.apply_value(svc("s", "a", "x")).expect("apply");
        let rv = store.resource_version();
        let b = store.apply_value(svc("s", "a", "x")).expect("apply");
        assert_eq!(a, b);
        assert_eq!(store.resource_version(), rv);
        let c = store.apply_value(svc("s", "a", "y")).expect("apply");
        assert_eq!(c["metadata"]["generation"], 1, "labels are not spec");
        assert_eq!(c["metadata"]["uid"], a["metadata"]["uid"]);
        assert_eq!(store.resource_version(), rv + 1);
    }

    #[test]
    fn load_yaml_multi_document_and_list() {
        let store = Store::new(ApiServerConfig::default());
        let n = store
            .load_yaml_str(
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}\n- {apiVersion: v1, kind: Node, metadata: {name: n1, namespace: ignored}}\n",
            )
            .expect("load");
        assert_eq!(n, 3);
        assert!(store.get("v1", "ConfigMap", None, "c").is_some());
        assert!(store.get("v1", "Node", None, "n1").is_some());
        assert!(
            store
                .load_yaml_str("apiVersion: v9\nkind: Foo\nmetadata: {name: x}\n")
                .is_err()
        );
    }
}
