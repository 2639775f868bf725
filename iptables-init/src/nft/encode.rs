//! The nf_tables netlink messages of one transaction, encoded as the kernel's uapi
//! (`linux/netfilter/nf_tables.h`, `linux/netfilter/nfnetlink.h`) defines them: a
//! `NFNL_MSG_BATCH_BEGIN`, one message per change, `NFNL_MSG_BATCH_END`. Attribute integers
//! are big endian (`NLA_BE32`); register data keeps the byte order of what the register holds.

use super::expr::{AnonSet, Expr};

const NLMSG_HDR: usize = 16;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;

const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWSETELEM: u16 = 12;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_DESC_SIZE: u16 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFT_SET_ANONYMOUS: u32 = 0x1;
const NFT_SET_CONSTANT: u32 = 0x2;
const NFT_LOOKUP_F_INV: u32 = 0x1;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`: the redirect carries a port.
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
/// The name the kernel completes for an anonymous set (`__set0`, ...).
const ANON_SET_NAME: &str = "__set%d";

/// A base chain's hook (`type nat hook prerouting priority -100`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    pub kind: String,
    pub hooknum: u32,
    pub priority: i32,
}

/// Netlink attributes appended to a message buffer.
#[derive(Debug, Default)]
pub struct Attrs {
    buf: Vec<u8>,
    /// An attribute did not fit the 16-bit length field: the message must not be sent.
    oversized: bool,
}

impl Attrs {
    fn put(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        let len = 4 + value.len();
        let Ok(len16) = u16::try_from(len) else {
            self.oversized = true;
            return self;
        };
        self.buf.extend_from_slice(&len16.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    fn str(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.put(kind, &v)
    }

    fn be32(&mut self, kind: u16, v: u32) -> &mut Self {
        self.put(kind, &v.to_be_bytes())
    }

    fn nest(&mut self, kind: u16, f: impl FnOnce(&mut Attrs)) -> &mut Self {
        let mut inner = Attrs::default();
        f(&mut inner);
        self.oversized |= inner.oversized;
        self.put(kind | NLA_F_NESTED, &inner.buf)
    }

    /// `NFTA_DATA_VALUE` inside `kind`.
    fn data(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        self.nest(kind, |a| {
            a.put(NFTA_DATA_VALUE, value);
        })
    }
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// One transaction being encoded; every message carries its own sequence number so an error
/// can be traced back to the change that caused it.
#[derive(Debug)]
pub struct Batch {
    family: u8,
    buf: Vec<u8>,
    /// (sequence number, what the message does) for each change.
    pub changes: Vec<(u32, String)>,
    next_seq: u32,
    next_set_id: u32,
    /// Where the last change's message starts.
    last_change_at: Option<usize>,
    /// The first change whose attributes did not fit a netlink attribute.
    oversized: Option<String>,
}

impl Batch {
    /// A transaction for tables of `family`, its begin message already written.
    pub fn new(family: u8, first_seq: u32) -> Batch {
        let mut b = Batch {
            family,
            buf: Vec::with_capacity(16 * 1024),
            changes: Vec::new(),
            next_seq: first_seq,
            next_set_id: 1,
            last_change_at: None,
            oversized: None,
        };
        b.control(NFNL_MSG_BATCH_BEGIN);
        b
    }

    /// Batch begin and end: `res_id` names the nf_tables subsystem, family unspecified.
    fn control(&mut self, kind: u16) {
        let seq = self.take_seq();
        self.header(
            kind,
            NLM_F_REQUEST,
            seq,
            0,
            &NFNL_SUBSYS_NFTABLES.to_be_bytes(),
            &[],
        );
    }

    fn take_seq(&mut self) -> u32 {
        let s = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        s
    }

    fn header(&mut self, kind: u16, flags: u16, seq: u32, family: u8, res: &[u8], attrs: &[u8]) {
        let len = NLMSG_HDR + 4 + attrs.len();
        self.buf.extend_from_slice(&(len as u32).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family, version (NFNETLINK_V0), resource id (big endian).
        self.buf.push(family);
        self.buf.push(0);
        self.buf.extend_from_slice(res);
        self.buf.extend_from_slice(attrs);
    }

    fn message(&mut self, msg: u16, flags: u16, attrs: &Attrs, what: String) {
        if attrs.oversized && self.oversized.is_none() {
            self.oversized = Some(what.clone());
        }
        let seq = self.take_seq();
        self.last_change_at = Some(self.buf.len());
        self.header(
            (NFNL_SUBSYS_NFTABLES << 8) | msg,
            NLM_F_REQUEST | flags,
            seq,
            self.family,
            &[0, 0],
            &attrs.buf,
        );
        self.changes.push((seq, what));
    }

    /// `add table`: created when missing, kept as it is otherwise.
    pub fn add_table(&mut self, table: &str) {
        let mut a = Attrs::default();
        a.str(NFTA_TABLE_NAME, table);
        self.message(
            NFT_MSG_NEWTABLE,
            NLM_F_CREATE,
            &a,
            format!("add table {table}"),
        );
    }

    /// `delete table`, with everything in it.
    pub fn delete_table(&mut self, table: &str) {
        let mut a = Attrs::default();
        a.str(NFTA_TABLE_NAME, table);
        self.message(NFT_MSG_DELTABLE, 0, &a, format!("delete table {table}"));
    }

    /// `flush table`: every rule of every chain of the table goes.
    pub fn flush_table(&mut self, table: &str) {
        let mut a = Attrs::default();
        a.str(NFTA_RULE_TABLE, table);
        self.message(NFT_MSG_DELRULE, 0, &a, format!("flush table {table}"));
    }

    /// `add chain`, a base chain when `hook` is given.
    pub fn add_chain(&mut self, table: &str, chain: &str, hook: Option<&Hook>) {
        let mut a = Attrs::default();
        a.str(NFTA_CHAIN_TABLE, table).str(NFTA_CHAIN_NAME, chain);
        if let Some(h) = hook {
            a.nest(NFTA_CHAIN_HOOK, |n| {
                n.be32(NFTA_HOOK_HOOKNUM, h.hooknum)
                    .be32(NFTA_HOOK_PRIORITY, h.priority as u32);
            })
            .str(NFTA_CHAIN_TYPE, &h.kind);
        }
        self.message(
            NFT_MSG_NEWCHAIN,
            NLM_F_CREATE,
            &a,
            format!("add chain {table} {chain}"),
        );
    }

    /// `add rule` (appended): its anonymous sets first, then the rule that looks them up.
    pub fn add_rule(
        &mut self,
        table: &str,
        chain: &str,
        exprs: &[Expr],
        sets: &[AnonSet],
        text: &str,
    ) {
        let mut ids = Vec::with_capacity(sets.len());
        for set in sets {
            let id = self.next_set_id;
            self.next_set_id += 1;
            self.add_set(table, id, set, text);
            ids.push(id);
        }
        let mut a = Attrs::default();
        a.str(NFTA_RULE_TABLE, table).str(NFTA_RULE_CHAIN, chain);
        a.nest(NFTA_RULE_EXPRESSIONS, |list| {
            for e in exprs {
                list.nest(NFTA_LIST_ELEM, |el| expression(el, e, &ids));
            }
        });
        self.message(
            NFT_MSG_NEWRULE,
            NLM_F_CREATE | NLM_F_APPEND,
            &a,
            format!("add rule {table} {chain} {text}"),
        );
    }

    fn add_set(&mut self, table: &str, id: u32, set: &AnonSet, text: &str) {
        let mut a = Attrs::default();
        a.str(NFTA_SET_TABLE, table)
            .str(NFTA_SET_NAME, ANON_SET_NAME)
            .be32(NFTA_SET_FLAGS, NFT_SET_ANONYMOUS | NFT_SET_CONSTANT)
            .be32(NFTA_SET_KEY_TYPE, set.key_type)
            .be32(NFTA_SET_KEY_LEN, set.key_len)
            .be32(NFTA_SET_ID, id)
            .nest(NFTA_SET_DESC, |d| {
                d.be32(NFTA_SET_DESC_SIZE, set.elements.len() as u32);
            });
        self.message(
            NFT_MSG_NEWSET,
            NLM_F_CREATE,
            &a,
            format!("add set of rule {text}"),
        );
        let mut e = Attrs::default();
        e.str(NFTA_SET_ELEM_LIST_TABLE, table)
            .str(NFTA_SET_ELEM_LIST_SET, ANON_SET_NAME)
            .be32(NFTA_SET_ELEM_LIST_SET_ID, id)
            .nest(NFTA_SET_ELEM_LIST_ELEMENTS, |list| {
                for key in &set.elements {
                    list.nest(NFTA_LIST_ELEM, |el| {
                        el.data(NFTA_SET_ELEM_KEY, key);
                    });
                }
            });
        self.message(
            NFT_MSG_NEWSETELEM,
            NLM_F_CREATE,
            &e,
            format!("add set elements of rule {text}"),
        );
    }

    /// The first change too large for a netlink attribute (64 KiB), if any: such a batch
    /// must not be sent.
    pub fn oversized(&self) -> Option<&str> {
        self.oversized.as_deref()
    }

    /// The whole transaction, end message written. The kernel is asked to acknowledge
    /// the last change (delivered after the commit), so success is seen, not assumed.
    pub fn finish(mut self) -> (Vec<u8>, Vec<(u32, String)>) {
        if let Some(at) = self.last_change_at {
            let flags = u16::from_ne_bytes([self.buf[at + 6], self.buf[at + 7]]) | NLM_F_ACK;
            self.buf[at + 6..at + 8].copy_from_slice(&flags.to_ne_bytes());
        }
        self.control(NFNL_MSG_BATCH_END);
        (self.buf, self.changes)
    }
}

/// One expression: `NFTA_EXPR_NAME` and its `NFTA_EXPR_DATA`; `set_ids[i]` is the transaction
/// id of the rule's i-th anonymous set.
fn expression(el: &mut Attrs, e: &Expr, set_ids: &[u32]) {
    let (name, data): (&str, Attrs) = match e {
        Expr::Meta { key } => ("meta", {
            let mut d = Attrs::default();
            d.be32(1, NFT_REG_1).be32(2, *key); // NFTA_META_DREG, NFTA_META_KEY
            d
        }),
        Expr::MetaSet { key } => ("meta", {
            let mut d = Attrs::default();
            d.be32(2, *key).be32(3, NFT_REG_1); // NFTA_META_KEY, NFTA_META_SREG
            d
        }),
        Expr::Ct { key } => ("ct", {
            let mut d = Attrs::default();
            d.be32(1, NFT_REG_1).be32(2, *key); // NFTA_CT_DREG, NFTA_CT_KEY
            d
        }),
        Expr::CtSet { key } => ("ct", {
            let mut d = Attrs::default();
            d.be32(2, *key).be32(4, NFT_REG_1); // NFTA_CT_KEY, NFTA_CT_SREG
            d
        }),
        Expr::Payload { base, offset, len } => ("payload", {
            let mut d = Attrs::default();
            // NFTA_PAYLOAD_DREG, _BASE, _OFFSET, _LEN
            d.be32(1, NFT_REG_1)
                .be32(2, *base)
                .be32(3, *offset)
                .be32(4, *len);
            d
        }),
        Expr::Cmp { op, data } => ("cmp", {
            let mut d = Attrs::default();
            d.be32(1, NFT_REG_1).be32(2, *op).data(3, data); // NFTA_CMP_SREG, _OP, _DATA
            d
        }),
        Expr::Bitwise { mask, xor } => ("bitwise", {
            let mut d = Attrs::default();
            // NFTA_BITWISE_SREG, _DREG, _LEN, _MASK, _XOR
            d.be32(1, NFT_REG_1)
                .be32(2, NFT_REG_1)
                .be32(3, mask.len() as u32)
                .data(4, mask)
                .data(5, xor);
            d
        }),
        Expr::Lookup { set, invert } => ("lookup", {
            let mut d = Attrs::default();
            // NFTA_LOOKUP_SET, _SREG, _SET_ID, _FLAGS
            d.str(1, ANON_SET_NAME)
                .be32(2, NFT_REG_1)
                .be32(4, set_ids.get(*set).copied().unwrap_or_default());
            if *invert {
                d.be32(5, NFT_LOOKUP_F_INV);
            }
            d
        }),
        Expr::Counter => ("counter", {
            let mut d = Attrs::default();
            d.put(1, &0u64.to_be_bytes()).put(2, &0u64.to_be_bytes()); // BYTES, PACKETS
            d
        }),
        Expr::Immediate { data } => ("immediate", {
            let mut d = Attrs::default();
            d.be32(1, NFT_REG_1).data(2, data); // NFTA_IMMEDIATE_DREG, _DATA
            d
        }),
        Expr::Verdict { code, chain } => ("immediate", {
            let mut d = Attrs::default();
            d.be32(1, NFT_REG_VERDICT).nest(2, |data| {
                data.nest(NFTA_DATA_VERDICT, |v| {
                    v.be32(NFTA_VERDICT_CODE, *code as u32);
                    if let Some(c) = chain {
                        v.str(NFTA_VERDICT_CHAIN, c);
                    }
                });
            });
            d
        }),
        Expr::Redirect => ("redir", {
            let mut d = Attrs::default();
            // NFTA_REDIR_REG_PROTO_MIN, NFTA_REDIR_FLAGS
            d.be32(1, NFT_REG_1).be32(3, NF_NAT_RANGE_PROTO_SPECIFIED);
            d
        }),
        Expr::Tproxy { family } => ("tproxy", {
            let mut d = Attrs::default();
            // NFTA_TPROXY_FAMILY, NFTA_TPROXY_REG_PORT
            d.be32(1, u32::from(*family)).be32(3, NFT_REG_1);
            d
        }),
    };
    el.str(NFTA_EXPR_NAME, name);
    el.put(NFTA_EXPR_DATA | NLA_F_NESTED, &data.buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ne16(v: u16) -> [u8; 2] {
        v.to_ne_bytes()
    }

    fn ne32(v: u32) -> [u8; 4] {
        v.to_ne_bytes()
    }

    /// nlmsghdr + nfgenmsg, as the uapi lays them out.
    fn header(len: u32, kind: u16, flags: u16, seq: u32, family: u8, res: [u8; 2]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(ne32(len));
        v.extend(ne16(kind));
        v.extend(ne16(flags));
        v.extend(ne32(seq));
        v.extend(ne32(0));
        v.extend([family, 0]);
        v.extend(res);
        v
    }

    #[test]
    fn a_table_transaction_byte_for_byte() {
        let mut b = Batch::new(1, 7);
        b.add_table("t");
        let (bytes, changes) = b.finish();
        let mut want = header(20, 0x10, NLM_F_REQUEST, 7, 0, [0, 10]);
        // NEWTABLE (subsystem 10 << 8 | 0), create, acked as the last change; NFTA_TABLE_NAME
        // "t\0" (len 6, padded to 8).
        want.extend(header(28, 0x0a00, 0x1 | 0x4 | 0x400, 8, 1, [0, 0]));
        want.extend(ne16(6));
        want.extend(ne16(1));
        want.extend([b't', 0, 0, 0]);
        want.extend(header(20, 0x11, NLM_F_REQUEST, 9, 0, [0, 10]));
        assert_eq!(bytes, want);
        assert_eq!(changes, vec![(8, "add table t".to_string())]);
    }

    #[test]
    fn base_chain_hook_is_nested_and_big_endian() {
        let mut a = Attrs::default();
        a.nest(NFTA_CHAIN_HOOK, |n| {
            n.be32(NFTA_HOOK_HOOKNUM, 0)
                .be32(NFTA_HOOK_PRIORITY, -100i32 as u32);
        });
        let mut want = Vec::new();
        want.extend(ne16(20));
        want.extend(ne16(4 | 0x8000));
        want.extend(ne16(8));
        want.extend(ne16(1));
        want.extend([0, 0, 0, 0]);
        want.extend(ne16(8));
        want.extend(ne16(2));
        want.extend([0xff, 0xff, 0xff, 0x9c]);
        assert_eq!(a.buf, want);
    }

    #[test]
    fn a_jump_verdict_nests_data_verdict_code_and_chain() {
        let mut el = Attrs::default();
        expression(
            &mut el,
            &Expr::Verdict {
                code: -3,
                chain: Some("c".into()),
            },
            &[],
        );
        let mut want = Vec::new();
        // NFTA_EXPR_NAME "immediate\0" (4 + 10 = 14, padded to 16)
        want.extend(ne16(14));
        want.extend(ne16(1));
        want.extend(b"immediate\0\0\0");
        // NFTA_EXPR_DATA { DREG 0, DATA { VERDICT { CODE -3, CHAIN "c" } } }
        want.extend(ne16(4 + 8 + 24));
        want.extend(ne16(2 | 0x8000));
        want.extend(ne16(8));
        want.extend(ne16(1));
        want.extend([0, 0, 0, 0]);
        want.extend(ne16(24));
        want.extend(ne16(2 | 0x8000));
        want.extend(ne16(20));
        want.extend(ne16(2 | 0x8000));
        want.extend(ne16(8));
        want.extend(ne16(1));
        want.extend([0xff, 0xff, 0xff, 0xfd]);
        want.extend(ne16(6));
        want.extend(ne16(2));
        want.extend([b'c', 0, 0, 0]);
        assert_eq!(el.buf, want);
    }

    #[test]
    fn a_cmp_carries_its_data_in_a_nested_value() {
        let mut el = Attrs::default();
        expression(
            &mut el,
            &Expr::Cmp {
                op: 1,
                data: vec![6],
            },
            &[],
        );
        let mut want = Vec::new();
        want.extend(ne16(8));
        want.extend(ne16(1));
        want.extend(b"cmp\0");
        want.extend(ne16(4 + 8 + 8 + 12));
        want.extend(ne16(2 | 0x8000));
        want.extend(ne16(8));
        want.extend(ne16(1));
        want.extend([0, 0, 0, 1]); // sreg 1
        want.extend(ne16(8));
        want.extend(ne16(2));
        want.extend([0, 0, 0, 1]); // NFT_CMP_NEQ
        want.extend(ne16(12));
        want.extend(ne16(3 | 0x8000));
        want.extend(ne16(5));
        want.extend(ne16(1));
        want.extend([6, 0, 0, 0]); // one byte, padded
        assert_eq!(el.buf, want);
    }

    #[test]
    fn an_attribute_over_64_kib_is_reported_not_truncated() {
        let mut b = Batch::new(1, 1);
        let sets = [AnonSet {
            key_type: 13,
            key_len: 2,
            elements: (0..20_000u16).map(|p| p.to_be_bytes().to_vec()).collect(),
        }];
        assert_eq!(b.oversized(), None);
        b.add_rule("t", "c", &[], &sets, "huge");
        assert_eq!(b.oversized(), Some("add set elements of rule huge"));
    }

    #[test]
    fn a_rule_with_a_set_sends_set_elements_then_rule_with_the_set_id() {
        let mut b = Batch::new(1, 1);
        let sets = [AnonSet {
            key_type: 13,
            key_len: 2,
            elements: vec![vec![0, 53]],
        }];
        b.add_rule(
            "t",
            "c",
            &[Expr::Lookup {
                set: 0,
                invert: true,
            }],
            &sets,
            "tcp dport != { 53 }",
        );
        let (_, changes) = b.finish();
        let what: Vec<&str> = changes.iter().map(|(_, w)| w.as_str()).collect();
        assert_eq!(
            what,
            [
                "add set of rule tcp dport != { 53 }",
                "add set elements of rule tcp dport != { 53 }",
                "add rule t c tcp dport != { 53 }",
            ]
        );
    }
}
