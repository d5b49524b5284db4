//! The cluster's DNS ConfigMap (`kube-system/kube-dns` by default), read as kube-dns and
//! NodeLocal DNSCache read it: `stubDomains` (JSON, zone → nameservers) add stub domains
//! beside `dns.forward_zones`, which win for the same zone; `upstreamNameservers` (a JSON
//! list) replace the resolv.conf's upstreams. The agent's one watch pipeline brings it
//! into the view; [`ConfigMapRoutes`] follows it there. A ConfigMap that is missing,
//! deleted or that the API does not let nodus read leaves the configuration as it is; one
//! that does not read is reported and its last good version kept.

use crate::forward::{Forwarder, Name, stub_domain, upstream_address};
use nodus_view::wire::DnsConfigMap;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// Bounds on what a ConfigMap may ask for: kube-dns takes three upstream nameservers.
const MAX_UPSTREAMS: usize = 3;
const MAX_STUB_DOMAINS: usize = 64;
const MAX_STUB_NAMESERVERS: usize = 8;

/// Upstreams, and the stub domains' zones with theirs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routes {
    pub upstreams: Vec<SocketAddr>,
    pub zones: Vec<(Name, Vec<SocketAddr>)>,
}

/// What a ConfigMap asks for: its upstreams (empty: keep the resolv.conf's) and its stub
/// domains. Stub domains in `cluster_domain` are refused: the view answers it.
pub fn read(map: &DnsConfigMap, cluster_domain: &str) -> Result<Routes, String> {
    let mut routes = Routes::default();
    if let Some(text) = &map.upstream_nameservers {
        let listed: Vec<String> = serde_json::from_str(text)
            .map_err(|error| format!("upstreamNameservers is not a JSON list: {error}"))?;
        if listed.len() > MAX_UPSTREAMS {
            return Err(format!(
                "upstreamNameservers lists {}, more than {MAX_UPSTREAMS}",
                listed.len()
            ));
        }
        routes.upstreams = listed
            .iter()
            .map(|upstream| upstream_address(upstream))
            .collect::<Result<_, _>>()
            .map_err(|error| format!("upstreamNameservers: {error}"))?;
    }
    if let Some(text) = &map.stub_domains {
        let stubs: BTreeMap<String, Vec<String>> = serde_json::from_str(text)
            .map_err(|error| format!("stubDomains is not a JSON object of lists: {error}"))?;
        if stubs.len() > MAX_STUB_DOMAINS {
            return Err(format!(
                "stubDomains has {}, more than {MAX_STUB_DOMAINS}",
                stubs.len()
            ));
        }
        for (zone, nameservers) in &stubs {
            if nameservers.len() > MAX_STUB_NAMESERVERS {
                return Err(format!(
                    "stubDomains: {zone} lists more than {MAX_STUB_NAMESERVERS} nameservers"
                ));
            }
            let stub = stub_domain(zone, nameservers, cluster_domain)
                .map_err(|error| format!("stubDomains: {error}"))?;
            routes.zones.push(stub);
        }
    }
    Ok(routes)
}

/// The routes of the configuration (`base`) with the ConfigMap's (`from_map`) laid over.
pub fn merge(base: &Routes, from_map: &Routes) -> Routes {
    let upstreams = if from_map.upstreams.is_empty() {
        base.upstreams.clone()
    } else {
        from_map.upstreams.clone()
    };
    let mut zones = base.zones.clone();
    for (zone, upstreams) in &from_map.zones {
        if !zones.iter().any(|(configured, _)| configured == zone) {
            zones.push((zone.clone(), upstreams.clone()));
        }
    }
    Routes { upstreams, zones }
}

/// A forwarder's routes following the cluster's DNS ConfigMap in the view: those of the
/// configuration (`base`) with the ConfigMap's laid over.
pub struct ConfigMapRoutes {
    forwarder: Arc<Forwarder>,
    base: Routes,
    current: Routes,
    cluster_domain: String,
}

impl ConfigMapRoutes {
    pub fn new(forwarder: Arc<Forwarder>, base: Routes, cluster_domain: &str) -> ConfigMapRoutes {
        ConfigMapRoutes {
            forwarder,
            current: base.clone(),
            base,
            cluster_domain: cluster_domain.to_string(),
        }
    }

