"""`scripts/bench-report.sh run [area…]`: the benches of each area, run as their commands say,
their printed results parsed into rows (docs/benchmarks/<area>.jsonl, format in
bench_report.py). A bench without an adapter is listed, never run; its rows stay as they are and
render stale. Every row a bench produces replaces the row of the same key."""

import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import bench_report as br

REPO = br.REPO
IA = "Istio's agent"
# Extra criterion arguments (e.g. "--warm-up-time 1 --measurement-time 2"), part of the command.
CRITERION = os.environ.get("BENCH_CRITERION_ARGS", "")
PEER = "PEER_AGENT=$ISTIO_GO_BIN/pilot-agent"
# hostile.sh takes istiod-lite from the agent's folder; target/dist has none.
LITE = "ISTIOD_LITE=${ISTIOD_LITE:-$PWD/target/release/istiod-lite}"
# The end-to-end tests run the workspace's binaries from the target folder (harness::workspace_bin).
NEXTEST = "cargo build --workspace --bins && cargo nextest run -p tests"


@dataclass
class Bench:
    name: str
    area: str
    command: str
    parse: Callable[[str, dict], list[dict]] | None  # (stdout, context) -> rows


def fig(v: float, unit: str, digits: int = 2) -> str:
    return f"{v:,.{digits}f} {unit}"


def rng(xs: list[float], fmt: Callable[[float], str]) -> str:
    lo, hi = fmt(min(xs)), fmt(max(xs))
    return lo if lo == hi else f"{lo.split(' ')[0]}–{hi}"


def signed(v: float, unit: str, digits: int = 0) -> str:
    return f"{v:+,.{digits}f} {unit}".replace("-", "−")


def row(key: str, ours: str, anchor: str = "", ratio: float | str | None = None, *, lower=None,
        higher=None, **defaults) -> dict:
    """A measured row; `lower`/`higher`: the goal's bound on the ratio (met when at or beyond)."""
    r = {"key": key, "ours": ours, "anchor": anchor,
         "ratio": f"{ratio:.2f}" if isinstance(ratio, float) else (ratio or "")}
    if isinstance(ratio, float) and lower is not None:
        r["met"] = "met" if ratio <= lower else "not met"
    elif isinstance(ratio, float) and higher is not None:
        r["met"] = "met" if ratio >= higher else "not met"
    else:
        r["met"] = ""
    r["_defaults"] = defaults
    return r


# --- criterion benches: target/criterion/<group>/<bench>/new/estimates.json -----------------

def criterion_ns(group: str, bench: str) -> float:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    est = json.loads((target / "criterion" / group / bench / "new/estimates.json").read_text())
    return (est.get("slope") or est["mean"])["point_estimate"]


def duration(ns: float) -> str:
    return f"{ns / 1e3:.1f} µs" if ns < 1e6 else f"{ns / 1e6:.2f} ms"


def parse_csr(out: str, ctx: dict) -> list[dict]:
    p256 = criterion_ns("keygen_csr", "p256")
    csr = row("csr-p256", duration(p256), what="P-256 keygen + CSR")
    csr["met"] = "met" if p256 <= 2e6 else "not met"
    return [csr,
            row("fetch-cold", duration(criterion_ns("fetch_p256", "cold_manager"))),
            row("fetch-warm", duration(criterion_ns("fetch_p256", "warm_channel")))]


def parse_ca_sign(out: str, ctx: dict) -> list[dict]:
    return [row("ca-sign-p256", f"{1e9 / criterion_ns('ca_sign', 'p256_csr'):,.0f}/s"),
            row("ca-sign-rsa2048", f"{1e9 / criterion_ns('ca_sign', 'rsa2048_csr'):,.0f}/s")]


# --- cargo bench -p control-plane --bench ads_load --------------------------------------------

ADS = re.compile(r"^ads_load mode=(\w+) proxies=(\d+) .*?connect\+initial_sync=(\d+)ms .*? "
                 r"p50=(\d+)ms p99=(\d+)ms .*?per_proxy=([\d.]+)KiB", re.M)


def parse_ads(out: str, ctx: dict) -> list[dict]:
    rows, largest = [], {}
    for mode, n, connect, p50, p99, per in ADS.findall(out):
        n = int(n)
        name = "SotW" if mode == "sotw" else "Delta"
        goal = {"goal": "< 2 s", "met": "met" if int(p99) < 2000 else "not met"} if n == 10000 else {}
        r = row(f"p99-{n}-{mode}", f"{int(p99):,} ms",
                what=f"{n:,} proxies, {name}: change → every proxy ACKed, p99")
        r.update(goal)
        rows.append(r)
        if n >= largest.get(mode, (0,))[0]:
            largest[mode] = (n, per, connect, p50)
    if "sotw" in largest and "delta" in largest:
        (n, ps, cs, p50s), (_, pd, cd, p50d) = largest["sotw"], largest["delta"]
        r = row("rss-per-proxy", f"{ps} / {pd} KiB")
        r["met"] = "met" if max(float(ps), float(pd)) < 32 else "not met"
        rows += [r, row(f"connect-{n}", f"{int(cs) / 1000:.1f} / {int(cd) / 1000:.1f} s",
                        what=f"connect + initial sync of {n:,}, SotW / Delta")]
    return rows


