//! The device's link, addresses and routes, over rtnetlink.
//!
//! Routes through the device in the main table are the mesh's: one per remote pod CIDR,
//! scope link, protocol `static`. Routes the kernel derives itself (protocol `kernel`) and
//! IPv6 link-local addresses are left alone.

use crate::Error;
use futures::TryStreamExt;
use nodus_view::model::Cidr;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::{Handle, LinkUnspec, LinkWireguard, RouteMessageBuilder};
use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// The kernel answers an rtnetlink request at once; one it does not answer fails after
/// this, rather than freezing the mesh's task.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `request`, failing after [`REQUEST_TIMEOUT`]; errors say what was being done.
async fn bounded<T>(
    context: impl Into<String>,
    request: impl Future<Output = Result<T, rtnetlink::Error>>,
) -> Result<T, Error> {
    let context = context.into();
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(result) => result.map_err(Error::netlink(context)),
        Err(_) => Err(Error::device(
            context,
            format!("no reply from the kernel within {REQUEST_TIMEOUT:?}"),
        )),
    }
}

pub struct Links {
    handle: Handle,
}

/// A link as the mesh needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub mtu: Option<u32>,
    pub up: bool,
    /// A kernel `wireguard` link, not a userspace TUN.
    pub wireguard: bool,
}

impl Links {
    pub fn new() -> Result<Links, Error> {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(Error::io("opening rtnetlink"))?;
        tokio::spawn(connection);
        Ok(Links { handle })
    }

    pub async fn link(&self, name: &str) -> Result<Link, Error> {
        self.find(name)
            .await?
            .ok_or_else(|| Error::device(format!("link {name}"), "not found"))
    }

    /// Creates a kernel `wireguard` link named `name`.
    pub async fn add_wireguard(&self, name: &str) -> Result<(), Error> {
        let request = self
            .handle
            .link()
            .add(LinkWireguard::new(name).build())
            .execute();
        bounded(format!("creating the wireguard link {name}"), request).await
    }

    /// Looks a link up by name, `None` when there is none.
    pub async fn find(&self, name: &str) -> Result<Option<Link>, Error> {
        let mut replies = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        let request = replies.try_next();
        let context = format!("finding link {name}");
        let found = tokio::time::timeout(REQUEST_TIMEOUT, request)
            .await
            .map_err(|_| {
                Error::device(
                    context.clone(),
                    format!("no reply from the kernel within {REQUEST_TIMEOUT:?}"),
                )
            })?;
        match found {
            Ok(message) => Ok(message.map(|message| Link {
                index: message.header.index,
                mtu: mtu_of(&message),
                up: message.header.flags.contains(LinkFlags::Up),
                wireguard: is_wireguard(&message),
            })),
            // The kernel answers ENODEV for a name it does not know.
            Err(rtnetlink::Error::NetlinkError(error))
                if error.code.map(|code| code.get()) == Some(-libc::ENODEV) =>
            {
                Ok(None)
            }
            Err(error) => Err(Error::netlink(context)(error)),
        }
    }

    /// Deletes a link; the kernel removes its addresses and routes with it.
    pub async fn delete(&self, index: u32) -> Result<(), Error> {
        let request = self.handle.link().del(index).execute();
        bounded(format!("deleting link {index}"), request).await
    }

