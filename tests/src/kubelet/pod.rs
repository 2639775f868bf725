//! A pod's life as the kubelet runs it: sandbox (network namespace, hosts and resolver files),
//! volumes, init containers in order and to completion, native sidecars (`restartPolicy:
//! Always` init containers) started and their startup probe awaited before the next container,
//! app containers started in order with `postStart` blocking the next, probes on their periods,
//! and termination as the kubelet's `killContainer` does it for each container at once: its
//! `preStop` first (native sidecars' too, at the start of termination), then, for a native
//! sidecar, its turn (the app containers and the sidecars started after it gone: reverse order),
//! then SIGTERM, with SIGKILL at the end of `terminationGracePeriodSeconds` or, for a container
//! whose turn came late, never sooner than 2 s after its SIGTERM (the kubelet's minimum).

use super::container::Launch;
use super::container_spec::{Ctx, identity};
use super::probe::{self, Action, Timing};
use super::prober::{act, prober, run_exec};
use super::spec::{Container, PodManifest, Probe};
use super::volumes;
use crate::netns::Netns;
use crate::process::Child;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The runtime's open-file limit for containers (containerd 2: soft 1024, hard 524288).
pub const CONTAINER_NOFILE: (u64, u64) = (1024, 524_288);

/// The kubelet's `minimumGracePeriodInSeconds`: the least time a container gets between its
/// SIGTERM and SIGKILL, even past the pod's grace period.
pub const MINIMUM_GRACE: Duration = Duration::from_secs(2);

/// What runs the pod: the node's namespace (probes come from there), the binaries, the CA.
pub struct Node {
    pub ns_name: String,
    /// The kubelet binary (its `__container` and `__exec` modes).
    pub kubelet_bin: PathBuf,
    /// `pilot-agent`, `envoy`, `pod-app` for the images.
    pub bin_dir: PathBuf,
    /// Istio's bootstrap template for the proxy image, when available.
    pub bootstrap_template: Option<PathBuf>,
    pub node_name: String,
    pub root_cert: String,
    /// Issues a token: (namespace, service account, audience, ttl seconds).
    #[allow(clippy::type_complexity)]
    pub token: Box<dyn Fn(&str, &str, &str, u64) -> Result<String, String> + Send + Sync>,
    /// The cluster DNS server's address (the pods' `nameserver`).
    pub cluster_dns: String,
    pub spire_dir: Option<PathBuf>,
    /// Extra arguments for the test app of a container (by container name).
    pub app_extra_args: BTreeMap<String, Vec<String>>,
}

/// The pod's sandbox network.
pub struct Sandbox {
    pub ns: Netns,
    pub ip: String,
    pub host_ip: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Init,
    Sidecar,
    App,
}

/// The state probes keep.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) started: AtomicBool,
    pub(crate) ready: AtomicBool,
    pub(crate) liveness_failures: AtomicU32,
    pub(crate) stop: AtomicBool,
}

pub(crate) struct Running {
    pub(crate) spec: Container,
    pub(crate) kind: Kind,
    pub(crate) launch: Launch,
    pub(crate) child: Option<Child>,
    pub(crate) state: Arc<State>,
}

/// Events, printed as they happen and kept for the report.
#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Vec<String>>>);

impl Events {
    pub fn say(&self, line: String) {
        eprintln!("[kubelet] {line}");
        self.0.lock().expect("events").push(line);
    }
    pub fn all(&self) -> Vec<String> {
        self.0.lock().expect("events").clone()
    }
}

/// How one container ended.
#[derive(Debug, Clone)]
pub struct Ended {
    pub name: String,
    pub code: Option<i32>,
    /// When, from the start of termination.
    pub after: Duration,
    pub killed: bool,
}

/// A running pod.
pub struct Pod {
    pub name: String,
    pub manifest: PodManifest,
    pub sandbox: Sandbox,
    pub dir: PathBuf,
    pub labels: BTreeMap<String, String>,
    pub events: Events,
    /// When the kubelet began starting the pod's containers.
    pub created: Instant,
    node_ns: String,
    kubelet_bin: PathBuf,
    containers: Vec<Running>,
    tmpfs: Vec<PathBuf>,
}

