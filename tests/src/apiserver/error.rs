//! API errors, rendered as `metav1.Status` the way kube-apiserver renders them.
//!
//! Clients parse these bodies (kube-rs into `ErrorResponse`, kubectl into its error text), so
//! `reason` and `code` follow the upstream `StatusReason` constants.

use serde_json::{Value, json};

use super::registry::ResourceDef;

/// A failed API request: HTTP code, `StatusReason` and message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message} ({reason}, {code})")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` of the Status (name, group, kind), when the error is about one object.
    pub details: Option<Value>,
}

/// The user a forbidden request is reported for.
pub const FORBIDDEN_USER: &str = "system:serviceaccount:kube-system:nodus";

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, def: &ResourceDef, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": def.group, "kind": def.plural}));
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(def)),
        )
        .about(def, name)
    }

    /// A path that names no resource.
    pub(crate) fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 403 as RBAC answers it, for the stand-in's fixed service account.
    pub(crate) fn forbidden(verb: &str, def: &ResourceDef, name: &str) -> Self {
        let group = def.group;
        // A list or watch names no object.
        let object = match name {
            "" => String::new(),
            name => format!(" \"{name}\""),
        };
        Self::new(
            403,
            "Forbidden",
            format!(
                "{}{object} is forbidden: User \"{FORBIDDEN_USER}\" cannot {verb} resource \"{}\" \
                 in API group \"{group}\" at the cluster scope",
                qualified(def),
                def.plural
            ),
        )
        .about(def, name)
    }

    pub(crate) fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(def)),
        )
        .about(def, name)
    }

    pub(crate) fn conflict(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                qualified(def)
            ),
        )
        .about(def, name)
    }

    /// 422 Invalid, with upstream's `Kind "name" is invalid: field: detail` message shape.
    pub(crate) fn invalid(kind: &str, name: &str, field_error: impl std::fmt::Display) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {field_error}"),
        )
    }

    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub(crate) fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    pub(crate) fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub(crate) fn too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }

    /// What upstream answers when a list asks for a resourceVersion newer than it has seen.
    pub(crate) fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        e.details = Some(json!({"retryAfterSeconds": 1}));
        e
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// `services` or `endpointslices.discovery.k8s.io`, as upstream names a resource in messages.
fn qualified(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        def.plural.to_owned()
    } else {
        format!("{}.{}", def.plural, def.group)
    }
}
