//! The pod's link, over rtnetlink: a veth pair made in the pod's namespace with its other
//! end in the node's, the pod's addresses without DAD or prefix routes, and routes that
//! send everything through the node, where the proxy's and the policy's rules see it.
//!
//! The shape is the reference `ptp` plugin's: each pod address's gateway is put on the
//! node's end as a host address (so the node answers ARP and NDP for it on that link
//! alone), the node reaches the pod through a host route over its end, and the pod reaches
//! even its own subnet through the gateway, so no pod talks to another past the node.

#![allow(unsafe_code)] // setns(2), which std does not offer.

use crate::error::{Error, code};
use crate::protocol::{Addressing, Attachment, Interface, Invocation, Prefix, mac_text};
use futures::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::packet_route::route::RouteScope;
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};
use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

/// The kernel answers at once; a request it does not answer fails after this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The interface group (`ip link show group …`) of every pod link's node end: nodus's
/// table checks the source of what arrives through a link of this group (`meta iifgroup`),
/// whatever the link's name, and no other plugin's link is in it. ASCII `nodu`.
pub const POD_LINK_GROUP: u32 = 0x6e6f_6475;

/// rtnetlink connections to the node's namespace (this process's) and the pod's.
struct Namespaces {
    node: Handle,
    pod: Handle,
    node_file: File,
}

impl Namespaces {
    /// `None` for the pod when its namespace is gone (a `DEL` after the sandbox).
    fn open(pod_netns: &Path) -> Result<Namespaces, Error> {
        let node_file = File::open("/proc/self/ns/net")
            .map_err(|e| Error::new(code::IO, format!("opening this network namespace: {e}")))?;
        let pod_file = File::open(pod_netns).map_err(|e| {
            Error::new(
                code::UNKNOWN_CONTAINER,
                format!(
                    "opening the pod's network namespace {}: {e}",
                    pod_netns.display()
                ),
            )
        })?;
        let node = connect()?;
        // A netlink socket belongs to the namespace it is made in, whichever thread uses
        // it later; so the pod's is made inside the pod's namespace and used from here.
        enter(&pod_file, pod_netns)?;
        let pod = connect();
        enter(&node_file, Path::new("/proc/self/ns/net"))?;
        Ok(Namespaces {
            node,
            pod: pod?,
            node_file,
        })
    }
}

fn connect() -> Result<Handle, Error> {
    let (connection, handle, _) = rtnetlink::new_connection()
        .map_err(|e| Error::new(code::IO, format!("opening rtnetlink: {e}")))?;
    tokio::spawn(connection);
    Ok(handle)
}

fn enter(namespace: &File, path: &Path) -> Result<(), Error> {
    // SAFETY: setns only reads the descriptor, which `namespace` keeps open, and moves
    // the calling thread alone; this plugin's runtime runs on this one thread.
    let rc = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(Error::new(
            code::IO,
            format!(
                "entering the network namespace {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ),
        ));
    }
    Ok(())
}

/// `request`, failing after [`REQUEST_TIMEOUT`]; errors say what was being done.
async fn bounded<T>(
    context: impl std::fmt::Display,
    request: impl Future<Output = Result<T, rtnetlink::Error>>,
) -> Result<T, Error> {
    bounded_unless(context, request, None).await
}

/// [`bounded`], with the kernel's refusal `errno` (no such link, already there) answered
/// by `instead` rather than failing.
async fn bounded_unless<T>(
    context: impl std::fmt::Display,
    request: impl Future<Output = Result<T, rtnetlink::Error>>,
    refusal: Option<(i32, T)>,
) -> Result<T, Error> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => match refusal {
            Some((errno, instead)) if is_errno(&error, errno) => Ok(instead),
            _ => Err(Error::kernel(format!("{context}: {error}"))),
        },
        Err(_) => Err(Error::kernel(format!(
            "{context}: no reply from the kernel within {REQUEST_TIMEOUT:?}"
        ))),
    }
}

fn is_errno(error: &rtnetlink::Error, errno: i32) -> bool {
    matches!(error, rtnetlink::Error::NetlinkError(e) if e.code.map(|c| c.get()) == Some(-errno))
}

