//! Publishing the node's WireGuard annotations on its own Node: a JSON merge patch under
//! field manager `nodus`, retried with exponential backoff.

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use std::collections::BTreeMap;
use std::time::Duration;

pub const FIELD_MANAGER: &str = "nodus";
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(60);

fn nodes(client: kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Node".into(),
        plural: "nodes".into(),
    };
    Api::all_with(client, &resource)
}

/// Why a patch failed, for people: a 403 names the RBAC rule that is missing.
pub fn describe_failure(node: &str, error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if status.code == 403 => format!(
            "forbidden: nodus needs RBAC permission to `patch` `nodes` (core API group, \
             cluster scope) to publish its WireGuard key on Node {node}; the API server said: {}",
            status.message
        ),
        other => format!("patching Node {node}: {other}"),
    }
}

/// Patches `annotations` onto Node `node` until it succeeds.
pub async fn publish(
    client: kube::Client,
    node: String,
    annotations: BTreeMap<&'static str, String>,
) {
    let api = nodes(client);
    let patch = crate::plan::annotations_patch(&annotations);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let mut delay = FIRST_RETRY;
    loop {
        match api.patch(&node, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::info!(node = %node, "published the WireGuard annotations");
                return;
            }
            Err(error) => {
                tracing::error!(retry_in = ?delay, "{}", describe_failure(&node, &error));
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY);
            }
        }
    }
}
