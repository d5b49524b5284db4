//! Watching the API server: one kube-rs watcher per kind, decoded straight into the view's
//! lean wire structs and merged into one stream of [`Update`]s.
//!
//! kube-rs needs a type that implements `Resource`; [`Lean`] is that type for the wire
//! structs. It carries only the name, namespace and resourceVersion that the watcher itself
//! needs, so no full Kubernetes object is ever built.

use futures::{Stream, StreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use nodus_view::wire;
use nodus_view::{Kind, Update};
use serde::{Deserialize, Deserializer, de::DeserializeOwned};
use std::borrow::Cow;
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

/// A wire struct that kube-rs can list and watch.
pub trait WireKind: DeserializeOwned + Clone + Debug + Send + 'static {
    const KIND: Kind;
    const GROUP: &'static str;
    const VERSION: &'static str;
    const PLURAL: &'static str;
    /// How its labels are read: the few nodus acts on, or all of them.
    type Labels;
    fn meta(&self) -> &wire::Meta<Self::Labels>;
    fn into_update(self) -> Update;
}

impl WireKind for wire::Service {
    const KIND: Kind = Kind::Service;
    const GROUP: &'static str = "";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "services";
    type Labels = wire::Labels;
    fn meta(&self) -> &wire::Meta<wire::Labels> {
        &self.metadata
    }
    fn into_update(self) -> Update {
        Update::Service(Box::new(self))
    }
}

impl WireKind for wire::EndpointSlice {
    const KIND: Kind = Kind::EndpointSlice;
    const GROUP: &'static str = "discovery.k8s.io";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "endpointslices";
    type Labels = wire::Labels;
    fn meta(&self) -> &wire::Meta<wire::Labels> {
        &self.metadata
    }
    fn into_update(self) -> Update {
        Update::EndpointSlice(Box::new(self))
    }
}

impl WireKind for wire::Node {
    const KIND: Kind = Kind::Node;
    const GROUP: &'static str = "";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "nodes";
    type Labels = wire::Labels;
    fn meta(&self) -> &wire::Meta<wire::Labels> {
        &self.metadata
    }
    fn into_update(self) -> Update {
        Update::Node(Box::new(self))
    }
}

impl WireKind for wire::ServiceCidr {
    const KIND: Kind = Kind::ServiceCidr;
    const GROUP: &'static str = "networking.k8s.io";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "servicecidrs";
    type Labels = wire::Labels;
    fn meta(&self) -> &wire::Meta<wire::Labels> {
        &self.metadata
    }
    fn into_update(self) -> Update {
        Update::ServiceCidr(Box::new(self))
    }
}

impl WireKind for wire::Pod {
    const KIND: Kind = Kind::Pod;
    const GROUP: &'static str = "";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "pods";
    type Labels = wire::LabelMap;
    fn meta(&self) -> &wire::Meta<wire::LabelMap> {
        &self.metadata
    }
    fn into_update(self) -> Update {
        Update::Pod(Box::new(self))
    }
}

impl WireKind for wire::Namespace {
    const KIND: Kind = Kind::Namespace;
    const GROUP: &'static str = "";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "namespaces";
    type Labels = wire::LabelMap;
    fn meta(&self) -> &wire::Meta<wire::LabelMap> {
        &self.metadata
    }
    fn into_update(self) -> Update {
        Update::Namespace(Box::new(self))
    }
}

impl WireKind for wire::NetworkPolicy {
    const KIND: Kind = Kind::NetworkPolicy;
    const GROUP: &'static str = "networking.k8s.io";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "networkpolicies";
    type Labels = wire::Labels;
    fn meta(&self) -> &wire::Meta<wire::Labels> {
        &self.metadata
    }
    fn into_update(self) -> Update {
        Update::NetworkPolicy(Box::new(self))
    }
}

impl WireKind for wire::ConfigMap {
    const KIND: Kind = Kind::ConfigMap;
    const GROUP: &'static str = "";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "configmaps";
    type Labels = wire::Labels;
    fn meta(&self) -> &wire::Meta<wire::Labels> {
        &self.metadata
    }
    fn into_update(self) -> Update {
        Update::ConfigMap(Box::new(self))
    }
}

/// A wire object with the bit of `ObjectMeta` that kube-rs's watcher reads.
#[derive(Clone, Debug)]
pub struct Lean<T> {
    meta: ObjectMeta,
    pub object: T,
}

