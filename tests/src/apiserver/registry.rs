//! The fixed table of resource kinds the stand-in serves.
//!
//! Everything else (routing, discovery, selectors, storage) looks kinds up here, so adding a
//! kind is one more entry in [`RESOURCES`].

/// Index of a kind in [`RESOURCES`]; the store keeps one ordered map per index.
pub(crate) type ResourceId = usize;

/// One served resource kind, with the facts discovery and field selectors need.
#[derive(Debug)]
pub(crate) struct ResourceDef {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// `apiVersion` as written in objects: `v1` or `group/version`.
    pub api_version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Field-selector paths beyond `metadata.name` and `metadata.namespace`.
    pub fields: &'static [&'static str],
    /// Whether the kind has a `/status` subresource. Writes to the main resource then keep
    /// the stored `.status`, and writes to `/status` change only `.status`, as on a real server.
    pub has_status: bool,
}

pub(crate) const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub(crate) static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        list_kind: "NamespaceList",
        namespaced: false,
        short_names: &["ns"],
        fields: &["status.phase"],
        has_status: true,
    },
    ResourceDef {
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        list_kind: "NodeList",
        namespaced: false,
        short_names: &["no"],
        fields: &["spec.unschedulable"],
        has_status: true,
    },
    ResourceDef {
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        list_kind: "PodList",
        namespaced: true,
        short_names: &["po"],
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        has_status: true,
    },
    ResourceDef {
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        list_kind: "ServiceList",
        namespaced: true,
        short_names: &["svc"],
        fields: &["spec.clusterIP", "spec.type"],
        has_status: true,
    },
    ResourceDef {
        group: "",
        version: "v1",
        api_version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        list_kind: "ConfigMapList",
        namespaced: true,
        short_names: &["cm"],
        fields: &[],
        has_status: false,
    },
    ResourceDef {
        group: "discovery.k8s.io",
        version: "v1",
        api_version: "discovery.k8s.io/v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        list_kind: "EndpointSliceList",
        namespaced: true,
        short_names: &[],
        fields: &[],
        has_status: false,
    },
    ResourceDef {
        group: "networking.k8s.io",
        version: "v1",
        api_version: "networking.k8s.io/v1",
        plural: "servicecidrs",
        singular: "servicecidr",
        kind: "ServiceCIDR",
        list_kind: "ServiceCIDRList",
        namespaced: false,
        short_names: &[],
        fields: &[],
        has_status: true,
    },
    ResourceDef {
        group: "networking.k8s.io",
        version: "v1",
        api_version: "networking.k8s.io/v1",
        plural: "networkpolicies",
        singular: "networkpolicy",
        kind: "NetworkPolicy",
        list_kind: "NetworkPolicyList",
        namespaced: true,
        short_names: &["netpol"],
        fields: &[],
        has_status: false,
    },
];

/// The id of the `namespaces` kind (deleting a namespace deletes its contents).
pub(crate) const NAMESPACES: ResourceId = 0;

pub(crate) fn def(id: ResourceId) -> &'static ResourceDef {
    &RESOURCES[id]
}

/// Finds a kind by URL group, version and plural.
pub(crate) fn by_plural(group: &str, version: &str, plural: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds a kind by the `apiVersion` and `kind` written in an object.
pub(crate) fn by_kind(api_version: &str, kind: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.api_version == api_version && r.kind == kind)
}

/// The served API groups other than core, in discovery order.
pub(crate) fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !groups.contains(&r.group) {
            groups.push(r.group);
        }
    }
    groups
}

/// The versions served for `group` (empty means core).
pub(crate) fn versions(group: &str) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group) {
        if !versions.contains(&r.version) {
            versions.push(r.version);
        }
    }
    versions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_agree() {
        for (id, r) in RESOURCES.iter().enumerate() {
            assert_eq!(by_plural(r.group, r.version, r.plural), Some(id));
            assert_eq!(by_kind(r.api_version, r.kind), Some(id));
            assert_eq!(r.list_kind, format!("{}List", r.kind));
        }
        assert_eq!(def(NAMESPACES).plural, "namespaces");
        assert_eq!(groups(), vec!["discovery.k8s.io", "networking.k8s.io"]);
    }
}
