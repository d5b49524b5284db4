//! Start-up checks of the host: what each subsystem needs from the node before it starts,
//! one clear error each, naming the configuration key it concerns. The proxy needs Linux
//! 6.2 and nftables netlink; the mesh a WireGuard backend that can run here, a CNI
//! directory it can write and the conflist's plugins in the runtime's plugin directory;
//! DNS its listen addresses free.
//!
//! `nodus check-config --host` fails on them. `nodus run` logs them and starts anyway:
//! each subsystem is retried until the host allows it (systemd-resolved stopped, a module
//! loaded, a directory mounted), and the kernel version, which no retry changes, already
//! ended it.

use crate::config::Config;
use nodus_mesh::config::{Backend as MeshBackend, Config as MeshConfig};
use std::collections::{BTreeSet, HashSet};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

/// Every check `config` calls for; one line per failure. With `dns_sockets_inherited`, a
/// nodus before this one handed its DNS sockets over, and the ports are rightly taken.
pub fn check_host(config: &Config, dns_sockets_inherited: bool) -> Vec<String> {
    let mut failures = Vec::new();
    if config.proxy.enabled
        && let Err(error) = nodus_proxy::kernel::check_running()
    {
        failures.push(format!("proxy.enabled: {error}"));
    }
    if config.programs_table()
        && let Err(error) = nodus_proxy::nft::Socket::open().and_then(|mut s| s.generation())
    {
        failures.push(format!(
            "proxy.enabled: the kernel does not answer nftables netlink requests ({error}); \
             nodus needs nf_tables and CAP_NET_ADMIN"
        ));
    }
    if config.mesh.enabled {
        failures.extend(wireguard_backend(&config.mesh));
        failures.extend(cni_directory(&config.mesh.cni_conflist));
        failures.extend(cni_plugins(&config.mesh.cni_bin_dir));
    }
    if config.dns.enabled && !dns_sockets_inherited {
        failures.extend(dns_addresses(&config.dns.listen));
    }
    failures
}

/// Whether the kernel has WireGuard: loaded, built in, or a module it can load.
fn kernel_wireguard() -> bool {
    if Path::new("/sys/module/wireguard").exists() {
        return true;
    }
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let modules = Path::new("/lib/modules").join(release.trim());
    let builtin = std::fs::read_to_string(modules.join("modules.builtin")).unwrap_or_default();
    let loadable = std::fs::read_to_string(modules.join("modules.dep")).unwrap_or_default();
    builtin
        .lines()
        .chain(loadable.lines())
        .any(|line| line.contains("/wireguard.ko"))
}

/// `program` as a path, or found on `$PATH` when it is a bare name, if it can run.
fn executable(program: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let candidates: Vec<PathBuf> = match program.components().count() {
        1 => std::env::var_os("PATH")
            .map(|path| {
                std::env::split_paths(&path)
                    .map(|dir| dir.join(program))
                    .collect()
            })
            .unwrap_or_default(),
        _ => vec![program.to_path_buf()],
    };
    candidates
        .into_iter()
        .find(|path| {
            std::fs::metadata(path)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| "not found, or not executable".to_string())
}

/// Whether a userspace device can be made: `/dev/net/tun` opens.
fn tun() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map(drop)
        .map_err(|error| format!("/dev/net/tun: {error}"))
}

fn wireguard_backend(mesh: &MeshConfig) -> Option<String> {
    let no_kernel = "this kernel has no wireguard module (not loaded, built in or installed)";
    let go = || {
        executable(&mesh.wireguard_go)
            .map_err(|error| format!("mesh.wireguard_go {}: {error}", mesh.wireguard_go.display()))
    };
    match mesh.backend {
        MeshBackend::Kernel => (!kernel_wireguard())
            .then(|| format!("mesh.backend kernel: {no_kernel}; use wireguard-go or embedded")),
        MeshBackend::WireguardGo => match go().and_then(|_| tun()) {
            Ok(()) => None,
            Err(error) => Some(format!("mesh.backend wireguard-go: {error}")),
        },
        MeshBackend::Embedded => tun()
            .err()
            .map(|error| format!("mesh.backend embedded: {error}")),
        // wireguard-go, when installed, or the embedded device; else the kernel's. The
        // device file first: it is one open, the module lists are long files to read.
        MeshBackend::Auto => match tun() {
            Ok(()) => None,
            Err(_) if kernel_wireguard() => None,
            Err(error) => Some(format!(
                "mesh.backend auto: {no_kernel}, and neither wireguard-go nor the embedded \
                 device can run without {error}"
            )),
        },
    }
}

/// The directory of `conflist` can be written (or made, from its nearest existing
/// ancestor).
fn cni_directory(conflist: &Path) -> Option<String> {
    let key = format!("mesh.cni_conflist {}", conflist.display());
    let dir = conflist.parent().unwrap_or(Path::new("/"));
    let existing = dir
        .ancestors()
        .find(|a| a.exists())
        .unwrap_or(Path::new("/"));
    if !existing.is_dir() {
        return Some(format!("{key}: {} is not a directory", existing.display()));
    }
    let probe = existing.join(format!(".nodus-check-{}", std::process::id()));
    match std::fs::write(&probe, b"") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            None
        }
        Err(error) => Some(format!(
            "{key}: cannot write in {}: {error}",
            existing.display()
        )),
    }
}

