#!/usr/bin/env bash
# What the local cluster needs on a Debian machine, beyond scripts/setup.sh: Go (to build the
# pinned components), libseccomp (runc), debootstrap (the images' Debian base), conntrack
# (kube-proxy). Idempotent: a second run only checks.
set -euo pipefail
# shellcheck source=versions.env
source "$(dirname "$0")/versions.env"

missing=()
for p in libseccomp-dev pkg-config debootstrap conntrack iptables iproute2 openssl util-linux; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  [[ $(id -u) == 0 ]] || { echo "cluster setup: missing Debian packages (run as root): ${missing[*]}" >&2; exit 1; }
  echo "cluster setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Go: the one on PATH when it is new enough, else the toolchain module from the Go module proxy
# (golang.org/toolchain, what `GOTOOLCHAIN` itself downloads) into /usr/local/go-<version>.
have=$(go env GOVERSION 2>/dev/null || true)
if [[ $have != "go$GO_VERSION" && $(printf '%s\n' "go$GO_VERSION" "$have" | sort -V | head -1) != "go$GO_VERSION" ]]; then
  dir=/usr/local/go-$GO_VERSION
  if [[ ! -x $dir/bin/go ]]; then
    arch=$(dpkg --print-architecture)
    proxy=${GOPROXY:-https://proxy.golang.org}
    proxy=${proxy%%,*}
    zip=$(mktemp --suffix .zip)
    echo "cluster setup: Go $GO_VERSION from the module proxy (golang.org/toolchain)"
    curl -fsSL -o "$zip" "$proxy/golang.org/toolchain/@v/v0.0.1-go$GO_VERSION.linux-$arch.zip"
    tmp=$(mktemp -d)
    python3 -m zipfile -e "$zip" "$tmp"
    mv "$tmp/golang.org/toolchain@v0.0.1-go$GO_VERSION.linux-$arch" "$dir"
    chmod -R a+rX "$dir" && chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
    rm -rf "$zip" "$tmp"
  fi
  echo "cluster setup: use $dir/bin (export PATH=$dir/bin:\$PATH)"
fi
