//! The image: the Dockerfile's final stage copies the tree `scripts/image-rootfs.sh` lays out.
//! No Docker engine runs here, so this test builds that same tree from the workspace binaries
//! and runs the entry points from it, so a broken path fails CI. Envoy is Istio's (from the
//! proxyv2 image of `ISTIO_VERSION`, with its bootstrap template) unless `ENVOY=upstream`.

use harness::{envoy_bin, repo_root, workspace_bin};
use std::path::Path;
use std::process::Command;

/// Istio's paths inside its proxyv2 image.
const ENVOY_PATH: &str = "usr/local/bin/envoy";
const TEMPLATE_PATH: &str = "var/lib/istio/envoy/envoy_bootstrap_tmpl.json";

fn dockerfile() -> String {
    std::fs::read_to_string(repo_root().join("Dockerfile")).expect("Dockerfile")
}

/// Runs `scripts/image-rootfs.sh` into `out`, with Istio's envoy directory when given.
fn lay_out(envoy: &Path, out: &Path, istio_envoy_dir: Option<&Path>) {
    let agent = workspace_bin("pilot-agent");
    let bin_dir = agent.parent().expect("bin dir").to_path_buf();
    let _ = workspace_bin("istio-iptables");
    let mut cmd = Command::new(repo_root().join("scripts/image-rootfs.sh"));
    cmd.arg(&bin_dir).arg(envoy).arg(out);
    if let Some(d) = istio_envoy_dir {
        cmd.arg(d);
    }
    let status = cmd.status().expect("run image-rootfs.sh");
    assert!(status.success(), "image-rootfs.sh failed: {status}");
}

#[test]
fn dockerfile_final_stage_is_the_rootfs_script_tree() {
    let dockerfile = dockerfile();
    for needle in [
        // Both binaries static and non-PIE, put where the rootfs script takes them from.
        "RUN scripts/build-dist.sh --locked",
        "scripts/image-rootfs.sh target/dist /envoy/usr/local/bin/envoy /rootfs /envoy/var/lib/istio/envoy",
        "COPY --from=build /rootfs/ /",
        "useradd -m --uid 1337 --user-group istio-proxy",
        "chown -R istio-proxy:istio-proxy /etc/istio /var/lib/istio /etc/certs",
        "WORKDIR /",
        "USER 1337:1337",
        r#"ENTRYPOINT ["/usr/local/bin/pilot-agent"]"#,
    ] {
        assert!(dockerfile.contains(needle), "Dockerfile lacks {needle:?}");
    }
}

#[test]
fn dist_build_script_links_both_shipped_binaries_static_and_non_pie() {
    let script = std::fs::read_to_string(repo_root().join("scripts/build-dist.sh"))
        .expect("scripts/build-dist.sh");
    for needle in [
        r#"RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static""#,
        // RUSTFLAGS reach the target only with --target: build scripts and proc macros stay
        // dynamic.
        r#"--target "$triple""#,
        r#"cargo build --profile dist "$@" -p iptables-init --bin istio-iptables --target "$triple""#,
        // pilot-agent's start code first in its text segment.
        r#"order="target/start-order-$(sha256sum agent/link/start-order.ld | cut -c1-16).ld""#,
        // ... and keeps its symbol table, so its CPU profiles (/debug/pprof/profile) name
        // their functions.
        r#"link=(-C "link-arg=-Wl,-T,$repo/$order" -C strip=debuginfo)"#,
        r#"cargo rustc --profile dist "$@" -p agent --bin pilot-agent --target "$triple" -- "${link[@]}""#,
        r#"cp "target/$triple/dist/pilot-agent" "target/$triple/dist/istio-iptables" target/dist/"#,
    ] {
        assert!(script.contains(needle), "build-dist.sh lacks {needle:?}");
    }
}

