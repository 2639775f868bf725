//! Containers as a runtime (containerd + runc) makes them, for the kubelet runner.
//!
//! The runner writes a [`Launch`] and starts `kubelet __container <launch.json>`; that process
//! ([`container_main`]) enters the pod's network namespace, makes a PID namespace (the
//! container's entrypoint is PID 1 there, as in a pod without `shareProcessNamespace`), and in
//! a mount namespace of its own builds the container's root: an overlay whose lower layer is the
//! host's root and whose upper layer holds the image's files (the proxy image's
//! `/usr/local/bin/pilot-agent`, `envoy`, Istio's bootstrap template ...), fresh `/proc`,
//! `/dev` and `/sys` (read-only), the volumes bind-mounted at their `mountPath`s (read-only where
//! the kubelet makes them so), the kubelet's `/etc/hosts`, `/etc/resolv.conf`, `/etc/hostname`
//! and `/dev/termination-log`; the root read-only when `readOnlyRootFilesystem`. Then it takes
//! the container's identity: groups, gid, the capability set (the runtime's defaults with the
//! spec's `add`/`drop`, all of them when `privileged`), `no_new_privs` when
//! `allowPrivilegeEscalation: false`, the runtime's open-file limit, the uid, and execs the
//! entrypoint. The launcher stays as the parent: it forwards signals to the container and exits
//! with its status.
//!
//! `kubelet __exec <launch.json>` ([`exec_main`]) runs a command inside a running container
//! (exec probes and hooks), as `runc exec` does: it joins the container's namespaces and takes
//! the same identity.

// A container runtime's system calls: fork, namespaces, mounts, credentials, capabilities, exec.
#![allow(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

/// Capabilities containerd grants a container by default (its `oci.DefaultCaps`, which is also
/// Docker's list).
pub const DEFAULT_CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// Linux capability names in number order (`CAP_CHOWN` = 0 ...).
const CAP_NAMES: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The number of a capability named as Kubernetes names it (`NET_ADMIN` or `CAP_NET_ADMIN`).
pub fn cap_number(name: &str) -> Option<u32> {
    let name = name.strip_prefix("CAP_").unwrap_or(name);
    CAP_NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(name))
        .map(|n| n as u32)
}

/// The capability set of a container: the runtime's defaults, minus `drop` (`ALL` drops every
/// one), plus `add`; every capability when privileged. Unknown names are an error.
pub fn capability_set(
    add: &[String],
    drop: &[String],
    privileged: bool,
) -> Result<Vec<u32>, String> {
    if privileged {
        return Ok((0..CAP_NAMES.len() as u32).collect());
    }
    let check = |n: &String| {
        if n.eq_ignore_ascii_case("ALL") {
            Ok(None)
        } else {
            cap_number(n)
                .map(Some)
                .ok_or_else(|| format!("unknown capability {n:?}"))
        }
    };
    let mut set: Vec<u32> = DEFAULT_CAPS.iter().filter_map(|n| cap_number(n)).collect();
    for d in drop {
        match check(d)? {
            None => set.clear(),
            Some(c) => set.retain(|x| *x != c),
        }
    }
    for a in add {
        match check(a)? {
            None => set = (0..CAP_NAMES.len() as u32).collect(),
            Some(c) if !set.contains(&c) => set.push(c),
            Some(_) => {}
        }
    }
    set.sort_unstable();
    Ok(set)
}

/// A bind mount into the container.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mount {
    /// Host path.
    pub source: PathBuf,
    /// Absolute path in the container.
    pub target: String,
    pub read_only: bool,
}

