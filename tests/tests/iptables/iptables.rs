//! istio-iptables end to end: the conformance corpus run through the real binary inside network
//! namespaces that present each case's host state, and the functional proof that the rules
//! capture what Istio's capture (and nothing else) with real iptables.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use harness::{Netns, assert_eventually, require_bin, require_root, veth, workspace_bin};

const POD: &str = "198.18.0.1";
const PEER: &str = "198.18.0.2";
const APP_UID: u32 = 1000;
const PROXY_UID: u32 = 1337;

fn prerequisites() -> bool {
    require_root()
        && require_bin("iptables")
        && require_bin("ip6tables")
        && require_bin("iptables-save")
        && require_bin("ip")
}

fn corpus() -> Option<PathBuf> {
    harness::conformance::dir(env!("CARGO_MANIFEST_DIR"), "istio-iptables")
}

fn read_lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .lines()
        .map(String::from)
        .collect()
}

/// Every corpus case through the real binary, in a namespace whose addresses make the binary
/// detect the case's address family and whose /etc/resolv.conf is the case's.
#[test]
fn conformance_cases_in_network_namespaces() {
    if !prerequisites() {
        return;
    }
    let Some(dir) = corpus() else { return };
    let bin = workspace_bin("istio-iptables");
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
        let ns = Netns::new("conf");
        ns.set_case_host(case);
        let out = tmp.path().join(format!("{name}.stream"));
        let env: Vec<(String, String)> = read_lines(&case.join("env"))
            .into_iter()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.into(), v.into())))
            .collect();
        let mut cmd = ns.cmd(&bin);
        cmd.env_clear()
            .env("PATH", harness::prereq::setting("PATH").unwrap_or_default())
            .env("DRY_RUN_FILE_PATH", &out)
            .envs(env)
            .args(read_lines(&case.join("args")));
        let result = cmd.output().expect("run istio-iptables");
        let expected_name = if case.join("expected-cli").is_file() {
            "expected-cli"
        } else {
            "expected"
        };
        let expected = std::fs::read_to_string(case.join(expected_name)).expect("expected");
        let got = std::fs::read_to_string(&out).unwrap_or_default();
        let stdout = String::from_utf8_lossy(&result.stdout);
        if !result.status.success() || got != expected || stdout != expected {
            failures.push(format!(
                "{name}: status {}, file matches: {}, stdout matches: {}\nstderr: {}",
                result.status,
                got == expected,
                stdout == expected,
                String::from_utf8_lossy(&result.stderr)
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

// ---------------------------------------------------------------------------------------------
// Functional proof.

/// A pod namespace joined to a peer namespace by a veth pair.
struct Pair {
    pod: Netns,
    peer: Netns,
}

fn pair(hint: &str) -> Pair {
    let pod = Netns::new(&format!("pod-{hint}"));
    let peer = Netns::new(&format!("peer-{hint}"));
    veth(&pod, &format!("{POD}/24"), &peer, &format!("{PEER}/24"));
    Pair { pod, peer }
}

const INJECTION_ARGS: [&str; 16] = [
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
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
];

fn injection_args(mode: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = INJECTION_ARGS.iter().map(|s| s.to_string()).collect();
    a[7] = mode.to_string();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn istio_iptables(ns: &Netns, args: &[String]) -> std::process::Output {
    let out = ns
        .cmd(workspace_bin("istio-iptables"))
        .args(args)
        .output()
        .expect("run istio-iptables");
    eprintln!(
        "istio-iptables {args:?} -> {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn apply(ns: &Netns, args: &[String]) {
    let out = istio_iptables(ns, args);
    assert!(
        out.status.success(),
        "istio-iptables failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn listen(ns: &Netns, addr: &str, transparent: bool) -> TcpListener {
    let addr: SocketAddr = addr.parse().expect("addr");
    ns.run(move || {
        use nix::sys::socket::{
            AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, setsockopt,
            socket, sockopt,
        };
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        setsockopt(&fd, sockopt::ReuseAddr, &true).expect("reuseaddr");
        if transparent {
            setsockopt(&fd, sockopt::IpTransparent, &true).expect("IP_TRANSPARENT");
        }
        let SocketAddr::V4(v4) = addr else {
            panic!("IPv4 only")
        };
        bind(fd.as_raw_fd(), &SockaddrIn::from(v4)).expect("bind");
        listen(&fd, Backlog::new(16).expect("backlog")).expect("listen");
        let l = TcpListener::from(fd);
        l.set_nonblocking(true).expect("nonblocking");
        l
    })
}

/// Runs `f` in `ns` on a thread whose fsuid/fsgid are `uid` (sockets it creates belong to that
/// user for the owner match).
fn as_user<T: Send + 'static>(ns: &Netns, uid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    ns.run(move || {
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(uid));
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
        f()
    })
}

fn connect_as(ns: &Netns, uid: u32, src: Option<&str>, dst: &str) -> Result<TcpStream, String> {
    let dst: SocketAddrV4 = dst.parse().expect("dst");
    let src: Option<Ipv4Addr> = src.map(|s| s.parse().expect("src"));
    as_user(ns, uid, move || {
        use nix::sys::socket::{
            AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, socket,
        };
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| e.to_string())?;
        if let Some(s) = src {
            bind(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(s, 0)))
                .map_err(|e| e.to_string())?;
        }
        connect(fd.as_raw_fd(), &SockaddrIn::from(dst))
            .map_err(|e| format!("connect {dst}: {e}"))?;
        Ok(TcpStream::from(fd))
    })
}

