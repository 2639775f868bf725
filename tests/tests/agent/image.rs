//! The image: the Dockerfile's final stage copies the tree `scripts/image-rootfs.sh` lays out.
//! No Docker engine runs here, so this test builds that same tree from the workspace binaries
//! and runs the entry points from it, so a broken path fails CI.

use harness::{envoy_bin, repo_root, workspace_bin};
use std::process::Command;

#[test]
fn dockerfile_final_stage_is_the_rootfs_script_tree() {
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).expect("Dockerfile");
    for needle in [
        "cargo build --profile dist --locked -p agent -p iptables-init --bins",
        "scripts/image-rootfs.sh target/dist .tools/bin/envoy /rootfs",
        "COPY --from=build /rootfs/ /",
        "--uid 1337",
        "WORKDIR /",
        "USER 1337:1337",
        r#"ENTRYPOINT ["/usr/local/bin/pilot-agent"]"#,
    ] {
        assert!(dockerfile.contains(needle), "Dockerfile lacks {needle:?}");
    }
}

#[test]
fn rootfs_runs_pilot_agent_istio_iptables_and_envoy() {
    let Some(envoy) = envoy_bin() else { return };
    let agent = workspace_bin("pilot-agent");
    let bin_dir = agent.parent().expect("bin dir").to_path_buf();
    let _ = workspace_bin("istio-iptables");
    let out = tempfile::tempdir().expect("tempdir");
    let status = Command::new(repo_root().join("scripts/image-rootfs.sh"))
        .arg(&bin_dir)
        .arg(&envoy)
        .arg(out.path())
        .status()
        .expect("run image-rootfs.sh");
    assert!(status.success(), "image-rootfs.sh failed: {status}");
    let bin = out.path().join("usr/local/bin");
    let run = |prog: &str, args: &[&str]| {
        let o = Command::new(bin.join(prog))
            .args(args)
            .current_dir(out.path())
            .output()
            .unwrap_or_else(|e| panic!("run {prog}: {e}"));
        assert!(o.status.success(), "{prog} {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };
    let v = run("pilot-agent", &["version"]);
    assert!(!v.trim().is_empty(), "pilot-agent version printed nothing");
    let help = run("istio-iptables", &["--help"]);
    assert!(
        help.contains("--envoy-port"),
        "istio-iptables --help: {help}"
    );
    let ev = run("envoy", &["--version"]);
    assert!(ev.contains("1.40.0"), "envoy --version: {ev}");
    for dir in [
        "etc/istio/proxy",
        "var/lib/istio/data",
        "var/run/secrets/istio",
    ] {
        assert!(
            out.path().join(dir).is_dir(),
            "{dir} missing from the rootfs"
        );
    }
}
