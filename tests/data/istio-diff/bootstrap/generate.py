#!/usr/bin/env python3
"""Seeded input generator for the `bootstrap` differential suite (issue #26).

Writes cases.jsonl next to this file: one JSON object per line,
  {"id": "b0001", "type": "sidecar", "env": {...}, "proxy_config": {...} | null,
   "annotations": {...}, "labels": {...}}
`env` excludes what the harness sets for every case (see README.md); `proxy_config` is merged
with the harness's `configPath`/`binaryPath` into PROXY_CONFIG (null: PROXY_CONFIG unset, or the
string form in `proxy_config_text` for malformed input); `annotations` and `labels` become the
pod's downward-API files. The same seed always gives the same file:

    python3 tests/data/istio-diff/bootstrap/generate.py [--seed 26] [--count 520]
"""

import argparse
import json
import os
import random

NAMES = ["foo", "httpbin-7d9c8b5f4-x2x9q", "a", "ratings-v1-0", "gw-abc"]
NAMESPACES = ["bar", "default", "istio-system", "ns-with-dashes"]
INSTANCE_IPS = ["10.1.1.1", "10.244.0.17", "fd00::17", "2001:db8::5", None, None, "not-an-ip"]
ENV_POOL = {
    "SERVICE_ACCOUNT": ["default", "httpbin", "bookinfo-ratings"],
    "ISTIO_META_CLUSTER_ID": ["Kubernetes", "cluster-1", ""],
    "ISTIO_META_MESH_ID": ["cluster.local", "mesh1"],
    "ISTIO_META_NETWORK": ["network1", ""],
    "ISTIO_META_WORKLOAD_NAME": ["httpbin", "ratings-v1"],
    "ISTIO_META_OWNER": ["kubernetes://apis/apps/v1/namespaces/default/deployments/httpbin"],
    "ISTIO_META_INTERCEPTION_MODE": ["REDIRECT", "TPROXY", "NONE"],
    "ISTIO_META_DNS_CAPTURE": ["true", "false"],
    "ISTIO_META_DNS_AUTO_ALLOCATE": ["true"],
    "ISTIO_META_APP_CONTAINERS": ["httpbin", "app,sidecar-helper"],
    "ISTIO_META_POD_PORTS": ['[{"containerPort":8080,"protocol":"TCP"}]', "[]"],
    "ISTIO_META_REQUESTED_NETWORK_VIEW": ["network1,network2"],
    "ISTIO_META_ROUTER_MODE": ["sni-dnat", "standard"],
    "ISTIO_META_ENABLE_HBONE": ["true"],
    "ISTIO_META_ISTIO_VERSION": ["1.28.0", "custom-1"],
    "ISTIO_META_CUSTOM_KEY": ["value", "with spaces", "{\"json\":1}"],
    "ISTIO_METAJSON_EXTRA": ['{"a":"b"}'],
    "ISTIO_METAJSON_LABELS": ['{"app":"httpbin","version":"v1"}', "{}"],
    "ISTIO_META_TLS_CLIENT_ROOT_CERT": ["/etc/certs/root-cert.pem"],
    "ISTIO_DELTA_XDS": ["true", "false"],
    "PILOT_CERT_PROVIDER": ["istiod", "kubernetes"],
    "CA_ADDR": ["istiod.istio-system.svc:15012", "ca.example.com:443"],
    "TRUST_DOMAIN": ["cluster.local", "example.org"],
    "PROXY_XDS_VIA_AGENT": ["true"],
    "HOST_IP": ["10.0.0.5"],
    "COMPLIANCE_POLICY": ["fips-140-2", ""],
    "ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": ["10000"],
    "ENVOY_PROMETHEUS_PORT": ["15090", "16090"],
    "ENVOY_STATUS_PORT": ["15021", "16021"],
    "ISTIO_AGENT_FLAGS": ["--x"],
}
PROXY_CONFIG_POOL = {
    "concurrency": [0, 2, 8],
    "drainDuration": ["45s", "5s", "1m30s"],
    "terminationDrainDuration": ["5s", "30s"],
    "discoveryAddress": ["istiod.istio-system.svc:15012", "istiod-canary.istio-system.svc:15012",
                         "10.96.0.5:15010", "[fd00::5]:15012"],
    "controlPlaneAuthPolicy": ["MUTUAL_TLS", "NONE"],
    "statusPort": [15020, 16020],
    "proxyAdminPort": [15000],
    "serviceCluster": ["istio-proxy", "custom-cluster"],
    "statNameLength": [189, 100],
    "tracing": [{"zipkin": {"address": "zipkin.istio-system:9411"}},
                {"zipkin": {"address": "zipkin:9411"}, "sampling": 50, "maxPathTagLength": 128},
                {"datadog": {"address": "$(HOST_IP):8126"}},
                {"stackdriver": {"debug": True, "maxNumberOfAttributes": 200}},
                {"openCensusAgent": {"address": "dns://oc:55678", "context": ["W3C_TRACE_CONTEXT"]}},
                {"zipkin": {"address": "zipkin:9411"},
                 "customTags": {"foo": {"literal": {"value": "bar"}},
                                "env": {"environment": {"name": "POD_NAME", "defaultValue": "x"}}}}],
    "proxyStatsMatcher": [{"inclusionPrefixes": ["cluster.outbound", "http.{pod_ip}_"]},
                          {"inclusionSuffixes": ["upstream_rq_timeout"],
                           "inclusionRegexps": [".*circuit_breakers.*"]}],
    "proxyMetadata": [{"FOO": "bar"}, {"ISTIO_META_DNS_CAPTURE": "true", "BAZ": "1"}],
    "holdApplicationUntilProxyStarts": [True, False],
    "extraStatTags": [["request_host", "destination_port"]],
    "gatewayTopology": [{"numTrustedProxies": 2}, {"forwardClientCertDetails": "SANITIZE_SET"}],
    "runtimeValues": [{"re2.max_program_size.error_level": "1024"}],
    "envoyMetricsService": [{"address": "ms.example:15000"}],
    "envoyAccessLogService": [{"address": "als.example:15000"}],
    "readinessProbe": [{"httpGet": {"path": "/healthz/ready", "port": 15021}}],
    "fileFlushInterval": ["2s"],
    "fileFlushMinSizeKb": [128],
    "meshId": ["mesh1"],
    "proxyHeaders": [{"server": {"disabled": True}}, {"requestId": {"disabled": True}}],
}
ANNOTATIONS = {
    "sidecar.istio.io/statsInclusionPrefixes": ["cluster.outbound,cluster_manager", "http.{pod_ip}_", ""],
    "sidecar.istio.io/statsInclusionSuffixes": ["upstream_rq_timeout,upstream_rq_retry"],
    "sidecar.istio.io/statsInclusionRegexps": ["http.[0-9]*\\.[0-9]*\\.[0-9]*\\.[0-9]*_8080.downstream_rq_time"],
    "sidecar.istio.io/extraStatTags": ["dest_port,source_port"],
    "sidecar.istio.io/statsHistogramBuckets": ['{"istiocustom":[1,5,10,50,100,500,1000,5000,10000]}',
                                               '{"cluster_manager":[1,5,10]}', "not json"],
    "sidecar.istio.io/statsFlushInterval": ["10s", "bogus"],
    "sidecar.istio.io/statsEvictionInterval": ["60s", "1m"],
    "proxy.istio.io/config": ['{"concurrency": 3}', "holdApplicationUntilProxyStarts: true\n",
                              '{"tracing": {"zipkin": {"address": "zipkin.other:9411"}}}',
                              "proxyStatsMatcher:\n  inclusionPrefixes:\n  - upstream_cx\n"],
    "traffic.sidecar.istio.io/excludeInterfaces": ["eth0", "eth1"],
    "istio.io/rev": ["default", "canary"],
    "kubectl.kubernetes.io/default-container": ["app"],
    "prometheus.io/scrape": ["true"],
}
LABELS = {
    "app": ["httpbin", "ratings"],
    "version": ["v1", "v2"],
    "service.istio.io/canonical-name": ["httpbin"],
    "service.istio.io/canonical-revision": ["v1"],
    "topology.kubernetes.io/region": ["us-east1"],
    "topology.kubernetes.io/zone": ["us-east1-b"],
    "topology.istio.io/subzone": ["rack1"],
    "istio-locality": ["region1.zone1.subzone1"],
    "topology.istio.io/network": ["network2"],
    "sidecar.istio.io/inject": ["true"],
}
HOSTS = ["eth"] * 4 + ["lo"]


