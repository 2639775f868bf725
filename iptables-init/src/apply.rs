//! Real apply: backend choice (legacy vs nft), one `iptables-restore --noflush` per family,
//! idempotence (a second run with the same flags changes nothing), reconcile on drift (one
//! restore transaction per family that replaces our rules), `--cleanup-only`, and the TPROXY
//! policy routes.
//!
//! Inspection parses one `iptables-save` snapshot per family (no per-rule process spawns);
//! "is every planned rule present" is one `-C` batch through `iptables-restore`.

mod backend;
mod state;

use std::collections::HashSet;

pub use backend::{Backend, Family};
pub use state::{State, TableState, parse_save};

use crate::builder::{Rule, RuleBuilder, declared_chains, is_built_in};
use crate::config::{Config, InboundPorts, InterceptionMode};

/// Why applying or removing the rules failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to run {cmd}: {error} (is it installed and in PATH?)")]
    Spawn { cmd: String, error: String },
    #[error("{cmd} failed ({status}): {stderr}")]
    Command {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("no working {family} iptables binary found: {detail}")]
    NoBackend { family: Family, detail: String },
    #[error(
        "{family} iptables state differs from the expected Istio rules ({reason}); nothing was changed. Rerun with --reconcile to replace them, or --cleanup-only to remove them"
    )]
    Drift { family: Family, reason: String },
}

/// Process environment handed to the iptables binaries (PATH lookup, lock file).
#[derive(Debug, Clone, Default)]
pub struct ExecEnv {
    /// `PATH` used to find the binaries (the caller's environment map has it); `None`: the
    /// usual system directories ([`DEFAULT_PATH`]). The library never reads the process's.
    pub path: Option<String>,
    /// `XTABLES_LOCKFILE` for legacy iptables (pod-scoped lock in CNI mode).
    pub xtables_lockfile: Option<String>,
}

/// Where the binaries are looked for when the caller's environment has no `PATH`.
pub const DEFAULT_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// What a family's run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    UpToDate,
    Reconciled,
    CleanedUp,
    Nothing,
}

/// Applies (or with `--cleanup-only` removes) the rule set in `rules` for `cfg`.
pub fn run(
    cfg: &Config,
    rules: &RuleBuilder,
    env: &ExecEnv,
) -> Result<Vec<(Family, Outcome)>, Error> {
    let mut families = vec![Family::V4];
    if cfg.enable_ipv6 {
        families.push(Family::V6);
    }
    // Built-in-chain rules of the same flags in the other interception mode (TPROXY's mangle
    // marks): a reconcile or cleanup after a mode change removes them too.
    let other_mode = other_mode_rules(cfg);
    // Without IPv6 detected the rule set has no IPv6 part; what an earlier run may have left
    // there is the same flags' IPv6 rules, in either mode.
    let v6_leftovers = (!cfg.enable_ipv6).then(|| {
        let mut v6 = cfg.clone();
        v6.enable_ipv6 = true;
        [crate::capture::build(&v6), other_mode_rules(&v6)]
    });
    let v6_candidates = || -> [&[Rule]; 2] {
        match &v6_leftovers {
            Some([a, b]) => [a.rules_v6(), b.rules_v6()],
            None => [rules.rules_v6(), other_mode.rules_v6()],
        }
    };
    if cfg.cleanup_only {
        let out = remove_istio_rules(cfg, rules, env)?;
        cleanup_routes(cfg);
        return Ok(out);
    }

    let mut backends = Vec::new();
    for &family in &families {
        backends.push(Backend::detect(family, cfg.force_iptables_binary, env)?);
    }
    let plans: Vec<&[Rule]> = families.iter().map(|&f| family_rules(rules, f)).collect();

    // Fast path: a fresh namespace takes the rule set in one restore per family. The restore
    // input opens with the nat block, which declares chains that exist whenever an earlier run
    // left rules behind; then the restore fails before committing anything and the family goes
    // the careful way (snapshot, compare, reconcile).
    let first = restore_all(&backends, &plans);

    let mut out = Vec::new();
    for ((backend, plan), result) in backends.iter().zip(&plans).zip(first) {
        let outcome = match result {
            Ok(()) => Outcome::Applied,
            Err(e) if cfg.force_apply => return Err(e),
            Err(e) => {
                tracing::info!(family = %backend.family, error = %e, "rules not applied on first attempt; inspecting current state");
                let others = family_rules(&other_mode, backend.family);
                careful_family(backend, plan, others, cfg.reconcile).map_err(|err| match err {
                    Error::Drift { family, reason } => Error::Drift {
                        family,
                        reason: format!("{reason}; the first apply attempt reported: {e}"),
                    },
                    other => other,
                })?
            }
        };
        tracing::info!(family = %backend.family, binary = %backend.bin(""), ?outcome, "iptables done");
        out.push((backend.family, outcome));
    }
    if cfg.reconcile && !cfg.enable_ipv6 {
        // The replaced rule set has no IPv6 part: remove one an earlier run left.
        if let Some(outcome) = reconcile_v6(cfg, env, &v6_candidates())? {
            out.push((Family::V6, outcome));
        }
    }
    configure_routes(cfg)?;
    Ok(out)
}

