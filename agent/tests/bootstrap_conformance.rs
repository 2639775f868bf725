//! The 29 bootstrap cases of ../shared/conformance/istio-bootstrap (Istio's `TestGolden`
//! goldens), each run through the agent's real bootstrap generation from the case's
//! environment, `PROXY_CONFIG` and pod annotations, two ways: rendering Istio's own
//! `envoy_bootstrap.json` with our Go-template engine (`ISTIO_BOOTSTRAP`), and our built-in
//! bootstrap. Each result is compared with the golden after the README's normalisations, under
//! proto rules; real Envoy then validates every rendered bootstrap.

#[path = "bootstrap_conformance/compare.rs"]
mod compare;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use agent::testing::{Inputs, Platform};
use agent::{Config, NodeType, ProxyFlags};
use serde_json::{Map, Value, json};

const CASES: usize = 29;
/// Metadata keys the agent adds from its own defaults (not from a case input); reported only.
const AGENT_DEFAULT_KEYS: &[&str] = &["ENVOY_SKIP_DEPRECATED_LOGS"];
const LIGHTSTEP_TOKEN: &str = "abcdefg1234567";

#[allow(clippy::disallowed_methods)] // a prerequisite check: CI=true fails instead of skipping
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

mod conformance {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/src/conformance.rs"
    ));
}

fn corpus() -> Option<PathBuf> {
    conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-bootstrap")
}

fn cases(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut cases: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .expect("read corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("expected.json").is_file() && p.join("env").is_file())
        .map(|p| {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, p)
        })
        .collect();
    cases.sort();
    assert_eq!(
        cases.len(),
        CASES,
        "expected {CASES} cases in {}",
        dir.display()
    );
    cases
}

/// `KEY=VALUE` lines, values verbatim (the README's `env` format).
fn env_lines(path: &Path, env: &mut HashMap<String, String>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{}: bad line {line:?}", path.display()));
        env.insert(k.to_string(), v.to_string());
    }
}

/// How a case is generated.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    /// Istio's `envoy_bootstrap.json` through our template engine.
    IstioTemplate,
    /// Our built-in bootstrap.
    BuiltIn,
}

/// One generated case: its scratch directory and the bootstrap path.
struct Generated {
    _scratch: tempfile::TempDir,
    scratch: PathBuf,
    config_dir: PathBuf,
    bootstrap: PathBuf,
}

/// The README's "How to run a case", through the agent's own entry points (`Config::load`
/// with the case's environment, then `app::write_bootstrap`, as `pilot-agent bootstrap`).
fn generate(corpus: &Path, name: &str, case: &Path, way: Way) -> Result<Generated, String> {
    let template = corpus.join("envoy_bootstrap.json");
    generate_with(corpus, &template, name, case, way, &|_, _| {})
}

