//! istio-iptables `--native-nftables` end to end, with real nftables in network namespaces:
//!
//! - the capture works: outbound lands on 15001 with its original destination, inbound on
//!   15006 (TPROXY keeps the source), DNS on 15053, the proxy's uid and gid 1337 go straight
//!   out, IPv6 too;
//! - every corpus configuration is a ruleset the kernel takes; the same flags again leave the
//!   same `nft list ruleset` (100 times); alternating flag sets never leave the pod
//!   unredirected; a run killed at a random point is repaired by the next;
//! - switching a pod between iptables and nftables, either way, leaves nothing of the other;
//! - without `nft` on `PATH` the run applies all the same (netlink); bad flags change nothing.
//!
//! Each loop runs up to its target within a time budget and asserts on every iteration; the
//! figures are printed (`--no-capture`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::iptables_reliability::{Rng, probe_loop};
use harness::{Netns, assert_eventually, require_bin, require_root, veth, workspace_bin};

const POD: &str = "198.18.0.1";
const PEER: &str = "198.18.0.2";
const APP_UID: u32 = 1000;
const PROXY_ID: u32 = 1337;

fn nft_prerequisites() -> bool {
    require_root() && require_bin("nft") && require_bin("ip")
}

fn both_prerequisites() -> bool {
    nft_prerequisites() && require_bin("iptables-save") && require_bin("ip6tables-save")
}

