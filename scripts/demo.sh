#!/usr/bin/env bash
# The main job: sets up what the demo needs (scripts/setup.sh: Debian packages and Envoy, none of
# the test tools), then runs the mesh and prints what happens step by step.
# As root: the mesh in a box (istiod-lite + two injected pods with pilot-agent and real Envoy in
# network namespaces). Without root: a local Envoy from the bootstrap `pilot-agent bootstrap`
# writes, with the agent in --external-envoy mode against istiod-lite on loopback.
#   scripts/demo.sh [--keep]   (--keep: leave it running until Enter, to look around)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --workspace --bins
log=${TMPDIR:-/tmp}/mesh-demo.log
echo "demo: logs of every process (istiod-lite, agents, Envoys, apps) go to $log"
target/debug/demo "$@" 2>"$log"