def sample(rng, pool, lo, hi):
    keys = rng.sample(sorted(pool), rng.randint(lo, min(hi, len(pool))))
    return {k: rng.choice(pool[k]) for k in sorted(keys)}


def case(rng, n):
    env = {"POD_NAME": rng.choice(NAMES), "POD_NAMESPACE": rng.choice(NAMESPACES)}
    ip = rng.choice(INSTANCE_IPS)
    if ip:
        env["INSTANCE_IP"] = ip
    env.update(sample(rng, ENV_POOL, 0, 6))
    c = {"id": f"b{n:04d}", "type": rng.choice(["sidecar"] * 4 + ["router"]),
         "host": rng.choice(HOSTS), "env": dict(sorted(env.items()))}
    r = rng.random()
    if r < 0.15:
        c["proxy_config"] = None
    elif r < 0.17:
        c["proxy_config"] = None
        c["proxy_config_text"] = rng.choice(['{"concurrency": "many"}', "{not json", '{"noSuchField": 1}'])
    else:
        c["proxy_config"] = sample(rng, PROXY_CONFIG_POOL, 0, 5)
    c["annotations"] = sample(rng, ANNOTATIONS, 0, 3) if rng.random() < 0.5 else {}
    c["labels"] = sample(rng, LABELS, 0, 4) if rng.random() < 0.6 else {}
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--count", type=int, default=520)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.jsonl"))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for n in range(1, a.count + 1):
            f.write(json.dumps(case(rng, n), separators=(",", ":")) + "\n")
    print(f"wrote {a.count} cases to {a.out}")


if __name__ == "__main__":
    main()
