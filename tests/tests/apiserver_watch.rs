//! The API-server stand-in driven by kube-rs over real HTTP: watcher list/watch, relists after
//! 410, server restarts, watch-list, pagination, selectors and write conflicts.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_fn};
use kube::{Client, ResourceExt as _};
use nodus_testbed::apiserver::{
    ApiServer, ApiServerConfig, ServerHandle, Store, WATCH_LIST_FORBIDDEN, serve,
};
use serde_json::{Value, json};

/// Upper bound for any single wait; a broken server fails the test instead of hanging it.
const WAIT: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn client(server: &ServerHandle) -> Client {
    let config = kube::Config::new(server.url().parse().expect("server URL parses"));
    Client::try_from(config).expect("client builds")
}

fn service(ns: &str, name: &str, labels: Value) -> Value {
    let spec = json!({"ports": [{"port": 80, "protocol": "TCP"}], "clusterIP": "10.96.0.10"});
    let mut service = nodus_testbed::fixtures::service(ns, name, spec);
    service["metadata"]["labels"] = labels;
    service
}

async fn start(config: ApiServerConfig) -> (Store, ServerHandle) {
    let store = Store::new(config);
    let server = ApiServer::start(store.clone())
        .await
        .expect("server starts");
    (store, server)
}

/// The next non-error watcher event (errors are retried by the watcher itself).
async fn next_event<S>(stream: &mut S, what: &str) -> Event<Service>
where
    S: Stream<Item = Result<Event<Service>, watcher::Error>> + Unpin,
{
    within(what, async {
        loop {
            match stream.next().await {
                Some(Ok(event)) => return event,
                Some(Err(_)) => continue,
                None => panic!("watcher ended while waiting for {what}"),
            }
        }
    })
    .await
}

/// Reads one initial listing (Init … InitDone) and returns the names it carried.
async fn initial_names<S>(stream: &mut S) -> BTreeSet<String>
where
    S: Stream<Item = Result<Event<Service>, watcher::Error>> + Unpin,
{
    let mut names = BTreeSet::new();
    match next_event(stream, "Init").await {
        Event::Init => {}
        other => panic!("expected Init, got {other:?}"),
    }
    loop {
        match next_event(stream, "InitApply/InitDone").await {
            Event::InitApply(svc) => {
                names.insert(svc.name_any());
            }
            Event::InitDone => return names,
            other => panic!("unexpected event during the initial list: {other:?}"),
        }
    }
}

/// Waits for an `Apply` (or `Delete` when `deleted`) of `name`, skipping others.
async fn wait_for<S>(stream: &mut S, name: &str, deleted: bool) -> Service
where
    S: Stream<Item = Result<Event<Service>, watcher::Error>> + Unpin,
{
    loop {
        match next_event(stream, name).await {
            Event::Apply(svc) if !deleted && svc.name_any() == name => return svc,
            Event::Delete(svc) if deleted && svc.name_any() == name => return svc,
            _ => {}
        }
    }
}

fn names(n: usize, prefix: &str) -> BTreeSet<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[tokio::test]
async fn watcher_pages_the_initial_list_then_streams_changes() {
    let (store, server) = start(ApiServerConfig::default()).await;
    for i in 0..5 {
        store
            .apply_value(service("a", &format!("s{i}"), json!({})))
            .expect("seed");
    }
    let api: Api<Service> = Api::all(client(&server));
    let mut stream = watch_fn(api, watcher::Config::default().page_size(2))
        .default_backoff()
        .boxed();
    assert_eq!(initial_names(&mut stream).await, names(5, "s"));
    assert!(
        store.request_counts().get("list").copied().unwrap_or(0) >= 3,
        "5 objects in pages of 2 take 3 list calls: {:?}",
        store.request_counts()
    );

    let ns_api: Api<Service> = Api::namespaced(client(&server), "b");
    let created: Service = serde_json::from_value(service("b", "live", json!({}))).expect("typed");
    ns_api
        .create(&PostParams::default(), &created)
        .await
        .expect("create");
    let seen = wait_for(&mut stream, "live", false).await;
    assert_eq!(seen.namespace().as_deref(), Some("b"));
    assert!(seen.uid().is_some());

    ns_api
        .delete("live", &Default::default())
        .await
        .expect("delete");
    wait_for(&mut stream, "live", true).await;
    server.shutdown().await;
}

