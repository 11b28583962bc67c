"""Charts for docs/, rendered from `bertfuse bench`'s gpu_bench.json files and from the breadth
benchmark's JSON (no plotting package: plain SVG, so the docs build needs nothing).

    python3 benchmarks/charts.py docs/runs/gpu_bench_2026-11-29_main.json -o docs/charts/latency_peers.svg \
        --title "p50 per request, H200, 2026-11-29"
    python3 benchmarks/charts.py RUN.json -o OUT.svg --field seq_per_s --variants "ORT bert_tf fp16 + CUDA graph" ...
    python3 benchmarks/charts.py breadth.json --fusion -o docs/charts/fusion_counts.svg

One panel per workload, one horizontal bar per variant (every row of the run with a number in
`--field`, or those named by --variants, in that order), the value printed at the bar's end.
Rows the run could not time are left out and listed in the chart's footnote.

--fusion reads benchmarks/convert/breadth.py's JSON instead: one panel per source model, and
per fused op (Attention, SkipLayerNorm, GELU, EmbedLayerNorm) a bar for bertfuse (its fp32
convert) and one for each ONNX Runtime transformer-optimizer model type the run tried, all on
one scale, so that a 0 reads as a 0 beside a 4. Sources a tool failed on go in the footnote.
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
# The fusion chart's ops: (label, the contrib ops counted under it). GELU: erf (BiasGelu, Gelu)
# or tanh (FastGelu).
FUSED_OPS = (("Attention", ("Attention",)), ("SkipLayerNorm", ("SkipLayerNormalization",)),
             ("GELU", ("BiasGelu", "Gelu", "FastGelu")),
             ("EmbedLayerNorm", ("EmbedLayerNormalization",)))
TOOL_COLOURS = {"bertfuse": "#2b6cb0", "ORT bert_tf": "#a0aec0", "ORT bert": "#cbd5e0"}
FUSION_BAR_H = 11


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


def _head(width: int, height: int, heading: str) -> list[str]:
    """An SVG's opening: its size, a white ground and the bold heading."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="12">',
            f'<rect width="{width}" height="{height}" fill="white"/>',
            f'<text x="{PAD}" y="{PAD + 14}" font-size="14" font-weight="bold">'
            f'{escape(heading)}</text>']


def _tail(out: list[str], y: float, what: str, missing: list[str]) -> str:
    """The SVG's end: a footnote naming what is left out, if anything, and the close."""
    if missing:
        out.append(f'<text x="{PAD}" y="{y + 12}" font-size="10">{what}: '
                   f'{escape("; ".join(missing))[:300]}</text>')
    return "\n".join(out + ["</svg>"]) + "\n"


def render(panels: dict[str, list[tuple[str, float]]], field: str, title: str,
           missing: list[str]) -> str:
    height = PAD * 2 + 28 + sum(24 + len(rows) * (BAR_H + GAP) + GAP for rows in panels.values()) \
        + (16 if missing else 0)
    width = LABEL_W + BAR_W + 90
    out = _head(width, height, f"{title} — {FIELDS.get(field, field)}")
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
    return _tail(out, y, "not timed in this run", missing)


Counts = dict[str, dict[str, int]]  # {tool: {op label: count}}


def fusion_counts(rows: list[dict]) -> tuple[dict[str, Counts], list[str]]:
    """{model: {tool: {op: count}}} from breadth.py's rows (in their order), and the
    'model / tool' pairs left out because that tool failed there."""
    panels: dict[str, Counts] = {}
    missing = []
    for r in rows:
        model = f"{r['library']} {r['class']} ({r['format']})"
        found = {"bertfuse": (r.get("fp32") or {}).get("fused")}
        for model_type, result in (r.get("ort") or {}).items():
            found[f"ORT {model_type}"] = result.get("fused")
        tools: Counts = {}
        for tool, fused in found.items():
            if not isinstance(fused, dict):
                missing.append(f"{model} / {tool}")
                continue
            tools[tool] = {label: sum(int(fused.get(op, 0)) for op in ops)
                           for label, ops in FUSED_OPS}
        if tools:
            panels[model] = tools
    return panels, missing


def render_fusion(panels: dict[str, Counts], title: str, missing: list[str]) -> str:
    """The fusion chart's SVG: per model, per op, one bar per tool on a common scale."""
    tools = list(dict.fromkeys(t for counts in panels.values() for t in counts))
    top = max((v for counts in panels.values() for ops in counts.values()
               for v in ops.values()), default=0) or 1
    group = len(tools) * (FUSION_BAR_H + 2) + GAP
    height = PAD * 2 + 28 + 20 + len(panels) * (24 + len(FUSED_OPS) * group + GAP) \
        + (16 if missing else 0)
    width = LABEL_W + BAR_W + 90
    out = _head(width, height, f"{title} — fused ops per model (higher is better)")
    x = PAD
    for tool in tools:  # the legend
        out.append(f'<rect x="{x}" y="{PAD + 24}" width="12" height="12" '
                   f'fill="{TOOL_COLOURS.get(tool, "#718096")}"/>')
        out.append(f'<text x="{x + 16}" y="{PAD + 34}">{escape(tool)}</text>')
        x += 16 + 8 * len(tool) + 20
    y = PAD + 48
    for model, counts in panels.items():
        out.append(f'<text x="{PAD}" y="{y + 16}" font-weight="bold">{escape(model)}</text>')
        y += 24
        for label, _ in FUSED_OPS:
            out.append(f'<text x="{LABEL_W - 6}" y="{y + FUSION_BAR_H + 3}" '
                       f'text-anchor="end">{escape(label)}</text>')
            for tool in tools:
                if tool in counts:
                    value = counts[tool][label]
                    w = BAR_W * value / top
                    out.append(f'<rect x="{LABEL_W}" y="{y}" width="{w:.1f}" '
                               f'height="{FUSION_BAR_H}" fill="{TOOL_COLOURS.get(tool, "#718096")}">'
                               f'<title>{escape(f"{model}: {tool}, {label}")}</title></rect>')
                    out.append(f'<text x="{LABEL_W + w + 4:.1f}" y="{y + FUSION_BAR_H - 1}" '
                               f'font-size="10">{value}</text>')
                y += FUSION_BAR_H + 2
            y += GAP
        y += GAP
    return _tail(out, y, "failed in this run", missing)


def _fusion_main(args: argparse.Namespace) -> int:
    try:
        data = json.loads(args.run.read_text())
        rows = data["rows"]
        panels, missing = fusion_counts(rows)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"charts: {args.run}: not a breadth.py JSON ({exc})", file=sys.stderr)
        return 2
    if not panels:
        print(f"charts: {args.run}: no row has fusion counts", file=sys.stderr)
        return 2
    env = data.get("environment") or {}
    title = args.title or f"{args.run.name} ({env.get('date', 'undated')})"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render_fusion(panels, title, missing))
    print(f"wrote {args.output} ({len(panels)} models)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a gpu_bench.json (with --fusion: a breadth.py JSON)")
    ap.add_argument("-o", "--output", type=Path, required=True, help="the .svg to write")
    ap.add_argument("--field", choices=sorted(FIELDS), default="p50_us")
    ap.add_argument("--variants", nargs="+", help="rows to draw, in this order (default: all)")
    ap.add_argument("--title", default="")
    ap.add_argument("--fusion", action="store_true",
                    help="the fusion-count chart of benchmarks/convert/breadth.py's JSON")
    args = ap.parse_args(argv)
    if args.fusion:
        return _fusion_main(args)
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
