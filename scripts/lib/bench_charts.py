"""SVG charts drawn from docs/benchmarks/ (scripts/bench-report.sh render): the cluster's
pod created → Ready CDF per agent (cluster-<services>.json, the per-pod values of the newest
cluster run) and istiod-lite's ADS p99 against the number of proxies (ads.jsonl's p99-<n>-<mode>
rows). Plain SVG, no plotting library; the same data always gives the same bytes."""

import json
import re
from pathlib import Path

W, H, L, R, T, B = 660, 300, 60, 200, 30, 40
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def svg(title: str, xlabel: str, ylabel: str, series: list[tuple[str, list[tuple[float, float]], bool]],
        xmax: float, ymax: float) -> str:
    """series: (label, points, step); x from 0 to xmax, y from 0 to ymax."""
    pw, ph = W - L - R, H - T - B
    sx = lambda x: L + x / xmax * pw
    sy = lambda y: T + ph - y / ymax * ph
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2 - R / 2:.0f}" y="18" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{L}" y1="{T + ph}" x2="{L + pw}" y2="{T + ph}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{T + ph}" stroke="black"/>',
           f'<text x="{L + pw / 2:.0f}" y="{H - 6}" text-anchor="middle">{xlabel}</text>',
           f'<text x="14" y="{T + ph / 2:.0f}" text-anchor="middle" transform="rotate(-90 14 {T + ph / 2:.0f})">{ylabel}</text>']
    for i in range(6):
        x, y = xmax * i / 5, ymax * i / 5
        out.append(f'<text x="{sx(x):.1f}" y="{T + ph + 14}" text-anchor="middle">{x:g}</text>')
        out.append(f'<text x="{L - 4}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        out.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{L + pw}" y2="{sy(y):.1f}" stroke="#ddd"/>')
    for n, (label, pts, step) in enumerate(series):
        c = COLORS[n % len(COLORS)]
        path, prev = [], None
        for x, y in pts:
            if step and prev is not None:
                path.append(f"{sx(x):.1f},{sy(prev):.1f}")
            path.append(f"{sx(x):.1f},{sy(y):.1f}")
            prev = y
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{" ".join(path)}"/>')
        if not step:
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{c}"/>' for x, y in pts]
        ly = T + 12 + 16 * n
        out.append(f'<line x1="{L + pw + 10}" y1="{ly - 4}" x2="{L + pw + 28}" y2="{ly - 4}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{L + pw + 32}" y="{ly}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def nice(v: float) -> float:
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
        if v <= step * 5:
            return step * 5
    return v


def cdf(values: list[float]) -> list[tuple[float, float]]:
    xs = sorted(values)
    return [(0.0, 0.0)] + [(x, (i + 1) / len(xs)) for i, x in enumerate(xs)]


def charts(data: Path) -> dict[Path, str]:
    out = {}
    for f in sorted(data.glob("cluster-*.json")):
        d = json.loads(f.read_text())
        series = []
        for who, name in (("ours", "ours"), ("istio", "Istio's agent")):
            series.append((f"{name}, one at a time", cdf(d[who]["one_by_one_s"]), True))
            series.append((f"{name}, {d['pods']} at once", cdf(d[who]["at_once_s"]), True))
        xmax = nice(max(x for _, pts, _ in series for x, _ in pts))
        delay = d.get("istiod_delay_ms", 0)
        out[data / f"{f.stem.replace('cluster-', 'cluster-ready-')}.svg"] = svg(
            f"pod created → Ready, {d['services']:,} Services"
            + (f", istiod {delay} ms away" if delay else "") + " (CDF)", "seconds", "share of pods", series,
            xmax, 1.0)
    rows = [json.loads(line) for line in (data / "ads.jsonl").read_text().splitlines()] \
        if (data / "ads.jsonl").exists() else []
    curves: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        m = re.fullmatch(r"p99-(\d+)-(sotw|delta)(-load(\d+))?", r["key"])
        if m and r["ours"].endswith(" ms"):
            label = f"{'SotW' if m[2] == 'sotw' else 'Delta'}, {r['machine'].split(', ')[-1]}"
            curves.setdefault(label, []).append((int(m[1]) / 1000, float(r["ours"][:-3].replace(",", ""))))
    if curves:
        series = [(k, sorted(v), False) for k, v in sorted(curves.items())]
        out[data / "ads-p99.svg"] = svg("istiod-lite: change → every proxy ACKed, p99", "proxies (thousands)",
                                         "ms", series, nice(max(x for _, p, _ in series for x, _ in p)),
                                         nice(max(y for _, p, _ in series for _, y in p)))
    return out


def write_all(data: Path) -> None:
    for path, text in charts(data).items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