/// Istio's injection arguments with `-m`, `-b` and `-d` chosen, nftables on, plus `extra`.
fn nft_args(mode: &str, include: &str, exclude: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--native-nftables",
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "-g",
        "1337",
        "-m",
        mode,
        "-i",
        "*",
        "-x",
        "",
        "-b",
        include,
        "-d",
        exclude,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn run(ns: &Netns, args: &[String]) -> Output {
    ns.cmd(workspace_bin("istio-iptables"))
        .args(args)
        .output()
        .expect("run istio-iptables")
}

fn apply(ns: &Netns, args: &[String], what: &str) {
    let out = run(ns, args);
    assert!(
        out.status.success(),
        "{what}: istio-iptables {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `nft list ruleset` with the packet counters zeroed (they count probe traffic).
fn ruleset(ns: &Netns) -> String {
    stdout_of(ns.cmd("nft").args(["list", "ruleset"]))
        .lines()
        .map(|l| match l.find("counter packets ") {
            Some(i) => {
                let rest: Vec<&str> = l[i..].split_whitespace().skip(5).collect();
                format!("{}counter {}", &l[..i], rest.join(" "))
            }
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The ruleset, the iptables rule sets of both families, and the TPROXY policy routing.
fn snapshot(ns: &Netns) -> String {
    let mut out = ruleset(ns);
    for save in ["iptables-save", "ip6tables-save"] {
        if harness::prereq::find_bin(save).is_some() {
            let text = stdout_of(&mut ns.cmd(save));
            out.push_str(&format!("\n== {save}, lines naming our chains\n"));
            for l in text.lines().filter(|l| l.contains("ISTIO")) {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    for fam in ["-4", "-6"] {
        out.push_str(&format!("\n== ip {fam} rule\n"));
        out.push_str(&stdout_of(ns.cmd("ip").args([fam, "rule", "show"])));
    }
    out
}

fn diff(expected: &str, got: &str) -> String {
    let e: Vec<&str> = expected.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let mut out = String::new();
    for l in e.iter().filter(|l| !g.contains(l)) {
        out.push_str(&format!("- {l}\n"));
    }
    for l in g.iter().filter(|l| !e.contains(l)) {
        out.push_str(&format!("+ {l}\n"));
    }
    if out.is_empty() {
        out.push_str("(same lines, different order or count)\n");
    }
    out
}

/// A namespace detected as dual stack, with a resolv.conf nameserver for the DNS rules.
fn host_ns(hint: &str) -> Netns {
    let ns = Netns::new(hint);
    ns.add_lo_addr("198.18.0.240/32");
    harness::netns::sh(
        ns.cmd("ip")
            .args(["-6", "addr", "add", "fd00::240/128", "dev", "lo"]),
    );
    ns.set_resolv_conf(&format!("nameserver {PEER}\n"));
    ns
}

/// Pod and peer joined by a veth pair, both families.
fn pair(hint: &str) -> (Netns, Netns) {
    let pod = Netns::new(&format!("pod-{hint}"));
    let peer = Netns::new(&format!("peer-{hint}"));
    veth(
        &pod,
        &format!("{POD}/24,fd00::1/64"),
        &peer,
        &format!("{PEER}/24,fd00::2/64"),
    );
    pod.set_resolv_conf(&format!("nameserver {PEER}\n"));
    (pod, peer)
}

fn listen(ns: &Netns, addr: &str, transparent: bool) -> TcpListener {
    let addr: SocketAddr = addr.parse().expect("addr");
    ns.run(move || {
        use nix::sys::socket::{
            AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt,
            socket, sockopt,
        };
        let family = if addr.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
        setsockopt(&fd, sockopt::ReuseAddr, &true).expect("reuseaddr");
        if addr.is_ipv6() {
            // Beside the IPv4 listener on the same port.
            setsockopt(&fd, sockopt::Ipv6V6Only, &true).expect("IPV6_V6ONLY");
        }
        if transparent {
            setsockopt(&fd, sockopt::IpTransparent, &true).expect("IP_TRANSPARENT");
        }
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrStorage::from(addr),
        )
        .expect("bind");
        listen(&fd, Backlog::new(64).expect("backlog")).expect("listen");
        let l = TcpListener::from(fd);
        l.set_nonblocking(true).expect("nonblocking");
        l
    })
}

/// Runs `f` in `ns` on a thread whose fsuid/fsgid are `uid`/`gid` (its sockets belong to them).
fn as_ids<T: Send + 'static>(
    ns: &Netns,
    uid: u32,
    gid: u32,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    ns.run(move || {
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(gid));
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
        f()
    })
}

fn connect(ns: &Netns, uid: u32, gid: u32, dst: &str) -> TcpStream {
    let dst: SocketAddr = dst.parse().expect("dst");
    as_ids(ns, uid, gid, move || {
        TcpStream::connect_timeout(&dst, Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("connect {dst} as {uid}:{gid}: {e}"))
    })
}

fn accept(l: &TcpListener, what: &str) -> TcpStream {
    assert_eventually(Duration::from_secs(5), || {
        l.accept()
            .map(|(s, _)| s)
            .map_err(|e| format!("{what}: no connection yet ({e})"))
    })
}

fn original_dst(s: &TcpStream) -> SocketAddr {
    use nix::sys::socket::{getsockopt, sockopt};
    if s.local_addr().expect("local").is_ipv4() {
        let sin = getsockopt(&s.as_fd(), sockopt::OriginalDst).expect("SO_ORIGINAL_DST");
        SocketAddr::new(
            std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into(),
            u16::from_be(sin.sin_port),
        )
    } else {
        let sin6 = getsockopt(&s.as_fd(), sockopt::Ip6tOriginalDst).expect("IP6T_SO_ORIGINAL_DST");
        SocketAddr::new(
            std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).into(),
            u16::from_be(sin6.sin6_port),
        )
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

/// Outbound and inbound capture in both families, the proxy's uid and gid going straight out.
fn check_capture(pod: &Netns, peer: &Netns, tproxy: bool) {
    let out4 = listen(pod, "0.0.0.0:15001", false);
    let out6 = listen(pod, "[::]:15001", false);
    let in4 = listen(pod, "0.0.0.0:15006", tproxy);
    let peer4 = listen(peer, &format!("{PEER}:8080"), false);
    let peer6 = listen(peer, "[fd00::2]:8080", false);

    // The app's outbound: on 15001 with the original destination, both families.
    for (dst, l) in [
        (format!("{PEER}:8080"), &out4),
        ("[fd00::2]:8080".into(), &out6),
    ] {
        let _c = connect(pod, APP_UID, APP_UID, &dst);
        let s = accept(l, &format!("outbound capture of {dst}"));
        assert_eq!(original_dst(&s), addr(&dst), "original destination");
    }
    assert!(
        peer4.accept().is_err() && peer6.accept().is_err(),
        "captured traffic reached the peer"
    );

    // The proxy's uid, and its gid alone: straight to the peer.
    for (uid, gid) in [(PROXY_ID, PROXY_ID), (APP_UID, PROXY_ID)] {
        let _c = connect(pod, uid, gid, &format!("{PEER}:8080"));
        accept(&peer4, &format!("{uid}:{gid} direct to the peer"));
        let _c = connect(pod, uid, gid, "[fd00::2]:8080");
        accept(&peer6, &format!("{uid}:{gid} direct to the peer over IPv6"));
        assert!(
            out4.accept().is_err() && out6.accept().is_err(),
            "{uid}:{gid} was captured"
        );
    }

    // Inbound to the pod: on 15006.
    let _c = connect(peer, 0, 0, &format!("{POD}:8080"));
    let s = accept(&in4, "inbound capture");
    if tproxy {
        assert_eq!(s.local_addr().expect("local"), addr(&format!("{POD}:8080")));
        assert_eq!(
            s.peer_addr().expect("peer").ip().to_string(),
            PEER,
            "TPROXY keeps the source"
        );
    } else {
        assert_eq!(original_dst(&s), addr(&format!("{POD}:8080")));
        let in6 = listen(pod, "[::]:15006", false);
        let _c = connect(peer, 0, 0, "[fd00::1]:8080");
        let s = accept(&in6, "IPv6 inbound capture");
        assert_eq!(original_dst(&s), addr("[fd00::1]:8080"));
    }

    // Excluded inbound port: not captured.
    let l = listen(pod, "0.0.0.0:15021", false);
    let _c = connect(peer, 0, 0, &format!("{POD}:15021"));
    accept(&l, "excluded port 15021 direct");
    assert!(in4.accept().is_err(), "port 15021 was captured");
}

fn assert_clean(ns: &Netns, what: &str) {
    let rs = ruleset(ns);
    assert!(!rs.contains("istio"), "{what}: istio tables left:\n{rs}");
    let s = snapshot(ns);
    assert!(!s.contains("ISTIO"), "{what}: iptables rules left:\n{s}");
    assert!(
        !s.contains("lookup 133"),
        "{what}: TPROXY policy rule left:\n{s}"
    );
}

#[test]
fn redirect_mode_captures_both_families_and_cleans_up() {
    if !nft_prerequisites() {
        return;
    }
    let (pod, peer) = pair("nredir");
    let args = nft_args("REDIRECT", "*", "15090,15021,15020", &["--dual-stack"]);
    apply(&pod, &args, "apply");
    let rs = ruleset(&pod);
    assert!(rs.contains("table inet istio-proxy-nat"), "{rs}");
    assert!(
        !rs.contains("istio-proxy-mangle"),
        "REDIRECT mode has no mangle table:\n{rs}"
    );
    check_capture(&pod, &peer, false);
    let mut cleanup = args.clone();
    cleanup.push("--cleanup-only".into());
    apply(&pod, &cleanup, "cleanup");
    assert_clean(&pod, "after --cleanup-only");
    // Not captured any more.
    let l = listen(&peer, &format!("{PEER}:8081"), false);
    let _c = connect(&pod, APP_UID, APP_UID, &format!("{PEER}:8081"));
    accept(&l, "direct after cleanup");
}

#[test]
fn tproxy_mode_keeps_the_source_and_cleans_up_its_routes() {
    if !nft_prerequisites() {
        return;
    }
    let (pod, peer) = pair("ntproxy");
    let args = nft_args("TPROXY", "*", "15090,15021,15020", &["--dual-stack"]);
    apply(&pod, &args, "apply");
    let rules = stdout_of(pod.cmd("ip").args(["rule"]));
    assert!(rules.contains("fwmark 0x539 lookup 133"), "{rules}");
    check_capture(&pod, &peer, true);
    apply(&pod, &args, "second run");
    let rules = stdout_of(pod.cmd("ip").args(["rule"]));
    assert_eq!(rules.matches("lookup 133").count(), 1, "{rules}");
    // The same pod switched to REDIRECT: TPROXY's table and routes go.
    apply(
        &pod,
        &nft_args("REDIRECT", "*", "15090,15021,15020", &["--dual-stack"]),
        "REDIRECT",
    );
    let s = snapshot(&pod);
    assert!(
        !s.contains("istio-proxy-mangle") && !s.contains("lookup 133"),
        "{s}"
    );
    let mut cleanup = args.clone();
    cleanup.push("--cleanup-only".into());
    apply(&pod, &cleanup, "cleanup");
    assert_clean(&pod, "after --cleanup-only");
}

#[test]
fn dns_goes_to_15053_for_the_app_and_upstream_for_the_proxy() {
    if !nft_prerequisites() {
        return;
    }
    let (pod, peer) = pair("ndns");
    apply(
        &pod,
        &nft_args("REDIRECT", "*", "", &["--redirect-dns"]),
        "apply",
    );
    let agent_udp: UdpSocket =
        pod.run(|| UdpSocket::bind("0.0.0.0:15053").expect("bind 15053/udp"));
    agent_udp
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let agent_tcp = listen(&pod, "0.0.0.0:15053", false);
    let upstream: UdpSocket =
        peer.run(|| UdpSocket::bind(format!("{PEER}:53")).expect("bind 53/udp"));
    upstream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");

    let send = |uid: u32, payload: &'static [u8]| {
        as_ids(&pod, uid, uid, move || {
            let s = UdpSocket::bind("0.0.0.0:0").expect("udp");
            s.send_to(payload, format!("{PEER}:53")).expect("send");
        })
    };
    let mut buf = [0u8; 64];
    send(APP_UID, b"app-query");
    let (n, _) = agent_udp
        .recv_from(&mut buf)
        .expect("app UDP query reaches 15053");
    assert_eq!(&buf[..n], b"app-query");

    let mut c = connect(&pod, APP_UID, APP_UID, &format!("{PEER}:53"));
    c.write_all(b"tcp-query").expect("write");
    let mut s = accept(&agent_tcp, "app TCP DNS to 15053");
    let mut got = [0u8; 9];
    s.read_exact(&mut got).expect("read");
    assert_eq!(&got, b"tcp-query");

    send(PROXY_ID, b"proxy-query");
    let (n, _) = upstream
        .recv_from(&mut buf)
        .expect("proxy UDP query goes upstream");
    assert_eq!(&buf[..n], b"proxy-query");
}

#[test]
fn validation_and_skip_rule_apply() {
    if !nft_prerequisites() {
        return;
    }
    let ns = host_ns("nvalid");
    let out = run(
        &ns,
        &[
            "--native-nftables",
            "--skip-rule-apply",
            "--run-validation",
            "--probe-timeout=1s",
            "-u",
            "1337",
        ]
        .map(String::from),
    );
    assert_eq!(out.status.code(), Some(126), "no rules: validation fails");
    assert!(
        !ruleset(&ns).contains("istio"),
        "--skip-rule-apply applied rules"
    );
    let mut args = nft_args(
        "REDIRECT",
        "*",
        "",
        &["--run-validation", "--probe-timeout=5s"],
    );
    args.push("--reconcile".into());
    apply(&ns, &args, "apply with validation");
}

#[test]
fn without_nft_the_run_applies_and_bad_flags_apply_nothing() {
    if !nft_prerequisites() {
        return;
    }
    let ns = host_ns("nbad");
    let tmp = tempfile::tempdir().expect("tempdir");
    // `ip` by its full path: the PATH given to the command has nothing in it, so no nft and
    // no iptables can start: the ruleset goes over netlink.
    let ip = harness::prereq::find_bin("ip").expect("ip");
    let without_path = |extra: &[&str]| {
        let out = Command::new(&ip)
            .args(["netns", "exec", ns.name()])
            .arg(workspace_bin("istio-iptables"))
            .env("PATH", tmp.path())
            .args(nft_args("REDIRECT", "*", "", extra))
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    without_path(&[]);
    assert!(ruleset(&ns).contains("istio-proxy-nat"), "nothing applied");
    without_path(&["--cleanup-only"]);
    assert!(!ruleset(&ns).contains("istio"), "cleanup left rules");
    for bad in [
        ["-p", "99999"],
        ["-m", "tproxy"],
        ["-i", "10.0.0.0/40"],
        ["-u", "no-such-user"],
    ] {
        let mut args: Vec<String> = vec!["--native-nftables".into()];
        args.extend(bad.iter().map(|s| s.to_string()));
        let out = run(&ns, &args);
        assert_eq!(out.status.code(), Some(1), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(bad[1]),
            "{bad:?}: message must name the value: {err}"
        );
    }
    // A group name that does not resolve: the whole transaction is refused.
    let out = ns
        .cmd(workspace_bin("istio-iptables"))
        .env("ISTIO_OUTBOUND_OWNER_GROUPS", "no-such-group-xyz")
        .args(nft_args("REDIRECT", "*", "", &[]))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing was applied"));
    assert!(!ruleset(&ns).contains("istio"), "a failed run left rules");
}

/// Every corpus configuration applied for real: the kernel takes it, a second run leaves the
/// same ruleset, cleanup leaves nothing (group names swapped for GID 0, which exists).
#[test]
fn every_corpus_configuration_applies_idempotently_and_cleans_up() {
    if !nft_prerequisites() {
        return;
    }
    let Some(dir) = harness::conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-nftables") else {
        return;
    };
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("args").is_file())
        .collect();
    cases.sort();
    assert_eq!(cases.len(), 28);
    let read = |p: PathBuf| -> Vec<String> {
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
            .lines()
            .map(String::from)
            .collect()
    };
    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let ns = Netns::new("ncorpus");
        ns.set_case_host(case);
        let env: Vec<(String, String)> = read(case.join("env"))
            .into_iter()
            .filter_map(|l| {
                let (k, v) = l.split_once('=')?;
                let v = if k.starts_with("ISTIO_OUTBOUND_OWNER_GROUPS") {
                    v.split(',')
                        .map(|g| {
                            if g.bytes().all(|b| b.is_ascii_digit()) {
                                g
                            } else {
                                "0"
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                } else {
                    v.to_string()
                };
                Some((k.to_string(), v))
            })
            .collect();
        let args: Vec<String> = read(case.join("args"))
            .into_iter()
            .filter(|a| a != "--dry-run")
            .collect();
        let go = |extra: Option<&str>| {
            ns.cmd(workspace_bin("istio-iptables"))
                .envs(env.clone())
                .args(&args)
                .args(extra)
                .output()
                .expect("run istio-iptables")
        };
        let first = go(None);
        let after_first = ruleset(&ns);
        let second = go(None);
        let after_second = ruleset(&ns);
        let cleanup = go(Some("--cleanup-only"));
        let left = ruleset(&ns);
        let ok = first.status.success()
            && second.status.success()
            && cleanup.status.success()
            && after_first.contains("istio-proxy-nat")
            && after_first == after_second
            && !left.contains("istio");
        if !ok {
            failures.push(format!(
                "{name}: first {} second {} cleanup {}, same {}\n{}\n{}",
                first.status,
                second.status,
                cleanup.status,
                after_first == after_second,
                String::from_utf8_lossy(&first.stderr),
                diff(&after_first, &after_second)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn same_flags_a_hundred_times_leave_the_same_ruleset() {
    if !nft_prerequisites() {
        return;
    }
    const TARGET: usize = 100;
    const MIN: usize = 20;
    let budget = Duration::from_secs(12);
    let ns = host_ns("nsame");
    let args = nft_args(
        "TPROXY",
        "*",
        "15090,15021,15020",
        &["--redirect-dns", "--dual-stack"],
    );
    let started = Instant::now();
    apply(&ns, &args, "run 1");
    let expected = snapshot(&ns);
    assert!(
        expected.contains("istio-proxy-raw"),
        "run 1 applied no DNS rules:\n{expected}"
    );
    let mut runs = 1;
    while runs < TARGET && started.elapsed() < budget {
        runs += 1;
        apply(&ns, &args, &format!("run {runs}"));
        let got = snapshot(&ns);
        assert!(
            got == expected,
            "run {runs} changed the ruleset:\n{}",
            diff(&expected, &got)
        );
    }
    eprintln!(
        "FIGURE nftables same-flags: {runs} runs in {:.1}s, ruleset identical after every run",
        started.elapsed().as_secs_f64()
    );
    assert!(runs >= MIN, "only {runs} runs fit the {budget:?} budget");
}

#[test]
fn alternating_flags_never_leave_the_pod_unredirected() {
    if !nft_prerequisites() {
        return;
    }
    const TARGET: usize = 40;
    const MIN: usize = 10;
    let budget = Duration::from_secs(10);
    let (pod, peer) = pair("nalt");
    // Both capture outbound TCP and inbound 8080; they differ in every table (DNS capture and
    // its raw table, inbound port lists, TPROXY-free both).
    let a = nft_args("REDIRECT", "*", "15090,15021,15020", &[]);
    let b = nft_args(
        "REDIRECT",
        "8080,9443",
        "",
        &["--redirect-dns", "--drop-invalid"],
    );
    apply(&pod, &a, "set A");
    let snap_a = snapshot(&pod);
    apply(&pod, &b, "set B");
    let snap_b = snapshot(&pod);
    assert_ne!(snap_a, snap_b, "the two flag sets must differ");

    let stop = Arc::new(AtomicBool::new(false));
    let outbound = probe_loop(
        &pod,
        APP_UID,
        "198.18.0.2:8080",
        listen(&pod, "0.0.0.0:15001", false),
        stop.clone(),
    );
    let inbound = probe_loop(
        &peer,
        0,
        "198.18.0.1:8080",
        listen(&pod, "0.0.0.0:15006", false),
        stop.clone(),
    );

    let started = Instant::now();
    let mut runs: Vec<(Instant, Instant)> = Vec::new();
    let mut problems = Vec::new();
    while runs.len() < TARGET && started.elapsed() < budget {
        let (args, expected, name) = if runs.len().is_multiple_of(2) {
            (&a, &snap_a, "A")
        } else {
            (&b, &snap_b, "B")
        };
        let s = Instant::now();
        let out = run(&pod, args);
        runs.push((s, Instant::now()));
        if !out.status.success() {
            problems.push(format!(
                "run {} (set {name}) failed: {}",
                runs.len(),
                String::from_utf8_lossy(&out.stderr)
            ));
            break;
        }
        let got = snapshot(&pod);
        if &got != expected {
            problems.push(format!(
                "after run {} the ruleset is not set {name}'s:\n{}",
                runs.len(),
                diff(expected, &got)
            ));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let outbound = outbound.join().expect("outbound probe");
    let inbound = inbound.join().expect("inbound probe");
    for (name, p) in [("outbound probe", &outbound), ("inbound probe", &inbound)] {
        eprintln!(
            "FIGURE nftables alternating [{name}]: {} samples, {} during the {} runs, {} without redirect ({:.1}s)",
            p.samples.len(),
            p.during(&runs),
            runs.len(),
            p.failures.len(),
            started.elapsed().as_secs_f64()
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for (name, p) in [("outbound probe", &outbound), ("inbound probe", &inbound)] {
        assert!(
            p.failures.is_empty(),
            "{name}: {} of {} samples found no redirect; first: {}",
            p.failures.len(),
            p.samples.len(),
            p.failures[0]
        );
        assert!(
            p.during(&runs) > 0,
            "{name} took no sample while a run was in progress"
        );
    }
    assert!(
        runs.len() >= MIN,
        "only {} runs fit the {budget:?} budget",
        runs.len()
    );
}

#[test]
fn killed_at_random_points_the_next_run_repairs() {
    if !nft_prerequisites() {
        return;
    }
    const TARGET: usize = 40;
    const MIN: usize = 10;
    let budget = Duration::from_secs(10);
    let ns = host_ns("nkill");
    let mut rng = Rng::new();
    let f = nft_args(
        "TPROXY",
        "*",
        "15090,15021,15020",
        &["--redirect-dns", "--dual-stack"],
    );
    let g = nft_args("REDIRECT", "8080", "", &[]);
    apply(&ns, &g, "set G");
    let expected_g = snapshot(&ns);
    let s = Instant::now();
    apply(&ns, &f, "set F");
    let took = s.elapsed();
    let expected_f = snapshot(&ns);

    let started = Instant::now();
    let (mut kills, mut alive, mut untouched, mut complete, mut other) = (0, 0, 0, 0, 0);
    while kills < TARGET && started.elapsed() < budget {
        apply(&ns, &g, "set G before the kill");
        assert_eq!(snapshot(&ns), expected_g, "starting state not reached");
        let delay = rng.duration(took.mul_f64(1.3));
        kills += 1;
        let mut child = ns
            .cmd(workspace_bin("istio-iptables"))
            .args(&f)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn istio-iptables");
        std::thread::sleep(delay);
        if matches!(child.try_wait(), Ok(None)) {
            alive += 1;
        }
        let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = child.wait();
        let after = snapshot(&ns);
        let rs_after = ruleset(&ns);
        // The netlink batch is one transaction: the ruleset is G's or F's, never a mix.
        if after == expected_g {
            untouched += 1;
        } else if after == expected_f {
            complete += 1;
        } else {
            other += 1;
            assert!(
                rs_after == expected_g.split("\n== ").next().unwrap_or_default()
                    || rs_after == expected_f.split("\n== ").next().unwrap_or_default(),
                "kill {kills} after {delay:?} left a ruleset that is neither G's nor F's:\n{}",
                diff(&expected_f, &after)
            );
        }
        apply(&ns, &f, "repair");
        let repaired = snapshot(&ns);
        assert!(
            repaired == expected_f,
            "kill {kills} after {delay:?}: not repaired:\n{}",
            diff(&expected_f, &repaired)
        );
    }
    eprintln!(
        "FIGURE nftables killed: {kills} SIGKILLs in {:.1}s ({alive} while running, a run takes {took:?}); after the kill: {untouched} untouched, {complete} complete, {other} ruleset whole but routes pending; every next run repaired",
        started.elapsed().as_secs_f64()
    );
    assert!(kills >= MIN, "only {kills} kills fit the {budget:?} budget");
    assert!(alive > 0, "no kill landed while istio-iptables was running");
}

#[test]
fn switching_backends_either_way_leaves_nothing_of_the_other() {
    if !both_prerequisites() {
        return;
    }
    let (pod, peer) = pair("nswitch");
    let nft = nft_args(
        "TPROXY",
        "*",
        "15090,15021,15020",
        &["--redirect-dns", "--dual-stack"],
    );
    // The same flags without --native-nftables.
    let ipt: Vec<String> = nft
        .iter()
        .filter(|a| *a != "--native-nftables")
        .cloned()
        .collect();
    let ipt_redirect: Vec<String> =
        nft_args("REDIRECT", "*", "15090,15021,15020", &["--dual-stack"])
            .into_iter()
            .filter(|a| a != "--native-nftables")
            .collect();

    for round in 0..2 {
        apply(&pod, &ipt, "iptables");
        let s = snapshot(&pod);
        assert!(
            s.contains("ISTIO_OUTPUT"),
            "round {round}: iptables applied nothing:\n{s}"
        );
        assert!(
            !s.contains("istio-proxy-"),
            "round {round}: nftables tables left after the switch to iptables:\n{s}"
        );

        apply(&pod, &nft, "nftables");
        let s = snapshot(&pod);
        assert!(
            s.contains("istio-proxy-nat"),
            "round {round}: nftables applied nothing"
        );
        assert!(
            !s.contains("ISTIO"),
            "round {round}: iptables rules left after the switch to nftables:\n{s}"
        );
    }
    check_capture(&pod, &peer, true);
    // nftables TPROXY to iptables REDIRECT: neither the nft tables nor TPROXY routing remain.
    apply(&pod, &ipt_redirect, "iptables REDIRECT");
    let s = snapshot(&pod);
    assert!(
        !s.contains("istio-proxy-") && !s.contains("lookup 133"),
        "{s}"
    );
    // --cleanup-only in either mode removes both backends' rules.
    apply(&pod, &nft, "nftables again");
    let mut cleanup = ipt.clone();
    cleanup.push("--cleanup-only".into());
    apply(&pod, &cleanup, "iptables cleanup");
    assert_clean(&pod, "iptables --cleanup-only after nftables");
}

#[test]
fn network_namespace_flag_programs_that_namespace() {
    if !nft_prerequisites() {
        return;
    }
    let ns = host_ns("ntarget");
    let mut args = nft_args("REDIRECT", "*", "", &[]);
    args.push(format!("--network-namespace=/run/netns/{}", ns.name()));
    // Run from the test's own namespace; the tables must land in `ns` only.
    let ours = || stdout_of(Command::new("nft").args(["list", "tables"])).contains("istio-proxy");
    let before = ours();
    let out = Command::new(workspace_bin("istio-iptables"))
        .args(&args)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ruleset(&ns).contains("table inet istio-proxy-nat"));
    assert!(
        before || !ours(),
        "tables landed in the test's own namespace"
    );
    args.push("--cleanup-only".into());
    let out = Command::new(workspace_bin("istio-iptables"))
        .args(&args)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!ruleset(&ns).contains("istio"));
}
