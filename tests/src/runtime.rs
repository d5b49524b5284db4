//! Pods made the way kubelet makes them: the conflist's CNI plugins (nodus's own, and the
//! reference ones from Debian's `containernetworking-plugins`) run against a conflist,
//! inside the node's namespace.

use crate::netns::{Netns, Pod};
use anyhow::{Context, bail};
use serde_json::Value;
use std::io::Write;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};

/// Where Debian installs the plugins.
pub const CNI_PATH: &str = "/usr/lib/cni";

/// The reference plugins nodus's conflist chains, which `nodus install-cni` copies from
/// [`CNI_PATH`] (`nodus_mesh::conflist::REFERENCE_PLUGINS`, which the binary's tests compare).
pub const REFERENCE_PLUGINS: [&str; 3] = ["host-local", "portmap", "loopback"];

/// Creates pod `name` on the node whose network namespace is `node_ns` by running `ADD`
/// of every plugin of the conflist at
/// `conflist`, chained as a runtime chains them. `host-local` keeps its leases in
/// `data_dir` (a runtime would use /var/lib/cni, which is shared by every namespace).
/// `ips` asks `host-local` for fixed addresses through the `args.cni.ips` convention.
/// The plugins are those in `cni_bin` ([`CNI_PATH`], or a node's own directory).
/// `kubernetes_pod` (namespace, name) is passed in `CNI_ARGS` as kubelet passes it.
pub fn add_pod(
    node_ns: &str,
    conflist: &Path,
    name: &str,
    data_dir: &Path,
    ips: &[IpAddr],
    cni_bin: &Path,
    kubernetes_pod: Option<(&str, &str)>,
) -> anyhow::Result<Pod> {
    let text = std::fs::read_to_string(conflist)
        .with_context(|| format!("reading {}", conflist.display()))?;
    let list: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", conflist.display()))?;
    let plugins = list["plugins"]
        .as_array()
        .with_context(|| format!("{}: no plugins", conflist.display()))?;
    let ns = Netns::new(name)?;
    let mut result = Value::Null;
    for plugin in plugins {
        let mut config = plugin.clone();
        config["cniVersion"] = list["cniVersion"].clone();
        config["name"] = list["name"].clone();
        if !result.is_null() {
            config["prevResult"] = result.clone();
        }
        if config["ipam"].is_object() {
            config["ipam"]["dataDir"] = data_dir.to_string_lossy().into_owned().into();
        }
        if !ips.is_empty() {
            let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
            config["args"] = serde_json::json!({ "cni": { "ips": ips } });
        }
        let kind = config["type"]
            .as_str()
            .context("a plugin without a type")?
            .to_string();
        result = run_plugin(node_ns, cni_bin, &kind, ns.name(), &config, kubernetes_pod)?;
    }
    let mut pod = Pod {
        ns,
        name: name.to_string(),
        v4: None,
        v6: None,
    };
    for ip in result["ips"].as_array().into_iter().flatten() {
        let address = ip["address"].as_str().unwrap_or_default();
        let addr: IpAddr = address
            .split('/')
            .next()
            .unwrap_or_default()
            .parse()
            .with_context(|| format!("the plugin returned address {address:?}"))?;
        match addr {
            IpAddr::V4(v4) => pod.v4 = Some(v4),
            IpAddr::V6(v6) => pod.v6 = Some(v6),
        }
    }
    Ok(pod)
}

/// A directory with the conflist's plugins as a runtime's would hold them: `nodus-cni`
/// (the `nodus` binary under that name) and the `reference` plugins of `from` (Debian's
/// [`CNI_PATH`], or those built from their modules), as symbolic links made once in `dir`.
pub fn plugin_dir(
    dir: &Path,
    nodus: &Path,
    reference: &[&str],
    from: &Path,
) -> anyhow::Result<std::path::PathBuf> {
    let bin = dir.join("cni-bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    let reference = reference.iter().map(|p| (*p, from.join(p)));
    for (name, target) in [("nodus-cni", nodus.to_path_buf())]
        .into_iter()
        .chain(reference)
    {
        let link = bin.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(&target, &link)
                .with_context(|| format!("linking {} to {}", link.display(), target.display()))?;
        }
    }
    Ok(bin)
}

fn run_plugin(
    node_ns: &str,
    cni_bin: &Path,
    kind: &str,
    pod_ns: &str,
    config: &Value,
    kubernetes_pod: Option<(&str, &str)>,
) -> anyhow::Result<Value> {
    let plugin = cni_bin.join(kind);
    let mut command = Command::new("ip");
    if let Some((namespace, name)) = kubernetes_pod {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}");
        command.env("CNI_ARGS", args);
    }
    let mut child = command
        .args(["netns", "exec", node_ns])
        .arg(&plugin)
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", pod_ns)
        .env("CNI_NETNS", format!("/var/run/netns/{pod_ns}"))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running the {kind} CNI plugin"))?;
    child
        .stdin
        .take()
        .context("plugin stdin")?
        .write_all(config.to_string().as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "CNI {kind} ADD failed ({}): {} {}",
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    serde_json::from_slice(&output.stdout).with_context(|| format!("the {kind} plugin's result"))
}
