//! The CNI protocol as this plugin speaks it (specification 1.1.0 with `STATUS` and `GC`,
//! results down to 0.3.0):
//! the environment the runtime sets, the network configuration on stdin, the delegated IPAM
//! plugin's result, and what the plugin prints. Nothing here touches the kernel.

use crate::error::Error;
use serde_json::{Value, json};
use std::net::IpAddr;
use std::path::PathBuf;

/// The versions whose configuration this plugin reads and whose result it writes.
pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
/// The version of a reply that has no configuration to take one from.
pub const LATEST_VERSION: &str = "1.1.0";
/// The first version with `STATUS` and `GC`.
pub const STATUS_AND_GC_SINCE: &str = "1.1.0";
/// The most attachments a `GC` may name as valid: pods on one node, many times over.
const MAX_VALID_ATTACHMENTS: usize = 65_536;

/// The most addresses and routes an IPAM result may give one pod; `host-local` gives one
/// address a range.
const MAX_ADDRESSES: usize = 8;
const MAX_ROUTES: usize = 64;
/// Linux's `IFNAMSIZ` less the terminating NUL.
const MAX_INTERFACE_NAME: usize = 15;

/// The operation the runtime asks for (`CNI_COMMAND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    /// Whether the plugin can take `ADD`s now (1.1.0).
    Status,
    /// Remove what belongs to no attachment the runtime still holds (1.1.0).
    Gc,
}

impl Command {
    /// The name of this command, as the delegated IPAM plugin is given it.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }
}

/// What the runtime's environment says about this call.
#[derive(Debug, PartialEq, Eq)]
pub struct Invocation {
    pub command: Command,
    pub container_id: String,
    /// The pod's network namespace; a `DEL` may come without one, once it is gone.
    pub netns: Option<PathBuf>,
    /// The pod-side interface (`eth0`).
    pub ifname: String,
    /// Where plugins are looked up (`CNI_PATH`, colon-separated).
    pub cni_path: Vec<PathBuf>,
    /// The Kubernetes pod this call is for, as namespace and name: kubelet names it in
    /// `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`); `None` for other runtimes' calls.
    pub pod: Option<(String, String)>,
}

impl Invocation {
    /// Reads the `CNI_*` variables through `var`.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Invocation, Error> {
        let required = |name: &str| {
            var(name)
                .filter(|value| !value.is_empty())
                .ok_or_else(|| Error::environment(format!("{name} is not set")))
        };
        let command = match required("CNI_COMMAND")?.as_str() {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            other => {
                return Err(Error::environment(format!(
                    "CNI_COMMAND {other:?} is not one this plugin knows (ADD, DEL, CHECK, \
                     VERSION, STATUS, GC)"
                )));
            }
        };
        let cni_path = || -> Result<Vec<PathBuf>, Error> {
            Ok(required("CNI_PATH")?
                .split(':')
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from)
                .collect())
        };
        // VERSION needs nothing; STATUS and GC concern the network, not one attachment.
        if matches!(command, Command::Version | Command::Status | Command::Gc) {
            return Ok(Invocation {
                command,
                container_id: String::new(),
                netns: None,
                ifname: String::new(),
                cni_path: match command {
                    Command::Version => Vec::new(),
                    _ => cni_path()?,
                },
                pod: None,
            });
        }
        let ifname = required("CNI_IFNAME")?;
        if !is_interface_name(&ifname) {
            return Err(Error::environment(format!(
                "CNI_IFNAME {ifname:?} is not an interface name (1 to {MAX_INTERFACE_NAME} bytes, no '/', ':' or space)"
            )));
        }
        let netns = var("CNI_NETNS")
            .filter(|path| !path.is_empty())
            .map(PathBuf::from);
        if netns.is_none() && command != Command::Del {
            return Err(Error::environment("CNI_NETNS is not set"));
        }
        Ok(Invocation {
            command,
            container_id: required("CNI_CONTAINERID")?,
            netns,
            ifname,
            cni_path: cni_path()?,
            pod: var("CNI_ARGS").as_deref().and_then(kubernetes_pod),
        })
    }
}

