//! The `iptables` differential suite (issue #26): Istio's own `pilot-agent istio-iptables`, built
//! from source, answered 1,500 generated flag/env sets once; its answers are committed under
//! `tests/data/istio-diff/iptables/` (how: that folder's README.md). This test asks our
//! `istio-iptables` (and, for every fifth case, `pilot-agent istio-iptables`) the same questions,
//! in network namespaces that present the same host state, and requires the same exit status and
//! the same dry-run stream byte for byte. Istio's binary is not run:
//! `ISTIO_GO_BIN`, when set (always under `CI=true`), is checked to be the binary recorded.
//!
//! A case where we differ on purpose is listed in `deliberate.txt` (`<id> exit=<ours> <reason>`,
//! each reason a line of docs/differences.md): the test requires our listed exit status there,
//! and fails when a listed case no longer differs, so the list cannot go stale.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use harness::{Netns, require_bin, require_root, workspace_bin};
use serde_json::Value;

fn data_dir() -> PathBuf {
    harness::istio_diff::recorded_dir(
        "iptables",
        &[
            "cases.jsonl",
            "recorded.jsonl",
            "hosts.json",
            "deliberate.txt",
        ],
    )
}

fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

struct Case {
    id: String,
    host: String,
    resolv: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Case {
    fn from_json(v: &Value) -> Case {
        let s = |k: &str| {
            v[k].as_str()
                .unwrap_or_else(|| panic!("case field {k}: {v}"))
                .to_string()
        };
        Case {
            id: s("id"),
            host: s("host"),
            resolv: s("resolv"),
            args: v["args"]
                .as_array()
                .expect("args")
                .iter()
                .map(|a| a.as_str().expect("arg").to_string())
                .collect(),
            env: v["env"]
                .as_object()
                .expect("env")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("env value").to_string()))
                .collect(),
        }
    }
}

/// An answer: exit status and the dry-run stream (None: nothing was programmed).
#[derive(PartialEq, Debug)]
struct Answer {
    exit: i32,
    stream: Option<String>,
}

/// Istio's recorded answer and how much of it compares (README.md, "What is compared").
struct Recorded {
    answer: Answer,
    /// Istio logged no stream (a `--native-nftables` case whose log options hide the info
    /// line that carries the script): only the exit status compares.
    hidden: bool,
}

impl Recorded {
    /// Exit statuses equal; streams equal when Istio succeeded and showed its stream (a failed
    /// run's stream is the state reads Istio's stub recorded before it failed, and ours
    /// validates before reading any state).
    fn matches(&self, ours: &Answer) -> bool {
        ours.exit == self.answer.exit
            && (self.answer.exit != 0 || self.hidden || ours.stream == self.answer.stream)
    }
}

/// Our answer, with what we said on stderr (for the failure message only).
struct Ours {
    answer: Answer,
    stderr: String,
}

/// `<id> exit=<n> <reason...>` lines; `#` starts a comment.
fn deliberate(path: &Path) -> BTreeMap<String, (i32, String)> {
    let text = std::fs::read_to_string(path).expect("read deliberate.txt");
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(3, ' ');
        let id = parts.next().expect("id").to_string();
        let exit = parts
            .next()
            .and_then(|e| e.strip_prefix("exit="))
            .and_then(|e| e.parse().ok())
            .unwrap_or_else(|| {
                panic!("deliberate.txt: `{line}`: expected `<id> exit=<n> <reason>`")
            });
        let reason = parts.next().unwrap_or_default().to_string();
        assert!(
            !reason.is_empty(),
            "deliberate.txt: `{line}` gives no reason"
        );
        out.insert(id, (exit, reason));
    }
    out
}

/// One namespace per (address family, resolv.conf) pair, made on first use.
struct Hosts {
    spec: Value,
    made: HashMap<(String, String), Netns>,
}

impl Hosts {
    fn get(&mut self, host: &str, resolv: &str) -> &Netns {
        let spec = &self.spec;
        self.made
            .entry((host.to_string(), resolv.to_string()))
            .or_insert_with(|| {
                let ns = Netns::new(&format!("idiff-{host}-{resolv}"));
                for cidr in spec["hosts"][host].as_array().expect("host in hosts.json") {
                    ns.add_lo_addr(cidr.as_str().expect("cidr"));
                }
                ns.set_resolv_conf(
                    spec["resolv"][resolv]
                        .as_str()
                        .expect("resolv in hosts.json"),
                );
                ns
            })
    }
}