/// The link named `name`, `None` when there is none.
async fn find(handle: &Handle, name: &str) -> Result<Option<LinkMessage>, Error> {
    let mut replies = handle.link().get().match_name(name.to_string()).execute();
    let context = format_args!("finding link {name}");
    bounded_unless(context, replies.try_next(), Some((libc::ENODEV, None))).await
}

async fn delete(handle: &Handle, name: &str) -> Result<(), Error> {
    if let Some(link) = find(handle, name).await? {
        let request = handle.link().del(link.header.index).execute();
        let context = format_args!("deleting link {name}");
        bounded_unless(context, request, Some((libc::ENODEV, ()))).await?;
    }
    Ok(())
}

fn mac_of(link: &LinkMessage) -> String {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(bytes) => Some(mac_text(bytes)),
            _ => None,
        })
        .unwrap_or_default()
}

/// `ADD`: makes the pod's link to `network` and returns both ends. What a failure leaves
/// is removed.
pub async fn add(
    call: &Invocation,
    netns: &Path,
    network: &str,
    mtu: Option<u32>,
    addressing: &Addressing,
) -> Result<(Interface, Interface), Error> {
    let namespaces = Namespaces::open(netns)?;
    let host_name = crate::protocol::host_link_name(&call.container_id, &call.ifname);
    if find(&namespaces.pod, &call.ifname).await?.is_some() {
        return Err(Error::new(
            code::INVALID_CONFIG,
            format!("the pod already has a link named {}", call.ifname),
        ));
    }
    // What a failed ADD for this container left on the node.
    delete(&namespaces.node, &host_name).await?;
    let made = make(
        &namespaces,
        call,
        netns,
        network,
        &host_name,
        mtu,
        addressing,
    )
    .await;
    if made.is_err() {
        // Deleting one end deletes both, with their addresses and routes.
        let _ = delete(&namespaces.pod, &call.ifname).await;
        let _ = delete(&namespaces.node, &host_name).await;
    }
    made
}

async fn make(
    namespaces: &Namespaces,
    call: &Invocation,
    netns: &Path,
    network: &str,
    host_name: &str,
    mtu: Option<u32>,
    addressing: &Addressing,
) -> Result<(Interface, Interface), Error> {
    let mut host_end = LinkUnspec::new_with_name(host_name)
        .setns_by_fd(namespaces.node_file.as_raw_fd())
        .append_extra_attribute(LinkAttribute::Group(POD_LINK_GROUP));
    let mut pod_end = LinkVeth::new(&call.ifname, host_name);
    if let Some(mtu) = mtu {
        host_end = host_end.mtu(mtu);
        pod_end = pod_end.mtu(mtu);
    }
    // Made in the pod's namespace with the peer placed in the node's at once: a name
    // such as `eth0` may exist on the node, and nothing is ever half in one namespace.
    let veth = pod_end
        .set_info_data(InfoData::Veth(InfoVeth::Peer(host_end.build())))
        .build();
    bounded(
        format_args!("creating the veth {} / {host_name}", call.ifname),
        namespaces.pod.link().add(veth).execute(),
    )
    .await?;
    let pod_link = find(&namespaces.pod, &call.ifname)
        .await?
        .ok_or_else(|| Error::kernel(format!("the new link {} is gone", call.ifname)))?;
    let host_link = find(&namespaces.node, host_name)
        .await?
        .ok_or_else(|| Error::kernel(format!("the new link {host_name} is gone")))?;
    let (pod_index, host_index) = (pod_link.header.index, host_link.header.index);

    refuse_router_messages(host_name)?;
    if addressing.has_family_of(Ipv6Addr::UNSPECIFIED.into()) {
        skip_duplicate_detection(host_name)?;
    }
    set_up(&namespaces.node, host_index, host_name).await?;
    let alias = attachment_alias(network, &call.container_id, &call.ifname);
    bounded(
        format_args!("naming link {host_name}'s attachment"),
        namespaces
            .node
            .link()
            .set(LinkUnspec::new_with_index(host_index).alias(alias).build())
            .execute(),
    )
    .await?;
    let mut gateways: Vec<IpAddr> = Vec::new();
    for address in &addressing.addresses {
        if !gateways.contains(&address.gateway) {
            gateways.push(address.gateway);
            add_address(&namespaces.node, host_index, Prefix::host(address.gateway)).await?;
        }
        add_route(
            &namespaces.node,
            host_index,
            Prefix::host(address.address.addr),
            None,
        )
        .await?;
    }

    set_up(&namespaces.pod, pod_index, &call.ifname).await?;
    let mut routed: Vec<Prefix> = Vec::new();
    for address in &addressing.addresses {
        add_address(&namespaces.pod, pod_index, address.address).await?;
        let gateway = Prefix::host(address.gateway);
        if !routed.contains(&gateway) {
            routed.push(gateway);
            add_route(&namespaces.pod, pod_index, gateway, None).await?;
        }
        let subnet = address.address.network();
        if subnet.len < gateway.len && !routed.contains(&subnet) {
            routed.push(subnet);
            add_route(&namespaces.pod, pod_index, subnet, Some(address.gateway)).await?;
        }
    }
    for route in &addressing.routes {
        if !routed.contains(&route.dst) {
            routed.push(route.dst);
            add_route(
                &namespaces.pod,
                pod_index,
                route.dst,
                addressing.gateway_of(route),
            )
            .await?;
        }
    }
    enable_forwarding(addressing)?;
    Ok((
        Interface {
            name: host_name.to_string(),
            mac: mac_of(&host_link),
            sandbox: None,
        },
        Interface {
            name: call.ifname.clone(),
            mac: mac_of(&pod_link),
            sandbox: Some(netns.display().to_string()),
        },
    ))
}

