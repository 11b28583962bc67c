"""Charts for docs/, rendered from `bertfuse bench`'s gpu_bench.json files (no plotting package:
plain SVG, so the docs build needs nothing).

    python3 benchmarks/charts.py docs/runs/gpu_bench_2026-11-29_main.json -o docs/charts/latency_peers.svg \
        --title "p50 per request, H200, 2026-11-29"
    python3 benchmarks/charts.py RUN.json -o OUT.svg --field seq_per_s --variants "ORT bert_tf fp16 + CUDA graph" ...

One panel per workload, one horizontal bar per variant (every row of the run with a number in
`--field`, or those named by --variants, in that order), the value printed at the bar's end.
Rows the run could not time are left out and listed in the chart's footnote.
"""

from __future__ import annotations

import argparse
import json
import sys
from html import escape
from pathlib import Path

FIELDS = {"p50_us": "p50 (us, lower is better)", "p99_us": "p99 (us, lower is better)",
          "seq_per_s": "sequences/s (higher is better)", "gpu_us": "GPU time (us, lower is better)"}
BAR_H, GAP, LABEL_W, BAR_W, PAD = 18, 6, 430, 360, 12


def rows_by_workload(results: list[dict], field: str, variants: list[str] | None
                     ) -> tuple[dict[str, list[tuple[str, float]]], list[str]]:
    """{workload: [(variant, value)]} in run order (or --variants order), and the rows left out."""
    panels: dict[str, list[tuple[str, float]]] = {}
    missing = []
    for r in results:
        if variants is not None and r["variant"] not in variants:
            continue
        value = r.get(field)
        if not isinstance(value, (int, float)) or value != value:  # None or NaN: not timed
            missing.append(f"{r['workload']} / {r['variant']}")
            continue
        panels.setdefault(r["workload"], []).append((r["variant"], float(value)))
    if variants is not None:
        for rows in panels.values():
            rows.sort(key=lambda row: variants.index(row[0]))
    return panels, missing


def render(panels: dict[str, list[tuple[str, float]]], field: str, title: str,
           missing: list[str]) -> str:
    height = PAD * 2 + 28 + sum(24 + len(rows) * (BAR_H + GAP) + GAP for rows in panels.values()) \
        + (16 if missing else 0)
    width = LABEL_W + BAR_W + 90
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{PAD}" y="{PAD + 14}" font-size="14" font-weight="bold">{escape(title)} — '
           f'{escape(FIELDS.get(field, field))}</text>']
    y = PAD + 28
    for workload, rows in panels.items():
        out.append(f'<text x="{PAD}" y="{y + 16}" font-weight="bold">{escape(workload)}</text>')
        y += 24
        top = max(v for _, v in rows) or 1.0
        for variant, value in rows:
            w = max(1.0, BAR_W * value / top)
            colour = "#2b6cb0" if variant.startswith("bertfuse") else "#a0aec0"
            out.append(f'<text x="{LABEL_W - 6}" y="{y + BAR_H - 5}" text-anchor="end">'
                       f'{escape(variant)}</text>')
            out.append(f'<rect x="{LABEL_W}" y="{y}" width="{w:.1f}" height="{BAR_H}" fill="{colour}"/>')
            out.append(f'<text x="{LABEL_W + w + 4:.1f}" y="{y + BAR_H - 5}">{value:,.1f}</text>')
            y += BAR_H + GAP
        y += GAP
    if missing:
        out.append(f'<text x="{PAD}" y="{y + 12}" font-size="10">not timed in this run: '
                   f'{escape("; ".join(missing))[:300]}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a gpu_bench.json")
    ap.add_argument("-o", "--output", type=Path, required=True, help="the .svg to write")
    ap.add_argument("--field", choices=sorted(FIELDS), default="p50_us")
    ap.add_argument("--variants", nargs="+", help="rows to draw, in this order (default: all)")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    try:
        data = json.loads(args.run.read_text())
        results = data["results"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"charts: {args.run}: not a gpu_bench.json ({exc})", file=sys.stderr)
        return 2
    panels, missing = rows_by_workload(results, args.field, args.variants)
    if not panels:
        print(f"charts: {args.run}: no row has {args.field}", file=sys.stderr)
        return 2
    title = args.title or f"{args.run.name} ({data.get('date', 'undated')})"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render(panels, args.field, title, missing))
    print(f"wrote {args.output} ({sum(map(len, panels.values()))} bars)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