fn accept(l: &TcpListener, what: &str) -> TcpStream {
    assert_eventually(Duration::from_secs(5), || {
        l.accept()
            .map(|(s, _)| s)
            .map_err(|e| format!("{what}: no connection yet ({e})"))
    })
}

fn nothing_pending(l: &TcpListener) -> bool {
    l.accept().is_err()
}

fn original_dst(s: &TcpStream) -> SocketAddr {
    use nix::sys::socket::{getsockopt, sockopt};
    let sin = getsockopt(&s.as_fd(), sockopt::OriginalDst).expect("SO_ORIGINAL_DST");
    SocketAddr::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into(),
        u16::from_be(sin.sin_port),
    )
}

fn save_all(ns: &Netns) -> String {
    let v4 = ns.cmd("iptables-save").output().expect("iptables-save");
    let v6 = ns.cmd("ip6tables-save").output().expect("ip6tables-save");
    format!(
        "{}{}",
        String::from_utf8_lossy(&v4.stdout),
        String::from_utf8_lossy(&v6.stdout)
    )
}

fn istio_lines(ns: &Netns) -> Vec<String> {
    save_all(ns)
        .lines()
        .filter(|l| l.contains("ISTIO_"))
        .map(String::from)
        .collect()
}

/// Outbound capture and its exceptions, inbound capture and its exceptions, in one namespace.
fn check_capture(p: &Pair, tproxy: bool) {
    let outbound = listen(&p.pod, "0.0.0.0:15001", false);
    let inbound = listen(&p.pod, "0.0.0.0:15006", tproxy);
    let peer_app = listen(&p.peer, &format!("{PEER}:8080"), false);
    let local_app = listen(&p.pod, "0.0.0.0:9090", false);

    // Outbound from the app (uid 1000): captured on 15001 with the original destination.
    let _c = connect_as(&p.pod, APP_UID, None, &format!("{PEER}:8080")).expect("app connect");
    let s = accept(&outbound, "outbound capture");
    assert_eq!(
        original_dst(&s),
        format!("{PEER}:8080").parse::<SocketAddr>().expect("addr")
    );
    assert!(
        nothing_pending(&peer_app),
        "captured connection also reached the peer"
    );

    // The same from the proxy (uid 1337): direct.
    let _c = connect_as(&p.pod, PROXY_UID, None, &format!("{PEER}:8080")).expect("proxy connect");
    accept(&peer_app, "proxy traffic direct to peer");
    assert!(nothing_pending(&outbound), "proxy traffic was captured");

    // Inbound from the peer to pod:8080: captured on 15006 with the original destination.
    let _c = connect_as(&p.peer, 0, None, &format!("{POD}:8080")).expect("peer connect");
    let s = accept(&inbound, "inbound capture");
    if tproxy {
        assert_eq!(
            s.local_addr().expect("local"),
            format!("{POD}:8080").parse().expect("addr")
        );
        assert_eq!(
            s.peer_addr().expect("peer").ip().to_string(),
            PEER,
            "TPROXY keeps the source"
        );
    } else {
        assert_eq!(
            original_dst(&s),
            format!("{POD}:8080").parse::<SocketAddr>().expect("addr")
        );
    }

    // Excluded inbound ports are not captured.
    for port in [15090, 15021, 15020] {
        let l = listen(&p.pod, &format!("0.0.0.0:{port}"), false);
        let _c = connect_as(&p.peer, 0, None, &format!("{POD}:{port}")).expect("peer connect");
        accept(&l, &format!("port {port} direct"));
        assert!(nothing_pending(&inbound), "port {port} was captured");
    }

    // App to app over loopback (127.0.0.1 and the pod IP): not captured.
    for dst in ["127.0.0.1:9090".to_string(), format!("{POD}:9090")] {
        let _c = connect_as(&p.pod, APP_UID, None, &dst).expect("local connect");
        accept(&local_app, &format!("app to app via {dst}"));
        assert!(
            nothing_pending(&outbound) && nothing_pending(&inbound),
            "{dst} was captured"
        );
    }

    // The proxy's passthrough source 127.0.0.6 to the pod IP: not captured.
    let _c = connect_as(&p.pod, PROXY_UID, Some("127.0.0.6"), &format!("{POD}:9090"))
        .expect("127.0.0.6");
    accept(&local_app, "127.0.0.6 passthrough");
    assert!(nothing_pending(&inbound), "127.0.0.6 traffic was captured");
}

