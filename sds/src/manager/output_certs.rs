//! `OUTPUT_CERTS`: the workload key, chain and root written to a directory (as Istio's agent
//! does for VMs), each file replaced atomically.

use std::path::Path;

use tracing::warn;

use super::{Inner, Workload};
use crate::Error;

impl Inner {
    pub(super) fn write_output(&self, w: &Workload) {
        let Some(dir) = &self.config.output_certs else {
            return;
        };
        for (file, data) in [
            (crate::config::KEY_FILE, &w.private_key_pem),
            (crate::config::CERT_CHAIN_FILE, &w.cert_chain_pem),
            (crate::config::ROOT_CERT_FILE, &w.root_cert_pem),
        ] {
            if let Err(e) = write_atomic_mode(&dir.join(file), data, self.config.output_certs_mode)
            {
                warn!(error = %e, "cannot write OUTPUT_CERTS");
            }
        }
    }
}

/// Writes `data` to `path` through a temporary file and a rename, mode 0600; skipped when the
/// content is unchanged.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), Error> {
    write_atomic_mode(path, data, 0o600)
}

/// [`write_atomic`] with the file mode `mode` (set explicitly: the umask does not apply);
/// rewritten when only the mode differs.
pub fn write_atomic_mode(path: &Path, data: &[u8], mode: u32) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let out_err = |reason: String| Error::Output {
        path: path.display().to_string(),
        reason,
    };
    let same_mode = |m: std::fs::Metadata| m.permissions().mode() & 0o777 == mode;
    if std::fs::read(path).is_ok_and(|cur| cur == data)
        && std::fs::metadata(path).is_ok_and(same_mode)
    {
        return Ok(());
    }
    let dir = path
        .parent()
        .ok_or_else(|| out_err("no parent directory".into()))?;
    std::fs::create_dir_all(dir).map_err(|e| out_err(e.to_string()))?;
    let file_name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{:x}", rand::random::<u64>()));
    let res = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(out_err(e.to_string()));
    }
    Ok(())
}
