//! Driving the Debian VM of `scripts/vm.sh` from a test: the script itself and a shell inside
//! the VM. Used by the `vm` tests (against istiod-lite) and the cluster's `vm::` tests.

use std::process::Command;

use crate::repo_root;

/// `scripts/vm.sh` with a plain PATH (the VM's tools, not the test's).
pub fn vm_sh() -> Command {
    let mut c = Command::new(repo_root().join("scripts/vm.sh"));
    c.env(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    c
}

/// `vm.sh exec sh -c SCRIPT`: success and stdout+stderr.
pub fn exec(script: &str) -> (bool, String) {
    let out = vm_sh()
        .args(["exec", "sh", "-c", script])
        .output()
        .expect("vm.sh exec");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
