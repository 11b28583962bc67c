"""The bertfuse-kernels forms in the padded-vs-packed part of `bertfuse bench` (`--forms both`).

    bertfuse16.onnx --bertfuse_kernels pass--> kernels16.onnx (padded, ai.bertfuse ops)
        --packing_kernels pass--> device-packed model (PackTokens / PackedBertAttention /
                                  UnpackTokens: the host packs nothing)

Beside the contrib form's padded and packed sessions, the fp16 rows time `kpadded` (Session of
kernels16) and `kpacked` (PackedSession of the device-packed model) on the same requests and
under the same load, so "device-packed vs padded, bertfuse kernels" and "vs the contrib form's
padded" read off one run. Where the library or a rewrite is missing, the rows say why.
"""

from __future__ import annotations

import os
from typing import Any

import onnx

from bertfuse.bench.forms import kernels_model
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import packing_plan
from bertfuse.runtime.packed import PackedSession
from bertfuse.runtime.session import Session

KINDS = ("kpadded", "kpacked")  # row keys: padded and device-packed, bertfuse kernels
LABELS = {"kpadded": "padded, bertfuse kernels", "kpacked": "device-packed, bertfuse kernels"}


def kernels_forms(kernels: Any, paths: dict[str, str]) -> tuple[dict[str, Any], str]:
    """({'kpadded': path, 'kpacked': model}, '') to time, or ({}, 'not run: why'); ({}, '')
    for `--forms contrib` (kernels None: no kernels rows at all). `kernels` is the run's
    bench.forms.KernelsSetup; kernels16 is made once per model and kept in `paths`."""
    if kernels is None:
        return {}, ""
    if not kernels.library:
        return {}, f"not run: {kernels.reason or 'no bertfuse op library'}"
    if "kernels16" not in paths:
        if "kernels16_note" not in paths:
            path, paths["kernels16_note"] = kernels_model(
                paths["bertfuse16"], os.path.dirname(paths["bertfuse16"]))
            if path:
                paths["kernels16"] = path
        if "kernels16" not in paths:
            return {}, f"not run: {paths['kernels16_note']}"
    try:
        packed, report = run_passes(onnx.load(paths["kernels16"]), packing_plan(on_kernels=True))
    except Exception as exc:  # noqa: BLE001 (a failed rewrite is a row note, not the run's end)
        return {}, f"not run: the packing_kernels pass failed ({str(exc).splitlines()[0][:160]})"
    misses = [d for d in report.diagnostics if not d.fused]
    if misses:
        return {}, f"not run: cannot pack on the device ({misses[0].reason})"
    return {"kpadded": paths["kernels16"], "kpacked": packed}, ""


def form_options(kw: dict) -> dict:
    """The session options of the kernels forms: the contrib rows' `kw` (which hold their form
    with kernels='ort'), with kernels='bertfuse': both forms are written with ai.bertfuse ops,
    which the runtime refuses to open under 'ort' and runs as written under 'bertfuse'."""
    return {**kw, "kernels": "bertfuse"}


def makers(forms: dict[str, Any], kw: dict) -> dict[str, Any]:
    """Session factories of the kernels forms, by row key (none when `forms` is empty); `kw`
    as the contrib rows get them (form_options)."""
    if not forms:
        return {}
    kw = form_options(kw)
    return {"kpadded": lambda: Session(forms["kpadded"], **kw),
            "kpacked": lambda: PackedSession(forms["kpacked"], **kw)}