    /// Gives the forwarder the routes `map` (the ConfigMap as the view holds it, or none)
    /// asks for, if they differ from what it has.
    pub fn follow(&mut self, map: Option<&DnsConfigMap>) {
        let wanted = match map.map(|map| read(map, &self.cluster_domain)) {
            None => self.base.clone(),
            Some(Ok(from_map)) => merge(&self.base, &from_map),
            Some(Err(error)) => {
                tracing::warn!(%error,
                    "the cluster's DNS ConfigMap does not read; its last good version stays");
                return;
            }
        };
        if wanted != self.current {
            tracing::info!(upstreams = ?wanted.upstreams, stub_domains = wanted.zones.len(),
                "forwarding follows the cluster's DNS ConfigMap");
            self.forwarder
                .set_upstreams(&wanted.upstreams, &wanted.zones);
            self.current = wanted;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> DnsConfigMap {
        let mut map = DnsConfigMap::default();
        for (key, value) in pairs {
            match *key {
                "upstreamNameservers" => map.upstream_nameservers = Some(value.to_string()),
                "stubDomains" => map.stub_domains = Some(value.to_string()),
                other => panic!("kube-dns reads no {other}"),
            }
        }
        map
    }

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().expect("addr")).collect()
    }

    #[test]
    fn the_kube_dns_config_map_reads_as_kube_dns_reads_it() {
        let routes = read(
            &data(&[
                ("upstreamNameservers", r#"["8.8.8.8", "1.1.1.1:5353"]"#),
                (
                    "stubDomains",
                    r#"{"acme.local": ["1.2.3.4"], "consul": ["10.0.0.3:8600"]}"#,
                ),
            ]),
            "cluster.local",
        )
        .expect("valid");
        assert_eq!(routes.upstreams, addrs(&["8.8.8.8:53", "1.1.1.1:5353"]));
        assert_eq!(routes.zones.len(), 2);
        assert_eq!(routes.zones[0].0.to_ascii(), "acme.local.");
        assert_eq!(read(&data(&[]), "cluster.local"), Ok(Routes::default()));
        for (bad, names) in [
            (("upstreamNameservers", "8.8.8.8"), "JSON list"),
            (
                ("upstreamNameservers", r#"["a", "b", "c", "d"]"#),
                "more than 3",
            ),
            (
                ("upstreamNameservers", r#"["dns.google"]"#),
                "not an address",
            ),
            (
                ("stubDomains", r#"{"svc.cluster.local": ["1.2.3.4"]}"#),
                "cluster domain",
            ),
            (
                ("stubDomains", r#"{"acme.local": "1.2.3.4"}"#),
                "JSON object",
            ),
        ] {
            let error = read(&data(&[bad]), "cluster.local").expect_err(bad.1);
            assert!(error.contains(names), "{bad:?}: {error}");
        }
    }

    #[test]
    fn the_configuration_wins_for_the_same_zone_and_upstreams_are_replaced_only_if_listed() {
        let zone = |text: &str| Name::from_ascii(text).expect("name");
        let base = Routes {
            upstreams: addrs(&["10.0.0.2:53"]),
            zones: vec![(zone("acme.local."), addrs(&["10.9.9.9:53"]))],
        };
        let from_map = Routes {
            upstreams: Vec::new(),
            zones: vec![
                (zone("acme.local."), addrs(&["1.2.3.4:53"])),
                (zone("consul."), addrs(&["10.0.0.3:8600"])),
            ],
        };
        let merged = merge(&base, &from_map);
        assert_eq!(merged.upstreams, base.upstreams);
        assert_eq!(
            merged.zones,
            vec![
                (zone("acme.local."), addrs(&["10.9.9.9:53"])),
                (zone("consul."), addrs(&["10.0.0.3:8600"])),
            ]
        );
        let replacing = Routes {
            upstreams: addrs(&["8.8.8.8:53"]),
            zones: Vec::new(),
        };
        assert_eq!(merge(&base, &replacing).upstreams, addrs(&["8.8.8.8:53"]));
    }
}
