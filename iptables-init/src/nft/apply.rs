//! Running `nft`: the whole ruleset (or its removal) in one `nft -f -` transaction; what the
//! iptables backend left is removed after the new rules are in (so a switch of backends never
//! leaves a pod unredirected); TPROXY's policy routes as with iptables.
//!
//! No capability probe runs before the apply: the transaction is atomic, so a missing or
//! unusable nf_tables is found by the apply itself, with nothing changed, and only then is the
//! failure explained (kernel support, `nft` version).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::NftRuleBuilder;
use crate::apply::ExecEnv;
use crate::config::Config;

/// The oldest `nft` Istio's backend accepts.
const MIN_VERSION: (u32, u32, u32) = (1, 0, 1);

/// Why the nftables ruleset could not be applied or removed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the nft binary was not found in PATH ({path}): --native-nftables needs nftables (nft v1.0.1 or later) {place}; nothing was applied"
    )]
    NftMissing { path: String, place: &'static str },
    #[error("failed to run {cmd}: {error}")]
    Spawn { cmd: String, error: String },
    #[error(
        "the kernel has no usable nf_tables support ({detail}); nothing was applied. Load the nf_tables modules (nf_tables, nft_nat, nft_redir, nft_tproxy, nft_ct) or run without --native-nftables"
    )]
    NoKernelSupport { detail: String },
    #[error("{version} is older than v1.0.1, which --native-nftables needs; nothing was applied")]
    TooOld { version: String },
    #[error("nft -f - rejected the ruleset ({status}); nothing was applied: {stderr}")]
    Rejected { status: String, stderr: String },
    #[error("removing the iptables rules of an earlier run: {0}")]
    Iptables(#[from] crate::apply::Error),
}

/// The `nft` binary found on `PATH`.
#[derive(Debug, Clone)]
pub struct Nft {
    bin: PathBuf,
    path: Option<String>,
}

impl Nft {
    /// Finds `nft` on `env.path` ([`crate::apply::DEFAULT_PATH`] when unset). `cni_mode` only
    /// changes the wording of the error.
    pub fn find(env: &ExecEnv, cni_mode: bool) -> Result<Nft, Error> {
        let path = env
            .path
            .clone()
            .unwrap_or_else(|| crate::apply::DEFAULT_PATH.into());
        match crate::apply::find_in_path("nft", Some(&path)) {
            Some(dir) => Ok(Nft {
                bin: dir.join("nft"),
                path: env.path.clone(),
            }),
            None => Err(Error::NftMissing {
                path,
                place: if cni_mode {
                    "on the host filesystem (--cni-mode)"
                } else {
                    "in the sidecar image"
                },
            }),
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        if let Some(p) = &self.path {
            c.env("PATH", p);
        }
        c
    }

    fn output(&self, args: &[&str], stdin: Option<&str>) -> Result<std::process::Output, Error> {
        let shown = format!("nft {}", args.join(" "));
        let spawn_err = |e: std::io::Error| Error::Spawn {
            cmd: shown.clone(),
            error: e.to_string(),
        };
        let input = match stdin {
            Some(text) => Stdio::from(crate::apply::input_file(text).map_err(spawn_err)?),
            None => Stdio::null(),
        };
        self.command()
            .args(args)
            .stdin(input)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(spawn_err)
    }

    /// Feeds `script` to one `nft -f -`: all of it takes effect, or none.
    pub fn apply(&self, script: &str) -> Result<(), Error> {
        tracing::debug!(script, "running nft -f -");
        let out = self.output(&["-f", "-"], Some(script))?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(self.explain(out.status.to_string(), stderr))
    }

    /// Why an apply failed: the kernel, an old `nft`, or the ruleset itself.
    fn explain(&self, status: String, stderr: String) -> Error {
        const UNSUPPORTED: [&str; 3] = [
            "Protocol not supported",
            "Operation not supported",
            "Address family not supported",
        ];
        if UNSUPPORTED.iter().any(|s| stderr.contains(s)) {
            return Error::NoKernelSupport { detail: stderr };
        }
        if let Ok(out) = self.output(&["--version"], None) {
            let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if parse_version(&version).is_some_and(|v| v < MIN_VERSION) {
                return Error::TooOld { version };
            }
        }
        Error::Rejected { status, stderr }
    }

    /// Removes Istio's nftables tables (no-op for missing ones).
    pub fn remove_tables(&self) -> Result<(), Error> {
        self.apply(&super::cleanup_script())
    }
}

/// `nftables v1.0.9 (Old Doc Yiss)` → (1, 0, 9).
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    });
    Some((
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
        parts.next().flatten().unwrap_or(0),
    ))
}

/// Whether the iptables backend may have left rules: legacy x_tables tables exist, or an
/// nf_tables chain of the ip/ip6 families carries an iptables `ISTIO_*` name (iptables-nft).
fn iptables_leftovers() -> bool {
    use crate::netlink::{NFPROTO_IPV4, NFPROTO_IPV6, nft_chains};
    let legacy = ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"]
        .iter()
        .any(|p| std::fs::read_to_string(p).is_ok_and(|s| !s.trim().is_empty()));
    legacy
        || nft_chains().is_some_and(|chains| {
            chains.iter().any(|(family, _, chain)| {
                (*family == NFPROTO_IPV4 || *family == NFPROTO_IPV6) && chain.starts_with("ISTIO_")
            })
        })
}

