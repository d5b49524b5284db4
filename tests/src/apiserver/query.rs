//! Query-string parsing into list, watch and write options.
//!
//! Validation mirrors upstream's `ValidateListOptions`: a malformed or contradictory parameter
//! is a 400 or 422 Status, never a panic. Unknown parameters are ignored, as upstream does.

use std::time::Duration;

use super::error::ApiError;
use super::registry::ResourceDef;
use super::selector::{FieldSelector, LabelSelector};

/// The decoded query pairs (kube-rs starts query strings with `?&`; empty pairs are skipped).
#[derive(Debug, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(query: Option<&str>) -> Query {
        Query(
            form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .into_owned()
                .collect(),
        )
    }

    /// The last value of `name` (upstream also takes the last when a parameter repeats).
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None | Some("") => Ok(None),
            Some("true" | "1" | "True" | "TRUE") => Ok(Some(true)),
            Some("false" | "0" | "False" | "FALSE") => Ok(Some(false)),
            Some(other) => Err(ApiError::bad_request(format!(
                "invalid boolean value {other:?} for {name}"
            ))),
        }
    }

    pub(crate) fn u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid value {v:?} for {name}: not a non-negative integer"
                ))
            }),
        }
    }

    /// `resourceVersion`: absent or empty is `None`; anything else must be a number.
    pub(crate) fn resource_version(&self) -> Result<Option<u64>, ApiError> {
        match self.get("resourceVersion") {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {v:?}"))),
        }
    }

    pub(crate) fn rv_match(&self) -> Result<Option<RvMatch>, ApiError> {
        match self.get("resourceVersionMatch") {
            None | Some("") => Ok(None),
            Some("NotOlderThan") => Ok(Some(RvMatch::NotOlderThan)),
            Some("Exact") => Ok(Some(RvMatch::Exact)),
            Some(other) => Err(ApiError::invalid(
                "ListOptions.meta.k8s.io",
                "",
                format!(
                    "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\""
                ),
            )),
        }
    }

    /// `dryRun=All` means validate without persisting.
    pub(crate) fn dry_run(&self) -> Result<bool, ApiError> {
        match self.get("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: \"{other}\": supported values: \"All\""
            ))),
        }
    }

    pub(crate) fn filter(
        &self,
        def: &ResourceDef,
        namespace: Option<&str>,
    ) -> Result<Filter, ApiError> {
        Ok(Filter {
            namespace: namespace.map(str::to_owned),
            label: LabelSelector::parse(self.get("labelSelector").unwrap_or(""))?,
            field: FieldSelector::parse(self.get("fieldSelector").unwrap_or(""), def)?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RvMatch {
    NotOlderThan,
    Exact,
}

/// Which objects a list or watch sees: a namespace (for namespaced kinds) and selectors.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub namespace: Option<String>,
    pub label: LabelSelector,
    pub field: FieldSelector,
}

impl Filter {
    pub(crate) fn matches(&self, key_namespace: &str, obj: &serde_json::Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| ns == key_namespace)
            && self.label.matches(obj)
            && self.field.matches(obj)
    }
}

/// Options of a list request.
#[derive(Debug)]
pub(crate) struct ListOptions {
    pub filter: Filter,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<u64>,
    pub rv_match: Option<RvMatch>,
}

impl ListOptions {
    pub(crate) fn parse(
        q: &Query,
        def: &ResourceDef,
        namespace: Option<&str>,
    ) -> Result<Self, ApiError> {
        let resource_version = q.resource_version()?;
        let rv_match = q.rv_match()?;
        if rv_match.is_some() && resource_version.is_none() {
            return Err(ApiError::invalid(
                "ListOptions.meta.k8s.io",
                "",
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if rv_match == Some(RvMatch::Exact) && resource_version == Some(0) {
            return Err(ApiError::invalid(
                "ListOptions.meta.k8s.io",
                "",
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
        let continue_token = q
            .get("continue")
            .filter(|c| !c.is_empty())
            .map(str::to_owned);
        if continue_token.is_some() && resource_version.is_some_and(|rv| rv != 0) {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        Ok(ListOptions {
            filter: q.filter(def, namespace)?,
            limit: q.u64("limit")?.filter(|&l| l > 0).map(|l| l as usize),
            continue_token,
            resource_version,
            rv_match,
        })
    }
}

/// Options of a watch request.
#[derive(Debug)]
pub(crate) struct WatchOptions {
    pub filter: Filter,
    pub resource_version: Option<u64>,
    pub allow_bookmarks: bool,
    pub timeout: Option<Duration>,
    pub send_initial_events: Option<bool>,
}

/// The text a 1.33 server answers to `sendInitialEvents` with the WatchList gate off.
pub const WATCH_LIST_FORBIDDEN: &str =
    "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";

impl WatchOptions {
    pub(crate) fn parse(
        q: &Query,
        def: &ResourceDef,
        namespace: Option<&str>,
        watch_list_enabled: bool,
    ) -> Result<Self, ApiError> {
        let invalid = |msg: &str| ApiError::invalid("ListOptions.meta.k8s.io", "", msg);
        let resource_version = q.resource_version()?;
        let rv_match = q.rv_match()?;
        let allow_bookmarks = q.bool("allowWatchBookmarks")?.unwrap_or(false);
        let send_initial_events = q.bool("sendInitialEvents")?;
        match send_initial_events {
            Some(_) if !watch_list_enabled => {
                return Err(invalid(&format!(
                    "sendInitialEvents: Forbidden: {WATCH_LIST_FORBIDDEN}"
                )));
            }
            Some(_) => {
                if rv_match != Some(RvMatch::NotOlderThan) {
                    return Err(invalid(
                        "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    ));
                }
                if !allow_bookmarks {
                    return Err(invalid(
                        "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
                    ));
                }
            }
            None if rv_match.is_some() => {
                return Err(invalid(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            None => {}
        }
        Ok(WatchOptions {
            filter: q.filter(def, namespace)?,
            resource_version,
            allow_bookmarks,
            timeout: q.u64("timeoutSeconds")?.map(Duration::from_secs),
            send_initial_events,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::RESOURCES;

    #[test]
    fn kube_rs_style_query() {
        let q = Query::parse(Some("&limit=2&continue=abc&labelSelector=app%3Dweb"));
        assert_eq!(q.get("limit"), Some("2"));
        assert_eq!(q.get("labelSelector"), Some("app=web"));
        let opts = ListOptions::parse(&q, &RESOURCES[3], Some("ns")).expect("valid");
        assert_eq!(opts.limit, Some(2));
        assert_eq!(opts.continue_token.as_deref(), Some("abc"));
    }

    #[test]
    fn invalid_combinations() {
        let list = |s: &str| {
            ListOptions::parse(&Query::parse(Some(s)), &RESOURCES[3], None).map_err(|e| e.code)
        };
        assert_eq!(list("limit=x").err(), Some(400));
        assert_eq!(list("resourceVersionMatch=Exact").err(), Some(422));
        assert_eq!(
            list("resourceVersion=0&resourceVersionMatch=Exact").err(),
            Some(422)
        );
        assert_eq!(list("resourceVersion=5&continue=x").err(), Some(400));
        let watch = |s: &str, on| {
            WatchOptions::parse(&Query::parse(Some(s)), &RESOURCES[3], None, on).map_err(|e| e.code)
        };
        assert_eq!(
            watch("sendInitialEvents=true&allowWatchBookmarks=true", true).err(),
            Some(422)
        );
        assert!(
            watch(
                "sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan",
                true
            )
            .is_ok()
        );
        assert_eq!(
            watch(
                "sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan",
                false
            )
            .err(),
            Some(422)
        );
    }
}
