//! Tables, chains and rules.

use super::attr::Attr;
use super::expr::Expr;
use super::sys;

/// The family of a table (`nfgen_family` of every message about it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4 and IPv6 in one table; what we use.
    Inet,
    Ip,
    Ip6,
}

impl Family {
    pub(crate) fn nfproto(self) -> u8 {
        match self {
            Family::Inet => sys::NFPROTO_INET,
            Family::Ip => sys::NFPROTO_IPV4,
            Family::Ip6 => sys::NFPROTO_IPV6,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Inet => "inet",
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }
}

/// A table: the namespace all our chains and sets live in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Table {
    pub family: Family,
    pub name: String,
}

impl Table {
    pub fn inet(name: impl Into<String>) -> Table {
        Table {
            family: Family::Inet,
            name: name.into(),
        }
    }

    pub(crate) fn attrs(&self) -> Vec<Attr> {
        vec![
            Attr::string(sys::NFTA_TABLE_NAME, &self.name),
            Attr::u32(sys::NFTA_TABLE_FLAGS, 0),
        ]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainType {
    Filter,
    Nat,
    Route,
}

impl ChainType {
    fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
            ChainType::Route => "route",
        }
    }
}

/// Netfilter hooks (`NF_INET_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    Prerouting = 0,
    Input = 1,
    Forward = 2,
    Output = 3,
    Postrouting = 4,
}

/// Standard priorities, as nft names them.
pub mod priority {
    pub const RAW: i32 = -300;
    pub const MANGLE: i32 = -150;
    pub const DSTNAT: i32 = -100;
    pub const FILTER: i32 = 0;
    pub const SECURITY: i32 = 50;
    pub const SRCNAT: i32 = 100;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    Accept,
    Drop,
}

/// Where and how a base chain is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
    pub policy: Policy,
}

/// A chain: regular (reached by jump/goto), or a base chain on a hook.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
}

impl Chain {
    pub fn regular(name: impl Into<String>) -> Chain {
        Chain {
            name: name.into(),
            base: None,
        }
    }

    /// A base chain with policy accept.
    pub fn base(name: impl Into<String>, kind: ChainType, hook: Hook, priority: i32) -> Chain {
        Chain {
            name: name.into(),
            base: Some(BaseChain {
                kind,
                hook,
                priority,
                policy: Policy::Accept,
            }),
        }
    }

    pub(crate) fn attrs(&self, table: &str) -> Vec<Attr> {
        let mut attrs = vec![
            Attr::string(sys::NFTA_CHAIN_TABLE, table),
            Attr::string(sys::NFTA_CHAIN_NAME, &self.name),
        ];
        if let Some(base) = &self.base {
            attrs.push(Attr::nested(
                sys::NFTA_CHAIN_HOOK,
                vec![
                    Attr::u32(sys::NFTA_HOOK_HOOKNUM, base.hook as u32),
                    // The kernel reads the priority as a big-endian s32.
                    Attr::bytes(sys::NFTA_HOOK_PRIORITY, base.priority.to_be_bytes()),
                ],
            ));
            attrs.push(Attr::u32(
                sys::NFTA_CHAIN_POLICY,
                match base.policy {
                    Policy::Accept => sys::NF_ACCEPT as u32,
                    Policy::Drop => sys::NF_DROP as u32,
                },
            ));
            attrs.push(Attr::string(sys::NFTA_CHAIN_TYPE, base.kind.name()));
        }
        attrs
    }
}

