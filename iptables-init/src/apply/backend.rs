//! The iptables binaries for one address family, chosen like Istio does: the legacy variant if
//! it already holds tables in this network namespace, else nft, else whatever `iptables` is;
//! `--force-iptables-binary` overrides the choice.

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use super::{Error, ExecEnv};
use crate::builder::Rule;
use crate::config::ForcedBinary;

/// Address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// Which iptables implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Legacy,
    Nft,
    /// The unsuffixed `iptables` binaries (whatever the distribution links them to).
    Plain,
}

/// The chosen binaries for one family.
#[derive(Debug, Clone)]
pub struct Backend {
    pub family: Family,
    pub variant: Variant,
    env: ExecEnv,
    /// Directory holding the binaries, found once at detection (saves PATH walks per spawn).
    dir: Option<std::path::PathBuf>,
}

/// Seconds to wait for the xtables lock.
const LOCK_WAIT: &str = "--wait=30";

impl Backend {
    /// A backend without detection (for tests and callers that know).
    pub fn new(family: Family, variant: Variant, env: ExecEnv) -> Self {
        let mut b = Self {
            family,
            variant,
            env,
            dir: None,
        };
        b.dir = find_in_path(&b.bin("-restore"), b.env.path.as_deref());
        b
    }

    /// Chooses the binaries for `family`.
    pub fn detect(
        family: Family,
        forced: Option<ForcedBinary>,
        env: &ExecEnv,
    ) -> Result<Backend, Error> {
        // Each candidate walks PATH once; the one found is the one returned.
        let found =
            |variant| Some(Backend::new(family, variant, env.clone())).filter(|b| b.dir.is_some());
        match forced {
            Some(ForcedBinary::Legacy) | Some(ForcedBinary::Nft) => {
                let variant = if forced == Some(ForcedBinary::Legacy) {
                    Variant::Legacy
                } else {
                    Variant::Nft
                };
                found(variant).ok_or_else(|| Error::NoBackend {
                    family,
                    detail: format!(
                        "--force-iptables-binary asks for {} which is not in PATH",
                        Backend::new(family, variant, env.clone()).bin("-restore")
                    ),
                })
            }
            None => {
                if legacy_tables_present(family)
                    && let Some(b) = found(Variant::Legacy)
                {
                    tracing::debug!(%family, "legacy tables present; using iptables-legacy");
                    return Ok(b);
                }
                if let Some(b) = [Variant::Nft, Variant::Legacy, Variant::Plain]
                    .into_iter()
                    .find_map(found)
                {
                    return Ok(b);
                }
                Err(Error::NoBackend {
                    family,
                    detail: "none of the nft, legacy or plain iptables-restore binaries is in PATH"
                        .to_string(),
                })
            }
        }
    }

    /// Binary name: `tool` is `""`, `"-save"` or `"-restore"`.
    pub fn bin(&self, tool: &str) -> String {
        let prefix = match self.family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        let suffix = match self.variant {
            Variant::Legacy => "-legacy",
            Variant::Nft => "-nft",
            Variant::Plain => "",
        };
        format!("{prefix}{suffix}{tool}")
    }

    fn command(&self, bin: &str) -> Command {
        let mut c = match &self.dir {
            Some(d) => Command::new(d.join(bin)),
            None => Command::new(bin),
        };
        if let Some(p) = &self.env.path {
            c.env("PATH", p);
        }
        if let (Variant::Legacy, Some(lock)) = (self.variant, &self.env.xtables_lockfile) {
            c.env("XTABLES_LOCKFILE", lock);
        }
        c
    }

    /// `iptables-save` output.
    pub fn save(&self) -> Result<String, Error> {
        let bin = self.bin("-save");
        run(self.command(&bin), &bin, &[], None)
    }

    /// Feeds `input` to `iptables-restore --noflush`. With `check_only` the input holds only
    /// `-C` lines; legacy then runs with `--test` (nothing committed), nft evaluates the checks
    /// in a batch that changes nothing.
    pub fn restore(&self, input: &str, check_only: bool) -> Result<(), Error> {
        if input.is_empty() {
            return Ok(());
        }
        let bin = self.bin("-restore");
        let mut args = vec!["--noflush", LOCK_WAIT];
        if check_only && self.variant != Variant::Nft {
            args.push("--test");
        }
        tracing::debug!(cmd = %bin, ?args, input, "running restore");
        run(self.command(&bin), &bin, &args, Some(input)).map(|_| ())
    }

