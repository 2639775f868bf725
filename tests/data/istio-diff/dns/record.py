#!/usr/bin/env python3
"""Records Istio's answers for the `dns` differential suite (issue #26).

The world (istiod-lite with config.yaml, dnsmasq with upstream.conf, a pod injected with Istio's
Go pilot-agent and Envoy) is the one the test builds for ours, so the recorder is the same Rust
code: the ignored test `istio_diff::record` of the `dns` test binary, which writes
recorded.jsonl. Needs root, Envoy, dnsmasq, dig, and Istio's template under ../shared/conformance.

    sudo ISTIO_GO_BIN=/path/to/dir/with/pilot-agent python3 tests/data/istio-diff/dns/record.py

Without ISTIO_GO_BIN it says so and exits 2.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "../../../.."))

if not os.environ.get("ISTIO_GO_BIN"):
    print("ISTIO_GO_BIN is unset: name the directory holding Istio's Go pilot-agent", file=sys.stderr)
    sys.exit(2)
sys.exit(subprocess.call(
    ["cargo", "nextest", "run", "-p", "tests", "--test", "dns", "istio_diff::record",
     "--run-ignored", "only", "--no-capture"],
    cwd=REPO,
))