/// The pod that `CNI_ARGS` (`KEY=VALUE;…`) names by `K8S_POD_NAMESPACE` and
/// `K8S_POD_NAME`.
fn kubernetes_pod(args: &str) -> Option<(String, String)> {
    let value = |key: &str| {
        args.split(';')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
            .filter(|v| !v.is_empty())
    };
    Some((value("K8S_POD_NAMESPACE")?, value("K8S_POD_NAME")?))
}

fn is_interface_name(name: &str) -> bool {
    (1..=MAX_INTERFACE_NAME).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b.is_ascii_control())
}

/// The parts of the network configuration this plugin reads; the IPAM plugin is given the
/// configuration's own bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Config {
    pub version: String,
    /// The network's name (the conflist's `name`, which the runtime passes on): `GC`
    /// removes this network's links only.
    pub network: String,
    /// Both ends of the veth; the kernel's default when unset.
    pub mtu: Option<u32>,
    /// The IPAM plugin's type: a file name in `CNI_PATH`.
    pub ipam: String,
    /// What `ADD` returned, which `CHECK` checks.
    pub prev_result: Option<Value>,
    /// The node agent's socket that `ADD` waits on until the pod's NetworkPolicy
    /// isolation is in place (`policy_socket`; written when the agent enforces policy).
    pub policy_socket: Option<PathBuf>,
    /// The attachments (container ID, interface) the runtime still holds, which `GC`
    /// keeps (`cni.dev/valid-attachments`).
    pub valid_attachments: Vec<Attachment>,
}

/// One attachment of a container to this network: what `ADD` made for it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

impl Config {
    pub fn parse(bytes: &[u8]) -> Result<Config, Error> {
        let document: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::decode(format!("the network configuration: {e}")))?;
        let version = document["cniVersion"]
            .as_str()
            .ok_or_else(|| Error::config("the network configuration has no cniVersion"))?;
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(Error::version(format!(
                "cniVersion {version:?} is not one of {SUPPORTED_VERSIONS:?}"
            )));
        }
        let mtu = match &document["mtu"] {
            Value::Null => None,
            value => Some(
                value
                    .as_u64()
                    .and_then(|mtu| u32::try_from(mtu).ok())
                    .filter(|mtu| (68..=65535).contains(mtu))
                    .ok_or_else(|| {
                        Error::config(format!("mtu {value} is not a number from 68 to 65535"))
                    })?,
            ),
        };
        let ipam = document["ipam"]["type"]
            .as_str()
            .ok_or_else(|| Error::config("the network configuration has no ipam.type"))?;
        if ipam.is_empty() || ipam.contains('/') || ipam == "." || ipam == ".." {
            return Err(Error::config(format!(
                "ipam.type {ipam:?} is not a plugin's file name"
            )));
        }
        Ok(Config {
            version: version.to_string(),
            network: document["name"].as_str().unwrap_or_default().to_string(),
            mtu,
            ipam: ipam.to_string(),
            prev_result: Some(document["prevResult"].clone()).filter(|v| !v.is_null()),
            policy_socket: document["policy_socket"]
                .as_str()
                .filter(|path| !path.is_empty())
                .map(PathBuf::from),
            valid_attachments: valid_attachments(&document["cni.dev/valid-attachments"])?,
        })
    }

    /// `STATUS` and `GC` are refused for a configuration older than 1.1.0, as the
    /// specification asks.
    pub fn allows_status_and_gc(&self) -> Result<(), Error> {
        if version_at_least(&self.version, STATUS_AND_GC_SINCE) {
            Ok(())
        } else {
            Err(Error::version(format!(
                "cniVersion {:?} has no STATUS or GC (they came with {STATUS_AND_GC_SINCE})",
                self.version
            )))
        }
    }

    /// Results before 1.0.0 name each address's family.
    fn names_families(&self) -> bool {
        self.version.starts_with("0.")
    }
}

