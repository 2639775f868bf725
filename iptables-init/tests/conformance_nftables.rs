//! The 28 cases of ../shared/conformance/istio-nftables through the real CLI entry point, with
//! each case's host state injected (addresses, resolv.conf): the `--dry-run` script equals the
//! golden byte for byte (`expected-cli` where the command line cannot express the golden).

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
    conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-nftables")
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

fn host(ipv6: bool, resolv_conf: PathBuf) -> HostInputs {
    HostInputs {
        addresses: Some(addresses(ipv6)),
        resolv_conf,
        users: Some(HashMap::new()),
        groups: Some(HashMap::new()),
    }
}

fn diff(expected: &str, got: &str) -> String {
    let e: Vec<&str> = expected.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let mut out = String::new();
    for i in 0..e.len().max(g.len()) {
        let (a, b) = (e.get(i).copied(), g.get(i).copied());
        if a != b {
            out.push_str(&format!(
                "line {}: expected {a:?}\n         got      {b:?}\n",
                i + 1
            ));
        }
    }
    out
}

#[test]
fn all_28_nftables_cases_byte_for_byte() {
    let Some(dir) = corpus() else { return };
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("args").is_file())
        .collect();
    cases.sort();
    assert_eq!(cases.len(), 28, "expected 28 cases in {}", dir.display());
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let ipv6 = match std::fs::read_to_string(case.join("host"))
            .expect("host file")
            .trim()
        {
            "ipv6=true" => true,
            "ipv6=false" => false,
            other => panic!("{name}: bad host file {other:?}"),
        };
        let resolv = case.join("resolv.conf");
        let resolv = if resolv.is_file() {
            resolv
        } else {
            tmp.path().join("absent-resolv.conf")
        };
        let out = tmp.path().join(format!("{name}.nft"));
        let mut env: HashMap<String, String> = lines(&case.join("env"))
            .into_iter()
            .filter_map(|l| {
                l.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        env.insert("DRY_RUN_FILE_PATH".into(), out.display().to_string());
        // No nft on this PATH: a dry run must not need (or probe) it.
        env.insert(
            "PATH".into(),
            tmp.path().join("no-bin").display().to_string(),
        );
        let args: Vec<OsString> = lines(&case.join("args"))
            .into_iter()
            .map(OsString::from)
            .collect();
        let code = run_cli_with(args, &env, &host(ipv6, resolv));
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

fn dry_run(args: &[&str], env: &[(&str, &str)], ipv6: bool) -> (i32, Option<String>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("script");
    let mut env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.insert("DRY_RUN_FILE_PATH".into(), out.display().to_string());
    let code = run_cli_with(
        args.iter().map(OsString::from),
        &env,
        &host(ipv6, tmp.path().join("none")),
    );
    (code, std::fs::read_to_string(&out).ok())
}

#[test]
fn environment_twin_selects_nftables() {
    let (code, s) = dry_run(&["-n", "-u", "1337"], &[("NATIVE_NFTABLES", "true")], false);
    assert_eq!(code, 0);
    let s = s.expect("script");
    assert!(s.starts_with("add table inet istio-proxy-nat\n"), "{s}");
    let (code, s) = dry_run(
        &["-n", "-u", "1337", "--native-nftables=false"],
        &[("NATIVE_NFTABLES", "true")],
        false,
    );
    assert_eq!(code, 0);
    assert!(
        s.expect("stream").starts_with("iptables-save\n"),
        "flag beats env"
    );
}

#[test]
fn dry_run_cleanup_only_deletes_the_three_tables() {
    let (code, s) = dry_run(
        &["-n", "--native-nftables", "-u", "1337", "--cleanup-only"],
        &[],
        true,
    );
    assert_eq!(code, 0);
    assert_eq!(
        s.expect("script"),
        "add table inet istio-proxy-nat\ndelete table inet istio-proxy-nat\n\
         add table inet istio-proxy-mangle\ndelete table inet istio-proxy-mangle\n\
         add table inet istio-proxy-raw\ndelete table inet istio-proxy-raw\n"
    );
}

#[test]
fn capture_all_dns_and_outbound_port_excludes() {
    // Not covered by a golden: Istio's rule texts for --capture-all-dns and
    // --istio-local-outbound-ports-exclude.
    let (code, s) = dry_run(
        &[
            "-n",
            "--native-nftables",
            "-u",
            "1337",
            "-g",
            "1337",
            "--redirect-dns",
            "--capture-all-dns",
            "-o",
            "8080",
        ],
        &[],
        false,
    );
    assert_eq!(code, 0);
    let s = s.expect("script");
    let nat = "add rule inet istio-proxy-nat";
    let raw = "add rule inet istio-proxy-raw";
    for line in [
        format!("{nat} istio-output tcp dport 8080 counter return"),
        format!("{nat} istio-output udp dport 8080 counter return"),
        format!("{nat} istio-output counter jump istio-output-dns"),
        format!("{nat} istio-output-dns meta l4proto tcp tcp dport 53 counter redirect to :15053"),
        format!("{nat} istio-output-dns udp dport 53 counter redirect to :15053"),
        format!("{raw} prerouting counter jump istio-inbound"),
        format!("{raw} istio-output-dns udp dport 53 counter ct zone set 2"),
        format!("{raw} istio-inbound udp sport 53 counter ct zone set 1"),
    ] {
        assert!(s.lines().any(|l| l == line), "missing {line:?} in:\n{s}");
    }
    // The excludes come right after the jump to istio-output, before the 127.0.0.6 return.
    let pos = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle} in {s}"));
    assert!(pos("tcp dport 8080 counter return") < pos("ip saddr 127.0.0.6/32"));
}

#[test]
fn bad_input_is_rejected_before_anything_runs() {
    for bad in [
        &["-n", "--native-nftables", "-p", "0"][..],
        &["-n", "--native-nftables", "-m", "BOGUS"],
        &["-n", "--native-nftables", "-i", "300.0.0.0/8"],
        &["-n", "--native-nftables", "-u", "nosuchuser"],
    ] {
        let (code, s) = dry_run(bad, &[], false);
        assert_eq!(code, 1, "{bad:?}");
        assert!(s.is_none(), "{bad:?} wrote a script");
    }
    // A command line that does not parse is a usage error, as in Istio's pilot-agent.
    let (code, s) = dry_run(&["-n", "--native-nftables=maybe"], &[], false);
    assert_eq!(code, 255);
    assert!(s.is_none(), "an unparsable command line wrote a script");
}
