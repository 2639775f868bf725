//! The rule builder: collects rules per address family and renders them, either as one
//! `iptables` argument list per rule or as `iptables-restore` input.
//!
//! Rendering rules (pinned by Istio's builder goldens): a chain is declared once (`-N`), the first
//! time it is used; built-in chains and targets are never declared; rules keep the order in which
//! they were added (inserts keep their position number); restore input groups rules by table,
//! tables sorted by name, each block closed by `COMMIT`.

use std::collections::{BTreeMap, HashSet};

/// Placeholder replaced by an address-family specific value in [`RuleBuilder::append_versioned`].
pub const IP_VERSION_SPECIFIC: &str = "PLACEHOLDER_IP_VERSION_SPECIFIC";

/// Chains and targets built into iptables: never declared with `-N`, never deleted.
pub const BUILT_IN: [&str; 8] = [
    "INPUT",
    "OUTPUT",
    "FORWARD",
    "PREROUTING",
    "POSTROUTING",
    "ACCEPT",
    "RETURN",
    "DROP",
];

/// Whether `name` is a built-in chain or target.
pub fn is_built_in(name: &str) -> bool {
    BUILT_IN.contains(&name)
}

/// One rule: its chain and table, and its full argument list starting with `-A chain` or
/// `-I chain position`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub table: String,
    pub params: Vec<String>,
}

impl Rule {
    /// The `-C chain <matches>` form of this rule (position of an insert dropped).
    pub fn check_params(&self) -> Vec<String> {
        self.with_command("-C")
    }

    /// The `-D chain <matches>` form of this rule (position of an insert dropped).
    pub fn delete_params(&self) -> Vec<String> {
        self.with_command("-D")
    }

    /// The match and target part, without `-A chain` / `-I chain N`.
    pub fn spec(&self) -> &[String] {
        let skip = match self.params.first().map(String::as_str) {
            Some("-I") => 3,
            Some("-A") => 2,
            _ => 0,
        };
        self.params.get(skip..).unwrap_or(&[])
    }

    /// The jump target if the rule ends with `-j <target>`.
    pub fn jump_target(&self) -> Option<&str> {
        let n = self.params.len();
        if n >= 2 && self.params[n - 2] == "-j" {
            Some(self.params[n - 1].as_str())
        } else {
            None
        }
    }

    /// Whether the rule jumps (anywhere in its params) to an `ISTIO_*` chain.
    pub fn jumps_to_istio(&self) -> bool {
        self.params
            .windows(2)
            .any(|w| (w[0] == "-j" || w[0] == "--jump") && w[1].starts_with("ISTIO_"))
    }

    fn with_command(&self, cmd: &str) -> Vec<String> {
        let mut out = vec![cmd.to_string(), self.chain.clone()];
        out.extend(self.spec().iter().cloned());
        out
    }
}

/// Collects IPv4 and IPv6 rules. IPv6 rules are dropped when IPv6 is disabled.
#[derive(Debug, Clone, Default)]
pub struct RuleBuilder {
    v4: Vec<Rule>,
    v6: Vec<Rule>,
    ipv6: bool,
}

fn owned(params: &[&str]) -> Vec<String> {
    params.iter().map(|s| s.to_string()).collect()
}

impl RuleBuilder {
    /// A builder; `ipv6` enables the IPv6 rule list.
    pub fn new(ipv6: bool) -> Self {
        Self {
            v4: Vec::new(),
            v6: Vec::new(),
            ipv6,
        }
    }

    /// Appends a rule to both families.
    pub fn append(&mut self, chain: &str, table: &str, params: &[&str]) -> &mut Self {
        self.append_v4(chain, table, params);
        self.append_v6(chain, table, params)
    }

    /// Appends a rule to the IPv4 family only.
    pub fn append_v4(&mut self, chain: &str, table: &str, params: &[&str]) -> &mut Self {
        push_append(&mut self.v4, chain, table, owned(params));
        self
    }

    /// Appends a rule to the IPv6 family only (no-op when IPv6 is disabled).
    pub fn append_v6(&mut self, chain: &str, table: &str, params: &[&str]) -> &mut Self {
        if self.ipv6 {
            push_append(&mut self.v6, chain, table, owned(params));
        }
        self
    }

