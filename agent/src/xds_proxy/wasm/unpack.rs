//! Turning a fetched body into a module file: the gzip and tar layers around the Wasm binary
//! are read as one stream (nested layers are readers wrapped in readers), every layer's
//! decompressed size capped as it streams, and the binary is hashed as it is written to a
//! staging file beside the cache. No layer is ever whole in memory, so one fetch holds the
//! body as downloaded and a few buffers. Synchronous: the cache runs it on the blocking pool.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::WASM_MAGIC;

/// Most gzip or tar layers unwrapped around one module.
const MAX_LAYERS: usize = 8;
/// A tar header block.
const BLOCK: usize = 512;

/// Why a body could not be made a module file.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(
        "a layer unpacks to more than {0} bytes (ISTIO_WASM_MAX_BINARY_SIZE_BYTES); is it a decompression bomb?"
    )]
    TooLarge(u64),
    #[error("{0} not found in the archive")]
    NotFound(&'static str),
    #[error("failed to parse layer as tar.gz: {0}")]
    Archive(#[source] io::Error),
    #[error("failed to parse layer as tar.gz: not a module")]
    NotModule,
    #[cfg(any(test, feature = "fuzzing"))]
    #[error(transparent)]
    Read(io::Error),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// A tar header whose size field is not an octal number.
#[derive(Debug, thiserror::Error)]
#[error("tar entry {name:?} has an unreadable size {size:?}")]
struct TarSizeError {
    name: String,
    size: String,
}

/// The marker a [`Capped`] reader's error carries.
#[derive(Debug, thiserror::Error)]
#[error("layer larger than its cap")]
struct OverCap;

fn over_cap(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<OverCap>())
}

/// A reader that fails (instead of stopping short) once more than `left` bytes came through.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // One byte more than allowed tells a body exactly at the cap from a larger one.
        let want = usize::try_from(self.left.saturating_add(1))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = self.inner.read(&mut buf[..want])?;
        let n64 = u64::try_from(n).unwrap_or(u64::MAX);
        if n64 > self.left {
            return Err(io::Error::other(OverCap));
        }
        self.left -= n64;
        Ok(n)
    }
}

fn capped<'a>(r: impl Read + 'a, cap: u64) -> Box<dyn Read + 'a> {
    Box::new(Capped {
        inner: r,
        left: cap,
    })
}

/// Reads up to `n` bytes (fewer only at the end of the stream).
fn peek(r: &mut dyn Read, n: usize) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(n);
    r.take(u64::try_from(n).unwrap_or(u64::MAX))
        .read_to_end(&mut head)?;
    Ok(head)
}

fn is_gzip(b: &[u8]) -> bool {
    b.len() > 2 && b.starts_with(&[0x1f, 0x8b])
}

fn is_tar(b: &[u8]) -> bool {
    b.len() > 262 && &b[257..262] == b"ustar"
}

fn is_wasm(b: &[u8]) -> bool {
    b.len() >= 8 && b.starts_with(WASM_MAGIC)
}

/// A tar entry's name (with the ustar prefix) and size, or `None` for the end of the archive.
fn tar_header(h: &[u8; BLOCK]) -> Result<Option<(String, u64, u8)>, TarSizeError> {
    if h.iter().all(|x| *x == 0) {
        return Ok(None);
    }
    let name_end = h[..100].iter().position(|x| *x == 0).unwrap_or(100);
    let mut name = String::from_utf8_lossy(&h[..name_end]).into_owned();
    if &h[257..262] == b"ustar" {
        let prefix_end = h[345..500].iter().position(|x| *x == 0).unwrap_or(155);
        if prefix_end > 0 {
            name = format!(
                "{}/{name}",
                String::from_utf8_lossy(&h[345..345 + prefix_end])
            );
        }
    }
    let size_text = String::from_utf8_lossy(&h[124..136]);
    let size = u64::from_str_radix(size_text.trim_matches(|c: char| c == '\0' || c == ' '), 8)
        .map_err(|_| TarSizeError {
            size: size_text.to_string(),
            name: name.clone(),
        })?;
    Ok(Some((name, size, h[156])))
}