/// `cni.dev/valid-attachments`: a list of `{"containerID", "ifname"}`, sorted.
fn valid_attachments(value: &Value) -> Result<Vec<Attachment>, Error> {
    let list = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(list) if list.len() <= MAX_VALID_ATTACHMENTS => list,
        _ => {
            return Err(Error::config(format!(
                "cni.dev/valid-attachments is not a list of at most {MAX_VALID_ATTACHMENTS}"
            )));
        }
    };
    let mut attachments = list
        .iter()
        .map(
            |entry| match (entry["containerID"].as_str(), entry["ifname"].as_str()) {
                (Some(container_id), Some(ifname)) => Ok(Attachment {
                    container_id: container_id.to_string(),
                    ifname: ifname.to_string(),
                }),
                _ => Err(Error::config(format!(
                    "cni.dev/valid-attachments: {entry} has no containerID and ifname"
                ))),
            },
        )
        .collect::<Result<Vec<_>, Error>>()?;
    attachments.sort_unstable();
    Ok(attachments)
}

/// Whether version `a` (`major.minor.patch`) is `b` or later.
fn version_at_least(a: &str, b: &str) -> bool {
    let numbers = |v: &str| -> Vec<u32> { v.split('.').map(|n| n.parse().unwrap_or(0)).collect() };
    numbers(a) >= numbers(b)
}

/// An address and its prefix length, as `10.244.1.5/24`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl Prefix {
    fn parse(text: &str) -> Option<Prefix> {
        let (addr, len) = text.split_once('/')?;
        let addr: IpAddr = addr.parse().ok()?;
        let len: u8 = len.parse().ok()?;
        (len <= host_len(addr)).then_some(Prefix { addr, len })
    }

    /// The network this prefix lies in: its address with the host bits cleared.
    pub fn network(self) -> Prefix {
        let addr = match self.addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        };
        Prefix {
            addr,
            len: self.len,
        }
    }

    /// The prefix of this one address alone (`/32`, `/128`).
    pub fn host(addr: IpAddr) -> Prefix {
        Prefix {
            addr,
            len: host_len(addr),
        }
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

fn host_len(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// One address of the pod, and the node-side gateway its traffic goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Address {
    pub address: Prefix,
    pub gateway: IpAddr,
}

/// A route the pod gets: through its address's gateway unless the IPAM result names one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: Prefix,
    pub gw: Option<IpAddr>,
}

/// The IPAM plugin's result: the pod's addresses, its routes and its DNS settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Addressing {
    pub addresses: Vec<Address>,
    pub routes: Vec<Route>,
    pub dns: Value,
}

