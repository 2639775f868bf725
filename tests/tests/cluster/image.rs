//! The cluster's `proxyv2` image (built by `scripts/cluster/images.sh`, run by the real kubelet
//! in the scenario) agrees with the Dockerfile's final stage: entrypoint, user, working
//! directory and the environment it sets, with `ISTIO_META_ISTIO_PROXY_SHA` as Istio's build of the
//! pinned module sets it. Its file tree is scripts/image-rootfs.sh's, which the Dockerfile runs
//! too (checked by the `agent` tests' image test).

use std::process::Command;

use harness::cluster::Cluster;

/// The final stage of the Dockerfile: the lines after its last `FROM`.
fn final_stage() -> Vec<String> {
    let dockerfile =
        std::fs::read_to_string(harness::repo_root().join("Dockerfile")).expect("the Dockerfile");
    let lines: Vec<&str> = dockerfile.lines().collect();
    let last_from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("a FROM line");
    lines[last_from..].iter().map(|l| l.to_string()).collect()
}

fn instruction<'a>(stage: &'a [String], word: &str) -> Vec<&'a str> {
    stage
        .iter()
        .filter_map(|l| l.strip_prefix(&format!("{word} ")))
        .collect()
}

/// A file of an OCI archive, read with tar.
fn archive_file(archive: &std::path::Path, name: &str) -> serde_json::Value {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(name)
        .output()
        .expect("tar");
    assert!(out.status.success(), "{name} in {}", archive.display());
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn proxy_image_config_matches_the_dockerfile() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let archive = cluster.image_archive("proxyv2");
    let index = archive_file(&archive, "index.json");
    let digest = |v: &serde_json::Value| {
        let d = v["digest"].as_str().expect("a digest");
        format!("blobs/sha256/{}", d.trim_start_matches("sha256:"))
    };
    let manifest = archive_file(&archive, &digest(&index["manifests"][0]));
    let config = archive_file(&archive, &digest(&manifest["config"]))["config"].clone();

    let stage = final_stage();
    let entrypoint: Vec<String> =
        serde_json::from_str(instruction(&stage, "ENTRYPOINT")[0]).expect("ENTRYPOINT is JSON");
    assert_eq!(config["Entrypoint"], serde_json::json!(entrypoint));
    assert_eq!(config["User"], instruction(&stage, "USER")[0]);
    assert_eq!(config["WorkingDir"], instruction(&stage, "WORKDIR")[0]);
    let env: Vec<String> = config["Env"]
        .as_array()
        .expect("Env")
        .iter()
        .filter_map(|e| e.as_str().map(str::to_string))
        .collect();
    for line in instruction(&stage, "ENV") {
        let name = line.split('=').next().expect("NAME=value");
        assert!(
            env.iter().any(|e| e.starts_with(&format!("{name}="))),
            "the image does not set {name}, which the Dockerfile sets: {env:?}"
        );
    }
    // Istio's build of the module names the istio/proxy commit of its istio.deps
    // (tools/docker-builder's proxy_version for Dockerfile.proxyv2).
    let Some(module) = harness::istio_release::dir() else {
        return;
    };
    let deps: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(module.join("istio.deps")).expect("the module's istio.deps"),
    )
    .expect("istio.deps is JSON");
    let sha = deps
        .as_array()
        .expect("a list")
        .iter()
        .find(|d| d["name"] == "PROXY_REPO_SHA")
        .and_then(|d| d["lastStableSHA"].as_str())
        .expect("PROXY_REPO_SHA");
    let want = format!("ISTIO_META_ISTIO_PROXY_SHA={sha}");
    assert!(env.contains(&want), "{want} not in {env:?}");
}