fn check_cleanup(p: &Pair, args: &[String]) {
    let mut a = args.to_vec();
    a.push("--cleanup-only".into());
    apply(&p.pod, &a);
    assert_eq!(
        istio_lines(&p.pod),
        Vec::<String>::new(),
        "ISTIO_ rules left after cleanup"
    );
    let rules = String::from_utf8_lossy(
        &p.pod
            .cmd("ip")
            .args(["rule"])
            .output()
            .expect("ip rule")
            .stdout,
    )
    .into_owned();
    assert!(
        !rules.contains("lookup 133"),
        "TPROXY policy rule left: {rules}"
    );
    let peer_app = listen(&p.peer, &format!("{PEER}:8081"), false);
    let _c =
        connect_as(&p.pod, APP_UID, None, &format!("{PEER}:8081")).expect("direct after cleanup");
    accept(&peer_app, "direct after cleanup");
}

#[test]
fn redirect_mode_captures_like_istio_and_cleans_up() {
    if !prerequisites() {
        return;
    }
    let p = pair("redir");
    // A foreign rule that must survive everything.
    harness::netns::sh(p.pod.cmd("iptables").args([
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-d",
        "198.18.1.1/32",
        "-j",
        "RETURN",
    ]));
    let args = injection_args("REDIRECT", &[]);
    apply(&p.pod, &args);
    check_capture(&p, false);

    // Second run: no-op (nothing changes, same text).
    let before = save_all(&p.pod);
    apply(&p.pod, &args);
    assert_eq!(
        strip_comments(&before),
        strip_comments(&save_all(&p.pod)),
        "second run changed rules"
    );

    // Drift without --reconcile: fails, changes nothing. With --reconcile: replaced.
    harness::netns::sh(p.pod.cmd("iptables").args([
        "-t",
        "nat",
        "-A",
        "ISTIO_OUTPUT",
        "-p",
        "udp",
        "-j",
        "RETURN",
    ]));
    let drifted = save_all(&p.pod);
    let out = istio_iptables(&p.pod, &args);
    assert!(!out.status.success(), "drift must fail without --reconcile");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reconcile"));
    assert_eq!(strip_comments(&drifted), strip_comments(&save_all(&p.pod)));
    let mut reconcile = injection_args("REDIRECT", &["--reconcile"]);
    reconcile[15] = "15090,15021".into(); // different flags too
    apply(&p.pod, &reconcile);
    let after = save_all(&p.pod);
    assert!(
        !after.contains("-p udp -j RETURN"),
        "drifted rule survived reconcile"
    );
    assert!(
        !after.contains("--dport 15020 -j RETURN"),
        "old flags survived reconcile"
    );
    assert!(
        after.contains("-d 198.18.1.1/32 -j RETURN"),
        "foreign rule removed"
    );

    check_cleanup(&p, &reconcile);
    assert!(
        save_all(&p.pod).contains("-d 198.18.1.1/32 -j RETURN"),
        "foreign rule removed by cleanup"
    );
}