# --- scripts/bench-dns.sh -----------------------------------------------------------------------

def parse_dns(out: str, ctx: dict) -> list[dict]:
    srv = {m[0].strip(): (float(m[1]), m[2]) for m in
           re.findall(r"^(\S.{27}) +(\d+) q/s +avg +\S+ ms +p99 +\S+ ms +cpu +(\S+) s/Mq", out, re.M)}
    ratio = {m[0]: (float(m[1]), m[2]) for m in
             re.findall(r"^(\w+ \w+ +proxy/\w+) += (\S+)(?:.*paired rounds (\S+)\))?", out, re.M)}
    r = lambda k: next(v for kk, v in ratio.items() if re.sub(" +", " ", kk) == k)
    kq = lambda q: f"{q / 1000:.0f}k q/s" if q >= 100_000 else f"{q / 1000:.1f}k q/s"
    us = lambda c: f"{float(c):.2f} µs"
    sfx = "" if ctx["outstanding"] == "64" else f"-{ctx['outstanding']}"
    p, u, d = srv["proxy (table)"], srv["unbound (local-data)"], srv["dnsmasq (hosts)"]
    pf, df = srv["proxy (forward)"], srv["dnsmasq (forward)"]
    tq, tc, fq, fc, fd = (r("table QPS proxy/unbound"), r("table CPU proxy/unbound"),
                          r("forward QPS proxy/dnsmasq"), r("forward CPU proxy/dnsmasq"),
                          r("forward QPS proxy/direct"))
    paired = lambda x: f"{x[0]:.2f} (paired median {x[1]})" if x[1] else f"{x[0]:.2f}"
    rows = [row("table-qps" + sfx, kq(p[0]), kq(u[0]), paired(tq)),
            row("table-cpu" + sfx, us(p[1]), us(u[1]), tc[0], lower=0.999),
            row("fwd-qps" + sfx, kq(pf[0]), kq(df[0]), paired(fq)),
            row("fwd-cpu" + sfx, us(pf[1]), us(df[1]), fc[0])]
    rows[0]["met"] = "met" if tq[0] >= 1 else "not met"
    rows[2]["met"] = "met" if fq[0] >= 2 else "not met"
    if not sfx:
        rows += [row("table-dnsmasq", f"{kq(p[0])}, {us(p[1])}", f"{kq(d[0])}, {us(d[1])}"),
                 row("fwd-direct", "", "", fd[0])]
        m = re.search(r"light load added latency: proxy (\S+) ms \[<= 0.050\], dnsmasq (\S+) ms", out)
        if m:
            lat = row("fwd-latency", f"+{float(m[1]):.3f} ms", f"+{float(m[2]):.3f} ms")
            lat["met"] = "met" if float(m[1]) <= 0.05 else "not met"
            rows.append(lat)
    return rows


# --- iptables-init/benches/apply-vs-restore.sh ------------------------------------------------

def parse_iptables(out: str, ctx: dict) -> list[dict]:
    rows = []
    blocks = re.split(r"^(?=(?:nft|legacy) +istio-iptables )", out, flags=re.M)[1:]
    for b in blocks:
        v = b.split()[0]
        m = re.match(r"\w+ +istio-iptables +([\d.]+) ms +iptables-restore by hand +([\d.]+) ms +ratio ([\d.]+)", b)
        rows.append(row(f"{v}-wall", f"{float(m[1]):.2f} ms", f"{float(m[2]):.2f} ms", float(m[3])))
        o = float(re.search(r"overhead beyond one extra spawn (-?[\d.]+) ms", b)[1])
        r = row(f"{v}-overhead", f"{o:.2f} ms".replace("-", "−"))
        r["met"] = "met" if o <= 0.3 else "not met"
        rows.append(r)
        t = re.search(r"task-clock medians \(perf\).*ours beyond one extra process (-?[\d.]+) ms", b)
        if t:
            r = row(f"{v}-cpu", f"{float(t[1]):.2f} ms")
            r["met"] = "met" if float(t[1]) <= 0.3 else "not met"
            rows.append(r)
    m = re.search(r"--native-nftables +([\d.]+) ms +nft -f by hand +([\d.]+) ms +ratio ([\d.]+).*\n"
                  r" +CPU per run: ours ([\d.]+) ms +nft -f ([\d.]+) ms +ratio ([\d.]+)", out)
    if m:
        rows += [row("native-wall", f"{m[1]} ms", f"{m[2]} ms", float(m[3]), lower=0.6),
                 row("native-cpu", f"{m[4]} ms", f"{m[5]} ms", float(m[6]), lower=0.6)]
    return rows