    /// Inserts a rule at `position` in both families.
    pub fn insert(
        &mut self,
        chain: &str,
        table: &str,
        position: u32,
        params: &[&str],
    ) -> &mut Self {
        self.insert_v4(chain, table, position, params);
        self.insert_v6(chain, table, position, params)
    }

    /// Inserts a rule in the IPv4 family only.
    pub fn insert_v4(
        &mut self,
        chain: &str,
        table: &str,
        position: u32,
        params: &[&str],
    ) -> &mut Self {
        push_insert(&mut self.v4, chain, table, position, owned(params));
        self
    }

    /// Inserts a rule in the IPv6 family only (no-op when IPv6 is disabled).
    pub fn insert_v6(
        &mut self,
        chain: &str,
        table: &str,
        position: u32,
        params: &[&str],
    ) -> &mut Self {
        if self.ipv6 {
            push_insert(&mut self.v6, chain, table, position, owned(params));
        }
        self
    }

    /// Appends a rule to both families, replacing [`IP_VERSION_SPECIFIC`] in `params` by
    /// `v4` in the IPv4 rule and by `v6` in the IPv6 rule.
    pub fn append_versioned(
        &mut self,
        v4: &str,
        v6: &str,
        chain: &str,
        table: &str,
        params: &[&str],
    ) -> &mut Self {
        let sub = |value: &str| -> Vec<String> {
            params
                .iter()
                .map(|p| {
                    if *p == IP_VERSION_SPECIFIC {
                        value.to_string()
                    } else {
                        p.to_string()
                    }
                })
                .collect()
        };
        push_append(&mut self.v4, chain, table, sub(v4));
        if self.ipv6 {
            push_append(&mut self.v6, chain, table, sub(v6));
        }
        self
    }

    /// The IPv4 rules in the order they were added.
    pub fn rules_v4(&self) -> &[Rule] {
        &self.v4
    }

    /// The IPv6 rules in the order they were added (empty when IPv6 is disabled).
    pub fn rules_v6(&self) -> &[Rule] {
        &self.v6
    }

    /// Per-command form of the IPv4 rules: `-t table -N chain` lines first, then the rules.
    #[cfg(test)]
    pub(crate) fn build_v4(&self) -> Vec<Vec<String>> {
        build_commands(&self.v4)
    }

    /// Per-command form of the IPv6 rules.
    #[cfg(test)]
    pub(crate) fn build_v6(&self) -> Vec<Vec<String>> {
        build_commands(&self.v6)
    }

    /// Per-command cleanup of the IPv4 rules (Istio's form): deletions in reverse order
    /// (skipping non-jump rules inside `ISTIO_*` chains), then `-F`/`-X` of every declared chain.
    pub fn build_cleanup_v4(&self) -> Vec<Vec<String>> {
        build_cleanup(&self.v4)
    }

    /// Per-command cleanup of the IPv6 rules.
    pub fn build_cleanup_v6(&self) -> Vec<Vec<String>> {
        build_cleanup(&self.v6)
    }

    /// `iptables-restore` input for any rule list (tables sorted by name).
    pub fn restore_of(rules: &[Rule]) -> String {
        build_restore(rules)
    }

    /// `iptables-restore` input for the IPv4 rules.
    pub fn build_v4_restore(&self) -> String {
        build_restore(&self.v4)
    }

    /// `ip6tables-restore` input for the IPv6 rules.
    pub fn build_v6_restore(&self) -> String {
        build_restore(&self.v6)
    }
}

fn push_append(list: &mut Vec<Rule>, chain: &str, table: &str, params: Vec<String>) {
    if !params.iter().any(|p| p == "-j") && !chain.starts_with("ISTIO_") {
        tracing::warn!(chain, rule = %params.join(" "), "appending non-jump rule in non-Istio chain");
    }
    let mut full = vec!["-A".to_string(), chain.to_string()];
    full.extend(params);
    list.push(Rule {
        chain: chain.to_string(),
        table: table.to_string(),
        params: full,
    });
}

