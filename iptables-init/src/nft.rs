//! Native nftables (`--native-nftables`, `NATIVE_NFTABLES=true`): Istio's capture in its own
//! `inet` tables (`istio-proxy-nat`, `-mangle`, `-raw`), applied as one atomic `nft -f -`
//! transaction, so a pod is either fully configured or untouched.
//!
//! - [`capture`]: the rules, in Istio's order, from a [`Config`];
//! - [`builder`]: the per-table rule lists and the insert/append conversion;
//! - [`apply`]: running `nft`, cleanup, and removing what the other backend left.
//!
//! [`script`] is the transaction text Istio's goldens pin (what `--dry-run` writes).

pub mod apply;
pub mod builder;
pub mod capture;

pub use apply::{Error, run};
pub use builder::{NftRule, NftRuleBuilder, Op};
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

/// What a real run feeds to `nft -f -`: the Istio tables removed, then rebuilt, in the same
/// transaction. Removing first drops chains and tables the new flags no longer use (a flag
/// change converges exactly); the kernel switches from the old ruleset to the new one at
/// once, so no packet sees a pod without its rules.
pub fn apply_script(rules: &NftRuleBuilder) -> String {
    let mut out = cleanup_script();
    out.push_str(&script(rules));
    out
}