/// Every plugin the mesh's conflist names can run from `bin_dir`: without one, kubelet
/// makes no pod on this node, and says so only in each pod's events.
fn cni_plugins(bin_dir: &Path) -> Option<String> {
    let missing: Vec<&str> = nodus_mesh::conflist::PLUGINS
        .into_iter()
        .filter(|plugin| executable(&bin_dir.join(plugin)).is_err())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "mesh.cni_bin_dir {}: no executable {} (the init container's `nodus install-cni \
             --to {}` puts them there)",
            bin_dir.display(),
            missing.join(", "),
            bin_dir.display()
        )
    })
}

/// Each address DNS will bind (a wildcard that another server's address keeps from
/// binding stands for each host address, as DNS serves it) binds, over UDP and TCP.
fn dns_addresses(listen: &[SocketAddr]) -> Vec<String> {
    use nodus_dns::listen;
    let host = match listen::host_addresses() {
        Ok(host) => host,
        Err(error) => return vec![format!("dns.listen: listing the host's addresses: {error}")],
    };
    let mut failures = Vec::new();
    for addr in listen::addresses(&listen::plan(listen), &host) {
        let udp = UdpSocket::bind(addr).map(drop);
        let tcp = TcpListener::bind(addr).map(drop);
        for (protocol, bound) in [("udp", udp), ("tcp", tcp)] {
            let Err(error) = bound else { continue };
            let why = match error.kind() {
                ErrorKind::AddrInUse => match holders(protocol, addr.port()).as_slice() {
                    [] => format!("{protocol} port {} is in use", addr.port()),
                    holders => format!(
                        "{protocol} port {} is in use by {}",
                        addr.port(),
                        holders.join(", ")
                    ),
                },
                ErrorKind::AddrNotAvailable => "no such address on this host".to_string(),
                _ => error.to_string(),
            };
            let failure = format!("dns.listen {addr}: {why}");
            // An address missing fails both protocols alike: said once.
            if !failures.contains(&failure) {
                failures.push(failure);
            }
        }
    }
    failures
}

/// The processes holding a socket on local `port` (listening, for TCP), as
/// `name (pid N)`, from `/proc/net/{protocol}{,6}` and each process's file descriptors.
fn holders(protocol: &str, port: u16) -> Vec<String> {
    const TCP_LISTEN: &str = "0A";
    let mut inodes = HashSet::new();
    for table in [protocol.to_string(), format!("{protocol}6")] {
        let text = std::fs::read_to_string(format!("/proc/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok());
            let bound = protocol == "udp" || *state == TCP_LISTEN;
            if bound && local_port == Some(port) && *inode != "0" {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    let mut found = BTreeSet::new();
    for process in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = process.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let fds = std::fs::read_dir(process.path().join("fd"));
        let holds = fds.into_iter().flatten().flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| inodes.contains(target.to_string_lossy().as_ref()))
        });
        if holds {
            let name = std::fs::read_to_string(process.path().join("comm")).unwrap_or_default();
            found.insert(format!("{} (pid {pid})", name.trim()));
        }
    }
    found.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_names_the_process_that_holds_it() {
        // Port 0 picks a free one; this test's own process then holds it.
        let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
        let addr = socket.local_addr().expect("its address");
        let failures = dns_addresses(&[addr]);
        let me = format!("(pid {})", std::process::id());
        assert!(
            failures
                .iter()
                .any(|f| f.starts_with(&format!("dns.listen {addr}: udp port")) && f.contains(&me)),
            "{failures:?}"
        );
        drop(socket);
        assert!(dns_addresses(&[addr]).is_empty());
    }

    #[test]
    fn the_cni_directory_must_be_a_directory_that_can_be_written() {
        let dir = std::env::temp_dir().join(format!("nodus-preflight-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        assert_eq!(cni_directory(&dir.join("net.d/00-nodus.conflist")), None);
        let file = dir.join("file");
        std::fs::write(&file, b"").expect("a file");
        let failure = cni_directory(&file.join("00-nodus.conflist")).expect("refused");
        assert!(failure.ends_with("is not a directory"), "{failure}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_conflists_plugins_must_be_in_the_plugin_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nodus-preflight-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let failure = cni_plugins(&dir).expect("an empty directory");
        assert!(
            failure.contains("no executable nodus-cni, host-local, portmap, loopback"),
            "{failure}"
        );
        for plugin in ["nodus-cni", "host-local", "portmap", "loopback"] {
            std::fs::write(dir.join(plugin), b"#!/bin/sh\n").expect("plugin");
            let mode = if plugin == "portmap" { 0o644 } else { 0o755 };
            std::fs::set_permissions(dir.join(plugin), std::fs::Permissions::from_mode(mode))
                .expect("mode");
        }
        let failure = cni_plugins(&dir).expect("portmap cannot run");
        assert!(failure.contains("no executable portmap ("), "{failure}");
        std::fs::set_permissions(dir.join("portmap"), std::fs::Permissions::from_mode(0o755))
            .expect("mode");
        assert_eq!(cni_plugins(&dir), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_named_backend_that_cannot_run_is_named() {
        let mesh = MeshConfig {
            backend: MeshBackend::WireguardGo,
            wireguard_go: "/nonexistent/wireguard-go".into(),
            ..MeshConfig::default()
        };
        let failure = wireguard_backend(&mesh).expect("refused");
        assert!(
            failure.starts_with("mesh.backend wireguard-go: mesh.wireguard_go /nonexistent"),
            "{failure}"
        );
        assert!(executable(Path::new("sh")).is_ok(), "found on $PATH");
    }
}