# --- scripts/bench-side-by-side.sh --------------------------------------------------------------

SBS = [  # key, field, format, goal bound (lower is better unless higher=True)
    ("rss5", "rss5_kib", "mib", 0.25, False), ("rss35", "rss35_kib", "mib", 0.25, False),
    ("start-peak", "start_peak_kib", "mib", 0.25, False), ("ready", "ready_ms", "ms", 0.5, False),
    ("cert", "cert_ms", "ms", None, False), ("dns-qps", "dns_qps", "kq", 3, True),
    ("dns-cpu", "dns_cpu_ns_per_query", "us", 0.3, False),
    ("dns-user-cpu", "dns_user_ns_per_query", "us", None, False), ("fwd-qps", "fwd_qps", "kq", 3, True),
    ("fwd-cpu", "fwd_cpu_ns_per_query", "us", 0.3, False), ("resync", "resync_ms", "ms", 0.2, False),
    ("eds-rss", "eds_rss_kib", "mib", None, False)]
FMT = {"mib": lambda v: f"{v / 1024:.1f} MiB", "ms": lambda v: f"{v:.0f} ms",
       "kq": lambda v: f"{v / 1000:.1f}k q/s", "us": lambda v: f"{v / 1000:.2f} µs"}


def parse_side_by_side(out: str, ctx: dict) -> list[dict]:
    runs = {"ours": [], "istio": []}
    for m in re.finditer(r"^(ours|istio) (ready_ms=.*)$", out, re.M):
        runs[m[1]].append({k: int(v) for k, v in (x.split("=") for x in m[2].split())})
    med = lambda xs: sorted(xs)[len(xs) // 2]  # as the bench's own table
    pre = "istiod-" if re.search(r"^control plane: istiod$", out, re.M) else ""
    rows = []
    for key, field, unit, bound, higher in SBS:
        a, b = [r[field] for r in runs["ours"]], [r[field] for r in runs["istio"]]
        ratio = med(a) / med(b) if med(b) else float("inf")
        rows.append(row(pre + key, rng(a, FMT[unit]), rng(b, FMT[unit]), ratio,
                        **({"higher": bound} if higher else {"lower": bound})))
    return rows


# --- cargo bench -p agent --bench cds_relay ----------------------------------------------------

def parse_cds_relay(out: str, ctx: dict) -> list[dict]:
    num = lambda pat: float(re.search(pat, out)[1])
    mb = num(r"cds_bytes=(\d+)") / 1e6
    direct = num(r"direct_tls_ms=([\d.]+)")
    a = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", "\n".join(
        line for line in out.splitlines() if line.startswith("agent:")))}
    rows = [row("vs-direct", f"+{a['relay_overhead_ms']:.1f} ms", f"{direct:.1f} ms",
                a["via_agent_ms"] / direct, lower=1.15),
            row("cpu-per-relay", f"{a['cpu_ms_per_relay']:.1f} ms"),
            row("peak-vs-message", f"+{a['peak_delta_kib'] / 1024:.1f} MiB", f"{mb * 1e6 / 2**20:.2f} MiB",
                a["peak_delta_kib"] * 1024 / (mb * 1e6), lower=2.0)]
    p = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", "\n".join(
        line for line in out.splitlines() if line.startswith("peer:")))}
    if p:
        rows += [row("added-vs-istio", f"+{a['relay_overhead_ms']:.1f} ms", f"+{p['relay_overhead_ms']:.1f} ms",
                     a["relay_overhead_ms"] / p["relay_overhead_ms"], lower=0.5),
                 row("cpu-per-mb", f"{a['cpu_ms_per_relay'] / mb:.2f} ms", f"{p['cpu_ms_per_relay'] / mb:.2f} ms",
                     a["cpu_ms_per_relay"] / p["cpu_ms_per_relay"], lower=0.5),
                 row("peak-vs-istio", f"+{a['peak_delta_kib'] / 1024:.1f} MiB", f"+{p['peak_delta_kib'] / 1024:.1f} MiB",
                     a["peak_delta_kib"] / p["peak_delta_kib"]),
                 row("rss-after", f"{a['rss_kib_after_11s_idle'] / 1024:.1f} MiB",
                     f"{p['rss_kib_after_11s_idle'] / 1024:.1f} MiB",
                     a["rss_kib_after_11s_idle"] / p["rss_kib_after_11s_idle"])]
    return rows


# --- scripts/bench-cluster.sh (its --json file; the script itself is not changed) ---------------