/// Everything the launcher needs to make one container (or to exec in it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Launch {
    /// `/run/netns/<pod namespace>`.
    pub netns: PathBuf,
    /// Host directory of the container's runtime state (its writable layer's mount point, the
    /// pid file).
    pub state_dir: PathBuf,
    /// Image files bind-mounted read-only: (path in the image, host file).
    pub image_binds: Vec<(String, PathBuf)>,
    /// Image files copied into the image layer: (path in the image, host file).
    pub image_copies: Vec<(String, PathBuf)>,
    pub mounts: Vec<Mount>,
    pub read_only_root: bool,
    pub hostname: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub capabilities: Vec<u32>,
    pub no_new_privs: bool,
    /// RLIMIT_NOFILE (soft, hard).
    pub nofile: (u64, u64),
    pub working_dir: String,
    pub env: Vec<(String, String)>,
    pub argv: Vec<String>,
}

impl Launch {
    /// Where the launcher writes the container's host PID.
    pub fn pid_file(&self) -> PathBuf {
        self.state_dir.join("pid")
    }
}

/// Fails the launcher with the step that failed (runc reports a start error likewise; the
/// kubelet shows it as the container's exit).
fn fail(step: &str, err: impl std::fmt::Display) -> ! {
    let _ = writeln!(std::io::stderr(), "kubelet: container setup: {step}: {err}");
    std::process::exit(128)
}

fn cstr(p: impl AsRef<std::ffi::OsStr>) -> CString {
    CString::new(p.as_ref().as_bytes()).unwrap_or_else(|e| fail("path", e))
}

fn check(step: &str, rc: libc::c_int) {
    if rc < 0 {
        fail(step, std::io::Error::last_os_error());
    }
}

fn mount(src: &str, target: &Path, fstype: &str, flags: libc::c_ulong, data: &str) {
    let (s, t, f, d) = (cstr(src), cstr(target), cstr(fstype), cstr(data));
    // SAFETY: the C strings outlive the call; a null fstype or data is allowed by mount(2).
    let rc = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            if fstype.is_empty() {
                std::ptr::null()
            } else {
                f.as_ptr()
            },
            flags,
            if data.is_empty() {
                std::ptr::null()
            } else {
                d.as_ptr().cast()
            },
        )
    };
    check(&format!("mount {src} on {}", target.display()), rc);
}

fn bind(source: &Path, target: &Path, read_only: bool) {
    mount(
        &source.to_string_lossy(),
        target,
        "",
        libc::MS_BIND | libc::MS_REC,
        "",
    );
    if read_only {
        mount(
            "",
            target,
            "",
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_REC,
            "",
        );
    }
}

/// `path` inside `root` with every symlink on the way resolved inside `root`, as runc's
/// secure join does: an absolute link target starts again at `root` (Debian's `/var/run ->
/// /run` must not lead to the host's `/run`).
pub fn secure_join(root: &Path, path: &str) -> PathBuf {
    let mut todo: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .rev()
        .map(String::from)
        .collect();
    let mut cur = root.to_path_buf();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "." => continue,
            ".." => {
                if cur != root {
                    cur.pop();
                }
                continue;
            }
            _ => {}
        }
        let next = cur.join(&c);
        match fs::read_link(&next) {
            Ok(target) if hops < 40 => {
                hops += 1;
                let t = target.to_string_lossy().into_owned();
                if t.starts_with('/') {
                    cur = root.to_path_buf();
                }
                todo.extend(
                    t.split('/')
                        .filter(|x| !x.is_empty())
                        .rev()
                        .map(String::from),
                );
            }
            _ => cur = next,
        }
    }
    cur
}

/// Creates `target` under `root` as what `source` is (a directory or an empty file).
fn make_mount_point(root: &Path, target: &str, source_is_dir: bool) -> PathBuf {
    let p = secure_join(root, target);
    if source_is_dir {
        fs::create_dir_all(&p).unwrap_or_else(|e| fail(&format!("mkdir {}", p.display()), e));
    } else {
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent)
                .unwrap_or_else(|e| fail(&format!("mkdir {}", parent.display()), e));
        }
        if !p.exists() {
            fs::File::create(&p).unwrap_or_else(|e| fail(&format!("create {}", p.display()), e));
        }
    }
    p
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) takes no pointers and is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

