#!/usr/bin/env python3
"""Records Istio's answers for the `status` differential suite (issue #26).

Runs drive.py (the one driver both sides share) with `$ISTIO_GO_BIN/pilot-agent`, Istio's Go
agent built from the pinned module by scripts/cluster/build.sh, and writes recorded.jsonl (and
what the binary is in oracle.json). Istio's bootstrap template is the one of the module the
binary was built from, in Go's module cache. Needs root (ip netns) and
python3 with grpcio (PY_GRPC_DIR, default <repo>/.tools/py-grpc).

    sudo ISTIO_GO_BIN=/path/to/dir/with/pilot-agent python3 tests/data/istio-diff/status/record.py

(scripts/istio-diff-record.sh runs it with the pinned build.) A run whose /quitquitquit got no
answer (Istio's agent exits racing it) is run again, three times at most. Without ISTIO_GO_BIN
it says so and exits 2; `record.py <run-id>...` prints those runs' answers instead of writing
the file.
"""

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import oracle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    agent = oracle.agent(need_root=True)
    info = oracle.describe(agent)
    template = oracle.module_file(info, "tools/packaging/common/envoy_bootstrap.json")
    only = sys.argv[1:]
    answers = drive(agent, template, only)
    # Istio's agent exits racing its own answer to /quitquitquit: now and then the connection
    # closes with no answer at all. Such a run is run again (three times at most), so the
    # recording holds the answer Istio's agent means to give.
    for _ in range(3):
        raced = sorted({a["id"].split("-")[0] for a in answers
                        if "agent_exit" in a and a["status"] == 0})
        if not raced:
            break
        print(f"re-running {raced}: Istio's /quitquitquit answer was lost", file=sys.stderr)
        again = {a["id"]: a for a in drive(agent, template, raced)}
        answers = [again.get(a["id"], a) for a in answers]
    text = "".join(json.dumps(a, sort_keys=True, separators=(",", ":")) + "\n" for a in answers)
    if only:
        sys.stdout.write(text)
        return
    with open(os.path.join(HERE, "recorded.jsonl"), "w") as f:
        f.write(text)
    oracle.write(HERE, info, "pilot-agent proxy sidecar")


def drive(agent, template, ids):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "answers.jsonl")
        subprocess.run([sys.executable, os.path.join(HERE, "drive.py"), "--agent", agent,
                        "--out", out, "--template", template] + list(ids), check=True)
        with open(out) as f:
            return [json.loads(line) for line in f]


if __name__ == "__main__":
    main()