def parse_cluster(out: str, ctx: dict) -> list[dict]:
    d = json.loads(Path(ctx["json"]).read_text())
    n, delay = d["services"], d.get("istiod_delay_ms", 0)
    tag = f"{n}-delay{delay}" if delay else f"{n}"
    shutil.copy(ctx["json"], br.DATA / f"cluster-{tag}.json")
    away = f", istiod {delay} ms away" if delay else ""
    names = {"ready-one-median": "pod created → Ready, one at a time, median",
             "ready-one-p90": "pod created → Ready, one at a time, p90",
             "ready-burst-median": f"{d['pods']} pods at once → each Ready, median",
             "ready-burst-p90": f"{d['pods']} pods at once → each Ready, p90",
             "agent-rss": "agent RSS at idle, median",
             "proxy-memory": "`istio-proxy` container memory (agent + Envoy), median",
             "istiod-cpu": f"istiod CPU to bring the {d['pods']} pods to Ready"}
    what = lambda key: f"{names[key]} ({n:,} Services{away})"
    o, i = d["ours"], d["istio"]
    p90 = lambda xs: sorted(xs)[max(0, int(round(0.9 * len(xs))) - 1)]  # as cluster_bench.py
    med = statistics.median
    rows = []
    for key, f, get, unit in (("ready-one-median", "one_by_one_s", med, "s"), ("ready-one-p90", "one_by_one_s", p90, "s"),
                              ("ready-burst-median", "at_once_s", med, "s"), ("ready-burst-p90", "at_once_s", p90, "s"),
                              ("agent-rss", "agent_rss_mib", med, "MiB"), ("proxy-memory", "proxy_container_mib", med, "MiB")):
        a, b = get(o[f]), get(i[f])
        r = row(f"{key}-{tag}", f"{a:.2f} {unit}", f"{b:.2f} {unit}", f"{a / b:.2f}", what=what(key),
                anchor_name=IA)
        if key in ("ready-one-median", "ready-burst-median") and n >= 1000:
            r["goal"] = "≤ 0.7 with istiod 5 ms away"
            r["met"] = "not met" if a / b > 0.7 else "met" if delay >= 5 else "met without the delay"
        if key == "agent-rss":
            r["goal"], r["met"] = "≤ 0.2", "met" if a / b <= 0.2 else "not met"
        rows.append(r)
    a, b = o["istiod_cpu_s"], i["istiod_cpu_s"]
    rows.append(row(f"istiod-cpu-{tag}", f"{a:.2f} s", f"{b:.2f} s", f"{a / b:.2f}", what=what("istiod-cpu"),
                    anchor_name=IA))
    return rows


# --- agent/benches/idle.sh, agent/benches/warm-start.py, agent/benches/start-peak.py -----------

def parse_idle(out: str, ctx: dict) -> list[dict]:
    m = re.search(r"start_to_ready_ms=(\d+) agent_rss_kib=(\d+) agent_peak_rss_kib=(\d+)", out)
    later = re.search(r"after 35 s idle: agent_rss_kib=(\d+)", out)
    mib = lambda k: f"{int(k) / 1024:.1f} MiB"
    return [row("idle-ready", f"{m[1]} ms", what="agent start → `/healthz/ready` 200 (idle.sh, one run)"),
            row("idle-rss5", mib(m[2]), what="agent idle RSS 5 s after ready, Envoy connected"),
            row("idle-peak", mib(m[3]), what="agent start peak (VmHWM)"),
            row("idle-rss35", mib(later[1]), what="agent idle RSS after 35 s")]


def parse_warm_start(out: str, ctx: dict) -> list[dict]:
    return [row(f"warm-start-{d}", f"{on} ms", f"{off} ms", r, anchor_name="prefetch off",
                what=f"agent start → Envoy ready, warm start on, istiod-lite {d} ms away each way")
            for d, on, off, r in re.findall(r"^(\d+) ms \| ([\d.]+) ms \| ([\d.]+) ms \| ([\d.]+)$", out, re.M)]


def parse_start_peak(out: str, ctx: dict) -> list[dict]:
    runs = [json.loads(line) for line in out.splitlines() if line.startswith('{"agent"')]
    ready = [r["ready_ms"] for r in runs]
    hwm = [r["hwm10_kib"] for r in runs]
    mid = lambda k: statistics.median(r[k] for r in runs) / 1024
    n = f"shipped build, {len(runs)} run{'s' if len(runs) > 1 else ''}"
    r = row("start-ready", ", ".join(map(str, ready)) + " ms")
    r["what"] = f"agent start → `/healthz/ready` 200 (xDS proxy, SDS, NDS; P-256, local CA), {n}"
    r["met"] = "met" if max(ready) <= 200 else "not met"
    # VmHWM can read below the sampled VmRSS peak (the kernel updates it lazily); it is the figure.
    p = row("start-peak", rng(hwm, lambda k: f"{k / 1024:.1f} MiB")
            + f" (sampled {mid('sampled_peak_kib'):.1f}: {mid('file_kib'):.1f} file-backed"
              f" + {mid('anon_kib'):.1f} anonymous)")
    p["what"] = ("startup peak RSS (VmHWM 10 s after exec; the largest VmRSS sampled every 2 ms over "
                 f"the first 3 s and its split, medians), {n}")
    p["met"] = "met" if max(hwm) <= 8 * 1024 else "not met"
    return [r, p]