#[test]
fn start_order_script_puts_listed_text_sections_before_text() {
    // A linker script that only adds an output section (INSERT): lld's and GNU ld's default
    // layout stays, and a pattern that matches nothing is ignored.
    let ld = std::fs::read_to_string(repo_root().join("agent/link/start-order.ld"))
        .expect("agent/link/start-order.ld");
    assert!(ld.contains("SECTIONS\n{\n  .text.start : {\n"), "{ld:.200}");
    assert!(ld.trim_end().ends_with("}\n}\nINSERT BEFORE .text;"));
    let patterns: Vec<&str> = ld
        .lines()
        .filter(|l| l.starts_with("    ") && l.ends_with(')'))
        .collect();
    assert!(patterns.len() > 1000, "{} patterns", patterns.len());
    for p in &patterns {
        let (file, section) = p.trim().split_once('(').expect("file(section)");
        assert!(!file.is_empty() && section.starts_with(".text"), "{p}");
        // Hash-free: the 16-hex hash of a Rust symbol would match one build only.
        assert!(
            !section.contains("17h") || section.ends_with("17h*)"),
            "{p}"
        );
    }
}

#[test]
fn dockerfile_takes_envoy_and_its_template_from_istios_proxyv2_image() {
    let dockerfile = dockerfile();
    // A pinned Istio release, Istio's image, and both files at Istio's own paths.
    let version = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ARG ISTIO_VERSION="))
        .expect("ARG ISTIO_VERSION=<release>");
    let parts: Vec<&str> = version.trim().split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "ISTIO_VERSION pins a release x.y.z: {version:?}"
    );
    for needle in [
        "FROM docker.io/istio/proxyv2:${ISTIO_VERSION} AS istio",
        "COPY --from=istio /usr/local/bin/envoy /usr/local/bin/envoy",
        "COPY --from=istio /var/lib/istio/envoy/ /var/lib/istio/envoy/",
        // Istio's Envoy by default; upstream's only when asked for.
        "ARG ENVOY=istio",
        "FROM envoy-${ENVOY} AS envoy",
        "FROM scratch AS envoy-istio",
        "FROM scratch AS envoy-upstream",
        "scripts/setup.sh --envoy-only",
        "COPY --from=envoy / /envoy/",
        // The release is carried into the image: istiod is told the version built, not the
        // agent's compiled-in default.
        "ARG ISTIO_VERSION\nENV ISTIO_META_ISTIO_VERSION=${ISTIO_VERSION}",
        // The istio/proxy commit, as Istio's image names it (`unknown` when not given, as
        // Istio's build without an istio.deps).
        "ARG ISTIO_PROXY_SHA=unknown\nENV ISTIO_META_ISTIO_PROXY_SHA=${ISTIO_PROXY_SHA}",
    ] {
        assert!(dockerfile.contains(needle), "Dockerfile lacks {needle:?}");
    }
}

#[test]
fn rootfs_puts_istios_envoy_and_template_at_istios_paths() {
    let Some(envoy) = envoy_bin() else { return };
    // Stand-ins for the proxyv2 image's /var/lib/istio/envoy: Istio's own template (the
    // bootstrap conformance corpus holds it byte for byte) and a second template file.
    let template = repo_root().join("../shared/conformance/istio-bootstrap/envoy_bootstrap.json");
    let istio = tempfile::tempdir().expect("tempdir");
    std::fs::copy(&template, istio.path().join("envoy_bootstrap_tmpl.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", template.display()));
    std::fs::write(istio.path().join("gcp_bootstrap_tmpl.json"), "{}").expect("write");
    let out = tempfile::tempdir().expect("tempdir");
    lay_out(&envoy, out.path(), Some(istio.path()));
    let installed = std::fs::read(out.path().join(TEMPLATE_PATH)).expect("template installed");
    assert_eq!(
        installed,
        std::fs::read(&template).expect("template"),
        "the template is copied byte for byte"
    );
    assert!(
        out.path()
            .join("var/lib/istio/envoy/gcp_bootstrap_tmpl.json")
            .is_file(),
        "everything in Istio's envoy directory is copied"
    );
    assert_eq!(
        std::fs::read(out.path().join(ENVOY_PATH)).expect("envoy"),
        std::fs::read(std::fs::canonicalize(&envoy).expect("envoy path")).expect("envoy"),
        "the given Envoy is installed at {ENVOY_PATH}"
    );
    // Upstream: no template (the agent's built-in bootstrap applies).
    let upstream = tempfile::tempdir().expect("tempdir");
    lay_out(&envoy, upstream.path(), None);
    assert!(upstream.path().join(ENVOY_PATH).is_file());
    assert!(
        !upstream.path().join(TEMPLATE_PATH).exists(),
        "no Istio template with upstream Envoy"
    );
    // A directory without Istio's template is refused.
    let empty = tempfile::tempdir().expect("tempdir");
    std::fs::write(empty.path().join("other.json"), "{}").expect("write");
    let status = Command::new(repo_root().join("scripts/image-rootfs.sh"))
        .arg(workspace_bin("pilot-agent").parent().expect("bin dir"))
        .arg(&envoy)
        .arg(tempfile::tempdir().expect("tempdir").path())
        .arg(empty.path())
        .status()
        .expect("run image-rootfs.sh");
    assert!(
        !status.success(),
        "a template dir without envoy_bootstrap_tmpl.json must fail"
    );
}

