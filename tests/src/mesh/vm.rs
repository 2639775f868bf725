//! A VM in the box: a namespace joined to the node like a pod, onboarded the way Istio's VM docs
//! do it, through the systemd unit and start script shipped in `docs/vm/` (a VM with a real
//! systemd is `scripts/vm.sh`, tested by the `vm` test binary).
//!
//! [`Unit`] reads that unit file; [`parse_env_file`] reads `cluster.env`'s `KEY='shell-quoted
//! value'` lines; [`Mesh::start_vm`] lays the `istiod-lite vm-bundle` files out at their
//! relative paths under the VM's root directory, then runs the unit's lines from that root
//! (istio-start.sh reads its files relative to it, as from `/`). Binaries named
//! `/usr/local/bin/<name>` come from the mesh's `bin/`.

use super::{Mesh, PROXY_UID, Pod, chown_r};
use crate::netns::sh;
use crate::process::Child;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the unit expects the binaries.
pub const UNIT_BIN_DIR: &str = "/usr/local/bin/";

/// A systemd unit file: sections of `Key=Value` assignments, in order.
#[derive(Debug, Clone)]
pub struct Unit {
    pub sections: Vec<(String, Vec<(String, String)>)>,
}

/// One `Exec*=` line: `+` runs with full privileges (root), whatever `User=` says.
#[derive(Debug, Clone, PartialEq)]
pub struct Exec {
    pub privileged: bool,
    pub ignore_failure: bool,
    pub argv: Vec<String>,
}

impl Unit {
    /// Parses unit-file syntax: `[Section]` headers, `Key=Value`, `#`/`;` comments, trailing
    /// `\` continuations.
    pub fn parse(text: &str) -> Result<Unit, String> {
        let mut sections: Vec<(String, Vec<(String, String)>)> = Vec::new();
        let mut pending = String::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if pending.is_empty() && (line.is_empty() || line.starts_with(['#', ';'])) {
                continue;
            }
            if let Some(cont) = line.strip_suffix('\\') {
                pending.push_str(cont);
                pending.push(' ');
                continue;
            }
            pending.push_str(line);
            let line = std::mem::take(&mut pending);
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                sections.push((name.to_string(), Vec::new()));
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("line {}: expected Key=Value: {raw:?}", n + 1))?;
            let section = sections
                .last_mut()
                .ok_or_else(|| format!("line {}: assignment outside a section", n + 1))?;
            section.1.push((k.trim().to_string(), v.trim().to_string()));
        }
        Ok(Unit { sections })
    }

    /// Every value of `key` in `section`, in order.
    pub fn all(&self, section: &str, key: &str) -> Vec<&str> {
        self.sections
            .iter()
            .filter(|(s, _)| s == section)
            .flat_map(|(_, kv)| kv.iter())
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The last value of `key` in `section`.
    pub fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.all(section, key).last().copied()
    }

    /// The service's environment as systemd builds it: `Environment=` assignments in order
    /// (specifiers expanded), then each `EnvironmentFile=` (read through `read_file`, which maps
    /// the unit's absolute path onto the test's root), whose settings override them.
    pub fn environment(
        &self,
        hostname: &str,
        read_file: impl Fn(&str) -> Result<String, String>,
    ) -> Result<BTreeMap<String, String>, String> {
        let mut env = BTreeMap::new();
        for line in self.all("Service", "Environment") {
            for word in split_words(&expand_specifiers(line, hostname)?)? {
                let (k, v) = word
                    .split_once('=')
                    .ok_or_else(|| format!("Environment={line}: {word:?} is not KEY=VALUE"))?;
                env.insert(k.to_string(), v.to_string());
            }
        }
        for file in self.all("Service", "EnvironmentFile") {
            let (optional, path) = match file.strip_prefix('-') {
                Some(p) => (true, p),
                None => (false, file),
            };
            match read_file(path) {
                Ok(text) => env.extend(parse_env_file(&text)?),
                Err(e) if optional => {
                    let _ = e;
                }
                Err(e) => return Err(format!("EnvironmentFile={path}: {e}")),
            }
        }
        Ok(env)
    }

    /// The `key` (`ExecStartPre`, `ExecStart`, ...) command lines with `${VAR}` expanded from
    /// `env` (an unset variable expands to nothing).
    pub fn exec(&self, key: &str, env: &BTreeMap<String, String>) -> Result<Vec<Exec>, String> {
        let mut out = Vec::new();
        for line in self.all("Service", key) {
            let mut rest = line;
            let (mut privileged, mut ignore_failure) = (false, false);
            loop {
                if let Some(r) = rest.strip_prefix('+') {
                    privileged = true;
                    rest = r;
                } else if let Some(r) = rest.strip_prefix('-') {
                    ignore_failure = true;
                    rest = r;
                } else {
                    break;
                }
            }
            let argv = split_words(rest)?
                .into_iter()
                .map(|w| expand_vars(&w, env))
                .collect::<Vec<_>>();
            if argv.is_empty() {
                return Err(format!("{key}={line}: no command"));
            }
            out.push(Exec {
                privileged,
                ignore_failure,
                argv,
            });
        }
        Ok(out)
    }
}

