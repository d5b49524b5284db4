//! The Kubernetes objects as they arrive on the wire, decoded lean.
//!
//! Each struct names only the JSON fields nodus reads; serde skips the rest of the object
//! (managedFields, last-applied annotations, status conditions) while parsing, so a full
//! object is never built, not even for a moment. Labels and annotations are reduced to the
//! few keys nodus acts on. Values stay as text here: [`crate::decode`] validates them.

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::fmt;

pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// The annotations nodus reads: the mesh's (each node publishes its WireGuard key, port and
/// endpoint on its own Node), and the time of the change an EndpointSlice reflects, for the
/// proxy's network programming latency. No other annotation is kept.
pub const ANNOTATION_PUBLIC_KEY: &str = "nodus.dev/wireguard-public-key";
pub const ANNOTATION_PORT: &str = "nodus.dev/wireguard-port";
pub const ANNOTATION_ENDPOINT: &str = "nodus.dev/wireguard-endpoint";
/// Set by the operator on a Node (never by nodus): the address, `IP` or `IP:port`, that
/// node publishes for peers to reach it, such as a port forward on its site's router.
pub const ANNOTATION_FORCE_ENDPOINT: &str = "nodus.dev/force-endpoint";
/// Published by nodus on its own Node: where the packets of the peers behind a NAT come
/// from, as its device sees them (`KEY=IP:port`, comma-separated, each key cut to
/// [`PEER_KEY_PREFIX`] characters), so that such a node can learn and publish its own.
pub const ANNOTATION_PEER_ENDPOINTS: &str = "nodus.dev/wireguard-peer-endpoints";
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";
/// The longest value kept of most of those annotations: a key is 44 bytes, an endpoint at
/// most 53 (`[v6%zone]:port`). A longer one is dropped as if absent, so that no Node's
/// author can make every agent of the cluster hold more.
pub const ANNOTATION_VALUE_MAX: usize = 64;
/// The characters of a public key that name a peer in [`ANNOTATION_PEER_ENDPOINTS`]: 96
/// bits, unique among the nodes of any cluster.
pub const PEER_KEY_PREFIX: usize = 16;
/// The most peers [`ANNOTATION_PEER_ENDPOINTS`] names, and its longest value kept: this
/// many entries of the longest endpoint.
pub const PEER_ENDPOINTS_MAX: usize = 64;
const PEER_ENDPOINTS_VALUE_MAX: usize = PEER_ENDPOINTS_MAX * (PEER_KEY_PREFIX + 2 + 53);
/// The annotations kept, each with the longest value kept.
const ANNOTATIONS_KEPT: [(&str, usize); 6] = [
    (ANNOTATION_PUBLIC_KEY, ANNOTATION_VALUE_MAX),
    (ANNOTATION_PORT, ANNOTATION_VALUE_MAX),
    (ANNOTATION_ENDPOINT, ANNOTATION_VALUE_MAX),
    (ANNOTATION_FORCE_ENDPOINT, ANNOTATION_VALUE_MAX),
    (ANNOTATION_PEER_ENDPOINTS, PEER_ENDPOINTS_VALUE_MAX),
    (ANNOTATION_LAST_CHANGE_TRIGGER_TIME, ANNOTATION_VALUE_MAX),
];

/// An object's metadata, with its labels read as `L`: the few keys nodus acts on
/// ([`Labels`]), or all of them ([`LabelMap`], for what NetworkPolicies select).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta<L = Labels> {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default)]
    pub labels: L,
    #[serde(default)]
    pub annotations: Annotations,
    /// `creationTimestamp`, in seconds since the epoch: which of two Nodes is older.
    #[serde(default, deserialize_with = "unix_seconds", skip_serializing)]
    pub creation_timestamp: Option<i64>,
    /// `deletionTimestamp` is set: the object is being deleted (only its presence counts).
    #[serde(default, deserialize_with = "present", skip_serializing)]
    pub deletion_timestamp: bool,
}

fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<IgnoredAny>::deserialize(deserializer)?.is_some())
}