    pub async fn set_up_with_mtu(&self, index: u32, mtu: u32) -> Result<(), Error> {
        let request = self
            .handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().mtu(mtu).build())
            .execute();
        bounded(format!("setting link {index} up, mtu {mtu}"), request).await
    }

    /// The MTU of the link that holds `ip` (the underlay under our endpoint).
    pub async fn mtu_of_address(&self, ip: IpAddr) -> Result<Option<u32>, Error> {
        let mut replies = self.handle.address().get().set_address_filter(ip).execute();
        let request = replies.try_next();
        let found = bounded(format!("finding the link of {ip}"), request).await?;
        let Some(address) = found else {
            return Ok(None);
        };
        let mut replies = self
            .handle
            .link()
            .get()
            .match_index(address.header.index)
            .execute();
        let request = replies.try_next();
        let message = bounded(format!("reading the link of {ip}"), request).await?;
        Ok(message.as_ref().and_then(mtu_of))
    }

    async fn address_messages(&self, index: u32) -> Result<Vec<AddressMessage>, Error> {
        let request = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect();
        bounded(format!("listing addresses of link {index}"), request).await
    }

    /// The device's addresses as host prefixes, IPv6 link-local ones left out.
    pub async fn addresses(&self, index: u32) -> Result<BTreeSet<Cidr>, Error> {
        Ok(self
            .address_messages(index)
            .await?
            .iter()
            .filter_map(address_of)
            .collect())
    }

    pub async fn add_address(&self, index: u32, address: Cidr) -> Result<(), Error> {
        let request = self
            .handle
            .address()
            .add(index, address.addr, address.prefix)
            .replace()
            .execute();
        bounded(format!("adding {address} to link {index}"), request).await
    }

    pub async fn remove_address(&self, index: u32, address: Cidr) -> Result<(), Error> {
        for message in self.address_messages(index).await? {
            if address_of(&message) == Some(address) {
                let request = self.handle.address().del(message).execute();
                bounded(format!("removing {address} from link {index}"), request).await?;
            }
        }
        Ok(())
    }

    /// Destinations routed through link `index` in the main table, by us.
    pub async fn routes(&self, index: u32) -> Result<BTreeSet<Cidr>, Error> {
        let mut out = BTreeSet::new();
        let filters = [
            RouteMessageBuilder::<Ipv4Addr>::new().build(),
            RouteMessageBuilder::<Ipv6Addr>::new().build(),
        ];
        for filter in filters {
            let request = self.handle.route().get(filter).execute().try_collect();
            let routes: Vec<RouteMessage> =
                bounded(format!("listing routes of link {index}"), request).await?;
            out.extend(routes.iter().filter_map(|r| ours(r, index)));
        }
        Ok(out)
    }

    pub async fn add_route(&self, index: u32, destination: Cidr) -> Result<(), Error> {
        let request = self
            .handle
            .route()
            .add(route_message(index, destination)?)
            .replace()
            .execute();
        bounded(format!("routing {destination} to link {index}"), request).await
    }

    pub async fn remove_route(&self, index: u32, destination: Cidr) -> Result<(), Error> {
        let request = self
            .handle
            .route()
            .del(route_message(index, destination)?)
            .execute();
        bounded(format!("removing the route to {destination}"), request).await
    }
}

fn is_wireguard(link: &LinkMessage) -> bool {
    link.attributes.iter().any(|a| {
        matches!(a, LinkAttribute::LinkInfo(infos)
            if infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Wireguard))))
    })
}

fn mtu_of(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Mtu(m) => Some(*m),
        _ => None,
    })
}

fn address_of(message: &AddressMessage) -> Option<Cidr> {
    let addr = message.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    })?;
    let link_local = matches!(addr, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
    (!link_local).then_some(Cidr {
        addr,
        prefix: message.header.prefix_len,
    })
}

fn route_message(index: u32, destination: Cidr) -> Result<RouteMessage, Error> {
    Ok(RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(destination.addr, destination.prefix)
        .map_err(|e| Error::device(format!("route to {destination}"), e))?
        .output_interface(index)
        .scope(RouteScope::Link)
        .protocol(RouteProtocol::Static)
        .kind(RouteType::Unicast)
        .table_id(u32::from(RouteHeader::RT_TABLE_MAIN))
        .build())
}

/// The destination of `route` if it is one of the mesh's on link `index`.
fn ours(route: &RouteMessage, index: u32) -> Option<Cidr> {
    let header = &route.header;
    let main = header.table == RouteHeader::RT_TABLE_MAIN
        || route.attributes.contains(&RouteAttribute::Table(u32::from(
            RouteHeader::RT_TABLE_MAIN,
        )));
    if !main
        || header.protocol == RouteProtocol::Kernel
        || header.kind != RouteType::Unicast
        || !route.attributes.contains(&RouteAttribute::Oif(index))
    {
        return None;
    }
    let prefix = header.destination_prefix_length;
    let addr = route.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
        RouteAttribute::Destination(RouteAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
        _ => None,
    });
    match (addr, header.address_family) {
        (Some(addr), _) => Some(Cidr { addr, prefix }),
        // A default route has no destination attribute.
        (None, AddressFamily::Inet) => Some(Cidr {
            addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            prefix: 0,
        }),
        (None, _) => Some(Cidr {
            addr: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            prefix: 0,
        }),
    }
}