# --- agent/benches/platform-start.py: per world and agent, the ms discovery adds ----------------

def parse_platform_start(out: str, ctx: dict) -> list[dict]:
    added = {}  # (world, agent) -> ms, None where Envoy was not started
    for line in out.splitlines():
        cells = line[26:].split()
        if line.startswith("#") or len(cells) < 2 or cells[0] not in ("ours", "istio"):
            continue
        added[(line[:26].strip(), cells[0])] = None if cells[-1] == "-" else float(cells[-1])
    if not added:
        return []
    build = re.search(r"^# ours: \S*/(dist|release|debug)/pilot-agent$", out, re.M)
    build = {"dist": "shipped build", "release": "release build", "debug": "debug build"}.get(
        build[1] if build else "", "build as `# ours:` names it")
    runs = re.search(r"^# runs: (\d+)", out, re.M)[1]
    get = lambda world, agent: added.get((world, agent))
    ms = lambda v: "no Envoy" if v is None else signed(v, "ms")
    both = lambda agent: " / ".join(ms(get(w, agent)).removesuffix(" ms") for w in
                                    ("no-route", "blackhole route")) + " ms"
    near0 = lambda *vs: "met" if all(v is not None and abs(v) <= 20 for v in vs) else "not met"  # ≈ 0: within noise
    silent = lambda v: "no Envoy" if v is None else signed(v / 1000, "s", 1)
    peer = any(a == "istio" for _, a in added)
    fails = row("platform-dns-fails", ms(get("black-hole, DNS refused", "ours")),
                ms(get("black-hole, DNS refused", "istio")) if peer else "")
    fails["what"] = ("start delay platform discovery adds (`CLOUD_PLATFORM` unset vs `none`): metadata "
                     f"address silent, DNS failing at once ({build}, medians of {runs})")
    fails["met"] = near0(get("black-hole, DNS refused", "ours"))
    route = row("platform-no-route", both("ours"), both("istio") if peer else "")
    route["met"] = near0(get("no-route", "ours"), get("blackhole route", "ours"))
    return [fails, route, row("platform-silent", silent(get("black-hole", "ours")),
                              silent(get("black-hole", "istio")) if peer else "")]


# --- agent/benches/hostile.sh: ours, then Istio's agent (AGENT_BIN) ---------------------------

HOSTILE_PORT = re.compile(
    r"^status port, .*?, (opened once|reconnecting each one closed): (\S+) connects\n"
    r" +probes: (\d+), failed (\d+); latency ms p50 \S+ p99 (\S+) max .*\n"
    r" +agent CPU (\S+)% of a core; RSS (\d+) -> (\d+) KiB \(peak \d+ KiB\); agent fds (\d+)", re.M)
HOSTILE_HPACK = re.compile(r"^HPACK bombs, (\d+) × (\d+) KiB blocks .*?: (\d+)/\d+ streams answered .*"
                           r"\(\+?(-?\d+) KiB\)$")


def hostile_run(text: str) -> dict:
    port = {m[1]: {"connects": int(m[2]) if m[2].isdigit() else 0, "probes": int(m[3]), "failed": int(m[4]),
                   "p99": float(m[5]), "cpu": float(m[6]), "growth": int(m[8]) - int(m[7]), "fds": int(m[9])}
            for m in HOSTILE_PORT.finditer(text)}
    hpack, closed = [], False
    for line in text.splitlines():
        closed = closed or "closed the connection" in line
        m = HOSTILE_HPACK.match(line)
        if m:
            hpack.append({"count": int(m[1]), "answered": int(m[3]), "peak": int(m[4]), "closed": closed})
            closed = False
    after = re.search(r"agent alive=(\w+), Envoy's readiness through the agent: (\d+)", text)
    return {"hold": port["opened once"], "reconnect": port["reconnecting each one closed"], "hpack": hpack,
            "alive": bool(after) and after[1] == "yes" and after[2] == "200"}