#[tokio::test]
async fn compaction_and_dropped_watches_make_the_watcher_relist() {
    let (store, server) = start(ApiServerConfig::default()).await;
    store
        .apply_value(service("a", "before", json!({})))
        .expect("seed");
    let api: Api<Service> = Api::all(client(&server));
    let mut stream = watch_fn(api, watcher::Config::default().page_size(2))
        .default_backoff()
        .boxed();
    assert_eq!(
        initial_names(&mut stream).await,
        ["before".to_owned()].into()
    );

    // Wait until the watch is really open: a change made now must stream.
    store
        .apply_value(service("a", "second", json!({})))
        .expect("apply");
    wait_for(&mut stream, "second", false).await;
    let lists_before = store.request_counts().get("list").copied().unwrap_or(0);

    store.force_compaction();
    server.drop_watches();
    let relisted = initial_names(&mut stream).await;
    assert_eq!(relisted, ["before".to_owned(), "second".to_owned()].into());
    assert!(store.request_counts().get("list").copied().unwrap_or(0) > lists_before);

    store
        .apply_value(service("a", "after", json!({})))
        .expect("apply");
    wait_for(&mut stream, "after", false).await;
    server.shutdown().await;
}

#[tokio::test]
async fn watcher_survives_a_restart_on_the_same_port() {
    let (store, server) = start(ApiServerConfig::default()).await;
    store
        .apply_value(service("a", "s0", json!({})))
        .expect("seed");
    let addr = server.addr();
    let api: Api<Service> = Api::all(client(&server));
    let mut stream = watch_fn(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    initial_names(&mut stream).await;
    store
        .apply_value(service("a", "s1", json!({})))
        .expect("apply");
    wait_for(&mut stream, "s1", false).await;

    server.shutdown().await;
    // A change while the server is down is delivered when the watch resumes.
    store
        .apply_value(service("a", "while-down", json!({})))
        .expect("apply");
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("the port is free again");
    let server = serve(store.clone(), listener)
        .await
        .expect("server restarts");
    wait_for(&mut stream, "while-down", false).await;

    store
        .apply_value(service("a", "after-restart", json!({})))
        .expect("apply");
    wait_for(&mut stream, "after-restart", false).await;
    store
        .delete("v1", "Service", Some("a"), "s0")
        .expect("delete");
    wait_for(&mut stream, "s0", true).await;
    server.shutdown().await;
}

#[tokio::test]
async fn streaming_lists_use_watch_list() {
    let (store, server) = start(ApiServerConfig::default()).await;
    for i in 0..3 {
        store
            .apply_value(service("a", &format!("s{i}"), json!({})))
            .expect("seed");
    }
    let api: Api<Service> = Api::all(client(&server));
    let mut stream = watch_fn(api, watcher::Config::default().streaming_lists())
        .default_backoff()
        .boxed();
    assert_eq!(initial_names(&mut stream).await, names(3, "s"));
    assert_eq!(
        store.request_counts().get("list"),
        None,
        "watch-list needs no list call"
    );
    store
        .apply_value(service("a", "s9", json!({})))
        .expect("apply");
    wait_for(&mut stream, "s9", false).await;
    server.shutdown().await;
}

#[tokio::test]
async fn streaming_lists_fail_when_watch_list_is_disabled() {
    let (_store, server) = start(ApiServerConfig {
        watch_list: false,
        ..Default::default()
    })
    .await;
    let api: Api<Service> = Api::all(client(&server));
    let mut stream = watch_fn(api, watcher::Config::default().streaming_lists()).boxed();
    let first = within("the watcher's first item", stream.next()).await;
    match first {
        Some(Err(err)) => {
            let text = format!("{err:?}");
            assert!(
                text.contains(WATCH_LIST_FORBIDDEN),
                "unexpected error: {text}"
            );
            assert!(text.contains("422"), "unexpected error: {text}");
        }
        other => panic!("expected a watch start error, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn pagination_returns_every_object_exactly_once() {
    let (store, server) = start(ApiServerConfig::default()).await;
    let mut expected = BTreeSet::new();
    for ns in ["a", "b", "c"] {
        for i in 0..9 {
            store
                .apply_value(service(ns, &format!("s{i}"), json!({})))
                .expect("seed");
            expected.insert(format!("{ns}/s{i}"));
        }
    }
    let api: Api<Service> = Api::all(client(&server));
    let mut seen = Vec::new();
    let mut params = ListParams::default().limit(4);
    let mut first_rv = None;
    loop {
        let page = within("a list page", api.list(&params))
            .await
            .expect("list");
        let rv = page.metadata.resource_version.clone();
        assert_eq!(
            *first_rv.get_or_insert(rv.clone()),
            rv,
            "every page is at one revision"
        );
        assert!(page.items.len() <= 4);
        seen.extend(
            page.items
                .iter()
                .map(|s| format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any())),
        );
        // Writes between pages must not leak into later pages.
        store
            .apply_value(service("b", &format!("zz{}", seen.len()), json!({})))
            .expect("apply");
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => {
                params = ListParams::default().limit(4).continue_token(&token)
            }
            _ => break,
        }
    }
    assert_eq!(seen.len(), expected.len(), "no duplicates: {seen:?}");
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), expected);

    // Namespaced lists page too.
    let b: Api<Service> = Api::namespaced(client(&server), "b");
    let page = b
        .list(&ListParams::default().limit(100))
        .await
        .expect("list");
    assert!(
        page.items
            .iter()
            .all(|s| s.namespace().as_deref() == Some("b"))
    );
    assert!(page.metadata.continue_.is_none_or(|c| c.is_empty()));
    server.shutdown().await;
}

