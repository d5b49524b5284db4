//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), an approximate
//! strategic merge patch, and server-side apply approximated as a merge.
//!
//! Strategic merge patch is approximated without OpenAPI schemas: lists of objects are merged
//! by a merge key chosen from the field name (`containers` by `name`, Service `ports` by
//! `port`, …; the keys upstream uses for the kinds served here), other lists are replaced, and
//! the directives kubectl emits (`$setElementOrder/…`, `$retainKeys`, `$patch`,
//! `$deleteFromPrimitiveList/…`) are honoured. That is enough for `kubectl apply` updates.

use serde_json::{Map, Value};

use super::error::ApiError;

/// The patch flavours, from the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Strategic,
    Json,
    /// Server-side apply: creates a missing object, otherwise merges (no field ownership).
    Apply,
}

impl PatchType {
    pub(crate) fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let media = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match media.as_str() {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/apply-patch+yaml" => Ok(PatchType::Apply),
            _ => Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types \
                 include: application/json-patch+json, application/merge-patch+json, \
                 application/apply-patch+yaml, application/strategic-merge-patch+json \
                 (got {content_type:?})"
            ))),
        }
    }
}

/// Decodes a body as JSON, or as YAML when that fails (apply bodies may be either).
pub(crate) fn decode_body(body: &[u8], allow_yaml: bool) -> Result<Value, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(json_err) if allow_yaml => serde_saphyr::from_slice::<Value>(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as JSON ({json_err}) or YAML ({e})"
            ))
        }),
        Err(e) => Err(ApiError::bad_request(format!(
            "the body of the request could not be decoded: {e}"
        ))),
    }
}

/// Applies `patch` (already decoded) of type `ty` to `doc`.
pub(crate) fn apply(doc: &mut Value, ty: PatchType, patch: &Value) -> Result<(), ApiError> {
    match ty {
        PatchType::Merge | PatchType::Apply => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(doc, patch);
            Ok(())
        }
        PatchType::Strategic => {
            let Value::Object(patch) = patch else {
                return Err(ApiError::bad_request(
                    "a strategic merge patch must be a JSON object",
                ));
            };
            if !doc.is_object() {
                *doc = Value::Object(Map::new());
            }
            if let Value::Object(map) = doc {
                strategic_merge_map(map, patch);
            }
            Ok(())
        }
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(doc, &ops)
                .map_err(|e| ApiError::invalid("patch", "", format!("JSON patch failed: {e}")))
        }
    }
}

/// The merge key upstream declares for a list field of the kinds served here, if any.
fn merge_key(field: &str, elements: &[Value]) -> Option<&'static str> {
    let has = |key: &str| elements.iter().any(|e| e.get(key).is_some());
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => Some("name"),
        // Container ports merge by containerPort, Service ports by port.
        "ports" if has("containerPort") => Some("containerPort"),
        "ports" => Some("port"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" | "addresses" if has("type") => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        _ => None,
    }
}

fn strategic_merge_map(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = patch.clone();
        target.remove("$patch");
        strip_directives(target);
        return;
    }
    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            target.remove(key);
            continue;
        }
        if value.get("$patch").and_then(Value::as_str) == Some("delete") {
            target.remove(key);
            continue;
        }
        match (target.get_mut(key), value) {
            (Some(Value::Object(t)), Value::Object(p)) => strategic_merge_map(t, p),
            (Some(Value::Array(t)), Value::Array(p)) => {
                let order = patch
                    .get(&format!("$setElementOrder/{key}"))
                    .and_then(Value::as_array);
                strategic_merge_list(key, t, p, order);
            }
            (_, v) => {
                let mut v = v.clone();
                if let Value::Object(m) = &mut v {
                    strip_directives(m);
                }
                target.insert(key.clone(), v);
            }
        }
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/")
            && let (Some(Value::Array(list)), Some(remove)) =
                (target.get_mut(field), value.as_array())
        {
            list.retain(|v| !remove.contains(v));
        }
    }
    if let Some(Value::Array(retain)) = patch.get("$retainKeys") {
        target.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k.as_str())));
    }
}

fn strategic_merge_list(
    field: &str,
    target: &mut Vec<Value>,
    patch: &[Value],
    order: Option<&Vec<Value>>,
) {
    let Some(key) = merge_key(field, patch).or_else(|| merge_key(field, target)) else {
        // Atomic list: the patch value replaces it.
        *target = patch.to_vec();
        return;
    };
    for element in patch {
        let Some(id) = element.get(key) else {
            target.push(element.clone());
            continue;
        };
        let pos = target.iter().position(|t| t.get(key) == Some(id));
        let delete = element.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                target.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => {
                if let (Value::Object(t), Value::Object(p)) = (&mut target[i], element) {
                    strategic_merge_map(t, p);
                }
            }
            (None, false) => {
                let mut e = element.clone();
                if let Value::Object(m) = &mut e {
                    strip_directives(m);
                }
                target.push(e);
            }
        }
    }
    if let Some(order) = order {
        // Elements named in $setElementOrder come first, in that order; the rest keep theirs.
        let rank = |v: &Value| {
            order
                .iter()
                .position(|o| o.get(key).is_some() && o.get(key) == v.get(key))
                .unwrap_or(usize::MAX)
        };
        target.sort_by_key(rank);
    }
}

fn strip_directives(map: &mut Map<String, Value>) {
    map.retain(|k, _| !k.starts_with('$'));
    for v in map.values_mut() {
        match v {
            Value::Object(m) => strip_directives(m),
            Value::Array(items) => {
                for item in items {
                    if let Value::Object(m) = item {
                        strip_directives(m);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strategic_merges_ports_by_port() {
        let mut svc = json!({"spec": {"ports": [{"port": 80, "targetPort": 80}, {"port": 443}], "type": "ClusterIP"}});
        let patch = json!({"spec": {
            "$setElementOrder/ports": [{"port": 443}, {"port": 80}],
            "ports": [{"port": 80, "targetPort": 8080}]
        }});
        apply(&mut svc, PatchType::Strategic, &patch).expect("patch applies");
        assert_eq!(
            svc,
            json!({"spec": {"ports": [{"port": 443}, {"port": 80, "targetPort": 8080}], "type": "ClusterIP"}})
        );
        let delete = json!({"spec": {"ports": [{"port": 443, "$patch": "delete"}], "type": null}});
        apply(&mut svc, PatchType::Strategic, &delete).expect("patch applies");
        assert_eq!(
            svc,
            json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}})
        );
    }

    #[test]
    fn merge_and_json_patch() {
        let mut doc = json!({"a": {"b": 1, "c": [1, 2]}});
        apply(
            &mut doc,
            PatchType::Merge,
            &json!({"a": {"b": null, "c": [3]}}),
        )
        .expect("merge");
        assert_eq!(doc, json!({"a": {"c": [3]}}));
        let ops = json!([{"op": "add", "path": "/a/d", "value": "x"}]);
        apply(&mut doc, PatchType::Json, &ops).expect("json patch");
        assert_eq!(doc["a"]["d"], "x");
        assert_eq!(
            apply(&mut doc, PatchType::Json, &json!([{"op": "bogus"}])).map_err(|e| e.code),
            Err(400)
        );
        assert!(PatchType::from_content_type("application/json").is_err());
    }
}
