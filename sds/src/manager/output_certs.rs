//! `OUTPUT_CERTS`: the workload key, chain and root written to a directory (as Istio's agent
//! does for VMs), each file replaced atomically.
//!
//! The files are written (and fsynced) on the blocking pool, never on the agent's one runtime
//! thread, key first; the first failure stops the rest, so a new chain never sits beside a key
//! that was not replaced.

use std::path::Path;
use std::sync::Arc;

use tracing::warn;

use super::{Inner, Workload};
use crate::Error;

impl Inner {
    pub(super) async fn write_output(&self, w: &Arc<Workload>) {
        let Some(dir) = self.config.output_certs.clone() else {
            return;
        };
        let (w, mode) = (w.clone(), self.config.output_certs_mode);
        match tokio::task::spawn_blocking(move || write_files(&dir, &w, mode)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                warn!(error = %e, "cannot write OUTPUT_CERTS; the files there are left as they were")
            }
            Err(e) => warn!(error = %e, "writing OUTPUT_CERTS failed"),
        }
    }
}

/// Key, chain, then root; stops at the first failure.
fn write_files(dir: &Path, w: &Workload, mode: u32) -> Result<(), Error> {
    for (file, data) in [
        (crate::config::KEY_FILE, &w.private_key_pem),
        (crate::config::CERT_CHAIN_FILE, &w.cert_chain_pem),
        (crate::config::ROOT_CERT_FILE, &w.root_cert_pem),
    ] {
        write_atomic_mode(&dir.join(file), data, mode)?;
    }
    Ok(())
}

/// Writes `data` to `path` through a temporary file and a rename, mode 0600; skipped when the
/// content is unchanged.
#[cfg(test)]
pub(super) fn write_atomic(path: &Path, data: &[u8]) -> Result<(), Error> {
    write_atomic_mode(path, data, 0o600)
}

/// Writes `data` to `path` through a temporary file and a rename, with the file mode `mode`
/// (set explicitly: the umask does not apply); skipped when the content and mode are unchanged,
/// rewritten when only the mode differs.
fn write_atomic_mode(path: &Path, data: &[u8], mode: u32) -> Result<(), Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> Workload {
        Workload {
            cert_chain_pem: b"chain".to_vec(),
            private_key_pem: b"key".to_vec(),
            root_cert_pem: b"root".to_vec(),
            expire_time: std::time::SystemTime::now(),
            created_time: std::time::SystemTime::now(),
            rotate_at: std::time::SystemTime::now(),
        }
    }

    #[test]
    fn a_failed_key_write_leaves_the_chain_and_root_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(crate::config::CERT_CHAIN_FILE), "old chain").unwrap();
        // The key's path is taken by a directory: the rename over it fails.
        std::fs::create_dir(dir.path().join(crate::config::KEY_FILE)).unwrap();
        let err = write_files(dir.path(), &workload(), 0o600).unwrap_err();
        assert!(err.to_string().contains(crate::config::KEY_FILE), "{err}");
        let chain = std::fs::read_to_string(dir.path().join(crate::config::CERT_CHAIN_FILE));
        assert_eq!(chain.unwrap(), "old chain", "the new chain was not written");
        assert!(!dir.path().join(crate::config::ROOT_CERT_FILE).exists());
        // With the key writable all three are written.
        std::fs::remove_dir(dir.path().join(crate::config::KEY_FILE)).unwrap();
        write_files(dir.path(), &workload(), 0o600).unwrap();
        for (f, want) in [
            (crate::config::KEY_FILE, "key"),
            (crate::config::CERT_CHAIN_FILE, "chain"),
            (crate::config::ROOT_CERT_FILE, "root"),
        ] {
            assert_eq!(std::fs::read_to_string(dir.path().join(f)).unwrap(), want);
        }
    }
}
