//! `previous-roots.json` in the CA directory: the roots of replaced plug-in CAs that stay in the
//! trust bundle, with the time each may leave it, so a restart of istiod-lite during the overlap
//! keeps trusting workload certificates the old CAs signed.
//!
//! ```json
//! {"roots": [{"pem": "-----BEGIN CERTIFICATE-----\n...", "keep_until": 1796025600}]}
//! ```
//!
//! `keep_until` is in seconds since the Unix epoch. The file holds public certificates only: it
//! is written with mode 0644, atomically (a temporary file in the same directory, then a
//! rename). A malformed file, or a malformed entry, is reported and ignored; it never stops the
//! CA from starting.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::{Error, MAX_WORKLOAD_TTL, RetiredRoot, io_err, pem_der};

/// Name of the file in the CA directory.
pub const PREVIOUS_ROOTS: &str = "previous-roots.json";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    roots: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    pem: String,
    keep_until: u64,
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

fn unix_secs_ceil(t: SystemTime) -> u64 {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Reads the retired roots still in their overlap at `now`, skipping those that are in
/// `current` (the roots of `root-cert.pem`). Returns them and whether the file holds anything
/// else (expired or malformed entries), i.e. should be rewritten.
pub(super) fn load(dir: &Path, current: &[String], now: SystemTime) -> (Vec<RetiredRoot>, bool) {
    let path = dir.join(PREVIOUS_ROOTS);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Vec::new(), false),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read the previous CA roots; ignoring them (old roots are not in the trust bundle)");
            return (Vec::new(), false);
        }
    };
    let file: File = match serde_json::from_str(&text) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "malformed previous CA roots (expected {{\"roots\": [{{\"pem\": ..., \"keep_until\": <unix seconds>}}]}}); ignoring the file (old roots are not in the trust bundle)");
            return (Vec::new(), false);
        }
    };
    let current: Vec<Option<Vec<u8>>> = current.iter().map(|r| pem_der(r)).collect();
    // No workload certificate outlives this: anything later is not what we wrote.
    let latest = now + MAX_WORKLOAD_TTL;
    let mut stale = false;
    let mut out: Vec<RetiredRoot> = Vec::new();
    for (i, e) in file.roots.into_iter().enumerate() {
        let Some(der) = pem_der(&e.pem) else {
            tracing::warn!(file = %path.display(), entry = i, field = "pem", "previous CA root entry holds no PEM certificate; ignoring it");
            stale = true;
            continue;
        };
        if x509_parser::parse_x509_certificate(&der).is_err() {
            tracing::warn!(file = %path.display(), entry = i, field = "pem", "previous CA root entry holds an unparsable certificate; ignoring it");
            stale = true;
            continue;
        }
        let Some(mut until) = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(e.keep_until))
        else {
            tracing::warn!(file = %path.display(), entry = i, field = "keep_until", value = e.keep_until, "previous CA root entry has an impossible keep_until; ignoring it");
            stale = true;
            continue;
        };
        if until > latest {
            tracing::warn!(file = %path.display(), entry = i, field = "keep_until", value = e.keep_until, max = unix_secs(latest), "previous CA root kept longer than any workload certificate can live; keeping it until the maximum");
            until = latest;
            stale = true;
        }
        if until <= now || current.contains(&Some(der.clone())) {
            stale = true;
            continue;
        }
        match out
            .iter_mut()
            .find(|x| pem_der(&x.pem).as_ref() == Some(&der))
        {
            Some(x) => {
                x.until = x.until.max(until);
                stale = true;
            }
            None => out.push(RetiredRoot { pem: e.pem, until }),
        }
    }
    (out, stale)
}

/// Writes the retired roots still in their overlap at `now` (removes the file when there are
/// none).
pub(super) fn store(dir: &Path, retired: &[RetiredRoot], now: SystemTime) -> Result<(), Error> {
    let path = dir.join(PREVIOUS_ROOTS);
    let roots: Vec<Entry> = retired
        .iter()
        .filter(|r| r.until > now)
        .map(|r| Entry {
            pem: r.pem.clone(),
            // Rounded up: never drop a root before the certificates it signed expire.
            keep_until: unix_secs_ceil(r.until),
        })
        .collect();
    if roots.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&path)(e)),
            _ => Ok(()),
        };
    }
    let mut text = serde_json::to_string_pretty(&File { roots }).map_err(|e| Error::BadFile {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    text.push('\n');
    write_atomically(&path, text.as_bytes())
}

/// A temporary file beside `path` (mode 0644), synced, then renamed over `path`.
pub(super) fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp: PathBuf = path.with_extension("json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        f.write_all(contents).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err(path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}