def parse_hostile(out: str, ctx: dict) -> list[dict]:
    runs = [hostile_run(part) for part in re.split(r"^agent open-file limit:", out, flags=re.M)[1:]]
    o, i = runs[0], (runs[1] if len(runs) > 1 else None)
    mib = lambda kib: signed(kib / 1024, "MiB", 1)
    growth = lambda r: f"{mib(r['hold']['growth'])} ({r['hold']['fds']:,} fds)"
    probes = lambda p: f"{p['failed']} of {p['probes']}, {p['p99']:.1f} ms"
    reconnect = lambda p: (f"{p['connects']:,} connects: {p['failed']} failed, {p['p99']:.1f} ms; "
                           f"{p['cpu']:.0f} %; {mib(p['growth'])}")

    def hpack(r):
        h = r["hpack"]
        peaks = [b["peak"] for b in h]
        peak = rng(peaks, mib) if min(peaks) < 0 else "+" + rng(peaks, lambda k: f"{k / 1024:.1f} MiB")
        if all(b["answered"] == b["count"] and not b["closed"] for b in h):
            said = "each stream refused (431), connection kept"
        elif all(b["closed"] and b["answered"] == 0 for b in h):
            said = f"connection closed, 0/{h[0]['count']} answered"
        else:
            said = ", ".join(f"{b['answered']}/{b['count']} answered" + (" then closed" if b["closed"] else "")
                             for b in h)
        return f"{said}; {peak}" + ("" if r["alive"] else "; agent or Envoy not ready after the attacks")

    a, b = o["hold"]["growth"], i["hold"]["growth"] if i else 0
    ratio = "" if b <= 0 else f"{a / b:.3f}" if a / b < 0.1 else f"{a / b:.2f}"
    conns = row("idle-conns", growth(o), growth(i) if i else "", ratio)
    conns["what"] = ("a peer holding 10,000 idle connections to 15020 while the kubelet's probes run: agent "
                     "RSS growth, open fds (ours: 64 admitted per peer, the rest closed)")
    conns["met"] = "met" if a < 16 * 1024 else "not met"
    p = row("idle-conns-probes", probes(o["hold"]), probes(i["hold"]) if i else "")
    p["met"] = "met" if o["hold"]["p99"] <= 100 else "not met"
    cpu = row("idle-conns-cpu", f"{o['hold']['cpu']:.1f} %", f"{i['hold']['cpu']:.1f} %" if i else "")
    cpu["met"] = "met" if o["hold"]["cpu"] < 5 else "not met"
    rec = row("reconnect", reconnect(o["reconnect"]), reconnect(i["reconnect"]) if i else "")
    rec["what"] = "each closed connection reconnected for 20 s: connects; probes failed, p99; CPU; RSS growth"
    hp = row("hpack", hpack(o), hpack(i) if i else "")
    hp["met"] = "met" if o["alive"] and max(x["peak"] for x in o["hpack"]) <= 8 * 1024 else "not met"
    return [conns, p, cpu, rec, hp]


# --- the reliability rows' end-to-end tests (their `FIGURE` and outage lines) ---------------------

def dur_ms(debug: str) -> float:
    """A Rust `Duration`'s Debug form (`191.2ms`, `1.5s`, `900µs`) in ms."""
    m = re.fullmatch(r"([\d.]+)(ns|µs|ms|s)", debug)
    return float(m[1]) * {"ns": 1e-6, "µs": 1e-3, "ms": 1, "s": 1e3}[m[2]]


def durs(out: str, pattern: str) -> list[float]:
    return [dur_ms(d) for d in re.findall(pattern, out, re.M)]


def ms_row(key: str, xs: list[float], bound_ms: float, fmt=lambda v: f"{v:,.0f} ms", **kw) -> dict:
    if not xs:
        raise RuntimeError(f"{key}: no FIGURE line (a test without its prerequisites passes as skipped)")
    r = row(key, rng(xs, fmt), **kw)
    r["met"] = "met" if max(xs) <= bound_ms else "not met"
    return r


def parse_pod_outage(out: str, ctx: dict) -> list[dict]:
    weight = durs(out, r"^weight change took effect within (\S+)$")
    synced = [float(x) for x in re.findall(r"^FIGURE control_plane_outage: .* synced (\d+) ms after", out, re.M)]
    ok, failed = map(int, re.search(r"^outage: (\d+) requests succeeded, (\d+) failed", out, re.M).groups())
    down = row("istiod-down-20s", f"{failed} of {ok + failed:,}; {rng(synced, lambda v: f'{v:,.0f} ms')}")
    # Measured before the agent owned the upstream connection, not in this run.
    down["anchor_name"] = "Envoy's own reconnect backoff (Istio's behaviour; 2.8–18.9 s, docs/reliability.md)"
    down["met"] = "met" if failed == 0 and max(synced) <= 1000 else "not met"
    return [ms_row("vs-weight", weight, 2000), down]


def parse_restart(out: str, ctx: dict) -> list[dict]:
    return [ms_row("sigkill-5s", durs(out, r"FIGURE istiod_restart: .*?; Envoy SYNCED (\S+) after that"), 1000)]