fn enter_netns(path: &Path) {
    let f = fs::File::open(path).unwrap_or_else(|e| fail(&format!("open {}", path.display()), e));
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| fail("setns net", e));
}

/// Forks; the parent forwards signals to the child and exits with its status. With `pid_file`,
/// the child's pid is written there once the child has exec'd its command (or died), as a
/// runtime reports a container started: a hook that joins the container's namespaces before
/// then would find the host's mount namespace, not the container's root.
fn fork_and_wait(pid_file: Option<&Path>) {
    // The child's copy of the write end closes at its execve (O_CLOEXEC) or exit: EOF here.
    let started = pid_file.map(|_| {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap_or_else(|e| fail("pipe2", e))
    });
    // SAFETY: the launcher is single-threaded here (a fresh `kubelet __container` process), so
    // the child may run Rust code after fork.
    let pid = unsafe { libc::fork() };
    check("fork", pid);
    if pid == 0 {
        if let Some((read, write)) = started {
            drop(read);
            // Kept open until the exec: leaked on purpose (closed by O_CLOEXEC).
            std::mem::forget(write);
        }
        // The container dies with its launcher, as with a runtime shim gone.
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes no pointers.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        return;
    }
    CHILD.store(pid, Ordering::SeqCst);
    if let (Some(f), Some((read, write))) = (pid_file, started) {
        drop(write);
        let mut done = [0u8; 1];
        let mut read = fs::File::from(read);
        // Blocks until every write end is closed: the child exec'd (or died).
        let _ = std::io::Read::read(&mut read, &mut done);
        let _ = fs::write(f, pid.to_string());
    }
    for sig in [
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGHUP,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        // SAFETY: `forward` is an extern "C" handler that only loads an atomic and calls kill(2).
        unsafe { libc::signal(sig, forward as *const () as libc::sighandler_t) };
    }
    let mut status = 0;
    loop {
        // SAFETY: `status` is a live i32 waitpid(2) writes to.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            break;
        }
        if rc < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            fail("waitpid", std::io::Error::last_os_error());
        }
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    std::process::exit(code);
}

