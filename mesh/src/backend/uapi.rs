//! The cross-platform UAPI (`/var/run/wireguard/<device>.sock`, the protocol `wg`
//! speaks): how nodus drives both userspace backends, `wireguard-go` and the embedded
//! boringtun, which serve the same socket. Requests are per-peer `set`s and `get`s; never
//! `replace_peers`.

use super::{DeviceState, PeerState};
use crate::Error;
use crate::key::Key;
use crate::plan::PeerChange;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Where `wireguard-go`, boringtun and `wg` put the UAPI sockets. It is not per network
/// namespace, so device names must be unique on the host.
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// How long one request may take, connect to reply: a stopped or wedged daemon must not
/// freeze the mesh's task.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest reply read: about 300 bytes per peer, so room for 50,000 peers. A daemon
/// that streams without ending its reply is cut off here.
const MAX_REPLY: usize = 16 << 20;

/// A client of one device's UAPI socket.
pub struct UapiDevice {
    socket: PathBuf,
}

impl UapiDevice {
    /// The client of device `name`'s socket (which may not exist yet).
    pub fn of(name: &str) -> UapiDevice {
        UapiDevice {
            socket: Path::new(SOCKET_DIR).join(format!("{name}.sock")),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// What an error of this device's requests names.
    fn context(&self) -> String {
        format!("UAPI {}", self.socket.display())
    }

    async fn request(&self, body: &str) -> Result<String, Error> {
        let context = || self.context();
        let reply = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(body))
            .await
            .map_err(|_| {
                Error::device(
                    context(),
                    format!("no reply within {REQUEST_TIMEOUT:?}: the daemon is stopped or wedged"),
                )
            })??;
        match errno(&reply) {
            Some(0) => Ok(reply),
            Some(code) => Err(Error::device(
                context(),
                format!(
                    "the device refused the request: {}",
                    std::io::Error::from_raw_os_error(code)
                ),
            )),
            None => Err(Error::device(context(), "no errno in the reply")),
        }
    }

    /// Sends `body` and reads the reply up to its blank line.
    async fn exchange(&self, body: &str) -> Result<String, Error> {
        let context = || self.context();
        let mut stream = UnixStream::connect(&self.socket)
            .await
            .map_err(Error::io(context()))?;
        stream
            .write_all(body.as_bytes())
            .await
            .map_err(Error::io(context()))?;
        let mut reply = Vec::with_capacity(4096);
        let mut chunk = vec![0; 64 * 1024];
        while !reply.ends_with(b"\n\n") {
            let n = stream
                .read(&mut chunk)
                .await
                .map_err(Error::io(context()))?;
            if n == 0 {
                return Err(Error::device(context(), "the device closed the socket"));
            }
            if reply.len() + n > MAX_REPLY {
                return Err(Error::device(
                    context(),
                    format!("a reply longer than {MAX_REPLY} bytes"),
                ));
            }
            reply.extend_from_slice(&chunk[..n]);
        }
        String::from_utf8(reply).map_err(|e| Error::device(context(), e))
    }

    pub async fn state(&self) -> Result<DeviceState, Error> {
        let reply = self.request("get=1\n\n").await?;
        parse_get(&reply).map_err(|m| Error::device(self.context(), m))
    }

    pub async fn set_identity(&self, private: &Key, port: u16) -> Result<(), Error> {
        self.request(&format!(
            "set=1\nprivate_key={}\nlisten_port={port}\n\n",
            private.to_hex()
        ))
        .await
        .map(drop)
    }

    /// One `set` with a block per peer: never `replace_peers`.
    pub async fn apply(&self, changes: &[PeerChange]) -> Result<(), Error> {
        self.request(&format_changes(changes)).await.map(drop)
    }
}

fn errno(reply: &str) -> Option<i32> {
    reply
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("errno="))
        .and_then(|v| v.parse().ok())
}

/// The `set=1` request for `changes`.
pub fn format_changes(changes: &[PeerChange]) -> String {
    let mut out = String::with_capacity(64 + changes.len() * 160);
    out.push_str("set=1\n");
    for change in changes {
        match change {
            PeerChange::Remove(key) => {
                let _ = write!(out, "public_key={}\nremove=true\n", key.to_hex());
            }
            PeerChange::Upsert(key, peer) => {
                let _ = writeln!(out, "public_key={}", key.to_hex());
                if let Some(endpoint) = peer.endpoint {
                    let _ = writeln!(out, "endpoint={endpoint}");
                }
                let _ = writeln!(out, "persistent_keepalive_interval={}", peer.keepalive);
                out.push_str("replace_allowed_ips=true\n");
                for ip in &peer.allowed_ips {
                    let _ = writeln!(out, "allowed_ip={ip}");
                }
            }
        }
    }
    out.push('\n');
    out
}

