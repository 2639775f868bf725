#!/usr/bin/env python3
"""Results of Istio's integration tests (`go test -json` output of scripts/istio-integration.sh).

  integration_table.py --summary RESULTS.json
      one line per test and sub-test (result and, for a skip, the reason), then the counts
  integration_table.py --record RESULTS.json --agent ours|istio --store DIR --module VERSION \
      --date DATE --commit SHA --command CMD
      keeps the run's results as data: per suite and agent, DIR/<suite>/<agent>.tsv (a header
      line `# date=… commit=… module=…`, one `# command=…`, then `test<TAB>result<TAB>reason`),
      replacing what an earlier run recorded for that suite and agent
  integration_table.py --render DIR [--notes NOTES.tsv] > docs/istio-integration.md
      every recorded suite, the two agents side by side, each column with the date, commit and
      command of the run that recorded it; NOTES.tsv (a Python regular expression matched
      against the test's full name, a tab, the explanation) explains the rows that did not pass
      with both
"""

import argparse
import json
import os
import re
import sys
from collections import OrderedDict

# The framework names its namespaces PREFIX-COUNTER-RANDOM: the same test in two runs differs
# only there.
NAMESPACE_SUFFIX = re.compile(r"-\d+-\d{3,6}\b")
# Some sub-tests are named after an address the run allocated (a Service's cluster IP).
ADDRESS = re.compile(r"(?<![\d.])\d{1,3}(\.\d{1,3}){3}(?![\d.])")


def normal(name: str) -> str:
    """A test's name without what differs from run to run."""
    return ADDRESS.sub("<address>", NAMESPACE_SUFFIX.sub("", name))
SUITE_PREFIX = "istio.io/istio/tests/integration/"


def read(path: str, packages: "dict[str, str] | None" = None,
         suite_output: "list[str] | None" = None) -> "OrderedDict[str, dict]":
    """test name → {"result": pass|fail|skip, "reason": str} from a go test -json stream;
    each package's own result goes into `packages`, its output outside any test into
    `suite_output`, when given."""
    tests: "OrderedDict[str, dict]" = OrderedDict()
    packages = {} if packages is None else packages
    suite_output = [] if suite_output is None else suite_output
    output: dict[str, list[str]] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            name = event.get("Test")
            if not name:
                if event.get("Action") in ("pass", "fail", "skip") and event.get("Package"):
                    packages[event["Package"]] = event["Action"]
                elif event.get("Action") == "output":
                    suite_output.append(event.get("Output", ""))
                continue
            action = event.get("Action")
            if action == "output":
                output.setdefault(name, []).append(event.get("Output", ""))
            elif action in ("pass", "fail", "skip"):
                suite = event.get("Package", "").removeprefix(SUITE_PREFIX)
                tests[f"{suite} {name}"] = {"suite": suite, "result": action,
                                            "reason": skip_reason(output.get(name, []))
                                            if action == "skip" else ""}
    return tests


# What t.Skip printed: an indented `file.go:LINE: reason` line before `--- SKIP`.
SKIP_MESSAGE = re.compile(r"^\s+[\w.]+\.go:\d+: (.+)$")


def skip_reason(lines: list[str]) -> str:
    """The message a skipped test gave (its last `file.go:LINE:` line), or its last line."""
    for line in reversed(lines):
        match = SKIP_MESSAGE.match(line.rstrip("\n"))
        if match:
            return match.group(1).strip()[:200]
    text = [l.strip() for l in lines if l.strip() and not l.strip().startswith(("=== ", "--- "))]
    return text[-1][:200] if text else ""


def summary(path: str) -> int:
    """Prints the results; 0: every test passed or skipped, 1: a test failed, 2: a framework
    failure (a suite that never finished, or one that failed before any test ran)."""
    packages: dict[str, str] = {}
    suite_output: list[str] = []
    tests = read(path, packages, suite_output)
    counts = {"pass": 0, "fail": 0, "skip": 0}
    for name, t in tests.items():
        counts[t["result"]] += 1
        reason = f"  ({t['reason']})" if t["reason"] else ""
        print(f"{t['result']:<5} {name}{reason}")
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    if not packages:
        print("framework failure: the suite did not finish (no result for its package)", file=sys.stderr)
        return 2
    if not tests and "fail" in packages.values():
        print("framework failure: the suite failed before any test ran; the end of its output:",
              file=sys.stderr)
        sys.stderr.write("".join(suite_output[-30:]))
        return 2
    return 1 if counts["fail"] or "fail" in packages.values() else 0


