#!/usr/bin/env bash
# Istio's own integration tests (tests/integration/ of the pinned istio module, run by its own
# framework with `go test -tags=integ`) against the local cluster of scripts/cluster.sh, with our
# proxy image or, as the control, Istio's Go agent in the same image.
#   usage: scripts/istio-integration.sh [--agent ours|istio|both] [--record] [--vm] [--out DIR]
#          [SUITE…] [-run REGEX] [-skip REGEX] [--istio.test.FLAG=VALUE…] (passed to the framework)
#   --record: keep the results as data, per suite and agent, in tests/data/istio-integration/
#   results/ (replacing that suite's and agent's earlier run) and render docs/istio-integration.md
#   from every recorded run (the rows that do not pass with both explained by
#   tests/data/istio-integration/notes.tsv).
#   --agent both: the same tests with ours, then with Istio's agent, both recorded.
#   SUITE: a package under tests/integration/ (default: pilot); REGEX: go test's -run / -skip.
#   --vm: the VM tests too (without it the framework runs with --istio.test.skipVM): the echo
#   workloads the framework deploys "as VMs" run the image app_sidecar_debian_12 with the agent
#   under test in its istio-sidecar.deb (scripts/cluster/images.sh --vm, loaded into the node;
#   Istio's agent's is tagged IMAGE_TAG_ISTIO, so that run uses that tag, under which the app
#   image is named too), and the install has the east-west gateway through which they reach
#   istiod (scripts/cluster/manifests/istio-eastwest*.yaml).
# Before each suite, Istio is reinstalled as the framework installs it for its tests (the module's
# tests/integration/base.yaml and iop-integration-test-defaults.yaml: DNS capture, access logs,
# the ingress and egress gateways), with the cluster's upstream-Envoy settings and the suite's own
# control-plane values (scripts/cluster/manifests/integration/SUITE.yaml, where a suite has them),
# and the agent under test as the proxy image of the gateways and of every injected pod; the
# framework then runs against that istiod (--istio.test.kube.deploy=false). Nothing is pulled.
# At the end the cluster's own install is put back and the framework's namespaces are removed.
# Results: DIR/<agent>.json (go test -json) and a line per test on stdout;
# scripts/lib/integration_table.py turns both agents' results into docs/istio-integration.md.
# Exit: 0 all passed, 1 a test failed, 2 a framework failure (no cluster, a build or install
# error, a suite that did not finish).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=cluster/versions.env
source "$repo/scripts/cluster/versions.env"
CACHE=${MESH_CACHE:-/var/cache/mesh-agent}
STATE=${MESH_CLUSTER_DIR:-/var/tmp/mesh-cluster}
manifests=$repo/scripts/cluster/manifests
agent=ours vm=() out=$repo/target/istio-integration run='' skip='' suites=() extra=() record=false
while (($#)); do
  case $1 in
    --agent) agent=$2; shift 2 ;;
    --vm) vm=(--vm); shift ;;
    --record) record=true; shift ;;
    --out) out=$2; shift 2 ;;
    -run) run=$2; shift 2 ;;
    -skip) skip=$2; shift 2 ;;
    --istio.test.*) extra+=("$1"); shift ;;
    *) suites+=("$1"); shift ;;
  esac
done
((${#suites[@]})) || suites=(pilot)
out=$(realpath -m "$out")
if [[ $agent == both ]]; then
  status=0
  for one in ours istio; do
    "$0" --agent "$one" --record --out "$out" ${vm[@]+"${vm[@]}"} ${run:+-run "$run"} ${skip:+-skip "$skip"} \
      ${extra[@]+"${extra[@]}"} "${suites[@]}" || status=$?
    ((status < 2)) || exit "$status"
  done
  echo "istio-integration: both agents recorded; docs/istio-integration.md rendered" >&2
  exit "$status"
fi
case $agent in
  ours) image=proxyv2 vm_tag=$IMAGE_TAG vm_image=app_sidecar_debian_12 ;;
  istio) image=proxyv2-istio vm_tag=$IMAGE_TAG_ISTIO vm_image=app_sidecar_debian_12-istio ;;
  *) echo "--agent ours|istio|both" >&2; exit 2 ;;
esac
fail() { echo "istio-integration: $*" >&2; exit 2; }

