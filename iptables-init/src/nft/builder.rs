//! The nftables rule builder: one rule list per table (IPv4 and IPv6 rules share it, in call
//! order), each rule an append or a request for a 0-based position in its chain.
//!
//! Turning the list into transaction operations follows Istio's conversion (pinned by its
//! builder goldens): a positioned rule stays an `insert ... index n` only while its chain
//! already holds more than `n` rules earlier in the transaction; otherwise it is appended,
//! because nft rejects an index that does not exist yet.

use std::collections::HashMap;

/// One rule: table, chain, optional requested position, and the rule text (match and statement
/// words joined by single spaces).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    pub table: String,
    pub chain: String,
    pub position: Option<usize>,
    pub text: String,
}

/// How a rule goes into the transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    /// `add rule <family> <table> <chain> <text>`
    Add { chain: &'a str, text: &'a str },
    /// `insert rule <family> <table> <chain> index <n> <text>`
    Insert {
        chain: &'a str,
        index: usize,
        text: &'a str,
    },
}

/// Collects rules per table. IPv6-only rules are dropped when IPv6 is disabled.
#[derive(Debug, Clone, Default)]
pub struct NftRuleBuilder {
    ipv6: bool,
    rules: Vec<NftRule>,
}

impl NftRuleBuilder {
    /// A builder; `ipv6` makes the `*_v6` helpers add their rules.
    pub fn new(ipv6: bool) -> Self {
        Self {
            ipv6,
            rules: Vec::new(),
        }
    }

    fn push(&mut self, table: &str, chain: &str, position: Option<usize>, text: String) {
        self.rules.push(NftRule {
            table: table.to_string(),
            chain: chain.to_string(),
            position,
            text,
        });
    }

    /// Appends `text` to `chain` of `table`.
    pub fn append(&mut self, table: &str, chain: &str, text: impl Into<String>) -> &mut Self {
        self.push(table, chain, None, text.into());
        self
    }

    /// Appends `text` when IPv6 is enabled.
    pub fn append_v6(&mut self, table: &str, chain: &str, text: impl Into<String>) -> &mut Self {
        if self.ipv6 {
            self.push(table, chain, None, text.into());
        }
        self
    }

    /// Asks for `text` at 0-based `position` of `chain`.
    pub fn insert(
        &mut self,
        table: &str,
        chain: &str,
        position: usize,
        text: impl Into<String>,
    ) -> &mut Self {
        self.push(table, chain, Some(position), text.into());
        self
    }

    /// [`NftRuleBuilder::insert`] when IPv6 is enabled.
    pub fn insert_v6(
        &mut self,
        table: &str,
        chain: &str,
        position: usize,
        text: impl Into<String>,
    ) -> &mut Self {
        if self.ipv6 {
            self.push(table, chain, Some(position), text.into());
        }
        self
    }

    /// The rules of `table`, in the order they were added.
    pub fn table_rules<'a>(&'a self, table: &'a str) -> impl Iterator<Item = &'a NftRule> + 'a {
        self.rules.iter().filter(move |r| r.table == table)
    }

    /// Whether `chain` of `table` has at least one rule.
    pub fn has_rules(&self, table: &str, chain: &str) -> bool {
        self.table_rules(table).any(|r| r.chain == chain)
    }

    /// The transaction operations for `table`'s rules, in order.
    pub fn ops<'a>(&'a self, table: &'a str) -> Vec<Op<'a>> {
        let mut count: HashMap<&str, usize> = HashMap::new();
        let mut out = Vec::new();
        for r in self.table_rules(table) {
            let n = count.entry(r.chain.as_str()).or_default();
            out.push(match r.position {
                Some(index) if *n > index => Op::Insert {
                    chain: &r.chain,
                    index,
                    text: &r.text,
                },
                _ => Op::Add {
                    chain: &r.chain,
                    text: &r.text,
                },
            });
            *n += 1;
        }
        out
    }
}

