#!/usr/bin/env bash
# Relay of a 10,000-cluster CDS (10,000 ServiceEntries in istiod-lite's config dir) through the
# agent's xDS proxy: time for the full CDS on a fresh ADS stream via the agent's XDS socket vs
# directly to istiod-lite (TLS and plaintext), medians of CDS_RELAY_RUNS (5), and the agent's
# peak RSS (VmHWM) before and after the pushes. Builds pilot-agent (dist profile, as shipped) and
# istiod-lite (release) first.
# Usage: agent/benches/cds-relay.sh   (env: CDS_RELAY_CLUSTERS=10000 CDS_RELAY_RUNS=5)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
scripts/build-dist.sh -q
cargo build --release -q -p control-plane --bin istiod-lite
cargo bench -q -p agent --bench cds_relay
