//! A tiny blocking HTTP/1.1 client (Connection: close), enough for admin, status and app endpoints.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// GET `path` from `addr`; returns the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    request(addr, "GET", path)
}

/// Sends `method path` to `addr` with an empty body; returns the status code and the body.
pub fn request(addr: SocketAddr, method: &str, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write {addr}: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .map_err(|e| format!("read {addr}{path}: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header from {addr}{path}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line from {addr}{path}: {head:?}"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| format!("bad chunked body from {addr}{path}"))?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// Decodes a chunked body.
fn dechunk(mut s: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        s = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dechunks() {
        assert_eq!(
            super::dechunk("5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n").as_deref(),
            Some("hello!")
        );
        assert_eq!(super::dechunk("5\r\nhel"), None);
    }
}
