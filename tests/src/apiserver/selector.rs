//! Label and field selectors, parsed from query strings and matched against JSON objects.
//!
//! The grammar follows `k8s.io/apimachinery/pkg/labels` and `.../fields`: label requirements
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, `k>n`, `k<n`; field
//! requirements `path=v`, `path==v`, `path!=v`, on a per-kind list of paths.

use serde_json::Value;

use super::error::ApiError;
use super::registry::ResourceDef;

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector(Vec<LabelReq>);

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Eq,
    DoubleEq,
    NotEq,
    Bang,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
}

fn tokenize(input: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = input.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            ' ' | '\t' => {
                chars.next();
            }
            '=' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                    tokens.push(Token::DoubleEq);
                } else {
                    tokens.push(Token::Eq);
                }
            }
            '!' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                    tokens.push(Token::NotEq);
                } else {
                    tokens.push(Token::Bang);
                }
            }
            '>' | '<' | '(' | ')' | ',' => {
                chars.next();
                tokens.push(match c {
                    '>' => Token::Gt,
                    '<' => Token::Lt,
                    '(' => Token::Open,
                    ')' => Token::Close,
                    _ => Token::Comma,
                });
            }
            _ => {
                let mut ident = String::new();
                while let Some(&c) = chars.peek() {
                    if " \t=!<>(),".contains(c) {
                        break;
                    }
                    ident.push(c);
                    chars.next();
                }
                tokens.push(Token::Ident(ident));
            }
        }
    }
    tokens
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn valid_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// The values of `in (a, b)` from its `(` at `pos`, which moves past the `)`.
fn value_list(tokens: &[Token], pos: &mut usize) -> Result<Vec<String>, &'static str> {
    if tokens.get(*pos) != Some(&Token::Open) {
        return Err("expected '('");
    }
    *pos += 1;
    let mut values = Vec::new();
    loop {
        match tokens.get(*pos) {
            Some(Token::Ident(v)) => {
                if !valid_value(v) {
                    return Err("invalid label value");
                }
                values.push(v.clone());
                *pos += 1;
            }
            Some(Token::Comma) => *pos += 1,
            Some(Token::Close) => {
                *pos += 1;
                return Ok(values);
            }
            _ => return Err("expected ')'"),
        }
    }
}

impl LabelSelector {
    pub(crate) fn parse(input: &str) -> Result<Self, ApiError> {
        let bad = |why: &str| {
            ApiError::bad_request(format!("unable to parse requirement: {why} in {input:?}"))
        };
        let tokens = tokenize(input);
        let mut reqs = Vec::new();
        let mut pos = 0;
        let ident = |pos: usize| match tokens.get(pos) {
            Some(Token::Ident(s)) => Some(s.clone()),
            _ => None,
        };
        while pos < tokens.len() {
            let req = if tokens[pos] == Token::Bang {
                let key = ident(pos + 1).ok_or_else(|| bad("expected a key after '!'"))?;
                pos += 2;
                LabelReq::NotExists(key)
            } else {
                let key = ident(pos).ok_or_else(|| bad("expected a key"))?;
                pos += 1;
                match tokens.get(pos) {
                    None | Some(Token::Comma) => LabelReq::Exists(key),
                    Some(Token::Eq | Token::DoubleEq | Token::NotEq) => {
                        let negate = tokens[pos] == Token::NotEq;
                        pos += 1;
                        // `k=` selects the empty value.
                        let value = match ident(pos) {
                            Some(v) => {
                                pos += 1;
                                v
                            }
                            None => String::new(),
                        };
                        if !valid_value(&value) {
                            return Err(bad("invalid label value"));
                        }
                        if negate {
                            LabelReq::NotEq(key, value)
                        } else {
                            LabelReq::Eq(key, value)
                        }
                    }
                    Some(Token::Gt | Token::Lt) => {
                        let greater = tokens[pos] == Token::Gt;
                        let n = ident(pos + 1)
                            .and_then(|v| v.parse::<i64>().ok())
                            .ok_or_else(|| bad("expected an integer"))?;
                        pos += 2;
                        if greater {
                            LabelReq::Gt(key, n)
                        } else {
                            LabelReq::Lt(key, n)
                        }
                    }
                    Some(Token::Ident(op)) if op == "in" || op == "notin" => {
                        let negate = op == "notin";
                        pos += 1;
                        let values = value_list(&tokens, &mut pos).map_err(&bad)?;
                        if negate {
                            LabelReq::NotIn(key, values)
                        } else {
                            LabelReq::In(key, values)
                        }
                    }
                    Some(_) => return Err(bad("unexpected operator")),
                }
            };
            let key = match &req {
                LabelReq::Eq(k, _)
                | LabelReq::NotEq(k, _)
                | LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k)
                | LabelReq::Gt(k, _)
                | LabelReq::Lt(k, _) => k,
            };
            if !valid_key(key) {
                return Err(bad("invalid label key"));
            }
            reqs.push(req);
            match tokens.get(pos) {
                None => {}
                Some(Token::Comma) => pos += 1,
                Some(_) => return Err(bad("expected ','")),
            }
        }
        Ok(LabelSelector(reqs))
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let labels = obj.pointer("/metadata/labels");
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
            LabelReq::Gt(k, n) => label(k)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l > *n),
            LabelReq::Lt(k, n) => label(k)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l < *n),
        })
    }
}

