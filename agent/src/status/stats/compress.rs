//! The merged metrics compressed when the scraper asks (`Accept-Encoding: gzip` or `zstd`),
//! frame by frame as the body streams.

use std::io::Write;

/// A content coding the merged metrics can be answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    Zstd,
}

impl Coding {
    pub fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Zstd => "zstd",
        }
    }
}

/// The coding to answer in for an `Accept-Encoding` header: the accepted one with the highest
/// `q` (`*` stands for gzip; `q=0` refuses); on a tie zstd, as it costs less CPU for the same
/// size. `None` answers uncompressed.
pub fn choose(accept_encoding: Option<&str>) -> Option<Coding> {
    let mut best: Option<(u16, Coding)> = None;
    let mut refused = Vec::new();
    let mut star = None;
    for item in accept_encoding?.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q=").map(str::to_string))
            .next()
            .map(|q| parse_q(&q))
            .unwrap_or(Some(1000));
        let Some(q) = q else { continue };
        let coding = match name.as_str() {
            "gzip" | "x-gzip" => Coding::Gzip,
            "zstd" => Coding::Zstd,
            "*" => {
                star = Some(q);
                continue;
            }
            _ => continue,
        };
        if q == 0 {
            refused.push(coding);
            continue;
        }
        if best.is_none_or(|(bq, bc)| q > bq || (q == bq && coding == Coding::Zstd && bc != coding))
        {
            best = Some((q, coding));
        }
    }
    if best.is_none()
        && let Some(q) = star
        && q > 0
        && !refused.contains(&Coding::Gzip)
    {
        return Some(Coding::Gzip);
    }
    best.map(|(_, c)| c)
}

/// A `q` value in thousandths (`1`, `0.5`, `0.125`); `None` when malformed.
fn parse_q(q: &str) -> Option<u16> {
    let v: f64 = q.trim().parse().ok()?;
    (0.0..=1.0)
        .contains(&v)
        .then(|| (v * 1000.0).round() as u16)
}

/// A streaming compressor: each pushed chunk comes back as the compressed bytes ready so far.
pub enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    pub fn new(coding: Coding) -> std::io::Result<Self> {
        Ok(match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::fast(),
            )),
            Coding::Zstd => Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 3)?),
        })
    }

    /// Compresses `data`, flushing so that the scraper gets the lines as they stream.
    pub fn push(&mut self, data: &[u8]) -> std::io::Result<bytes::Bytes> {
        let out = match self {
            Encoder::Gzip(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
            Encoder::Zstd(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
        };
        Ok(bytes::Bytes::from(std::mem::take(out)))
    }

    /// Ends the stream (gzip's trailer, zstd's last block).
    pub fn finish(self) -> std::io::Result<bytes::Bytes> {
        Ok(bytes::Bytes::from(match self {
            Encoder::Gzip(e) => e.finish()?,
            Encoder::Zstd(e) => e.finish()?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_coding_follows_accept_encoding() {
        assert_eq!(choose(None), None);
        assert_eq!(choose(Some("")), None);
        assert_eq!(choose(Some("identity")), None);
        assert_eq!(choose(Some("br")), None);
        // Prometheus sends `gzip` alone.
        assert_eq!(choose(Some("gzip")), Some(Coding::Gzip));
        assert_eq!(choose(Some("zstd")), Some(Coding::Zstd));
        assert_eq!(choose(Some("gzip, deflate, br, zstd")), Some(Coding::Zstd));
        assert_eq!(choose(Some("gzip;q=1.0, zstd;q=0.5")), Some(Coding::Gzip));
        assert_eq!(choose(Some("zstd;q=0, gzip;q=0.1")), Some(Coding::Gzip));
        assert_eq!(choose(Some("gzip;q=0")), None);
        assert_eq!(choose(Some("*")), Some(Coding::Gzip));
        assert_eq!(choose(Some("gzip;q=0, *")), None);
        assert_eq!(choose(Some("gzip;q=nope")), None);
    }

    #[test]
    fn streamed_chunks_decompress_to_the_input() {
        let chunks: [&[u8]; 3] = [b"a_total 1\n", b"b_total 2\n", b"c 3\n"];
        for coding in [Coding::Gzip, Coding::Zstd] {
            let mut enc = Encoder::new(coding).unwrap();
            let mut wire = Vec::new();
            for c in chunks {
                let out = enc.push(c).unwrap();
                assert!(!out.is_empty(), "{coding:?}: each chunk is flushed");
                wire.extend_from_slice(&out);
            }
            wire.extend_from_slice(&enc.finish().unwrap());
            let mut plain = Vec::new();
            match coding {
                Coding::Gzip => {
                    flate2::read::GzDecoder::new(&wire[..])
                        .read_to_end(&mut plain)
                        .unwrap();
                }
                Coding::Zstd => plain = zstd::stream::decode_all(&wire[..]).unwrap(),
            }
            assert_eq!(plain, chunks.concat(), "{coding:?}");
        }
    }
}
