#!/usr/bin/env bash
# Sets up the tests' tools and runs every check: formatting, clippy, unit, end-to-end and conformance
# tests. Run as root (the end-to-end tests create network namespaces and program iptables);
# with CI=true a test whose prerequisite is missing fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
step() { echo; echo "==> $* ($((SECONDS - start))s)"; }

step "setup (the demo's packages and Envoy, and the test tools)"
scripts/setup.sh --test-tools
if [[ ${CI:-} == true ]]; then
  scripts/lib/cargo-cache.sh
  export CARGO_INCREMENTAL=0
fi

# A check whose tool is missing (setup.sh installs them where it can) is said plainly; under
# CI=true it fails the run instead of passing silently.
missing_tool() {
  echo "test: $1 is missing: the $2 check did not run" >&2
  if [[ ${CI:-} == true ]]; then exit 1; fi
}

step "format"
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all -- --check
else
  missing_tool "cargo fmt" format
fi

step "clippy"
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --workspace --all-targets --locked -- -D warnings
else
  missing_tool "cargo clippy" clippy
fi

# Errors are typed (a thiserror enum per module); a few text errors may stay where the text is
# the contract. The product crates are every crate but `tests`.
max_string_errors=10
step "function lengths and Result<_, String> (scripts/fn-lengths.py; fails over $max_string_errors Result<_, String> in the product crates)"
if command -v python3 >/dev/null 2>&1; then
  for src in */src agent/src/xds_proxy.rs\ agent/src/xds_proxy; do
    # shellcheck disable=SC2086 # the xds proxy's file and folder are one entry
    echo "$src: $(python3 scripts/fn-lengths.py --summary $src)"
  done
  product=()
  for src in */src; do [[ $src == tests/src ]] || product+=("$src"); done
  string_errors=$(python3 scripts/fn-lengths.py --summary "${product[@]}" | sed -n 's/.*Result<_, String>: //p')
  echo "product crates: $string_errors Result<_, String> (limit $max_string_errors)"
  if ((string_errors > max_string_errors)); then
    echo "test: the product crates have $string_errors Result<_, String>, over the limit of $max_string_errors: give the new errors a thiserror enum" >&2
    exit 1
  fi
else
  missing_tool python3 "function length"
fi

step "benchmark report (docs/benchmarks.md and the README's headline table as docs/benchmarks/ renders them)"
if command -v python3 >/dev/null 2>&1; then
  scripts/bench-report.sh --check
else
  missing_tool python3 "benchmark report"
fi

step "Istio's integration table (docs/istio-integration.md as tests/data/istio-integration/results renders it)"
if command -v python3 >/dev/null 2>&1; then
  python3 scripts/lib/integration_table.py --render tests/data/istio-integration/results \
    --notes tests/data/istio-integration/notes.tsv | diff -u docs/istio-integration.md - >/dev/null ||
    { echo "test: docs/istio-integration.md differs from its data: run scripts/lib/integration_table.py --render (see its header)" >&2; exit 1; }
else
  missing_tool python3 "integration table"
fi

step "cargo deny (licenses, bans, sources; advisories from a local database only)"
if cargo deny --version >/dev/null 2>&1; then
  # cargo metadata, which cargo-deny reads, wants every crate the lock file lists, for every
  # platform: fetch them (crates.io, as the build does); the checks themselves run offline.
  cargo fetch --locked --quiet
  cargo deny --locked --offline check licenses bans sources
  # Advisories only from a database already on this machine (`cargo deny fetch db`): CI fetches
  # nothing. A database older than 90 days fails the check; fetch it again.
  if compgen -G "${CARGO_HOME:-$HOME/.cargo}/advisory-dbs/advisory-db-*/" >/dev/null; then
    cargo deny --locked --offline check advisories
  else
    echo "test: no local advisory database (cargo deny fetch db): advisories not checked"
  fi
else
  missing_tool cargo-deny "licenses, duplicate versions and sources"
fi

step "build (once: every binary and test)"
cargo build --workspace --bins --locked
nextest=false
if cargo nextest --version >/dev/null 2>&1; then
  nextest=true
else
  missing_tool cargo-nextest "nextest (its per-test processes and the ci profile)"
fi
if $nextest; then
  cargo nextest run --workspace --locked --no-run
else
  cargo test --workspace --locked --no-run
fi

# Istio's, Kubernetes' and the node's components from pinned versions (scripts/cluster/
# versions.env), built once per machine outside the clone: the live-istiod tests use Istio's
# pilot-discovery against a real kube-apiserver and etcd, the differential oracle Istio's
# pilot-agent, the cluster step all of it.
step "pinned components (scripts/cluster/build.sh; cached in ${MESH_CACHE:-/var/cache/mesh-agent})"
scripts/cluster/setup.sh
scripts/vm/setup.sh
scripts/cluster/build.sh
ISTIO_GO_BIN=$(scripts/cluster/build.sh --dir istio)
KUBERNETES_BIN=$(scripts/cluster/build.sh --dir kubernetes)
ETCD_BIN=$(scripts/cluster/build.sh --dir etcd)
export ISTIO_GO_BIN KUBERNETES_BIN ETCD_BIN

profile=$([[ ${CI:-} == true ]] && echo ci || echo default)
step "tests (unit, conformance, end-to-end)"
if $nextest; then
  cargo nextest run --workspace --locked --profile "$profile" -E 'not binary(cluster)'
else
  cargo test --workspace --locked
fi

# The real cluster: built from pinned versions once per machine (scripts/cluster/build.sh), up
# for its own tests only, and always taken down again.
step "cluster up (scripts/cluster.sh: kubelet, containerd, Istio's istiod, our proxyv2 image)"
trap 'scripts/cluster.sh down' EXIT
MESH_AGENT_BIN=target/debug scripts/cluster.sh up
step "cluster tests (ours, and Istio's agent as the control)"
if $nextest; then
  cargo nextest run --locked --profile "$profile" -p tests --test cluster
else
  cargo test --locked -p tests --test cluster
fi
# Istio's own integration suites against the same cluster, with our image as every injected
# proxy (docs/cluster.md): TestTraffic's protocols between every kind of workload and its DNS
# capture; mTLS reachability under every PeerAuthentication/DestinationRule mode and an
# AuthorizationPolicy by principal. The full run of
# both agents is `scripts/istio-integration.sh --agent both` (docs/istio-integration.md).
step "Istio's integration tests (a subset, with our agent)"
scripts/istio-integration.sh --agent ours --out target/istio-integration/ci-pilot \
  -run '^TestTraffic$/^(services|dns|serverfirst|autopassthrough|instanceip|tls-origination)$' pilot
scripts/istio-integration.sh --agent ours --out target/istio-integration/ci-security \
  -run '^(TestReachability|TestAuthz_Principal)$' security
step "cluster down"
scripts/cluster.sh down
trap - EXIT

step "fuzz (bounded: each target FUZZ_SECONDS, default 20)"
scripts/fuzz-smoke.sh

step "done in $((SECONDS - start))s"
