//! Child processes that never outlive the test, and the workspace's own binaries.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The repository root (the workspace folder).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Path of a workspace binary (`istio-iptables`, `pilot-agent`, `istiod-lite`) in the cargo
/// target dir this test was built into. The test command builds every binary first.
pub fn workspace_bin(name: &str) -> PathBuf {
    // Test executables live in <target>/<profile>/deps/, binaries (the demo) in
    // <target>/<profile>/.
    let exe = std::env::current_exe().expect("current_exe");
    let mut profile_dir = exe.parent().expect("executable has a folder");
    if profile_dir.ends_with("deps") {
        profile_dir = profile_dir.parent().expect("deps has a parent");
    }
    let p = profile_dir.join(name);
    assert!(
        p.is_file(),
        "{} is not built: run `cargo build --workspace --bins` first (the test command does)",
        p.display()
    );
    p
}

/// A child process killed (SIGKILL) and reaped on drop. Its stdout and stderr are captured line
/// by line (and echoed to the test's stderr) so tests can wait for a log line.
pub struct Child {
    inner: Option<std::process::Child>,
    output: Arc<Mutex<Vec<String>>>,
    /// Output streams read to their end (0, 1 or 2).
    drained: Arc<std::sync::atomic::AtomicUsize>,
    name: String,
}

impl Child {
    /// Spawns `cmd` with piped stdout/stderr.
    pub fn spawn(name: &str, mut cmd: Command) -> Child {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name} ({cmd:?}): {e}"));
        let output = Arc::new(Mutex::new(Vec::new()));
        let drained = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        for (stream, tag) in [
            (Box::new(stdout) as Box<dyn std::io::Read + Send>, "out"),
            (Box::new(stderr), "err"),
        ] {
            let output = output.clone();
            let drained = drained.clone();
            let name = name.to_string();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    eprintln!("[{name} {tag}] {line}");
                    output.lock().expect("output lock").push(line);
                }
                drained.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        Child {
            inner: Some(child),
            output,
            drained,
            name: name.to_string(),
        }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.inner.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Lines printed so far (stdout and stderr interleaved as read).
    pub fn output(&self) -> Vec<String> {
        self.output.lock().expect("output lock").clone()
    }

    /// Waits until a printed line contains `needle`; returns that line.
    pub fn wait_for_line(&self, needle: &str, timeout: Duration) -> String {
        crate::assert_eventually(timeout, || {
            self.output()
                .into_iter()
                .find(|l| l.contains(needle))
                .ok_or_else(|| format!("{} has not printed {needle:?}", self.name))
        })
    }

    /// Returns the exit status if the process has exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.inner
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends a signal (e.g. `nix::sys::signal::Signal::SIGTERM`).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.inner {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// Waits for exit, at most `timeout`; then what the child printed has been read.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait() {
                // What it printed last may still be in the pipes: read them to their end (for
                // at most 2 s: a child of its own may still hold them open).
                let drained = std::time::Instant::now() + Duration::from_secs(2);
                while self.drained.load(std::sync::atomic::Ordering::SeqCst) < 2
                    && std::time::Instant::now() < drained
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                return Some(s);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(mut c) = self.inner.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
