#!/usr/bin/env python3
"""Records Istio's answers for the `dns` differential suite (issue #26).

The world (istiod-lite with config.yaml, dnsmasq with upstream.conf, a pod injected with Istio's
Go pilot-agent and Envoy) is the one the test builds for ours, so the recorder is the same Rust
code: the ignored test `istio_diff::record` of the `dns` test binary, which writes
recorded.jsonl. This script writes what the binary is in oracle.json. Needs root, Envoy,
dnsmasq, dig, and Istio's release module in Go's module cache (its bootstrap template).

    sudo ISTIO_GO_BIN=/path/to/dir/with/pilot-agent python3 tests/data/istio-diff/dns/record.py

(scripts/istio-diff-record.sh runs it with the pinned build.) Without ISTIO_GO_BIN it says so
and exits 2.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "../../../.."))
sys.path.insert(0, os.path.dirname(HERE))
import oracle  # noqa: E402

agent = oracle.agent(need_root=True)
info = oracle.describe(agent)
code = subprocess.call(
    ["cargo", "nextest", "run", "-p", "tests", "--test", "dns", "istio_diff::record",
     "--run-ignored", "only", "--no-capture"],
    cwd=REPO,
)
if code == 0:
    oracle.write(HERE, info, "pilot-agent proxy sidecar (DNS proxy on 127.0.0.1:15053)")
sys.exit(code)