impl Addressing {
    /// Reads an IPAM result (or a previous result, for `CHECK`) of any supported version.
    pub fn parse(result: &Value) -> Result<Addressing, Error> {
        let invalid = |what: String| Error::config(format!("the IPAM result: {what}"));
        // The list under `field`, absent read as empty; at most `max` of what it holds.
        let list = |field: &str, what: &str, max: usize| {
            let items = result[field].as_array().map(Vec::as_slice).unwrap_or(&[]);
            if items.len() > max {
                Err(invalid(format!("{} {what}, more than {max}", items.len())))
            } else {
                Ok(items)
            }
        };
        let ips = list("ips", "addresses", MAX_ADDRESSES)?;
        if ips.is_empty() {
            return Err(invalid("no address".into()));
        }
        let addresses = ips
            .iter()
            .map(|ip| {
                let text = ip["address"].as_str().unwrap_or_default();
                let address = Prefix::parse(text)
                    .ok_or_else(|| invalid(format!("address {text:?} is not an address/length")))?;
                let gateway: IpAddr = ip["gateway"]
                    .as_str()
                    .and_then(|gw| gw.parse().ok())
                    .ok_or_else(|| {
                        invalid(format!(
                            "address {address} has no gateway, and the pod's traffic leaves through one"
                        ))
                    })?;
                if gateway.is_ipv4() != address.addr.is_ipv4() || gateway == address.addr {
                    return Err(invalid(format!(
                        "gateway {gateway} cannot serve address {address}"
                    )));
                }
                Ok(Address { address, gateway })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let routes = list("routes", "routes", MAX_ROUTES)?
            .iter()
            .map(|route| {
                let text = route["dst"].as_str().unwrap_or_default();
                let dst = Prefix::parse(text)
                    .ok_or_else(|| invalid(format!("route {text:?} is not an address/length")))?;
                let gw = match route["gw"].as_str() {
                    None => None,
                    Some(gw) => Some(
                        gw.parse::<IpAddr>()
                            .ok()
                            .filter(|gw| gw.is_ipv4() == dst.addr.is_ipv4())
                            .ok_or_else(|| invalid(format!("route {dst} has gateway {gw:?}")))?,
                    ),
                };
                if gw.is_none() && !addresses.iter().any(|a| same_family(a.gateway, dst.addr)) {
                    return Err(invalid(format!(
                        "route {dst} has no gateway and no address of its family"
                    )));
                }
                Ok(Route { dst, gw })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Addressing {
            addresses,
            routes,
            dns: result["dns"].clone(),
        })
    }

    /// Whether the pod has an address of `addr`'s family.
    pub fn has_family_of(&self, addr: IpAddr) -> bool {
        self.addresses
            .iter()
            .any(|a| same_family(a.address.addr, addr))
    }

    /// The gateway a route goes through: its own, or that of the first address of its family.
    pub fn gateway_of(&self, route: &Route) -> Option<IpAddr> {
        route.gw.or_else(|| {
            self.addresses
                .iter()
                .map(|a| a.gateway)
                .find(|gw| same_family(*gw, route.dst.addr))
        })
    }
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

/// A link of the result: the node's end, or the pod's (with its namespace as `sandbox`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    pub sandbox: Option<String>,
}

/// The result of `ADD`, in the configuration's version: both links, the pod's addresses
/// (on the pod's link, the second), and the IPAM plugin's routes and DNS settings.
pub fn add_result(
    config: &Config,
    host: &Interface,
    pod: &Interface,
    addressing: &Addressing,
) -> Value {
    let interface = |link: &Interface| {
        let mut value = json!({ "name": link.name, "mac": link.mac });
        if let Some(sandbox) = &link.sandbox {
            value["sandbox"] = sandbox.clone().into();
        }
        value
    };
    let ips: Vec<Value> = addressing
        .addresses
        .iter()
        .map(|a| {
            let mut ip = json!({
                "address": a.address.to_string(),
                "gateway": a.gateway.to_string(),
                "interface": 1,
            });
            if config.names_families() {
                ip["version"] = if a.address.addr.is_ipv4() { "4" } else { "6" }.into();
            }
            ip
        })
        .collect();
    let routes: Vec<Value> = addressing
        .routes
        .iter()
        .map(|r| match r.gw {
            Some(gw) => json!({ "dst": r.dst.to_string(), "gw": gw.to_string() }),
            None => json!({ "dst": r.dst.to_string() }),
        })
        .collect();
    let mut result = json!({
        "cniVersion": config.version,
        "interfaces": [interface(host), interface(pod)],
        "ips": ips,
        "routes": routes,
    });
    if !addressing.dns.is_null() {
        result["dns"] = addressing.dns.clone();
    }
    result
}

/// The reply to `VERSION`.
pub fn version_result() -> Value {
    json!({ "cniVersion": LATEST_VERSION, "supportedVersions": SUPPORTED_VERSIONS })
}

/// An error as the runtime reads it from stdout.
pub fn error_result(version: &str, error: &Error) -> Value {
    json!({
        "cniVersion": version,
        "code": error.code,
        "msg": error.message,
        "details": error.details,
    })
}

/// The prefix of a pod link's node end: the one the reference `ptp` plugin used, so a
/// proxy that tells pod traffic by interface prefix keeps working across the change.
pub const HOST_LINK_PREFIX: &str = "veth";

/// A pod link's node end is named with this many bytes, the most a name may have.
pub const HOST_LINK_NAME_LEN: usize = 15;

/// The node-side name of the pod's veth: [`HOST_LINK_PREFIX`] and 11 hex digits of a hash
/// of the container and its interface, so that a retried `ADD` finds what a failed one
/// left.
pub fn host_link_name(container_id: &str, ifname: &str) -> String {
    // FNV-1a: stable across builds and toolchains, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in container_id.bytes().chain([0]).chain(ifname.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{HOST_LINK_PREFIX}{:011x}", hash >> 20)
}

/// A link-layer address as `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    const ADD: [(&str, &str); 5] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/var/run/netns/pod"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin::/usr/lib/cni"),
    ];

    #[test]
    fn the_environment_is_read_and_checked() {
        let call = Invocation::from_env(env(&ADD)).expect("add");
        assert_eq!(call.pod, None, "no CNI_ARGS: not a Kubernetes pod");
        let kubelet_args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;\
                            K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u";
        let kubelet = [&ADD[..], &[("CNI_ARGS", kubelet_args)]].concat();
        let from_kubelet = Invocation::from_env(env(&kubelet)).expect("add");
        assert_eq!(from_kubelet.pod, Some(("shop".into(), "web-0".into())));
        assert_eq!(call.command, Command::Add);
        assert_eq!(call.netns, Some(PathBuf::from("/var/run/netns/pod")));
        assert_eq!(
            call.cni_path,
            [PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        let version = Invocation::from_env(env(&[("CNI_COMMAND", "VERSION")])).expect("version");
        assert_eq!(version.command, Command::Version);

        let mut del = ADD;
        del[0].1 = "DEL";
        del[2].1 = "";
        let del = Invocation::from_env(env(&del)).expect("a DEL without a namespace");
        assert_eq!(del.netns, None);

        let mut no_netns = ADD;
        no_netns[2].1 = "";
        let error = Invocation::from_env(env(&no_netns)).expect_err("ADD needs a namespace");
        assert_eq!(error.code, crate::code::INVALID_ENVIRONMENT);
        for bad in ["", "sixteen-bytes-xx", "a/b", "a b", ".."] {
            let mut call = ADD;
            call[3].1 = bad;
            assert!(Invocation::from_env(env(&call)).is_err(), "{bad:?}");
        }
        let mut unknown = ADD;
        unknown[0].1 = "RESET";
        let error = Invocation::from_env(env(&unknown)).expect_err("RESET");
        assert!(error.message.contains("RESET"), "{}", error.message);
        // STATUS and GC concern the network: CNI_PATH alone.
        for command in ["STATUS", "GC"] {
            let call = Invocation::from_env(env(&[("CNI_COMMAND", command), ADD[4]]))
                .expect("STATUS and GC need no attachment");
            assert_eq!(call.command.as_str(), command);
            assert_eq!(call.cni_path.len(), 2);
        }
    }

    #[test]
    fn gc_reads_the_valid_attachments_and_older_versions_have_no_status_or_gc() {
        let config = Config::parse(
            br#"{"cniVersion":"1.1.0","name":"nodus","ipam":{"type":"host-local"},
                 "cni.dev/valid-attachments":[{"containerID":"b","ifname":"eth0"},
                                              {"containerID":"a","ifname":"eth0"}]}"#,
        )
        .expect("config");
        assert!(config.allows_status_and_gc().is_ok());
        let ids: Vec<&str> = config
            .valid_attachments
            .iter()
            .map(|a| a.container_id.as_str())
            .collect();
        assert_eq!(ids, ["a", "b"], "sorted, for GC's lookups");
        let old = Config::parse(br#"{"cniVersion":"1.0.0","ipam":{"type":"host-local"}}"#)
            .expect("config");
        let refused = old.allows_status_and_gc().expect_err("1.0.0 has no GC");
        assert_eq!(refused.code, crate::code::INCOMPATIBLE_VERSION);
        let bad = Config::parse(
            br#"{"cniVersion":"1.1.0","ipam":{"type":"host-local"},
                 "cni.dev/valid-attachments":[{"containerID":"a"}]}"#,
        );
        assert_eq!(
            bad.expect_err("no ifname").code,
            crate::code::INVALID_CONFIG
        );
    }

    #[test]
    fn the_configuration_is_read_and_checked() {
        let config = Config::parse(
            br#"{"cniVersion":"1.0.0","name":"nodus","type":"nodus-cni","mtu":1420,
                 "ipam":{"type":"host-local","ranges":[]}}"#,
        )
        .expect("config");
        assert_eq!(config.mtu, Some(1420));
        assert_eq!(config.ipam, "host-local");
        assert_eq!(config.prev_result, None);

        let cases: [(&[u8], u32); 5] = [
            (b"{", crate::code::DECODE),
            (
                br#"{"cniVersion":"2.0.0","ipam":{"type":"x"}}"#,
                crate::code::INCOMPATIBLE_VERSION,
            ),
            (br#"{"cniVersion":"1.0.0"}"#, crate::code::INVALID_CONFIG),
            (
                br#"{"cniVersion":"1.0.0","ipam":{"type":"../x"}}"#,
                crate::code::INVALID_CONFIG,
            ),
            (
                br#"{"cniVersion":"1.0.0","mtu":10,"ipam":{"type":"x"}}"#,
                crate::code::INVALID_CONFIG,
            ),
        ];
        for (text, code) in cases {
            let error = Config::parse(text).expect_err("invalid");
            assert_eq!(error.code, code, "{}", String::from_utf8_lossy(text));
        }
    }

    fn host_local_result() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "ips": [
                { "address": "10.244.1.5/24", "gateway": "10.244.1.1" },
                { "address": "fd00:10:244:1::5/64", "gateway": "fd00:10:244:1::1" }
            ],
            "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }],
            "dns": {}
        })
    }

    #[test]
    fn an_ipam_result_gives_addresses_gateways_and_routes() {
        let addressing = Addressing::parse(&host_local_result()).expect("result");
        assert_eq!(addressing.addresses.len(), 2);
        assert_eq!(addressing.addresses[1].address.len, 64);
        assert_eq!(
            addressing.addresses[0].address.network().to_string(),
            "10.244.1.0/24"
        );
        assert_eq!(
            addressing.addresses[1].address.network().to_string(),
            "fd00:10:244:1::/64"
        );
        let gateways: Vec<String> = addressing
            .routes
            .iter()
            .map(|r| addressing.gateway_of(r).expect("gateway").to_string())
            .collect();
        assert_eq!(gateways, ["10.244.1.1", "fd00:10:244:1::1"]);

        for broken in [
            json!({ "ips": [] }),
            json!({ "ips": [{ "address": "10.244.1.5/24" }] }),
            json!({ "ips": [{ "address": "10.244.1.5/33", "gateway": "10.244.1.1" }] }),
            json!({ "ips": [{ "address": "10.244.1.5/24", "gateway": "fd00::1" }] }),
            json!({ "ips": [{ "address": "10.244.1.5/24", "gateway": "10.244.1.1" }],
                    "routes": [{ "dst": "::/0" }] }),
        ] {
            assert!(Addressing::parse(&broken).is_err(), "{broken}");
        }
    }

    #[test]
    fn the_result_follows_the_configuration_version() {
        let addressing = Addressing::parse(&host_local_result()).expect("result");
        let host = Interface {
            name: "veth0123456789a".into(),
            mac: "aa:bb:cc:dd:ee:ff".into(),
            sandbox: None,
        };
        let pod = Interface {
            name: "eth0".into(),
            mac: "aa:bb:cc:dd:ee:00".into(),
            sandbox: Some("/var/run/netns/pod".into()),
        };
        let mut config = Config {
            version: "1.0.0".into(),
            network: "nodus".into(),
            mtu: None,
            ipam: "host-local".into(),
            prev_result: None,
            policy_socket: None,
            valid_attachments: Vec::new(),
        };
        let result = add_result(&config, &host, &pod, &addressing);
        assert_eq!(result["interfaces"][1]["sandbox"], "/var/run/netns/pod");
        assert_eq!(result["ips"][0]["interface"], 1);
        assert_eq!(result["ips"][1]["address"], "fd00:10:244:1::5/64");
        assert!(result["ips"][0].get("version").is_none());
        assert_eq!(
            Addressing::parse(&result).expect("a result reads back"),
            addressing
        );
        config.version = "0.4.0".into();
        let old = add_result(&config, &host, &pod, &addressing);
        assert_eq!(old["cniVersion"], "0.4.0");
        assert_eq!(old["ips"][1]["version"], "6");
    }

    #[test]
    fn host_link_names_are_stable_and_fit() {
        let name = host_link_name("c1", "eth0");
        assert_eq!(name, host_link_name("c1", "eth0"));
        assert_ne!(name, host_link_name("c1", "eth1"));
        assert_ne!(name, host_link_name("c2", "eth0"));
        assert!(
            is_interface_name(&name) && name.len() == HOST_LINK_NAME_LEN,
            "{name}"
        );
        assert_eq!(mac_text(&[0xaa, 0x01, 0]), "aa:01:00");
    }
}