/// An RFC 3339 time as the API server writes it (`2024-05-01T12:00:00Z`, also with a
/// fraction or an offset), in seconds since the epoch; anything else reads as absent.
fn unix_seconds<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    let text = Option::<std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
    Ok(text.as_deref().and_then(parse_rfc3339))
}

pub(crate) fn parse_rfc3339(text: &str) -> Option<i64> {
    parse_rfc3339_millis(text).map(|millis| millis.div_euclid(1000))
}

/// The same in milliseconds, the fraction of a second included.
pub(crate) fn parse_rfc3339_millis(text: &str) -> Option<i64> {
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = text.get(range)?;
        digits
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| digits.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let separators = text.as_bytes();
    if separators.get(4) != Some(&b'-')
        || separators.get(7) != Some(&b'-')
        || !matches!(separators.get(10), Some(b'T' | b't'))
        || separators.get(13) != Some(&b':')
        || separators.get(16) != Some(&b':')
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        millis = fraction[..digits.min(3)].parse::<i64>().unwrap_or(0)
            * 10_i64.pow(3 - digits.min(3) as u32);
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let hours: i64 = rest.get(1..3)?.parse().ok()?;
            let minutes: i64 = rest.get(4..6)?.parse().ok()?;
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            sign * (hours * 3600 + minutes * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm), 1970-01-01 being day 0.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some((days * 86_400 + hour * 3600 + minute * 60 + second - offset) * 1000 + millis)
}

/// The labels nodus acts on; every other label is skipped while parsing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Labels {
    pub service_name: Option<String>,
    pub headless: bool,
    pub service_proxy_name: Option<String>,
    pub zone: Option<String>,
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LabelsVisitor;
        impl<'de> Visitor<'de> for LabelsVisitor {
            type Value = Labels;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_unit<E>(self) -> Result<Labels, E> {
                Ok(Labels::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
                let mut labels = Labels::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match &*key {
                        LABEL_SERVICE_NAME => labels.service_name = Some(map.next_value()?),
                        LABEL_HEADLESS => {
                            map.next_value::<IgnoredAny>()?;
                            labels.headless = true;
                        }
                        LABEL_SERVICE_PROXY_NAME => {
                            labels.service_proxy_name = Some(map.next_value()?)
                        }
                        LABEL_ZONE => labels.zone = Some(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(labels)
            }
        }
        deserializer.deserialize_any(LabelsVisitor)
    }
}

/// Every label of an object that NetworkPolicies select (Pods, Namespaces), in the
/// order written. Kubernetes sets no limit on their number, only the object's size; nodus
/// keeps up to [`LABELS_MAX`] labels of up to [`LABEL_BYTES_MAX`] bytes in all, far more
/// than any workload writes, so that no tenant can make every node hold megabytes per
/// object. `overflow` tells that there were more: such an object is matched by no selector but
/// the empty one, and its pods fail closed (`policy::decode`), since a selector must never judge it on
/// part of its labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LabelMap {
    pub entries: Vec<(String, String)>,
    #[serde(skip)]
    pub overflow: bool,
}

/// Labels kept per object.
pub const LABELS_MAX: usize = 1024;
/// Bytes of label keys and values kept per object.
pub const LABEL_BYTES_MAX: usize = 64 * 1024;

impl<'de> Deserialize<'de> for LabelMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LabelMapVisitor;
        impl<'de> Visitor<'de> for LabelMapVisitor {
            type Value = LabelMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_unit<E>(self) -> Result<LabelMap, E> {
                Ok(LabelMap::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LabelMap, A::Error> {
                let mut labels = LabelMap::default();
                let mut bytes = 0;
                while let Some(key) = map.next_key::<String>()? {
                    if labels.overflow {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                    let value = map.next_value::<Option<String>>()?.unwrap_or_default();
                    bytes += key.len() + value.len();
                    labels.overflow = labels.entries.len() == LABELS_MAX || bytes > LABEL_BYTES_MAX;
                    if labels.overflow {
                        // What was kept is useless now: give it back at once.
                        labels.entries = Vec::new();
                    } else {
                        labels.entries.push((key, value));
                    }
                }
                Ok(labels)
            }
        }
        deserializer.deserialize_any(LabelMapVisitor)
    }
}

/// Only the annotations nodus reads, of bounded length; the rest (often large) is skipped
/// while parsing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Annotations(pub Vec<(String, String)>);

impl Annotations {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find_map(|(k, value)| (k == key).then_some(value.as_str()))
    }
}

