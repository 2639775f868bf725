#!/usr/bin/env python3
"""Records Istio's bootstraps for the `bootstrap` differential suite (issue #26).

For every case of cases.jsonl, runs `$ISTIO_GO_BIN/pilot-agent proxy <type>` (Istio's Go agent,
built from the pinned module by scripts/cluster/build.sh) in a throwaway network namespace, with ProxyConfig `binaryPath`
pointing at a stand-in Envoy that copies its `-c` file and exits, and records that bootstrap in
recorded.jsonl (top-level sections deduplicated into sections.jsonl), and what the binary is in
oracle.json. Needs root (ip netns).

    sudo ISTIO_GO_BIN=/path/to/dir/with/pilot-agent python3 tests/data/istio-diff/bootstrap/record.py

(scripts/istio-diff-record.sh runs it with the pinned build.) The template is
tools/packaging/common/envoy_bootstrap.json of the module the binary was built from, in Go's
module cache, unless ISTIO_BOOTSTRAP_TEMPLATE names another copy. Without ISTIO_GO_BIN it says
so and exits 2.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import oracle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# Every case runs in this directory (its working directory and configPath's parent); the
# recorded bootstrap says /CASE where it said this path.
CASE_DIR = "/tmp/istio-diff-bootstrap-case"
STANDIN = "/tmp/istio-diff-bootstrap-envoy"
CAPTURE = "/tmp/istio-diff-bootstrap-captured.json"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def downward_api(d):
    """The kubelet's downward-API file: key="value" lines, Go %q quoting (JSON for ASCII)."""
    return "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(d.items()))


def prepare(case, root_cert, template):
    """The case directory, the environment, the command line (shared with the Rust test via
    README.md: keep both in step)."""
    shutil.rmtree(CASE_DIR, ignore_errors=True)
    for d in ["etc/istio/proxy", "etc/istio/pod", "etc/istio/config", "var/run/secrets/istio"]:
        os.makedirs(os.path.join(CASE_DIR, d))
    # The mesh config (--meshConfig's default ./etc/istio/config/mesh) points Envoy at the
    # stand-in and the bootstrap into the case directory, below every case's own ProxyConfig.
    with open(os.path.join(CASE_DIR, "etc/istio/config/mesh"), "w") as f:
        f.write(f"defaultConfig:\n  binaryPath: {STANDIN}\n  configPath: {CASE_DIR}/etc/istio/proxy\n")
    with open(os.path.join(CASE_DIR, "var/run/secrets/istio/root-cert.pem"), "w") as f:
        f.write(root_cert)
    with open(os.path.join(CASE_DIR, "etc/istio/pod/annotations"), "w") as f:
        f.write(downward_api(case["annotations"]))
    with open(os.path.join(CASE_DIR, "etc/istio/pod/labels"), "w") as f:
        f.write(downward_api(case["labels"]))
    env = {"PATH": PATH, "CLOUD_PLATFORM": "none", "ISTIO_BOOTSTRAP": template}
    env.update(case["env"])
    if case.get("proxy_config") is not None:
        env["PROXY_CONFIG"] = json.dumps(case["proxy_config"], sort_keys=True)
    elif case.get("proxy_config_text") is not None:
        env["PROXY_CONFIG"] = case["proxy_config_text"]
    return env


def normalise(text):
    return json.loads(text.replace(CASE_DIR, "/CASE"))


def main():
    agent = oracle.agent(need_root=True)
    info = oracle.describe(agent)
    template = os.environ.get("ISTIO_BOOTSTRAP_TEMPLATE") or oracle.module_file(
        info, "tools/packaging/common/envoy_bootstrap.json")
    if not os.path.isfile(template):
        print(f"{template} is missing", file=sys.stderr)
        sys.exit(2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with open(STANDIN, "w") as f:
        f.write('#!/bin/sh\n# stand-in Envoy: copies its -c file, exits\n'
                'while [ $# -gt 0 ]; do [ "$1" = -c ] && cp "$2" ' + CAPTURE + '; shift; done\nexit 0\n')
    os.chmod(STANDIN, 0o755)
    root_cert = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", "/dev/null", "-subj", "/CN=istio-diff root", "-days", "3650"],
        check=True, capture_output=True, text=True).stdout
    with open(os.path.join(HERE, "cases.jsonl")) as f:
        cases = [json.loads(line) for line in f]
    only = set(sys.argv[1:])
    sections, results = {}, []
    for c in cases:
        if only and c["id"] not in only:
            continue
        env = prepare(c, root_cert, template)
        if os.path.exists(CAPTURE):
            os.remove(CAPTURE)
        ns = f"idiff-bs-{os.getpid()}"
        subprocess.run(["ip", "netns", "add", ns], check=True)
        try:
            subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
            if c["host"] == "eth":
                subprocess.run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0"], check=True)
                subprocess.run(["ip", "-n", ns, "addr", "add", "10.10.0.5/24", "dev", "eth0"], check=True)
                subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
            p = subprocess.run(["ip", "netns", "exec", ns, agent, "proxy", c["type"]], env=env,
                               cwd=CASE_DIR, capture_output=True, text=True, timeout=60)
        finally:
            subprocess.run(["ip", "netns", "del", ns])
        result = {"id": c["id"], "exit": p.returncode}
        if os.path.exists(CAPTURE):
            with open(CAPTURE) as f:
                boot = normalise(f.read())
            keys = {}
            for k, v in boot.items():
                text = json.dumps(v, sort_keys=True, separators=(",", ":"))
                h = hashlib.sha256(text.encode()).hexdigest()[:16]
                sections[h] = v
                keys[k] = h
            result["bootstrap"] = keys
        else:
            errs = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith("Error: ")]
            result["error"] = errs[-1][len("Error: "):] if errs else ""
        results.append(result)
        print(f"{c['id']} exit={p.returncode} bootstrap={'bootstrap' in result}", file=sys.stderr)
    if only:
        for r in results:
            print(json.dumps(r))
        return
    with open(os.path.join(HERE, "recorded.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    with open(os.path.join(HERE, "sections.jsonl"), "w") as f:
        for h in sorted(sections):
            f.write(json.dumps({"hash": h, "value": sections[h]}, sort_keys=True, separators=(",", ":")) + "\n")
    oracle.write(HERE, info, "pilot-agent proxy <type>")
    shutil.rmtree(CASE_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
