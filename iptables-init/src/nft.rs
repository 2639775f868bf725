//! Native nftables (`--native-nftables`, `NATIVE_NFTABLES=true`): Istio's capture in its own
//! `inet` tables (`istio-proxy-nat`, `-mangle`, `-raw`), applied as one atomic nf_tables
//! transaction sent over netlink from this process, so a pod is either fully configured or
//! untouched, and no `nft` binary is needed.
//!
//! - [`capture`]: the rules, in Istio's order, from a [`Config`];
//! - [`builder`]: the per-table rule lists and the insert/append conversion;
//! - [`program`]: the transaction script turned into one netlink batch;
//! - [`compile`]: one rule's text turned into kernel expressions, as `nft` 1.0.x does;
//! - [`expr`]: those expressions;
//! - [`encode`]: the nf_tables netlink messages, byte by byte;
//! - [`kernel`]: the socket that sends the batch and reads the kernel's verdict;
//! - [`apply`]: the run: apply, cleanup, and removing what the other backend left.
//!
//! [`script`] is the transaction text Istio's goldens pin (what `--dry-run` writes); a real
//! run sends the same changes to the kernel.
//!
//! Why our own encoder rather than a crate: Istio's backend runs `nft`, and its users hit
//! version skew crashes (istio#58492), builds without JSON (#60328) and images without the
//! binary (#57978); a wrapper of libnftnl/libmnl would bring the C userland back. The Rust
//! crates were weighed against what this needs (anonymous sets, `tproxy`, `redir`, `ct` set,
//! one batch with per-change errors): `rustables` (pure Rust since 0.8) is GPL-3.0, which this
//! workspace's license cannot take, and by its own README has rough edges and messages found
//! by trial and error; `nftables` drives the `nft` JSON API, so the binary again; `nftnl-rs`
//! covers set elements only; `neli` and `netlink-packet-*` are netlink framing without an
//! nf_tables expression layer, which is the part that takes work. Istio's rules use a dozen
//! expression kinds, so a small encoder next to the read-only dumps of [`crate::netlink`],
//! tested byte by byte against the uapi layout and end to end against `nft`'s own result for
//! all 28 goldens (listing and bytecode), costs less than adapting a crate and adds no
//! dependency.
//!
//! The `nft -f` path is gone: nothing was found that it did better (the kernel ends in the same
//! state, byte for byte), and the `--dry-run` script can still be fed to `nft -f` by hand.

pub mod apply;
pub mod builder;
pub mod capture;
pub mod compile;
pub mod encode;
pub mod expr;
pub mod kernel;
pub mod program;

pub use apply::run;
pub use builder::NftRuleBuilder;
pub use capture::build;

use crate::config::Config;

/// Address family of every Istio table.
pub const FAMILY: &str = "inet";
pub const NAT: &str = "istio-proxy-nat";
pub const MANGLE: &str = "istio-proxy-mangle";
pub const RAW: &str = "istio-proxy-raw";

/// The tables in transaction order, each with its chain declarations in Istio's fixed order:
/// (chain, declaration text after the chain name).
pub const TABLES: [(&str, &[(&str, &str)]); 3] = [
    (
        NAT,
        &[
            (
                capture::PREROUTING,
                " { type nat hook prerouting priority -100 ; }",
            ),
            (capture::OUTPUT, " { type nat hook output priority -100 ; }"),
            (capture::ISTIO_INBOUND, ""),
            (capture::ISTIO_REDIRECT, ""),
            (capture::ISTIO_IN_REDIRECT, ""),
            (capture::ISTIO_OUTPUT, ""),
            (capture::ISTIO_OUTPUT_DNS, ""),
        ],
    ),
    (
        MANGLE,
        &[
            (
                capture::PREROUTING,
                " { type filter hook prerouting priority -150 ; }",
            ),
            (
                capture::OUTPUT,
                " { type route hook output priority -150 ; }",
            ),
            (capture::ISTIO_DIVERT, ""),
            (capture::ISTIO_TPROXY, ""),
            (capture::ISTIO_INBOUND, ""),
            (capture::ISTIO_DROP, ""),
        ],
    ),
    (
        RAW,
        &[
            (
                capture::PREROUTING,
                " { type filter hook prerouting priority -300 ; }",
            ),
            (
                capture::OUTPUT,
                " { type filter hook output priority -300 ; }",
            ),
            (capture::ISTIO_INBOUND, ""),
            (capture::ISTIO_OUTPUT_DNS, ""),
        ],
    ),
];

/// The transaction that installs `rules`: per table with rules, `add table`, `flush table`,
/// the chains that get rules, then the rules in the order they were generated.
pub fn script(rules: &NftRuleBuilder) -> String {
    let mut out = String::new();
    for (table, chains) in TABLES {
        let ops = rules.ops(table);
        if ops.is_empty() {
            continue;
        }
        out.push_str(&format!("add table {FAMILY} {table}\n"));
        out.push_str(&format!("flush table {FAMILY} {table}\n"));
        for (chain, decl) in chains {
            if rules.has_rules(table, chain) {
                out.push_str(&format!("add chain {FAMILY} {table} {chain}{decl}\n"));
            }
        }
        builder::render_ops(FAMILY, table, &ops, &mut out);
    }
    out
}

/// The transaction that removes every Istio table (adding first makes the delete succeed
/// when a table is missing).
pub fn cleanup_script() -> String {
    TABLES
        .iter()
        .map(|(t, _)| format!("add table {FAMILY} {t}\ndelete table {FAMILY} {t}\n"))
        .collect()
}