#[tokio::test]
async fn an_expired_continue_token_gives_410() {
    let (store, server) = start(ApiServerConfig::default()).await;
    for i in 0..5 {
        store
            .apply_value(service("a", &format!("s{i}"), json!({})))
            .expect("seed");
    }
    let api: Api<Service> = Api::all(client(&server));
    let page = api
        .list(&ListParams::default().limit(2))
        .await
        .expect("list");
    let token = page.metadata.continue_.expect("more pages");
    store.force_compaction();
    match api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn resuming_before_the_event_log_gives_a_410_event() {
    let (store, server) = start(ApiServerConfig {
        history: 4,
        ..Default::default()
    })
    .await;
    let first = store
        .apply_value(service("a", "s0", json!({})))
        .expect("seed");
    let rv = first["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_owned();
    for i in 1..10 {
        store
            .apply_value(service("a", &format!("s{i}"), json!({})))
            .expect("apply");
    }
    let api: Api<Service> = Api::all(client(&server));
    // HTTP 200, then one ERROR event (what makes kube-rs relist).
    let mut events = api
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch starts")
        .boxed();
    match within("the error event", events.next()).await {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
            assert!(
                status.message.starts_with("too old resource version"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn selectors_filter_lists_and_watches() {
    let config = ApiServerConfig {
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    };
    let (store, server) = start(config).await;
    store
        .apply_value(service("a", "web", json!({"app": "web", "tier": "front"})))
        .expect("seed");
    store
        .apply_value(service("a", "db", json!({"app": "db"})))
        .expect("seed");
    store
        .apply_value(service("b", "cache", json!({"app": "cache"})))
        .expect("seed");
    let api: Api<Service> = Api::all(client(&server));
    let list_names = |params: ListParams| {
        let api = api.clone();
        async move {
            let list = api.list(&params).await.expect("list");
            list.items.iter().map(|s| s.name_any()).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        list_names(ListParams::default().labels("app in (web,db)")).await,
        ["db", "web"]
    );
    assert_eq!(
        list_names(ListParams::default().labels("tier")).await,
        ["web"]
    );
    assert_eq!(
        list_names(ListParams::default().labels("!tier,app!=db")).await,
        ["cache"]
    );
    assert_eq!(
        list_names(ListParams::default().labels("app notin (web)")).await,
        ["db", "cache"]
    );
    assert_eq!(
        list_names(ListParams::default().fields("metadata.namespace=b")).await,
        ["cache"]
    );
    assert_eq!(
        list_names(ListParams::default().fields("metadata.name!=db,metadata.namespace==a")).await,
        ["web"]
    );
    match api
        .list(&ListParams::default().fields("spec.nodeName=x"))
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 400),
        other => panic!("expected 400 for an unsupported field, got {other:?}"),
    }

    // Pods by node: a pod scheduled onto the node is ADDED, moved away is DELETED.
    let pods: Api<Pod> = Api::all(client(&server));
    let pod = |node: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})
    };
    store.apply_value(pod("other")).expect("seed pod");
    let params = WatchParams::default().fields("spec.nodeName=n1");
    let mut events = pods.watch(&params, "0").await.expect("watch").boxed();
    store.apply_value(pod("n1")).expect("move in");
    store.apply_value(pod("n2")).expect("move out");
    let mut kinds = Vec::new();
    let mut bookmarks = 0;
    within("pod events", async {
        while kinds.len() < 2 || bookmarks == 0 {
            match events.next().await {
                Some(Ok(WatchEvent::Added(p))) => {
                    kinds.push(("ADDED", p.spec.and_then(|s| s.node_name)))
                }
                Some(Ok(WatchEvent::Deleted(p))) => {
                    kinds.push(("DELETED", p.spec.and_then(|s| s.node_name)))
                }
                Some(Ok(WatchEvent::Bookmark(_))) => bookmarks += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await;
    assert_eq!(
        kinds,
        [
            ("ADDED", Some("n1".to_owned())),
            ("DELETED", Some("n1".to_owned()))
        ]
    );
    assert_eq!(list_names_pods(&pods, "spec.nodeName=n2").await, ["p"]);
    server.shutdown().await;
}

async fn list_names_pods(pods: &Api<Pod>, fields: &str) -> Vec<String> {
    let list = pods
        .list(&ListParams::default().fields(fields))
        .await
        .expect("list pods");
    list.items.iter().map(|p| p.name_any()).collect()
}

#[tokio::test]
async fn a_stale_resource_version_conflicts() {
    let (store, server) = start(ApiServerConfig::default()).await;
    store
        .apply_value(service("a", "s", json!({})))
        .expect("seed");
    let api: Api<Service> = Api::namespaced(client(&server), "a");
    let original = api.get("s").await.expect("get");
    let mut changed = original.clone();
    changed.labels_mut().insert("v".into(), "2".into());
    let updated = api
        .replace("s", &PostParams::default(), &changed)
        .await
        .expect("replace");
    assert_ne!(updated.resource_version(), original.resource_version());
    let mut stale = original.clone();
    stale.labels_mut().insert("v".into(), "3".into());
    match api.replace("s", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 409);
            assert_eq!(status.reason, "Conflict");
        }
        other => panic!("expected 409 Conflict, got {other:?}"),
    }
    match api.create(&PostParams::default(), &original).await {
        Err(kube::Error::Api(status)) => assert_eq!(
            (status.code, status.reason.as_str()),
            (409, "AlreadyExists")
        ),
        other => panic!("expected 409 AlreadyExists, got {other:?}"),
    }
    match api.get("missing").await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"))
        }
        other => panic!("expected 404, got {other:?}"),
    }
    server.shutdown().await;
}

/// The scale-bench shape: 10,000 Services and 10,000 EndpointSlices, listed in pages of 100
/// and then watched. Correctness only; no timing assertions.
#[tokio::test]
async fn bulk_load_pages_and_watch() {
    let (store, server) = start(ApiServerConfig::default()).await;
    for i in 0..10_000 {
        let ns = format!("ns{}", i % 10);
        store
            .apply_value(service(&ns, &format!("svc{i}"), json!({"app": "bulk"})))
            .expect("service");
        let endpoints: Vec<Value> = (0..10)
            .map(|e| json!({"addresses": [format!("10.{}.{}.{e}", i / 256 % 256, i % 256)], "conditions": {"ready": true}}))
            .collect();
        store
            .apply_value(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("svc{i}-abcde"), "namespace": ns,
                             "labels": {"kubernetes.io/service-name": format!("svc{i}")}},
                "addressType": "IPv4", "endpoints": endpoints,
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            }))
            .expect("endpointslice");
    }
    let slices: Api<EndpointSlice> = Api::all(client(&server));
    let mut stream = watch_fn(slices, watcher::Config::default().page_size(100))
        .default_backoff()
        .boxed();
    let mut count = 0;
    within("the initial list of 10,000 slices", async {
        loop {
            match stream.next().await {
                Some(Ok(Event::InitApply(_))) => count += 1,
                Some(Ok(Event::InitDone)) => break,
                Some(_) => {}
                None => panic!("watcher ended"),
            }
        }
    })
    .await;
    assert_eq!(count, 10_000);
    assert_eq!(store.request_counts().get("list").copied(), Some(100));
    store
        .delete(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            Some("ns3"),
            "svc3-abcde",
        )
        .expect("delete");
    within("the delete event", async {
        loop {
            if let Some(Ok(Event::Delete(s))) = stream.next().await {
                assert_eq!(s.name_any(), "svc3-abcde");
                break;
            }
        }
    })
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_second_listener_serves_the_same_store() {
    let (store, server) = start(ApiServerConfig::default()).await;
    store
        .apply_value(service("a", "shared", json!({})))
        .expect("seed");
    let extra = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let extra_url = format!("http://{}", extra.local_addr().expect("addr"));
    server.add_listener(extra).expect("add listener");
    let config = kube::Config::new(extra_url.parse().expect("URL parses"));
    let api: Api<Service> = Api::namespaced(Client::try_from(config).expect("client"), "a");
    let got = within("a get on the second listener", api.get("shared"))
        .await
        .expect("get");
    assert_eq!(got.name_any(), "shared");
    server.shutdown().await;
}
