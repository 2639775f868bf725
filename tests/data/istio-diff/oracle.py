"""The oracle every suite's record.py runs: Istio's Go `pilot-agent` in `$ISTIO_GO_BIN`, and what
it is. `scripts/istio-diff-record.sh` points ISTIO_GO_BIN at the build of the pinned module
(scripts/cluster/versions.env) and runs every recorder.

Each recorder writes `oracle.json` beside its recording: the module and version the binary was
built from (its Go build information, `go version -m`), the Go release, the version the binary
reports, its SHA-256 and the day of the recording. The tests require the module version to be
the one the project targets (`tests/src/istio_release.rs`) and, when ISTIO_GO_BIN is set, the
binary there to be a build of that module with the recorded Go release.
"""

import datetime
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "../../.."))
GO_CANDIDATES = ["go", "/usr/local/go/bin/go"]


def agent(need_root=False):
    """`$ISTIO_GO_BIN/pilot-agent`, or exit 2 saying what is missing."""
    go_bin = os.environ.get("ISTIO_GO_BIN")
    if not go_bin:
        print("ISTIO_GO_BIN is not set: point it at the directory holding Istio's Go pilot-agent "
              "(scripts/istio-diff-record.sh builds the pinned one and sets it). Nothing recorded.",
              file=sys.stderr)
        sys.exit(2)
    path = os.path.join(go_bin, "pilot-agent")
    if not os.access(path, os.X_OK):
        print(f"{path} is not an executable", file=sys.stderr)
        sys.exit(2)
    if need_root and os.geteuid() != 0:
        print("this recorder needs root (ip netns)", file=sys.stderr)
        sys.exit(2)
    return path


def _go(*args):
    for go in GO_CANDIDATES:
        try:
            p = subprocess.run([go, *args], capture_output=True, text=True)
        except FileNotFoundError:
            continue
        if p.returncode == 0:
            return p.stdout
    print(f"`go {' '.join(args)}` failed: Go 1.26 or later is needed to read the oracle's build "
          "information", file=sys.stderr)
    sys.exit(2)


def describe(path):
    """What the binary is: module, version, Go release (its build information), the version it
    reports, its SHA-256."""
    info = {}
    for line in _go("version", "-m", path).splitlines():
        parts = line.split()
        if line.startswith(path + ":"):
            info["go"] = parts[-1]
        elif parts[:1] == ["mod"]:
            info["module"], info["version"] = parts[1], parts[2]
    if "module" not in info:
        print(f"{path} carries no module version (built from a checkout, not the module): "
              "build it with scripts/cluster/build.sh istio", file=sys.stderr)
        sys.exit(2)
    out = subprocess.run([path, "version", "-s"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    info["reports"] = out.strip()
    with open(path, "rb") as f:
        info["sha256"] = hashlib.sha256(f.read()).hexdigest()
    return info


def module_file(info, rel):
    """A file of the module the binary was built from, in Go's module cache (never copied)."""
    cache = _go("env", "GOMODCACHE").strip()
    path = os.path.join(cache, f"{info['module']}@{info['version']}", rel)
    if not os.path.isfile(path):
        print(f"{path} is missing: `go mod download {info['module']}@{info['version']}`",
              file=sys.stderr)
        sys.exit(2)
    return path


def write(suite_dir, info, command):
    """`oracle.json` of a suite: `info` plus the command line it ran and the day."""
    doc = dict(info, command=command, recorded=datetime.date.today().isoformat())
    with open(os.path.join(suite_dir, "oracle.json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
