//! Kernel ABI numbers for nf_tables, from `include/uapi/linux/netfilter/nf_tables.h`,
//! `nfnetlink.h` and `nf_nat.h`.
//!
//! They live in one place so that a reviewer can hold them against the kernel headers.
//! `netlink-packet-netfilter` keeps most of its own copies private, so we cannot reuse them.

#![allow(dead_code)] // A complete table of the ABI reads better than a pruned one.

// nfnetlink (nfnetlink.h)
pub const NFNL_SUBSYS_CTNETLINK: u8 = 1;
pub const NFNL_SUBSYS_NFTABLES: u8 = 10;
pub const NFNETLINK_V0: u8 = 0;
pub const NFNETLINK_V1: u8 = 1;

// ctnetlink (nfnetlink_conntrack.h)
pub const IPCTNL_MSG_CT_GET: u8 = 1;
pub const IPCTNL_MSG_CT_DELETE: u8 = 2;
pub const CTA_TUPLE_ORIG: u16 = 1;
pub const CTA_TUPLE_REPLY: u16 = 2;
pub const CTA_ZONE: u16 = 18;
pub const CTA_FILTER: u16 = 25;
pub const CTA_TUPLE_IP: u16 = 1;
pub const CTA_TUPLE_PROTO: u16 = 2;
pub const CTA_IP_V4_SRC: u16 = 1;
pub const CTA_IP_V4_DST: u16 = 2;
pub const CTA_IP_V6_SRC: u16 = 3;
pub const CTA_IP_V6_DST: u16 = 4;
pub const CTA_PROTO_NUM: u16 = 1;
pub const CTA_PROTO_SRC_PORT: u16 = 2;
pub const CTA_PROTO_DST_PORT: u16 = 3;
pub const CTA_FILTER_ORIG_FLAGS: u16 = 1;
pub const CTA_FILTER_REPLY_FLAGS: u16 = 2;
pub const CTA_FILTER_F_CTA_PROTO_NUM: u32 = 1 << 3;
pub const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub const NFNL_MSG_BATCH_END: u16 = 17;

// Messages (enum nf_tables_msg_types).
pub const NFT_MSG_NEWTABLE: u8 = 0;
pub const NFT_MSG_GETTABLE: u8 = 1;
pub const NFT_MSG_DELTABLE: u8 = 2;
pub const NFT_MSG_NEWCHAIN: u8 = 3;
pub const NFT_MSG_GETCHAIN: u8 = 4;
pub const NFT_MSG_DELCHAIN: u8 = 5;
pub const NFT_MSG_NEWRULE: u8 = 6;
pub const NFT_MSG_GETRULE: u8 = 7;
pub const NFT_MSG_DELRULE: u8 = 8;
pub const NFT_MSG_NEWSET: u8 = 9;
pub const NFT_MSG_GETSET: u8 = 10;
pub const NFT_MSG_DELSET: u8 = 11;
pub const NFT_MSG_NEWSETELEM: u8 = 12;
pub const NFT_MSG_GETSETELEM: u8 = 13;
pub const NFT_MSG_DELSETELEM: u8 = 14;
pub const NFT_MSG_NEWGEN: u8 = 15;
pub const NFT_MSG_GETGEN: u8 = 16;

// Protocol families (nfgenmsg.nfgen_family).
pub const NFPROTO_INET: u8 = 1;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

// Common list / data / verdict attributes.
pub const NFTA_LIST_ELEM: u16 = 1;
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;

// Verdict codes (netfilter.h and enum nft_verdicts), as the kernel's signed int.
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_CONTINUE: i32 = -1;
pub const NFT_BREAK: i32 = -2;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;

// Tables.
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_FLAGS: u16 = 2;

// Chains.
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;

// Rules.
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_HANDLE: u16 = 3;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_POSITION: u16 = 6;
pub const NFTA_RULE_USERDATA: u16 = 7;
/// libnftnl's TLV type for a rule's comment in `NFTA_RULE_USERDATA`.
pub const NFTNL_UDATA_RULE_COMMENT: u8 = 0;
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;

// Sets.
pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_DATA_TYPE: u16 = 6;
pub const NFTA_SET_DATA_LEN: u16 = 7;
pub const NFTA_SET_DESC: u16 = 9;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_EXPR: u16 = 17;
pub const NFTA_SET_TIMEOUT: u16 = 11;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFTA_SET_DESC_SIZE: u16 = 1;
pub const NFTA_SET_DESC_CONCAT: u16 = 2;
pub const NFTA_SET_FIELD_LEN: u16 = 1;

