#!/usr/bin/env bash
# The benchmark report: figures as data in docs/benchmarks/<area>.jsonl (the format: the header
# of scripts/lib/bench_report.py), rendered into docs/benchmarks.md, its charts and the README's
# headline table.
#   scripts/bench-report.sh run [--continue] [area|bench…]
#                                         run the benches of those areas or those benches
#                                         by name (default all), record their rows under a new
#                                         run id, then render; --continue: the run joins the
#                                         newest report (one measured in parts: the cluster's
#                                         area while it is up, the rest after), so the rows of
#                                         all its runs render current
#   scripts/bench-report.sh render        render only
#   scripts/bench-report.sh --check       fail if docs/benchmarks.md, the charts or the README's
#                                         headline table differ from what render writes
# Areas: cluster side-by-side dns identity iptables ads agent cds-relay hostile reliability.
# A bench without an adapter is listed as such by run; its rows stay as they are and render stale.
set -euo pipefail
exec python3 "$(dirname "$0")/lib/bench_report.py" "${@:-render}"
