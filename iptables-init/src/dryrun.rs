//! `--dry-run`: the command stream Istio's implementation records instead of running, in the
//! format of the conformance corpus (one entry per line; restore input recorded line by line).

use crate::builder::RuleBuilder;
use crate::config::Config;

/// The stream for `cfg` and its rule set, as on a fresh host (every state dump empty).
pub fn stream(cfg: &Config, rules: &RuleBuilder) -> String {
    let mut out: Vec<String> = vec!["iptables-save".into(), "ip6tables-save".into()];
    if cfg.cleanup_only {
        for cmd in rules.build_cleanup_v4() {
            out.push(format!("iptables {}", cmd.join(" ")));
        }
        if cfg.enable_ipv6 {
            for cmd in rules.build_cleanup_v6() {
                out.push(format!("ip6tables {}", cmd.join(" ")));
            }
        }
    } else {
        out.extend(rules.build_v4_restore().lines().map(String::from));
        if cfg.enable_ipv6 {
            out.extend(rules.build_v6_restore().lines().map(String::from));
        }
    }
    out.push("iptables-save".into());
    if cfg.enable_ipv6 {
        out.push("ip6tables-save".into());
    }
    out.into_iter().map(|l| l + "\n").collect()
}