/// The first regular file of a tar stream that `wanted` accepts, as a reader of its bytes;
/// the entries before it are read past (the stream's cap bounds how far).
fn tar_file<'a>(
    mut r: Box<dyn Read + 'a>,
    wanted: impl Fn(&str) -> bool,
) -> io::Result<Option<(Box<dyn Read + 'a>, u64)>> {
    loop {
        let mut h = [0u8; BLOCK];
        let head = peek(&mut r, BLOCK)?;
        if head.len() < BLOCK {
            return Ok(None);
        }
        h.copy_from_slice(&head);
        let Some((name, size, kind)) = tar_header(&h).map_err(io::Error::other)? else {
            return Ok(None);
        };
        if (kind == b'0' || kind == 0) && wanted(name.trim_start_matches("./")) {
            return Ok(Some((Box::new(r.take(size)), size)));
        }
        let padded = size.div_ceil(512).saturating_mul(512);
        let skipped = io::copy(&mut (&mut r).take(padded), &mut io::sink())?;
        if skipped < padded {
            return Ok(None);
        }
    }
}

/// What a fetch brought, to be unpacked.
pub(crate) enum Body {
    /// An HTTP module: Istio's `unboxIfPossible` (gzip and tar layers, the first file of each
    /// tar), and the body as it came when that finds no Wasm.
    Http(bytes::Bytes),
    /// An OCI layer, the binary itself or (`packed`) a tar.gz holding `plugin.wasm`.
    Layer { blob: bytes::Bytes, packed: bool },
}

/// A module written to a staging file in the cache's directory (removed when dropped unless
/// [`Staged::keep`] moved it into place).
#[derive(Debug)]
pub(crate) struct Staged {
    path: Option<PathBuf>,
    /// The sha256 (hex) of what was written.
    pub(crate) sha256: String,
    /// Whether it starts with the Wasm magic number.
    pub(crate) wasm: bool,
    /// Its size in bytes.
    pub(crate) size: u64,
}