/// Takes the container's identity and execs its command (never returns).
fn become_and_exec(l: &Launch) -> ! {
    // The hard limit cannot be raised above the launcher's own without CAP_SYS_RESOURCE, which
    // some test machines do not grant even to root: then the runtime's hard limit is capped
    // there (the soft limit, what the agent starts with, is the runtime's either way).
    let mut own = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes only the struct passed to it.
    check("getrlimit NOFILE", unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut own)
    });
    let rl = libc::rlimit {
        rlim_cur: l.nofile.0.min(own.rlim_max),
        rlim_max: l.nofile.1.min(own.rlim_max),
    };
    // SAFETY: setrlimit(2) reads only the struct passed to it.
    check("setrlimit NOFILE", unsafe {
        libc::setrlimit(libc::RLIMIT_NOFILE, &rl)
    });
    let groups: Vec<libc::gid_t> = l.groups.clone();
    // SAFETY: `groups` is a live slice of `groups.len()` gids.
    check("setgroups", unsafe {
        libc::setgroups(groups.len(), groups.as_ptr())
    });
    // SAFETY: setresgid(2) takes no pointers.
    check("setresgid", unsafe { libc::setresgid(l.gid, l.gid, l.gid) });
    let last_cap: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    for cap in 0..=last_cap {
        if !l.capabilities.contains(&cap) {
            // SAFETY: prctl(PR_CAPBSET_DROP) takes no pointers.
            check(&format!("drop capability {cap}"), unsafe {
                libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0)
            });
        }
    }
    // Effective, permitted and inheritable: the container's set (for root; a non-root uid loses
    // them at setresuid and gets none at exec, as in a container without ambient capabilities).
    let mut mask = [0u32; 2];
    for cap in &l.capabilities {
        mask[(*cap / 32) as usize] |= 1 << (cap % 32);
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [0, 1].map(|i| Data {
        effective: mask[i],
        permitted: mask[i],
        inheritable: 0,
    });
    // SAFETY: setresuid(2) takes no pointers.
    check("setresuid", unsafe { libc::setresuid(l.uid, l.uid, l.uid) });
    if l.uid == 0 {
        // SAFETY: capset(2) reads a v3 header and two data structs, which `header` and `data`
        // are (repr(C)).
        check("capset", unsafe {
            libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int
        });
    }
    if l.no_new_privs {
        // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes no pointers.
        check("no_new_privs", unsafe {
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        });
    }
    let path = l
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    let Some(program) = l.argv.first() else {
        fail("exec", "no command")
    };
    let resolved = if program.contains('/') {
        PathBuf::from(program)
    } else {
        path.split(':')
            .map(|d| Path::new(d).join(program))
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "kubelet: exec: {program:?}: executable file not found in $PATH"
                );
                std::process::exit(127)
            })
    };
    let argv: Vec<CString> = l.argv.iter().map(cstr).collect();
    let env: Vec<CString> = l
        .env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}")))
        .collect();
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut env_p: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    env_p.push(std::ptr::null());
    let prog = cstr(&resolved);
    // SAFETY: the program path, argv and envp are NUL-terminated C strings in null-terminated
    // arrays that outlive the call.
    unsafe { libc::execve(prog.as_ptr(), argv_p.as_ptr(), env_p.as_ptr()) };
    let e = std::io::Error::last_os_error();
    let _ = writeln!(
        std::io::stderr(),
        "kubelet: exec {}: {e}",
        resolved.display()
    );
    std::process::exit(if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// `kubelet __container`: makes the container described by `l` and runs it (never returns).
pub fn container_main(l: &Launch) -> ! {
    enter_netns(&l.netns);
    // SAFETY: unshare(2) takes no pointers.
    check("unshare pid", unsafe { libc::unshare(libc::CLONE_NEWPID) });
    fork_and_wait(Some(&l.pid_file()));
    // PID 1 of the container, from here on.
    // SAFETY: unshare(2) takes no pointers.
    check("unshare mount, uts, ipc", unsafe {
        libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC)
    });
    mount("", Path::new("/"), "", libc::MS_REC | libc::MS_PRIVATE, "");
    let fsdir = l.state_dir.join("fs");
    fs::create_dir_all(&fsdir).unwrap_or_else(|e| fail("mkdir state", e));
    mount("tmpfs", &fsdir, "tmpfs", 0, "mode=0700");
    let (upper, work, root) = (fsdir.join("upper"), fsdir.join("work"), fsdir.join("root"));
    for d in [&upper, &work, &root] {
        fs::create_dir_all(d).unwrap_or_else(|e| fail("mkdir layer", e));
    }
    // The image layer: files copied in, mount points for the bound files, the volumes' mount
    // points (the runtime creates them in the container's root).
    for (path, host) in &l.image_copies {
        let p = make_mount_point(&upper, path, false);
        fs::copy(host, &p).unwrap_or_else(|e| fail(&format!("copy {}", host.display()), e));
    }
    for (path, _) in &l.image_binds {
        make_mount_point(&upper, path, false);
    }
    make_mount_point(&upper, &l.working_dir, true);
    mount(
        "overlay",
        &root,
        "overlay",
        0,
        &format!(
            "lowerdir=/,upperdir={},workdir={}",
            upper.display(),
            work.display()
        ),
    );
    for (path, host) in &l.image_binds {
        bind(host, &secure_join(&root, path), true);
    }
    mount(
        "proc",
        &root.join("proc"),
        "proc",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "",
    );
    mount(
        "sysfs",
        &root.join("sys"),
        "sysfs",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY,
        "",
    );
    let dev = root.join("dev");
    mount(
        "tmpfs",
        &dev,
        "tmpfs",
        libc::MS_NOSUID,
        "mode=755,size=65536k",
    );
    for d in ["null", "zero", "full", "random", "urandom", "tty"] {
        let p = make_mount_point(&dev, d, false);
        bind(&Path::new("/dev").join(d), &p, false);
    }
    let pts = make_mount_point(&dev, "pts", true);
    mount(
        "devpts",
        &pts,
        "devpts",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    );
    let shm = make_mount_point(&dev, "shm", true);
    mount(
        "shm",
        &shm,
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "mode=1777,size=65536k",
    );
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let _ = std::os::unix::fs::symlink(to, dev.join(link));
    }
    for m in &l.mounts {
        let target = make_mount_point(&root, &m.target, m.source.is_dir());
        bind(&m.source, &target, m.read_only);
    }
    if l.read_only_root {
        mount(
            "",
            &root,
            "",
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
            "",
        );
    }
    std::env::set_current_dir(&root).unwrap_or_else(|e| fail("chdir root", e));
    let dot = cstr(".");
    // SAFETY: pivot_root(2) with "." twice, a live C string.
    check("pivot_root", unsafe {
        libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) as libc::c_int
    });
    // SAFETY: umount2(2) on a live C string.
    check("umount old root", unsafe {
        libc::umount2(dot.as_ptr(), libc::MNT_DETACH)
    });
    std::env::set_current_dir("/").unwrap_or_else(|e| fail("chdir /", e));
    let host = cstr(&l.hostname);
    // SAFETY: `host` is a live buffer of `l.hostname.len()` bytes.
    check("sethostname", unsafe {
        libc::sethostname(host.as_ptr(), l.hostname.len())
    });
    std::env::set_current_dir(&l.working_dir)
        .unwrap_or_else(|e| fail(&format!("chdir {}", l.working_dir), e));
    become_and_exec(l)
}