/// `%H` (host name) and `%%`; any other specifier is an error (the unit should not need one).
fn expand_specifiers(s: &str, hostname: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('H') => out.push_str(hostname),
            Some('%') => out.push('%'),
            other => return Err(format!("unsupported specifier %{other:?} in {s:?}")),
        }
    }
    Ok(out)
}

fn expand_vars(word: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find('}') {
            Some(end) => {
                out.push_str(env.get(&after[..end]).map(String::as_str).unwrap_or(""));
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// Splits a unit value into words: whitespace separates, `"..."` and `'...'` quote (quotes
/// removed), `\` escapes the next character outside single quotes.
pub fn split_words(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err(format!("unterminated ' in {s:?}")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => cur.push(c),
                            None => return Err(format!("trailing \\ in {s:?}")),
                        },
                        Some(c) => cur.push(c),
                        None => return Err(format!("unterminated \" in {s:?}")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => cur.push(c),
                    None => return Err(format!("trailing \\ in {s:?}")),
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// Parses an environment file the way systemd's `EnvironmentFile=` (and `set -a; . file`) reads
/// `cluster.env`: `KEY=value` lines, `#`/`;` comments, values quoted with `'...'` (literal) or
/// `"..."` (backslash escapes), unquoted parts with `\` escapes, parts concatenated, so the
/// shell quoting `'it'\''s'` reads back as `it's`.
pub fn parse_env_file(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| format!("line {}: expected KEY=VALUE: {raw:?}", n + 1))?;
        let key = key.trim();
        if key.is_empty()
            || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || key.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(format!("line {}: invalid variable name {key:?}", n + 1));
        }
        let words = split_words(value).map_err(|e| format!("line {}: {e}", n + 1))?;
        if words.len() > 1 {
            return Err(format!(
                "line {}: unquoted whitespace in the value of {key}",
                n + 1
            ));
        }
        env.insert(
            key.to_string(),
            words.into_iter().next().unwrap_or_default(),
        );
    }
    Ok(env)
}

/// What [`Mesh::start_vm`] did, for assertions.
pub struct VmStart {
    /// The environment the unit's lines were given (istio-start.sh's own settings; it reads
    /// cluster.env itself).
    pub env: BTreeMap<String, String>,
    /// The unit's `ExecStart=` after expansion.
    pub exec_start: Exec,
    /// `WorkingDirectory=` mapped onto the VM's root.
    pub cwd: PathBuf,
}

/// The VM's files, at the paths the unit and the agent read them from (relative to `/`).
pub const VM_FILES: &[(&str, &str)] = &[
    ("cluster.env", "var/lib/istio/envoy/cluster.env"),
    ("mesh.yaml", "etc/istio/config/mesh"),
    ("root-cert.pem", "etc/certs/root-cert.pem"),
    ("istio-token", "var/run/secrets/tokens/istio-token"),
];

impl Mesh {
    /// `istiod-lite vm-bundle` for `vm` (service account `vm-sa`, WorkloadGroup `name`), with
    /// istiod at the VM's node address (so the bundle's `hosts` maps istiod's name).
    pub fn vm_bundle(&self, vm: &Pod, name: &str) -> PathBuf {
        let out = self.root.path().join(format!("bundle-{}", vm.name));
        sh(Command::new(self.bin("istiod-lite"))
            .arg("vm-bundle")
            .arg("--ca-dir")
            .arg(self.ca_dir())
            .args(["--namespace", super::NAMESPACE])
            .args(["--service-account", &vm.service_account])
            .args(["--name", name])
            .arg("--discovery-address")
            .arg(format!("{}:15012", vm.node_ip))
            .arg("--output")
            .arg(&out));
        out
    }

    /// Onboards `vm` as Istio's VM guide does, with `unit` (docs/vm/istio.service): the bundle's
    /// files go to their places under the VM's root (`vm.dir` stands for `/`), its `hosts` is
    /// appended to the VM's /etc/hosts, then the unit's lines run in the VM's namespace from
    /// that root: `ExecStartPre=`'s `install -d … /var/run/secrets` on the root's copy, and
    /// `ExecStart=` (istio-start.sh: the capture as root, then pilot-agent as `EXEC_USER`).
    ///
    /// What differs from a VM, given to istio-start.sh through its own settings:
    /// `ISTIO_BIN_BASE` (the mesh's `bin/`), `EXEC_USER` the proxy uid (this host has no
    /// istio-proxy user), and a `PROXY_CONFIG` whose `binaryPath` is the mesh's Envoy.
    pub fn start_vm(&self, vm: &mut Pod, bundle: &Path, unit: &Unit) -> VmStart {
        for (from, to) in VM_FILES {
            let dest = vm.dir.join(to);
            std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
            std::fs::copy(bundle.join(from), &dest)
                .unwrap_or_else(|e| panic!("copy {from} to {}: {e}", dest.display()));
        }
        let hosts = std::fs::read_to_string(bundle.join("hosts")).expect("bundle hosts");
        let etc_hosts = PathBuf::from("/etc/netns").join(vm.ns.name()).join("hosts");
        // The VM's /etc/hosts knows only localhost until the bundle's line is appended.
        std::fs::write(&etc_hosts, format!("127.0.0.1 localhost\n{hosts}")).expect("hosts");

        let env = BTreeMap::new();
        for exec in unit.exec("ExecStartPre", &env).expect("ExecStartPre") {
            // `+/usr/bin/install -d -o istio-proxy -m 0755 /var/run/secrets`, on the VM's root.
            let dir = exec.argv.last().expect("a directory");
            assert!(
                exec.privileged && exec.argv[0] == "/usr/bin/install" && dir.starts_with('/'),
                "unexpected ExecStartPre= {exec:?}"
            );
            std::fs::create_dir_all(vm.dir.join(dir.trim_start_matches('/'))).expect("mkdir");
        }
        chown_r(&vm.dir, PROXY_UID);

        let cwd = vm.dir.clone();
        let pc = serde_json::json!({
            "controlPlaneAuthPolicy": "MUTUAL_TLS",
            "binaryPath": self.bin("envoy").display().to_string(),
        });
        let env: BTreeMap<String, String> = [
            ("ISTIO_BIN_BASE", self.bin("").display().to_string()),
            ("EXEC_USER", PROXY_UID.to_string()),
            ("PROXY_CONFIG", pc.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.trim_end_matches('/').to_string()))
        .collect();
        assert_eq!(unit.get("Service", "User"), None, "the unit runs as root");
        let mut starts = unit.exec("ExecStart", &env).expect("ExecStart");
        assert_eq!(starts.len(), 1, "one ExecStart= for Type=simple");
        let exec_start = starts.remove(0);
        let cmd = self.unit_command(vm, &exec_start, &env, &cwd);
        vm.agent = Some(Child::spawn(&format!("agent-{}", vm.name), cmd));
        VmStart {
            env,
            exec_start,
            cwd,
        }
    }

    /// Stops the VM's agent as systemd does with `KillMode=mixed` (SIGTERM to the main process,
    /// the agent, which istio-start.sh became; SIGKILL after `TimeoutStopSec=`), then runs the
    /// unit's `ExecStopPost=` lines. Returns the agent's exit status if it exited before the
    /// timeout.
    pub fn stop_vm(
        &self,
        vm: &mut Pod,
        unit: &Unit,
        started: &VmStart,
    ) -> Option<std::process::ExitStatus> {
        let timeout = unit
            .get("Service", "TimeoutStopSec")
            .and_then(|t| t.strip_suffix('s').unwrap_or(t).parse::<u64>().ok())
            .unwrap_or(90);
        let mut status = None;
        if let Some(mut agent) = vm.agent.take() {
            agent.signal(nix::sys::signal::Signal::SIGTERM);
            status = agent.wait_timeout(std::time::Duration::from_secs(timeout));
        }
        self.run_unit_lines(vm, unit, "ExecStopPost", &started.env, &started.cwd);
        status
    }

    /// The command for one of the unit's lines, in the VM's namespace: as root when `+` or when
    /// the unit has no `User=`, else as the proxy user; `/usr/local/bin/<name>` from the mesh's
    /// `bin/`.
    fn unit_command(
        &self,
        vm: &Pod,
        exec: &Exec,
        env: &BTreeMap<String, String>,
        cwd: &Path,
    ) -> Command {
        let program = exec.argv[0]
            .strip_prefix(UNIT_BIN_DIR)
            .map(|name| self.bin(name))
            .unwrap_or_else(|| PathBuf::from(&exec.argv[0]));
        let mut cmd = if exec.privileged || vm_unit_runs_as_root(env) {
            vm.ns.cmd(program)
        } else {
            vm.ns.cmd_as(PROXY_UID, PROXY_UID, program)
        };
        cmd.args(&exec.argv[1..])
            .current_dir(cwd)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .envs(env);
        cmd
    }

    /// Runs every `key=` line of the unit to completion; a failure fails the test unless the
    /// line has the `-` prefix.
    fn run_unit_lines(
        &self,
        vm: &Pod,
        unit: &Unit,
        key: &str,
        env: &BTreeMap<String, String>,
        cwd: &Path,
    ) {
        for exec in unit.exec(key, env).unwrap_or_else(|e| panic!("{key}: {e}")) {
            let out = self
                .unit_command(vm, &exec, env, cwd)
                .output()
                .unwrap_or_else(|e| panic!("run {:?}: {e}", exec.argv));
            assert!(
                out.status.success() || exec.ignore_failure,
                "{key} {:?} failed: {}{}",
                exec.argv,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The unit runs its lines as root (no `User=`; istio-start.sh changes to `EXEC_USER` itself):
/// true for every environment [`Mesh::start_vm`] builds.
fn vm_unit_runs_as_root(env: &BTreeMap<String, String>) -> bool {
    env.contains_key("EXEC_USER")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_file_reads_shell_quoting_back() {
        let env = parse_env_file(
            "# comment\nA='x y'\nB='it'\\''s'\nC=plain\nD=\"q\\\"d\"\nE=''\nF='*'\n",
        )
        .unwrap();
        assert_eq!(env["A"], "x y");
        assert_eq!(env["B"], "it's");
        assert_eq!(env["C"], "plain");
        assert_eq!(env["D"], "q\"d");
        assert_eq!(env["E"], "");
        assert_eq!(env["F"], "*");
        assert!(parse_env_file("A=x y\n").is_err());
        assert!(parse_env_file("A='open\n").is_err());
        assert!(parse_env_file("1A=x\n").is_err());
    }

    #[test]
    fn unit_environment_file_overrides_environment() {
        let unit = Unit::parse(
            "[Service]\nEnvironment=A=1 B=2\nEnvironment='J={\"k\":\"v\"}'\nEnvironment=H=%H\n\
             EnvironmentFile=/x/cluster.env\nEnvironmentFile=-/missing\n\
             ExecStartPre=+/usr/local/bin/tool --flag\nExecStart=/bin/run ${B} ${NOPE}\n",
        )
        .unwrap();
        let env = unit
            .environment("host1", |p| match p {
                "/x/cluster.env" => Ok("B='3'\n".into()),
                _ => Err("missing".into()),
            })
            .unwrap();
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "3");
        assert_eq!(env["J"], r#"{"k":"v"}"#);
        assert_eq!(env["H"], "host1");
        let pre = unit.exec("ExecStartPre", &env).unwrap();
        assert_eq!(
            pre,
            vec![Exec {
                privileged: true,
                ignore_failure: false,
                argv: vec!["/usr/local/bin/tool".into(), "--flag".into()],
            }]
        );
        let start = unit.exec("ExecStart", &env).unwrap();
        assert_eq!(start[0].argv, vec!["/bin/run", "3", ""]);
    }
}
