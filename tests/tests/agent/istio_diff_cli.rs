//! The `cli` differential suite (issue #26): every command and flag of the help tree of Istio's
//! own Go `pilot-agent`, asked once with valid and invalid values and recorded with Istio's exit
//! status under `tests/data/istio-diff/cli/` (how: that folder's README.md). Our `pilot-agent`
//! must accept what Istio's accepts and reject what it rejects: exit status 0 against non-zero,
//! not message text. Istio's binary is not run: `ISTIO_GO_BIN`, when set (always under
//! `CI=true`), is checked to be the binary recorded (`harness::istio_diff`).
//!
//! Command lines that would start something end with `--help`, which both binaries honour only
//! once the flags parse. A case where we differ on purpose is listed in `deliberate.txt`
//! (`<id> <reason>`, each reason a line of docs/differences.md); the test fails when a listed
//! case no longer differs.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::workspace_bin;
use serde_json::Value;

fn data_dir() -> PathBuf {
    harness::istio_diff::recorded_dir("cli", &["cases.jsonl", "deliberate.txt"])
}

struct Case {
    id: String,
    args: Vec<String>,
    istio_exit: i64,
}

fn cases(dir: &Path) -> Vec<Case> {
    let path = dir.join("cases.jsonl");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            Case {
                id: v["id"].as_str().expect("id").to_string(),
                args: v["args"]
                    .as_array()
                    .expect("args")
                    .iter()
                    .map(|a| a.as_str().expect("arg").to_string())
                    .collect(),
                istio_exit: v["exit"].as_i64().expect("exit"),
            }
        })
        .collect()
}

/// `<id> <reason...>` lines; `#` starts a comment.
fn deliberate(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("deliberate.txt"))
        .expect("read deliberate.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (id, reason) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("deliberate.txt: `{l}`: expected `<id> <reason>`"));
            (id.to_string(), reason.trim().to_string())
        })
        .collect()
}

/// Our exit status, or None when the command did not answer within `limit` (it ran instead).
fn ours(bin: &Path, args: &[String], scratch: &Path, limit: Duration) -> Option<i32> {
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(scratch)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pilot-agent");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = stdout.read_to_end(&mut sink);
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait pilot-agent") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let _ = reader.join();
    status.map(|s| s.code().unwrap_or(-1))
}

#[test]
fn pilot_agent_accepts_and_rejects_what_istios_does() {
    let dir = data_dir();
    let cases = cases(&dir);
    let known = deliberate(&dir);
    assert!(
        cases.len() >= 1000,
        "expected at least 1,000 cases, found {}",
        cases.len()
    );
    let bin = workspace_bin("pilot-agent");
    let scratch = tempfile::tempdir().expect("tempdir");
    let workers = 4;
    let results: Vec<(usize, Option<i32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (cases, bin, scratch) = (&cases, &bin, scratch.path());
                s.spawn(move || {
                    (w..cases.len())
                        .step_by(workers)
                        .map(|i| {
                            (
                                i,
                                ours(bin, &cases[i].args, scratch, Duration::from_secs(20)),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("worker"))
            .collect()
    });
    let mut failures = Vec::new();
    let mut equal = 0;
    for (i, got) in results {
        let case = &cases[i];
        let Some(got) = got else {
            failures.push(format!(
                "{}: {:?} did not answer within 20s (it ran instead of parsing)",
                case.id, case.args
            ));
            continue;
        };
        let same = (got == 0) == (case.istio_exit == 0);
        match known.get(&case.id) {
            Some(reason) if same => failures.push(format!(
                "{}: listed in deliberate.txt ({reason}) but now answers as Istio: remove the line",
                case.id
            )),
            Some(_) => {}
            None if same => equal += 1,
            None => failures.push(format!(
                "{}: pilot-agent {:?}: istio exit {}, ours {got}",
                case.id, case.args, case.istio_exit
            )),
        }
    }
    failures.sort();
    eprintln!(
        "cli: {} cases, {equal} equal, {} deliberate",
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
