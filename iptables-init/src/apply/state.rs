//! Parsing of `iptables-save` output: per table, the declared chains and the rules by chain.

use std::collections::BTreeMap;

/// One table of an `iptables-save` snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableState {
    /// Every chain declared in the table (`:NAME ...`), built-in or not, in save order.
    pub chains: Vec<String>,
    /// Rules as `(chain, "-A chain ...")`, in save order.
    pub rules: Vec<(String, String)>,
}

impl TableState {
    /// Whether the table holds an `ISTIO_*` chain or a jump to one.
    pub fn has_istio(&self) -> bool {
        self.chains.iter().any(|c| c.starts_with("ISTIO_"))
            || self.rules.iter().any(|(_, l)| line_jumps_to_istio(l))
    }
}

/// A whole snapshot, keyed by table name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub tables: BTreeMap<String, TableState>,
}

impl State {
    /// Whether any table holds Istio chains or jumps (residue of an earlier run).
    pub fn has_istio(&self) -> bool {
        self.tables.values().any(TableState::has_istio)
    }

    /// Whether the snapshot holds no table at all.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Whether `chain` is declared in `table`.
    pub fn has_chain(&self, table: &str, chain: &str) -> bool {
        self.tables
            .get(table)
            .is_some_and(|t| t.chains.iter().any(|c| c == chain))
    }

    /// The rules of `chain` in `table`, as saved.
    #[cfg(test)]
    pub(crate) fn rules_of<'a>(
        &'a self,
        table: &str,
        chain: &'a str,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.tables
            .get(table)
            .into_iter()
            .flat_map(move |t| t.rules.iter().filter(move |(c, _)| c == chain))
            .map(|(_, l)| l.as_str())
    }
}

/// Whether a saved rule line jumps to an `ISTIO_*` chain.
pub fn line_jumps_to_istio(line: &str) -> bool {
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-j" || w == "--jump" || w == "-g" || w == "--goto" {
            return words.next().is_some_and(|t| {
                t.trim_matches(|c| c == '"' || c == '\'')
                    .starts_with("ISTIO_")
            });
        }
    }
    false
}

/// Parses `iptables-save` output. Comments and counters are ignored.
pub fn parse_save(text: &str) -> State {
    let mut state = State::default();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line == "COMMIT" {
            current = None;
            continue;
        }
        if let Some(t) = line.strip_prefix('*') {
            let t = t.trim().to_string();
            state.tables.entry(t.clone()).or_default();
            current = Some(t);
            continue;
        }
        let Some(table) = current.as_ref().and_then(|t| state.tables.get_mut(t)) else {
            continue;
        };
        if let Some(decl) = line.strip_prefix(':') {
            if let Some(name) = decl.split_whitespace().next() {
                table.chains.push(name.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("-A ")
            && let Some(chain) = rest.split_whitespace().next()
        {
            table.rules.push((chain.to_string(), line.to_string()));
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tables_chains_rules() {
        let s = parse_save(
            "# x\n*nat\n:PREROUTING ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n-A OUTPUT -j ISTIO_OUTPUT\n-A ISTIO_OUTPUT -m comment --comment \"a b\" -j RETURN\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n",
        );
        assert_eq!(s.tables.len(), 2);
        let nat = &s.tables["nat"];
        assert_eq!(nat.chains, ["PREROUTING", "ISTIO_OUTPUT"]);
        assert_eq!(nat.rules.len(), 2);
        assert!(s.has_istio());
        assert!(!s.tables["filter"].has_istio());
        assert_eq!(s.rules_of("nat", "ISTIO_OUTPUT").count(), 1);
    }

    #[test]
    fn jump_detection() {
        assert!(line_jumps_to_istio("-A OUTPUT -p tcp -j ISTIO_OUTPUT"));
        assert!(!line_jumps_to_istio("-A OUTPUT -j RETURN"));
        assert!(!line_jumps_to_istio(
            "-A OUTPUT -m comment --comment ISTIO_X -j RETURN"
        ));
    }
}