def read_notes(path: str) -> "list[tuple[re.Pattern, str]]":
    notes = []
    if not path:
        return notes
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            pattern, sep, note = line.partition("\t")
            if not sep or not note:
                sys.exit(f"{path}:{number}: expected `regex<TAB>explanation`")
            notes.append((re.compile(pattern), note))
    return notes


def explain(name: str, notes: "list[tuple[re.Pattern, str]]") -> str:
    return next((note for pattern, note in notes if pattern.search(name)), "")


def unique(key, taken) -> object:
    """`key`, or when a run already has a test of that name (two that differ only in what
    `normal` removes) the same with ` #2`, ` #3`… in the order they ran."""
    n, k = 1, key
    while k in taken:
        n += 1
        k = (key[0], f"{key[1]} #{n}") if isinstance(key, tuple) else f"{key} #{n}"
    return k


def keyed(tests: "OrderedDict[str, dict]") -> "OrderedDict[tuple[str, str], dict]":
    out: "OrderedDict[tuple[str, str], dict]" = OrderedDict()
    for name, t in tests.items():
        out[unique((t["suite"], normal(name.split(" ", 1)[1])), out)] = t
    return out


def cell(t: dict) -> str:
    return {"pass": "pass", "fail": "**fail**", "skip": "skip"}.get(t["result"], t["result"])


def record(results: str, agent: str, store: str, meta: dict) -> None:
    """Writes the run's results per suite into STORE/<suite>/<agent>.tsv."""
    by_suite: "OrderedDict[str, list[tuple[str, dict]]]" = OrderedDict()
    for (suite, name), t in keyed(read(results)).items():
        by_suite.setdefault(suite, []).append((name, t))
    for suite, tests in by_suite.items():
        os.makedirs(os.path.join(store, suite), exist_ok=True)
        with open(os.path.join(store, suite, f"{agent}.tsv"), "w", encoding="utf-8") as f:
            f.write(f"# date={meta['date']} commit={meta['commit']} module={meta['module']}\n")
            f.write(f"# command={meta['command']}\n")
            for name, t in tests:
                reason = t["reason"].replace("\t", " ").replace("\n", " ")
                f.write(f"{name}\t{t['result']}\t{reason}\n")
        print(f"integration_table: {len(tests)} results of {suite} with {agent} recorded", file=sys.stderr)


def load(path: str) -> "tuple[dict, OrderedDict[str, dict]]":
    """(the run's header fields, test → {result, reason}) of one recorded file."""
    meta: dict = {}
    tests: "OrderedDict[str, dict]" = OrderedDict()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if line.startswith("# command="):
                meta["command"] = line.removeprefix("# command=")
            elif line.startswith("# "):
                meta.update(kv.split("=", 1) for kv in line[2:].split() if "=" in kv)
            elif line:
                fields = line.split("\t")
                if len(fields) != 3 or fields[1] not in ("pass", "fail", "skip"):
                    sys.exit(f"{path}:{number}: expected `test<TAB>pass|fail|skip<TAB>reason`")
                tests[unique(normal(fields[0]), tests)] = {"result": fields[1], "reason": fields[2]}
    return meta, tests


def suites(store: str) -> list[str]:
    found = []
    for root, _, files in os.walk(store):
        if any(f.endswith(".tsv") for f in files):
            found.append(os.path.relpath(root, store))
    # Istio's order: a suite before its sub-suites.
    return sorted(found)