/// The reply to `get=1`.
pub fn parse_get(reply: &str) -> Result<DeviceState, String> {
    let mut state = DeviceState::default();
    let mut current: Option<(Key, PeerState)> = None;
    let mut handshake = (0u64, 0u32);
    let finish = |current: &mut Option<(Key, PeerState)>,
                  handshake: &mut (u64, u32),
                  state: &mut DeviceState| {
        if let Some((key, mut peer)) = current.take() {
            peer.peer.allowed_ips.sort_unstable();
            if *handshake != (0, 0) {
                // `Duration::new` would panic on a nanosecond carry past u64 seconds.
                peer.last_handshake = Duration::from_secs(handshake.0)
                    .checked_add(Duration::from_nanos(u64::from(handshake.1)))
                    .and_then(|since| SystemTime::UNIX_EPOCH.checked_add(since));
            }
            state.peers.insert(key, peer);
        }
        *handshake = (0, 0);
    };
    for line in reply.lines().filter(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once('=')
            .ok_or_else(|| format!("malformed line {line:?}"))?;
        let bad = || format!("bad {name} {value:?}");
        let number = || value.parse::<u64>().map_err(|_| bad());
        match (name, current.as_mut()) {
            ("public_key", _) => {
                finish(&mut current, &mut handshake, &mut state);
                let key = Key::from_hex(value).ok_or_else(bad)?;
                current = Some((key, PeerState::default()));
            }
            ("private_key", None) => {
                state.private_key = Some(Key::from_hex(value).ok_or_else(bad)?)
            }
            ("listen_port", None) => state.listen_port = value.parse().map_err(|_| bad())?,
            ("endpoint", Some((_, p))) => p.peer.endpoint = Some(value.parse().map_err(|_| bad())?),
            ("allowed_ip", Some((_, p))) => {
                p.peer.allowed_ips.push(value.parse().map_err(|_| bad())?)
            }
            ("persistent_keepalive_interval", Some((_, p))) => {
                p.peer.keepalive = value.parse().map_err(|_| bad())?
            }
            ("rx_bytes", Some((_, p))) => p.rx_bytes = number()?,
            ("tx_bytes", Some((_, p))) => p.tx_bytes = number()?,
            ("last_handshake_time_sec", Some(_)) => handshake.0 = number()?,
            ("last_handshake_time_nsec", Some(_)) => {
                handshake.1 = value.parse().map_err(|_| bad())?
            }
            // fwmark, preshared keys, protocol version and errno: unused.
            _ => {}
        }
    }
    finish(&mut current, &mut handshake, &mut state);
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Peer;

    #[test]
    fn a_get_reply_parses() {
        let a = Key([1; 32]);
        let b = Key([2; 32]);
        let reply = format!(
            "private_key={}\nlisten_port=51820\npublic_key={}\nprotocol_version=1\n\
             endpoint=192.168.1.2:51820\nlast_handshake_time_sec=1700000000\n\
             last_handshake_time_nsec=5\ntx_bytes=10\nrx_bytes=20\n\
             persistent_keepalive_interval=0\nallowed_ip=fd00:10:244:2::/64\n\
             allowed_ip=10.244.2.0/24\npublic_key={}\nendpoint=[fd00::3]:51820\n\
             last_handshake_time_sec=0\nlast_handshake_time_nsec=0\nallowed_ip=10.244.3.0/24\n\
             errno=0\n\n",
            a.to_hex(),
            b.to_hex(),
            a.to_hex()
        );
        let state = parse_get(&reply).expect("parses");
        assert_eq!(state.private_key, Some(a));
        assert_eq!(state.listen_port, 51820);
        let pb = &state.peers[&b];
        assert_eq!(pb.rx_bytes, 20);
        assert_eq!(pb.peer.keepalive, 0);
        assert_eq!(pb.tx_bytes, 10);
        assert_eq!(
            pb.peer.allowed_ips,
            vec![
                "10.244.2.0/24".parse().expect("c"),
                "fd00:10:244:2::/64".parse().expect("c")
            ]
        );
        assert!(pb.last_handshake.is_some());
        let pa = &state.peers[&a];
        assert_eq!(
            pa.peer.endpoint,
            Some("[fd00::3]:51820".parse().expect("addr"))
        );
        assert_eq!(pa.last_handshake, None);
        assert_eq!(errno(&reply), Some(0));
        assert!(parse_get("listen_port=x\n").is_err());
        // A handshake time at the end of u64 seconds with a nanosecond carry is no time.
        let overflow = format!(
            "public_key={}\nlast_handshake_time_sec={}\nlast_handshake_time_nsec=1000000000\n",
            a.to_hex(),
            u64::MAX
        );
        let state = parse_get(&overflow).expect("parses");
        assert_eq!(state.peers[&a].last_handshake, None);
    }

    #[test]
    fn changes_are_per_peer_and_never_replace_the_set() {
        let peer = Peer {
            endpoint: Some("192.168.1.2:51820".parse().expect("addr")),
            allowed_ips: vec!["10.244.2.0/24".parse().expect("cidr")],
            keepalive: 25,
        };
        let text = format_changes(&[
            PeerChange::Remove(Key([1; 32])),
            PeerChange::Upsert(Key([2; 32]), peer),
        ]);
        assert_eq!(
            text,
            format!(
                "set=1\npublic_key={}\nremove=true\npublic_key={}\nendpoint=192.168.1.2:51820\n\
                 persistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.244.2.0/24\n\n",
                Key([1; 32]).to_hex(),
                Key([2; 32]).to_hex()
            )
        );
        assert!(!text.contains("replace_peers"));
    }
}
