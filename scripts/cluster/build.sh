#!/usr/bin/env bash
# Builds the pinned components of the local cluster from the Go module proxy, once per machine:
# each into $MESH_CACHE/bin/<component>-<version>/ (default /var/cache/mesh-agent), outside any
# clone, so a fresh clone on the same machine reuses them. A component whose directory is
# complete is not built again.
#   usage: scripts/cluster/build.sh [component…]   (default: all; `--list` prints the names)
# A failed build names the component, its version and its log, and leaves no partial directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
CACHE=${MESH_CACHE:-/var/cache/mesh-agent}
export GOFLAGS=-trimpath GOTOOLCHAIN=local
# scripts/cluster/setup.sh puts Go here when the machine has none new enough.
[[ -x /usr/local/go-$GO_VERSION/bin/go ]] && export PATH=/usr/local/go-$GO_VERSION/bin:$PATH

# name → version: the directory key of each component.
declare -A VERSION=(
  [istio]=$ISTIO_VERSION [istio-test-servers]=$ISTIO_VERSION [kubernetes]=$KUBERNETES_VERSION [etcd]=$ETCD_VERSION
  [containerd]=$CONTAINERD_VERSION [runc]=$RUNC_VERSION [cni]=$CNI_PLUGINS_VERSION
  [coredns]=$COREDNS_VERSION [pause]=$(sha256sum "$here/go/pause/main.go" | cut -c1-12)
)
ORDER=(pause runc cni containerd etcd coredns kubernetes istio istio-test-servers)

bin_dir() { echo "$CACHE/bin/$1-${VERSION[$1]}"; }

build_istio() {
  local v=$ISTIO_VERSION p=$ISTIO_MODULE
  CGO_ENABLED=0 GOBIN=$1 go install -ldflags="-s -w -X $p/pkg/version.buildVersion=$ISTIO_BUILD_VERSION" \
    "$p/pilot/cmd/pilot-discovery@$v" "$p/pilot/cmd/pilot-agent@$v" \
    "$p/istioctl/cmd/istioctl@$v" "$p/pkg/test/echo/cmd/server@$v" \
    "$p/pkg/test/echo/cmd/client@$v" "$p/cni/cmd/istio-cni@$v" "$p/cni/cmd/install-cni@$v"
}