impl<'de, T: WireKind> Deserialize<'de> for Lean<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let object = T::deserialize(deserializer)?;
        let m = object.meta();
        let meta = ObjectMeta {
            name: Some(m.name.clone()),
            namespace: m.namespace.clone(),
            resource_version: m.resource_version.clone(),
            ..ObjectMeta::default()
        };
        Ok(Lean { meta, object })
    }
}

impl<T: WireKind> Resource for Lean<T> {
    type DynamicType = ();
    type Scope = kube::core::DynamicResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        T::KIND.as_str().into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        T::GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        T::VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        T::PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

/// Whether a plain `http://` API server is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlainHttp {
    /// The agent: its credentials and everything it programs would cross the network
    /// unprotected, so that anyone on the path could redirect the node's traffic.
    Refused,
    /// Told so (`--allow-http-api`, for test beds), or a command that only prints.
    Allowed,
}

/// How nodus finds the API server: `--kubeconfig`, else in-cluster, else `$KUBECONFIG`
/// (or `~/.kube/config`); `api_server` replaces the URL found.
pub async fn connect(
    kubeconfig: Option<&Path>,
    api_server: Option<&str>,
    plain_http: PlainHttp,
) -> anyhow::Result<Client> {
    use anyhow::Context;
    use kube::config::{Config, KubeConfigOptions, Kubeconfig};
    let mut config = if let Some(path) = kubeconfig {
        let file = Kubeconfig::read_from(path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?;
        Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("using kubeconfig {}", path.display()))?
    } else if std::env::var_os("KUBECONFIG").is_none()
        && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
    {
        // $KUBECONFIG, when set, wins over the in-cluster account, as it does for kubectl.
        Config::incluster().context("using the in-cluster service account")?
    } else {
        Config::from_kubeconfig(&KubeConfigOptions::default())
            .await
            .context(
                "no --kubeconfig, no usable $KUBECONFIG, not in a cluster, and no ~/.kube/config",
            )?
    };
    if let Some(url) = api_server {
        config.cluster_url = url.parse().with_context(|| format!("api_server {url:?}"))?;
    }
    if config.cluster_url.scheme_str() == Some("http") && plain_http == PlainHttp::Refused {
        anyhow::bail!(
            "the API server {} is plain http://: the node's credentials and the cluster's \
             state would cross the network unprotected; use https://, or pass \
             --allow-http-api (NODUS_ALLOW_HTTP_API=true) where that is intended, as in a \
             test bed",
            config.cluster_url
        );
    }
    client(config).context("building the API client")
}

/// Keepalive probes start after this long without traffic on an API connection...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
/// ...and repeat this often...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 3;
/// ...and a connection whose probes or data stay unacknowledged this long is dropped
/// (`TCP_USER_TIMEOUT`): a half-open watch (the server gone without a reset, a NAT entry
/// lost) is replaced within it instead of after kube-rs's five-minute idle timeout, and a
/// request on such a connection fails instead of waiting out TCP's retransmissions
/// (about 15 minutes).
const UNACKNOWLEDGED: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// kube's client stack (TLS, the API's address, credentials, impersonation headers) over a
/// connector whose sockets notice a dead peer.
fn client(config: kube::Config) -> anyhow::Result<Client> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    tcp.set_keepalive(Some(KEEPALIVE_IDLE));
    tcp.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    tcp.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    tcp.set_tcp_user_timeout(Some(UNACKNOWLEDGED));
    let connector = config.rustls_https_connector_with_connector(tcp)?;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}

/// What to watch.
#[derive(Clone, Debug)]
pub struct WatchSet {
    pub page_size: u32,
    /// Watch every Node (the mesh needs them all) rather than only `node_name`.
    pub all_nodes: bool,
    pub node_name: String,
    /// Watch ServiceCIDRs (the proxy drops their unallocated addresses; DNS answers their
    /// reverse names).
    pub service_cidrs: bool,
    /// Watch this node's Pods (DNS tells who asks by them).
    pub local_pods: bool,
    /// Watch every Namespace (DNS answers NODATA, not NXDOMAIN, for one that holds no
    /// Service, as CoreDNS does); policy selects by their labels.
    pub namespaces: bool,
    /// Watch every Pod, Namespace and NetworkPolicy (NetworkPolicy enforcement).
    pub policy: bool,
    /// Watch the cluster's DNS ConfigMap, `namespace/name` (its stub domains and
    /// upstreams).
    pub dns_config_map: Option<(String, String)>,
}

