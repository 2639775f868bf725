#!/usr/bin/env python3
"""Records Istio's answers for the `iptables` differential suite (issue #26).

Runs `$ISTIO_GO_BIN/pilot-agent istio-iptables <args>` (Istio's Go binary, built from the pinned
module by scripts/cluster/build.sh) for every case of cases.jsonl, each inside a throwaway
network namespace that presents the case's host state, and writes recorded.jsonl next to this
file, and what the binary is in oracle.json. Needs root (ip netns).

    sudo ISTIO_GO_BIN=/path/to/istio/bin python3 tests/data/istio-diff/iptables/record.py

(scripts/istio-diff-record.sh runs it with the pinned build.) Without ISTIO_GO_BIN it says so
and exits 2. What is recorded, and how it is normalised, is in README.md.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import oracle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# Host states (see README.md): addresses on the namespace's loopback, and its /etc/resolv.conf.
with open(os.path.join(HERE, "hosts.json")) as _f:
    _hosts = json.load(_f)
HOSTS = _hosts["hosts"]
RESOLVS = _hosts["resolv"]
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# "<RFC 3339 time>\t<level>\t[<file:line>\t]<message>" (the caller with --log_caller)
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z\t(\w+)\t(?:[\w./-]+:\d+\t)?", re.M)
NFT_HEADER = "nftables rules programmed:\n"


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


class Namespaces:
    def __init__(self):
        self.made = {}

    def get(self, host, resolv, n):
        """A fresh namespace for every case (Istio's --native-nftables ignores --dry-run and
        programs the namespace it runs in)."""
        key = n
        if key not in self.made:
            name = f"idiff-{os.getpid()}-{n}"
            sh("ip", "netns", "add", name)
            self.made[key] = name
            sh("ip", "-n", name, "link", "set", "lo", "up")
            for cidr in HOSTS[host]:
                sh("ip", "-n", name, "addr", "add", cidr, "dev", "lo")
            os.makedirs(f"/etc/netns/{name}", exist_ok=True)
            with open(f"/etc/netns/{name}/resolv.conf", "w") as f:
                f.write(RESOLVS[resolv])
        return self.made[key]

    def close(self):
        for name in self.made.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            self.remove_resolv(name)
        self.made = {}

    def remove_resolv(self, name):
        try:
            os.remove(f"/etc/netns/{name}/resolv.conf")
            os.rmdir(f"/etc/netns/{name}")
        except OSError:
            pass


def log_entries(stdout):
    """Istio's log as (level, message) pairs, timestamps dropped: text lines, or JSON lines
    when the case passes --log_as_json."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                entry = json.loads(line)
                out.append((entry.get("level", ""), entry.get("msg", "")))
            except ValueError:
                pass
    marks = list(LOG_LINE.finditer(stdout))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(stdout)
        out.append((m.group(1), stdout[m.end():end]))
    return out


def nft_dump(entries):
    """The nft script of log.Infof("nftables rules programmed:\n%s \n", tx.String())."""
    for level, msg in entries:
        if msg.startswith(NFT_HEADER):
            body = msg[len(NFT_HEADER):].rstrip("\n")
            assert body.endswith("\n "), repr(body[-20:])
            return body[:-1]
        if msg.startswith("There are no nftables rules"):
            return ""
    return None


def errors(entries, stderr):
    msgs = [msg.strip() for level, msg in entries if level in ("error", "fatal")]
    for line in stderr.splitlines():
        if line.startswith("Error: "):
            msgs.append(line[len("Error: "):])
    return list(dict.fromkeys(msgs))


def c_skips(c):
    """Whether a case asks for no rules at all (then an absent stream is the answer)."""
    text = " ".join(c["args"]) + " " + json.dumps(c["env"])
    return "skip-rule-apply" in text or "SKIP_RULE_APPLY" in text


def main():
    agent = oracle.agent(need_root=True)
    info = oracle.describe(agent)
    with open(os.path.join(HERE, "cases.jsonl")) as f:
        cases = [json.loads(line) for line in f]
    only = set(sys.argv[1:])
    nss = Namespaces()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for c in cases:
                if only and c["id"] not in only:
                    continue
                ns = nss.get(c["host"], c["resolv"], c["id"])
                dry = os.path.join(tmp, "dry-run")
                if os.path.exists(dry):
                    os.remove(dry)
                env = {"PATH": PATH, "DRY_RUN_FILE_PATH": dry}
                env.update(c["env"])
                p = subprocess.run(["ip", "netns", "exec", ns, agent, "istio-iptables", *c["args"]],
                                   env=env, capture_output=True, text=True, timeout=60)
                entries = log_entries(p.stdout)
                stream = None
                if os.path.exists(dry):
                    with open(dry) as f:
                        stream = f.read()
                nft = nft_dump(entries)
                if nft is not None:
                    assert stream is None, c["id"]
                    stream = nft
                result = {"id": c["id"], "exit": p.returncode, "stream": stream}
                if p.returncode == 0 and stream is None and not c_skips(c):
                    # --native-nftables logs its script at info level: a case that raises the
                    # log level hides it. Only the exit status is recorded then.
                    result["hidden"] = True
                result["errors"] = errors(entries, p.stderr)
                results.append(result)
                nss.close()
                print(f"{c['id']} exit={p.returncode}", file=sys.stderr)
    finally:
        nss.close()
    if only:
        for r in results:
            print(json.dumps(r, indent=1))
        return
    with open(os.path.join(HERE, "recorded.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    oracle.write(HERE, info, "pilot-agent istio-iptables <args>")


if __name__ == "__main__":
    main()
