//! The test apps' HTTP/1.1 answer (`mesh-app`, `pod-app`): `hello from <name>`, the peer and the
//! request head it received, so a test can see what the mesh added.

use std::io::{BufRead, BufReader, Read, Write};

/// Serves requests on `stream` until the peer closes it.
pub fn serve(stream: impl Read + Write, name: &str, peer: &str) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
            head.push_str(&line);
        }
        let body = format!("hello from {name}\npeer: {peer}\n{head}");
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let out = reader.get_mut();
        if out.write_all(resp.as_bytes()).is_err() || out.flush().is_err() {
            return;
        }
    }
}