impl WatchSet {
    /// What `config`'s subsystems need, on the node `node_name`.
    pub fn of(config: &crate::config::Config, node_name: &str) -> WatchSet {
        let dns = config.dns.enabled;
        WatchSet {
            page_size: config.watch_page_size,
            all_nodes: config.mesh.enabled,
            node_name: node_name.to_string(),
            // The proxy drops their unallocated addresses; DNS answers their reverse names.
            service_cidrs: config.proxy.enabled || dns,
            local_pods: dns && config.dns.autopath,
            namespaces: dns,
            policy: config.policy.enabled,
            dns_config_map: config
                .dns
                .config_map()
                .filter(|_| dns)
                .map(|(namespace, name)| (namespace.to_string(), name.to_string())),
        }
    }
}

/// Pods come in pages of at most this many: a Pod is ten times the size of the other
/// objects, and kube-rs holds a whole page's text while it decodes it.
const POD_PAGE_MAX: u32 = 50;

/// One item of the merged watch stream.
#[derive(Debug)]
pub enum WatchItem {
    Update(Update),
    /// nodus-cni asks for a new pod's isolation ([`crate::agent::gate`]).
    Sandbox(crate::agent::gate::Claim),
    /// A watch failed; kube-rs retries with backoff and relists when it must.
    Restarted(Kind, String),
    /// Time passed: periodic work runs even when the cluster is quiet.
    Tick,
}

/// The API server has never reached the revision a watch resumes from: it runs another
/// history (restored from a backup whose revisions were not bumped, or a new etcd).
/// kube-rs retries such a watch as it is, forever; only a fresh list can catch up.
fn is_another_history(error: &watcher::Error) -> bool {
    error.to_string().contains("Too large resource version")
}

/// The list of a kind was answered 404 (a cluster before 1.33 has no ServiceCIDRs) or 403
/// (the agent's RBAC predates the kind).
fn is_refused(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => {
            matches!(status.code, 403 | 404)
        }
        _ => false,
    }
}

/// Whether the view needs a kind to be complete.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Presence {
    Required,
    /// A kind the cluster may not serve, or not let nodus read: a refused list counts as
    /// an empty one, so that the view completes without it, and the list is tried again
    /// after [`REFUSED_RECHECK`].
    Optional,
}

/// How long a refused optional kind waits before it is listed again: the cluster may be
/// upgraded, or the RBAC fixed, while nodus runs.
const REFUSED_RECHECK: Duration = Duration::from_secs(300);

/// One kind's watch: kube-rs's watcher, started again (with a fresh list) when the server
/// turns out to run another history, or after a pause when an optional kind is refused.
fn kind_stream<T: WireKind>(
    api: Api<Lean<T>>,
    config: watcher::Config,
    presence: Presence,
) -> impl Stream<Item = WatchItem> + Send {
    let refused = Arc::new(AtomicBool::new(false));
    let reported = Arc::new(AtomicBool::new(false));
    let pause = refused.clone();
    stream::unfold((), move |()| {
        let pause = pause.clone();
        async move {
            if pause.swap(false, Relaxed) {
                tokio::time::sleep(REFUSED_RECHECK).await;
            }
            Some(((), ()))
        }
    })
    .flat_map(move |()| {
        let (refused, reported) = (refused.clone(), reported.clone());
        // The item that ends a watcher is passed on; it stops at the watcher's next item.
        watcher::watcher(api.clone(), config.clone())
            .default_backoff()
            .scan(false, move |ended, event| {
                if *ended {
                    return futures::future::ready(None);
                }
                let item = match event {
                    Err(error) if is_another_history(&error) => {
                        tracing::warn!(
                            kind = T::KIND.as_str(),
                            "the API server runs another resourceVersion history; listing afresh"
                        );
                        *ended = true;
                        WatchItem::Restarted(T::KIND, error.to_string())
                    }
                    Err(error) if presence == Presence::Optional && is_refused(&error) => {
                        if !reported.swap(true, Relaxed) {
                            tracing::warn!(
                                kind = T::KIND.as_str(),
                                %error,
                                "the API server does not serve this kind, or nodus may not \
                                 list it; going on without it, and trying again every 5 minutes"
                            );
                        }
                        refused.store(true, Relaxed);
                        *ended = true;
                        WatchItem::Update(Update::RelistDone(T::KIND))
                    }
                    event => watch_item(event),
                };
                futures::future::ready(Some(item))
            })
    })
}

