#!/usr/bin/env bash
# Istio's own integration tests (tests/integration/ of the pinned istio module, run by its own
# framework with `go test -tags=integ`) against the local cluster of scripts/cluster.sh, with our
# proxy image or, as the control, Istio's Go agent in the same image.
#   usage: scripts/istio-integration.sh [--agent ours|istio] [--out DIR] [SUITE…] [-run REGEX]
#   SUITE: a package under tests/integration/ (default: pilot); REGEX: go test's -run.
# The framework uses the istiod scripts/cluster.sh installed (--istio.test.kube.deploy=false):
# its echo deployments come from the locally built app image, injected by that istiod with the
# chosen proxy image; nothing is pulled. Results: DIR/<agent>.json (go test -json) and a line per
# test and sub-test on stdout; scripts/lib/integration_table.py turns both agents' results into
# docs/istio-integration.md. A framework failure (no cluster, a build error) exits 2, apart from
# test failures (exit 1).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=cluster/versions.env
source "$repo/scripts/cluster/versions.env"
CACHE=${MESH_CACHE:-/var/cache/mesh-agent}
STATE=${MESH_CLUSTER_DIR:-/var/tmp/mesh-cluster}
agent=ours out=$repo/target/istio-integration run='' suites=()
while (($#)); do
  case $1 in
    --agent) agent=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -run) run=$2; shift 2 ;;
    *) suites+=("$1"); shift ;;
  esac
done
((${#suites[@]})) || suites=(pilot)
case $agent in ours) image=proxyv2 ;; istio) image=proxyv2-istio ;; *) echo "--agent ours|istio" >&2; exit 2 ;; esac
fail() { echo "istio-integration: $*" >&2; exit 2; }

"$repo/scripts/cluster.sh" status >/dev/null 2>&1 || fail "the cluster is not up (scripts/cluster.sh up)"
kubectl() { "$STATE/bin/kubectl" --kubeconfig "$STATE/kubeconfig" "$@"; }

# The injector's proxy image for this run: istiod reads its values from this ConfigMap and
# follows a change; the chart's own value is put back at the end.
set_proxy_image() {
  local values
  values=$(kubectl -n istio-system get configmap istio-sidecar-injector -o jsonpath='{.data.values}')
  values=$(python3 -c 'import json,sys; v=json.loads(sys.argv[1]); v["global"]["proxy"]["image"]=sys.argv[2]; v["global"]["proxy_init"]["image"]=sys.argv[2]; print(json.dumps(v))' "$values" "$1")
  kubectl -n istio-system patch configmap istio-sidecar-injector --type merge \
    -p "$(python3 -c 'import json,sys; print(json.dumps({"data": {"values": sys.argv[1]}}))' "$values")" >/dev/null
}
set_proxy_image "$image"
trap 'set_proxy_image proxyv2' EXIT
sleep 3 # istiod's file watch on the mounted ConfigMap

# Istio's tests build from a module that requires the pinned istio (their test dependencies
# are resolved on the way: -mod=mod).
src=$CACHE/src/istio-integration-$ISTIO_VERSION
if [[ ! -f $src/go.sum ]]; then
  mkdir -p "$src"
  printf 'module meshagent.local/integration\n\ngo 1.26.0\n\nrequire %s %s\n' "$ISTIO_MODULE" "$ISTIO_VERSION" >"$src/go.mod"
  printf '//go:build tools\npackage tools\nimport _ "%s/pkg/test/framework"\n' "$ISTIO_MODULE" >"$src/tools.go"
  (cd "$src" && go mod tidy) || fail "resolving $ISTIO_MODULE@$ISTIO_VERSION failed"
fi
mkdir -p "$out/bin"
args=(--istio.test.kube.config="$STATE/kubeconfig" --istio.test.kube.deploy=false
  --istio.test.hub="$IMAGE_HUB" --istio.test.tag="$IMAGE_TAG" --istio.test.pullpolicy=Never
  --istio.test.kube.loadbalancer=false --istio.test.work_dir="$out/work-$agent")
echo "istio-integration: ${suites[*]} with $agent ($IMAGE_HUB/$image:$IMAGE_TAG)" >&2
istio_dir=$(go mod download -json "$ISTIO_MODULE@$ISTIO_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
: >"$out/$agent.json"
rc=0
for suite in "${suites[@]}"; do
  pkg=$ISTIO_MODULE/tests/integration/$suite
  test_bin=$out/bin/${suite//\//_}.test
  # Built here (the module proxy is reachable), run in the cluster's network namespace (it is
  # not), from the package's own folder as go test runs it.
  (cd "$src" && GOFLAGS=-mod=mod go test -c -tags=integ -o "$test_bin" "$pkg") ||
    fail "building $pkg failed"
  (cd "$istio_dir/tests/integration/$suite" && nsenter --net=/run/netns/mesh-node -- \
    go tool test2json -p "$pkg" "$test_bin" -test.v=test2json -test.count=1 -test.timeout=60m \
    ${run:+-test.run "$run"} "${args[@]}") >>"$out/$agent.json" || rc=$?
done
python3 "$repo/scripts/lib/integration_table.py" --summary "$out/$agent.json"
exit $((rc == 0 ? 0 : 1))
