//! A tiny HTTP/1.1 app for end-to-end tests and the demo: answers every request with
//! `hello from <name>` followed by the request head it received (so a test can see, e.g., the
//! headers Envoy added). Usage: `mesh-app <listen addr> <name>`.

#![forbid(unsafe_code)]

use std::net::TcpListener;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(addr), Some(name)) = (args.next(), args.next()) else {
        eprintln!("usage: mesh-app <listen addr> <name>");
        std::process::exit(2);
    };
    let listener = match TcpListener::bind(&addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mesh-app: bind {addr}: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("mesh-app {name} listening on {addr}");
    for stream in listener.incoming().flatten() {
        let name = name.clone();
        std::thread::spawn(move || {
            let peer = stream
                .peer_addr()
                .map(|p| p.to_string())
                .unwrap_or_default();
            harness::app::serve(stream, &name, &peer);
        });
    }
}