pub const NFT_SET_ANONYMOUS: u32 = 0x1;
pub const NFT_SET_CONSTANT: u32 = 0x2;
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;
pub const NFT_SET_CONCAT: u32 = 0x80;

// nft's own set annotations in NFTA_SET_USERDATA (libnftnl `enum nftnl_udata_set_types`
// and nftables `enum byteorder`): how to print keys and data.
pub const NFTNL_UDATA_SET_KEYBYTEORDER: u8 = 0;
pub const NFTNL_UDATA_SET_DATABYTEORDER: u8 = 1;
pub const NFTNL_UDATA_SET_KEY_TYPEOF: u8 = 3;
pub const NFTNL_UDATA_SET_DATA_TYPEOF: u8 = 4;
pub const NFTNL_UDATA_SET_DATA_INTERVAL: u8 = 6;
// Inside a typeof annotation: the expression's type, then its own attributes.
pub const NFTNL_UDATA_SET_TYPEOF_EXPR: u8 = 0;
pub const NFTNL_UDATA_SET_TYPEOF_DATA: u8 = 1;
// nftables' `enum expr_types` numbers, and its protocol and field numbers, as they
// appear in typeof annotations.
pub const NFT_EXPR_TYPE_PAYLOAD: u32 = 7;
pub const NFT_EXPR_TYPE_CONCAT: u32 = 13;
pub const NFT_EXPR_TYPE_META: u32 = 9;
pub const NFT_EXPR_TYPE_NUMGEN: u32 = 23;
pub const NFT_PROTO_IP: u32 = 12;
pub const NFT_PROTO_IP6: u32 = 13;
pub const NFT_PROTO_TH: u32 = 11;
pub const NFT_IPHDR_DADDR: u32 = 12;
pub const NFT_IP6HDR_DADDR: u32 = 9;
pub const NFT_THDR_DPORT: u32 = 2;
pub const NFT_BYTEORDER_HOST_ENDIAN: u32 = 1;

/// `NFTA_SET_DATA_TYPE` of a verdict map (`NFT_DATA_VERDICT`).
pub const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

// Set elements.
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
pub const NFTA_SET_ELEM_EXPIRATION: u16 = 5;
pub const NFTA_SET_ELEM_KEY_END: u16 = 10;
pub const NFTA_SET_ELEM_EXPR: u16 = 7;
pub const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;

// Generation.
pub const NFTA_GEN_ID: u16 = 1;

// Registers: the verdict register, and the 32-bit registers that concatenations need.
pub const NFT_REG_VERDICT: u32 = 0;
pub const NFT_REG_1: u32 = 1;
pub const NFT_REG32_00: u32 = 8;

// payload
pub const NFTA_PAYLOAD_DREG: u16 = 1;
pub const NFTA_PAYLOAD_BASE: u16 = 2;
pub const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub const NFTA_PAYLOAD_LEN: u16 = 4;
pub const NFT_PAYLOAD_LL_HEADER: u32 = 0;
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;

// meta
pub const NFTA_META_DREG: u16 = 1;
pub const NFTA_META_KEY: u16 = 2;
pub const NFTA_META_SREG: u16 = 3;
pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_IIF: u32 = 4;
pub const NFT_META_OIF: u32 = 5;
pub const NFT_META_IIFNAME: u32 = 6;
pub const NFT_META_OIFNAME: u32 = 7;
pub const NFT_META_NFPROTO: u32 = 15;
pub const NFT_META_L4PROTO: u32 = 16;
pub const NFT_META_IIFGROUP: u32 = 21;

// cmp
pub const NFTA_CMP_SREG: u16 = 1;
pub const NFTA_CMP_OP: u16 = 2;
pub const NFTA_CMP_DATA: u16 = 3;

// bitwise
pub const NFTA_BITWISE_SREG: u16 = 1;
pub const NFTA_BITWISE_DREG: u16 = 2;
pub const NFTA_BITWISE_LEN: u16 = 3;
pub const NFTA_BITWISE_MASK: u16 = 4;
pub const NFTA_BITWISE_XOR: u16 = 5;

// immediate
pub const NFTA_IMMEDIATE_DREG: u16 = 1;
pub const NFTA_IMMEDIATE_DATA: u16 = 2;

// lookup
pub const NFTA_LOOKUP_SET: u16 = 1;
pub const NFTA_LOOKUP_SREG: u16 = 2;
pub const NFTA_LOOKUP_DREG: u16 = 3;
pub const NFTA_LOOKUP_SET_ID: u16 = 4;
pub const NFTA_LOOKUP_FLAGS: u16 = 5;
pub const NFT_LOOKUP_F_INV: u32 = 0x1;

