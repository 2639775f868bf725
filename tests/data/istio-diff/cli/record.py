#!/usr/bin/env python3
"""Records Istio's answers for the `cli` differential suite (issue #26).

Walks the help tree of Istio's Go `pilot-agent` (`$ISTIO_GO_BIN/pilot-agent`, built from the pinned
module by scripts/cluster/build.sh), writes each command's help text to help/<command path>.txt, derives command lines
from it (every command, every flag with valid and invalid values of its type, missing values,
unknown flags and commands, wrong positional arguments) and writes cases.jsonl: one case a line,
{"id", "args", "exit"}, with the exit status Istio's binary gave; and what the binary is in
oracle.json.

    ISTIO_GO_BIN=/path/to/dir/with/pilot-agent python3 tests/data/istio-diff/cli/record.py

(scripts/istio-diff-record.sh runs it with the pinned build.) Without ISTIO_GO_BIN it says so
and exits 2. Nothing is started: every command line that would run a command (proxy, wait,
request) ends with --help, which cobra honours only after the flags parse, so the exit status
says whether the flags were accepted. See README.md.
"""

import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import oracle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FLAG_LINE = re.compile(r"^\s+(?:-(\w), )?--([\w-]+)(?: (\w+))?\s{2,}")

# Values per pflag type: (valid, invalid). Strings take anything.
VALUES = {
    None: (["true", "false", "1", "0", "t", "F", "TRUE", "False"], ["yes", "2", "", "on"]),  # bool
    "string": (["x", "", "a,b", "default:debug", "-"], []),
    "stringArray": (["x", "stdout", ""], []),
    "int": (["0", "8", "-1", "2147483647"], ["abc", "1.5", "", "0x10x", "99999999999999999999"]),
    "Level": (["0", "9", "-1"], ["abc", "", "1.5"]),
    "uint16": (["0", "15002", "65535"], ["65536", "-1", "abc", ""]),
    "duration": (["1s", "100ms", "0", "-1s"], ["1", "abc", ""]),
}


def run(agent, args):
    p = subprocess.run([agent, *args], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout


def parse_help(text):
    """Subcommands and flags (name, short, type) of one help page."""
    commands, flags, section = [], [], None
    for line in text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            section = line[:-1]
            continue
        if section == "Available Commands" and line.startswith("  "):
            commands.append(line.split()[0])
        elif section in ("Flags", "Global Flags"):
            m = FLAG_LINE.match(line)
            if m and m.group(2) != "help":
                flags.append({"name": m.group(2), "short": m.group(1), "type": m.group(3),
                              "global": section == "Global Flags"})
    return commands, flags


def main():
    agent = oracle.agent()
    info = oracle.describe(agent)

    # The help tree.
    tree = {}
    todo = [[]]
    os.makedirs(os.path.join(HERE, "help"), exist_ok=True)
    while todo:
        path = todo.pop(0)
        code, text = run(agent, [*path, "--help"])
        assert code == 0, path
        name = "-".join(["pilot-agent", *path])
        with open(os.path.join(HERE, "help", f"{name}.txt"), "w") as f:
            f.write(text)
        commands, flags = parse_help(text)
        tree[tuple(path)] = flags
        todo += [[*path, c] for c in commands if c != "help"]

    cases = []

    def add(args):
        cases.append(list(args))

    for path, flags in tree.items():
        path = list(path)
        add([*path, "--help"])
        add([*path, "-h"])
        add([*path, "--no-such-flag", "--help"])
        add([*path, "--no-such-flag=1", "--help"])
        add([*path, "-Z", "--help"])
        add([*path, "--help", "extra-positional"])
        for fl in flags:
            valid, invalid = VALUES.get(fl["type"], VALUES["string"])
            n, short, boolean = fl["name"], fl["short"], fl["type"] is None
            for v in valid + invalid:
                add([*path, f"--{n}={v}", "--help"])
            if boolean:
                add([*path, f"--{n}", "--help"])
            else:
                for v in (valid + invalid)[:2]:
                    add([*path, f"--{n}", v, "--help"])
                add([*path, "--help", f"--{n}"])  # missing value
            if short:
                for v in (valid + invalid)[:3]:
                    add([*path, f"-{short}={v}", "--help"])
                    if not boolean and v:
                        add([*path, f"-{short}{v}", "--help"])
                        add([*path, f"-{short}", v, "--help"])
            if fl["global"]:
                for v in (valid + invalid)[:3]:
                    add([f"--{n}={v}", *path, "--help"])
    # Command lines that run something harmless, or fail before running anything.
    for args in [
        [], ["help"], ["help", "proxy"], ["help", "no-such-command"], ["no-such-command"],
        ["version"], ["version", "-s"], ["version", "--short"], ["version", "-o", "json"],
        ["version", "-o", "yaml"], ["version", "-o", "bogus"], ["version", "--output=json"],
        ["version", "extra"], ["version", "--no-such-flag"], ["--no-such-flag", "version"],
        ["--log_output_level=default:debug", "version", "-s"],
        ["completion"], ["completion", "bash"], ["completion", "zsh"], ["completion", "fish"],
        ["completion", "powershell"], ["completion", "bogus"],
        ["completion", "bash", "--no-descriptions"], ["completion", "zsh", "--no-such-flag"],
        ["request"], ["request", "GET"], ["request", "--debug-port=abc", "GET", "/x"],
        ["proxy", "--concurrency=abc"], ["proxy", "--stsPort=x"], ["proxy", "--profiling=maybe"],
        ["wait", "--timeoutSeconds=abc"], ["wait", "--no-such-flag"], ["wait", "--periodMillis"],
        ["istio-iptables", "--no-such-flag"], ["istio-iptables", "--dry-run=maybe"],
    ]:
        add(args)

    seen = set()
    with open(os.path.join(HERE, "cases.jsonl"), "w") as f:
        n = 0
        for args in cases:
            if tuple(args) in seen:
                continue
            seen.add(tuple(args))
            n += 1
            code, _ = run(agent, args)
            f.write(json.dumps({"id": f"c{n:04d}", "args": args, "exit": code},
                               separators=(",", ":")) + "\n")
    oracle.write(HERE, info, "pilot-agent <args>")
    print(f"recorded {n} cases from {len(tree)} commands", file=sys.stderr)


if __name__ == "__main__":
    main()