/// No DAD for the node's end: the kernel sends a neighbour solicitation for traffic it
/// forwards only from a link-local address that has passed DAD, so for about 2 s a new
/// pod would get nothing but the node's own packets. A veth has one other end, the pod's,
/// so its address cannot be duplicated.
fn skip_duplicate_detection(host_name: &str) -> Result<(), Error> {
    let switch = format!("/proc/sys/net/ipv6/conf/{host_name}/accept_dad");
    std::fs::write(&switch, "0")
        .map_err(|e| Error::new(code::IO, format!("writing 0 to {switch}: {e}")))
}

/// The node's end takes no router advertisement or redirect from the pod, whatever the
/// node forwards (CVE-2020-10749; the reference `ptp` plugin does the same since 0.8.6):
/// a pod with `CAP_NET_RAW` could otherwise give the node a default route, or a route to
/// any prefix, through itself. Written before the link is up, so no message is taken
/// meanwhile. A node without IPv6 has no such switches, and nothing to protect.
fn refuse_router_messages(host_name: &str) -> Result<(), Error> {
    let conf = Path::new("/proc/sys/net/ipv6/conf").join(host_name);
    if !conf.exists() {
        return Ok(());
    }
    for switch in ["accept_ra", "accept_redirects"] {
        let path = conf.join(switch);
        std::fs::write(&path, "0")
            .map_err(|e| Error::new(code::IO, format!("writing 0 to {}: {e}", path.display())))?;
    }
    Ok(())
}

async fn set_up(handle: &Handle, index: u32, name: &str) -> Result<(), Error> {
    bounded(
        format_args!("setting link {name} up"),
        handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute(),
    )
    .await
}

/// Adds `address` with no duplicate detection (it comes from the node's own range, and a
/// tentative IPv6 address would hold the pod's first packets) and no prefix route (the
/// routes below say where the prefix goes). An address already there is kept.
async fn add_address(handle: &Handle, index: u32, address: Prefix) -> Result<(), Error> {
    let mut request = handle.address().add(index, address.addr, address.len);
    request
        .message_mut()
        .attributes
        .push(AddressAttribute::Flags(
            AddressFlags::Nodad | AddressFlags::Noprefixroute,
        ));
    let context = format_args!("adding address {address}");
    bounded_unless(context, request.execute(), Some((libc::EEXIST, ()))).await
}