fn strip_comments(s: &str) -> String {
    s.lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn tproxy_mode_captures_with_original_source_and_cleans_up() {
    if !prerequisites() {
        return;
    }
    let p = pair("tproxy");
    let args = injection_args("TPROXY", &[]);
    apply(&p.pod, &args);
    let rules = String::from_utf8_lossy(
        &p.pod
            .cmd("ip")
            .args(["rule"])
            .output()
            .expect("ip rule")
            .stdout,
    )
    .into_owned();
    assert!(rules.contains("fwmark 0x539 lookup 133"), "{rules}");
    check_capture(&p, true);
    // Idempotent: one policy rule after a second run.
    apply(&p.pod, &args);
    let rules = String::from_utf8_lossy(
        &p.pod
            .cmd("ip")
            .args(["rule"])
            .output()
            .expect("ip rule")
            .stdout,
    )
    .into_owned();
    assert_eq!(rules.matches("lookup 133").count(), 1, "{rules}");
    check_cleanup(&p, &args);
}

#[test]
fn redirect_dns_captures_udp_and_tcp_dns_of_the_app_only() {
    if !prerequisites() {
        return;
    }
    let p = pair("dns");
    p.pod.set_resolv_conf(&format!("nameserver {PEER}\n"));
    let args = injection_args("REDIRECT", &["--redirect-dns"]);
    apply(&p.pod, &args);
    assert!(save_all(&p.pod).contains(&format!(
        "-d {PEER}/32 -p udp -m udp --dport 53 -j REDIRECT"
    )));

    let agent_udp: UdpSocket = p
        .pod
        .run(|| UdpSocket::bind("0.0.0.0:15053").expect("bind 15053/udp"));
    agent_udp
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let agent_tcp = listen(&p.pod, "0.0.0.0:15053", false);
    let upstream: UdpSocket = p
        .peer
        .run(|| UdpSocket::bind(format!("{PEER}:53")).expect("bind 53/udp"));
    upstream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");

    let send = |uid: u32, payload: &'static [u8]| {
        as_user(&p.pod, uid, move || {
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

    let mut c = connect_as(&p.pod, APP_UID, None, &format!("{PEER}:53")).expect("tcp dns");
    c.write_all(b"tcp-query").expect("write");
    let mut s = accept(&agent_tcp, "app TCP DNS to 15053");
    let mut got = [0u8; 9];
    s.read_exact(&mut got).expect("read");
    assert_eq!(&got, b"tcp-query");

    send(PROXY_UID, b"proxy-query");
    let (n, _) = upstream
        .recv_from(&mut buf)
        .expect("proxy UDP query goes upstream");
    assert_eq!(&buf[..n], b"proxy-query");

    check_cleanup(&p, &args);
}

#[test]
fn invalid_flags_apply_nothing() {
    if !prerequisites() {
        return;
    }
    let ns = Netns::new("bad");
    ns.add_lo_addr("198.18.0.240/32");
    for bad in [
        ["-p", "99999"],
        ["-m", "tproxy"],
        ["-i", "10.0.0.0/40"],
        ["-u", "no-such-user"],
    ] {
        let args: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
        let out = istio_iptables(&ns, &args);
        assert_eq!(out.status.code(), Some(1), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(bad[1]),
            "{bad:?}: message must name the value: {err}"
        );
        assert!(istio_lines(&ns).is_empty(), "{bad:?} applied rules");
    }
}

#[test]
fn run_validation_passes_with_rules_and_fails_126_without() {
    if !prerequisites() {
        return;
    }
    let ns = Netns::new("valid");
    ns.add_lo_addr("198.18.0.240/32");
    // No rules: the probe cannot be redirected.
    let out = istio_iptables(
        &ns,
        &[
            "--skip-rule-apply",
            "--run-validation",
            "--probe-timeout=1s",
            "-u",
            "1337",
        ]
        .map(String::from),
    );
    assert_eq!(out.status.code(), Some(126));
    let mut args = injection_args("REDIRECT", &["--run-validation"]);
    args.push("--probe-timeout=5s".into());
    apply(&ns, &args);
}

fn save_with(ns: &Netns, bin: &str) -> String {
    String::from_utf8_lossy(&ns.cmd(bin).output().expect("save").stdout).into_owned()
}

#[test]
fn backend_prefers_legacy_when_it_holds_rules_and_honours_force() {
    if !prerequisites() || !require_bin("iptables-legacy-save") || !require_bin("iptables-nft-save")
    {
        return;
    }
    // Fresh namespace: nft.
    let ns = Netns::new("nft");
    ns.add_lo_addr("198.18.0.240/32");
    let args = injection_args("REDIRECT", &[]);
    apply(&ns, &args);
    assert!(save_with(&ns, "iptables-nft-save").contains("ISTIO_OUTPUT"));
    assert!(!save_with(&ns, "iptables-legacy-save").contains("ISTIO_OUTPUT"));

    // Legacy already holds rules: legacy is used.
    let ns = Netns::new("legacy");
    ns.add_lo_addr("198.18.0.240/32");
    harness::netns::sh(ns.cmd("iptables-legacy").args([
        "-t",
        "filter",
        "-A",
        "INPUT",
        "-s",
        "198.18.3.3/32",
        "-j",
        "ACCEPT",
    ]));
    apply(&ns, &args);
    assert!(save_with(&ns, "iptables-legacy-save").contains("ISTIO_OUTPUT"));
    assert!(!save_with(&ns, "iptables-nft-save").contains("ISTIO_OUTPUT"));
    // Idempotent on legacy too.
    let before = strip_comments(&save_with(&ns, "iptables-legacy-save"));
    apply(&ns, &args);
    assert_eq!(
        before,
        strip_comments(&save_with(&ns, "iptables-legacy-save"))
    );
    // Cleanup on legacy leaves the foreign rule.
    let mut cleanup = args.clone();
    cleanup.push("--cleanup-only".into());
    apply(&ns, &cleanup);
    let after = save_with(&ns, "iptables-legacy-save");
    assert!(!after.contains("ISTIO_"), "{after}");
    assert!(after.contains("-s 198.18.3.3/32 -j ACCEPT"), "{after}");

    // --force-iptables-binary=nft overrides the legacy preference.
    let mut forced = args.clone();
    forced.push("--force-iptables-binary=nft".into());
    apply(&ns, &forced);
    assert!(save_with(&ns, "iptables-nft-save").contains("ISTIO_OUTPUT"));
    assert!(!save_with(&ns, "iptables-legacy-save").contains("ISTIO_"));
}

fn original_dst6(s: &TcpStream) -> SocketAddr {
    use nix::sys::socket::{getsockopt, sockopt};
    let sin6 = getsockopt(&s.as_fd(), sockopt::Ip6tOriginalDst).expect("IP6T_SO_ORIGINAL_DST");
    SocketAddr::new(
        std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).into(),
        u16::from_be(sin6.sin6_port),
    )
}

#[test]
fn dual_stack_captures_ipv6_too() {
    if !prerequisites() {
        return;
    }
    let pod = Netns::new("pod6");
    let peer = Netns::new("peer6");
    veth(
        &pod,
        &format!("{POD}/24,fd00::1/64"),
        &peer,
        &format!("{PEER}/24,fd00::2/64"),
    );
    let args = injection_args("REDIRECT", &["--dual-stack"]);
    apply(&pod, &args);
    let v6 = save_with(&pod, "ip6tables-save");
    assert!(v6.contains("-A ISTIO_OUTPUT -j ISTIO_REDIRECT"), "{v6}");
    let lo = String::from_utf8_lossy(
        &pod.cmd("ip")
            .args(["-6", "addr", "show", "dev", "lo"])
            .output()
            .expect("ip")
            .stdout,
    )
    .into_owned();
    assert!(lo.contains("::6/128"), "::6 not added to lo: {lo}");

    let outbound: TcpListener = pod.run(|| {
        let l = TcpListener::bind("[::]:15001").expect("bind [::]:15001");
        l.set_nonblocking(true).expect("nonblocking");
        l
    });
    let inbound: TcpListener = pod.run(|| {
        let l = TcpListener::bind("[::]:15006").expect("bind [::]:15006");
        l.set_nonblocking(true).expect("nonblocking");
        l
    });
    let _c = as_user(&pod, APP_UID, || {
        TcpStream::connect("[fd00::2]:8080").expect("app connect v6")
    });
    let s = accept(&outbound, "IPv6 outbound capture");
    assert_eq!(
        original_dst6(&s),
        "[fd00::2]:8080".parse::<SocketAddr>().expect("addr")
    );
    let _c = peer.run(|| TcpStream::connect("[fd00::1]:8080").expect("peer connect v6"));
    let s = accept(&inbound, "IPv6 inbound capture");
    assert_eq!(
        original_dst6(&s),
        "[fd00::1]:8080".parse::<SocketAddr>().expect("addr")
    );

    let mut cleanup = args.clone();
    cleanup.push("--cleanup-only".into());
    apply(&pod, &cleanup);
    assert_eq!(istio_lines(&pod), Vec::<String>::new());
}

#[test]
fn force_apply_fails_when_chains_exist() {
    if !prerequisites() {
        return;
    }
    let ns = Netns::new("force");
    ns.add_lo_addr("198.18.0.240/32");
    let args = injection_args("REDIRECT", &[]);
    apply(&ns, &args);
    let before = strip_comments(&save_all(&ns));
    let mut forced = args.clone();
    forced.push("--force-apply".into());
    let out = istio_iptables(&ns, &forced);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        before,
        strip_comments(&save_all(&ns)),
        "failed force-apply changed rules"
    );
}

#[test]
fn network_namespace_flag_programs_that_namespace() {
    if !prerequisites() {
        return;
    }
    let ns = Netns::new("target");
    ns.add_lo_addr("198.18.0.240/32");
    let mut args = injection_args("REDIRECT", &[]);
    args.push(format!("--network-namespace=/run/netns/{}", ns.name()));
    // Run from the test's own namespace; the rules must land in `ns`.
    let out = Command::new(workspace_bin("istio-iptables"))
        .args(&args)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(save_with(&ns, "iptables-save").contains("ISTIO_OUTPUT"));
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
    assert!(istio_lines(&ns).is_empty());
}

/// Every corpus configuration applied for real: it applies, a second run changes nothing, and
/// `--cleanup-only` leaves no Istio rule behind (group names swapped for GID 0, which exists).
#[test]
fn every_corpus_configuration_applies_idempotently_and_cleans_up() {
    if !prerequisites() {
        return;
    }
    let Some(dir) = corpus() else { return };
    let bin = workspace_bin("istio-iptables");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("args").is_file())
        .collect();
    cases.sort();
    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let ipv6 = std::fs::read_to_string(case.join("host"))
            .expect("host")
            .trim()
            == "ipv6=true";
        let ns = Netns::new("real");
        if ipv6 {
            harness::netns::sh(ns.cmd("ip").args([
                "-6",
                "addr",
                "add",
                "fd00::240/128",
                "dev",
                "lo",
            ]));
        } else {
            ns.add_lo_addr("198.18.0.240/32");
        }
        if case.join("resolv.conf").is_file() {
            ns.set_resolv_conf(&std::fs::read_to_string(case.join("resolv.conf")).expect("resolv"));
        }
        let env: Vec<(String, String)> = read_lines(&case.join("env"))
            .into_iter()
            .filter_map(|l| {
                l.split_once('=').map(|(k, v)| {
                    if !k.starts_with("ISTIO_OUTBOUND_OWNER_GROUPS") {
                        return (k.to_string(), v.to_string());
                    }
                    let v = v
                        .split(',')
                        .map(|g| {
                            if g.bytes().all(|b| b.is_ascii_digit()) {
                                g
                            } else {
                                "0"
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(",");
                    (k.to_string(), v)
                })
            })
            .collect();
        let args: Vec<String> = read_lines(&case.join("args"))
            .into_iter()
            .filter(|a| a != "--dry-run")
            .collect();
        let run = |extra: Option<&str>| {
            let mut c = ns.cmd(&bin);
            c.envs(env.clone()).args(&args).args(extra);
            c.output().expect("run istio-iptables")
        };
        let first = run(None);
        let after_first = strip_comments(&save_all(&ns));
        let second = run(None);
        let after_second = strip_comments(&save_all(&ns));
        let cleanup = run(Some("--cleanup-only"));
        let left = istio_lines(&ns);
        let rules =
            String::from_utf8_lossy(&ns.cmd("ip").arg("rule").output().expect("ip rule").stdout)
                .into_owned();
        let ok = first.status.success()
            && second.status.success()
            && cleanup.status.success()
            && after_first == after_second
            && after_first.contains("ISTIO_OUTPUT")
            && left.is_empty()
            && !rules.contains("lookup 133");
        if !ok {
            failures.push(format!(
                "{name}: first {} second {} cleanup {}, idempotent {}, left {left:?}\n{}{}",
                first.status,
                second.status,
                cleanup.status,
                after_first == after_second,
                String::from_utf8_lossy(&first.stderr),
                String::from_utf8_lossy(&second.stderr)
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

/// Istio's VM start script, `istio-start.sh init <istio-iptables flags>`, runs
/// `pilot-agent istio-iptables init <flags> --cleanup-only` and then
/// `pilot-agent istio-iptables init <flags>`: the positional `init` (and pilot-agent's
/// `--vklog`) must be accepted and ignored, giving exactly the rules the flags alone give, and
/// those rules capture.
#[test]
fn vm_start_script_sequence_through_pilot_agent_is_the_plain_rule_set() {
    if !prerequisites() {
        return;
    }
    let plain = pair("vmplain");
    apply(&plain.pod, &injection_args("REDIRECT", &[]));
    let want = strip_comments(&save_all(&plain.pod));

    let p = pair("vminit");
    let pilot_agent = |extra: &[&str]| {
        let mut args = vec!["istio-iptables".to_string(), "init".to_string()];
        args.extend(injection_args("REDIRECT", &["--vklog=0"]));
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = p
            .pod
            .cmd(workspace_bin("pilot-agent"))
            .args(&args)
            .output()
            .expect("run pilot-agent istio-iptables");
        assert!(
            out.status.success(),
            "pilot-agent {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    };
    pilot_agent(&["--cleanup-only"]);
    assert_eq!(istio_lines(&p.pod), Vec::<String>::new());
    pilot_agent(&[]);
    assert_eq!(strip_comments(&save_all(&p.pod)), want);
    check_capture(&p, false);
}