fn ours(ns: &Netns, program: &[PathBuf], case: &Case, dry_file: &Path) -> Ours {
    let _ = std::fs::remove_file(dry_file);
    let mut cmd = ns.cmd(&program[0]);
    cmd.env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("DRY_RUN_FILE_PATH", dry_file)
        .envs(case.env.iter().map(|(k, v)| (k, v)))
        .args(program[1..].iter())
        .args(&case.args);
    let out = cmd.output().expect("run our istio-iptables");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    Ours {
        answer: Answer {
            exit: out.status.code().unwrap_or(-1),
            stream: (!stdout.is_empty()).then_some(stdout),
        },
        stderr: stderr
            .lines()
            .rfind(|l| l.contains("\terror\t") || l.starts_with("error"))
            .unwrap_or_default()
            .to_string(),
    }
}

fn first_difference(want: &str, got: &str) -> String {
    for (n, (w, g)) in want.lines().zip(got.lines()).enumerate() {
        if w != g {
            return format!("line {}: istio `{w}`, ours `{g}`", n + 1);
        }
    }
    format!(
        "istio has {} lines, ours {}",
        want.lines().count(),
        got.lines().count()
    )
}

#[test]
fn istio_iptables_answers_match_the_recorded_go_binary() {
    if !(require_root() && require_bin("ip")) {
        return;
    }
    let dir = data_dir();
    let cases: Vec<Case> = json_lines(&dir.join("cases.jsonl"))
        .iter()
        .map(Case::from_json)
        .collect();
    let recorded: HashMap<String, Recorded> = json_lines(&dir.join("recorded.jsonl"))
        .into_iter()
        .map(|v| {
            let id = v["id"].as_str().expect("id").to_string();
            let exit = v["exit"].as_i64().expect("exit") as i32;
            let stream = v["stream"].as_str().map(String::from);
            let hidden = v["hidden"].as_bool().unwrap_or(false);
            let answer = Answer { exit, stream };
            (id, Recorded { answer, hidden })
        })
        .collect();
    assert!(
        cases.len() >= 1000,
        "expected at least 1,000 cases, found {}",
        cases.len()
    );
    assert_eq!(
        recorded.len(),
        cases.len(),
        "recorded.jsonl does not answer every case of cases.jsonl: re-record (README.md)"
    );
    let known = deliberate(&dir.join("deliberate.txt"));
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("hosts.json")).expect("read hosts.json"),
    )
    .expect("hosts.json");
    let mut hosts = Hosts {
        spec,
        made: HashMap::new(),
    };
    let standalone = vec![workspace_bin("istio-iptables")];
    let subcommand = vec![
        workspace_bin("pilot-agent"),
        PathBuf::from("istio-iptables"),
    ];
    let tmp = tempfile::tempdir().expect("tempdir");
    let dry_file = tmp.path().join("dry-run");

    let (mut equal, mut failures) = (0usize, Vec::new());
    for (n, case) in cases.iter().enumerate() {
        let istio = recorded
            .get(&case.id)
            .unwrap_or_else(|| panic!("{}: not in recorded.jsonl", case.id));
        let ns = hosts.get(&case.host, &case.resolv);
        let mut programs = vec![&standalone];
        if n % 5 == 0 {
            programs.push(&subcommand);
        }
        let before = failures.len();
        for program in programs {
            let Ours {
                answer: got,
                stderr,
            } = ours(ns, program, case, &dry_file);
            let who = if program.len() > 1 {
                "pilot-agent istio-iptables"
            } else {
                "istio-iptables"
            };
            match known.get(&case.id) {
                Some((_, reason)) if istio.matches(&got) => failures.push(format!(
                    "{} ({who}): listed in deliberate.txt ({reason}) but now equals Istio: remove the line",
                    case.id
                )),
                Some((exit, reason)) if got.exit != *exit => failures.push(format!(
                    "{} ({who}): deliberate difference ({reason}) expects our exit {exit}, got {}",
                    case.id, got.exit
                )),
                Some(_) => {}
                None if istio.matches(&got) => {}
                None => {
                    let how = if got.exit != istio.answer.exit {
                        format!("exit: istio {}, ours {}", istio.answer.exit, got.exit)
                    } else {
                        first_difference(
                            istio.answer.stream.as_deref().unwrap_or(""),
                            got.stream.as_deref().unwrap_or(""),
                        )
                    };
                    failures.push(format!(
                        "{} ({who}): {how}\n    args {:?} env {:?}\n    ours: {stderr}",
                        case.id, case.args, case.env
                    ));
                }
            }
        }
        if !known.contains_key(&case.id) && failures.len() == before {
            equal += 1;
        }
    }
    eprintln!(
        "iptables: {} cases, {equal} equal, {} deliberate",
        cases.len(),
        known.len()
    );
    assert!(
        failures.is_empty(),
        "{} differences from Istio's recorded answers:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
