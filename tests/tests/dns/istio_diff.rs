//! The `dns` differential suite (issue #26): Istio's own Go `pilot-agent`, in a pod beside
//! `istiod-lite`, answered 5,206 generated DNS queries once; its answers are committed under
//! `tests/data/istio-diff/dns/` (how: that folder's README.md). This test builds the same world
//! (the same istiod-lite config, so the same NDS table; the same dnsmasq upstream at the pod's
//! resolv.conf nameserver; the pod's search list and ndots), runs our `pilot-agent` in the pod
//! instead, sends it the recorded query packets byte for byte over UDP and TCP, and requires
//! the same answers (normalised as `answer.rs` says). Istio's binary is not run:
//! `ISTIO_GO_BIN`, when set (always under `CI=true`), is checked to be the binary recorded.
//!
//! A case where we differ on purpose is listed in `deliberate.txt` (`<id> <reason>`, each reason
//! a line of docs/differences.md); the test fails when a listed case no longer differs, so the
//! list cannot go stale.
//!
//! `record` (ignored; it needs `ISTIO_GO_BIN`) runs Istio's agent in the same world and writes
//! `recorded.jsonl`.

#[path = "istio_diff/answer.rs"]
mod answer;
#[path = "istio_diff/world.rs"]
mod world;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn data_dir() -> PathBuf {
    harness::istio_diff::recorded_dir(
        "dns",
        &[
            "cases.jsonl",
            "config.yaml",
            "upstream.conf",
            "recorded.jsonl",
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

/// One generated query: its id, transport and packet.
pub struct Case {
    pub id: String,
    pub tcp: bool,
    pub query: Vec<u8>,
    pub what: String,
}

fn cases(dir: &Path) -> Vec<Case> {
    json_lines(&dir.join("cases.jsonl"))
        .iter()
        .map(|v| {
            let s = |k: &str| {
                v[k].as_str()
                    .unwrap_or_else(|| panic!("case field {k}: {v}"))
                    .to_string()
            };
            Case {
                id: s("id"),
                tcp: match s("proto").as_str() {
                    "tcp" => true,
                    "udp" => false,
                    other => panic!("case {}: proto {other:?} is not udp or tcp", s("id")),
                },
                query: answer::unhex(&s("query"))
                    .unwrap_or_else(|e| panic!("case {}: query: {e}", s("id"))),
                what: s("what"),
            }
        })
        .collect()
}

/// `deliberate.txt`: id -> its tags (comma-separated, from [`answer::TAGS`]).
fn deliberate(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("deliberate.txt"))
        .expect("read deliberate.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (id, reason) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("deliberate.txt: {l:?} is not `<id> <reason>`"));
            (id.to_string(), reason.trim().to_string())
        })
        .collect()
}

#[test]
fn matches_istio() {
    if !world::prerequisites() {
        return;
    }
    let dir = data_dir();
    let cases = cases(&dir);
    assert!(
        cases.len() >= 5000,
        "{} cases: the suite has 5,000 or more",
        cases.len()
    );
    let recorded: BTreeMap<String, Option<Vec<u8>>> = json_lines(&dir.join("recorded.jsonl"))
        .iter()
        .map(|v| {
            let id = v["id"].as_str().expect("recorded id").to_string();
            let answer = v["answer"]
                .as_str()
                .map(|h| answer::unhex(h).unwrap_or_else(|e| panic!("recorded {id}: {e}")));
            (id, answer)
        })
        .collect();
    let deliberate = deliberate(&dir);
    for id in deliberate.keys() {
        assert!(
            recorded.contains_key(id),
            "deliberate.txt names {id}, no such case"
        );
    }

    let world = world::World::start(&dir, None);
    let ours = world.ask(&cases);
    if let Some(path) = harness::prereq::setting("ISTIO_DIFF_DUMP") {
        // Our answers in recorded.jsonl's format, for reading the differences side by side.
        write_answers(Path::new(&path), &cases, &ours);
    }

    let (mut equal, mut on_purpose) = (0, 0);
    let mut failures = Vec::new();
    let mut suggestions = String::new();
    for (case, got) in cases.iter().zip(&ours) {
        let want = recorded
            .get(&case.id)
            .unwrap_or_else(|| panic!("{} has no recorded answer: re-record", case.id));
        let (w, g) = (
            answer::normalise(want.as_deref()),
            answer::normalise(got.as_deref()),
        );
        let query = answer::normalise(Some(&case.query));
        let label = format!(
            "{} ({}, {})",
            case.id,
            case.what,
            if case.tcp { "tcp" } else { "udp" }
        );
        match (w == g, deliberate.get(&case.id)) {
            (true, None) => equal += 1,
            (false, Some(tags)) => {
                let tags: Vec<&str> = tags.split(',').collect();
                match answer::excused(&tags, &query, &w, &g) {
                    Ok(()) => on_purpose += 1,
                    Err(e) => failures.push(format!("{label}: deliberate.txt: {e}")),
                }
            }
            (true, Some(tags)) => failures.push(format!(
                "{label}: listed in deliberate.txt ({tags}) but answers as Istio did: remove its line"
            )),
            (false, None) => {
                if let Some(tags) = answer::suggest(&query, &w, &g) {
                    suggestions.push_str(&format!("{} {}\n", case.id, tags.join(",")));
                }
                failures.push(format!("{label}:\n{}", answer::diff(&w, &g)));
            }
        }
    }
    if let Some(path) = harness::prereq::setting("ISTIO_DIFF_DUMP") {
        // Tags that would account for each unlisted difference, for review.
        let path = format!("{path}.suggest");
        std::fs::write(&path, &suggestions).unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
    if let Some(path) = harness::prereq::setting("ISTIO_DIFF_DUMP") {
        let path = format!("{path}.diff");
        std::fs::write(&path, failures.join("\n")).unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
    eprintln!(
        "dns: {} cases, {equal} equal, {on_purpose} deliberate, {} failing",
        cases.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} answers differ from Istio's (first 40 shown; Istio's lines -, ours +):\n{}",
        failures.len(),
        cases.len(),
        failures
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Records Istio's answers: `ISTIO_GO_BIN=<dir with pilot-agent> cargo nextest run -p tests
/// --test dns istio_diff::record --run-ignored only`.
#[test]
#[ignore = "records Istio's answers into tests/data/istio-diff/dns (needs ISTIO_GO_BIN)"]
fn record() {
    let Some(go_bin) = harness::istio_go_bin() else {
        return;
    };
    let agent = go_bin.join("pilot-agent");
    assert!(agent.is_file(), "{} is missing", agent.display());
    if !world::prerequisites() {
        return;
    }
    let dir =
        harness::istio_diff::data_dir("dns", &["cases.jsonl", "config.yaml", "upstream.conf"]);
    let cases = cases(&dir);
    let world = world::World::start(&dir, Some(&agent));
    let answers = world.ask(&cases);
    write_answers(&dir.join("recorded.jsonl"), &cases, &answers);
    eprintln!("recorded {} answers", answers.len());
}

fn write_answers(path: &Path, cases: &[Case], answers: &[Option<Vec<u8>>]) {
    let mut out = String::new();
    for (case, a) in cases.iter().zip(answers) {
        let line = serde_json::json!({
            "id": case.id,
            "answer": a.as_ref().map(|b| answer::hex(b)),
            "summary": answer::summary(a.as_deref()),
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    std::fs::write(path, out).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