/// Removes the IPv6 rules of an earlier run (any of `candidates`) when ip6tables is usable;
/// `Some` when there were any.
fn reconcile_v6(
    cfg: &Config,
    env: &ExecEnv,
    candidates: &[&[Rule]; 2],
) -> Result<Option<Outcome>, Error> {
    match Backend::detect(Family::V6, cfg.force_iptables_binary, env) {
        Ok(b) => {
            let outcome = cleanup_family(&b, candidates)?;
            if outcome == Outcome::CleanedUp {
                tracing::info!(family = %Family::V6, "reconcile removed IPv6 rules of an earlier run");
                return Ok(Some(outcome));
            }
            Ok(None)
        }
        Err(e) => {
            tracing::debug!(error = %e, "no usable ip6tables; nothing to reconcile for IPv6");
            Ok(None)
        }
    }
}

/// Restores each family's rule set in one go, the families in parallel; the result of each.
fn restore_all(backends: &[Backend], plans: &[&[Rule]]) -> Vec<Result<(), Error>> {
    if backends.len() == 1 {
        vec![backends[0].restore(&restore_text(plans[0]), false)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = backends
                .iter()
                .zip(plans)
                .map(|(b, plan)| s.spawn(move || b.restore(&restore_text(plan), false)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Spawn {
                            cmd: "iptables-restore".into(),
                            error: "thread panicked".into(),
                        })
                    })
                })
                .collect()
        })
    }
}