// nat
pub const NFTA_NAT_TYPE: u16 = 1;
pub const NFTA_NAT_FAMILY: u16 = 2;
pub const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
pub const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub const NFTA_NAT_REG_PROTO_MAX: u16 = 6;
pub const NFTA_NAT_FLAGS: u16 = 7;
pub const NFT_NAT_SNAT: u32 = 0;
pub const NFT_NAT_DNAT: u32 = 1;
// nf_nat.h range flags
pub const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;
pub const NF_NAT_RANGE_PROTO_RANDOM: u32 = 0x4;
pub const NF_NAT_RANGE_PERSISTENT: u32 = 0x8;
pub const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;

// masq
pub const NFTA_MASQ_FLAGS: u16 = 1;

// redir
pub const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;

// numgen
pub const NFTA_NG_DREG: u16 = 1;
pub const NFTA_NG_MODULUS: u16 = 2;
pub const NFTA_NG_TYPE: u16 = 3;
pub const NFTA_NG_OFFSET: u16 = 4;
pub const NFT_NG_INCREMENTAL: u32 = 0;
pub const NFT_NG_RANDOM: u32 = 1;

// fib
pub const NFTA_FIB_DREG: u16 = 1;
pub const NFTA_FIB_RESULT: u16 = 2;
pub const NFTA_FIB_FLAGS: u16 = 3;
pub const NFT_FIB_RESULT_OIF: u32 = 1;
pub const NFT_FIB_RESULT_OIFNAME: u32 = 2;
pub const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub const NFTA_FIB_F_SADDR: u32 = 0x1;
pub const NFTA_FIB_F_DADDR: u32 = 0x2;
pub const NFTA_FIB_F_MARK: u32 = 0x4;
pub const NFTA_FIB_F_IIF: u32 = 0x8;
pub const NFTA_FIB_F_OIF: u32 = 0x10;
pub const NFTA_FIB_F_PRESENT: u32 = 0x20;

// ct
pub const NFTA_CT_DREG: u16 = 1;
pub const NFTA_CT_KEY: u16 = 2;
pub const NFTA_CT_DIRECTION: u16 = 3;
pub const NFTA_CT_SREG: u16 = 4;
pub const NFT_CT_STATE: u32 = 0;
pub const NFT_CT_STATUS: u32 = 2;
pub const NFT_CT_MARK: u32 = 3;
pub const NFT_CT_L3PROTOCOL: u32 = 7;
pub const NFT_CT_PROTOCOL: u32 = 10;
pub const NFT_CT_PROTO_SRC: u32 = 11;
pub const NFT_CT_PROTO_DST: u32 = 12;
pub const NFT_CT_SRC_IP: u32 = 19;
pub const NFT_CT_DST_IP: u32 = 20;
pub const NFT_CT_SRC_IP6: u32 = 21;
pub const NFT_CT_DST_IP6: u32 = 22;

// reject
pub const NFTA_REJECT_TYPE: u16 = 1;
pub const NFTA_REJECT_ICMP_CODE: u16 = 2;
pub const NFT_REJECT_ICMP_UNREACH: u32 = 0;
pub const NFT_REJECT_TCP_RST: u32 = 1;
pub const NFT_REJECT_ICMPX_UNREACH: u32 = 2;

// counter
pub const NFTA_COUNTER_BYTES: u16 = 1;
pub const NFTA_COUNTER_PACKETS: u16 = 2;

// dynset
pub const NFTA_DYNSET_SET_NAME: u16 = 1;
pub const NFTA_DYNSET_SET_ID: u16 = 2;
pub const NFTA_DYNSET_OP: u16 = 3;
pub const NFTA_DYNSET_SREG_KEY: u16 = 4;
pub const NFTA_DYNSET_SREG_DATA: u16 = 5;
pub const NFTA_DYNSET_TIMEOUT: u16 = 6;
pub const NFT_DYNSET_OP_ADD: u32 = 0;
pub const NFT_DYNSET_OP_UPDATE: u32 = 1;
pub const NFT_DYNSET_OP_DELETE: u32 = 2;

// limit
pub const NFTA_LIMIT_RATE: u16 = 1;
pub const NFTA_LIMIT_UNIT: u16 = 2;
pub const NFTA_LIMIT_BURST: u16 = 3;
pub const NFTA_LIMIT_TYPE: u16 = 4;
pub const NFTA_LIMIT_FLAGS: u16 = 5;
pub const NFT_LIMIT_PKTS: u32 = 0;
pub const NFT_LIMIT_PKT_BYTES: u32 = 1;
pub const NFT_LIMIT_F_INV: u32 = 0x1;