/// [`generate`] with Istio's template `template`, and `prepare` run on the scratch directory
/// and the environment last.
fn generate_with(
    corpus: &Path,
    template: &Path,
    name: &str,
    case: &Path,
    way: Way,
    prepare: &dyn Fn(&Path, &mut HashMap<String, String>),
) -> Result<Generated, String> {
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let s = scratch.path().canonicalize().map_err(|e| e.to_string())?;
    let annotations = case.join("pod/annotations");
    if annotations.is_file() {
        std::fs::create_dir_all(s.join("etc/istio/pod")).map_err(|e| e.to_string())?;
        std::fs::copy(&annotations, s.join("etc/istio/pod/annotations"))
            .map_err(|e| e.to_string())?;
    }
    let mut env = HashMap::new();
    env_lines(&corpus.join("common.env"), &mut env);
    env_lines(&case.join("env"), &mut env);
    let bootstrap_name = if name == "secure_metrics" {
        "default"
    } else {
        name
    };
    let config_dir = s.join("bootstrap").join(bootstrap_name);
    let mut pc: Value = serde_json::from_str(
        &std::fs::read_to_string(case.join("proxy-config.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("proxy-config.json: {e}"))?;
    pc["configPath"] = json!(config_dir.display().to_string());
    env.insert("PROXY_CONFIG".into(), pc.to_string());
    if way == Way::IstioTemplate {
        env.insert("ISTIO_BOOTSTRAP".into(), template.display().to_string());
    }
    prepare(&s, &mut env);
    let config = Config::load(Inputs {
        node_type: NodeType::Sidecar,
        flags: ProxyFlags {
            outlier_log_path: "/dev/stdout".into(),
            ..ProxyFlags::default()
        },
        env: &env,
        base_dir: s.clone(),
        interface_ips: vec![],
        is_root: false,
        cgroup_memory_limit: None,
    })
    .map_err(|e| format!("config: {e}"))?;
    let written = agent::write_bootstrap(&config, &Platform::none(), None)
        .map_err(|e| format!("bootstrap: {e:?}"))?;
    let expected = config_dir.join("envoy-rev.json");
    if written != expected {
        return Err(format!(
            "bootstrap written to {}, expected {}",
            written.display(),
            expected.display()
        ));
    }
    Ok(Generated {
        _scratch: scratch,
        scratch: s,
        config_dir,
        bootstrap: written,
    })
}

/// Applies `f` to every `(key, string value)` in the tree.
fn each_string(v: &mut Value, f: &mut impl FnMut(&str, &mut String)) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if let Value::String(s) = x {
                    f(k, s);
                } else {
                    each_string(x, f);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| each_string(x, f)),
        _ => {}
    }
}

/// Step 1: Istio's rewrites of the generated file (scratch dir as the temp dir).
fn rewrite_generated(name: &str, scratch: &Path, text: &str) -> Result<Value, String> {
    let text = text.replace(&scratch.display().to_string(), "/tmp");
    let mut v: Value =
        serde_json::from_str(&text).map_err(|e| format!("generated bootstrap is not JSON: {e}"))?;
    let keep_locality = name == "running" || name == "runningsds";
    each_string(&mut v, &mut |k, s| {
        if k == "access_token_file" && s.ends_with("lightstep_access_token.txt") {
            *s = "/test-path/lightstep_access_token.txt".into();
        }
        if k == "path" && s.ends_with("/XDS") {
            *s = "/tmp/XDS".into();
        }
        if !keep_locality && (k == "zone" || k == "region") {
            s.clear();
        }
    });
    Ok(v)
}

fn metadata(v: &mut Value) -> &mut Map<String, Value> {
    match v.pointer_mut("/node/metadata") {
        Some(Value::Object(m)) => m,
        _ => panic!("bootstrap without node.metadata"),
    }
}

/// The `http.<ip>_` inclusion prefixes of the golden become one per generated instance IP.
fn expand_pod_ip(golden: &mut Value, golden_ips: &[String], ips: &[String]) {
    let Some(Value::Array(patterns)) =
        golden.pointer_mut("/stats_config/stats_matcher/inclusion_list/patterns")
    else {
        return;
    };
    let is_pod_ip = |p: &Value| {
        p.get("prefix")
            .and_then(Value::as_str)
            .is_some_and(|s| golden_ips.iter().any(|ip| s == format!("http.{ip}_")))
    };
    let Some(first) = patterns.iter().position(is_pod_ip) else {
        return;
    };
    patterns.retain(|p| !is_pod_ip(p));
    for (i, ip) in ips.iter().enumerate() {
        patterns.insert(first + i, json!({ "prefix": format!("http.{ip}_") }));
    }
}

/// Steps 2 and 3: neutralise what the test injects, then compare. Returns the differences and
/// the reported (allowed) extra metadata keys.
fn check(name: &str, golden_text: &str, generated: &mut Value) -> (Vec<String>, Vec<String>) {
    let mut diffs = Vec::new();
    let mut golden: Value = serde_json::from_str(golden_text).expect("golden JSON");
    let socket = "./var/run/secrets/workload-spiffe-uds/socket";
    each_string(&mut golden, &mut |_, s| {
        if s == "./var/run/secrets/workload-spiffe-uds/test.sock" {
            *s = socket.into();
        }
    });
    let split_ips = |v: &Value| -> Vec<String> {
        v.as_str()
            .unwrap_or("")
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    let golden_ips = split_ips(&metadata(&mut golden)["INSTANCE_IPS"]);
    let ips = split_ips(
        metadata(generated)
            .get("INSTANCE_IPS")
            .unwrap_or(&Value::Null),
    );
    expand_pod_ip(&mut golden, &golden_ips, &ips);
    for v in [&mut golden, &mut *generated] {
        if let Some(node) = v.get_mut("node").and_then(Value::as_object_mut) {
            node.remove("id");
        }
    }
    let gm = metadata(&mut golden);
    if gm.get("WORKLOAD_IDENTITY_SOCKET_FILE") == Some(&json!("test.sock")) {
        gm.insert("WORKLOAD_IDENTITY_SOCKET_FILE".into(), json!("socket"));
    }
    let golden_pc = gm.remove("PROXY_CONFIG");
    let golden_version = gm.remove("ISTIO_VERSION");
    for k in ["INSTANCE_IPS", "PILOT_SAN"] {
        gm.remove(k);
    }
    let golden_keys: Vec<String> = gm.keys().cloned().collect();
    let m = metadata(generated);
    let pc = m.remove("PROXY_CONFIG");
    let version = m.remove("ISTIO_VERSION");
    for k in ["INSTANCE_IPS", "PILOT_SAN"] {
        m.remove(k);
    }
    if name == "running" || name == "runningsds" {
        compare::compare(
            "node.metadata.ISTIO_VERSION",
            &golden_version.unwrap_or_default(),
            &version.unwrap_or_default(),
            &mut diffs,
        );
    }
    // PROXY_CONFIG: every golden field but customConfigFile, equal; merged defaults allowed.
    match (golden_pc, pc) {
        (Some(Value::Object(want)), Some(Value::Object(got))) => {
            for (k, w) in want.iter().filter(|(k, _)| *k != "customConfigFile") {
                match got.get(k) {
                    Some(g) => compare::compare(
                        &format!("node.metadata.PROXY_CONFIG.{k}"),
                        w,
                        g,
                        &mut diffs,
                    ),
                    None => diffs.push(format!(
                        "node.metadata.PROXY_CONFIG.{k}: expected {w} got nothing"
                    )),
                }
            }
        }
        (w, g) => diffs.push(format!(
            "node.metadata.PROXY_CONFIG: expected {w:?} got {g:?}"
        )),
    }
    // Extra metadata keys: reported; a failure unless the agent adds them from its defaults.
    let mut reported = Vec::new();
    let extra: Vec<String> = m
        .keys()
        .filter(|k| !golden_keys.contains(k))
        .cloned()
        .collect();
    for k in extra {
        if AGENT_DEFAULT_KEYS.contains(&k.as_str()) {
            m.remove(&k);
            reported.push(k);
        }
    }
    compare::compare("", &golden, generated, &mut diffs);
    (diffs, reported)
}

/// One golden to meet: the case's name, the corpus folder with its inputs (`env`,
/// `proxy-config.json`, `pod/annotations`) and the golden file.
struct Golden {
    name: String,
    inputs: PathBuf,
    golden: PathBuf,
}

/// Generates and compares every case of the corpus one way; panics with every difference.
fn run_way(way: Way) {
    let Some(dir) = corpus() else { return };
    let goldens = cases(&dir)
        .into_iter()
        .map(|(name, inputs)| Golden {
            golden: inputs.join("expected.json"),
            name,
            inputs,
        })
        .collect();
    run_goldens(
        way,
        "Istio's goldens",
        &dir,
        &dir.join("envoy_bootstrap.json"),
        goldens,
    );
}

/// Generates each of `goldens` one way (Istio's `template` for [`Way::IstioTemplate`]) and
/// compares it with its golden; panics with every difference.
fn run_goldens(way: Way, label: &str, dir: &Path, template: &Path, goldens: Vec<Golden>) {
    let total = goldens.len();
    let mut failures = Vec::new();
    let mut passed = 0;
    let mut reported = Vec::new();
    for Golden {
        name,
        inputs: case,
        golden,
    } in goldens
    {
        let g = match generate_with(dir, template, &name, &case, way, &|_, _| {}) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let text = std::fs::read_to_string(&g.bootstrap).expect("read generated bootstrap");
        let mut generated = match rewrite_generated(&name, &g.scratch, &text) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let golden = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e}", golden.display()));
        let (mut diffs, extra) = check(&name, &golden, &mut generated);
        if !extra.is_empty() {
            reported.push(format!("{name}: {}", extra.join(",")));
        }
        let token = g.config_dir.join("lightstep_access_token.txt");
        match (name == "tracing_lightstep", std::fs::read_to_string(&token)) {
            (true, Ok(t)) if t == LIGHTSTEP_TOKEN => {}
            (true, got) => diffs.push(format!(
                "lightstep token file: expected {LIGHTSTEP_TOKEN:?} got {got:?}"
            )),
            (false, Ok(_)) => diffs.push(format!("{} exists", token.display())),
            (false, Err(_)) => {}
        }
        if diffs.is_empty() {
            passed += 1;
        } else {
            failures.push(format!("{name}:\n  {}", diffs.join("\n  ")));
        }
    }
    eprintln!("{way:?}: {passed}/{total} cases equal to {label}");
    if !reported.is_empty() {
        eprintln!(
            "{way:?}: extra node metadata from the agent's defaults: {}",
            reported.join("; ")
        );
    }
    assert!(
        failures.is_empty(),
        "{way:?}: {} of {total} cases differ from {label}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn istio_template_renders_every_golden() {
    run_way(Way::IstioTemplate);
}

#[test]
fn builtin_bootstrap_matches_every_golden() {
    run_way(Way::BuiltIn);
}

mod istio_release {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/src/istio_release.rs"
    ));
}