    /// Whether `rule` exists (`iptables -C`).
    pub fn check(&self, rule: &Rule) -> bool {
        let bin = self.bin("");
        let mut args: Vec<String> = vec![LOCK_WAIT.into(), "-t".into(), rule.table.clone()];
        args.extend(rule.check_params());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(self.command(&bin), &bin, &args, None).is_ok()
    }
}

/// Whether legacy x_tables tables exist in this network namespace (what makes `iptables-legacy-save`
/// print anything), read from procfs without spawning a process.
fn legacy_tables_present(family: Family) -> bool {
    let path = match family {
        Family::V4 => "/proc/net/ip_tables_names",
        Family::V6 => "/proc/net/ip6_tables_names",
    };
    std::fs::read_to_string(path).is_ok_and(|s| !s.trim().is_empty())
}

pub(crate) fn find_in_path(name: &str, path: Option<&str>) -> Option<std::path::PathBuf> {
    let path = path.unwrap_or(super::DEFAULT_PATH);
    std::env::split_paths(path).find(|d| is_executable(&d.join(name)))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn run(mut c: Command, bin: &str, args: &[&str], stdin: Option<&str>) -> Result<String, Error> {
    let shown = if args.is_empty() {
        bin.to_string()
    } else {
        format!("{bin} {}", args.join(" "))
    };
    // Restore input goes in as a memory file rather than a pipe: the restore reads it like
    // `< file`, without waiting on us to write.
    let input = match stdin {
        Some(text) => Stdio::from(input_file(text).map_err(|e| Error::Spawn {
            cmd: shown.clone(),
            error: format!("preparing restore input: {e}"),
        })?),
        None => Stdio::null(),
    };
    c.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(input);
    let child = c.spawn().map_err(|e| Error::Spawn {
        cmd: shown.clone(),
        error: e.to_string(),
    })?;
    let out = child.wait_with_output().map_err(|e| Error::Spawn {
        cmd: shown.clone(),
        error: e.to_string(),
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            cmd: shown,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// An anonymous in-memory file holding `text`, positioned at its start.
pub(crate) fn input_file(text: &str) -> std::io::Result<std::fs::File> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    use std::io::{Seek, SeekFrom};
    let fd = memfd_create(c"iptables-restore-input", MFdFlags::MFD_CLOEXEC)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(text.as_bytes())?;
    f.seek(SeekFrom::Start(0))?;
    Ok(f)
}

/// Runs `ip <args>` and returns its stdout.
pub fn ip(args: &[&str]) -> Result<String, Error> {
    run(Command::new("ip"), "ip", args, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn fake_path(bins: &[&str]) -> (tempfile::TempDir, ExecEnv) {
        let dir = tempfile::tempdir().expect("tempdir");
        for b in bins {
            let p = dir.path().join(b);
            std::fs::write(&p, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let env = ExecEnv {
            path: Some(dir.path().display().to_string()),
            xtables_lockfile: None,
        };
        (dir, env)
    }

    #[test]
    fn prefers_nft_then_legacy_then_plain() {
        let (_d, env) = fake_path(&["iptables-nft-restore", "iptables-restore"]);
        let b = Backend::detect(Family::V4, None, &env).expect("backend");
        assert_eq!(b.variant, Variant::Nft);
        assert_eq!(b.bin("-save"), "iptables-nft-save");
        let (_d, env) = fake_path(&["ip6tables-restore"]);
        let b = Backend::detect(Family::V6, None, &env).expect("backend");
        assert_eq!(b.variant, Variant::Plain);
        assert_eq!(b.bin("-restore"), "ip6tables-restore");
    }

    #[test]
    fn forced_binary_must_exist() {
        let (_d, env) = fake_path(&["iptables-nft-restore"]);
        let e = Backend::detect(Family::V4, Some(ForcedBinary::Legacy), &env).unwrap_err();
        assert!(e.to_string().contains("iptables-legacy-restore"), "{e}");
        let b = Backend::detect(Family::V4, Some(ForcedBinary::Nft), &env).expect("nft");
        assert_eq!(b.variant, Variant::Nft);
    }

    #[test]
    fn nothing_installed_is_a_clear_error() {
        let (_d, env) = fake_path(&[]);
        let e = Backend::detect(Family::V4, None, &env).unwrap_err();
        assert!(
            e.to_string().contains("no working IPv4 iptables binary"),
            "{e}"
        );
    }
}
