//! Autopath: a pod's search list, walked by the server.
//!
//! kubelet gives a `ClusterFirst` pod `search <ns>.svc.<zone> svc.<zone> <zone>` followed by
//! the node's own search domains, with `ndots:5`: an outside name `X` is asked as
//! `X.<ns>.svc.<zone>`, `X.svc.<zone>`, `X.<zone>`, `X.<node domain>`… and last `X.`, each
//! miss a round trip (two, for A and AAAA). nodus knows which pod asks by the address it
//! sends from (this node's pods are in the view) and so knows its search list: it answers
//! the first question with a CNAME to the first name of the list that exists, with that
//! name's records, as CoreDNS's autopath does, without its cluster-wide pod watch.
//!
//! The walk starts only when the asked name is NXDOMAIN, so a name that exists in the pod's
//! own namespace still wins. It stops at the first name that is not NXDOMAIN (an existing
//! name without records of the type included, as CoreDNS stops). When every name is
//! NXDOMAIN, or an upstream fails on the way, the asked name gets its own answer and the
//! pod walks its list itself; the names asked on the way are in the forwarding cache by
//! then. Pods with search domains of their own (`dnsConfig.searches`), other DNS policies,
//! host-network pods and clients the view does not know are never walked for.

use hickory_proto::rr::Name;
use nodus_view::View;
use std::net::IpAddr;

/// kubelet's limits on a pod's search list (`MaxDNSSearchPaths`, `MaxDNSSearchListChars`):
/// domains past them are dropped, so the walk leaves them out too.
const MAX_SEARCH_DOMAINS: usize = 32;
const MAX_SEARCH_CHARS: usize = 2048;

/// How a walk ended, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walked {
    /// A later name of the list exists: a CNAME to it.
    Answered,
    /// Every name of the list is NXDOMAIN: so is the asked one.
    NxDomain,
    /// An upstream failed on the way: the asked name gets its own answer.
    GaveUp,
}

impl Walked {
    pub const ALL: [Walked; 3] = [Walked::Answered, Walked::NxDomain, Walked::GaveUp];

    pub fn as_str(self) -> &'static str {
        match self {
            Walked::Answered => "answered",
            Walked::NxDomain => "nxdomain",
            Walked::GaveUp => "gave_up",
        }
    }
}

/// The node's own search domains, as kubelet appends them to a `ClusterFirst` pod's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSearch {
    domains: Vec<Name>,
}

impl NodeSearch {
    /// The `search` line of the node's resolv.conf (the last one, as kubelet reads it),
    /// without the cluster's own domains (there when nodus itself was given a pod's
    /// resolv.conf), repeats, and what kubelet's limits leave out of a pod's list.
    pub fn from_resolv_conf(text: &str, zone: &Name) -> NodeSearch {
        let line = text
            .lines()
            .filter_map(|line| line.split(['#', ';']).next())
            .filter_map(|line| line.trim().strip_prefix("search"))
            .rfind(|rest| rest.starts_with(char::is_whitespace))
            .unwrap_or_default();
        // The pod's list starts with the cluster's three domains, its namespace's at most
        // 63 bytes longer than `svc.<zone>`.
        let zone_chars = zone.to_string().trim_end_matches('.').len();
        let mut chars = 3 * (zone_chars + 1) + 2 * "svc.".len() + 64;
        let mut domains: Vec<Name> = Vec::new();
        for text in line.split_whitespace() {
            let Ok(mut name) = Name::from_ascii(text.trim_end_matches('.')) else {
                continue;
            };
            name.set_fqdn(true);
            let lower = name.to_lowercase();
            if zone.zone_of(&lower) || name.is_root() || domains.contains(&lower) {
                continue;
            }
            chars += text.trim_end_matches('.').len() + 1;
            if domains.len() + 3 == MAX_SEARCH_DOMAINS || chars > MAX_SEARCH_CHARS {
                break;
            }
            domains.push(lower);
        }
        NodeSearch { domains }
    }

    pub fn domains(&self) -> &[Name] {
        &self.domains
    }
}

