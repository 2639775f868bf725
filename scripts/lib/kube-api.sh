# A real Kubernetes API server with no nodes, for running Istio's istiod outside a cluster
# (docs/istiod.md): etcd and kube-apiserver from the pinned builds on loopback, an admin token,
# and a service-account issuer whose tokens istiod judges through TokenReview (`istio-ca` among
# the API audiences). Sourced by bench scripts:
#   kube_api_start DIR PORT     etcd on PORT+1/PORT+2, kube-apiserver on 127.0.0.1:PORT, state in
#                               DIR; appends both process groups to the caller's `groups` array
#                               (the caller kills them) and returns once /readyz answers;
#                               DIR/kubeconfig is the admin's
#   kube_api_token DIR NS SA    prints a TokenRequest token for NS/SA, audience istio-ca
# Binaries: KUBERNETES_BIN and ETCD_BIN, default `scripts/cluster/build.sh --dir kubernetes|etcd`.

kube_api_bins() {
  local build
  build="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/cluster/build.sh"
  KUBERNETES_BIN=${KUBERNETES_BIN:-$("$build" --dir kubernetes)}
  ETCD_BIN=${ETCD_BIN:-$("$build" --dir etcd)}
  [[ -x $KUBERNETES_BIN/kube-apiserver && -x $ETCD_BIN/etcd ]] || {
    echo "kube-api: kube-apiserver or etcd missing in $KUBERNETES_BIN, $ETCD_BIN (scripts/cluster/build.sh kubernetes etcd)" >&2
    return 1
  }
}

kube_api_start() {
  local dir=$1 port=$2 token=mesh-agent-bench-admin issuer=https://kubernetes.default.svc.cluster.local
  kube_api_bins || return 1
  mkdir -p "$dir"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$dir/sa.key" 2>/dev/null
  echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"
  setsid "$ETCD_BIN/etcd" --name=bench --data-dir="$dir/etcd" --unsafe-no-fsync --log-level=warn \
    --listen-client-urls="http://127.0.0.1:$((port + 1))" --advertise-client-urls="http://127.0.0.1:$((port + 1))" \
    --listen-peer-urls="http://127.0.0.1:$((port + 2))" --initial-advertise-peer-urls="http://127.0.0.1:$((port + 2))" \
    --initial-cluster="bench=http://127.0.0.1:$((port + 2))" >"$dir/etcd.log" 2>&1 &
  groups+=("$!")
  setsid "$KUBERNETES_BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$((port + 1))" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$port" --cert-dir="$dir/certs" --token-auth-file="$dir/tokens.csv" \
    --service-account-key-file="$dir/sa.key" --service-account-signing-key-file="$dir/sa.key" \
    --service-account-issuer="$issuer" --api-audiences="$issuer,istio-ca" --authorization-mode=RBAC \
    --service-cluster-ip-range=198.19.0.0/16 --endpoint-reconciler-type=none \
    --enable-priority-and-fairness=false >"$dir/apiserver.log" 2>&1 &
  groups+=("$!")
  printf 'apiVersion: v1\nkind: Config\nclusters: [{name: local, cluster: {server: "https://127.0.0.1:%s", insecure-skip-tls-verify: true}}]\nusers: [{name: admin, user: {token: %s}}]\ncontexts: [{name: local, context: {cluster: local, user: admin}}]\ncurrent-context: local\n' \
    "$port" "$token" >"$dir/kubeconfig"
  local i
  for i in $(seq 180); do
    "$KUBERNETES_BIN/kubectl" --kubeconfig="$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1 && break
    ((i < 180)) || { echo "kube-api: not ready in 90 s; its log:" >&2; tail -20 "$dir/apiserver.log" >&2; return 1; }
    sleep 0.5
  done
  "$KUBERNETES_BIN/kubectl" --kubeconfig="$dir/kubeconfig" create namespace istio-system >/dev/null
}

kube_api_token() {
  local dir=$1 ns=$2 sa=$3 k=("$KUBERNETES_BIN/kubectl" --kubeconfig="$1/kubeconfig")
  printf 'apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: %s, namespace: %s}\n' \
    "$ns" "$sa" "$ns" | "${k[@]}" apply -f - >/dev/null
  "${k[@]}" create token "$sa" -n "$ns" --audience istio-ca --duration 24h
}
