//! `--native-nftables` applied over netlink from istio-iptables itself, checked against the
//! real `nft`:
//!
//! - for each of Istio's 28 nftables goldens, the ruleset the kernel holds after our run equals
//!   the one after `nft -f` of the golden script, both as `nft list ruleset` and as the
//!   kernel's bytecode (`nft --debug=netlink list ruleset`), with a `PATH` that holds no `nft`
//!   and no iptables (only `ip`, which TPROXY's policy routes use);
//! - a transaction the kernel refuses half way leaves the old ruleset whole, and the error
//!   names the change that was refused.
//!
//! `nft` is used here only to list and to apply the goldens for comparison.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use harness::{Netns, require_bin, require_root, workspace_bin};

fn prerequisites() -> bool {
    require_root() && require_bin("nft") && require_bin("ip")
}

/// Groups the goldens name that a test host may lack, swapped for groups that exist
/// everywhere (daemon = 1, bin = 2 on Debian and Fedora), on both sides of the comparison.
const GROUP_SWAPS: [(&str, &str); 2] = [("ftp", "daemon"), ("java", "bin")];

fn swap_groups(text: &str) -> String {
    let mut out = text.to_string();
    for (from, to) in GROUP_SWAPS {
        out = out
            .replace(&format!("skgid {from} "), &format!("skgid {to} "))
            .replace(&format!("skgid != {from} "), &format!("skgid != {to} "))
            .replace(&format!(",{from}"), &format!(",{to}"))
            .replace(&format!("={from},"), &format!("={to},"));
    }
    out
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `nft list ruleset`, and the bytecode listing with rule handles (and the handle of the rule
/// before) and anonymous set numbers dropped: they follow creation order, which is not part of
/// the ruleset (ours are created chain by chain, nft's in script order).
fn rulesets(ns: &Netns) -> (String, String) {
    let text = stdout_of(ns.cmd("nft").args(["list", "ruleset"]));
    let code = stdout_of(ns.cmd("nft").args(["--debug=netlink", "list", "ruleset"]))
        .lines()
        .map(|l| {
            let l = match l.strip_prefix("inet ") {
                Some(rest) if !l.starts_with("  ") => {
                    // "inet <table> <chain> <handle> [<handle of the rule before>]"
                    let mut words: Vec<&str> = rest.split_whitespace().collect();
                    while words.last().is_some_and(|w| w.parse::<u64>().is_ok()) {
                        words.pop();
                    }
                    format!("inet {}", words.join(" "))
                }
                _ => l.to_string(),
            };
            normalize_sets(&l)
        })
        .collect::<Vec<_>>()
        .join("\n");
    (text, code)
}

fn normalize_sets(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find("__set") {
        out.push_str(&rest[..i + 5]);
        rest = rest[i + 5..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// A directory holding only `ip`: what our run may start.
fn ip_only_path() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let ip = harness::prereq::find_bin("ip").expect("ip");
    std::os::unix::fs::symlink(ip, dir.path().join("ip")).expect("symlink ip");
    dir
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .lines()
        .map(String::from)
        .collect()
}

fn corpus() -> Option<Vec<PathBuf>> {
    let dir = harness::conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-nftables")?;
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("args").is_file())
        .collect();
    cases.sort();
    Some(cases)
}

#[test]
fn every_golden_ruleset_equals_nft_f_of_the_golden() {
    if !prerequisites() {
        return;
    }
    let Some(cases) = corpus() else { return };
    assert_eq!(cases.len(), 28);
    let path = ip_only_path();
    let ip = harness::prereq::find_bin("ip").expect("ip");
    let mut failures = Vec::new();
    let mut same = 0;
    for case in &cases {
        let name = case
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let ours = Netns::new("ngold");
        let theirs = Netns::new("ngoldnft");
        // The host state the case's flags expect, for our run (the golden is literal).
        ours.set_case_host(case);
        let env: Vec<(String, String)> = lines(&case.join("env"))
            .iter()
            .filter_map(|l| {
                let l = swap_groups(l);
                let (k, v) = l.split_once('=')?;
                Some((k.to_string(), v.to_string()))
            })
            .collect();
        let args: Vec<String> = lines(&case.join("args"))
            .into_iter()
            .filter(|a| a != "--dry-run")
            .collect();
        let run = output(
            Command::new(&ip)
                .args(["netns", "exec", ours.name()])
                .arg(workspace_bin("istio-iptables"))
                .env_clear()
                .env("PATH", path.path())
                .envs(env)
                .args(&args),
        );
        let golden = if case.join("expected-cli").is_file() {
            case.join("expected-cli")
        } else {
            case.join("expected")
        };
        let script = swap_groups(&std::fs::read_to_string(&golden).expect("golden"));
        let script_file = tempfile::NamedTempFile::new().expect("tempfile");
        std::fs::write(script_file.path(), &script).expect("write script");
        stdout_of(theirs.cmd("nft").arg("-f").arg(script_file.path()));
        if !run.status.success() {
            failures.push(format!(
                "{name}: our run failed ({}): {}",
                run.status,
                String::from_utf8_lossy(&run.stderr)
            ));
            continue;
        }
        let (our_text, our_code) = rulesets(&ours);
        let (nft_text, nft_code) = rulesets(&theirs);
        if our_text != nft_text {
            failures.push(format!(
                "{name}: nft list ruleset differs\n--- ours\n{our_text}\n--- nft -f\n{nft_text}"
            ));
        } else if our_code != nft_code {
            failures.push(format!(
                "{name}: same listing, different bytecode\n--- ours\n{our_code}\n--- nft -f\n{nft_code}"
            ));
        } else {
            same += 1;
        }
    }
    eprintln!(
        "FIGURE nftables over netlink: {same}/28 goldens give the ruleset and bytecode of nft -f"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The planned chains of the REDIRECT capture exist, but `prerouting` is a regular chain
/// holding a rule: the batch flushes the table, then the kernel refuses to turn that chain
/// into a base chain. Nothing of the batch may remain: the rule is still there.
#[test]
fn a_batch_the_kernel_refuses_half_way_changes_nothing() {
    if !prerequisites() {
        return;
    }
    let ns = Netns::new("nrefuse");
    ns.add_lo_addr("198.18.0.240/32");
    let args = [
        "--native-nftables",
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "-m",
        "REDIRECT",
        "-i",
        "*",
        "-b",
        "*",
    ];
    let dry = stdout_of(
        ns.cmd(workspace_bin("istio-iptables"))
            .arg("--dry-run")
            .args(args),
    );
    let mut pre = String::from("add table inet istio-proxy-nat\n");
    for l in dry
        .lines()
        .filter(|l| l.starts_with("add chain inet istio-proxy-nat "))
    {
        let chain = l.split_whitespace().nth(4).expect("chain name");
        pre.push_str(&format!("add chain inet istio-proxy-nat {chain}\n"));
    }
    pre.push_str("add rule inet istio-proxy-nat prerouting counter accept\n");
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(file.path(), &pre).expect("write");
    stdout_of(ns.cmd("nft").arg("-f").arg(file.path()));
    let before = rulesets(&ns);
    let out = output(ns.cmd(workspace_bin("istio-iptables")).args(args));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refused add chain istio-proxy-nat prerouting")
            && err.contains("nothing was applied"),
        "{err}"
    );
    assert_eq!(rulesets(&ns), before, "a refused batch changed the ruleset");
}

/// 3,000 inbound ports: a batch of about 1 MB, far beyond a netlink socket's default send
/// buffer, still goes in as one transaction.
#[test]
fn a_batch_larger_than_the_socket_buffer_goes_in_whole() {
    if !prerequisites() {
        return;
    }
    let ns = Netns::new("nlarge");
    ns.add_lo_addr("198.18.0.240/32");
    let ports: Vec<String> = (1000..4000).map(|p| p.to_string()).collect();
    let out = output(
        ns.cmd(workspace_bin("istio-iptables"))
            .args([
                "--native-nftables",
                "-p",
                "15001",
                "-z",
                "15006",
                "-u",
                "1337",
            ])
            .args(["-m", "REDIRECT", "-i", "*", "-b"])
            .arg(ports.join(",")),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (text, _) = rulesets(&ns);
    let per_port = text
        .lines()
        .filter(|l| {
            l.contains("tcp dport ") && !l.contains("!=") && l.contains("jump istio-in-redirect")
        })
        .count();
    assert_eq!(per_port, 3000, "one rule per inbound port");
}
