#!/usr/bin/env bash
# The main job: sets everything up and runs the mesh locally, showing what happens.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --workspace --bins
if [[ $(id -u) != 0 ]]; then
  echo "demo: run as root to create the network namespaces the pod runs in" >&2
  exit 1
fi
echo "demo: starting real Envoy in a fresh network namespace (the smoke pod)"
cargo test -p tests --test smoke -- --nocapture --test-threads 1
