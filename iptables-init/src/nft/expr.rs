//! The kernel's nf_tables expressions a compiled rule is made of (`linux/netfilter/nf_tables.h`):
//! what [`super::compile`] produces and [`super::encode`] writes.

/// nf_tables meta keys (`enum nft_meta_keys`).
pub mod meta {
    pub const MARK: u32 = 3;
    pub const IIFNAME: u32 = 6;
    pub const OIFNAME: u32 = 7;
    pub const SKUID: u32 = 10;
    pub const SKGID: u32 = 11;
    pub const NFPROTO: u32 = 15;
    pub const L4PROTO: u32 = 16;
}

/// Conntrack keys (`enum nft_ct_keys`).
pub mod ct {
    pub const STATE: u32 = 0;
    pub const MARK: u32 = 3;
    pub const ZONE: u32 = 17;
}

/// Payload bases (`enum nft_payload_bases`).
pub const NETWORK_HEADER: u32 = 1;
pub const TRANSPORT_HEADER: u32 = 2;

/// `enum nft_cmp_ops`.
pub const CMP_EQ: u32 = 0;
pub const CMP_NEQ: u32 = 1;

/// Verdict codes (`NF_DROP`, `NF_ACCEPT`, `NFT_JUMP`, `NFT_RETURN`).
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_RETURN: i32 = -5;

/// One expression of a rule. Every load and store uses register 1; verdicts go to the
/// verdict register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// `meta load <key> => reg 1`
    Meta {
        key: u32,
    },
    /// `meta set <key> with reg 1`
    MetaSet {
        key: u32,
    },
    /// `ct load <key> => reg 1`
    Ct {
        key: u32,
    },
    /// `ct set <key> with reg 1`
    CtSet {
        key: u32,
    },
    /// `payload load <len>b @ <base> + <offset> => reg 1`
    Payload {
        base: u32,
        offset: u32,
        len: u32,
    },
    /// `cmp <op> reg 1 <data>`
    Cmp {
        op: u32,
        data: Vec<u8>,
    },
    /// `bitwise reg 1 = (reg 1 & mask) ^ xor`
    Bitwise {
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// `lookup reg 1 set <sets[set]>`, inverted for `!=`.
    Lookup {
        set: usize,
        invert: bool,
    },
    Counter,
    /// `immediate reg 1 <data>`
    Immediate {
        data: Vec<u8>,
    },
    /// `immediate reg 0 <verdict>`
    Verdict {
        code: i32,
        chain: Option<String>,
    },
    /// `redir proto_min reg 1`
    Redirect,
    /// `tproxy <family> port reg 1`
    Tproxy {
        family: u8,
    },
}

/// An anonymous constant set a rule looks up (`{ 53, 15008 }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnonSet {
    /// nft's datatype id of the key (13: inet_service).
    pub key_type: u32,
    pub key_len: u32,
    pub elements: Vec<Vec<u8>>,
}

/// A compiled rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    pub exprs: Vec<Expr>,
    pub sets: Vec<AnonSet>,
}
