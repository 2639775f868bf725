//! The 27 conformance cases of ../shared/conformance/istio-iptables, run through the real CLI
//! entry point with each case's host state injected (addresses, resolv.conf), byte for byte.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use iptables_init::{HostInputs, run_cli_with};

mod conformance {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/src/conformance.rs"
    ));
}

fn corpus() -> Option<PathBuf> {
    conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-iptables")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .map(String::from)
        .collect()
}

fn addresses(ipv6: bool) -> Vec<IpAddr> {
    let list: &[&str] = if ipv6 {
        &["127.0.0.1", "::1", "2001:db8::240", "fe80::1"]
    } else {
        &["127.0.0.1", "240.240.240.240", "::1", "fe80::1"]
    };
    list.iter()
        .map(|a| a.parse().expect("test address"))
        .collect()
}

#[test]
fn all_conformance_cases_byte_for_byte() {
    let Some(dir) = corpus() else { return };
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("args").is_file())
        .collect();
    cases.sort();
    assert_eq!(cases.len(), 27, "expected 27 cases in {}", dir.display());
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let host_line = std::fs::read_to_string(case.join("host")).expect("host file");
        let ipv6 = match host_line.trim() {
            "ipv6=true" => true,
            "ipv6=false" => false,
            other => panic!("{name}: bad host file {other:?}"),
        };
        let resolv = case.join("resolv.conf");
        let host = HostInputs {
            addresses: Some(addresses(ipv6)),
            resolv_conf: if resolv.is_file() {
                resolv
            } else {
                tmp.path().join("absent-resolv.conf")
            },
            users: Some(HashMap::new()),
            groups: Some(HashMap::new()),
        };
        let out = tmp.path().join(format!("{name}.stream"));
        let mut env: HashMap<String, String> = lines(&case.join("env"))
            .into_iter()
            .filter_map(|l| {
                l.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        env.insert("DRY_RUN_FILE_PATH".into(), out.display().to_string());
        let args: Vec<OsString> = lines(&case.join("args"))
            .into_iter()
            .map(OsString::from)
            .collect();
        let code = run_cli_with(args, &env, &host);
        let expected_file = if case.join("expected-cli").is_file() {
            "expected-cli"
        } else {
            "expected"
        };
        let expected = std::fs::read_to_string(case.join(expected_file)).expect("expected");
        let got = std::fs::read_to_string(&out).unwrap_or_default();
        if code != 0 || got != expected {
            failures.push(format!(
                "--- {name}: exit {code}\n{}",
                diff(&expected, &got)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn diff(expected: &str, got: &str) -> String {
    let e: Vec<&str> = expected.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let mut out = String::new();
    for i in 0..e.len().max(g.len()) {
        let (a, b) = (e.get(i).copied(), g.get(i).copied());
        if a != b {
            out.push_str(&format!(
                "line {}: expected {:?}\n         got      {:?}\n",
                i + 1,
                a,
                b
            ));
        }
    }
    out
}

#[test]
fn stdout_is_not_required_but_file_is_written_once_per_run() {
    // The stream written to DRY_RUN_FILE_PATH ends with the final state dump.
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("s");
    let env = HashMap::from([("DRY_RUN_FILE_PATH".to_string(), out.display().to_string())]);
    let host = HostInputs {
        addresses: Some(addresses(false)),
        resolv_conf: tmp.path().join("none"),
        users: Some(HashMap::new()),
        groups: Some(HashMap::new()),
    };
    let code = run_cli_with(["-n", "-u", "1337"].map(OsString::from), &env, &host);
    assert_eq!(code, 0);
    let s = std::fs::read_to_string(&out).expect("stream");
    assert!(
        s.starts_with("iptables-save\nip6tables-save\n* nat\n"),
        "{s}"
    );
    assert!(s.ends_with("COMMIT\niptables-save\n"), "{s}");
}

#[test]
fn invalid_input_exits_non_zero_and_writes_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("s");
    let env = HashMap::from([("DRY_RUN_FILE_PATH".to_string(), out.display().to_string())]);
    let host = HostInputs {
        addresses: Some(addresses(false)),
        resolv_conf: tmp.path().join("none"),
        users: Some(HashMap::new()),
        groups: Some(HashMap::new()),
    };
    for bad in [
        &["-n", "-p", "0"][..],
        &["-n", "-m", "BOGUS"],
        &["-n", "-i", "300.0.0.0/8"],
        &["-n", "-u", "nosuchuser"],
    ] {
        let code = run_cli_with(bad.iter().map(OsString::from), &env, &host);
        assert_eq!(code, 1, "{bad:?}");
        assert!(!out.exists(), "{bad:?} wrote a stream");
    }
    // No usable local address: Istio's error, exit 1.
    let host = HostInputs {
        addresses: Some(vec!["127.0.0.1".parse().unwrap()]),
        ..host
    };
    assert_eq!(run_cli_with(["-n"].map(OsString::from), &env, &host), 1);
    // --redirect-dns with an unreadable resolv.conf: exit 1.
    let host = HostInputs {
        addresses: Some(addresses(false)),
        ..host
    };
    assert_eq!(
        run_cli_with(["-n", "--redirect-dns"].map(OsString::from), &env, &host),
        1
    );
    assert!(!out.exists());
}

fn host_v4(tmp: &Path) -> HostInputs {
    HostInputs {
        addresses: Some(addresses(false)),
        resolv_conf: tmp.join("none"),
        users: Some(HashMap::new()),
        groups: Some(HashMap::new()),
    }
}

#[test]
fn help_exits_zero() {
    let tmp = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        run_cli_with(
            ["--help"].map(OsString::from),
            &HashMap::new(),
            &host_v4(tmp.path())
        ),
        0
    );
    assert_eq!(
        run_cli_with(
            ["-h"].map(OsString::from),
            &HashMap::new(),
            &host_v4(tmp.path())
        ),
        0
    );
}

#[test]
fn dry_run_cleanup_only_records_istio_style_cleanup_commands() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("s");
    let env = HashMap::from([("DRY_RUN_FILE_PATH".to_string(), out.display().to_string())]);
    let args = [
        "-n",
        "-u",
        "1337",
        "-g",
        "1337",
        "--cleanup-only",
        "-c",
        "eth9",
    ]
    .map(OsString::from);
    assert_eq!(run_cli_with(args, &env, &host_v4(tmp.path())), 0);
    let s = std::fs::read_to_string(&out).expect("stream");
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.first(), Some(&"iptables-save"));
    assert_eq!(lines.last(), Some(&"iptables-save"));
    // Deletions in reverse order of creation; non-jump rules inside ISTIO_* chains are not
    // deleted one by one (their chains are flushed); then every chain is flushed and deleted.
    assert!(
        lines.contains(&"iptables -t nat -D OUTPUT -j ISTIO_OUTPUT"),
        "{s}"
    );
    assert!(
        lines.contains(&"iptables -t nat -D PREROUTING -i eth9 -j RETURN"),
        "{s}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("-D ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN")),
        "{s}"
    );
    let f = lines
        .iter()
        .position(|l| *l == "iptables -t nat -F ISTIO_OUTPUT")
        .expect("flush");
    let x = lines
        .iter()
        .position(|l| *l == "iptables -t nat -X ISTIO_OUTPUT")
        .expect("delete");
    let d = lines
        .iter()
        .position(|l| *l == "iptables -t nat -D OUTPUT -j ISTIO_OUTPUT")
        .expect("jump delete");
    assert!(d < f && f < x, "{s}");
    assert!(!s.contains("-A "), "cleanup must not add rules: {s}");
}

#[test]
fn dry_run_stdout_equals_file() {
    // Checked end to end in tests/tests/iptables/iptables.rs (stdout of the real binary); here the
    // stream for an IPv6 host ends with both final dumps.
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("s");
    let env = HashMap::from([("DRY_RUN_FILE_PATH".to_string(), out.display().to_string())]);
    let host = HostInputs {
        addresses: Some(addresses(true)),
        ..host_v4(tmp.path())
    };
    assert_eq!(
        run_cli_with(["-n", "-u", "1337"].map(OsString::from), &env, &host),
        0
    );
    let s = std::fs::read_to_string(&out).expect("stream");
    assert!(
        s.ends_with("COMMIT\niptables-save\nip6tables-save\n"),
        "{s}"
    );
    assert!(
        s.contains("-A ISTIO_OUTPUT -o lo -s ::6/128 -j RETURN\n"),
        "{s}"
    );
}