fn watch_item<T: WireKind>(event: watcher::Result<Event<Lean<T>>>) -> WatchItem {
    match event {
        Ok(Event::Init) => WatchItem::Update(Update::RelistStarted(T::KIND)),
        Ok(Event::InitApply(o) | Event::Apply(o)) => WatchItem::Update(o.object.into_update()),
        Ok(Event::Delete(o)) => WatchItem::Update(Update::Deleted {
            kind: T::KIND,
            namespace: o.object.meta().namespace.clone().unwrap_or_default(),
            name: o.object.meta().name.clone(),
        }),
        Ok(Event::InitDone) => WatchItem::Update(Update::RelistDone(T::KIND)),
        Err(err) => WatchItem::Restarted(T::KIND, err.to_string()),
    }
}

/// The merged stream of every watch nodus needs, and the kinds it must list before the
/// view is complete.
pub fn watch_all(
    client: &Client,
    set: &WatchSet,
) -> (impl Stream<Item = WatchItem> + Send + use<>, Vec<Kind>) {
    let config = watcher::Config::default().page_size(set.page_size);
    let nodes = if set.all_nodes {
        Some(config.clone())
    } else if !set.node_name.is_empty() {
        Some(
            config
                .clone()
                .fields(&format!("metadata.name={}", set.node_name)),
        )
    } else {
        None
    };
    let mut kinds = vec![Kind::Service, Kind::EndpointSlice];
    let mut streams = vec![
        kind_stream::<wire::Service>(Api::all(client.clone()), config.clone(), Presence::Required)
            .boxed(),
        kind_stream::<wire::EndpointSlice>(
            Api::all(client.clone()),
            config.clone(),
            Presence::Required,
        )
        .boxed(),
    ];
    if let Some(node_config) = nodes {
        kinds.push(Kind::Node);
        streams.push(
            kind_stream::<wire::Node>(Api::all(client.clone()), node_config, Presence::Required)
                .boxed(),
        );
    }
    if set.policy || (set.local_pods && !set.node_name.is_empty()) {
        let mut pods = watcher::Config::default().page_size(set.page_size.min(POD_PAGE_MAX));
        // Policies must not be enforced from a partial picture: with them on, a refused
        // list holds the view back rather than letting every pod through.
        let pod_presence = if set.policy {
            Presence::Required
        } else {
            Presence::Optional
        };
        if !set.policy {
            pods = pods.fields(&format!("spec.nodeName={}", set.node_name));
        }
        kinds.push(Kind::Pod);
        streams
            .push(kind_stream::<wire::Pod>(Api::all(client.clone()), pods, pod_presence).boxed());
    }
    if set.namespaces || set.policy {
        // Without policy, a refused list only leaves empty namespaces NXDOMAIN.
        let presence = if set.policy {
            Presence::Required
        } else {
            Presence::Optional
        };
        kinds.push(Kind::Namespace);
        streams.push(
            kind_stream::<wire::Namespace>(Api::all(client.clone()), config.clone(), presence)
                .boxed(),
        );
    }
    if set.policy {
        kinds.push(Kind::NetworkPolicy);
        streams.push(
            kind_stream::<wire::NetworkPolicy>(
                Api::all(client.clone()),
                config.clone(),
                Presence::Required,
            )
            .boxed(),
        );
    }
    if set.service_cidrs {
        kinds.push(Kind::ServiceCidr);
        streams.push(
            kind_stream::<wire::ServiceCidr>(
                Api::all(client.clone()),
                config.clone(),
                Presence::Optional,
            )
            .boxed(),
        );
    }
    if let Some((namespace, name)) = &set.dns_config_map {
        // A missing ConfigMap, or one nodus may not read, leaves forwarding as configured.
        kinds.push(Kind::ConfigMap);
        let one = config.fields(&format!("metadata.name={name}"));
        streams.push(
            kind_stream::<wire::ConfigMap>(
                Api::namespaced_with(client.clone(), namespace, &()),
                one,
                Presence::Optional,
            )
            .boxed(),
        );
    }
    (stream::select_all(streams), kinds)
}
