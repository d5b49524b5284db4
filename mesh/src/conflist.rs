//! The CNI conflist kubelet (or containerd) uses for this node's pods: nodus's own plugin
//! ([`nodus_cni`], the pod's veth and routes) with the reference `host-local` IPAM over the
//! node's pod CIDRs, both families, at the mesh MTU, then `portmap` for pods' `hostPort`s;
//! and the installation of those plugins into the runtime's plugin directory.
//!
//! `host-local` hands out the first address of each range as the gateway; that is also the
//! address on the WireGuard device, so pod traffic to other nodes leaves with a source the
//! peers accept.

use crate::Error;
use nodus_view::model::{Cidr, Family};
use std::path::Path;

/// The conflist's `name`: the network's name in the runtime and host-local's data directory.
pub const NETWORK_NAME: &str = "nodus";

/// The reference plugins the conflist chains, and `loopback`, which the runtime runs for
/// every pod itself; all must be in the runtime's CNI binary directory, beside
/// [`nodus_cni::PLUGIN`].
pub const REFERENCE_PLUGINS: [&str; 3] = [IPAM_PLUGIN, PORT_PLUGIN, "loopback"];
/// Every plugin the runtime needs in its CNI binary directory for this conflist: ours and
/// [`REFERENCE_PLUGINS`].
pub const PLUGINS: [&str; 4] = [POD_PLUGIN, IPAM_PLUGIN, PORT_PLUGIN, "loopback"];
const POD_PLUGIN: &str = nodus_cni::PLUGIN;
const IPAM_PLUGIN: &str = "host-local";
const PORT_PLUGIN: &str = "portmap";

/// The conflist's version unless every plugin it chains says it reads a later one.
pub const BASE_VERSION: &str = "1.0.0";
/// The version with `STATUS` and `GC`, through which the runtime asks whether the plugins
/// can take pods and has leftovers of lost `DEL`s removed.
pub const STATUS_AND_GC_VERSION: &str = "1.1.0";
/// The plugins the conflist chains, which must all read its version.
const CHAINED: [&str; 3] = [POD_PLUGIN, IPAM_PLUGIN, PORT_PLUGIN];
/// How long a plugin may take to say which versions it reads.
const VERSION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The conflist version for the plugins in `bin_dir`: [`STATUS_AND_GC_VERSION`] when each
/// plugin the conflist chains lists it in its `VERSION` reply, else [`BASE_VERSION`].
/// Debian 12's `host-local` and `portmap` (1.1.1) refuse a 1.1.0 configuration, and a
/// runtime would then make no pod at all; a plugin missing or silent counts as refusing.
pub fn chain_version(bin_dir: &Path) -> &'static str {
    let reads_latest = |plugin: &str| {
        supported_versions(&bin_dir.join(plugin))
            .is_some_and(|versions| versions.iter().any(|v| v == STATUS_AND_GC_VERSION))
    };
    if CHAINED.iter().all(|plugin| reads_latest(plugin)) {
        STATUS_AND_GC_VERSION
    } else {
        BASE_VERSION
    }
}

/// `supportedVersions` from `program`'s reply to `CNI_COMMAND=VERSION`; `None` when it
/// cannot run, fails, or does not answer within [`VERSION_TIMEOUT`].
fn supported_versions(program: &Path) -> Option<Vec<String>> {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let mut child = std::process::Command::new(program)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(format!(r#"{{"cniVersion":"{BASE_VERSION}"}}"#).as_bytes());
    }
    let deadline = std::time::Instant::now() + VERSION_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let mut reply = Vec::new();
    child
        .stdout
        .take()?
        .take(64 * 1024)
        .read_to_end(&mut reply)
        .ok()?;
    let reply: serde_json::Value = serde_json::from_slice(&reply)
        .ok()
        .filter(|_| status.success())?;
    let versions = reply["supportedVersions"].as_array()?;
    Some(
        versions
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
    )
}

/// The conflist for `cidrs` (our pod CIDRs) at `mtu` and `version` ([`chain_version`]),
/// as pretty JSON ending in a newline; with `policy_socket`, nodus-cni's `ADD` waits there
/// for the pod's isolation.
pub fn conflist(cidrs: &[Cidr], mtu: u32, policy_socket: Option<&Path>, version: &str) -> String {
    let ranges: Vec<_> = cidrs
        .iter()
        .map(|c| serde_json::json!([{ "subnet": c.network().to_string() }]))
        .collect();
    let mut routes = Vec::new();
    for family in Family::ALL {
        if cidrs.iter().any(|c| c.family() == family) {
            let dst = match family {
                Family::V4 => "0.0.0.0/0",
                Family::V6 => "::/0",
            };
            routes.push(serde_json::json!({ "dst": dst }));
        }
    }
    let mut document = serde_json::json!({
        "cniVersion": version,
        "name": NETWORK_NAME,
        "plugins": [{
            "type": POD_PLUGIN,
            "mtu": mtu,
            "ipam": {
                "type": IPAM_PLUGIN,
                "ranges": ranges,
                "routes": routes,
            },
        }, {
            // kubelet passes a pod's hostPorts as the `portMappings` capability.
            "type": PORT_PLUGIN,
            "capabilities": { "portMappings": true },
            "snat": true,
        }],
    });
    if let Some(socket) = policy_socket {
        document["plugins"][0]["policy_socket"] = socket.to_string_lossy().into_owned().into();
    }
    let mut text = serde_json::to_string_pretty(&document).unwrap_or_default();
    text.push('\n');
    text
}

/// Writes `content` to `path` through a temporary file and a rename, so that a runtime
/// never reads half a file; does nothing when the file already holds `content`. Returns
/// whether it wrote.
pub fn write_if_changed(path: &Path, content: &str) -> Result<bool, Error> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == content) {
        return Ok(false);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    }
    // A dot name: runtimes load only `*.conflist` and `*.conf` from the directory.
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp"));
    nodus_durable::replace(path, &tmp, 0o644, content.as_bytes())?;
    Ok(true)
}

