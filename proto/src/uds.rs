//! Unix socket paths past the kernel's `sun_path` limit (108 bytes with its NUL): Istio's agent
//! binds and dials its sockets by relative paths (`./etc/istio/proxy/XDS`,
//! `./var/run/secrets/workload-spiffe-uds/socket`), so a working directory nested deeper than
//! the limit still works. Here a path too long for `sun_path` is bound and dialed relative to
//! the working directory when it lies under it (Istio's way), else through the directory's
//! `/proc/self/fd/<n>/` link, which the kernel resolves like the directory itself.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The longest path `sun_path` holds (108 bytes with the terminating NUL).
pub const SUN_PATH_MAX: usize = 107;

/// The address to hand the kernel for `path`: `path` itself when it fits; else relative to
/// `cwd` when under it and short enough; else `None` (use [`Short::open`]'s `/proc` form).
pub fn short_path(cwd: &Path, path: &Path) -> Option<PathBuf> {
    if path.as_os_str().len() <= SUN_PATH_MAX {
        return Some(path.to_path_buf());
    }
    let rel = path.strip_prefix(cwd).ok()?;
    let rel = Path::new(".").join(rel);
    (rel.as_os_str().len() <= SUN_PATH_MAX).then_some(rel)
}

/// A socket address short enough for `sun_path`, valid while this value lives (the `/proc`
/// form holds the directory open).
pub struct Short {
    pub path: PathBuf,
    _dir: Option<File>,
}

impl Short {
    /// The short form of `path` (see the module docs).
    pub fn open(path: &Path) -> std::io::Result<Short> {
        let cwd = std::env::current_dir().unwrap_or_default();
        if let Some(p) = short_path(&cwd, path) {
            return Ok(Short {
                path: p,
                _dir: None,
            });
        }
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("socket path {} has no file name", path.display()),
            ));
        };
        let dir = File::open(dir)?;
        let p = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
        if p.as_os_str().len() > SUN_PATH_MAX {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("socket file name too long: {}", path.display()),
            ));
        }
        Ok(Short {
            path: p,
            _dir: Some(dir),
        })
    }
}

/// Binds a Unix listener at `path`, however deep.
pub fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    let short = Short::open(path)?;
    tokio::net::UnixListener::bind(&short.path)
}

/// Connects to the Unix socket at `path`, however deep.
pub async fn connect(path: &Path) -> std::io::Result<tokio::net::UnixStream> {
    let short = Short::open(path)?;
    tokio::net::UnixStream::connect(&short.path).await
}

/// [`connect`], blocking.
pub fn connect_std(path: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    let short = Short::open(path)?;
    std::os::unix::net::UnixStream::connect(&short.path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory under `base` whose socket path is longer than `sun_path`.
    fn deep(base: &Path) -> PathBuf {
        let dir = base.join("a".repeat(60)).join("b".repeat(60));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn short_paths() {
        let cwd = Path::new("/work").join("x".repeat(120));
        let sock = cwd.join("var/run/secrets/workload-spiffe-uds/socket");
        assert_eq!(
            short_path(&cwd, &sock),
            Some(PathBuf::from(
                "./var/run/secrets/workload-spiffe-uds/socket"
            ))
        );
        assert_eq!(short_path(Path::new("/other"), &sock), None);
        let fits = Path::new("/etc/istio/proxy/XDS");
        assert_eq!(short_path(&cwd, fits), Some(fits.to_path_buf()));
    }

    /// Bound and dialed at a path the kernel refuses as is (the directory is not the working
    /// directory: the `/proc` form).
    #[tokio::test]
    async fn bind_and_connect_past_sun_path() {
        let tmp = tempfile::tempdir().unwrap();
        let path = deep(tmp.path()).join("socket");
        assert!(path.as_os_str().len() > SUN_PATH_MAX);
        assert!(
            tokio::net::UnixListener::bind(&path).is_err(),
            "the kernel refuses it as is"
        );
        let listener = bind(&path).unwrap();
        assert!(path.exists(), "the socket file is where it was asked for");
        let accept = tokio::spawn(async move {
            listener.accept().await?;
            listener.accept().await.map(|_| ())
        });
        connect(&path).await.unwrap();
        connect_std(&path).unwrap();
        accept.await.unwrap().unwrap();
    }
}

/// Run in a child process whose working directory is deeper than `sun_path`
/// ([`deep_cwd::deep_working_directory`]): the sockets under it are bound and dialed by relative
/// paths.
#[cfg(test)]
mod deep_cwd {
    use super::*;

    /// The child's part, in the deep working directory.
    fn child_in_deep_working_directory() {
        let cwd = std::env::current_dir().unwrap();
        assert!(cwd.as_os_str().len() > SUN_PATH_MAX, "{}", cwd.display());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for rel in [
                "var/run/secrets/workload-spiffe-uds/socket",
                "etc/istio/proxy/XDS",
            ] {
                let path = cwd.join(rel);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                assert_eq!(
                    Short::open(&path).unwrap().path,
                    Path::new(".").join(rel),
                    "Istio's relative path"
                );
                let listener = bind(&path).unwrap();
                let accept = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
                connect(&path).await.unwrap();
                accept.await.unwrap().unwrap();
            }
        });
    }

    /// Set in the child run of [`deep_working_directory`].
    const CHILD: &str = "PROTO_UDS_DEEP_CWD_CHILD";

    #[test]
    fn deep_working_directory() {
        #[allow(clippy::disallowed_methods)] // the test re-runs itself as its own child
        if std::env::var_os(CHILD).is_some() {
            return child_in_deep_working_directory();
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a".repeat(60)).join("b".repeat(60));
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "uds::deep_cwd::deep_working_directory",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .current_dir(&dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