def parse_stall(out: str, ctx: dict) -> list[dict]:
    m = re.findall(r"FIGURE stalled_istiod: detected and replaced after (\S+) \(keepalive interval (\S+),", out)
    return [ms_row("sigstop", [dur_ms(d) for d, _ in m], 2 * max((dur_ms(k) for _, k in m), default=0),
                   lambda v: f"{v / 1000:.2f} s")]


def parse_failover(out: str, ctx: dict) -> list[dict]:
    return [ms_row("failover-lite", durs(out, r"FIGURE istiod_failover \(List\): Envoy SYNCED via the other "
                                              r"istiod-lite (\S+) after"), 1000)]


def parse_failover_istiod(out: str, ctx: dict) -> list[dict]:
    xs = durs(out, r"FIGURE live_istiods_failover: Envoy SYNCED via the other istiod (\S+) after")
    r = ms_row("failover-istiod", xs, 1000)
    r["what"] = ("two of Istio's istiods (`ISTIO_GO_BIN`), the one in use SIGKILLed: Envoy synced via the "
                 f"other ({len(xs)} run{'s' if len(xs) > 1 else ''})")
    return [r]


BENCHES = [
    Bench("csr", "identity", f"cargo bench -p sds --features testing --bench csr{' -- ' + CRITERION if CRITERION else ''}", parse_csr),
    Bench("ca_sign", "identity", f"cargo bench -p control-plane --bench ca_sign{' -- ' + CRITERION if CRITERION else ''}", parse_ca_sign),
    Bench("ads_load", "ads", "cargo bench -p control-plane --bench ads_load", parse_ads),
    # One istiod-lite process at this machine's limit: RLIMIT_NOFILE's hard 20,000 (no
    # CAP_SYS_RESOURCE to raise it), one socket per proxy.
    Bench("ads_load-limit", "ads", "ADS_LOAD_CLIENTS=19000 cargo bench -p control-plane --bench ads_load",
          parse_ads),
    Bench("bench-dns", "dns", "scripts/bench-dns.sh", parse_dns),
    Bench("bench-dns-256", "dns", "OUTSTANDING=256 scripts/bench-dns.sh", parse_dns),
    Bench("apply-vs-restore", "iptables", "iptables-init/benches/apply-vs-restore.sh", parse_iptables),
    Bench("side-by-side", "side-by-side", f"{PEER} scripts/bench-side-by-side.sh target/dist/pilot-agent 3", parse_side_by_side),
    Bench("side-by-side-istiod", "side-by-side",
          f"CONTROL_PLANE=istiod {PEER} scripts/bench-side-by-side.sh target/dist/pilot-agent 3", parse_side_by_side),
    Bench("cds_relay", "cds-relay",
          f"{PEER} CDS_RELAY_AGENT=$PWD/target/dist/pilot-agent cargo bench -p agent --bench cds_relay", parse_cds_relay),
    Bench("cluster-1000", "cluster", "scripts/bench-cluster.sh --pods 20 --services 1000", parse_cluster),
    Bench("cluster-1000-delay5", "cluster",
          "scripts/bench-cluster.sh --pods 20 --services 1000 --istiod-delay-ms 5", parse_cluster),
    Bench("cluster-10", "cluster", "scripts/bench-cluster.sh --pods 20 --services 10", parse_cluster),
    Bench("idle", "agent", "agent/benches/idle.sh", parse_idle),
    Bench("warm-start", "agent", "agent/benches/warm-start.py --rounds 9 --delays 0,2,5,10", parse_warm_start),
    Bench("start-peak", "agent", "agent/benches/start-peak.py --idle", parse_start_peak),
    Bench("platform-start", "agent", "python3 agent/benches/platform-start.py", parse_platform_start),
    Bench("hostile", "hostile", f"export {LITE}; agent/benches/hostile.sh target/dist && "
          "AGENT_BIN=$ISTIO_GO_BIN/pilot-agent agent/benches/hostile.sh target/dist", parse_hostile),
    Bench("reliability-pod", "reliability", f"{NEXTEST} --test mesh --no-capture "
          "pod::virtual_service_weights_move_traffic_and_control_plane_outage_costs_nothing", parse_pod_outage),
    Bench("reliability-restart", "reliability",
          f"{NEXTEST} --test agent --no-capture xds_reconnect::istiod_restart_is_invisible_to_envoy", parse_restart),
    Bench("reliability-stall", "reliability", f"{NEXTEST} --test agent --no-capture "
          "xds_reconnect::stalled_istiod_is_replaced_within_two_keepalive_periods", parse_stall),
    Bench("reliability-failover", "reliability",
          f"{NEXTEST} --test agent --no-capture istiod_failover::agent_fails_over_to_the_other_istiod", parse_failover),
    # Skips (no figure: the bench fails) without ISTIO_GO_BIN, KUBERNETES_BIN and ETCD_BIN.
    Bench("reliability-failover-istiod", "reliability", "cargo build --workspace --bins && for i in 1 2 3; do "
          "cargo nextest run -p tests --test agent --no-capture live_istiods_failover || exit 1; done",
          parse_failover_istiod),
    Bench("outage-10m", "reliability", "sudo scripts/outage.sh 10m", None),
    Bench("soak-30m", "reliability", "sudo scripts/soak.sh 30m", None),
]


