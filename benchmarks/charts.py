"""Charts for docs/, rendered from `bertfuse bench`'s gpu_bench.json files and from the breadth
benchmark's JSON, drawn by matplotlib (a Figure saved by its SVG backend: no pyplot, no
display) into SVG files that are the same bytes on every run of the same input (a fixed
svg.hashsalt, no date).

    python3 benchmarks/charts.py docs/runs/gpu_bench_2026-12-06_h100_evening_base.json -o docs/charts/latency_peers_h100.svg \
        --title "p50 per request against the peers, H100, 2026-12-06" --variants "bertfuse fp16 runtime (arena + CUDA graph)" ...
    python3 benchmarks/charts.py RUN.json -o OUT.svg --field seq_per_s --variants "ORT bert_tf fp16 + CUDA graph" ...
    python3 benchmarks/charts.py breadth.json --fusion -o docs/charts/fusion_counts.svg

(benchmarks/README.md lists the commands that drew each chart in docs/charts/.)

One panel per workload, one horizontal bar per variant (every row of the run with a number in
`--field`, or those named by --variants, in that order), the value printed at the bar's end;
bertfuse's rows in blue, the others in grey, each panel on its own scale. Rows the run could not
time are left out and listed in the chart's footnote.

--fusion reads benchmarks/convert/breadth.py's JSON instead: one panel per source model, and
per fused op (Attention, SkipLayerNorm, GELU, EmbedLayerNorm) a bar for bertfuse (its fp32
convert) and one for each ONNX Runtime transformer-optimizer model type the run tried, all on
one scale, so that a 0 reads as a 0 beside a 4, with a legend of the tools. Sources a tool failed
on go in the footnote.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import textwrap
from pathlib import Path

FIELDS = {"p50_us": "p50 (us, lower is better)", "p99_us": "p99 (us, lower is better)",
          "seq_per_s": "sequences/s (higher is better)", "gpu_us": "GPU time (us, lower is better)"}
OTHER_COLOUR, BERTFUSE_COLOUR = "#a0aec0", "#2b6cb0"
WIDTH_IN, ROW_IN, PANEL_IN, HEAD_IN = 11.0, 0.3, 0.75, 0.8  # figure size, inches
# Same bytes on every run: clip-path ids hash this salt instead of a random one; text stays
# text (searchable, and what the tests read); a '$' in a name is not mathtext.
RC = {"svg.hashsalt": "bertfuse-charts", "svg.fonttype": "none", "text.parse_math": False,
      "font.size": 9}
METADATA = {"Date": None}  # no timestamp in the file
# The fusion chart's ops: (label, the contrib ops counted under it). GELU: erf (BiasGelu, Gelu)
# or tanh (FastGelu).
FUSED_OPS = (("Attention", ("Attention",)), ("SkipLayerNorm", ("SkipLayerNormalization",)),
             ("GELU", ("BiasGelu", "Gelu", "FastGelu")),
             ("EmbedLayerNorm", ("EmbedLayerNormalization",)))
TOOL_COLOURS = {"bertfuse": BERTFUSE_COLOUR, "ORT bert_tf": OTHER_COLOUR, "ORT bert": "#cbd5e0"}
NEW_TOOL_COLOUR = "#718096"  # a tool not named above


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


def _figure(heights: list[float], title: str):
    """A matplotlib Figure (no pyplot: no display, no global state) with one panel per entry
    of `heights` (their rows), stacked, laid out by matplotlib's constrained layout."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, HEAD_IN + sum(PANEL_IN + ROW_IN * h for h in heights)),
                 layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False,
                        gridspec_kw={"height_ratios": [PANEL_IN / ROW_IN + h for h in heights]})
    fig.suptitle(title, fontweight="bold", fontsize=11, x=0.01, ha="left")
    return fig, [row[0] for row in axes]


def _svg(fig, note: str, missing: list[str]) -> str:
    """The figure as SVG text, with a footnote naming what is left out, if anything."""
    if missing:  # under the panels, where the layout leaves room for it
        fig.supxlabel(textwrap.fill(f"{note}: {'; '.join(missing)}"[:300], 160), fontsize=7,
                      x=0.01, ha="left")
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata=METADATA)
    return out.getvalue()


def _name_bars(bars, prefix: str) -> None:
    """Each bar's SVG id: PREFIX-ROW (PREFIX names its panel, and for --fusion its tool)."""
    for row, bar in enumerate(bars):
        bar.set_gid(f"{prefix}-{row}")


def _panel(ax, heading: str, labels: list[str]) -> None:
    """A panel's heading and its category labels, top to bottom."""
    ax.set_title(heading, loc="left", fontweight="bold", fontsize=10)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()  # the first row at the top
    ax.spines[["top", "right"]].set_visible(False)


def render(panels: dict[str, list[tuple[str, float]]], field: str, title: str,
           missing: list[str]) -> str:
    """The latency/throughput chart's SVG: per workload a panel of bars on its own scale."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig, axes = _figure([len(rows) for rows in panels.values()],
                            f"{title} — {FIELDS.get(field, field)}")
        for k, (ax, (workload, rows)) in enumerate(zip(axes, panels.items())):
            values = [v for _, v in rows]
            colours = [BERTFUSE_COLOUR if variant.startswith("bertfuse") else OTHER_COLOUR
                       for variant, _ in rows]
            bars = ax.barh(range(len(rows)), values, height=0.75, color=colours)
            _name_bars(bars, f"bar-{k}")
            ax.bar_label(bars, labels=[f"{v:,.1f}" for v in values], padding=3)
            _panel(ax, workload, [variant for variant, _ in rows])
            ax.set_xlim(0, (max(values) or 1.0) * 1.12)  # room for the value at the longest
            ax.set_xlabel(FIELDS.get(field, field))
        return _svg(fig, "not timed in this run", missing)


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
    import matplotlib
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    tools = list(dict.fromkeys(t for counts in panels.values() for t in counts))
    top = max((v for counts in panels.values() for ops in counts.values()
               for v in ops.values()), default=0) or 1
    labels = [label for label, _ in FUSED_OPS]
    step = 0.8 / len(tools)  # the bars of one op share 0.8 of its row
    with matplotlib.rc_context(RC):
        fig, axes = _figure([len(FUSED_OPS) * len(tools) / 2] * len(panels),
                            f"{title} — fused ops per model (higher is better)")
        for k, (ax, (model, counts)) in enumerate(zip(axes, panels.items())):
            for i, tool in enumerate(tools):
                if tool not in counts:
                    continue
                values = [counts[tool][label] for label in labels]
                bars = ax.barh([row - 0.4 + step * (i + 0.5) for row in range(len(labels))], values,
                               height=step * 0.9, color=TOOL_COLOURS.get(tool, NEW_TOOL_COLOUR),
                               label=tool)
                _name_bars(bars, f"bar-{k}-{i}")
                ax.bar_label(bars, fontsize=7, padding=2)
            _panel(ax, model, labels)
            ax.set_xlim(0, top * 1.08)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # counts
            ax.set_xlabel("fused ops in the model")
        handles = [Patch(color=TOOL_COLOURS.get(t, NEW_TOOL_COLOUR), label=t) for t in tools]
        fig.legend(handles=handles, loc="outside right upper", frameon=False)
        return _svg(fig, "failed in this run", missing)


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
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("charts: needs matplotlib (pip install matplotlib; it is in bertfuse's `test` "
              "extra)", file=sys.stderr)
        return 2
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