impl<'de> Deserialize<'de> for Annotations {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AnnotationsVisitor;
        impl<'de> Visitor<'de> for AnnotationsVisitor {
            type Value = Annotations;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of annotations")
            }
            fn visit_unit<E>(self) -> Result<Annotations, E> {
                Ok(Annotations::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Annotations, A::Error> {
                let mut kept = Vec::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let max = ANNOTATIONS_KEPT
                        .iter()
                        .find_map(|(kept, max)| (*kept == key).then_some(*max));
                    if let Some(max) = max {
                        let value: std::borrow::Cow<'de, str> = map.next_value()?;
                        if value.len() <= max {
                            kept.push((key.into_owned(), value.into_owned()));
                        }
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Annotations(kept))
            }
        }
        deserializer.deserialize_any(AnnotationsVisitor)
    }
}

/// A `null` in the JSON reads as the default, as the API server's Go clients do.
fn null_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default, deserialize_with = "null_default")]
    pub spec: ServiceSpec,
    #[serde(default, deserialize_with = "null_default")]
    pub status: ServiceStatus,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs", default, deserialize_with = "null_default")]
    pub cluster_ips: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub ports: Vec<ServicePort>,
    #[serde(rename = "externalIPs", default, deserialize_with = "null_default")]
    pub external_ips: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub load_balancer_source_ranges: Vec<String>,
    pub session_affinity: Option<String>,
    pub session_affinity_config: Option<SessionAffinityConfig>,
    pub external_traffic_policy: Option<String>,
    pub internal_traffic_policy: Option<String>,
    pub health_check_node_port: Option<i64>,
    pub traffic_distribution: Option<String>,
    pub publish_not_ready_addresses: Option<bool>,
    pub external_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    pub name: Option<String>,
    pub protocol: Option<String>,
    #[serde(default)]
    pub port: i64,
    pub node_port: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinityConfig {
    #[serde(rename = "clientIP")]
    pub client_ip: Option<ClientIpConfig>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    pub timeout_seconds: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    #[serde(default, deserialize_with = "null_default")]
    pub load_balancer: LoadBalancerStatus,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct LoadBalancerStatus {
    #[serde(default, deserialize_with = "null_default")]
    pub ingress: Vec<LoadBalancerIngress>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    pub ip: Option<String>,
    pub ip_mode: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default)]
    pub address_type: String,
    #[serde(default, deserialize_with = "null_default")]
    pub endpoints: Vec<Endpoint>,
    #[serde(default, deserialize_with = "null_default")]
    pub ports: Vec<EndpointPort>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default, deserialize_with = "null_default")]
    pub addresses: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub conditions: EndpointConditions,
    pub hostname: Option<String>,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    pub hints: Option<EndpointHints>,
    pub target_ref: Option<ObjectReference>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct EndpointConditions {
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHints {
    #[serde(default, deserialize_with = "null_default")]
    pub for_zones: Vec<NamedRef>,
    #[serde(default, deserialize_with = "null_default")]
    pub for_nodes: Vec<NamedRef>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NamedRef {
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ObjectReference {
    pub kind: Option<String>,
    pub name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct EndpointPort {
    pub name: Option<String>,
    pub protocol: Option<String>,
    pub port: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Node {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default, deserialize_with = "null_default")]
    pub spec: NodeSpec,
    #[serde(default, deserialize_with = "null_default")]
    pub status: NodeStatus,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs", default, deserialize_with = "null_default")]
    pub pod_cidrs: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub taints: Vec<Taint>,
}

/// The taint the cluster autoscaler puts on a Node it is about to remove.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Taint {
    #[serde(default)]
    pub key: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NodeStatus {
    #[serde(default, deserialize_with = "null_default")]
    pub addresses: Vec<NodeAddress>,
    /// Only each condition's type, status and last transition are read.
    #[serde(default, deserialize_with = "null_default")]
    pub conditions: Vec<NodeCondition>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    /// `lastTransitionTime`, in seconds since the epoch.
    #[serde(default, deserialize_with = "unix_seconds", skip_serializing)]
    pub last_transition_time: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NodeAddress {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub address: String,
}

/// A `networking.k8s.io/v1` ServiceCIDR: a range the cluster allocates service addresses
/// from (checklist C.25).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ServiceCidr {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default, deserialize_with = "null_default")]
    pub spec: ServiceCidrSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ServiceCidrSpec {
    #[serde(default, deserialize_with = "null_default")]
    pub cidrs: Vec<String>,
}

/// A Pod: who sends DNS questions from which address, and which search list kubelet gave
/// it (DNS autopath); its labels and named ports, for NetworkPolicies. Volumes, status
/// conditions and all of a container but its ports are skipped while parsing.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: Meta<LabelMap>,
    #[serde(default, deserialize_with = "null_default")]
    pub spec: PodSpec,
    #[serde(default, deserialize_with = "null_default")]
    pub status: PodStatus,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    pub node_name: Option<String>,
    pub host_network: Option<bool>,
    pub dns_policy: Option<String>,
    pub dns_config: Option<PodDnsConfig>,
    #[serde(default, deserialize_with = "null_default")]
    pub containers: Vec<Container>,
    /// Only those with `restartPolicy: Always` (native sidecars) serve: their named
    /// ports count as the main containers' do.
    #[serde(default, deserialize_with = "null_default")]
    pub init_containers: Vec<Container>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default, deserialize_with = "null_default")]
    pub ports: Vec<ContainerPort>,
    pub restart_policy: Option<String>,
}

impl PodSpec {
    /// The containers that run beside the pod's main ones: those and its native sidecars.
    pub fn serving_containers(&self) -> impl Iterator<Item = &Container> {
        let sidecars = self.init_containers.iter();
        let sidecars = sidecars.filter(|c| c.restart_policy.as_deref() == Some("Always"));
        self.containers.iter().chain(sidecars)
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    pub name: Option<String>,
    #[serde(default)]
    pub container_port: i64,
    pub protocol: Option<String>,
}

/// A Namespace: only its labels matter (NetworkPolicies' `namespaceSelector`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Namespace {
    #[serde(default)]
    pub metadata: Meta<LabelMap>,
}

/// The cluster's DNS ConfigMap (`kube-system/kube-dns`): only its `data` matters, and of
/// it only what kube-dns reads ([`DnsConfigMap`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ConfigMap {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default, deserialize_with = "null_default")]
    pub data: DnsConfigMap,
}