/// Cases of Istio's `TestGolden` at the targeted release.
const RELEASE_CASES: usize = 27;

/// The goldens of Istio's `TestGolden` at the targeted release (`pkg/bootstrap/testdata` of the
/// release's module), with the template that release ships
/// (`tools/packaging/common/envoy_bootstrap.json`). The cases are the `base:` names of the
/// release's `instance_test.go`; each one's inputs are the corpus case of that name, used only
/// when the release's `.proxycfg` is byte for byte the corpus' (`secure_metrics` reads
/// `default.proxycfg`, as Istio's test does).
fn release_goldens() -> Option<(PathBuf, PathBuf, Vec<Golden>)> {
    let corpus = corpus()?;
    let module = istio_release::dir()?;
    let testdata = module.join("pkg/bootstrap/testdata");
    let test = std::fs::read_to_string(module.join("pkg/bootstrap/instance_test.go"))
        .expect("instance_test.go");
    let mut names: Vec<String> = Vec::new();
    for line in test.lines() {
        let Some(rest) = line.trim().strip_prefix("base:") else {
            continue;
        };
        let name = rest
            .trim()
            .trim_end_matches(',')
            .trim_matches('"')
            .to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    assert_eq!(
        names.len(),
        RELEASE_CASES,
        "Istio {}'s TestGolden cases: {names:?}",
        istio_release::RELEASE
    );
    let goldens = names
        .into_iter()
        .map(|name| {
            let inputs = corpus.join(&name);
            let proxycfg = [format!("{name}.proxycfg"), "default.proxycfg".into()]
                .into_iter()
                .map(|f| testdata.join(f))
                .find(|p| p.is_file())
                .expect("a proxycfg");
            let release = std::fs::read(&proxycfg).expect("release proxycfg");
            let ours = std::fs::read(inputs.join("proxycfg"))
                .unwrap_or_else(|e| panic!("corpus case {name}: {e}"));
            assert!(
                release == ours,
                "{}: the corpus' inputs for {name} were derived from another ProxyConfig",
                proxycfg.display()
            );
            Golden {
                golden: testdata.join(format!("{name}_golden.json")),
                name,
                inputs,
            }
        })
        .collect();
    let template = module.join("tools/packaging/common/envoy_bootstrap.json");
    Some((corpus, template, goldens))
}

/// [`release_goldens`], generated one way and compared.
fn run_release(way: Way) {
    let Some((corpus, template, goldens)) = release_goldens() else {
        return;
    };
    let label = format!("Istio {}'s goldens", istio_release::RELEASE);
    run_goldens(way, &label, &corpus, &template, goldens);
}

#[test]
fn release_template_renders_every_release_golden() {
    run_release(Way::IstioTemplate);
}

#[test]
fn builtin_bootstrap_matches_every_release_golden() {
    run_release(Way::BuiltIn);
}

/// The Envoy binary: `ENVOY_BIN`, else `<repo>/.tools/bin/envoy`; missing fails under CI.
#[allow(clippy::disallowed_methods)] // ENVOY_BIN, as the test harness reads it
fn envoy_bin() -> Option<PathBuf> {
    let p = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/envoy"));
    if p.is_file() {
        return Some(p);
    }
    assert!(
        !in_ci(),
        "Envoy missing at {} (set ENVOY_BIN or run scripts/setup.sh; required under CI=true)",
        p.display()
    );
    eprintln!(
        "SKIP: Envoy not found at {} (set ENVOY_BIN or run scripts/setup.sh)",
        p.display()
    );
    None
}

/// `envoy --mode validate` on a generated bootstrap, from its scratch directory.
fn validate(envoy: &Path, g: &Generated) -> std::process::Output {
    Command::new(envoy)
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "error",
            "-c",
        ])
        .arg(&g.bootstrap)
        .current_dir(&g.scratch)
        .output()
        .expect("run envoy")
}

