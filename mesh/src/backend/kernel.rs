//! The kernel backend: a `wireguard` link made over rtnetlink and configured over generic
//! netlink (the family `wg` uses), peers in chunks per message, never `REPLACE_PEERS`.
//!
//! Untested here: the test machines' kernel has no WireGuard module, so `open` fails with
//! "Unknown device type" and `auto` falls back to the userspace backend. The message
//! layout follows the kernel's `include/uapi/linux/wireguard.h`.

use super::DeviceState;
use crate::Error;
use crate::key::Key;
use crate::links::Links;
use crate::links::REQUEST_TIMEOUT;
use crate::plan::PeerChange;
use futures::StreamExt;
use genetlink::GenetlinkHandle;
use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::GenlMessage;
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute,
    WireguardCmd, WireguardMessage, WireguardPeer, WireguardPeerAttribute, WireguardPeerFlags,
};
use nodus_view::model::Cidr;
use std::time::{Duration, SystemTime};

/// Peers per generic netlink message: a peer with two allowed IPs takes about 120 bytes,
/// and the kernel reads messages into a 32 KiB buffer (`wg` also splits its writes).
const PEERS_PER_MESSAGE: usize = 100;

pub struct KernelDevice {
    name: String,
    genl: GenetlinkHandle,
}

impl KernelDevice {
    /// Creates the `wireguard` link `name` unless it exists; a link of another kind with
    /// that name (a userspace TUN) is an error, so that `auto` picks the userspace backend.
    pub async fn open(name: &str) -> Result<KernelDevice, Error> {
        let links = Links::new()?;
        match links.find(name).await? {
            Some(link) if !link.wireguard => {
                return Err(Error::device(
                    format!("link {name}"),
                    "exists and is not a kernel WireGuard device",
                ));
            }
            Some(_) => {}
            None => links.add_wireguard(name).await?,
        }
        let (connection, genl, _) =
            genetlink::new_connection().map_err(Error::io("opening generic netlink"))?;
        tokio::spawn(connection);
        Ok(KernelDevice {
            name: name.to_string(),
            genl,
        })
    }

