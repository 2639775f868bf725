//! `issued-until.json` in the CA directory: the latest expiry of any workload certificate the
//! signing CA issued, so that after a restart a replacement of that CA still keeps its root in
//! the trust bundle for as long as those certificates live.
//!
//! ```json
//! {"ca_cert": "-----BEGIN CERTIFICATE-----\n...", "until": 1796025600}
//! ```
//!
//! The record belongs to the CA whose certificate it names; another CA's record is ignored.
//! `until` is rounded up to the next hour, so the file is rewritten at most once an hour however
//! many certificates are signed. Written atomically (mode 0644: it holds a public certificate).
//! A malformed file is reported and ignored; the CA still starts.

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::{Error, MAX_WORKLOAD_TTL, pem_der, previous_roots::write_atomically};

/// Name of the file in the CA directory.
pub const ISSUED_UNTIL: &str = "issued-until.json";

/// Granularity of the recorded expiry (and so the most often the file is written).
const STEP: u64 = 3600;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    ca_cert: String,
    until: u64,
}

/// `t` in seconds since the epoch, rounded up to the next [`STEP`].
pub(super) fn round_up(t: SystemTime) -> SystemTime {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs.div_ceil(STEP) * STEP)
}

/// The recorded expiry for the CA whose certificate is `ca_cert` (PEM), if the file names it.
pub(super) fn load(dir: &Path, ca_cert: &str, now: SystemTime) -> Option<SystemTime> {
    let path = dir.join(ISSUED_UNTIL);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read when the CA's certificates expire; a later CA replacement keeps its root only for certificates signed from now on");
            return None;
        }
    };
    let file: File = match serde_json::from_str(&text) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "malformed record of when the CA's certificates expire (expected {{\"ca_cert\": <PEM>, \"until\": <unix seconds>}}); ignoring it");
            return None;
        }
    };
    if pem_der(&file.ca_cert).is_none() || pem_der(&file.ca_cert) != pem_der(ca_cert) {
        // Another CA's record (the cacerts were replaced while istiod-lite was down).
        return None;
    }
    let until = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(file.until))?;
    let latest = round_up(now + MAX_WORKLOAD_TTL);
    if until > latest {
        tracing::warn!(file = %path.display(), field = "until", value = file.until, "recorded certificate expiry is later than any workload certificate can live; using the maximum");
        return Some(latest);
    }
    Some(until)
}

/// Records `until` (already rounded) for the CA whose certificate is `ca_cert`.
pub(super) fn store(dir: &Path, ca_cert: &str, until: SystemTime) -> Result<(), Error> {
    let path = dir.join(ISSUED_UNTIL);
    let secs = until
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut text = serde_json::to_string(&File {
        ca_cert: ca_cert.to_string(),
        until: secs,
    })
    .map_err(|e| Error::BadFile {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    text.push('\n');
    write_atomically(&path, text.as_bytes())
}