def open_sessions(forms: dict[str, Any], kw: dict, note: str
                  ) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(makers, one session of each, note): none and 'failed: why' where a session cannot be
    made (the contrib rows still run)."""
    made = makers(forms, kw)
    try:
        return made, {k: make() for k, make in made.items()}, note
    except Exception as exc:  # noqa: BLE001 (a row note, not the run's end)
        return {}, {}, f"failed: {(str(exc).splitlines() or [type(exc).__name__])[0][:200]}"


def add_ratios(row: dict[str, Any], suffix: str, higher_better: bool) -> None:
    """kpacked against kpadded and against the contrib form's padded, from `<kind><suffix>`
    (p50 in us: lower is better; seq/s: higher is better)."""
    def ratio(a: str, b: str) -> float | None:
        x, y = row.get(f"{a}{suffix}"), row.get(f"{b}{suffix}")
        if not x or not y:
            return None
        return round(x / y if higher_better else y / x, 2)

    row["kpacked_vs_kpadded"] = ratio("kpacked", "kpadded")
    row["kpacked_vs_padded"] = ratio("kpacked", "padded")


def format_tables(result: dict) -> str:
    """Padded vs device-packed on bertfuse kernels: per request (p50) and under load (seq/s);
    empty when no row has the kernels forms or a note on them."""
    rows = [r for r in result.get("rows", []) if "kernels" in r or "kpacked_p50_us" in r]
    load = [r for r in result.get("load", []) if "kernels" in r or "kpacked_seq_per_s" in r]
    if not rows and not load:
        return ""
    return "\n".join(_table(
        rows, ("mix", "fill"), "kpacked_p50_us",
        ["contrib padded p50", "kernels padded p50", "kernels device-packed p50"],
        lambda r: [f"{r['padded_p50_us']:.1f}", f"{r['kpadded_p50_us']:.1f}",
                   f"{r['kpacked_p50_us']:.1f}"],
        "max diff vs contrib padded", lambda r: f"{r.get('kpacked_max_diff', float('nan')):.2e}")
        + [""] + _table(
        load, ("streams",), "kpacked_seq_per_s",
        ["contrib padded seq/s", "kernels padded seq/s",
         "kernels device-packed seq/s (p50/p99 us)"],
        lambda r: [f"{r['padded_seq_per_s']:,}", f"{r['kpadded_seq_per_s']:,}",
                   f"{r['kpacked_seq_per_s']:,} ({r['kpacked_p50_us']:.0f}/"
                   f"{r['kpacked_p99_us']:.0f})"]))


def _table(rows: list[dict], keys: tuple[str, ...], needed: str, heads: list[str], cells,
           last_head: str = "", last=None) -> list[str]:
    """Markdown lines: workload, `keys`, the `heads` cells, the two ratios (and `last`); a row
    without `needed` shows its note (why not run) or error instead."""
    heads = ["workload", *keys, *heads, "device-packed / kernels padded",
             "device-packed / contrib padded"] + ([last_head] if last else [])
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        head = "| " + " | ".join(str(r[k]) for k in ("workload", *keys)) + " |"
        if needed not in r:
            lines.append(f"{head} {r.get('kernels') or r.get('error', '')} |")
            continue
        more = cells(r) + [str(r["kpacked_vs_kpadded"]), str(r["kpacked_vs_padded"])]
        lines.append(f"{head} " + " | ".join(more + ([last(r)] if last else [])) + " |")
    return lines


def target_line(result: dict, workload: str = "uniform [8,64] b20 s64", streams: int = 4,
                target: float = 1.0) -> str:
    """The issue's packed target: device-packed on bertfuse kernels under `streams` streams,
    against padded (kernels form and contrib form), one line."""
    row = next((r for r in result.get("load", []) if r.get("workload") == workload
                and r.get("streams") == streams), None)
    name = f"packed {workload} under {streams} streams"
    if row is None:
        return f"{name}: no row"
    if "kpacked_seq_per_s" not in row:
        return f"{name}: no number ({row.get('kernels') or row.get('error', 'no kernels rows')})"
    got = row["kpacked_vs_kpadded"]
    met = got is not None and got >= target
    return (f"{name}: device-packed {row['kpacked_seq_per_s']:,} seq/s, kernels padded "
            f"{row['kpadded_seq_per_s']:,}, contrib padded {row['padded_seq_per_s']:,}: "
            f"{got}x kernels padded, {row['kpacked_vs_padded']}x contrib padded (target >= "
            f"{target}x padded: {'met' if met else 'MISSED'})")
