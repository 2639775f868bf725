//! The transaction script (what `--dry-run` prints and Istio feeds to `nft -f -`) turned into
//! one netlink batch, so the kernel receives exactly the script's changes with no `nft`
//! process: `add`/`flush`/`delete table`, `add chain`, and the rules compiled by
//! [`super::compile`].
//!
//! Rules are sent as appends in each chain's final order (an `insert ... index n` is placed
//! where nft would put it). That equals nft's result because a script only adds rules to a
//! table it flushed or recreated first, so every chain starts empty; a script that does not
//! is refused.

use super::compile::{self, Names};
use super::encode::{Batch, Hook};

/// Why a script could not be turned into a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("unsupported nftables command {0:?}")]
    Command(String),
    #[error("nftables rules for table {0} without flushing or recreating it first")]
    NotFlushed(String),
    #[error("{0}: too large for one netlink attribute (64 KiB)")]
    TooLarge(String),
    #[error(transparent)]
    Rule(#[from] compile::Error),
}

/// The rules waiting for their table's block to end: (chain, rules in final order), chains
/// in first-seen order.
#[derive(Default)]
struct Pending {
    table: String,
    chains: Vec<(String, Vec<String>)>,
}

impl Pending {
    fn chain(&mut self, chain: &str) -> &mut Vec<String> {
        let i = match self.chains.iter().position(|(c, _)| c == chain) {
            Some(i) => i,
            None => {
                self.chains.push((chain.to_string(), Vec::new()));
                self.chains.len() - 1
            }
        };
        &mut self.chains[i].1
    }

    fn emit(&mut self, batch: &mut Batch, names: &dyn Names) -> Result<(), Error> {
        for (chain, rules) in std::mem::take(&mut self.chains) {
            for text in rules {
                let c = compile::compile(&text, names)?;
                batch.add_rule(&self.table, &chain, &c.exprs, &c.sets, &text);
            }
        }
        Ok(())
    }
}

/// `{ type nat hook prerouting priority -100 ; }`
fn hook(decl: &[&str]) -> Option<Hook> {
    match decl {
        ["{", "type", kind, "hook", hook, "priority", prio, ";", "}"] => Some(Hook {
            kind: kind.to_string(),
            hooknum: match *hook {
                "prerouting" => 0,
                "input" => 1,
                "forward" => 2,
                "output" => 3,
                "postrouting" => 4,
                _ => return None,
            },
            priority: prio.parse().ok()?,
        }),
        _ => None,
    }
}

/// The batch for `script` (tables of the `inet` family), sequence numbers from `first_seq`.
pub fn batch(script: &str, names: &dyn Names, first_seq: u32) -> Result<Batch, Error> {
    let mut batch = Batch::new(crate::netlink::NFPROTO_INET, first_seq);
    let mut pending = Pending::default();
    // Tables flushed or recreated earlier in the script: their chains start empty.
    let mut fresh: Vec<String> = Vec::new();
    for line in script.lines().filter(|l| !l.trim().is_empty()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let bad = || Error::Command(line.to_string());
        let (verb, object, table) = match words.as_slice() {
            [verb, object, "inet", table, ..] => (*verb, *object, *table),
            _ => return Err(bad()),
        };
        if table != pending.table {
            pending.emit(&mut batch, names)?;
            pending.table = table.to_string();
        }
        match (verb, object, &words[4..]) {
            ("add", "table", []) => batch.add_table(table),
            ("flush", "table", []) => {
                batch.flush_table(table);
                fresh.push(table.to_string());
            }
            ("delete", "table", []) => {
                batch.delete_table(table);
                fresh.push(table.to_string());
            }
            ("add", "chain", [chain]) => batch.add_chain(table, chain, None),
            ("add", "chain", [chain, decl @ ..]) => {
                let h = hook(decl).ok_or_else(bad)?;
                batch.add_chain(table, chain, Some(&h));
            }
            ("add" | "insert", "rule", [chain, rest @ ..]) => {
                if !fresh.iter().any(|t| t == table) {
                    return Err(Error::NotFlushed(table.to_string()));
                }
                let (index, text) = match (verb, rest) {
                    ("insert", ["index", n, text @ ..]) => {
                        (Some(n.parse::<usize>().map_err(|_| bad())?), text)
                    }
                    ("add", text) => (None, text),
                    _ => return Err(bad()),
                };
                let rules = pending.chain(chain);
                let text = text.join(" ");
                match index {
                    Some(i) => rules.insert(i.min(rules.len()), text),
                    None => rules.push(text),
                }
            }
            _ => return Err(bad()),
        }
    }
    pending.emit(&mut batch, names)?;
    if let Some(what) = batch.oversized() {
        return Err(Error::TooLarge(what.to_string()));
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoNames;
    impl Names for NoNames {
        fn uid(&self, _: &str) -> Option<u32> {
            None
        }
        fn gid(&self, _: &str) -> Option<u32> {
            None
        }
    }

    fn changes(script: &str) -> Vec<String> {
        let (_, c) = batch(script, &NoNames, 1).expect("batch").finish();
        c.into_iter().map(|(_, w)| w).collect()
    }

    #[test]
    fn inserts_land_where_nft_puts_them_and_rules_follow_their_chains() {
        let script = "add table inet t\nflush table inet t\n\
            add chain inet t output { type nat hook output priority -100 ; }\n\
            add chain inet t c\n\
            add rule inet t c counter return\n\
            add rule inet t output counter jump c\n\
            insert rule inet t c index 0 counter accept\n\
            add rule inet t c counter drop\n";
        assert_eq!(
            changes(script),
            [
                "add table t",
                "flush table t",
                "add chain t output",
                "add chain t c",
                "add rule t c counter accept",
                "add rule t c counter return",
                "add rule t c counter drop",
                "add rule t output counter jump c",
            ]
        );
    }

    #[test]
    fn cleanup_and_resets_are_table_commands() {
        assert_eq!(
            changes(&crate::nft::cleanup_script()),
            [
                "add table istio-proxy-nat",
                "delete table istio-proxy-nat",
                "add table istio-proxy-mangle",
                "delete table istio-proxy-mangle",
                "add table istio-proxy-raw",
                "delete table istio-proxy-raw",
            ]
        );
    }

    #[test]
    fn what_nft_would_read_otherwise_is_refused() {
        for (script, needle) in [
            ("add table ip t\n", "add table ip t"),
            ("add rule inet t c counter\n", "without flushing"),
            ("flush table inet t\nadd rule inet t c log\n", "\"log\""),
            (
                "add chain inet t c { type nat hook nowhere priority 0 ; }\n",
                "nowhere",
            ),
            (
                "flush table inet t\ninsert rule inet t c index x counter\n",
                "index x",
            ),
            ("list ruleset\n", "list ruleset"),
        ] {
            let e = batch(script, &NoNames, 1).unwrap_err().to_string();
            assert!(e.contains(needle), "{script}: {e}");
        }
    }
}