#[test]
fn rootfs_runs_pilot_agent_istio_iptables_and_envoy() {
    let Some(envoy) = envoy_bin() else { return };
    let out = tempfile::tempdir().expect("tempdir");
    lay_out(&envoy, out.path(), None);
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
        "etc/istio/config",
        "etc/istio/pod",
        "etc/certs",
        "var/lib/istio/envoy",
        "var/lib/istio/data",
        "var/lib/istio/config",
        "var/run/secrets/istio",
        "var/run/secrets/tokens",
    ] {
        assert!(
            out.path().join(dir).is_dir(),
            "{dir} missing from the rootfs"
        );
    }
}

/// The image built with the Dockerfile's default `ISTIO_VERSION`: its `/var/lib/istio/envoy`
/// is that proxyv2 image's, which holds the release's template (read here from the release's
/// Go module, `tools/packaging/common/envoy_bootstrap.json`). The agent in that tree, run from
/// `/` as the image runs it with the environment the Dockerfile sets, renders that template on
/// its own: the release's three stats compressors on 15090, and the version the image claims.
#[test]
fn rootfs_with_the_default_istio_release_renders_its_template() {
    let Some(envoy) = envoy_bin() else { return };
    let version = dockerfile()
        .lines()
        .find_map(|l| l.strip_prefix("ARG ISTIO_VERSION="))
        .expect("ARG ISTIO_VERSION=<release>")
        .trim()
        .to_string();
    let release = harness::istio_release::RELEASE;
    assert!(
        version.starts_with(&format!("{release}.")),
        "the tests read Istio {release}'s template; the Dockerfile builds {version}"
    );
    let Some(module) = harness::istio_release::dir() else {
        return;
    };
    let template = module.join("tools/packaging/common/envoy_bootstrap.json");
    let istio = tempfile::tempdir().expect("tempdir");
    std::fs::copy(&template, istio.path().join("envoy_bootstrap_tmpl.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", template.display()));
    let root = tempfile::tempdir().expect("tempdir");
    lay_out(&envoy, root.path(), Some(istio.path()));
    let out = Command::new(root.path().join("usr/local/bin/pilot-agent"))
        .args(["bootstrap", "sidecar", "--output", "envoy-rev.json"])
        .current_dir(root.path())
        .env_clear()
        // On the host: no real metadata server is asked.
        .env("CLOUD_PLATFORM", "none")
        .env("POD_NAME", "p")
        .env("POD_NAMESPACE", "ns1")
        .env("INSTANCE_IP", "10.3.3.3")
        .env("ISTIO_META_ISTIO_VERSION", &version)
        .output()
        .expect("pilot-agent bootstrap");
    assert!(out.status.success(), "bootstrap: {out:?}");
    let text = std::fs::read_to_string(root.path().join("envoy-rev.json")).expect("bootstrap");
    let b: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(b["node"]["metadata"]["ISTIO_VERSION"], version.as_str());
    let prometheus = b["static_resources"]["listeners"]
        .as_array()
        .expect("listeners")
        .iter()
        .find(|l| l["name"] == "0.0.0.0_15090")
        .expect("15090 listener");
    let filters: Vec<&str> =
        prometheus["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
            .as_array()
            .expect("filters")
            .iter()
            .map(|f| f["name"].as_str().unwrap_or_default())
            .collect();
    assert_eq!(
        filters,
        [
            "envoy.filters.http.compressor.brotli",
            "envoy.filters.http.compressor.zstd",
            "envoy.filters.http.compressor.gzip",
            "envoy.filters.http.router"
        ],
        "Istio {release}'s three compressors"
    );
}