/// Cases upstream Envoy 1.40 cannot load, with the extension type its error names: `ambient`
/// uses Istio's `metadata_discovery` bootstrap extension (only in Istio's Envoy build), and
/// `tracing_lightstep` the Lightstep tracer upstream Envoy no longer ships.
const UPSTREAM_REJECTS: &[(&str, &str)] = &[
    ("ambient", "istio.workload.BootstrapExtension"),
    ("tracing_lightstep", "envoy.config.trace.v3.LightstepConfig"),
];

/// `envoy --mode validate` on every rendered bootstrap, both ways: all accepted but the cases
/// in [`UPSTREAM_REJECTS`], which fail naming exactly that extension.
#[test]
fn rendered_bootstraps_validate_in_envoy() {
    let Some(dir) = corpus() else { return };
    let Some(envoy) = envoy_bin() else { return };
    let mut failures = Vec::new();
    let mut valid = Vec::new();
    for (name, case) in cases(&dir) {
        for way in [Way::IstioTemplate, Way::BuiltIn] {
            let g = match generate(&dir, &name, &case, way) {
                Ok(g) => g,
                Err(e) => {
                    failures.push(format!("{name} ({way:?}): {e}"));
                    continue;
                }
            };
            let out = validate(&envoy, &g);
            let log = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            match UPSTREAM_REJECTS.iter().find(|(c, _)| *c == name) {
                Some((_, ext)) => {
                    if out.status.success() || !log.contains(ext) {
                        failures.push(format!(
                            "{name} ({way:?}): expected Envoy to reject {ext}, got {}: {log}",
                            out.status
                        ));
                    }
                }
                None if out.status.success() => valid.push(format!("{name} ({way:?})")),
                None => failures.push(format!("{name} ({way:?}): Envoy rejects it: {log}")),
            }
        }
    }
    eprintln!(
        "Envoy validates {} of {} bootstraps; expected rejections: {:?}",
        valid.len(),
        2 * CASES,
        UPSTREAM_REJECTS
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The harness is not blind: `default`'s bootstrap differs from the `all` and `stats_inclusion`
/// goldens exactly where those cases add something.
#[test]
fn harness_reports_differences() {
    let Some(dir) = corpus() else { return };
    let g = generate(&dir, "default", &dir.join("default"), Way::BuiltIn).expect("default");
    let text = std::fs::read_to_string(&g.bootstrap).expect("read");
    for (other, needles) in [
        (
            "all",
            &[
                "static_resources.clusters: expected 7 items got 4",
                "admin.address.socket_address.port_value: expected 15005 got 15000",
                "stats_sinks: expected",
                "tracing: expected",
            ][..],
        ),
        (
            "stats_inclusion",
            &[
                "stats_config.stats_tags: expected 19 items got 16",
                "stats_config.histogram_bucket_settings: expected",
                "stats_config.stats_matcher.inclusion_list.patterns: expected 37 items got 13",
            ][..],
        ),
    ] {
        let mut generated = rewrite_generated("default", &g.scratch, &text).expect("json");
        let golden =
            std::fs::read_to_string(dir.join(other).join("expected.json")).expect("golden");
        let (diffs, _) = check(other, &golden, &mut generated);
        for needle in needles {
            assert!(
                diffs.iter().any(|d| d.starts_with(needle)),
                "{other}: no difference {needle:?} in {diffs:#?}"
            );
        }
    }
}

/// The README's socket-file step, taken instead of skipped: a live SDS server (standing in for
/// SPIRE's agent; ours, on its own runtime) already listens on `test.sock`, the golden's
/// `WORKLOAD_IDENTITY_SOCKET_FILE`. The agent must keep `sds-grpc` on that socket and switch
/// its own server to files only: the golden plus a `file-credential` metadata key and an
/// `sds-files-grpc` cluster on `./var/run/secrets/credential-uds/files-socket`, both ways.
#[test]
fn external_sds_socket_gives_the_golden_plus_the_file_only_cluster() {
    let Some(dir) = corpus() else { return };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for way in [Way::BuiltIn, Way::IstioTemplate] {
        let stop = tokio_util::sync::CancellationToken::new();
        let prepare = |s: &Path, env: &mut HashMap<String, String>| {
            let socket = s.join("var/run/secrets/workload-spiffe-uds/test.sock");
            let manager = sds::SecretManager::new(
                std::sync::Arc::new(sds::Config::defaults(s)),
                std::sync::Arc::new(sds::Metrics::new(&mut Default::default())),
            )
            .expect("manager");
            let server = rt
                .block_on(sds::SdsServer::bind(&socket, manager))
                .expect("external SDS server");
            rt.spawn(server.run(stop.clone()));
            env.insert("WORKLOAD_IDENTITY_SOCKET_FILE".into(), "test.sock".into());
        };
        let template = dir.join("envoy_bootstrap.json");
        let g = generate_with(
            &dir,
            &template,
            "default",
            &dir.join("default"),
            way,
            &prepare,
        )
        .unwrap_or_else(|e| panic!("{way:?}: {e}"));
        let text = std::fs::read_to_string(&g.bootstrap).expect("read");
        let mut generated = rewrite_generated("default", &g.scratch, &text).expect("json");
        // The golden's own socket file is kept (check() then maps both sides to `socket`).
        assert_eq!(
            metadata(&mut generated)["WORKLOAD_IDENTITY_SOCKET_FILE"],
            json!("test.sock")
        );
        assert!(
            text.contains("\"./var/run/secrets/workload-spiffe-uds/test.sock\""),
            "{way:?}: sds-grpc is not on test.sock"
        );
        each_string(&mut generated, &mut |_, s| {
            if s == "./var/run/secrets/workload-spiffe-uds/test.sock" {
                *s = "./var/run/secrets/workload-spiffe-uds/socket".into();
            }
        });
        metadata(&mut generated).insert("WORKLOAD_IDENTITY_SOCKET_FILE".into(), json!("socket"));
        let mut golden: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("default/expected.json")).expect("golden"),
        )
        .expect("golden JSON");
        metadata(&mut golden).insert("file-credential".into(), json!("true"));
        let clusters = golden["static_resources"]["clusters"]
            .as_array_mut()
            .expect("clusters");
        let at = clusters
            .iter()
            .position(|c| c["name"] == "sds-grpc")
            .expect("sds-grpc");
        let mut files = clusters[at].clone();
        files["name"] = json!("sds-files-grpc");
        files["alt_stat_name"] = json!("sds-files-grpc;");
        files["load_assignment"]["cluster_name"] = json!("sds-files-grpc");
        files["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["pipe"]
            ["path"] = json!("./var/run/secrets/credential-uds/files-socket");
        clusters.insert(at + 1, files);
        let (diffs, _) = check("default", &golden.to_string(), &mut generated);
        assert!(diffs.is_empty(), "{way:?}:\n  {}", diffs.join("\n  "));
        if let Some(envoy) = envoy_bin() {
            let out = validate(&envoy, &g);
            assert!(
                out.status.success(),
                "{way:?}: Envoy rejects the file-only bootstrap: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        stop.cancel();
    }
}

/// Settings no golden covers, built in and through Istio's template, validated by real Envoy:
/// dual stack, localhost-only metrics, PROXY protocol on 15021 (built in only: Istio's template
/// has a trailing comma there), self discovery, a Datadog tracer over TLS, ISTIO_MUTUAL metrics
/// service with TCP keepalive, an access-log service with MUTUAL TLS and SANs, histogram
/// buckets and a 90s flush interval (Go would print `1m30s`, which Envoy rejects, so the
/// template way uses 10s).
#[test]
fn extras_validate_in_envoy() {
    let Some(envoy) = envoy_bin() else { return };
    for way in [Way::BuiltIn, Way::IstioTemplate] {
        extras(&envoy, way);
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one bootstrap carries every extra setting, so Envoy validates them together; the settings and their checks read as one list"
)]
fn extras(envoy: &Path, way: Way) {
    let flush = if way == Way::BuiltIn { "90s" } else { "10s" };
    let dir = tempfile::tempdir().expect("tempdir");
    let s = dir.path().canonicalize().expect("canonical");
    std::fs::create_dir_all(s.join("etc/istio/pod")).expect("pod dir");
    std::fs::write(
        s.join("etc/istio/pod/annotations"),
        format!(
            "sidecar.istio.io/statsFlushInterval=\"{flush}\"\nsidecar.istio.io/statsEvictionInterval=\"180s\"\nsidecar.istio.io/statsHistogramBuckets=\"{{\\\"cluster\\\":[0.5,1,5]}}\"\n"
        ),
    )
    .expect("annotations");
    let pc = json!({
        "configPath": s.join("proxy").display().to_string(),
        "proxyMetadata": {"METRICS_LOCALHOST_ACCESS_ONLY": "true"},
        "tracing": {"datadog": {"address": "$(HOST_IP):8126"}, "tlsSettings": {"mode": "SIMPLE", "caCertificates": "/etc/dd/ca.pem", "subjectAltNames": ["dd.example"]}},
        "envoyMetricsService": {"address": "ms.example:15000", "tlsSettings": {"mode": "ISTIO_MUTUAL"}, "tcpKeepalive": {"probes": 3, "time": "10s", "interval": "5s"}},
        "envoyAccessLogService": {"address": "als.example:15000", "tlsSettings": {"mode": "MUTUAL", "clientCertificate": "/c.pem", "privateKey": "/k.pem", "caCertificates": "/ca.pem", "sni": "als"}},
        "extraStatTags": ["x_tag"],
    });
    let mut env: HashMap<String, String> = [
        ("INSTANCE_IP", "198.18.0.2"),
        ("ISTIO_DUAL_STACK", "true"),
        ("HOST_IP", "198.18.0.1"),
        ("POD_NAME", "p"),
        ("POD_NAMESPACE", "ns"),
        ("ISTIO_META_ENABLE_SELF_DISCOVERY", "true"),
        ("ENVOY_SECURE_METRICS_PORT", "15091"),
        ("PROXY_CONFIG", &pc.to_string()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    match way {
        Way::BuiltIn => env.insert(
            "ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL".into(),
            "true".into(),
        ),
        Way::IstioTemplate => env.insert(
            "ISTIO_BOOTSTRAP".into(),
            corpus()
                .map(|d| d.join("envoy_bootstrap.json").display().to_string())
                .unwrap_or_default(),
        ),
    };
    let config = Config::load(Inputs {
        node_type: NodeType::Sidecar,
        flags: ProxyFlags::default(),
        env: &env,
        base_dir: s.clone(),
        interface_ips: vec!["fd00::2".parse().expect("ip")],
        is_root: false,
        cgroup_memory_limit: None,
    })
    .expect("config");
    let written = agent::write_bootstrap(&config, &Platform::none(), None).expect("bootstrap");
    let b: Value =
        serde_json::from_str(&std::fs::read_to_string(&written).expect("read")).expect("json");
    if way == Way::IstioTemplate && !env["ISTIO_BOOTSTRAP"].ends_with(".json") {
        return; // corpus absent (reported by corpus()).
    }
    assert_eq!(b["stats_flush_interval"], flush, "{way:?}");
    assert_eq!(b["stats_eviction_interval"], "180s");
    let clusters = b["static_resources"]["clusters"]
        .as_array()
        .expect("clusters");
    let names: Vec<&str> = clusters.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "prometheus_stats",
            "agent",
            "sds-grpc",
            "xds-grpc",
            "datadog_agent",
            "envoy_metrics_service",
            "envoy_accesslog_service",
            "local_cluster"
        ]
    );
    assert_eq!(
        clusters[4]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
            ["address"],
        "198.18.0.1",
        "$(HOST_IP) replaced"
    );
    let ms_tls = &clusters[5]["transport_socket"]["typed_config"];
    assert_eq!(ms_tls["sni"], "envoy_metrics_service");
    assert_eq!(
        ms_tls["common_tls_context"]["alpn_protocols"],
        json!(["istio", "h2"])
    );
    assert_eq!(
        clusters[6]["transport_socket"]["typed_config"]["common_tls_context"]["tls_certificate_sds_secret_configs"]
            [0]["name"],
        "file-cert:/c.pem~/k.pem"
    );
    let listeners = b["static_resources"]["listeners"]
        .as_array()
        .expect("listeners");
    assert_eq!(listeners[0]["name"], "127.0.0.1_15090");
    assert_eq!(listeners[1]["name"], "0.0.0.0_15091");
    let extra = &listeners[2];
    assert!(
        extra["additional_addresses"].is_array() || extra["additionalAddresses"].is_array(),
        "dual stack ({way:?})"
    );
    let out = Command::new(envoy)
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "error",
            "-c",
        ])
        .arg(&written)
        .current_dir(&s)
        .output()
        .expect("run envoy");
    assert!(
        out.status.success(),
        "Envoy rejects the {way:?} bootstrap: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