/// Removes every Istio iptables rule and chain in both families (the rules of `cfg` in either
/// interception mode, and the `ISTIO_*` chains of any flags); policy routes are left alone.
pub fn remove_istio_rules(
    cfg: &Config,
    rules: &RuleBuilder,
    env: &ExecEnv,
) -> Result<Vec<(Family, Outcome)>, Error> {
    let other_mode = other_mode_rules(cfg);
    let v6_leftovers = (!cfg.enable_ipv6).then(|| {
        let mut v6 = cfg.clone();
        v6.enable_ipv6 = true;
        [crate::capture::build(&v6), other_mode_rules(&v6)]
    });
    let mut out = Vec::new();
    for family in [Family::V4, Family::V6] {
        match Backend::detect(family, cfg.force_iptables_binary, env) {
            Ok(b) => {
                let candidates = match (family, &v6_leftovers) {
                    (Family::V4, _) => [rules.rules_v4(), other_mode.rules_v4()],
                    (Family::V6, Some([a, b])) => [a.rules_v6(), b.rules_v6()],
                    (Family::V6, None) => [rules.rules_v6(), other_mode.rules_v6()],
                };
                out.push((family, cleanup_family(&b, &candidates)?))
            }
            Err(e) if family == Family::V6 && !cfg.enable_ipv6 => {
                tracing::info!(error = %e, "no usable ip6tables; skipping IPv6 cleanup")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The rule set of `cfg` in the other inbound interception mode.
fn other_mode_rules(cfg: &Config) -> RuleBuilder {
    let mut other = cfg.clone();
    other.inbound_interception_mode = match cfg.inbound_interception_mode {
        InterceptionMode::Redirect => InterceptionMode::Tproxy,
        InterceptionMode::Tproxy => InterceptionMode::Redirect,
    };
    crate::capture::build(&other)
}

fn family_rules(rules: &RuleBuilder, family: Family) -> &[Rule] {
    match family {
        Family::V4 => rules.rules_v4(),
        Family::V6 => rules.rules_v6(),
    }
}

/// Restore input for `rules` with the nat block first, then the other tables sorted.
pub fn restore_text(rules: &[Rule]) -> String {
    let text = RuleBuilder::restore_of(rules);
    let mut blocks: Vec<(String, String)> = Vec::new();
    for block in text.split_inclusive("COMMIT\n") {
        let table = block
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("* "))
            .unwrap_or("")
            .to_string();
        blocks.push((table, block.to_string()));
    }
    blocks.sort_by_key(|(t, _)| (t != "nat", t.clone()));
    blocks.into_iter().map(|(_, b)| b).collect()
}

/// Snapshot, compare, then apply / keep / reconcile one family. `others` are rules an earlier
/// run with other flags may have left in built-in chains; reconcile removes those present.
fn careful_family(
    backend: &Backend,
    plan: &[Rule],
    others: &[Rule],
    reconcile: bool,
) -> Result<Outcome, Error> {
    let state = parse_save(&backend.save()?);
    if !state.has_istio() {
        backend.restore(&restore_text(plan), false)?;
        return Ok(Outcome::Applied);
    }
    match differences(backend, &state, plan)? {
        None => {
            tracing::info!(family = %backend.family, "found compatible Istio rules in place; nothing to do");
            Ok(Outcome::UpToDate)
        }
        Some(reason) if !reconcile => Err(Error::Drift {
            family: backend.family,
            reason,
        }),
        Some(reason) => {
            tracing::info!(family = %backend.family, %reason, "reconciling drifted Istio rules");
            let deletes = existing_builtin_rules(backend, &[plan, others]);
            let script = replace_script(&state, plan, &deletes);
            backend.restore(&script, false)?;
            Ok(Outcome::Reconciled)
        }
    }
}

/// Removes every `ISTIO_*` chain, the jumps to them, and those of `candidates`' built-in-chain
/// rules that are present.
fn cleanup_family(backend: &Backend, candidates: &[&[Rule]]) -> Result<Outcome, Error> {
    let state = match backend.save() {
        Ok(s) => parse_save(&s),
        Err(e) if backend.family == Family::V6 => {
            tracing::info!(error = %e, "ip6tables-save failed; skipping IPv6 cleanup");
            return Ok(Outcome::Nothing);
        }
        Err(e) => return Err(e),
    };
    let deletes = if state.is_empty() {
        Vec::new()
    } else {
        existing_builtin_rules(backend, candidates)
    };
    let script = replace_script(&state, &[], &deletes);
    if script.is_empty() {
        return Ok(Outcome::Nothing);
    }
    backend.restore(&script, false)?;
    Ok(Outcome::CleanedUp)
}

/// Istio's equivalence: every planned chain exists, every `ISTIO_*` chain holds as many rules
/// as planned, no unplanned `ISTIO_*` chain exists, and every planned rule is present (`-C`).
/// Returns why the state differs, or `None` when it matches.
pub fn differences(
    backend: &Backend,
    state: &State,
    plan: &[Rule],
) -> Result<Option<String>, Error> {
    if let Some(reason) = structural_differences(state, plan) {
        return Ok(Some(reason));
    }
    let check = check_script(plan);
    if check.is_empty() {
        return Ok(None);
    }
    match backend.restore(&check, true) {
        Ok(()) => Ok(None),
        Err(Error::Command { stderr, .. }) => Ok(Some(format!(
            "a planned rule is missing: {}",
            stderr.trim()
        ))),
        Err(e) => Err(e),
    }
}

/// The parts of the comparison that need no iptables call.
pub fn structural_differences(state: &State, plan: &[Rule]) -> Option<String> {
    let declared = declared_chains(plan);
    for (table, chain) in &declared {
        if !state.has_chain(table, chain) {
            return Some(format!("chain {chain} missing from table {table}"));
        }
    }
    let planned: HashSet<(&str, &str)> = declared
        .iter()
        .map(|(t, c)| (t.as_str(), c.as_str()))
        .collect();
    for (table, ts) in &state.tables {
        for chain in ts.chains.iter().filter(|c| c.starts_with("ISTIO_")) {
            if !planned.contains(&(table.as_str(), chain.as_str())) {
                return Some(format!("unexpected chain {chain} in table {table}"));
            }
            let want = plan
                .iter()
                .filter(|r| &r.table == table && &r.chain == chain)
                .count();
            let have = ts.rules.iter().filter(|(c, _)| c == chain).count();
            if want != have {
                return Some(format!(
                    "chain {chain} in table {table} holds {have} rules, expected {want}"
                ));
            }
        }
    }
    None
}

/// `-C` lines for every planned rule, grouped by table.
pub fn check_script(plan: &[Rule]) -> String {
    let mut tables: Vec<&str> = plan.iter().map(|r| r.table.as_str()).collect();
    tables.sort();
    tables.dedup();
    let mut out = String::new();
    for t in tables {
        out.push_str(&format!("*{t}\n"));
        for r in plan.iter().filter(|r| r.table == t) {
            out.push_str(&r.check_params().join(" "));
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Rules of `candidates` in built-in chains that are not jumps to our chains (interface
/// RETURNs, TPROXY marks): the ones present now, each once, found with one `-C` each.
fn existing_builtin_rules(backend: &Backend, candidates: &[&[Rule]]) -> Vec<Rule> {
    let mut seen = HashSet::new();
    candidates
        .iter()
        .flat_map(|rules| rules.iter())
        .filter(|r| is_built_in(&r.chain) && !r.jumps_to_istio())
        .filter(|r| seen.insert((r.table.clone(), r.delete_params())))
        .filter(|r| backend.check(r))
        .cloned()
        .collect()
}

/// One restore transaction per table that removes our rules and chains (jumps to `ISTIO_*`
/// chains from other chains, the given built-in rules, every `ISTIO_*` chain) and adds `plan`.
/// Chains kept by the plan are flushed, not deleted, so their jumps stay valid.
pub fn replace_script(state: &State, plan: &[Rule], deletes: &[Rule]) -> String {
    let declared = declared_chains(plan);
    let mut tables: Vec<String> = state
        .tables
        .iter()
        .filter(|(_, ts)| ts.has_istio())
        .map(|(t, _)| t.clone())
        .chain(plan.iter().map(|r| r.table.clone()))
        .chain(deletes.iter().map(|r| r.table.clone()))
        .collect();
    tables.sort_by_key(|t| (t != "nat", t.clone()));
    tables.dedup();

    let mut out = String::new();
    for table in tables {
        let mut lines: Vec<String> = Vec::new();
        let empty = TableState::default();
        let ts = state.tables.get(&table).unwrap_or(&empty);
        for (chain, line) in &ts.rules {
            if !chain.starts_with("ISTIO_")
                && state::line_jumps_to_istio(line)
                && let Some(rest) = line.strip_prefix("-A ")
            {
                lines.push(format!("-D {rest}"));
            }
        }
        for r in deletes.iter().filter(|r| r.table == table) {
            lines.push(r.delete_params().join(" "));
        }
        let istio_chains: Vec<&String> = ts
            .chains
            .iter()
            .filter(|c| c.starts_with("ISTIO_"))
            .collect();
        for c in &istio_chains {
            lines.push(format!("-F {c}"));
        }
        for c in &istio_chains {
            if !declared.iter().any(|(t, d)| *t == table && d == *c) {
                lines.push(format!("-X {c}"));
            }
        }
        for (t, c) in &declared {
            if *t == table && !ts.chains.iter().any(|x| x == c) {
                lines.push(format!("-N {c}"));
            }
        }
        for r in plan.iter().filter(|r| r.table == table) {
            lines.push(r.params.join(" "));
        }
        if !lines.is_empty() {
            out.push_str(&format!("*{table}\n"));
            for l in lines {
                out.push_str(&l);
                out.push('\n');
            }
            out.push_str("COMMIT\n");
        }
    }
    out
}

pub(crate) fn tproxy_routes_wanted(cfg: &Config) -> bool {
    cfg.inbound_ports_include != InboundPorts::Off
        && cfg.inbound_interception_mode == InterceptionMode::Tproxy
}

/// Istio's route setup: `::6/128` on lo when IPv6 is on; in TPROXY mode a policy rule
/// `fwmark <mark> lookup <table>` and `local default dev lo` in that table, per family.
pub(crate) fn configure_routes(cfg: &Config) -> Result<(), Error> {
    if cfg.enable_ipv6 {
        // Over netlink, as `ip` would send it; `ip` itself when that fails.
        if let Err(errno) =
            crate::netlink::replace_loopback_v6(std::net::Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6))
        {
            tracing::debug!(
                errno,
                "adding ::6/128 to lo over netlink failed; running ip"
            );
            backend::ip(&["-6", "addr", "replace", "::6/128", "dev", "lo"])?;
        }
    }
    if !tproxy_routes_wanted(cfg) {
        if cfg.reconcile {
            // A TPROXY run before this one left its policy routing; the new rules do not mark.
            cleanup_routes(cfg);
        }
        return Ok(());
    }
    let mark = cfg.inbound_tproxy_mark.to_string();
    let table = cfg.inbound_tproxy_route_table.to_string();
    let mut families = vec![("-4", "0.0.0.0/0")];
    if cfg.enable_ipv6 {
        families.push(("-6", "::/0"));
    }
    for (fam, default) in families {
        if count_rules(fam, cfg) == 0 {
            backend::ip(&[fam, "rule", "add", "fwmark", &mark, "lookup", &table])?;
        }
        backend::ip(&[
            fam, "route", "replace", "local", default, "dev", "lo", "table", &table,
        ])?;
    }
    Ok(())
}

/// Whether a TPROXY policy rule of `cfg`'s mark and table exists in either family.
pub(crate) fn tproxy_rule_present(cfg: &Config) -> bool {
    count_rules("-4", cfg) > 0 || count_rules("-6", cfg) > 0
}

fn count_rules(fam: &str, cfg: &Config) -> usize {
    let needle = format!(
        "fwmark {:#x} lookup {}",
        cfg.inbound_tproxy_mark, cfg.inbound_tproxy_route_table
    );
    backend::ip(&[fam, "rule", "show"])
        .map(|out| out.lines().filter(|l| l.contains(&needle)).count())
        .unwrap_or(0)
}

/// Removes the TPROXY policy rules and routes (both families), best effort.
pub(crate) fn cleanup_routes(cfg: &Config) {
    let mark = cfg.inbound_tproxy_mark.to_string();
    let table = cfg.inbound_tproxy_route_table.to_string();
    for fam in ["-4", "-6"] {
        for _ in 0..count_rules(fam, cfg) {
            if let Err(e) = backend::ip(&[fam, "rule", "del", "fwmark", &mark, "lookup", &table]) {
                tracing::warn!(error = %e, "removing TPROXY policy rule");
                break;
            }
        }
        let routes = backend::ip(&[fam, "route", "show", "table", &table]).unwrap_or_default();
        if !routes.trim().is_empty()
            && let Err(e) = backend::ip(&[fam, "route", "flush", "table", &table])
        {
            tracing::warn!(error = %e, "flushing TPROXY route table");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Vec<Rule> {
        let mut b = RuleBuilder::new(false);
        b.append("PREROUTING", "nat", &["-i", "eth9", "-j", "RETURN"]);
        b.append(
            "ISTIO_REDIRECT",
            "nat",
            &["-p", "tcp", "-j", "REDIRECT", "--to-ports", "15001"],
        );
        b.append("OUTPUT", "nat", &["-j", "ISTIO_OUTPUT"]);
        b.append("ISTIO_OUTPUT", "nat", &["-j", "ISTIO_REDIRECT"]);
        b.rules_v4().to_vec()
    }

    const SAVE: &str = "# Generated by iptables-nft-save v1.8.9 (nf_tables)\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n:ISTIO_OLD - [0:0]\n:FOREIGN - [0:0]\n-A OUTPUT -j ISTIO_OUTPUT\n-A OUTPUT -d 10.0.0.0/8 -j RETURN\n-A FOREIGN -j ISTIO_OLD\n-A ISTIO_OUTPUT -j ISTIO_OLD\n-A ISTIO_OLD -j RETURN\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n";

    #[test]
    fn nat_block_goes_first() {
        let mut b = RuleBuilder::new(false);
        b.append("ISTIO_DROP", "mangle", &["-j", "DROP"]);
        b.append("ISTIO_X", "nat", &["-j", "RETURN"]);
        b.append("ISTIO_Y", "raw", &["-j", "RETURN"]);
        let t = restore_text(b.rules_v4());
        assert!(t.starts_with("* nat\n-N ISTIO_X\n"), "{t}");
        assert!(t.find("* mangle").unwrap() < t.find("* raw").unwrap());
    }

    #[test]
    fn structural_diff_finds_drift() {
        let state = parse_save(SAVE);
        assert!(state.has_istio());
        let r = structural_differences(&state, &plan()).unwrap();
        assert!(r.contains("ISTIO_REDIRECT"), "{r}");
    }

    #[test]
    fn replace_script_removes_ours_keeps_foreign() {
        let state = parse_save(SAVE);
        let plan = plan();
        let deletes = vec![plan[0].clone()];
        let s = replace_script(&state, &plan, &deletes);
        assert_eq!(
            s,
            "*nat\n-D OUTPUT -j ISTIO_OUTPUT\n-D FOREIGN -j ISTIO_OLD\n-D PREROUTING -i eth9 -j RETURN\n-F ISTIO_OUTPUT\n-F ISTIO_OLD\n-X ISTIO_OLD\n-N ISTIO_REDIRECT\n-A PREROUTING -i eth9 -j RETURN\n-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001\n-A OUTPUT -j ISTIO_OUTPUT\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT\n"
        );
        // Cleanup: no plan, every ISTIO chain deleted, foreign rules untouched.
        let s = replace_script(&state, &[], &[]);
        assert_eq!(
            s,
            "*nat\n-D OUTPUT -j ISTIO_OUTPUT\n-D FOREIGN -j ISTIO_OLD\n-F ISTIO_OUTPUT\n-F ISTIO_OLD\n-X ISTIO_OUTPUT\n-X ISTIO_OLD\nCOMMIT\n"
        );
    }

    fn config(args: &[&str]) -> Config {
        let host = crate::HostInputs {
            addresses: Some(vec!["198.18.0.240".parse().expect("ip")]),
            resolv_conf: std::path::PathBuf::from("/nonexistent/resolv.conf"),
            users: Some(std::collections::HashMap::new()),
            groups: Some(std::collections::HashMap::new()),
        };
        let args = args.iter().map(std::ffi::OsString::from);
        match crate::config::parse(args, &std::collections::HashMap::new(), &host) {
            Ok(crate::config::Parsed::Run(mut cfg)) => {
                cfg.detect_host(&host).expect("host");
                *cfg
            }
            other => panic!("{other:?}"),
        }
    }

    fn mangle_marks(rules: &[Rule]) -> Vec<String> {
        rules
            .iter()
            .filter(|r| r.table == "mangle" && is_built_in(&r.chain) && !r.jumps_to_istio())
            .map(|r| r.params.join(" "))
            .collect()
    }

    #[test]
    fn reconcile_candidates_include_the_other_modes_built_in_rules() {
        let redirect = config(&["-p", "15001", "-u", "1337", "-m", "REDIRECT", "-b", "*"]);
        assert!(mangle_marks(crate::capture::build(&redirect).rules_v4()).is_empty());
        let other = mangle_marks(other_mode_rules(&redirect).rules_v4());
        assert!(
            other.iter().any(|r| r.contains("CONNMARK --save-mark")),
            "{other:?}"
        );
        let tproxy = config(&["-p", "15001", "-u", "1337", "-m", "TPROXY", "-b", "*"]);
        assert_eq!(
            mangle_marks(crate::capture::build(&tproxy).rules_v4()),
            other
        );
        assert!(mangle_marks(other_mode_rules(&tproxy).rules_v4()).is_empty());
    }

    #[test]
    fn check_script_uses_check_form() {
        assert_eq!(
            check_script(&plan()[..1]),
            "*nat\n-C PREROUTING -i eth9 -j RETURN\nCOMMIT\n"
        );
    }
}
