//! The `bootstrap` differential suite (issue #26): 520 generated sets of environment,
//! `PROXY_CONFIG`, pod annotations and labels, and proxy type, for which Istio's own Go
//! `pilot-agent proxy` wrote its Envoy bootstrap (captured by a stand-in Envoy, recorded under
//! `tests/data/istio-diff/bootstrap/`; how: that folder's README.md). Our `pilot-agent bootstrap`
//! gets the same inputs in the same kind of network namespace; both render Istio's template
//! (`ISTIO_BOOTSTRAP`, the release module's, from Go's module cache). The answers must agree:
//! failure against failure, and a bootstrap equal byte for byte after JSON normalisation, or
//! else under the proto rules of Istio's golden test (`compare.rs`). Istio's binary is not run:
//! `ISTIO_GO_BIN`, when set (always under `CI=true`), is checked to be the binary recorded.
//!
//! A case where we differ on purpose is listed in `deliberate.txt` (`<id> <reason>`, each reason
//! a line of docs/differences.md); the test fails when a listed case no longer differs.

#[path = "../../../agent/tests/bootstrap_conformance/compare.rs"]
mod compare;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use harness::{Netns, require_bin, require_root, workspace_bin};
use serde_json::{Map, Value};

/// The stand-in Envoy's path as the recorder gave it in `binaryPath` (it shows in the
/// bootstrap's `PROXY_CONFIG`; ours never runs it).
const STANDIN: &str = "/tmp/istio-diff-bootstrap-envoy";
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn data_dir() -> PathBuf {
    harness::istio_diff::recorded_dir(
        "bootstrap",
        &[
            "cases.jsonl",
            "recorded.jsonl",
            "sections.jsonl",
            "deliberate.txt",
        ],
    )
}

/// Istio's bootstrap template of the release the suite was recorded from, in Go's module cache
/// (absent: skip, or fail under `CI=true`).
fn template() -> Option<PathBuf> {
    harness::istio_release::bootstrap_template()
}

fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

/// The kubelet's downward-API file: `key="value"` lines (JSON quoting, as Go's `%q` for ASCII).
fn downward_api(m: &Map<String, Value>) -> String {
    let sorted: BTreeMap<&String, &Value> = m.iter().collect();
    sorted
        .into_iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect()
}

/// Lays out the case directory and returns the environment (as the recorder does).
fn prepare(case: &Value, dir: &Path, template: &Path) -> Vec<(String, String)> {
    let _ = std::fs::remove_dir_all(dir);
    for d in [
        "etc/istio/proxy",
        "etc/istio/pod",
        "etc/istio/config",
        "var/run/secrets/istio",
    ] {
        std::fs::create_dir_all(dir.join(d)).expect("case dir");
    }
    // The mesh config points Envoy at the stand-in and the bootstrap into the case directory,
    // below every case's own ProxyConfig.
    std::fs::write(
        dir.join("etc/istio/config/mesh"),
        format!(
            "defaultConfig:\n  binaryPath: {STANDIN}\n  configPath: {}/etc/istio/proxy\n",
            dir.display()
        ),
    )
    .expect("mesh config");
    let empty = Map::new();
    for (file, key) in [("annotations", "annotations"), ("labels", "labels")] {
        let m = case[key].as_object().unwrap_or(&empty);
        std::fs::write(dir.join("etc/istio/pod").join(file), downward_api(m)).expect("pod file");
    }
    let mut env = vec![
        ("PATH".to_string(), PATH.to_string()),
        ("CLOUD_PLATFORM".to_string(), "none".to_string()),
        (
            "ISTIO_BOOTSTRAP".to_string(),
            template.display().to_string(),
        ),
    ];
    for (k, v) in case["env"].as_object().expect("env") {
        env.push((k.clone(), v.as_str().expect("env value").to_string()));
    }
    if let Some(pc) = case["proxy_config"].as_object() {
        env.push(("PROXY_CONFIG".into(), Value::Object(pc.clone()).to_string()));
    } else if let Some(text) = case["proxy_config_text"].as_str() {
        env.push(("PROXY_CONFIG".into(), text.to_string()));
    }
    env
}

/// An answer: exit status, the bootstrap (case directory written as `/CASE`), and the last
/// line of stderr (for the failure message).
type Answer = (i32, Option<Value>, String);

/// Our answer.
fn ours(case: &Value, dir: &Path, template: &Path) -> Answer {
    let env = prepare(case, dir, template);
    let ns = Netns::new("idiff-bs");
    if case["host"] == "eth" {
        for args in [
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
            ][..],
            &["addr", "add", "10.10.0.5/24", "dev", "eth0"],
            &["link", "set", "eth0", "up"],
        ] {
            harness::netns::sh(ns.cmd("ip").args(args));
        }
    }
    let out_file = dir.join("bootstrap-out.json");
    let out = ns
        .cmd(workspace_bin("pilot-agent"))
        .current_dir(dir)
        .env_clear()
        .envs(env)
        .args([
            "bootstrap",
            case["type"].as_str().expect("type"),
            "--output",
        ])
        .arg(&out_file)
        .output()
        .expect("run pilot-agent bootstrap");
    let code = out.status.code().unwrap_or(-1);
    let boot = std::fs::read_to_string(&out_file).ok().map(|t| {
        let t = t.replace(&dir.display().to_string(), "/CASE");
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("our bootstrap is not JSON: {e}"))
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default().to_string();
    (code, boot, last)
}

