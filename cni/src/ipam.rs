//! The delegated IPAM plugin (`host-local`): found in `CNI_PATH`, run with this call's
//! environment and the network configuration, as the specification's delegation asks.
//! `GC` is delegated too, and since `host-local` (up to 1.9 at least) does nothing for it,
//! its leases held by attachments the runtime no longer holds are given back here, each
//! with the `DEL` its attachment would have sent ([`release_stale_leases`]).

use crate::error::{Error, code};
use crate::protocol::{Attachment, Command};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Runs `plugin` for `command` with `config` on its stdin; returns its result (`ADD`) or
/// `Null`. A failure carries the plugin's own code and message.
pub fn delegate(
    plugin: &str,
    cni_path: &[PathBuf],
    command: Command,
    config: &[u8],
) -> Result<Value, Error> {
    delegate_for(plugin, cni_path, command, config, None)
}

/// [`delegate`], for `attachment` rather than the one in this call's environment.
fn delegate_for(
    plugin: &str,
    cni_path: &[PathBuf],
    command: Command,
    config: &[u8],
    attachment: Option<&Attachment>,
) -> Result<Value, Error> {
    let program = cni_path
        .iter()
        .map(|dir| dir.join(plugin))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            Error::new(
                code::IO,
                format!("the IPAM plugin {plugin} is not in CNI_PATH {cni_path:?}"),
            )
        })?;
    let output = run(&program, command, config, attachment)
        .map_err(|e| Error::new(code::IO, format!("running {}: {e}", program.display())))?;
    if !output.status.success() {
        // A plugin reports its failure on stdout, as this one does.
        let reply: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        let message = reply["msg"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&output.stderr).trim().to_string());
        return Err(Error {
            code: reply["code"]
                .as_u64()
                .and_then(|c| u32::try_from(c).ok())
                .unwrap_or(code::IO),
            message: format!(
                "the IPAM plugin {plugin} failed {} ({}): {message}",
                command.as_str(),
                output.status
            ),
            details: reply["details"].as_str().unwrap_or_default().to_string(),
        });
    }
    if command != Command::Add {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|e| Error::decode(format!("the IPAM plugin {plugin}'s result: {e}")))
}

fn run(
    program: &Path,
    command: Command,
    config: &[u8],
    attachment: Option<&Attachment>,
) -> std::io::Result<std::process::Output> {
    let mut command_line = std::process::Command::new(program);
    command_line.env("CNI_COMMAND", command.as_str());
    if let Some(attachment) = attachment {
        // A DEL after the sandbox is gone: no namespace, as the specification allows.
        command_line
            .env("CNI_CONTAINERID", &attachment.container_id)
            .env("CNI_IFNAME", &attachment.ifname)
            .env_remove("CNI_NETNS");
    }
    let mut child = command_line
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(config)?;
    }
    child.wait_with_output()
}

/// Where `host-local` keeps the leases of the network `config` names (`ipam.dataDir`,
/// by default `/var/lib/cni/networks`, then the network's name); `None` for another IPAM
/// plugin, whose own `GC` is trusted.
fn host_local_leases(config: &Value) -> Option<PathBuf> {
    if config["ipam"]["type"].as_str() != Some("host-local") {
        return None;
    }
    let name = config["name"].as_str().filter(|n| is_file_name(n))?;
    let data_dir = config["ipam"]["dataDir"]
        .as_str()
        .unwrap_or("/var/lib/cni/networks");
    Some(Path::new(data_dir).join(name))
}

fn is_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/')
}

/// The attachment a lease file of `host-local` names: `containerID\r\nifname`, or the
/// container ID alone as versions before 0.8 wrote it.
fn lease_holder(text: &str) -> Attachment {
    let (container_id, ifname) = text.split_once("\r\n").unwrap_or((text, ""));
    Attachment {
        container_id: container_id.trim().to_string(),
        ifname: ifname.trim().to_string(),
    }
}

/// `GC` for `host-local`: each lease in its data directory whose attachment is not in
/// `valid` (sorted) is given back by a `DEL` for that attachment. Returns how many.
/// Lease files are the addresses' names; `lock` and `last_reserved_ip.*` are not leases.
pub fn release_stale_leases(
    plugin: &str,
    cni_path: &[PathBuf],
    config: &[u8],
    valid: &[Attachment],
) -> Result<usize, Error> {
    let document: Value = serde_json::from_slice(config)
        .map_err(|e| Error::decode(format!("the network configuration: {e}")))?;
    let Some(dir) = host_local_leases(&document) else {
        return Ok(0);
    };
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => {
            return Err(Error::new(
                code::IO,
                format!("reading {}: {error}", dir.display()),
            ));
        }
    };
    let mut stale: Vec<Attachment> = entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            name.to_str()
                .is_some_and(|name| name.parse::<std::net::IpAddr>().is_ok())
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .map(|text| lease_holder(&text))
        .filter(|holder| {
            !holder.container_id.is_empty()
                && valid
                    .binary_search_by(|v| {
                        (v.container_id.as_str(), v.ifname.as_str())
                            .cmp(&(holder.container_id.as_str(), holder.ifname.as_str()))
                    })
                    .is_err()
                // A lease from before 0.8 names no interface: kept if its container is.
                && !(holder.ifname.is_empty()
                    && valid.iter().any(|v| v.container_id == holder.container_id))
        })
        .collect();
    stale.sort_unstable();
    stale.dedup();
    for attachment in &stale {
        delegate_for(plugin, cni_path, Command::Del, config, Some(attachment))?;
    }
    Ok(stale.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_files_name_their_attachment() {
        assert_eq!(
            lease_holder("abc123\r\neth0"),
            Attachment {
                container_id: "abc123".into(),
                ifname: "eth0".into()
            }
        );
        assert_eq!(lease_holder("old\n").ifname, "");
        let config = serde_json::json!({"name": "nodus", "ipam": {"type": "host-local"}});
        assert_eq!(
            host_local_leases(&config),
            Some(PathBuf::from("/var/lib/cni/networks/nodus"))
        );
        let elsewhere = serde_json::json!({"name": "nodus",
            "ipam": {"type": "host-local", "dataDir": "/run/leases"}});
        assert_eq!(
            host_local_leases(&elsewhere),
            Some(PathBuf::from("/run/leases/nodus"))
        );
        let other = serde_json::json!({"name": "nodus", "ipam": {"type": "whereabouts"}});
        assert_eq!(host_local_leases(&other), None);
        let escaping = serde_json::json!({"name": "../etc", "ipam": {"type": "host-local"}});
        assert_eq!(host_local_leases(&escaping), None);
    }
}
