//! The `status` differential suite (issue #26): the same kubelet and Prometheus requests to
//! both agents' status servers, and what the apps and a stand-in Envoy saw of them. 340
//! generated requests over 14 agent starts (`pilot-agent proxy sidecar` with generated
//! `ISTIO_KUBE_APP_PROBERS` and `ISTIO_PROMETHEUS_ANNOTATIONS`): app probes to HTTP, HTTPS,
//! gRPC-health and TCP apps, unknown probers, `/healthz/ready` through Envoy's states,
//! merged `/stats/prometheus` with text and OpenMetrics apps (down, slow, failing),
//! `/quitquitquit` and `/drain` from inside and outside the pod, unknown paths and methods.
//! Istio's Go `pilot-agent` answers are recorded under `tests/data/istio-diff/status/` (how:
//! that folder's README.md); this test runs the same driver (`drive.py`) with ours and
//! requires the same answers. Istio's binary is not run (`ISTIO_GO_BIN`, when set, is checked
//! to be the recorded one); it needs root (one network namespace per agent start), `ip`,
//! `openssl` and python3 with grpcio (the gRPC health app).
//!
//! A case where we differ on purpose is listed in `deliberate.txt` as `<id> <reason>...`; each
//! reason names the one part of the answer it excuses (below, [`excuse`]), the rest must
//! still agree, and the test fails when a listed reason no longer makes a difference.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use harness::prereq::{py_grpc_dir, require_grpcio};
use harness::{require_bin, require_root, workspace_bin};
use serde_json::Value;

fn data_dir() -> PathBuf {
    harness::istio_diff::recorded_dir(
        "status",
        &[
            "cases.jsonl",
            "recorded.jsonl",
            "deliberate.txt",
            "drive.py",
        ],
    )
}

/// Istio's bootstrap template of the release the suite was recorded from, in Go's module cache
/// (absent: skip, or fail under `CI=true`).
fn template() -> Option<PathBuf> {
    harness::istio_release::bootstrap_template()
}

fn answers(path: &Path) -> BTreeMap<String, Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .lines()
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (v["id"].as_str().expect("id").to_string(), v)
        })
        .collect()
}

/// The reasons `deliberate.txt` may give, each a line of docs/differences.md.
const REASONS: &[&str] = &[
    "accept-encoding",
    "envoy-sigterm",
    "ready-reason",
    "go-accept-state",
    "head-no-envoy",
];

/// Makes Istio's answer (`want`) and ours (`got`) agree on the one part `reason` excuses.
fn excuse(reason: &str, want: &mut Value, got: &mut Value) {
    match reason {
        // Go's HTTP client adds `Accept-Encoding: gzip` to every probe and scrape it sends.
        "accept-encoding" => {
            if let Some(seen) = want["seen"].as_object_mut() {
                for requests in seen.values_mut() {
                    for r in requests.as_array_mut().into_iter().flatten() {
                        if let Some(h) = r.get_mut("headers").and_then(Value::as_array_mut) {
                            h.retain(|kv| kv[0] != "accept-encoding" || kv[1] != "gzip");
                        }
                    }
                }
            }
        }
        // On /quitquitquit Istio SIGKILLs Envoy; we send SIGTERM.
        "envoy-sigterm" => want["envoy_signals"] = got["envoy_signals"].clone(),
        // Istio's 503 from /healthz/ready has no body; ours names what is not ready.
        "ready-reason" => {
            want["body"] = got["body"].clone();
            want["content_type"] = got["content_type"].clone();
        }
        // Istio's agent keeps the `q` it gave text 0.0.4 in a shared value: later scrapes'
        // `Accept` to Envoy and the apps carry a stale `q` or the range twice.
        "go-accept-state" => {
            let Some(seen) = want["seen"].as_object_mut() else {
                return;
            };
            for (who, requests) in seen.iter_mut() {
                for (i, r) in requests.as_array_mut().into_iter().flatten().enumerate() {
                    let scrape = who == "envoy_prometheus"
                        || who == "metrics"
                        || r["target"] == "/app-metrics";
                    let ours = got["seen"][who][i]["headers"]
                        .as_array()
                        .and_then(|h| h.iter().find(|kv| kv[0] == "accept"))
                        .map(|kv| kv[1].clone());
                    if let (true, Some(ours), Some(h)) = (
                        scrape,
                        ours,
                        r.get_mut("headers").and_then(Value::as_array_mut),
                    ) {
                        for kv in h.iter_mut().filter(|kv| kv[0] == "accept") {
                            kv[1] = ours.clone();
                        }
                    }
                }
            }
        }
        // Istio scrapes Envoy for a HEAD /stats/prometheus whose body it then drops.
        "head-no-envoy" => {
            if got["seen"].get("envoy_prometheus").is_none()
                && let Some(seen) = want["seen"].as_object_mut()
            {
                seen.remove("envoy_prometheus");
            }
        }
        other => panic!("deliberate.txt: unknown reason {other} (known: {REASONS:?})"),
    }
}