"$repo/scripts/cluster.sh" status >/dev/null 2>&1 || fail "the cluster is not up (scripts/cluster.sh up)"
kubectl() { "$STATE/bin/kubectl" --kubeconfig "$STATE/kubeconfig" "$@"; }
istio_dir=$(go mod download -json "$ISTIO_MODULE@$ISTIO_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
[[ -d $istio_dir ]] || fail "the module $ISTIO_MODULE@$ISTIO_VERSION is not in the module cache"
mkdir -p "$out/bin"

# Istio as the framework installs it for SUITE, with this run's proxy image.
install_for() {
  local suite=$1 manifest=$out/istio-$agent.yaml log=$out/install-$agent.log files
  files=(-f "$istio_dir/tests/integration/base.yaml"
    -f "$istio_dir/tests/integration/iop-integration-test-defaults.yaml"
    -f "$manifests/istio-operator.yaml" -f "$manifests/istio-gateways.yaml")
  [[ -f $manifests/integration/${suite//\//_}.yaml ]] && files+=(-f "$manifests/integration/${suite//\//_}.yaml")
  "$STATE/bin/istioctl" manifest generate "${files[@]}" --set hub="$IMAGE_HUB" --set tag="$IMAGE_TAG" \
    --set values.global.proxy.image="$image" --set values.global.proxy_init.image="$image" \
    >"$manifest" 2>"$log" || fail "rendering Istio for $suite failed; its log: $log"
  local deployments=(istiod istio-ingressgateway istio-egressgateway)
  if ((${#vm[@]})); then
    {
      echo ---
      "$STATE/bin/istioctl" manifest generate -f "$manifests/istio-gateways.yaml" -f "$manifests/istio-eastwest.yaml" \
        --set hub="$IMAGE_HUB" --set tag="$IMAGE_TAG" --set values.global.proxy.image="$image"
      echo ---
      cat "$manifests/istio-eastwest-istiod.yaml"
    } >>"$manifest" 2>>"$log" || fail "rendering the east-west gateway for $suite failed; its log: $log"
    deployments+=(istio-eastwestgateway)
  fi
  kubectl apply --server-side --force-conflicts -f "$manifest" >>"$log" 2>&1 ||
    fail "installing Istio for $suite failed; its log: $log"
  local deployment
  for deployment in "${deployments[@]}"; do
    kubectl -n istio-system rollout status "deployment/$deployment" --timeout=240s >>"$log" 2>&1 ||
      fail "$deployment not ready for $suite; its log: $log"
  done
}

# The cluster's own install back; what only the tests' install has (the gateways, the network
# policies) and the framework's namespaces (an interrupted run leaves them) removed.
restore() {
  kubectl delete namespace -l istio-testing=istio-test --wait=false >/dev/null 2>&1 || true
  [[ -f $out/istio-$agent.yaml ]] || return 0
  python3 "$repo/scripts/lib/manifest_diff.py" "$out/istio-$agent.yaml" "$STATE/istio.yaml" |
    while read -r kind namespace name; do
      kubectl -n "$namespace" delete "$kind" "$name" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    done
  kubectl apply --server-side --force-conflicts -f "$STATE/istio.yaml" >/dev/null 2>&1 ||
    echo "istio-integration: putting back the cluster's Istio failed: scripts/cluster.sh up reinstalls it" >&2
}
trap restore EXIT

# Istio's tests build from a module that requires the pinned istio (their test dependencies
# are resolved on the way: -mod=mod).
src=$CACHE/src/istio-integration-$ISTIO_VERSION
if [[ ! -f $src/go.sum ]]; then
  mkdir -p "$src"
  printf 'module meshagent.local/integration\n\ngo 1.26.0\n\nrequire %s %s\n' "$ISTIO_MODULE" "$ISTIO_VERSION" >"$src/go.mod"
  printf '//go:build tools\npackage tools\nimport _ "%s/pkg/test/framework"\n' "$ISTIO_MODULE" >"$src/tools.go"
  (cd "$src" && go mod tidy) || fail "resolving $ISTIO_MODULE@$ISTIO_VERSION failed"
fi
# The VM images: built (cached) and loaded into the node; the app image also under the tag of
# Istio's agent's VM image, the one tag the framework takes both from.
tag=$IMAGE_TAG
if ((${#vm[@]})); then
  tag=$vm_tag
  "$repo/scripts/cluster/images.sh" --vm "${MESH_AGENT_BIN:-$repo/target/debug}" "$CACHE/images/vm" >"$out/images.log" 2>&1 ||
    fail "building the VM images failed; its log: $out/images.log"
  "$repo/scripts/cluster.sh" load "$CACHE/images/vm/$vm_image.tar" >>"$out/images.log" 2>&1 ||
    fail "loading $vm_image into the node failed; its log: $out/images.log"
  # The framework deploys its default VM (TestTraffic's `vm` workload) as Ubuntu Noble
  # (release-1.31's echo.DefaultVMDistro); only Debian's archive is reachable here, so the
  # Debian 12 image, with the same package and start script, also answers to that name.
  "$repo/scripts/cluster.sh" tag "$IMAGE_HUB/app_sidecar_debian_12:$tag" "$IMAGE_HUB/app_sidecar_ubuntu_noble:$tag" \
    >>"$out/images.log" 2>&1 || fail "naming app_sidecar_debian_12:$tag as app_sidecar_ubuntu_noble failed; its log: $out/images.log"
  [[ $tag == "$IMAGE_TAG" ]] ||
    "$repo/scripts/cluster.sh" tag "$IMAGE_HUB/app:$IMAGE_TAG" "$IMAGE_HUB/app:$tag" >>"$out/images.log" 2>&1 ||
    fail "naming the app image $IMAGE_HUB/app:$tag failed; its log: $out/images.log"
fi
args=(--istio.test.kube.config="$STATE/kubeconfig" --istio.test.kube.deploy=false
  --istio.test.hub="$IMAGE_HUB" --istio.test.tag="$tag" --istio.test.pullpolicy=Never
  --istio.test.kube.loadbalancer=false --istio.test.work_dir="$out/work-$agent")
((${#vm[@]})) || args+=(--istio.test.skipVM=true)
args+=(${extra[@]+"${extra[@]}"})
echo "istio-integration: ${suites[*]} with $agent ($IMAGE_HUB/$image:$IMAGE_TAG${vm[*]+, VMs $IMAGE_HUB/app_sidecar_debian_12:$tag})" >&2
: >"$out/$agent.json"
rc=0
for suite in "${suites[@]}"; do
  pkg=$ISTIO_MODULE/tests/integration/$suite
  test_bin=$out/bin/${suite//\//_}.test
  # Built here (the module proxy is reachable), run in the cluster's network namespace (it is
  # not), from the package's own folder as go test runs it.
  (cd "$src" && GOFLAGS=-mod=mod go test -c -tags=integ -o "$test_bin" "$pkg") >"$out/build.log" 2>&1 ||
    fail "building $pkg failed; its log: $out/build.log"
  install_for "$suite"
  (cd "$istio_dir/tests/integration/$suite" && nsenter --net=/run/netns/mesh-node -- \
    go tool test2json -p "$pkg" "$test_bin" -test.v=test2json -test.count=1 -test.timeout=60m \
    ${run:+-test.run "$run"} ${skip:+-test.skip "$skip"} "${args[@]}") >>"$out/$agent.json" || rc=$?
done
# The summary's status tells a test failure (1) from a framework failure (2).
python3 "$repo/scripts/lib/integration_table.py" --summary "$out/$agent.json" || exit $?
if $record; then
  python3 "$repo/scripts/lib/integration_table.py" --record "$out/$agent.json" --agent "$agent" \
    --store "$repo/tests/data/istio-integration/results" --module "$ISTIO_VERSION" --date "$(date -u +%F)" \
    --commit "$(git -C "$repo" rev-parse --short HEAD)" \
    --command "scripts/istio-integration.sh --agent $agent ${vm[*]+${vm[*]} }${run:+-run '$run' }${skip:+-skip '$skip' }${extra[*]+${extra[*]} }${suites[*]}"
  python3 "$repo/scripts/lib/integration_table.py" --render "$repo/tests/data/istio-integration/results" \
    --notes "$repo/tests/data/istio-integration/notes.tsv" >"$repo/docs/istio-integration.md"
  echo "istio-integration: docs/istio-integration.md rendered from tests/data/istio-integration/results" >&2
fi
exit $((rc == 0 ? 0 : 1))