/// A route to `dst` over link `index`: through `via`, or on the link itself.
async fn add_route(
    handle: &Handle,
    index: u32,
    dst: Prefix,
    via: Option<IpAddr>,
) -> Result<(), Error> {
    let mut route = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dst.addr, dst.len)
        .map_err(|e| invalid_route(dst, e))?
        .output_interface(index);
    route = match via {
        Some(gateway) => route.gateway(gateway).map_err(|e| invalid_route(dst, e))?,
        None => route.scope(RouteScope::Link),
    };
    let context = match via {
        Some(gateway) => format!("adding the route to {dst} via {gateway}"),
        None => format!("adding the route to {dst} on the link"),
    };
    bounded(context, handle.route().add(route.build()).execute()).await
}

fn invalid_route(dst: Prefix, error: impl std::fmt::Display) -> Error {
    Error::config(format!("route {dst}: {error}"))
}

/// The node forwards between the pod and the rest, for each family the pod has.
fn enable_forwarding(addressing: &Addressing) -> Result<(), Error> {
    let switches = [
        (
            IpAddr::from(Ipv4Addr::UNSPECIFIED),
            "/proc/sys/net/ipv4/ip_forward",
        ),
        (
            Ipv6Addr::UNSPECIFIED.into(),
            "/proc/sys/net/ipv6/conf/all/forwarding",
        ),
    ];
    for (family, switch) in switches
        .into_iter()
        .filter(|(family, _)| addressing.has_family_of(*family))
    {
        if std::fs::read_to_string(switch).is_ok_and(|v| v.trim() == "1") {
            continue;
        }
        if family.is_ipv6() {
            keep_accepting_router_advertisements(Path::new("/proc/sys/net/ipv6/conf"))?;
        }
        std::fs::write(switch, "1")
            .map_err(|e| Error::new(code::IO, format!("writing 1 to {switch}: {e}")))?;
    }
    Ok(())
}

/// A forwarding node ignores router advertisements where `accept_ra` is 1, so a host
/// that takes its IPv6 default route from SLAAC would lose it with its first IPv6 pod:
/// every interface that accepts them now is set to 2, which accepts them while forwarding.
/// Not `default`, which every later link (each pod's node end among them) would inherit,
/// nor a pod link's node end, which takes none ([`refuse_router_messages`]).
fn keep_accepting_router_advertisements(conf: &Path) -> Result<(), Error> {
    let entries = std::fs::read_dir(conf)
        .map_err(|e| Error::new(code::IO, format!("reading {}: {e}", conf.display())))?;
    for entry in entries.flatten() {
        let accept_ra = entry.path().join("accept_ra");
        let name = entry.file_name();
        if name == "all"
            || name == "default"
            || is_pod_link(&name.to_string_lossy())
            || !std::fs::read_to_string(&accept_ra).is_ok_and(|v| v.trim() == "1")
        {
            continue;
        }
        std::fs::write(&accept_ra, "2").map_err(|e| {
            Error::new(
                code::IO,
                format!("writing 2 to {}: {e}", accept_ra.display()),
            )
        })?;
    }
    Ok(())
}

