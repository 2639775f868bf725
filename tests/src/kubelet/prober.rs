//! The kubelet's probe workers and its runner of actions: network probes from the node's
//! namespace, exec through `kubelet __exec` in the container; startup gates readiness and
//! liveness, thresholds as Kubernetes counts them.

use super::container_spec::random_suffix;
use super::pod::{Events, Running, State};
use super::probe::{self, Action, Timing};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(crate) fn run_exec(
    mut cmd: std::process::Command,
    timeout: Duration,
) -> Result<(i32, String), String> {
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("exec: {e}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(_s) = child.try_wait().map_err(|e| e.to_string())? {
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            return Ok((out.status.code().unwrap_or(-1), text));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("timed out after {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn act(
    node_ns: &str,
    kubelet: &Path,
    c: &Running,
    action: &Action,
    timeout: Duration,
) -> Result<String, String> {
    match action {
        Action::Exec(argv) => {
            let mut l = c.launch.clone();
            l.argv = argv.clone();
            let file = l.state_dir.join(format!("exec-{}.json", random_suffix(6)));
            std::fs::write(&file, serde_json::to_vec(&l).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            let mut cmd = std::process::Command::new(kubelet);
            cmd.arg("__exec").arg(&file).env_clear();
            let r = run_exec(cmd, timeout);
            let _ = std::fs::remove_file(&file);
            match r? {
                (0, out) => Ok(format!("exec {argv:?}: exit 0 {}", out.trim())),
                (code, out) => Err(format!("exec {argv:?}: exit {code}: {}", out.trim())),
            }
        }
        other => {
            let path = PathBuf::from("/run/netns").join(node_ns);
            let action = other.clone();
            std::thread::spawn(move || {
                let f = std::fs::File::open(&path).map_err(|e| e.to_string())?;
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| e.to_string())?;
                probe::run_network(&action, timeout)
            })
            .join()
            .unwrap_or_else(|_| Err("probe thread panicked".into()))
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn prober(
    which: &str,
    c: &Running,
    action: &Action,
    t: Timing,
    state: &State,
    events: &Events,
    node_ns: &str,
    kubelet: &Path,
) {
    std::thread::sleep(t.initial_delay);
    let (mut ok_run, mut fail_run) = (0u32, 0u32);
    let mut next = Instant::now();
    loop {
        if state.stop.load(Ordering::SeqCst) {
            return;
        }
        let gated = which != "startup" && !state.started.load(Ordering::SeqCst);
        let done_startup = which == "startup" && state.started.load(Ordering::SeqCst);
        if done_startup {
            return;
        }
        if !gated && Instant::now() >= next {
            let r = act(node_ns, kubelet, c, action, t.timeout);
            next = Instant::now() + t.period;
            match r {
                Ok(m) => {
                    fail_run = 0;
                    ok_run += 1;
                    if ok_run >= t.success_threshold {
                        match which {
                            "startup" => {
                                state.started.store(true, Ordering::SeqCst);
                                events.say(format!(
                                    "container {} startup probe passed: {m}",
                                    c.spec.name
                                ));
                                // The readiness probe runs as soon as the container has started.
                            }
                            "readiness" if !state.ready.swap(true, Ordering::SeqCst) => {
                                events.say(format!("container {} ready: {m}", c.spec.name));
                            }
                            _ => {}
                        }
                    }
                }
                Err(e) => {
                    ok_run = 0;
                    fail_run += 1;
                    if fail_run >= t.failure_threshold {
                        match which {
                            "readiness" => {
                                if state.ready.swap(false, Ordering::SeqCst) {
                                    events.say(format!("container {} not ready: {e}", c.spec.name));
                                }
                            }
                            "liveness" => {
                                state.liveness_failures.fetch_add(1, Ordering::SeqCst);
                                events.say(format!("container {} liveness probe failed (the kubelet would restart it): {e}", c.spec.name));
                                fail_run = 0;
                            }
                            _ => {
                                events.say(format!(
                                    "container {} startup probe failed: {e}",
                                    c.spec.name
                                ));
                                fail_run = 0;
                            }
                        }
                    }
                }
            }
        }
        // A started container's readiness is probed at once rather than a period later.
        if which == "readiness"
            && !gated
            && !state.ready.load(Ordering::SeqCst)
            && ok_run == 0
            && fail_run == 0
        {
            next = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(if gated { 10 } else { 50 }));
    }
}