/// What [`install_plugins`] did with one plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// Copied in: it was missing, ours and changed, or replaced on request.
    Written,
    /// The directory held the same bytes already.
    Unchanged,
    /// The directory held another plugin of that name, which was kept: the host's own
    /// (a containerd package's, k3s's, Talos's static ones), which its other networks
    /// and every pod's `loopback` may rely on.
    KeptHosts,
}

/// Copies nodus's own plugin (`nodus`, the binary that answers to [`nodus_cni::PLUGIN`])
/// and each of [`REFERENCE_PLUGINS`] from `from` into `to` (an init container's job: the
/// image carries them, the host's runtime runs them), each through a temporary file and a
/// rename so that the runtime never runs half a binary. A plugin already there with the
/// same bytes is left alone. Ours replaces an older copy of itself; a reference plugin
/// with other bytes is the host's and is kept, unless `replace`. Returns what was done
/// with each plugin.
pub fn install_plugins(
    nodus: &Path,
    from: &Path,
    to: &Path,
    replace: bool,
) -> Result<Vec<(&'static str, Installed)>, Error> {
    std::fs::create_dir_all(to).map_err(Error::io(format!("creating {}", to.display())))?;
    let ours = std::iter::once((POD_PLUGIN, nodus.to_path_buf(), true));
    let reference = REFERENCE_PLUGINS
        .iter()
        .map(|name| (*name, from.join(name), replace));
    ours.chain(reference)
        .map(|(name, source, replace)| {
            let target = to.join(name);
            let content = std::fs::read(&source)
                .map_err(Error::io(format!("reading {}", source.display())))?;
            match std::fs::read(&target) {
                Ok(old) if old == content => return Ok((name, Installed::Unchanged)),
                Ok(_) if !replace => return Ok((name, Installed::KeptHosts)),
                _ => {}
            }
            let tmp = to.join(format!(".{name}.nodus-tmp"));
            nodus_durable::replace(&target, &tmp, 0o755, &content)?;
            Ok((name, Installed::Written))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dual_stack_conflist() {
        let cidrs: Vec<Cidr> = ["10.244.1.0/24", "fd00:10:244:1::/64"]
            .iter()
            .map(|c| c.parse().expect("cidr"))
            .collect();
        let text = conflist(&cidrs, 1420, None, BASE_VERSION);
        let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
        let plugin = &doc["plugins"][0];
        assert_eq!(plugin["type"], "nodus-cni");
        assert_eq!(plugin["mtu"], 1420);
        assert_eq!(plugin["ipam"]["type"], "host-local");
        assert_eq!(plugin["ipam"]["ranges"][0][0]["subnet"], "10.244.1.0/24");
        assert_eq!(
            plugin["ipam"]["ranges"][1][0]["subnet"],
            "fd00:10:244:1::/64"
        );
        assert_eq!(plugin["ipam"]["routes"][1]["dst"], "::/0");
        let ports = &doc["plugins"][1];
        assert_eq!(ports["type"], "portmap");
        assert_eq!(ports["capabilities"]["portMappings"], true);
        assert!(plugin.get("policy_socket").is_none());
        let v4_only = conflist(&cidrs[..1], 1420, None, BASE_VERSION);
        assert!(!v4_only.contains("::/0"), "{v4_only}");
        let gated = conflist(
            &cidrs,
            1420,
            Some(Path::new("/run/nodus/cni.sock")),
            STATUS_AND_GC_VERSION,
        );
        let doc: serde_json::Value = serde_json::from_str(&gated).expect("json");
        assert_eq!(doc["plugins"][0]["policy_socket"], "/run/nodus/cni.sock");
        assert_eq!(doc["cniVersion"], "1.1.0");
    }

    /// Plugins that answer VERSION as the reference ones do: the conflist is 1.1.0 only
    /// when every chained plugin reads it (Debian 12's stop at 1.0.0).
    #[test]
    fn the_conflist_version_is_the_newest_every_chained_plugin_reads() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nodus-cni-version-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let plugin = |name: &str, versions: &str| {
            let path = dir.join(name);
            let script = format!(
                "#!/bin/sh\ncat >/dev/null\necho '{{\"cniVersion\":\"1.0.0\",\
                 \"supportedVersions\":[{versions}]}}'\n"
            );
            std::fs::write(&path, script).expect("plugin");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("mode");
        };
        let all = r#""0.4.0","1.0.0","1.1.0""#;
        assert_eq!(chain_version(&dir), BASE_VERSION, "no plugins at all");
        for name in CHAINED {
            plugin(name, all);
        }
        assert_eq!(chain_version(&dir), STATUS_AND_GC_VERSION);
        plugin(IPAM_PLUGIN, r#""0.4.0","1.0.0""#);
        assert_eq!(chain_version(&dir), BASE_VERSION, "an older host-local");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn written_only_when_changed() {
        let dir = std::env::temp_dir().join(format!("nodus-cni-{}", std::process::id()));
        let path = dir.join("net.d/10-nodus.conflist");
        assert!(write_if_changed(&path, "a\n").expect("write"));
        let before = std::fs::metadata(&path)
            .expect("file")
            .modified()
            .expect("mtime");
        assert!(!write_if_changed(&path, "a\n").expect("same"));
        assert_eq!(
            std::fs::metadata(&path)
                .expect("file")
                .modified()
                .expect("mtime"),
            before
        );
        assert!(write_if_changed(&path, "b\n").expect("write"));
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "b\n");
        let entries = std::fs::read_dir(path.parent().expect("dir"))
            .expect("dir")
            .count();
        assert_eq!(entries, 1, "no temporary file left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn plugins_are_installed_once_and_executable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nodus-cni-bin-{}", std::process::id()));
        let (from, to) = (dir.join("image"), dir.join("host/opt/cni/bin"));
        std::fs::create_dir_all(&from).expect("dir");
        for name in REFERENCE_PLUGINS {
            std::fs::write(from.join(name), format!("#!/bin/sh\necho {name}\n")).expect("plugin");
        }
        let nodus = dir.join("nodus");
        std::fs::write(&nodus, "#!/bin/sh\necho nodus 1\n").expect("nodus");
        let installed = install_plugins(&nodus, &from, &to, false).expect("install");
        assert!(
            installed
                .iter()
                .all(|(_, done)| *done == Installed::Written),
            "{installed:?}"
        );
        assert_eq!(installed.len(), 1 + REFERENCE_PLUGINS.len());
        let mode = std::fs::metadata(to.join("nodus-cni"))
            .expect("nodus-cni")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        let again = install_plugins(&nodus, &from, &to, false).expect("install again");
        assert!(
            again.iter().all(|(_, done)| *done == Installed::Unchanged),
            "{again:?}"
        );
        // A reference plugin of that name with other bytes is the host's: kept, unless
        // replaced. Ours replaces its older copy.
        std::fs::write(from.join("portmap"), "#!/bin/sh\necho newer\n").expect("plugin");
        std::fs::write(&nodus, "#!/bin/sh\necho nodus 2\n").expect("nodus");
        let kept = install_plugins(&nodus, &from, &to, false).expect("install beside the host's");
        assert!(
            kept.contains(&("portmap", Installed::KeptHosts))
                && kept.contains(&("nodus-cni", Installed::Written)),
            "{kept:?}"
        );
        let host = std::fs::read_to_string(to.join("portmap")).expect("portmap");
        assert_eq!(host, "#!/bin/sh\necho portmap\n");
        let replaced = install_plugins(&nodus, &from, &to, true).expect("replace");
        assert_eq!(
            replaced
                .iter()
                .filter(|(_, done)| *done == Installed::Written)
                .count(),
            1,
            "{replaced:?}"
        );
        assert_eq!(
            std::fs::read_dir(&to).expect("dir").count(),
            1 + REFERENCE_PLUGINS.len()
        );
        // A plugin missing from the image is an error that names it.
        std::fs::remove_file(from.join("loopback")).expect("rm");
        let error = install_plugins(&nodus, &from, &to, false).expect_err("missing");
        assert!(error.to_string().contains("loopback"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