/// A parsed `fieldSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector(Vec<FieldReq>);

#[derive(Debug, Clone, PartialEq)]
struct FieldReq {
    /// JSON pointer to the field, e.g. `/spec/nodeName`.
    pointer: String,
    value: String,
    negate: bool,
}

impl FieldSelector {
    /// Parses `input`, rejecting fields the kind does not index (400, like upstream).
    pub(crate) fn parse(input: &str, def: &ResourceDef) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in input.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, negate) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{input}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            let supported = field == "metadata.name"
                || (field == "metadata.namespace" && def.namespaced)
                || def.fields.contains(&field);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push(FieldReq {
                pointer: format!("/{}", field.replace('.', "/")),
                value: value.trim().to_owned(),
                negate,
            });
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether `obj` satisfies every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|req| {
            // Upstream's field sets render missing strings as "" and booleans as text.
            let actual = match obj.pointer(&req.pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::Null) | None
                    if req.pointer.ends_with("unschedulable")
                        || req.pointer.ends_with("hostNetwork") =>
                {
                    "false".to_owned()
                }
                _ => String::new(),
            };
            (actual == req.value) != req.negate
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::registry::{RESOURCES, by_plural};

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let m = |s: &str| LabelSelector::parse(s).map(|sel| sel.matches(&o));
        assert_eq!(m("app=web"), Ok(true));
        assert_eq!(m("app==web,tier=front"), Ok(true));
        assert_eq!(m("app!=web"), Ok(false));
        assert_eq!(m("app in (db, web)"), Ok(true));
        assert_eq!(m("app notin (db,web)"), Ok(false));
        assert_eq!(m("app notin (db)"), Ok(true));
        assert_eq!(m("tier,!missing"), Ok(true));
        assert_eq!(m("!app"), Ok(false));
        assert_eq!(m("missing!=x"), Ok(true));
        assert_eq!(m("n>4,n<6"), Ok(true));
        assert_eq!(m(""), Ok(true));
        assert!(m("app in (web").is_err());
        assert!(m("app=web=x").is_err());
        assert!(m("=x").is_err());
    }

    #[test]
    fn field_selectors() {
        let pods = &RESOURCES[by_plural("", "v1", "pods").expect("pods are served")];
        let o = obj(json!({}));
        let m = |s: &str| FieldSelector::parse(s, pods).map(|sel| sel.matches(&o));
        assert_eq!(m("metadata.name=a"), Ok(true));
        assert_eq!(m("metadata.name==a,metadata.namespace!=ns"), Ok(false));
        assert_eq!(m("spec.nodeName=n1"), Ok(true));
        assert_eq!(m("spec.nodeName!=n1"), Ok(false));
        assert_eq!(m("status.podIP="), Ok(true));
        assert_eq!(m("spec.hostNetwork=false"), Ok(true));
        assert_eq!(m("spec.bogus=1").map_err(|e| e.code), Err(400));
        assert_eq!(m("nonsense").map_err(|e| e.code), Err(400));
    }
}