def sh(cmd: str) -> str:
    return subprocess.run(cmd, shell=True, cwd=REPO, capture_output=True, text=True).stdout.strip()


def run_id() -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    commit = sh("git rev-parse --short HEAD")
    cores, kernel = os.cpu_count(), os.uname().release
    load = os.getloadavg()[0]
    return {"id": f"{now:%Y-%m-%dT%H%MZ}-{commit}-{cores}c-{kernel}", "date": f"{now:%Y-%m-%d}",
            "commit": commit, "dirty": bool(sh("git status --porcelain --untracked-files=no")),
            "machine": f"{cores} cores, kernel {kernel}, load {load:.1f} at start"}


def merge(area: str, new: list[dict], meta: dict, command: str) -> None:
    rows = br.load(area)
    by_key = {r["key"]: r for r in rows}
    for n in new:
        defaults = n.pop("_defaults", {})
        old = by_key.get(n["key"])
        r = old if old else {"key": n["key"], "area": area, "what": defaults.get("what", n["key"]),
                             "anchor_name": defaults.get("anchor_name", ""), "goal": ""}
        if old is None:
            rows.append(r)
        r.update(n)
        r.update({"date": meta["date"], "commit": meta["commit"], "machine": meta["machine"],
                  "command": command, "run": meta["id"]})
        if not r["goal"]:
            r["met"] = ""
        by_key[r["key"]] = r
    br.save(area, [{f: r.get(f, "") for f in br.FIELDS} | ({"headline": r["headline"]} if r.get("headline") else {})
                   for r in rows])


def run(areas: list[str]) -> int:
    joining = "--continue" in areas
    areas = [a for a in areas if a != "--continue"]
    names = [b.name for b in BENCHES]
    unknown = [a for a in areas if a not in br.AREAS and a not in names]
    if unknown:
        sys.exit(f"bench-report: unknown area(s) or bench(es) {unknown}; areas: {' '.join(br.AREAS)}; "
                 f"benches: {' '.join(names)}")
    meta = run_id()
    earlier = br.runs()
    meta["report"] = br.report_of(earlier[-1]) if joining and earlier else meta["id"]
    chosen = [b for b in BENCHES if not areas or b.area in areas or b.name in areas]
    done, failed, no_adapter = [], [], []
    print(f"bench-report: run {meta['id']}" + (" (uncommitted changes)" if meta["dirty"] else ""))
    for b in chosen:
        if b.parse is None:
            print(f"  {b.name} ({b.area}): no adapter yet: `{b.command}` is not run; its rows render stale")
            no_adapter.append(b.name)
            continue
        ctx = {"outstanding": re.search(r"OUTSTANDING=(\d+)", b.command)[1] if "OUTSTANDING=" in b.command else "64"}
        cmd = b.command
        if b.area == "cluster":
            ctx["json"] = tempfile.mktemp(suffix=".json")
            cmd = f"{b.command} --json {ctx['json']}"
        print(f"  {b.name} ({b.area}): {b.command}", flush=True)
        with tempfile.TemporaryFile("w+") as log:
            code = subprocess.run(["bash", "-c", f"set -o pipefail; {{ {cmd}; }} 2>&1 | tee /dev/stderr"],
                                  cwd=REPO, stdout=log).returncode
            log.seek(0)
            out = log.read()
        try:
            if code != 0:
                raise RuntimeError(f"exit {code}")
            rows = b.parse(out, ctx)
            if not rows:
                raise RuntimeError("no figures found in its output")
        except Exception as e:  # noqa: BLE001: any parse failure leaves the bench's rows stale
            print(f"  {b.name}: failed ({e}); its rows stay as they were", file=sys.stderr)
            failed.append(b.name)
            continue
        merge(b.area, rows, meta, b.command)
        done.append(b.name)
    if not done:
        print("bench-report: nothing measured; no run recorded", file=sys.stderr)
        return 1 if failed else 0
    with open(br.DATA / "runs.jsonl", "a") as f:
        f.write(json.dumps(meta | {"areas": areas or "all", "benches": done, "no_adapter": no_adapter,
                                   "failed": failed}, ensure_ascii=False) + "\n")
    return 1 if failed else 0
