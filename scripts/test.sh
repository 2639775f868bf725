#!/usr/bin/env bash
# Sets up everything and runs every check: formatting, clippy, unit, end-to-end and conformance
# tests. Run as root (the end-to-end tests create network namespaces and program iptables);
# with CI=true a test whose prerequisite is missing fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
step() { echo; echo "==> $* ($((SECONDS - start))s)"; }

step "setup"
scripts/setup.sh

step "format"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "build (once: every binary and test)"
cargo build --workspace --bins --locked
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-run
else
  cargo test --workspace --locked --no-run
fi

step "tests (unit, conformance, end-to-end)"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --profile "$([[ ${CI:-} == true ]] && echo ci || echo default)"
else
  cargo test --workspace --locked
fi

step "fuzz (bounded: each target FUZZ_SECONDS, default 20)"
scripts/fuzz-smoke.sh

step "done in $((SECONDS - start))s"