# The servers Istio's integration suites deploy beside their echo apps (security: the sample
# ext-authz server, the JWT/JWKS server).
build_istio-test-servers() {
  local v=$ISTIO_VERSION p=$ISTIO_MODULE
  CGO_ENABLED=0 GOBIN=$1 go install -ldflags="-s -w" "$p/samples/extauthz/cmd/extauthz@$v"
  local src
  src=$(go mod download -json "$p@$v" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  (cd "$src/samples/jwt-server/src" && CGO_ENABLED=0 go build -ldflags="-s -w" -o "$1/jwt-server" main.go)
}

# Kubernetes' go.mod replaces its staging modules with ./staging paths, so `go install` refuses
# it: a wrapper module requires it and points each staging module at its published release.
build_kubernetes() {
  local out=$1 src="$CACHE/src/kubernetes-$KUBERNETES_VERSION" mod
  mod=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  rm -rf "$src" && mkdir -p "$src"
  {
    echo "module meshagent.local/kubernetes"
    echo "go 1.25.0"
    echo "godebug default=go1.25"
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    sed -n 's|^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*|replace \1 => \1 '"$KUBERNETES_STAGING_VERSION"'|p' "$mod"
  } >"$src/go.mod"
  local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
  {
    echo "//go:build tools"
    echo "package tools"
    printf 'import _ "k8s.io/kubernetes/cmd/%s"\n' "${cmds[@]}"
  } >"$src/tools.go"
  local ld="-s -w" minor=${KUBERNETES_VERSION#v1.}
  minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean"
  done
  (cd "$src" && go mod tidy && CGO_ENABLED=0 go build -ldflags="$ld" -o "$out/" \
    "${cmds[@]/#/k8s.io/kubernetes/cmd/}")
}

# etcd's server module replaces its sibling modules with ../ paths: the same wrapper trick.
build_etcd() {
  local out=$1 src="$CACHE/src/etcd-$ETCD_VERSION"
  rm -rf "$src" && mkdir -p "$src"
  {
    echo "module meshagent.local/etcd"
    echo "go 1.25.0"
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do
      echo "replace go.etcd.io/etcd/$m => go.etcd.io/etcd/$m $ETCD_VERSION"
    done
  } >"$src/go.mod"
  printf '//go:build tools\npackage tools\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$src/tools.go"
  (cd "$src" && go mod tidy && CGO_ENABLED=0 go build -ldflags="-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
}

build_containerd() {
  local p=github.com/containerd/containerd/v2 v=$CONTAINERD_VERSION
  CGO_ENABLED=0 GOBIN=$1 go install -ldflags="-s -w -X $p/version.Version=$v" \
    "$p/cmd/containerd@$v" "$p/cmd/ctr@$v" "$p/cmd/containerd-shim-runc-v2@$v"
}

# runc needs cgo and libseccomp (Debian's libseccomp-dev; setup installs it).
build_runc() {
  CGO_ENABLED=1 GOBIN=$1 go install -tags "seccomp urfave_cli_no_docs" -ldflags="-s -w" \
    "github.com/opencontainers/runc@$RUNC_VERSION"
}

build_cni() {
  local p=github.com/containernetworking/plugins v=$CNI_PLUGINS_VERSION
  CGO_ENABLED=0 GOBIN=$1 go install -ldflags="-s -w" \
    "$p/plugins/main/bridge@$v" "$p/plugins/ipam/host-local@$v" \
    "$p/plugins/main/loopback@$v" "$p/plugins/meta/portmap@$v"
}

build_coredns() {
  CGO_ENABLED=0 GOBIN=$1 go install -ldflags="-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
}

# The pod sandbox's pause process: our own few lines (scripts/cluster/go/pause).
build_pause() {
  (cd "$here/go/pause" && CGO_ENABLED=0 go build -ldflags="-s -w" -o "$1/pause" .)
}

build_one() {
  local name=$1 dir tmp log
  dir=$(bin_dir "$name")
  [[ -f $dir/.complete ]] && return 0
  # One build of a component at a time per machine; a second waits, then finds it built.
  mkdir -p "$CACHE/bin"
  exec {lock}>"$dir.lock"
  flock "$lock"
  [[ -f $dir/.complete ]] && return 0
  tmp="$dir.partial" log="$CACHE/logs/$name-${VERSION[$name]}.log"
  mkdir -p "$CACHE/logs" && rm -rf "$tmp" && mkdir -p "$tmp"
  echo "cluster build: $name ${VERSION[$name]} (log: $log)"
  local t0=$SECONDS
  if ! "build_$name" "$tmp" >"$log" 2>&1; then
    rm -rf "$tmp"
    echo "cluster build: $name ${VERSION[$name]} failed; its log: $log" >&2
    tail -n 20 "$log" >&2
    return 1
  fi
  touch "$tmp/.complete" && rm -rf "$dir" && mv "$tmp" "$dir"
  echo "cluster build: $name ${VERSION[$name]} built in $((SECONDS - t0)) s"
}

case ${1:-} in
  --list) printf '%s\n' "${ORDER[@]}"; exit 0 ;;
  --dir) bin_dir "$2"; exit 0 ;;
esac
command -v go >/dev/null || { echo "cluster build: Go is missing (scripts/setup.sh --cluster installs it)" >&2; exit 1; }
for name in "${@:-${ORDER[@]}}"; do
  [[ -n ${VERSION[$name]:-} ]] || { echo "cluster build: unknown component $name" >&2; exit 2; }
  build_one "$name"
done