/// Build metadata that names the binary, not the inputs: `ISTIO_VERSION` (Istio's build says
/// the version `scripts/cluster/build.sh` stamps, `1.31-dev`; ours its release) unless the case
/// sets it.
fn neutralise(case: &Value, boot: &mut Value) {
    if case["env"].get("ISTIO_META_ISTIO_VERSION").is_none()
        && let Some(meta) = boot
            .pointer_mut("/node/metadata")
            .and_then(Value::as_object_mut)
    {
        meta.remove("ISTIO_VERSION");
    }
}

/// JSON with object keys sorted, compact: "byte for byte after JSON normalisation".
fn canonical(v: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let sorted: BTreeMap<&String, Value> =
                    m.iter().map(|(k, v)| (k, sort(v))).collect();
                Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "every recorded Go agent bootstrap compared in one pass, the differences reported together"
)]
fn bootstraps_match_the_recorded_go_agent() {
    if !(require_root() && require_bin("ip")) {
        return;
    }
    let Some(template) = template() else { return };
    let dir = data_dir();
    let cases = json_lines(&dir.join("cases.jsonl"));
    assert!(
        cases.len() >= 500,
        "expected at least 500 cases, found {}",
        cases.len()
    );
    let sections: HashMap<String, Value> = json_lines(&dir.join("sections.jsonl"))
        .into_iter()
        .map(|v| {
            (
                v["hash"].as_str().expect("hash").to_string(),
                v["value"].clone(),
            )
        })
        .collect();
    let recorded: HashMap<String, Value> = json_lines(&dir.join("recorded.jsonl"))
        .into_iter()
        .map(|v| (v["id"].as_str().expect("id").to_string(), v))
        .collect();
    assert_eq!(
        recorded.len(),
        cases.len(),
        "recorded.jsonl does not answer every case: re-record"
    );
    let known: BTreeMap<String, String> = std::fs::read_to_string(dir.join("deliberate.txt"))
        .expect("deliberate.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (id, reason) = l.split_once(' ').unwrap_or((l, ""));
            assert!(
                !reason.trim().is_empty(),
                "deliberate.txt: `{l}` gives no reason"
            );
            (id.to_string(), reason.trim().to_string())
        })
        .collect();

    let workers = 4;
    let scratch = tempfile::tempdir().expect("tempdir");
    let results: Vec<(usize, Answer)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (cases, template) = (&cases, &template);
                let case_dir = scratch.path().join(format!("w{w}"));
                s.spawn(move || {
                    (w..cases.len())
                        .step_by(workers)
                        .map(|i| (i, ours(&cases[i], &case_dir, template)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("worker"))
            .collect()
    });

    let (mut byte_equal, mut proto_equal, mut refused) = (0usize, 0usize, 0usize);
    let mut failures = Vec::new();
    for (i, (code, boot, stderr)) in results {
        let case = &cases[i];
        let id = case["id"].as_str().expect("id");
        let rec = &recorded[id];
        let istio_code = rec["exit"].as_i64().expect("exit");
        let istio_boot = rec["bootstrap"].as_object().map(|keys| {
            Value::Object(
                keys.iter()
                    .map(|(k, h)| (k.clone(), sections[h.as_str().expect("hash")].clone()))
                    .collect(),
            )
        });
        let mut diffs = Vec::new();
        let mut how = "";
        match (istio_boot, boot) {
            (None, None) if (istio_code == 0) == (code == 0) => how = "both refused",
            (Some(mut want), Some(mut got)) => {
                neutralise(case, &mut want);
                neutralise(case, &mut got);
                if canonical(&want) == canonical(&got) {
                    how = "byte";
                } else {
                    compare::compare("", &want, &got, &mut diffs);
                    if diffs.is_empty() {
                        how = "proto";
                    }
                }
            }
            (want, got) => diffs.push(format!(
                "istio exit {istio_code} ({}), ours exit {code} ({}) {}",
                if want.is_some() {
                    "bootstrap"
                } else {
                    "no bootstrap"
                },
                if got.is_some() {
                    "bootstrap"
                } else {
                    "no bootstrap"
                },
                if got.is_none() { stderr.as_str() } else { "" }
            )),
        }
        match (known.get(id), diffs.is_empty()) {
            (Some(reason), true) => failures.push(format!(
                "{id}: listed in deliberate.txt ({reason}) but now equals Istio: remove the line"
            )),
            (Some(_), false) => {}
            (None, true) => match how {
                "byte" => byte_equal += 1,
                "proto" => proto_equal += 1,
                _ => refused += 1,
            },
            (None, false) => failures.push(format!(
                "{id}: {}\n    {}",
                diffs
                    .iter()
                    .take(6)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n    "),
                case
            )),
        }
    }
    failures.sort();
    eprintln!(
        "bootstrap: {} cases, {} equal ({byte_equal} bootstraps byte for byte after JSON normalisation, {proto_equal} only under proto rules, {refused} refused by both), {} deliberate",
        cases.len(),
        byte_equal + proto_equal + refused,
        known.len()
    );
    assert!(
        failures.is_empty(),
        "{} differences from Istio's recorded bootstraps:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
