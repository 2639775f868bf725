#!/usr/bin/env bash
# The cluster's certificates and kubeconfigs, made with openssl: one CA, the API server's serving
# certificate, a client certificate per component (as kubeadm names their users), kubelet's
# serving certificate and the service account signing key.
#   usage: pki.sh <dir> <node name> <node ip> <kubernetes service ip>
set -euo pipefail
dir=$1 node=$2 node_ip=$3 svc_ip=$4
mkdir -p "$dir" && cd "$dir"
quiet() { "$@" 2>/dev/null >/dev/null || { echo "pki: $* failed" >&2; "$@"; }; }

quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
  -keyout ca.key -out ca.crt -subj "/CN=mesh-cluster-ca"
quiet openssl genrsa -out sa.key 2048
quiet openssl rsa -in sa.key -pubout -out sa.pub

# cert NAME SUBJECT EXTENDED-USAGE [SANS]
cert() {
  local name=$1 subject=$2 usage=$3 sans=${4:-}
  quiet openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$name.key" -out "$name.csr" -subj "$subject"
  {
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n $sans ]] && echo "subjectAltName=$sans"
  } >"$name.ext"
  quiet openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
    -extfile "$name.ext" -out "$name.crt"
  rm -f "$name.csr" "$name.ext"
}

cert apiserver "/CN=kube-apiserver" serverAuth \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:$node_ip,IP:$svc_ip,IP:127.0.0.1"
cert apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client" clientAuth
cert admin "/O=system:masters/CN=kubernetes-admin" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
cert kube-proxy "/CN=system:kube-proxy" clientAuth
cert kubelet "/O=system:nodes/CN=system:node:$node" clientAuth
cert kubelet-serving "/O=system:nodes/CN=system:node:$node" serverAuth "DNS:$node,IP:$node_ip"

# kubeconfig USER FILE: a kubeconfig for the client certificate USER.crt/USER.key.
kubeconfig() {
  local user=$1
  cat >"$user.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: mesh
  cluster:
    server: https://$node_ip:6443
    certificate-authority-data: $(base64 -w0 ca.crt)
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$user.crt")
    client-key-data: $(base64 -w0 "$user.key")
contexts:
- name: mesh
  context: {cluster: mesh, user: $user}
current-context: mesh
EOF
}
for user in admin controller-manager scheduler kube-proxy kubelet; do kubeconfig "$user"; done
