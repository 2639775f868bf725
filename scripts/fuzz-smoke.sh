#!/usr/bin/env bash
# Bounded fuzzing for CI: the cargo-fuzz project fuzz/ (DNS requests and upstream answers,
# iptables flags, istiod-lite's ADS requests, SDS requests, xDS/NDS
# decode, the XDS socket's HPACK rewriter, app probers, status-port requests, CSR/PEM in the CA,
# Istio YAML, Wasm OCI manifests and layers) is built once (all targets in one build), then each runs for
# FUZZ_SECONDS (default 20) starting from its committed seed corpus. Fails on any crash (the
# reproducer is left in <project>/artifacts/<target>/), prints executions per target.
#
# Runs on the stable toolchain: cargo-fuzz passes -Z flags, which RUSTC_BOOTSTRAP=1 allows.
# cargo-fuzz is installed with `cargo install --locked` when missing (about a minute).
# Settings (environment):
#   FUZZ_SECONDS    seconds per target (default 20)
#   FUZZ_SANITIZER  none (default) or address: the targets are Rust, what they look for is a
#                   panic; ASan makes the build about twice as long for little gain here
#   FUZZ_TARGETS    space-separated subset of target names (default: all)
#   FUZZ_PROFILE    dev (default: unoptimised, builds several times faster; fewer executions
#                   per second, plenty for a smoke run) or release (for long runs)
#   FUZZ_RUNS       stop each target after this many executions (default: time only); a
#                   campaign: FUZZ_PROFILE=release FUZZ_RUNS=10000000 FUZZ_SECONDS=7200
#   FUZZ_JOBS       targets fuzzed at once (default: the number of cores); each target is one
#                   single-threaded libFuzzer process, so each still gets a whole core
# Usage: scripts/fuzz-smoke.sh
# Reproduce a crash: <project>/target-dir binary with the artifact as argument, e.g.
#   fuzz/target/x86_64-unknown-linux-gnu/debug/xds_decode fuzz/artifacts/xds_decode/crash-...
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECS="${FUZZ_SECONDS:-20}"
SANITIZER="${FUZZ_SANITIZER:-none}"
ONLY="${FUZZ_TARGETS:-}"
PROFILE="${FUZZ_PROFILE:-dev}"
RUNS="${FUZZ_RUNS:-}"
JOBS="${FUZZ_JOBS:-$(nproc)}"
runs_flag=()
[[ -n $RUNS ]] && runs_flag=(-runs="$RUNS")
case "$PROFILE" in
  dev) profile_flag=(--dev); profile_dir=debug ;;
  release) profile_flag=(--release); profile_dir=release ;;
  *) echo "fuzz-smoke: FUZZ_PROFILE must be dev or release, not $PROFILE" >&2; exit 2 ;;
esac
export RUSTC_BOOTSTRAP=1
# One target dir for every fuzz project: they share most dependencies (proto, tokio, ...).
TARGET_DIR="$ROOT/fuzz/target"
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz-smoke: installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi

projects=(fuzz)

# Fuzzes target $3 of project $1 (folder $2) for SECS; writes "<exit> <seconds>" to its log's .status.
fuzz_one() {
  local p=$1 dir=$2 t=$3
  local bin="$TARGET_DIR/$TRIPLE/$profile_dir/$t" seeds="$dir/corpus/$t" work="$TARGET_DIR/fuzz-corpus/$p/$t"
  local artifacts="$dir/artifacts/$t/" log="$TARGET_DIR/fuzz-corpus/$p/$t.log" t0=$SECONDS rc=0
  mkdir -p "$seeds" "$work" "$artifacts"
  # New inputs go to the work corpus (first directory); the committed seeds stay as they are.
  "$bin" "$work" "$seeds" -max_total_time="$SECS" "${runs_flag[@]}" -timeout=10 -rss_limit_mb=2048 \
    -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts" >"$log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - t0))" >"$log.status"
}

start=$SECONDS
failed=()
summary=()
for p in "${projects[@]}"; do
  dir="$ROOT/$p"
  # The project folder's parent is the crate cargo-fuzz belongs to.
  crate="$(dirname "$dir")"
  # A project without its own lock file gets the workspace's, so it builds the same versions
  # as the others and reuses their compiled dependencies in the shared target dir.
  [[ -f "$dir/Cargo.lock" ]] || cp "$ROOT/Cargo.lock" "$dir/Cargo.lock"
  echo "==> fuzz-smoke: building $p (profile: $PROFILE, sanitizer: $SANITIZER)"
  b=$SECONDS
  (cd "$crate" && cargo fuzz build --fuzz-dir "$dir" "${profile_flag[@]}" -s "$SANITIZER" \
    --target-dir "$TARGET_DIR")
  echo "fuzz-smoke: $p built in $((SECONDS - b))s"
  mapfile -t targets < <(cd "$crate" && cargo fuzz list --fuzz-dir "$dir")
  run_targets=()
  for t in "${targets[@]}"; do
    if [[ -n $ONLY && " $ONLY " != *" $t "* ]]; then continue; fi
    run_targets+=("$t")
  done
  # JOBS targets at a time; each writes its exit status and time beside its log.
  for t in "${run_targets[@]}"; do
    while (($(jobs -rp | wc -l) >= JOBS)); do wait -n || true; done
    fuzz_one "$p" "$dir" "$t" &
  done
  wait
  for t in "${run_targets[@]}"; do
    log="$TARGET_DIR/fuzz-corpus/$p/$t.log"
    read -r rc secs <"$log.status"
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    line="$p/$t: ${execs:-?} executions in ${secs}s, exit $rc"
    summary+=("$line")
    if ((rc != 0)); then
      failed+=("$line")
      echo "fuzz-smoke: CRASH in $line; last output:" >&2
      tail -40 "$log" >&2
      ls -1 "$dir/artifacts/$t/" >&2 || true
    else
      echo "fuzz-smoke: $line"
    fi
  done
done

echo "==> fuzz-smoke summary ($((SECONDS - start))s)"
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz-smoke: ${#failed[@]} target(s) crashed" >&2
  exit 1
fi