/// What kube-dns and NodeLocal DNSCache read from their ConfigMap, as written there
/// (JSON texts); every other key is skipped while decoding.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DnsConfigMap {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_nameservers: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stub_domains: Option<String>,
}

/// A `networking.k8s.io/v1` NetworkPolicy.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NetworkPolicy {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default, deserialize_with = "null_default")]
    pub spec: NetworkPolicySpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    #[serde(default, deserialize_with = "null_default")]
    pub pod_selector: LabelSelector,
    #[serde(default, deserialize_with = "null_default")]
    pub policy_types: Vec<String>,
    pub ingress: Option<Vec<PolicyIngressRule>>,
    pub egress: Option<Vec<PolicyEgressRule>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct PolicyIngressRule {
    #[serde(default, deserialize_with = "null_default")]
    pub from: Vec<PolicyPeer>,
    #[serde(default, deserialize_with = "null_default")]
    pub ports: Vec<PolicyPort>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct PolicyEgressRule {
    #[serde(default, deserialize_with = "null_default")]
    pub to: Vec<PolicyPeer>,
    #[serde(default, deserialize_with = "null_default")]
    pub ports: Vec<PolicyPort>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPeer {
    pub pod_selector: Option<LabelSelector>,
    pub namespace_selector: Option<LabelSelector>,
    pub ip_block: Option<IpBlock>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct IpBlock {
    #[serde(default)]
    pub cidr: String,
    #[serde(default, deserialize_with = "null_default")]
    pub except: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPort {
    pub protocol: Option<String>,
    pub port: Option<IntOrString>,
    pub end_port: Option<i64>,
}

/// A port given by number or by name.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum IntOrString {
    Int(i64),
    String(String),
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, deserialize_with = "null_default")]
    pub match_labels: std::collections::BTreeMap<String, String>,
    #[serde(default, deserialize_with = "null_default")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct LabelSelectorRequirement {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub operator: String,
    #[serde(default, deserialize_with = "null_default")]
    pub values: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct PodDnsConfig {
    #[serde(default, deserialize_with = "null_default")]
    pub searches: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    pub phase: Option<String>,
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(rename = "podIPs", default, deserialize_with = "null_default")]
    pub pod_ips: Vec<PodIp>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct PodIp {
    #[serde(default)]
    pub ip: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_annotations_keep_only_what_nodus_reads() {
        let json = r#"{
            "metadata": {
                "name": "web", "namespace": "default", "resourceVersion": "7",
                "labels": {"app": "web", "kubernetes.io/service-name": "web",
                           "service.kubernetes.io/headless": ""},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{…}",
                                "nodus.dev/wireguard-public-key": "abc",
                                "nodus.dev/anything-else": "x",
                                "nodus.dev/wireguard-endpoint": "LONG",
                                "nodus.dev/wireguard-peer-endpoints": "PEERS"},
                "managedFields": [{"manager": "kubectl"}]
            },
            "addressType": "IPv4", "endpoints": null, "ports": null
        }"#;
        let json = json.replace("LONG", &"9".repeat(ANNOTATION_VALUE_MAX + 1));
        // The peers' endpoints may be longer than the other annotations, up to their cap.
        let peers = "k".repeat(ANNOTATION_VALUE_MAX + 1);
        let slice: EndpointSlice =
            serde_json::from_str(&json.replace("PEERS", &peers)).expect("valid slice");
        assert_eq!(slice.metadata.labels.service_name.as_deref(), Some("web"));
        assert!(slice.metadata.labels.headless);
        assert_eq!(
            slice.metadata.annotations.0,
            vec![
                (
                    "nodus.dev/wireguard-public-key".to_string(),
                    "abc".to_string()
                ),
                (ANNOTATION_PEER_ENDPOINTS.to_string(), peers)
            ]
        );
        assert!(slice.endpoints.is_empty());
        let too_long = "k".repeat(PEER_ENDPOINTS_VALUE_MAX + 1);
        let slice: EndpointSlice =
            serde_json::from_str(&json.replace("PEERS", &too_long)).expect("valid slice");
        assert_eq!(slice.metadata.annotations.0.len(), 1);
    }

    #[test]
    fn creation_timestamps_read_as_seconds_since_the_epoch() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2024-02-29T12:34:56Z"), Some(1_709_210_096));
        assert_eq!(
            parse_rfc3339("2024-02-29T12:34:56.789Z"),
            Some(1_709_210_096)
        );
        assert_eq!(
            parse_rfc3339("2024-02-29T14:34:56+02:00"),
            Some(1_709_210_096)
        );
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), Some(-1));
        assert_eq!(
            parse_rfc3339_millis("2024-02-29T12:34:56.789123Z"),
            Some(1_709_210_096_789)
        );
        assert_eq!(
            parse_rfc3339_millis("2024-02-29T12:34:56.5Z"),
            Some(1_709_210_096_500)
        );
        assert_eq!(parse_rfc3339_millis("1969-12-31T23:59:59.5Z"), Some(-500));
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59.5Z"), Some(-1));
        for bad in [
            "",
            "2024-02-29",
            "2024-13-01T00:00:00Z",
            "2024-02-29T12:34:56",
            "2024-02-29 12:34:56Z",
            "2024-02-29T12:34:56+0200",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        let node: Node = serde_json::from_str(
            r#"{"metadata": {"name": "n", "creationTimestamp": "2024-02-29T12:34:56Z"}}"#,
        )
        .expect("node");
        assert_eq!(node.metadata.creation_timestamp, Some(1_709_210_096));
    }
}