    /// Sends one message; returns the replies (for a dump) or nothing (for an ack). A
    /// kernel that does not answer within [`REQUEST_TIMEOUT`] fails the request.
    async fn send(
        &mut self,
        attributes: Vec<WireguardAttribute>,
        cmd: WireguardCmd,
    ) -> Result<Vec<WireguardMessage>, Error> {
        let context = format!("WireGuard netlink on {}", self.name);
        tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(attributes, cmd))
            .await
            .unwrap_or_else(|_| {
                Err(Error::device(
                    context,
                    format!("no reply from the kernel within {REQUEST_TIMEOUT:?}"),
                ))
            })
    }

    async fn exchange(
        &mut self,
        attributes: Vec<WireguardAttribute>,
        cmd: WireguardCmd,
    ) -> Result<Vec<WireguardMessage>, Error> {
        let context = || format!("WireGuard netlink on {}", self.name);
        let mut message = NetlinkMessage::from(GenlMessage::from_payload(WireguardMessage {
            cmd,
            attributes,
        }));
        message.header.flags = match cmd {
            WireguardCmd::GetDevice => NLM_F_REQUEST | NLM_F_DUMP,
            _ => NLM_F_REQUEST | NLM_F_ACK,
        };
        let mut replies = self
            .genl
            .request(message)
            .await
            .map_err(|e| Error::device(context(), e))?;
        let mut out = Vec::new();
        while let Some(reply) = replies.next().await {
            let reply = reply.map_err(|e| Error::device(context(), e))?;
            match reply.payload {
                NetlinkPayload::InnerMessage(genl) => out.push(genl.payload),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(Error::device(context(), e.to_io()));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    pub async fn state(&mut self) -> Result<DeviceState, Error> {
        let name = WireguardAttribute::IfName(self.name.clone());
        let replies = self.send(vec![name], WireguardCmd::GetDevice).await?;
        let mut state = DeviceState::default();
        // A device with many peers comes in several messages; a peer may span two.
        for attribute in replies.into_iter().flat_map(|m| m.attributes) {
            match attribute {
                WireguardAttribute::PrivateKey(k) if k != [0; 32] => {
                    state.private_key = Some(Key(k));
                }
                WireguardAttribute::ListenPort(p) => state.listen_port = p,
                WireguardAttribute::Peers(peers) => {
                    for peer in peers {
                        merge_peer(&mut state, peer);
                    }
                }
                _ => {}
            }
        }
        for peer in state.peers.values_mut() {
            peer.peer.allowed_ips.sort_unstable();
        }
        Ok(state)
    }

    pub async fn set_identity(&mut self, private: &Key, port: u16) -> Result<(), Error> {
        let attributes = vec![
            WireguardAttribute::IfName(self.name.clone()),
            WireguardAttribute::PrivateKey(private.0),
            WireguardAttribute::ListenPort(port),
        ];
        self.send(attributes, WireguardCmd::SetDevice)
            .await
            .map(drop)
    }

    pub async fn apply(&mut self, changes: &[PeerChange]) -> Result<(), Error> {
        for chunk in changes.chunks(PEERS_PER_MESSAGE) {
            let peers = chunk.iter().map(peer_message).collect();
            let attributes = vec![
                WireguardAttribute::IfName(self.name.clone()),
                WireguardAttribute::Peers(peers),
            ];
            self.send(attributes, WireguardCmd::SetDevice).await?;
        }
        Ok(())
    }
}

fn peer_message(change: &PeerChange) -> WireguardPeer {
    match change {
        PeerChange::Remove(key) => WireguardPeer(vec![
            WireguardPeerAttribute::PublicKey(key.0),
            WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe),
        ]),
        PeerChange::Upsert(key, peer) => {
            let mut attributes = vec![
                WireguardPeerAttribute::PublicKey(key.0),
                WireguardPeerAttribute::Flags(WireguardPeerFlags::ReplaceAllowedIps),
            ];
            if let Some(endpoint) = peer.endpoint {
                attributes.push(WireguardPeerAttribute::Endpoint(endpoint));
            }
            attributes.push(WireguardPeerAttribute::PersistentKeepalive(peer.keepalive));
            let allowed = peer
                .allowed_ips
                .iter()
                .map(|c| {
                    let family = match c.addr {
                        std::net::IpAddr::V4(_) => WireguardAddressFamily::Ipv4,
                        std::net::IpAddr::V6(_) => WireguardAddressFamily::Ipv6,
                    };
                    WireguardAllowedIp(vec![
                        WireguardAllowedIpAttr::Family(family),
                        WireguardAllowedIpAttr::IpAddr(c.addr),
                        WireguardAllowedIpAttr::Cidr(c.prefix),
                    ])
                })
                .collect();
            attributes.push(WireguardPeerAttribute::AllowedIps(allowed));
            WireguardPeer(attributes)
        }
    }
}

fn merge_peer(state: &mut DeviceState, peer: WireguardPeer) {
    let Some(key) = peer.0.iter().find_map(|a| match a {
        WireguardPeerAttribute::PublicKey(k) => Some(Key(*k)),
        _ => None,
    }) else {
        return;
    };
    let entry = state.peers.entry(key).or_default();
    for attribute in peer.0 {
        match attribute {
            WireguardPeerAttribute::Endpoint(e) => entry.peer.endpoint = Some(e),
            WireguardPeerAttribute::PersistentKeepalive(n) => entry.peer.keepalive = n,
            WireguardPeerAttribute::RxBytes(n) => entry.rx_bytes = n,
            WireguardPeerAttribute::TxBytes(n) => entry.tx_bytes = n,
            WireguardPeerAttribute::LastHandshake(t) if t.seconds > 0 => {
                entry.last_handshake = SystemTime::UNIX_EPOCH.checked_add(Duration::new(
                    t.seconds.unsigned_abs(),
                    t.nano_seconds.clamp(0, 999_999_999) as u32,
                ));
            }
            WireguardPeerAttribute::AllowedIps(ips) => {
                for ip in ips {
                    let addr = ip.0.iter().find_map(|a| match a {
                        WireguardAllowedIpAttr::IpAddr(a) => Some(*a),
                        _ => None,
                    });
                    let prefix = ip.0.iter().find_map(|a| match a {
                        WireguardAllowedIpAttr::Cidr(p) => Some(*p),
                        _ => None,
                    });
                    if let (Some(addr), Some(prefix)) = (addr, prefix) {
                        entry.peer.allowed_ips.push(Cidr { addr, prefix });
                    }
                }
            }
            _ => {}
        }
    }
}