/// A rule: expressions evaluated in order in one chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub chain: String,
    pub exprs: Vec<Expr>,
    /// Shown by `nft list` after the rule, as nft's own `comment "…"`.
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(chain: impl Into<String>, exprs: impl IntoIterator<Item = Expr>) -> Rule {
        Rule {
            chain: chain.into(),
            exprs: exprs.into_iter().collect(),
            comment: None,
        }
    }

    pub fn with_comment(mut self, comment: String) -> Rule {
        self.comment = Some(comment);
        self
    }

    /// `NFT_MSG_NEWRULE` attributes; `position` is the handle to add after (or, without
    /// `NLM_F_APPEND`, before).
    pub(crate) fn attrs(&self, table: &str, position: Option<u64>) -> Vec<Attr> {
        let mut attrs = vec![
            Attr::string(sys::NFTA_RULE_TABLE, table),
            Attr::string(sys::NFTA_RULE_CHAIN, &self.chain),
        ];
        if let Some(position) = position {
            attrs.push(Attr::u64(sys::NFTA_RULE_POSITION, position));
        }
        attrs.push(Attr::nested(
            sys::NFTA_RULE_EXPRESSIONS,
            self.exprs.iter().map(Expr::to_attr).collect(),
        ));
        if let Some(comment) = &self.comment {
            attrs.push(Attr::bytes(
                sys::NFTA_RULE_USERDATA,
                comment_userdata(comment),
            ));
        }
        attrs
    }

    /// A short description for error messages: the expression kinds in order.
    pub fn summary(&self) -> String {
        let kinds: Vec<&str> = self.exprs.iter().map(Expr::kind_name).collect();
        format!("[{}]", kinds.join(" "))
    }
}

/// A comment as nft writes it in a rule's user data: one libnftnl TLV of type
/// `NFTNL_UDATA_RULE_COMMENT`, the string with its NUL. nft shows at most 128 bytes.
fn comment_userdata(comment: &str) -> Vec<u8> {
    let text = &comment.as_bytes()[..comment.len().min(127)];
    let mut userdata = vec![sys::NFTNL_UDATA_RULE_COMMENT, text.len() as u8 + 1];
    userdata.extend_from_slice(text);
    userdata.push(0);
    userdata
}

/// The comment of a rule's user data, read back from the kernel.
pub(crate) fn comment_of_userdata(mut userdata: &[u8]) -> Option<&str> {
    while let [kind, len, rest @ ..] = userdata {
        let value = rest.get(..usize::from(*len))?;
        if *kind == sys::NFTNL_UDATA_RULE_COMMENT {
            return std::str::from_utf8(value.strip_suffix(&[0]).unwrap_or(value)).ok();
        }
        userdata = &rest[usize::from(*len)..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::attr::encode;

    #[test]
    fn rule_comments_are_libnftnl_tlvs_and_read_back() {
        let userdata = comment_userdata("nodus chain 00ff");
        assert_eq!(&userdata[..2], &[0, 17]);
        assert_eq!(comment_of_userdata(&userdata), Some("nodus chain 00ff"));
        // Another TLV first (an ebtables policy, type 1) is skipped.
        let mut other = vec![1, 4, 0, 0, 0, 0];
        other.extend_from_slice(&userdata);
        assert_eq!(comment_of_userdata(&other), Some("nodus chain 00ff"));
        assert_eq!(comment_of_userdata(&[0, 9, b'a']), None, "truncated");
        assert_eq!(comment_userdata(&"x".repeat(300)).len(), 2 + 128);
    }

    #[test]
    fn base_chain_hook_and_signed_priority() {
        let chain = Chain::base("filter-input", ChainType::Filter, Hook::Input, -110);
        let bytes = encode(&chain.attrs("t")[2..3]);
        let mut expected = vec![20, 0, 4, 0x80, 8, 0, 1, 0, 0, 0, 0, 1, 8, 0, 2, 0];
        expected.extend_from_slice(&(-110i32).to_be_bytes());
        assert_eq!(bytes, expected);
        assert!(
            chain
                .attrs("t")
                .contains(&Attr::string(sys::NFTA_CHAIN_TYPE, "filter"))
        );
        assert!(
            chain
                .attrs("t")
                .contains(&Attr::u32(sys::NFTA_CHAIN_POLICY, 1))
        );
        assert_eq!(Chain::regular("svc").attrs("t").len(), 2);
    }
}