/// Whether TPROXY's policy rule is in place (over netlink; `ip rule` when that fails).
fn tproxy_rule_present(cfg: &Config) -> bool {
    crate::netlink::fwmark_rule_present(cfg.inbound_tproxy_mark, cfg.inbound_tproxy_route_table)
        .unwrap_or_else(|| crate::apply::tproxy_rule_present(cfg))
}

/// Applies the nftables ruleset for `cfg` (or with `--cleanup-only` removes it), then removes
/// what the iptables backend left and sets up (or removes) TPROXY's policy routes.
pub fn run(cfg: &Config, rules: &NftRuleBuilder, env: &ExecEnv) -> Result<(), Error> {
    let nft = Nft::find(env, cfg.cni_mode)?;
    let build_script = || {
        if cfg.cleanup_only {
            super::cleanup_script()
        } else {
            super::apply_script(rules, super::Existing::read().as_ref())
        }
    };
    let mut script = build_script();
    // What the other backend or an earlier TPROXY run left, read before the change.
    let leftovers = iptables_leftovers();
    let stale_routes =
        (cfg.cleanup_only || !crate::apply::tproxy_routes_wanted(cfg)) && tproxy_rule_present(cfg);
    let mut applied = nft.apply(&script);
    if applied.is_err() && !cfg.cleanup_only {
        // The state changed under us (a chain to remove went away): once more, freshly read.
        let again = build_script();
        if again != script {
            tracing::info!("nftables state changed during the run; retrying with a fresh view");
            script = again;
            applied = nft.apply(&script);
        }
    }
    applied?;
    tracing::info!(
        tables = script
            .lines()
            .filter(|l| l.starts_with("add table"))
            .count(),
        cleanup = cfg.cleanup_only,
        "nftables transaction applied"
    );
    if leftovers {
        let iptables_rules = crate::capture::build(cfg);
        let removed = crate::apply::remove_istio_rules(cfg, &iptables_rules, env)?;
        tracing::info!(?removed, "removed iptables rules of an earlier run");
    }
    if stale_routes {
        crate::apply::cleanup_routes(cfg);
    }
    if !cfg.cleanup_only {
        crate::apply::configure_routes(cfg)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn stub(script: &str) -> (tempfile::TempDir, ExecEnv) {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("nft");
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let env = ExecEnv {
            path: Some(dir.path().display().to_string()),
            xtables_lockfile: None,
        };
        (dir, env)
    }

    #[test]
    fn versions() {
        assert_eq!(
            parse_version("nftables v1.0.9 (Old Doc Yiss)"),
            Some((1, 0, 9))
        );
        assert_eq!(parse_version("nftables v0.9.8 (E.D.S.)"), Some((0, 9, 8)));
        assert_eq!(parse_version("nftables v1.1 (x)"), Some((1, 1, 0)));
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn missing_nft_names_the_image_or_the_host() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = ExecEnv {
            path: Some(dir.path().display().to_string()),
            xtables_lockfile: None,
        };
        let e = Nft::find(&env, false).unwrap_err().to_string();
        assert!(
            e.contains("nft binary was not found") && e.contains("sidecar image"),
            "{e}"
        );
        let e = Nft::find(&env, true).unwrap_err().to_string();
        assert!(e.contains("host filesystem"), "{e}");
    }

    #[test]
    fn kernel_without_nf_tables_is_named() {
        let (_d, env) = stub(
            "/bin/cat >/dev/null; echo 'Error: Could not process rule: Operation not supported' >&2; exit 1",
        );
        let nft = Nft::find(&env, false).expect("stub");
        let e = nft.apply("add table inet x\n").unwrap_err().to_string();
        assert!(e.contains("no usable nf_tables support"), "{e}");
        assert!(e.contains("nothing was applied"), "{e}");
    }

    #[test]
    fn old_nft_is_named_and_other_failures_carry_stderr() {
        let (_d, env) = stub(
            "if [ \"$1\" = --version ]; then echo 'nftables v0.9.3 (Topsy)'; exit 0; fi; /bin/cat >/dev/null; echo 'Error: syntax error' >&2; exit 1",
        );
        let e = Nft::find(&env, false)
            .expect("stub")
            .apply("x\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("v0.9.3") && e.contains("older than v1.0.1"),
            "{e}"
        );
        let (_d, env) = stub(
            "if [ \"$1\" = --version ]; then echo 'nftables v1.0.6 (Lester Gooch #5)'; exit 0; fi; /bin/cat >/dev/null; echo 'Error: Could not process rule: No such file or directory' >&2; exit 1",
        );
        let e = Nft::find(&env, false)
            .expect("stub")
            .apply("x\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rejected the ruleset") && e.contains("No such file or directory"),
            "{e}"
        );
    }

    #[test]
    fn script_goes_to_stdin_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let copy = dir.path().join("stdin");
        let (_d, env) = stub(&format!(
            "[ \"$1 $2\" = '-f -' ] || exit 3; /bin/cat > {}",
            copy.display()
        ));
        Nft::find(&env, false)
            .expect("stub")
            .apply("add table inet t\n")
            .expect("apply");
        assert_eq!(
            std::fs::read_to_string(&copy).expect("copy"),
            "add table inet t\n"
        );
    }
}