impl Pod {
    /// Makes the pod's sandbox, volumes and containers, in the kubelet's order, and returns
    /// once every container has been started (init containers completed, native sidecars
    /// started). Errors say which container or field failed.
    pub fn start(
        node: &Node,
        manifest: PodManifest,
        sandbox: Sandbox,
        dir: PathBuf,
    ) -> Result<Pod, String> {
        if manifest.spec.host_network == Some(true) {
            return Err("spec.hostNetwork: the runner runs pods in their own network".into());
        }
        if manifest.spec.share_process_namespace == Some(true) {
            return Err("spec.shareProcessNamespace: not supported by the runner".into());
        }
        let (name, labels) = identity(&manifest);
        let events = Events::default();
        events.say(format!(
            "pod {name}: {} {} in namespace {}",
            manifest.kind,
            manifest.workload,
            manifest.namespace()
        ));
        let mut annotations = manifest.metadata.annotations.clone();
        annotations.insert("kubernetes.io/config.seen".into(), rfc3339_now());
        annotations.insert("kubernetes.io/config.source".into(), "api".into());
        std::fs::create_dir_all(&dir).map_err(|e| format!("pod dir: {e}"))?;
        apply_sysctls(&manifest, &sandbox)?;
        write_pod_files(node, &manifest, &sandbox, &dir, &name)?;
        let ns = manifest.namespace();
        let token = |aud: &str, ttl: u64| (node.token)(ns, manifest.service_account(), aud, ttl);
        let vols = volumes::set_up(
            &dir.join("volumes"),
            &volumes::Inputs {
                pod: &manifest,
                pod_name: &name,
                pod_ip: &sandbox.ip,
                host_ip: &sandbox.host_ip,
                node_name: &node.node_name,
                labels: &labels,
                annotations: &annotations,
                root_cert: &node.root_cert,
                token: &token,
                spire_dir: node.spire_dir.as_deref(),
            },
        )?;
        let tmpfs = vols
            .values()
            .filter(|v| v.tmpfs)
            .map(|v| v.path.clone())
            .collect();
        let mut pod = Pod {
            name: name.clone(),
            manifest: manifest.clone(),
            sandbox,
            dir: dir.clone(),
            labels,
            events,
            created: Instant::now(),
            node_ns: node.ns_name.clone(),
            kubelet_bin: node.kubelet_bin.clone(),
            containers: Vec::new(),
            tmpfs,
        };
        let ctx = Ctx {
            node,
            m: &manifest,
            name: &name,
            sandbox: &pod.sandbox,
            dir: &dir,
            vols: &vols,
            annotations: &annotations,
        };
        let mut launches = Vec::new();
        for c in &manifest.spec.init_containers {
            let kind = if c.is_sidecar() {
                Kind::Sidecar
            } else {
                Kind::Init
            };
            launches.push((c.clone(), kind, ctx.launch(c)?));
        }
        for c in &manifest.spec.containers {
            launches.push((c.clone(), Kind::App, ctx.launch(c)?));
        }
        for (spec, kind, launch) in launches {
            pod.run_container(spec, kind, launch)?;
        }
        Ok(pod)
    }

    fn spawn(
        &self,
        c: &Container,
        launch: &Launch,
        mode: &str,
        argv: Option<Vec<String>>,
    ) -> Result<std::process::Command, String> {
        let mut l = launch.clone();
        if let Some(a) = argv {
            l.argv = a;
        }
        let file = launch.state_dir.join(format!("{mode}.json"));
        std::fs::write(&file, serde_json::to_vec(&l).map_err(|e| e.to_string())?)
            .map_err(|e| format!("container {:?}: {e}", c.name))?;
        let mut cmd = std::process::Command::new(&self.kubelet_bin);
        cmd.arg(format!("__{mode}")).arg(file).env_clear();
        Ok(cmd)
    }

