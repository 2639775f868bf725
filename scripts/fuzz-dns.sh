#!/usr/bin/env bash
# Fuzzes the DNS proxy's request path for a bounded time (default 60 s).
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# Usage: scripts/fuzz-dns.sh [seconds]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECS="${1:-60}"
command -v cargo-fuzz >/dev/null || { echo "missing cargo-fuzz: cargo install cargo-fuzz" >&2; exit 1; }
cd "$ROOT/dns-proxy"
mkdir -p fuzz/corpus/request
# Seeds: a plain query, an EDNS query, a query for a table name (dig +qr prints nothing useful
# offline, so the seeds are written byte by byte).
printf '\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03svc\x03ns1\x03svc\x07cluster\x05local\x00\x00\x01\x00\x01' \
  >fuzz/corpus/request/table-a
printf '\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x01\x04many\x07example\x03com\x00\x00\x01\x00\x01\x00\x00\x29\x02\x00\x00\x00\x00\x00\x00\x00' \
  >fuzz/corpus/request/edns-many
printf '\x12\x34\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00\x01x\x04test\x00\x00\x01\x00\x01\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\xc6\x12\x00\x01' \
  >fuzz/corpus/request/answer
# No sanitizer: the request path is safe Rust; the target hunts panics (debug assertions on).
cargo +nightly fuzz run --sanitizer none request fuzz/corpus/request -- -max_total_time="$SECS" -max_len=4096
