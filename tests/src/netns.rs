//! Network namespaces for tests: unique names, removed on drop (even when the test panics),
//! veth pairs between them, commands and closures run inside them.
//!
//! Addresses used in them come from 198.18.0.0/15 and fd00::/8; the namespaces have no route to
//! the host or beyond.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique(prefix: &str) -> u32 {
    let _ = prefix;
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// Runs a command and panics with its output when it fails.
pub fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named network namespace, deleted on drop with every process still inside it.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `t<pid>-<n>-<hint>` with loopback up.
    pub fn new(hint: &str) -> Netns {
        let hint: String = hint
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(24)
            .collect();
        let name = format!("t{}-{}-{hint}", std::process::id(), unique("ns"));
        sh(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name };
        sh(ns.cmd("ip").args(["link", "set", "lo", "up"]));
        ns
    }

    /// The namespace's name (as `ip netns` knows it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`).
    pub fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// A command that runs `program` inside the namespace as `uid`/`gid` (no supplementary
    /// groups), the way an app container or the proxy user would.
    pub fn cmd_as(&self, uid: u32, gid: u32, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, "setpriv"])
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg(program);
        c
    }

    /// Runs `f` on a thread that has entered the namespace; returns its result.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn(f)
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// Starts `f` on a new thread that has entered the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = PathBuf::from("/run/netns").join(&self.name);
        std::thread::spawn(move || {
            let fd = File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
            nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns {}: {e}", path.display()));
            f()
        })
    }

    /// Presents `content` as /etc/resolv.conf to commands run with [`Netns::cmd`].
    pub fn set_resolv_conf(&self, content: &str) {
        let dir = PathBuf::from("/etc/netns").join(&self.name);
        std::fs::create_dir_all(&dir).expect("create /etc/netns/<ns>");
        std::fs::write(dir.join("resolv.conf"), content).expect("write resolv.conf");
    }

    /// Adds an address to the namespace's loopback (e.g. a service VIP).
    pub fn add_lo_addr(&self, cidr: &str) {
        sh(self.cmd("ip").args(["addr", "add", cidr, "dev", "lo"]));
    }

    /// Gives the namespace the host state a conformance case expects (the case folder's
    /// `host`: `ipv6=true` for an IPv6 host address, else IPv4; its `resolv.conf` when it has
    /// one).
    pub fn set_case_host(&self, case: &std::path::Path) {
        let host = std::fs::read_to_string(case.join("host")).unwrap_or_default();
        let ipv6 = host.lines().next().map(str::trim) == Some("ipv6=true");
        if ipv6 {
            sh(self
                .cmd("ip")
                .args(["-6", "addr", "add", "fd00::240/128", "dev", "lo"]));
        } else {
            self.add_lo_addr("198.18.0.240/32");
        }
        if let Ok(text) = std::fs::read_to_string(case.join("resolv.conf")) {
            self.set_resolv_conf(&text);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(&self.name));
    }
}

/// Joins two namespaces with a veth pair, `a_cidr` on `a`'s end and `b_cidr` on `b`'s end
/// (IPv4 like `198.18.0.1/24` or IPv6 like `fd00::1/64`; several may be given comma-separated).
/// Returns the interface names (in `a`, in `b`).
pub fn veth(a: &Netns, a_cidr: &str, b: &Netns, b_cidr: &str) -> (String, String) {
    let n = unique("veth");
    let (ea, eb) = (
        format!("va{}x{n}", std::process::id() % 10000),
        format!("vb{}x{n}", std::process::id() % 10000),
    );
    sh(Command::new("ip").args([
        "link", "add", &ea, "netns", &a.name, "type", "veth", "peer", "name", &eb, "netns", &b.name,
    ]));
    for (ns, dev, cidrs) in [(a, &ea, a_cidr), (b, &eb, b_cidr)] {
        for cidr in cidrs.split(',').filter(|c| !c.is_empty()) {
            let mut c = ns.cmd("ip");
            c.args(["addr", "add", cidr, "dev", dev]);
            if cidr.contains(':') {
                c.arg("nodad");
            }
            sh(&mut c);
        }
        sh(ns.cmd("ip").args(["link", "set", dev, "up"]));
    }
    (ea, eb)
}