fn push_insert(list: &mut Vec<Rule>, chain: &str, table: &str, position: u32, params: Vec<String>) {
    if !params.iter().any(|p| p == "-j") && !chain.starts_with("ISTIO_") {
        tracing::warn!(chain, rule = %params.join(" "), "inserting non-jump rule in non-Istio chain");
    }
    let mut full = vec!["-I".to_string(), chain.to_string(), position.to_string()];
    full.extend(params);
    list.push(Rule {
        chain: chain.to_string(),
        table: table.to_string(),
        params: full,
    });
}

#[cfg(test)]
fn build_commands(rules: &[Rule]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for r in rules {
        if !is_built_in(&r.chain) && seen.insert((r.chain.as_str(), r.table.as_str())) {
            out.push(vec![
                "-t".to_string(),
                r.table.clone(),
                "-N".to_string(),
                r.chain.clone(),
            ]);
        }
    }
    for r in rules {
        let mut cmd = vec!["-t".to_string(), r.table.clone()];
        cmd.extend(r.params.iter().cloned());
        out.push(cmd);
    }
    out
}

fn build_cleanup(rules: &[Rule]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for r in rules.iter().rev() {
        if r.chain.starts_with("ISTIO_") && !r.jumps_to_istio() {
            continue;
        }
        let mut cmd = vec!["-t".to_string(), r.table.clone()];
        cmd.extend(r.delete_params());
        out.push(cmd);
    }
    let mut seen = HashSet::new();
    for r in rules.iter().rev() {
        if seen.insert((r.chain.as_str(), r.table.as_str())) && !is_built_in(&r.chain) {
            for op in ["-F", "-X"] {
                out.push(vec![
                    "-t".to_string(),
                    r.table.clone(),
                    op.to_string(),
                    r.chain.clone(),
                ]);
            }
        }
    }
    out
}

/// Chains (per table) that a restore of `rules` declares, in declaration order: first the chains
/// that get rules, then chains only used as jump targets.
pub fn declared_chains(rules: &[Rule]) -> Vec<(String, String)> {
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let mut out = Vec::new();
    let mut declare = |table: &str, chain: &str| {
        let key = (table.to_string(), chain.to_string());
        if seen.insert(key.clone()) && !is_built_in(chain) {
            out.push(key);
        }
    };
    for r in rules {
        declare(&r.table, &r.chain);
    }
    for r in rules {
        if let Some(target) = r.jump_target() {
            declare(&r.table, target);
        }
    }
    out
}