/// Renders `ops` as transaction lines for `family table`.
pub fn render_ops(family: &str, table: &str, ops: &[Op<'_>], out: &mut String) {
    for op in ops {
        match op {
            Op::Add { chain, text } => {
                out.push_str(&format!("add rule {family} {table} {chain} {text}\n"))
            }
            Op::Insert { chain, index, text } => out.push_str(&format!(
                "insert rule {family} {table} {chain} index {index} {text}\n"
            )),
        }
    }
}

/// The chains' final rule order once `ops` are applied to empty chains (what `nft list` would
/// show): an insert goes before the rule at its index.
#[cfg(test)]
fn final_order<'a>(ops: &[Op<'a>]) -> HashMap<&'a str, Vec<&'a str>> {
    let mut chains: HashMap<&str, Vec<&str>> = HashMap::new();
    for op in ops {
        match *op {
            Op::Add { chain, text } => chains.entry(chain).or_default().push(text),
            Op::Insert { chain, index, text } => {
                let c = chains.entry(chain).or_default();
                let at = index.min(c.len());
                c.insert(at, text);
            }
        }
    }
    chains
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const TABLE: &str = "inet-table";
    const CHAIN: &str = "test-chain";

    mod conformance {
        include!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/src/conformance.rs"
        ));
    }

    fn corpus() -> Option<PathBuf> {
        conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-nftables/builder")
    }

    /// Istio's builder test: the table, the chain, then the dump of the chain after the
    /// transaction was applied.
    fn dump(b: &NftRuleBuilder) -> String {
        let ops = b.ops(TABLE);
        let order = final_order(&ops);
        let mut out = format!("add table inet {TABLE}\nadd chain inet {TABLE} {CHAIN}\n");
        for text in order.get(CHAIN).into_iter().flatten() {
            out.push_str(&format!("add rule inet {TABLE} {CHAIN} {text}\n"));
        }
        out
    }

    enum Step {
        Append(&'static str),
        AppendV6(&'static str),
        Insert(usize, &'static str),
        InsertV6(usize, &'static str),
    }

    fn build(steps: &[Step]) -> NftRuleBuilder {
        let mut b = NftRuleBuilder::new(true);
        for s in steps {
            match *s {
                Step::Append(t) => b.append(TABLE, CHAIN, t),
                Step::AppendV6(t) => b.append_v6(TABLE, CHAIN, t),
                Step::Insert(p, t) => b.insert(TABLE, CHAIN, p, t),
                Step::InsertV6(p, t) => b.insert_v6(TABLE, CHAIN, p, t),
            };
        }
        b
    }

    #[test]
    fn builder_goldens() {
        use Step::*;
        let Some(dir) = corpus() else { return };
        const RET: &str = "tcp dport 15008 return";
        const JUMP: &str = "meta l4proto tcp jump test-chain";
        const REDIR: &str = "meta l4proto tcp redirect to :15001";
        const V4: &str = "ip daddr 127.0.0.1 return";
        const V6: &str = "ip6 daddr ::ffff:7f00:1 return";
        let cases: Vec<(&str, Vec<Step>)> = vec![
            ("add-table-chain", vec![]),
            ("append-single-v4", vec![Append(V4)]),
            ("append-single-v6", vec![AppendV6(V6)]),
            (
                "append-multi",
                vec![Append(RET), Append(JUMP), Append(REDIR)],
            ),
            ("insert-single-v4", vec![Append(RET), Insert(0, V4)]),
            ("insert-single-v6", vec![Append(RET), InsertV6(0, V6)]),
            (
                "insert-multi",
                vec![Append(RET), Insert(0, JUMP), Insert(1, REDIR)],
            ),
            (
                "append-insert-multi",
                vec![Append(RET), Insert(0, JUMP), Append(REDIR)],
            ),
            (
                "multi-rules-v4-v6",
                vec![Append(V4), Insert(0, RET), AppendV6(V6)],
            ),
        ];
        let goldens = std::fs::read_dir(&dir)
            .expect("read builder goldens")
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "golden"))
            .count();
        assert_eq!(goldens, cases.len(), "every builder golden has a case");
        let mut failures = Vec::new();
        for (name, steps) in &cases {
            let path = dir.join(format!("{name}.golden"));
            let expected = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            let got = dump(&build(steps));
            if got.trim() != expected.trim() {
                failures.push(format!("{name}:\nexpected:\n{expected}\ngot:\n{got}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn position_into_a_short_chain_becomes_an_append() {
        let mut b = NftRuleBuilder::new(false);
        b.insert("t", "c", 0, "a");
        b.insert("t", "c", 1, "b");
        b.insert("t", "c", 1, "c");
        b.append_v6("t", "c", "dropped");
        b.insert_v6("t", "c", 0, "dropped too");
        assert_eq!(
            b.ops("t"),
            vec![
                Op::Add {
                    chain: "c",
                    text: "a"
                },
                Op::Add {
                    chain: "c",
                    text: "b"
                },
                Op::Insert {
                    chain: "c",
                    index: 1,
                    text: "c"
                },
            ]
        );
        let mut s = String::new();
        render_ops("inet", "t", &b.ops("t"), &mut s);
        assert_eq!(
            s,
            "add rule inet t c a\nadd rule inet t c b\ninsert rule inet t c index 1 c\n"
        );
        assert_eq!(final_order(&b.ops("t"))["c"], ["a", "c", "b"]);
    }

    #[test]
    fn positions_count_per_chain_and_table() {
        let mut b = NftRuleBuilder::new(true);
        b.append("t", "x", "1");
        b.append("u", "c", "other table");
        b.insert("t", "c", 0, "first in c");
        b.insert("t", "c", 0, "second in c");
        let ops = b.ops("t");
        assert_eq!(
            ops[1],
            Op::Add {
                chain: "c",
                text: "first in c"
            }
        );
        assert_eq!(
            ops[2],
            Op::Insert {
                chain: "c",
                index: 0,
                text: "second in c"
            }
        );
        assert!(b.has_rules("u", "c") && !b.has_rules("u", "x"));
    }
}