def render(store: str, notes_path: str) -> None:
    notes = read_notes(notes_path)
    missing = {"result": "not run", "reason": ""}
    runs, rows = [], []
    for suite in suites(store):
        cols = {}
        for agent in ("ours", "istio"):
            path = os.path.join(store, suite, f"{agent}.tsv")
            cols[agent] = load(path) if os.path.exists(path) else ({}, OrderedDict())
            if cols[agent][0]:
                runs.append((suite, agent, cols[agent][0]))
        (_, ours), (_, istio) = cols["ours"], cols["istio"]
        for name in OrderedDict.fromkeys([*istio.keys(), *ours.keys()]):
            o, i = ours.get(name, missing), istio.get(name, missing)
            note = ""
            if (o["result"], i["result"]) != ("pass", "pass"):
                note = explain(f"{suite} {name}", notes) or o["reason"] or i["reason"]
            if "not run" in (o["result"], i["result"]):
                agent = "ours" if o is missing else "Istio's agent"
                note = f"{agent}: not run. {note}".strip()
            if o["result"] == "fail" and i["result"] == "pass":
                note = "REGRESSION: " + note
            rows.append((suite, name, o, i, note))
    header(runs)
    counts(rows, suites(store))
    failing = [r for r in rows if "fail" in (r[2]["result"], r[3]["result"])]
    print("\n## Failing with either agent\n")
    if not failing:
        print("None.")
    else:
        print("| suite | test | ours | Istio's agent | why |")
        print("|---|---|---|---|---|")
        for suite, name, o, i, note in failing:
            print(f"| `{suite}` | `{name}` | {cell(o)} | {cell(i)} | {note.replace('|', '/')} |")
    print("\n## Every test\n")
    print("| suite | test | ours | Istio's agent | note |")
    print("|---|---|---|---|---|")
    for suite, name, o, i, note in rows:
        print(f"| `{suite}` | `{name}` | {cell(o)} | {cell(i)} | {note.replace('|', '/')} |")


def header(runs: list) -> None:
    print("# Istio's integration tests: our agent beside Istio's\n")
    print("<!-- Generated by scripts/lib/integration_table.py --render from tests/data/istio-integration/")
    print("results/ (scripts/istio-integration.sh --agent both, or --record, writes them); do not edit. -->\n")
    print("Istio's own suites from `tests/integration/` of the pinned istio module (release-1.31), on the")
    print("local cluster of `scripts/cluster.sh`, with the `proxyv2` image (ours) and the `proxyv2-istio`")
    print("image (Istio's Go agent, the same upstream Envoy) as the proxy of every injected pod and of")
    print("the gateways; the two columns of a suite come from one run of the same tests with the same")
    print("istiod. How it runs and what each note means: `docs/cluster.md`, \"Istio's integration")
    print("tests\". The runs each column comes from:\n")
    print("| suite | agent | date | commit | module | command |")
    print("|---|---|---|---|---|---|")
    for suite, agent, meta in runs:
        word = "ours" if agent == "ours" else "Istio's agent"
        print(f"| `{suite}` | {word} | {meta.get('date', '')} | {meta.get('commit', '')} | "
              f"`{meta.get('module', '')}` | `{meta.get('command', '')}` |")


def counts(rows: list, all_suites: list) -> None:
    print("\n| suite | tests and sub-tests | passed with ours | passed with Istio's agent | "
          "failed with both | regressions | skipped or not applicable |")
    print("|---|---|---|---|---|---|---|")
    for suite in all_suites:
        mine = [r for r in rows if r[0] == suite]
        count = lambda f: sum(1 for r in mine if f(r))
        passed = lambda col: (count(lambda r: r[col]["result"] == "pass")
                              if any(r[col]["result"] != "not run" for r in mine) else "not run")
        print(f"| `{suite}` | {len(mine)} | {passed(2)} | {passed(3)} | "
              f"{count(lambda r: r[2]['result'] == 'fail' and r[3]['result'] == 'fail')} | "
              f"{count(lambda r: r[2]['result'] == 'fail' and r[3]['result'] == 'pass')} | "
              f"{count(lambda r: r[2]['result'] == 'skip' or r[3]['result'] == 'skip')} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--summary")
    ap.add_argument("--record", help="a go test -json file to keep as data")
    ap.add_argument("--agent", choices=["ours", "istio"])
    ap.add_argument("--store", default="tests/data/istio-integration/results")
    ap.add_argument("--render", help="the folder of recorded results")
    ap.add_argument("--module", default="")
    ap.add_argument("--date", default="")
    ap.add_argument("--commit", default="")
    ap.add_argument("--command", default="")
    ap.add_argument("--notes", default="")
    args = ap.parse_args()
    if args.summary:
        sys.exit(summary(args.summary))
    elif args.record:
        if not args.agent:
            ap.error("--record needs --agent")
        record(args.record, args.agent, args.store, {"module": args.module, "date": args.date,
                                                     "commit": args.commit, "command": args.command})
    elif args.render:
        render(args.render, args.notes)
    else:
        ap.print_help()
        sys.exit(2)


if __name__ == "__main__":
    main()