    /// Starts the container's process and waits until the runtime reports it started (its
    /// PID known), as the kubelet's StartContainer returns.
    fn start_process(&self, spec: &Container, launch: &Launch) -> Result<Child, String> {
        let _ = std::fs::remove_file(launch.pid_file());
        let cmd = self.spawn(spec, launch, "container", None)?;
        let mut child = Child::spawn(&format!("{}/{}", self.name, spec.name), cmd);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !launch.pid_file().exists() {
            if let Some(s) = child.try_wait() {
                return Err(format!(
                    "container {:?} failed to start: {s}: {:?}",
                    spec.name,
                    child.output()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("container {:?} did not start in 10 s", spec.name));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(child)
    }

    fn run_container(&mut self, spec: Container, kind: Kind, launch: Launch) -> Result<(), String> {
        let mut child = self.start_process(&spec, &launch)?;
        let started_at = Instant::now();
        self.events.say(format!(
            "container {} started ({:?}, uid {})",
            spec.name, kind, launch.uid
        ));
        let state = Arc::new(State::default());
        // postStart runs before the next container starts. It races the entrypoint, as in
        // Kubernetes; a failed hook kills the container, which is restarted after the
        // kubelet's first back-off (10 s), a few times at most.
        if kind != Kind::Init
            && let Some(h) = spec.lifecycle.as_ref().and_then(|l| l.post_start.as_ref())
        {
            let action = probe::handler_action(&spec, h, &self.sandbox.ip)?;
            let mut attempt = 1;
            loop {
                let probe_target = Running {
                    spec: spec.clone(),
                    kind,
                    launch: launch.clone(),
                    child: None,
                    state: state.clone(),
                };
                match self.act(&probe_target, &action, Duration::from_secs(120)) {
                    Ok(m) => {
                        self.events
                            .say(format!("container {} postStart: {m}", spec.name));
                        break;
                    }
                    Err(e) if attempt < 3 => {
                        self.events.say(format!(
                            "container {} FailedPostStartHook ({e}): killed, restarted in 10 s",
                            spec.name
                        ));
                        drop(child);
                        std::thread::sleep(Duration::from_secs(10));
                        child = self.start_process(&spec, &launch)?;
                        attempt += 1;
                    }
                    Err(e) => {
                        return Err(format!(
                            "container {:?}: postStart hook failed: {e}",
                            spec.name
                        ));
                    }
                }
            }
        }
        let mut running = Running {
            spec: spec.clone(),
            kind,
            launch,
            child: Some(child),
            state: state.clone(),
        };
        if kind == Kind::Init {
            let status = running
                .child
                .as_mut()
                .expect("child")
                .wait_timeout(Duration::from_secs(120));
            let code = status.and_then(|s| s.code());
            self.events.say(format!(
                "init container {} exited {code:?} after {:?}",
                spec.name,
                started_at.elapsed()
            ));
            if code != Some(0) {
                return Err(format!(
                    "init container {:?} failed: exit {code:?}",
                    spec.name
                ));
            }
            self.containers.push(running);
            return Ok(());
        }
        state
            .started
            .store(spec.startup_probe.is_none(), Ordering::SeqCst);
        if spec.readiness_probe.is_none() {
            state
                .ready
                .store(spec.startup_probe.is_none(), Ordering::SeqCst);
        }
        self.start_probes(&running)?;
        if kind == Kind::Sidecar && spec.startup_probe.is_some() {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !state.started.load(Ordering::SeqCst) {
                if let Some(s) = running.child.as_mut().and_then(|c| c.try_wait()) {
                    return Err(format!(
                        "sidecar {:?} exited before its startup probe passed: {s}",
                        spec.name
                    ));
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "sidecar {:?}: startup probe did not pass in 120 s",
                        spec.name
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            self.events.say(format!(
                "sidecar {} started after {:?}",
                spec.name,
                started_at.elapsed()
            ));
        }
        self.containers.push(running);
        Ok(())
    }

    /// Runs a probe or hook action for a container: network actions from the node, exec in it.
    fn act(&self, c: &Running, action: &Action, timeout: Duration) -> Result<String, String> {
        act(&self.node_ns, &self.kubelet_bin, c, action, timeout)
    }

    fn start_probes(&self, c: &Running) -> Result<(), String> {
        let probes: [(&str, &Option<Probe>); 3] = [
            ("startup", &c.spec.startup_probe),
            ("readiness", &c.spec.readiness_probe),
            ("liveness", &c.spec.liveness_probe),
        ];
        for (which, p) in probes {
            let Some(p) = p else { continue };
            let action = probe::probe_action(&c.spec, p, &self.sandbox.ip)?;
            let timing = Timing::of(p);
            let state = c.state.clone();
            let events = self.events.clone();
            let (node_ns, kubelet) = (self.node_ns.clone(), self.kubelet_bin.clone());
            let container = Running {
                spec: c.spec.clone(),
                kind: c.kind,
                launch: c.launch.clone(),
                child: None,
                state: c.state.clone(),
            };
            let which = which.to_string();
            std::thread::spawn(move || {
                prober(
                    &which, &container, &action, timing, &state, &events, &node_ns, &kubelet,
                )
            });
        }
        Ok(())
    }

    /// Whether every container is ready (Kubernetes' pod `Ready` condition).
    pub fn ready(&self) -> Result<(), String> {
        let not: Vec<&str> = self
            .containers
            .iter()
            .filter(|c| c.kind != Kind::Init && !c.state.ready.load(Ordering::SeqCst))
            .map(|c| c.spec.name.as_str())
            .collect();
        match not.is_empty() {
            true => Ok(()),
            false => Err(format!("containers not ready: {not:?}")),
        }
    }

    /// Waits for the pod to be ready; returns the time from the pod's creation.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Duration, String> {
        let start = self.created;
        loop {
            self.check_running()?;
            match self.ready() {
                Ok(()) => {
                    self.events.say(format!(
                        "pod {} ready after {:?}",
                        self.name,
                        start.elapsed()
                    ));
                    return Ok(start.elapsed());
                }
                Err(e) if start.elapsed() > timeout => {
                    return Err(format!("{e} after {timeout:?}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// An error when a long-running container has exited or failed its liveness probe.
    pub fn check_running(&mut self) -> Result<(), String> {
        for c in &mut self.containers {
            if c.kind == Kind::Init {
                continue;
            }
            let failures = c.state.liveness_failures.load(Ordering::SeqCst);
            if failures > 0 {
                return Err(format!(
                    "container {:?} failed its liveness probe ({failures} times)",
                    c.spec.name
                ));
            }
            if let Some(s) = c.child.as_mut().and_then(|ch| ch.try_wait()) {
                let tail = c.child.as_ref().map(|ch| ch.output()).unwrap_or_default();
                let tail: Vec<_> = tail.iter().rev().take(15).rev().cloned().collect();
                return Err(format!(
                    "container {:?} exited ({s}); last lines:\n{}",
                    c.spec.name,
                    tail.join("\n")
                ));
            }
        }
        Ok(())
    }

    /// Keeps watching the pod for `d`: every container running, no liveness failure, still
    /// ready.
    pub fn stay_healthy(&mut self, d: Duration) -> Result<(), String> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.check_running()?;
            self.ready()?;
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// For a pod whose app containers run to completion (a Job): waits for them all to exit;
    /// returns their exit codes.
    pub fn wait_apps_completed(&mut self, timeout: Duration) -> Result<Vec<(String, i32)>, String> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        for c in self.containers.iter_mut().filter(|c| c.kind == Kind::App) {
            let left = deadline.saturating_duration_since(Instant::now());
            let s = c
                .child
                .as_mut()
                .and_then(|ch| ch.wait_timeout(left))
                .ok_or_else(|| {
                    format!(
                        "container {:?} still running after {timeout:?}",
                        c.spec.name
                    )
                })?;
            let code = s.code().unwrap_or(-1);
            self.events
                .say(format!("container {} completed, exit {code}", c.spec.name));
            out.push((c.spec.name.clone(), code));
        }
        Ok(out)
    }

    /// The output of a container so far.
    pub fn logs(&self, container: &str) -> Vec<String> {
        self.containers
            .iter()
            .find(|c| c.spec.name == container)
            .and_then(|c| c.child.as_ref())
            .map(|c| c.output())
            .unwrap_or_default()
    }

    /// Runs a command in a container (`kubectl exec`); returns its exit code and output.
    pub fn exec(&self, container: &str, argv: &[&str]) -> Result<(i32, String), String> {
        let c = self
            .containers
            .iter()
            .find(|c| c.spec.name == container)
            .ok_or_else(|| format!("no container {container:?}"))?;
        let cmd = self.spawn(
            &c.spec,
            &c.launch,
            "exec",
            Some(argv.iter().map(|s| s.to_string()).collect()),
        )?;
        run_exec(cmd, Duration::from_secs(30))
    }

    /// Terminates the pod as the kubelet does on deletion (see the module docs); returns how
    /// each container ended.
    pub fn terminate(&mut self) -> Vec<Ended> {
        let grace = Duration::from_secs(
            self.manifest
                .spec
                .termination_grace_period_seconds
                .unwrap_or(30),
        );
        let t0 = Instant::now();
        let deadline = t0 + grace;
        self.events
            .say(format!("pod {} terminating (grace {grace:?})", self.name));
        // Every preStop at once; an app container gets SIGTERM when its own hook is done.
        let mut hooks = BTreeMap::new();
        for c in self.containers.iter().filter(|c| c.kind != Kind::Init) {
            c.state.stop.store(true, Ordering::SeqCst);
            let hook = c.spec.lifecycle.as_ref().and_then(|l| l.pre_stop.clone());
            let action = hook.map(|h| probe::handler_action(&c.spec, &h, &self.sandbox.ip));
            let pid = c.child.as_ref().map(|ch| ch.id()).unwrap_or(0);
            let term = c.kind == Kind::App;
            let (events, node_ns, kubelet) = (
                self.events.clone(),
                self.node_ns.clone(),
                self.kubelet_bin.clone(),
            );
            let copy = Running {
                spec: c.spec.clone(),
                kind: c.kind,
                launch: c.launch.clone(),
                child: None,
                state: c.state.clone(),
            };
            let name = c.spec.name.clone();
            hooks.insert(
                name,
                std::thread::spawn(move || {
                    if let Some(action) = action {
                        let left = deadline.saturating_duration_since(Instant::now());
                        let r = action.and_then(|a| act(&node_ns, &kubelet, &copy, &a, left));
                        events.say(format!(
                            "container {} preStop: {}",
                            copy.spec.name,
                            r.unwrap_or_else(|e| format!("failed: {e}"))
                        ));
                    }
                    if term && pid > 0 {
                        events.say(format!("container {} SIGTERM", copy.spec.name));
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGTERM,
                        );
                    }
                }),
            );
        }
        let mut ended = Vec::new();
        let wait = |containers: &mut [Running], which: &[usize], ended: &mut Vec<Ended>| {
            wait_for_exits(containers, which, (t0, deadline), ended);
        };
        let apps: Vec<usize> = (0..self.containers.len())
            .filter(|i| self.containers[*i].kind == Kind::App)
            .collect();
        wait(&mut self.containers, &apps, &mut ended);
        // Native sidecars: reverse order, after the app containers.
        let order: Vec<usize> = (0..self.containers.len())
            .rev()
            .filter(|i| self.containers[*i].kind == Kind::Sidecar)
            .collect();
        for i in order {
            let c = &self.containers[i];
            // Its own preStop comes first: the kubelet's killContainer runs the hook, then waits
            // for the container's turn, then stops it.
            if let Some(h) = hooks.remove(&c.spec.name) {
                let _ = h.join();
            }
            self.events.say(format!("sidecar {} SIGTERM", c.spec.name));
            c.child
                .as_ref()
                .expect("child")
                .signal(nix::sys::signal::Signal::SIGTERM);
            wait(&mut self.containers, &[i], &mut ended);
        }
        for h in hooks.into_values() {
            let _ = h.join();
        }
        for e in &ended {
            self.events.say(format!(
                "container {} {} after {:?}",
                e.name,
                if e.killed {
                    "SIGKILLed at the end of the grace period".to_string()
                } else {
                    format!("exited {:?}", e.code)
                },
                e.after
            ));
        }
        ended
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for c in &mut self.containers {
            c.state.stop.store(true, Ordering::SeqCst);
            c.child = None;
        }
        for t in &self.tmpfs {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(t)
                .output();
        }
    }
}

fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let stamp = super::utc_stamp(now.as_secs());
    let b = stamp.as_bytes();
    let s = |r: std::ops::Range<usize>| String::from_utf8_lossy(&b[r]).into_owned();
    format!(
        "{}-{}-{}T{}:{}:{}.{:09}Z",
        s(0..4),
        s(5..7),
        s(8..10),
        s(11..13),
        s(14..16),
        s(17..19),
        now.subsec_nanos()
    )
}

/// Waits for the containers `which` together (each has its own SIGTERM and runs its own
/// shutdown), each recorded in `ended` when it exits, its time counted from the termination's
/// start; SIGKILL for those left at the deadline, which the kubelet never puts less than 2 s
/// after their SIGTERM.
fn wait_for_exits(
    containers: &mut [Running],
    which: &[usize],
    (t0, deadline): (Instant, Instant),
    ended: &mut Vec<Ended>,
) {
    let end = deadline.max(Instant::now() + MINIMUM_GRACE);
    let mut left: Vec<usize> = which.to_vec();
    loop {
        left.retain(|&i| {
            let c = &mut containers[i];
            let child = c.child.as_mut().expect("child");
            let Some(status) = child.try_wait() else {
                return true;
            };
            let after = t0.elapsed();
            // What it printed last is read to its end.
            let _ = child.wait_timeout(Duration::from_secs(2));
            ended.push(Ended {
                name: c.spec.name.clone(),
                code: status.code(),
                after,
                killed: false,
            });
            false
        });
        if left.is_empty() || Instant::now() >= end {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for i in left {
        // The runtime's SIGKILL: the container is gone before the next one's turn.
        let c = &mut containers[i];
        let child = c.child.as_mut().expect("child");
        child.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = child.wait_timeout(Duration::from_secs(5));
        ended.push(Ended {
            name: c.spec.name.clone(),
            code: None,
            after: t0.elapsed(),
            killed: true,
        });
    }
}

/// The pod's `securityContext.sysctls`, set in its network namespace.
fn apply_sysctls(manifest: &PodManifest, sandbox: &Sandbox) -> Result<(), String> {
    for s in manifest
        .spec
        .security_context
        .iter()
        .flat_map(|s| &s.sysctls)
    {
        let out = sandbox
            .ns
            .cmd("sysctl")
            .args(["-qw", &format!("{}={}", s.name, s.value)])
            .output()
            .map_err(|e| format!("sysctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "securityContext.sysctls {}: {}",
                s.name,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    Ok(())
}

/// The files the kubelet writes for a pod: `/etc/hosts`, `/etc/resolv.conf`, `/etc/hostname`,
/// and the proxy image's `/etc/passwd`.
fn write_pod_files(
    node: &Node,
    manifest: &PodManifest,
    sandbox: &Sandbox,
    dir: &Path,
    name: &str,
) -> Result<(), String> {
    let ns = manifest.namespace();
    let write =
        |n: &str, s: String| std::fs::write(dir.join(n), s).map_err(|e| format!("write {n}: {e}"));
    write(
        "etc-hosts",
        format!(
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n{}\t{name}\n",
            sandbox.ip
        ),
    )?;
    write(
        "resolv.conf",
        format!(
            "search {ns}.svc.cluster.local svc.cluster.local cluster.local\nnameserver {}\noptions ndots:5\n",
            node.cluster_dns
        ),
    )?;
    write("hostname", format!("{name}\n"))?;
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    write(
        "image-passwd",
        format!("{passwd}istio-proxy:x:1337:1337::/home/istio-proxy:/bin/sh\n"),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::container_spec::expand;

    #[test]
    fn expansion_as_kubernetes() {
        let vars = vec![("POD_NAMESPACE".to_string(), "default".to_string())];
        assert_eq!(
            expand("$(POD_NAMESPACE).svc.cluster.local", &vars),
            "default.svc.cluster.local"
        );
        assert_eq!(
            expand("$(UNSET) and $$(POD_NAMESPACE)", &vars),
            "$(UNSET) and $(POD_NAMESPACE)"
        );
        assert_eq!(expand("no vars é", &vars), "no vars é");
    }
}