#[test]
fn status_server_answers_as_the_recorded_go_agent() {
    if !(require_root() && require_bin("ip") && require_bin("openssl") && require_grpcio()) {
        return;
    }
    let Some(template) = template() else { return };
    let dir = data_dir();
    let recorded = answers(&dir.join("recorded.jsonl"));
    let cases: usize = std::fs::read_to_string(dir.join("cases.jsonl"))
        .expect("cases.jsonl")
        .lines()
        .map(|l| {
            let run: Value = serde_json::from_str(l).expect("cases.jsonl");
            run["requests"].as_array().expect("requests").len()
        })
        .sum();
    assert!(
        cases >= 300,
        "expected at least 300 requests, found {cases}"
    );
    assert_eq!(
        recorded.len(),
        cases,
        "recorded.jsonl does not answer every request: re-record"
    );
    let known: HashMap<String, Vec<String>> = std::fs::read_to_string(dir.join("deliberate.txt"))
        .expect("deliberate.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut words = l.split_whitespace();
            let id = words.next().expect("id").to_string();
            let reasons: Vec<String> = words.map(str::to_string).collect();
            assert!(!reasons.is_empty(), "deliberate.txt: `{l}` gives no reason");
            (id, reasons)
        })
        .collect();

    for id in known.keys() {
        assert!(
            recorded.contains_key(id),
            "deliberate.txt lists {id}, which is no case of cases.jsonl"
        );
    }

    let scratch = tempfile::tempdir().expect("tempdir");
    let out = scratch.path().join("ours.jsonl");
    let run = Command::new("python3")
        .arg(dir.join("drive.py"))
        .arg("--agent")
        .arg(workspace_bin("pilot-agent"))
        .arg("--out")
        .arg(&out)
        .arg("--template")
        .arg(&template)
        .env("PY_GRPC_DIR", py_grpc_dir())
        .output()
        .expect("run drive.py");
    assert!(
        run.status.success(),
        "drive.py failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let ours = answers(&out);

    let (mut equal, mut failures) = (0usize, Vec::new());
    for (id, want) in &recorded {
        let Some(got) = ours.get(id) else {
            failures.push(format!("{id}: no answer from ours"));
            continue;
        };
        let reasons = known.get(id).cloned().unwrap_or_default();
        let (mut w, mut g) = (want.clone(), got.clone());
        for r in &reasons {
            excuse(r, &mut w, &mut g);
        }
        if w != g {
            failures.push(format!(
                "{id}{}:\n    istio {w}\n    ours  {g}",
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(" (excused: {})", reasons.join(" "))
                }
            ));
            continue;
        }
        if reasons.is_empty() {
            equal += 1;
            continue;
        }
        // Every reason listed must still be needed.
        for r in &reasons {
            let (mut w, mut g) = (want.clone(), got.clone());
            for other in reasons.iter().filter(|o| *o != r) {
                excuse(other, &mut w, &mut g);
            }
            if w == g {
                failures.push(format!(
                    "{id}: deliberate.txt gives `{r}`, but that part now equals Istio: remove it"
                ));
            }
        }
    }
    failures.sort();
    eprintln!(
        "status: {} cases, {equal} equal, {} deliberate",
        recorded.len(),
        known.len()
    );
    assert!(
        failures.is_empty(),
        "{} differences from Istio's recorded status answers:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