impl Staged {
    /// Moves the file to `to`.
    pub(crate) fn keep(mut self, to: &Path) -> io::Result<()> {
        let Some(from) = self.path.take() else {
            return Err(io::Error::other("staged module already kept"));
        };
        std::fs::rename(&from, to).inspect_err(|_| {
            let _ = std::fs::remove_file(&from);
        })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A writer that hashes and counts what passes, and keeps its first bytes.
struct Hashing<W> {
    inner: W,
    digest: aws_lc_rs::digest::Context,
    size: u64,
    head: Vec<u8>,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Hashing {
            inner,
            digest: aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256),
            size: 0,
            head: Vec::with_capacity(8),
        }
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        let done = &buf[..n];
        self.digest.update(done);
        self.size += u64::try_from(n).unwrap_or(u64::MAX);
        let room = 8usize.saturating_sub(self.head.len()).min(n);
        self.head.extend_from_slice(&done[..room]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

static STAGING: AtomicU64 = AtomicU64::new(0);
const STAGING_PREFIX: &str = ".staging-";

/// Removes the staging files in `dir` (left by an agent killed while unpacking).
pub(crate) fn remove_staging(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(STAGING_PREFIX) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Unpacks `body` into a staging file in `dir`, no layer larger than `cap`.
pub(crate) fn stage(body: Body, dir: &Path, cap: u64) -> Result<Staged, UnpackError> {
    let write_err = |path: &Path, source| UnpackError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
    let path = dir.join(format!(
        "{STAGING_PREFIX}{}-{}",
        std::process::id(),
        STAGING.fetch_add(1, Ordering::Relaxed)
    ));
    let file = File::create(&path).map_err(|e| write_err(&path, e))?;
    // Removed on every error from here on.
    let mut staged = Staged {
        path: Some(path.clone()),
        sha256: String::new(),
        wasm: false,
        size: 0,
    };
    let mut out = Hashing::new(io::BufWriter::new(file));
    let result = match &body {
        Body::Http(b) => unbox(b, cap, &mut out),
        Body::Layer { blob, packed: true } => plugin_from_tar_gz(blob, cap, &mut out),
        Body::Layer {
            blob,
            packed: false,
        } => out.write_all(blob).map_err(Fail::Io),
    };
    match result {
        Ok(()) => {}
        Err(Fail::TooLarge) => return Err(UnpackError::TooLarge(cap)),
        Err(Fail::Io(e)) if over_cap(&e) => return Err(UnpackError::TooLarge(cap)),
        Err(Fail::NotWasm) => {
            // Istio's rule: a body that does not unpack to Wasm is taken as it came (the
            // checksum and the magic number then judge it).
            let Body::Http(b) = &body else {
                return Err(UnpackError::NotModule);
            };
            out = restart(out).map_err(|e| write_err(&path, e))?;
            out.write_all(b).map_err(|e| write_err(&path, e))?;
        }
        Err(Fail::Missing(what)) => return Err(UnpackError::NotFound(what)),
        Err(Fail::Io(e)) => {
            return Err(match body {
                Body::Layer { .. } => UnpackError::Archive(e),
                Body::Http(_) => write_err(&path, e),
            });
        }
    }
    out.flush().map_err(|e| write_err(&path, e))?;
    let Hashing {
        inner,
        digest,
        size,
        head,
    } = out;
    let file = inner
        .into_inner()
        .map_err(|e| write_err(&path, e.into_error()))?;
    file.sync_all().map_err(|e| write_err(&path, e))?;
    staged.sha256 = hex(digest.finish().as_ref());
    staged.wasm = head.len() == 8 && head.starts_with(WASM_MAGIC);
    staged.size = size;
    Ok(staged)
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write as _;
    b.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The staging file emptied, its hash reset.
fn restart(out: Hashing<io::BufWriter<File>>) -> io::Result<Hashing<io::BufWriter<File>>> {
    let mut file = out.inner.into_inner().map_err(|e| e.into_error())?;
    file.set_len(0)?;
    file.rewind()?;
    Ok(Hashing::new(io::BufWriter::new(file)))
}

/// How an unpacking stopped short.
enum Fail {
    /// A layer grew past the cap.
    TooLarge,
    /// The layers end in something that is not Wasm, or do not parse.
    NotWasm,
    /// The archive lacks the file.
    Missing(&'static str),
    Io(io::Error),
}

/// Copies `r` to `out`, a failure of `r` being `read_fail` (unless over the cap) and of `out`
/// an I/O error.
fn copy(
    r: &mut dyn Read,
    out: &mut dyn Write,
    read_fail: fn(io::Error) -> Fail,
) -> Result<(), Fail> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if over_cap(&e) => return Err(Fail::TooLarge),
            Err(e) => return Err(read_fail(e)),
        };
        out.write_all(&buf[..n]).map_err(Fail::Io)?;
    }
}

/// Istio's `unboxIfPossible`, streamed: gzip and tar (first file) layers, at most
/// [`MAX_LAYERS`], until the Wasm magic number shows; its bytes go to `out`.
fn unbox(body: &[u8], cap: u64, out: &mut dyn Write) -> Result<(), Fail> {
    let not_wasm = |e: io::Error| {
        if over_cap(&e) {
            Fail::TooLarge
        } else {
            Fail::NotWasm
        }
    };
    let mut r: Box<dyn Read + '_> = capped(body, cap);
    for _ in 0..=MAX_LAYERS {
        let head = peek(&mut r, BLOCK).map_err(not_wasm)?;
        let rest = io::Cursor::new(head.clone()).chain(r);
        r = if is_wasm(&head) {
            let mut rest = rest;
            return copy(&mut rest, out, |_| Fail::NotWasm);
        } else if is_gzip(&head) {
            capped(flate2::read::GzDecoder::new(rest), cap)
        } else if is_tar(&head) {
            match tar_file(Box::new(rest), |_| true).map_err(not_wasm)? {
                Some((file, _)) => file,
                None => return Err(Fail::NotWasm),
            }
        } else {
            return Err(Fail::NotWasm);
        };
    }
    Err(Fail::NotWasm)
}

/// Istio's file in a Wasm image's tar.gz layer.
pub(crate) const PLUGIN_FILE: &str = "plugin.wasm";

/// `plugin.wasm` from a tar.gz layer, to `out`.
fn plugin_from_tar_gz(blob: &[u8], cap: u64, out: &mut dyn Write) -> Result<(), Fail> {
    let tar = capped(flate2::read::GzDecoder::new(blob), cap);
    let Some((mut file, size)) = tar_file(tar, |name| name == PLUGIN_FILE).map_err(|e| {
        if over_cap(&e) {
            Fail::TooLarge
        } else {
            Fail::Io(e)
        }
    })?
    else {
        return Err(Fail::Missing(PLUGIN_FILE));
    };
    if size > cap {
        return Err(Fail::TooLarge);
    }
    let mut counted = Counted { inner: out, n: 0 };
    copy(&mut file, &mut counted, Fail::Io)?;
    if counted.n < size {
        return Err(Fail::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{PLUGIN_FILE} cut short ({} of {size} bytes)", counted.n),
        )));
    }
    Ok(())
}

struct Counted<'a> {
    inner: &'a mut dyn Write,
    n: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += u64::try_from(n).unwrap_or(u64::MAX);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Unpacks `body` into memory (at most `cap` bytes per layer) for the fuzz targets and tests:
/// what [`stage`] would write, or why not.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn unpack_to_vec(body: Body, cap: u64) -> Result<Vec<u8>, UnpackError> {
    let mut out = Vec::new();
    let r = match &body {
        Body::Http(b) => unbox(b, cap, &mut out),
        Body::Layer { blob, packed: true } => plugin_from_tar_gz(blob, cap, &mut out),
        Body::Layer {
            blob,
            packed: false,
        } => {
            out.extend_from_slice(blob);
            Ok(())
        }
    };
    match r {
        Ok(()) => Ok(out),
        Err(Fail::NotWasm) => match body {
            Body::Http(b) => Ok(b.to_vec()),
            Body::Layer { .. } => Err(UnpackError::NotModule),
        },
        Err(Fail::TooLarge) => Err(UnpackError::TooLarge(cap)),
        Err(Fail::Missing(w)) => Err(UnpackError::NotFound(w)),
        Err(Fail::Io(e)) if over_cap(&e) => Err(UnpackError::TooLarge(cap)),
        Err(Fail::Io(e)) => Err(match body {
            Body::Layer { .. } => UnpackError::Archive(e),
            Body::Http(_) => UnpackError::Read(e),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(n: usize) -> Vec<u8> {
        let mut m = WASM_MAGIC.to_vec();
        m.extend_from_slice(&[1, 0, 0, 0]);
        m.resize(n, 7);
        m
    }

    fn gz(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    fn tar(name: &str, content: &[u8]) -> Vec<u8> {
        let mut h = [0u8; BLOCK];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[124..135].copy_from_slice(format!("{:011o}", content.len()).as_bytes());
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        let mut t = h.to_vec();
        t.extend_from_slice(content);
        t.resize(t.len().div_ceil(BLOCK) * BLOCK + 2 * BLOCK, 0);
        t
    }

    fn http(b: Vec<u8>, cap: u64) -> Result<Vec<u8>, UnpackError> {
        unpack_to_vec(Body::Http(b.into()), cap)
    }

    fn layer(b: Vec<u8>, cap: u64) -> Result<Vec<u8>, UnpackError> {
        unpack_to_vec(
            Body::Layer {
                blob: b.into(),
                packed: true,
            },
            cap,
        )
    }

    #[test]
    fn nested_layers_unpack_to_the_module() {
        let m = module(5000);
        assert_eq!(http(m.clone(), 1 << 20).unwrap(), m);
        assert_eq!(http(gz(&gz(&m)), 1 << 20).unwrap(), m);
        assert_eq!(http(gz(&tar("x.wasm", &gz(&m))), 1 << 20).unwrap(), m);
        assert_eq!(layer(gz(&tar("plugin.wasm", &m)), 1 << 20).unwrap(), m);
        // Exactly at the cap passes.
        assert_eq!(http(gz(&m), 5000).unwrap(), m);
    }

    #[test]
    fn what_does_not_unpack_comes_back_as_it_came() {
        for body in [
            b"plain text".to_vec(),
            gz(b"not wasm"),
            vec![0x1f, 0x8b, 1, 2, 3],
        ] {
            assert_eq!(http(body.clone(), 1 << 20).unwrap(), body);
        }
        // Nine layers are one too many.
        let mut b = module(100);
        for _ in 0..9 {
            b = gz(&b);
        }
        assert_eq!(http(b.clone(), 1 << 20).unwrap(), b);
    }

    /// Every layer is capped as it streams, the innermost of nested gzip included; a layer
    /// past the cap is an error, never a module cut at the cap.
    #[test]
    fn a_layer_past_the_cap_is_refused() {
        let m = module(5001);
        for body in [gz(&m), gz(&gz(&m)), gz(&tar("x", &m))] {
            let e = http(body, 5000).unwrap_err();
            assert!(matches!(e, UnpackError::TooLarge(5000)), "{e}");
        }
        let e = layer(gz(&tar("plugin.wasm", &m)), 5000).unwrap_err();
        assert!(matches!(e, UnpackError::TooLarge(5000)), "{e}");
        // An outer layer past the cap, even when what it holds would fit.
        let mut padded = tar("pad", &vec![0; 6000]);
        padded.extend_from_slice(&tar("plugin.wasm", &module(100)));
        let e = layer(gz(&padded), 5000).unwrap_err();
        assert!(matches!(e, UnpackError::TooLarge(5000)), "{e}");
    }

    #[test]
    fn layers_without_the_plugin_or_cut_short_are_refused() {
        let e = layer(gz(&tar("other.wasm", &module(10))), 1 << 20).unwrap_err();
        assert!(matches!(e, UnpackError::NotFound("plugin.wasm")), "{e}");
        let mut t = tar("plugin.wasm", &module(2000));
        t.truncate(BLOCK + 100);
        assert!(layer(gz(&t), 1 << 20).is_err());
        assert!(layer(b"not gzip".to_vec(), 1 << 20).is_err());
    }

    #[test]
    fn staging_hashes_what_it_writes_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let m = module(3000);
        let s = stage(Body::Http(gz(&m).into()), dir.path(), 1 << 20).unwrap();
        assert!(s.wasm);
        assert_eq!(s.size, 3000);
        assert_eq!(s.sha256, super::super::sha256_hex(&m));
        let to = dir.path().join("m.wasm");
        s.keep(&to).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), m);
        // Not Wasm: the body as it came, flagged.
        let s = stage(Body::Http(gz(b"text").into()), dir.path(), 1 << 20).unwrap();
        assert!(!s.wasm);
        assert_eq!(s.sha256, super::super::sha256_hex(&gz(b"text")));
        drop(s);
        let e = stage(Body::Http(gz(&module(9000)).into()), dir.path(), 5000).unwrap_err();
        assert!(matches!(e, UnpackError::TooLarge(5000)), "{e}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["m.wasm"], "staging files removed");
    }
}
