#!/usr/bin/env python3
"""Records Istio's answers for the `status` differential suite (issue #26).

Runs drive.py (the one driver both sides share) with `$ISTIO_GO_BIN/pilot-agent`, Istio's Go
agent built outside this repository, and writes recorded.jsonl. Needs root (ip netns) and
python3 with grpcio (PY_GRPC_DIR, default <repo>/.tools/py-grpc).

    sudo ISTIO_GO_BIN=/path/to/dir/with/pilot-agent python3 tests/data/istio-diff/status/record.py

Without ISTIO_GO_BIN it says so and exits 2; `record.py <run-id>...` prints those runs' answers
instead of writing the file.
"""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    go_bin = os.environ.get("ISTIO_GO_BIN")
    if not go_bin:
        print("ISTIO_GO_BIN is not set: point it at the directory holding Istio's Go pilot-agent "
              "(built from istio/istio at the commit in README.md). Nothing recorded.", file=sys.stderr)
        sys.exit(2)
    agent = os.path.join(go_bin, "pilot-agent")
    if not os.path.isfile(agent):
        print(f"{agent} is missing", file=sys.stderr)
        sys.exit(2)
    only = sys.argv[1:]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "answers.jsonl")
        subprocess.run([sys.executable, os.path.join(HERE, "drive.py"), "--agent", agent,
                        "--out", out] + only, check=True)
        with open(out) as f:
            text = f.read()
    if only:
        sys.stdout.write(text)
        return
    with open(os.path.join(HERE, "recorded.jsonl"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