/// Whether any of Istio's nftables tables exists in this namespace (read over netlink; no
/// nf_tables means none).
pub fn istio_tables_present() -> bool {
    crate::netlink::nft_tables().is_some_and(|tables| {
        tables.iter().any(|(family, name)| {
            *family == crate::netlink::NFPROTO_INET && TABLES.iter().any(|(t, _)| t == name)
        })
    })
}

/// What `--dry-run` writes for `cfg`: the cleanup transaction with `--cleanup-only`, else the
/// capture transaction.
pub fn dry_run_script(cfg: &Config, rules: &NftRuleBuilder) -> String {
    if cfg.cleanup_only {
        cleanup_script()
    } else {
        script(rules)
    }
}

/// Istio's tables and their chains as they are in the namespace before a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Existing {
    pub tables: Vec<String>,
    /// (table, chain)
    pub chains: Vec<(String, String)>,
}

impl Existing {
    /// Read over netlink; `None` when nf_tables cannot be read.
    pub fn read() -> Option<Existing> {
        let chains = crate::netlink::nft_chains()?;
        Some(Existing::from_dumps(crate::netlink::nft_tables()?, &chains))
    }

    /// Istio's part of the dumps of every table and chain (as [`crate::netlink`] lists them).
    pub fn from_dumps(tables: Vec<(u8, String)>, chains: &[(u8, String, String)]) -> Existing {
        let ours = |family: u8, table: &str| {
            family == crate::netlink::NFPROTO_INET && TABLES.iter().any(|(t, _)| *t == table)
        };
        Existing {
            tables: tables
                .into_iter()
                .filter(|(f, t)| ours(*f, t))
                .map(|(_, t)| t)
                .collect(),
            chains: chains
                .iter()
                .filter(|(f, t, _)| ours(*f, t))
                .map(|(_, t, c)| (t.clone(), c.clone()))
                .collect(),
        }
    }
}

/// What a real run sends to the kernel: [`script`], preceded, in the same transaction, by the
/// removal of each Istio table whose chains are not exactly the ones the new rules declare (in
/// their order): tables the new rules do not use, and tables an earlier run with other flags
/// shaped differently. A run over its own rules, or over none, sends exactly [`script`]; a
/// flag change ends in the same ruleset, in the same order, as a fresh pod. When the current
/// state is unknown every table is removed first. Either way the kernel switches from the old
/// ruleset to the new one at once.
pub fn apply_script(rules: &NftRuleBuilder, existing: Option<&Existing>) -> String {
    let mut out = String::new();
    for (table, chains) in TABLES {
        let reset = match existing {
            None => true,
            Some(e) if !e.tables.iter().any(|t| t == table) => false,
            Some(e) => {
                let now: Vec<&str> = e
                    .chains
                    .iter()
                    .filter(|(t, _)| t == table)
                    .map(|(_, c)| c.as_str())
                    .collect();
                let planned: Vec<&str> = chains
                    .iter()
                    .map(|(c, _)| *c)
                    .filter(|c| rules.has_rules(table, c))
                    .collect();
                planned.is_empty() || now != planned
            }
        };
        if reset {
            out.push_str(&format!(
                "add table {FAMILY} {table}\ndelete table {FAMILY} {table}\n"
            ));
        }
    }
    out.push_str(&script(rules));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn existing_keeps_only_istios_inet_tables() {
        use crate::netlink::{NFPROTO_INET, NFPROTO_IPV4};
        let e = Existing::from_dumps(
            vec![
                (NFPROTO_INET, NAT.into()),
                (NFPROTO_IPV4, MANGLE.into()),
                (NFPROTO_INET, "filter".into()),
            ],
            &[
                (NFPROTO_INET, NAT.into(), "output".into()),
                (NFPROTO_IPV4, NAT.into(), "ISTIO_OUTPUT".into()),
                (NFPROTO_INET, "filter".into(), "input".into()),
            ],
        );
        assert_eq!(e.tables, vec![NAT.to_string()]);
        assert_eq!(e.chains, vec![(NAT.to_string(), "output".to_string())]);
    }

    #[test]
    fn apply_script_resets_only_tables_shaped_otherwise() {
        let mut b = NftRuleBuilder::new(false);
        b.append(NAT, capture::OUTPUT, "counter jump istio-output");
        b.append(NAT, capture::ISTIO_OUTPUT, "counter return");
        let plain = script(&b);
        assert_eq!(apply_script(&b, Some(&Existing::default())), plain);
        let same = Existing {
            tables: vec![NAT.into()],
            chains: vec![
                (NAT.into(), "output".into()),
                (NAT.into(), "istio-output".into()),
            ],
        };
        assert_eq!(
            apply_script(&b, Some(&same)),
            plain,
            "own rules: the golden text"
        );
        let reset = |t: &str| format!("add table inet {t}\ndelete table inet {t}\n");
        let other = Existing {
            tables: vec![NAT.into(), MANGLE.into()],
            chains: vec![
                (NAT.into(), "output".into()),
                (NAT.into(), "istio-output".into()),
                (NAT.into(), "istio-output-dns".into()),
                (MANGLE.into(), "prerouting".into()),
            ],
        };
        assert_eq!(
            apply_script(&b, Some(&other)),
            format!("{}{}{plain}", reset(NAT), reset(MANGLE))
        );
        let reordered = Existing {
            tables: vec![NAT.into()],
            chains: vec![
                (NAT.into(), "istio-output".into()),
                (NAT.into(), "output".into()),
            ],
        };
        assert_eq!(
            apply_script(&b, Some(&reordered)),
            format!("{}{plain}", reset(NAT))
        );
        assert_eq!(
            apply_script(&b, None),
            format!("{}{plain}", cleanup_script())
        );
    }
}
