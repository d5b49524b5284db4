//! Writing a kubeconfig that points kubectl or kube-rs at a stand-in.

use std::path::Path;

use anyhow::Context as _;
use serde_json::json;

/// The cluster, user and context name in written kubeconfigs.
pub const CONTEXT: &str = "nodus-sandbox";

/// Writes a kubeconfig for `server_url` (plain `http://`, no credentials) with one cluster,
/// user and context named `nodus-sandbox`, namespace `default`. The file is written to a
/// temporary name and renamed, so a reader never sees half of it.
pub fn write_kubeconfig(path: &Path, server_url: &str) -> anyhow::Result<()> {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server_url}}],
        "users": [{"name": CONTEXT, "user": {}}],
        "contexts": [{
            "name": CONTEXT,
            "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": "default"},
        }],
        "current-context": CONTEXT,
        "preferences": {},
    });
    let text = serde_saphyr::to_string(&config).context("rendering the kubeconfig")?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", Path::new(&tmp).display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming onto {}", path.display()))?;
    Ok(())
}