fn build_restore(rules: &[Rule]) -> String {
    let mut tables: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (table, chain) in declared_chains(rules) {
        tables.entry(table).or_default().push(format!("-N {chain}"));
    }
    for r in rules {
        tables
            .entry(r.table.clone())
            .or_default()
            .push(r.params.join(" "));
    }
    let mut out = String::new();
    for (table, lines) in tables {
        if lines.is_empty() {
            continue;
        }
        out.push_str("* ");
        out.push_str(&table);
        out.push('\n');
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    mod conformance {
        include!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/src/conformance.rs"
        ));
    }

    fn corpus() -> Option<PathBuf> {
        conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-iptables/builder")
    }

    fn golden(dir: &std::path::Path, name: &str) -> String {
        let path = dir.join(format!("{name}.golden"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    fn commands_text(cmds: &[Vec<String>]) -> String {
        cmds.iter().map(|c| c.join(" ") + "\n").collect()
    }

    const R: [&str; 4] = ["-f", "foo", "-b", "bar"];

    type Case = (&'static str, fn(&mut RuleBuilder, bool));

    fn add(b: &mut RuleBuilder, v6: bool, insert: Option<u32>, params: &[&str]) {
        match (insert, v6) {
            (Some(p), false) => b.insert_v4("chain", "table", p, params),
            (Some(p), true) => b.insert_v6("chain", "table", p, params),
            (None, false) => b.append_v4("chain", "table", params),
            (None, true) => b.append_v6("chain", "table", params),
        };
    }

    #[test]
    fn builder_goldens_single_family_cases() {
        let Some(dir) = corpus() else { return };
        let cases: [Case; 5] = [
            ("insert-single", |b, v6| add(b, v6, Some(2), &R)),
            ("append-single", |b, v6| add(b, v6, None, &R)),
            ("append-multi", |b, v6| {
                add(b, v6, None, &R);
                add(b, v6, None, &["-f", "fu", "-b", "bar"]);
                add(b, v6, None, &["-f", "foo", "-b", "baz"]);
            }),
            ("insert-multi", |b, v6| {
                add(b, v6, Some(1), &R);
                add(b, v6, Some(2), &["-f", "foo", "-b", "baaz"]);
                add(b, v6, Some(3), &["-f", "foo", "-b", "baz"]);
            }),
            ("append-insert-multi", |b, v6| {
                add(b, v6, None, &R);
                add(b, v6, Some(2), &R);
                add(b, v6, None, &["-f", "foo", "-b", "baz"]);
            }),
        ];
        for (name, f) in cases {
            for v6 in [false, true] {
                let mut b = RuleBuilder::new(true);
                f(&mut b, v6);
                let (used, unused) = if v6 {
                    (
                        (b.build_v6(), b.build_v6_restore()),
                        (b.build_v4(), b.build_v4_restore()),
                    )
                } else {
                    (
                        (b.build_v4(), b.build_v4_restore()),
                        (b.build_v6(), b.build_v6_restore()),
                    )
                };
                assert_eq!(commands_text(&used.0), golden(&dir, name), "{name} v6={v6}");
                assert_eq!(
                    used.1,
                    golden(&dir, &format!("{name}-restore")),
                    "{name}-restore v6={v6}"
                );
                assert!(unused.0.is_empty(), "{name}: unused family has commands");
                assert!(
                    unused.1.is_empty(),
                    "{name}: unused family has restore text"
                );
            }
        }
    }

    #[test]
    fn builder_goldens_multi_rules_new_chain() {
        let Some(dir) = corpus() else { return };
        let mut b = RuleBuilder::new(true);
        b.append_v4("chain", "table", &R);
        b.insert_v4("chain", "table", 2, &R);
        b.append_v4("chain", "table", &["-f", "foo", "-b", "baz"]);
        b.append_v4("PREROUTING", "nat", &R);
        b.append_v6("chain", "table", &R);
        b.insert_v6("chain", "table", 2, &R);
        b.insert_v6("chain", "table", 1, &R);
        assert_eq!(
            commands_text(&b.build_v4()),
            golden(&dir, "multi-rules-new-chain-v4")
        );
        assert_eq!(
            b.build_v4_restore(),
            golden(&dir, "multi-rules-new-chain-v4-restore")
        );
        assert_eq!(
            commands_text(&b.build_v6()),
            golden(&dir, "multi-rules-new-chain-v6")
        );
        assert_eq!(
            b.build_v6_restore(),
            golden(&dir, "multi-rules-new-chain-v6-restore")
        );
    }

    #[test]
    fn ipv6_disabled_drops_v6_rules() {
        let mut b = RuleBuilder::new(false);
        b.append("ISTIO_X", "nat", &["-j", "RETURN"]);
        b.append_versioned("1", "2", "ISTIO_X", "nat", &["-d", IP_VERSION_SPECIFIC]);
        assert_eq!(b.rules_v4().len(), 2);
        assert!(b.rules_v6().is_empty());
        assert_eq!(b.rules_v4()[1].params, ["-A", "ISTIO_X", "-d", "1"]);
    }

    #[test]
    fn jump_targets_are_declared_after_ruled_chains() {
        let mut b = RuleBuilder::new(false);
        b.append("OUTPUT", "nat", &["-j", "ISTIO_B"]);
        b.append("ISTIO_A", "nat", &["-j", "RETURN"]);
        assert_eq!(
            b.build_v4_restore(),
            "* nat\n-N ISTIO_A\n-N ISTIO_B\n-A OUTPUT -j ISTIO_B\n-A ISTIO_A -j RETURN\nCOMMIT\n"
        );
    }

    #[test]
    fn check_and_delete_forms_drop_insert_position() {
        let mut b = RuleBuilder::new(false);
        b.insert("PREROUTING", "nat", 1, &["-i", "eth0", "-j", "RETURN"]);
        let r = &b.rules_v4()[0];
        assert_eq!(
            r.check_params(),
            ["-C", "PREROUTING", "-i", "eth0", "-j", "RETURN"]
        );
        assert_eq!(
            r.delete_params(),
            ["-D", "PREROUTING", "-i", "eth0", "-j", "RETURN"]
        );
    }
}
