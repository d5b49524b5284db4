//! A thin nf_tables netlink layer: the objects we program (tables, chains, sets, maps,
//! elements, rules and their expressions), their encoding as nf_tables messages, atomic
//! batches, and a socket to commit them and read state back.
//!
//! The encoding mirrors what `nft --debug=netlink` shows nft sending, so `nft list`
//! prints our rulesets as if nft had written them; the kernel tests in
//! `tests/nft_netlink.rs` check exactly that.

mod attr;
pub mod batch;
pub mod conntrack;
pub mod error;
pub mod expr;
pub mod object;
pub mod set;
pub mod socket;
mod sys;
pub mod types;

pub use batch::Batch;
pub use conntrack::{FlowTuple, UdpEntry};
pub use error::{Errno, Error, Result};
pub use expr::{Expr, Field, Register};
pub use object::{BaseChain, Chain, ChainType, Family, Hook, Policy, Rule, Table, priority};
pub use set::{AnonymousSet, Element, ElementData, Set, SetData, SetFlags, SetRef};
pub use socket::{Dispatch, ListedData, ListedElement, ListedRule, Socket};
pub use types::{DataType, Fields, Tuple, Value, Verdict};