/// `kubelet __exec`: runs `l.argv` inside the running container whose launcher wrote
/// `l.pid_file()` (never returns).
pub fn exec_main(l: &Launch) -> ! {
    let pid: i32 = fs::read_to_string(l.pid_file())
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| fail("exec", "the container is not running (no pid file)"));
    // The mount namespace last: the others are named through /proc, which it would hide.
    let mut files = Vec::new();
    for ns in ["ipc", "uts", "net", "pid", "mnt"] {
        let p = format!("/proc/{pid}/ns/{ns}");
        files.push(fs::File::open(&p).unwrap_or_else(|e| fail(&format!("open {p}"), e)));
    }
    for f in &files {
        nix::sched::setns(f, nix::sched::CloneFlags::empty()).unwrap_or_else(|e| fail("setns", e));
    }
    fork_and_wait(None);
    std::env::set_current_dir(&l.working_dir)
        .unwrap_or_else(|e| fail(&format!("chdir {}", l.working_dir), e));
    become_and_exec(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_sets_follow_the_runtime_defaults() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // Istio's init container: drop ALL, add NET_ADMIN and NET_RAW.
        let caps = capability_set(&s(&["NET_ADMIN", "NET_RAW"]), &s(&["ALL"]), false).unwrap();
        assert_eq!(caps, vec![12, 13]);
        // No securityContext: the runtime's 14 defaults.
        assert_eq!(
            capability_set(&[], &[], false).unwrap().len(),
            DEFAULT_CAPS.len()
        );
        assert!(capability_set(&[], &[], true).unwrap().len() > 40);
        assert!(capability_set(&s(&["NOPE"]), &[], false).is_err());
        assert_eq!(cap_number("CAP_SYS_ADMIN"), Some(21));
    }

    #[test]
    fn secure_join_stays_inside_the_root() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("run")).unwrap();
        fs::create_dir_all(root.path().join("var")).unwrap();
        std::os::unix::fs::symlink("/run", root.path().join("var/run")).unwrap();
        std::os::unix::fs::symlink("../../..", root.path().join("run/up")).unwrap();
        assert_eq!(
            secure_join(root.path(), "/var/run/secrets/x"),
            root.path().join("run/secrets/x")
        );
        assert_eq!(
            secure_join(root.path(), "/run/up/etc"),
            root.path().join("etc")
        );
    }
}