/// Whether `name` is a pod link's node end, as [`crate::protocol::host_link_name`] names
/// them: its group says so too, but `/proc` shows names only.
fn is_pod_link(name: &str) -> bool {
    name.len() == crate::protocol::HOST_LINK_NAME_LEN
        && name.starts_with(crate::protocol::HOST_LINK_PREFIX)
        && name[crate::protocol::HOST_LINK_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

/// `DEL`: removes the pod's link, and with it the node's end, its addresses and routes.
/// A namespace or a link already gone is not an error: `DEL` may come more than once.
pub async fn del(call: &Invocation) -> Result<(), Error> {
    let node = connect()?;
    if let Some(netns) = &call.netns {
        match Namespaces::open(netns) {
            Ok(namespaces) => delete(&namespaces.pod, &call.ifname).await?,
            Err(error) if error.code == code::UNKNOWN_CONTAINER => {}
            Err(error) => return Err(error),
        }
    }
    // An end left on the node by an ADD that failed before the pod's end was made.
    delete(
        &node,
        &crate::protocol::host_link_name(&call.container_id, &call.ifname),
    )
    .await
}

/// What the node's end of a pod's link carries as its alias (`ip link` shows it), so that
/// `GC` knows the links this plugin made, for which network and whose they are.
const ALIAS_PREFIX: &str = "nodus-cni ";

fn attachment_alias(network: &str, container_id: &str, ifname: &str) -> String {
    format!("{ALIAS_PREFIX}{network} {container_id} {ifname}")
}

/// The attachment to `network` an alias of [`attachment_alias`] names; `None` for another
/// network's link (CNI names hold no spaces).
fn attachment_of(alias: &str, network: &str) -> Option<Attachment> {
    let rest = alias.strip_prefix(ALIAS_PREFIX)?.strip_prefix(network)?;
    let (container_id, ifname) = rest.strip_prefix(' ')?.split_once(' ')?;
    Some(Attachment {
        container_id: container_id.to_string(),
        ifname: ifname.to_string(),
    })
}

/// `GC` of `network`: deletes every link this plugin made on the node for that network
/// whose attachment is not in `valid` (sorted), and with it the pod's end, its addresses
/// and routes. Links made by anything else, or for another network, are never touched.
/// Returns how many went.
pub async fn gc(network: &str, valid: &[Attachment]) -> Result<usize, Error> {
    let node = connect()?;
    let links: Vec<LinkMessage> = bounded(
        format_args!("listing the node's links"),
        node.link().get().execute().try_collect(),
    )
    .await?;
    let mut removed = 0;
    for link in links {
        let stale = link.attributes.iter().any(|a| match a {
            LinkAttribute::IfAlias(alias) => {
                attachment_of(alias, network).is_some_and(|a| valid.binary_search(&a).is_err())
            }
            _ => false,
        });
        if stale {
            let request = node.link().del(link.header.index).execute();
            let context = format_args!("deleting the stale link {}", link.header.index);
            bounded_unless(context, request, Some((libc::ENODEV, ()))).await?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// `CHECK`: the pod's link is there, up, with every address of the previous result.
pub async fn check(call: &Invocation, netns: &Path, addressing: &Addressing) -> Result<(), Error> {
    let namespaces = Namespaces::open(netns)?;
    let link = find(&namespaces.pod, &call.ifname)
        .await?
        .ok_or_else(|| Error::kernel(format!("the pod has no link {}", call.ifname)))?;
    if !link.header.flags.contains(LinkFlags::Up) {
        return Err(Error::kernel(format!(
            "the pod's link {} is down",
            call.ifname
        )));
    }
    let index = link.header.index;
    let listed: Vec<_> = bounded(
        format_args!("listing the addresses of {}", call.ifname),
        namespaces
            .pod
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect::<Vec<_>>(),
    )
    .await?;
    for address in &addressing.addresses {
        let present = listed.iter().any(|message| {
            message.header.prefix_len == address.address.len
                && message.attributes.iter().any(
                    |a| matches!(a, AddressAttribute::Address(ip) if *ip == address.address.addr),
                )
        });
        if !present {
            return Err(Error::kernel(format!(
                "the pod's link {} lacks address {}",
                call.ifname, address.address
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod alias_tests {
    use super::*;

    #[test]
    fn an_alias_names_its_attachment_and_no_other_is_ours() {
        let alias = attachment_alias("nodus", "0123abcd", "eth0");
        assert_eq!(
            attachment_of(&alias, "nodus"),
            Some(Attachment {
                container_id: "0123abcd".into(),
                ifname: "eth0".into()
            })
        );
        assert_eq!(attachment_of(&alias, "nodus-b"), None, "another network's");
        assert_eq!(
            attachment_of(&alias, "nod"),
            None,
            "a prefix is not the name"
        );
        assert_eq!(attachment_of("uplink to the rack switch", "nodus"), None);
        assert_eq!(attachment_of("nodus-cni", "nodus"), None);
    }
}