/// The names after `qname` in the search list of the pod that sends from `client`, when
/// `qname` is the first name of that list (`X.<its namespace>.svc.<origin>`):
/// `X.svc.<origin>`, `X.<origin>`, `X.<node domain>`… and `X.`, in the asked case. None
/// when the client is not a `ClusterFirst` pod of this node or the name is not from its
/// list.
pub fn search_after(
    view: &View,
    node_search: &NodeSearch,
    origin: &Name,
    client: IpAddr,
    qname: &Name,
) -> Option<Vec<Name>> {
    let pod = view.local_pod(client)?;
    if !pod.pod.cluster_search {
        return None;
    }
    let own = Name::from_labels([pod.namespace, "svc"])
        .ok()?
        .append_domain(origin)
        .ok()?;
    if !own.zone_of(&qname.to_lowercase()) {
        return None;
    }
    let base_labels = qname.iter().count().checked_sub(own.iter().count())?;
    if base_labels == 0 {
        return None;
    }
    let base = Name::from_labels(qname.iter().take(base_labels)).ok()?;
    let svc = Name::from_labels(["svc"])
        .ok()?
        .append_domain(origin)
        .ok()?;
    let mut path = Vec::with_capacity(4 + node_search.domains.len());
    for domain in [&svc, origin].into_iter().chain(&node_search.domains) {
        // A name past 255 bytes is not one the pod can ask.
        if let Ok(name) = base.clone().append_domain(domain) {
            path.push(name);
        }
    }
    let mut bare = base;
    bare.set_fqdn(true);
    path.push(bare);
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_view::Update;

    fn name(text: &str) -> Name {
        Name::from_ascii(text).expect("name")
    }

    #[test]
    fn the_node_search_list_is_kubelets_tail() {
        let zone = name("cluster.local.");
        let text = "domain ignored.example\nsearch old.example\n\
                    search Corp.Example. default.svc.cluster.local svc.cluster.local \
                    cluster.local corp.example lab.example # a comment\nnameserver 10.0.0.1\n";
        let search = NodeSearch::from_resolv_conf(text, &zone);
        assert_eq!(
            search.domains(),
            [name("corp.example."), name("lab.example.")],
            "the last search line, lower case, without the cluster's domains or repeats"
        );
        let long: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let search = NodeSearch::from_resolv_conf(&format!("search {}", long.join(" ")), &zone);
        assert_eq!(
            search.domains().len(),
            29,
            "32 in all with the cluster's three"
        );
        assert!(
            NodeSearch::from_resolv_conf("searchx a.example", &zone)
                .domains()
                .is_empty()
        );
    }

    fn pod(namespace: &str, ip: &str, spec: serde_json::Value) -> Update {
        let mut spec = spec;
        spec["nodeName"] = "node-a".into();
        Update::Pod(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p-{ip}"), "namespace": namespace},
                "spec": spec,
                "status": {"podIPs": [{"ip": ip}]}
            }))
            .expect("pod"),
        )
    }

    #[test]
    fn only_the_first_name_of_a_known_pods_list_is_walked() {
        let mut view = View::new("node-a");
        view.apply([
            pod("shop", "10.244.0.5", serde_json::json!({})),
            pod(
                "shop",
                "10.244.0.6",
                serde_json::json!({"dnsPolicy": "Default"}),
            ),
        ]);
        let origin = name("cluster.local.");
        let node = NodeSearch::from_resolv_conf("search corp.example", &origin);
        let client: IpAddr = "10.244.0.5".parse().expect("ip");
        let asked = name("WWW.example.org.Shop.svc.cluster.local.");
        let path = search_after(&view, &node, &origin, client, &asked).expect("walked");
        let texts: Vec<String> = path.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "WWW.example.org.svc.cluster.local.",
                "WWW.example.org.cluster.local.",
                "WWW.example.org.corp.example.",
                "WWW.example.org.",
            ]
        );
        for (client, asked) in [
            ("10.244.0.6", "www.example.org.shop.svc.cluster.local."),
            ("10.244.0.7", "www.example.org.shop.svc.cluster.local."),
            ("10.244.0.5", "www.example.org.blog.svc.cluster.local."),
            ("10.244.0.5", "shop.svc.cluster.local."),
            ("10.244.0.5", "www.example.org.svc.cluster.local."),
        ] {
            let client: IpAddr = client.parse().expect("ip");
            let path = search_after(&view, &node, &origin, client, &name(asked));
            assert_eq!(path, None, "{client} {asked}");
        }
    }
}
