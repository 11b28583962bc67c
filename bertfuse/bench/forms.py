"""bertfuse's own CUDA ops (domain ai.bertfuse) in `bertfuse bench`, beside the ORT-contrib form.

    bertfuse16.onnx (contrib ops) --bertfuse_kernels pass--> kernels16.onnx (ai.bertfuse ops)
    op library: `bertfuse kernels build` -> cache (kernels/library.py) -> found by the
    runtime, which registers it on its sessions

The rewrite is the one `--ops bertfuse` makes (pipeline.lowering.to_bertfuse_kernels), applied
to the same fused fp16 model the contrib rows run, so both forms see the same weights and
inputs and are compared against the same ORT raw fp32 outputs. The library is looked up once,
before any workload; where it or the rewrite is missing, the rows say why and the rest runs.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import onnx
from dataclasses import dataclass, field
from pathlib import Path

from bertfuse.bench.peers import PEER_ROWS, best_peer
from bertfuse.kernels import library as lib
from bertfuse.ops import BERTFUSE_DOMAIN
from bertfuse.passes.cleanup import Cleanup
from bertfuse.passes.fast_gelu import FastGeluApproximation
from bertfuse.passes.manager import PipelineReport, run_passes
from bertfuse.pipeline.fp8 import fp8_form
from bertfuse.pipeline.lowering import kernels_misses, model_feeds, to_bertfuse_kernels
from bertfuse.pipeline.options import ConvertOptions

FORMS = ("contrib", "both")  # bench --forms: the contrib form alone, or both forms
# The runtime rows of the bertfuse-kernels form: (label, model key, Session options). The
# first is the runtime as shipped (mask variants as it picks them: key lengths for right
# padding); the FP8 row has the same model with FP8 (e4m3) weights in its GEMMs; the last,
# the model `--gelu-approximation` writes (its exact GELUs in the tanh form).
KERNELS_ROWS: list[tuple[str, str, dict]] = [
    ("bertfuse fp16 runtime, bertfuse kernels", "kernels16", {}),
    ("bertfuse fp16 runtime, bertfuse kernels, raw mask only", "kernels16",
     {"mask_variants": False}),
    ("bertfuse runtime, bertfuse kernels, FP8 weights", "kernels_fp8", {}),
    ("bertfuse fp16 runtime, bertfuse kernels, --gelu-approximation", "kernels16_gelu", {}),
]
# Each kernels model's first row, whose note says what the model's rewrite made.
FIRST_ROW = {key: label for label, key, _ in reversed(KERNELS_ROWS)}
CONTRIB_DEFAULT = "bertfuse fp16 runtime (arena + CUDA graph)"
CONTRIB_RAW_ONLY = "bertfuse fp16 runtime, raw 2-D mask only"
AUTO_ROW = "bertfuse fp16 runtime, kernels=auto (contrib file, chosen at load)"


@dataclass
class KernelsSetup:
    """The op library as found before the run: its path and info, or why there is none."""

    library: str | None = None
    reason: str = ""
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"library": self.library, "reason": self.reason, "info": self.info}


def find_library(sm: int | None = None, root: str | None = None) -> KernelsSetup:
    """The cached library the runtime will register (library.locate), loaded once with ctypes
    to read its build info; else the one-line reason (no GPU, not built, cannot load)."""
    try:
        path = lib.locate(sm=sm, root=Path(root) if root else None)
        return KernelsSetup(str(path), info=lib.library_info(path))
    except lib.KernelLibraryError as exc:
        return KernelsSetup(reason=str(exc).splitlines()[0])


def kernels_model(fused16: str, workdir: str) -> tuple[str | None, str]:
    """The fused fp16 model rewritten into ai.bertfuse ops, saved under workdir: (path, note
    with the op census and what stayed in contrib ops), or (None, why not)."""
    return _rewrite(lambda report: to_bertfuse_kernels(onnx.load(fused16), report),
                    os.path.join(workdir, "kernels16.onnx"), "the bertfuse kernels pass")


def fp8_model(fused16: str, kernels16: str, workdir: str) -> tuple[str | None, str]:
    """The bertfuse-kernels model with FP8 weights, as `convert --ops bertfuse --fp8`
    makes it (pipeline.fp8.fp8_form): activation scales calibrated on convert's parity inputs
    (its default batch, seq and seed), not on the benchmark's request. (path, note) or (None,
    why not)."""
    def rewrite(report) -> onnx.ModelProto:
        contrib = onnx.load(fused16)
        opts = ConvertOptions()
        feeds = model_feeds(contrib, opts.batch, opts.seq, opts.seed)
        return fp8_form(contrib, onnx.load(kernels16), feeds, report)

    return _rewrite(rewrite, os.path.join(workdir, "kernels_fp8.onnx"), "the FP8 rewrite",
                    lambda op: op.endswith("Fp8"))


def gelu_approximation_model(fused16: str, workdir: str) -> tuple[str | None, str]:
    """The fused fp16 model with `--gelu-approximation` (its exact GELUs as FastGelu, the pass
    fusion_plan adds), rewritten into ai.bertfuse ops: (path, note) or (None, why not; also
    where the model has no exact GELU, so the row would repeat the first)."""
    def rewrite(report) -> onnx.ModelProto:
        contrib, approx = run_passes(onnx.load(fused16), [FastGeluApproximation(), Cleanup()])
        if not any(d.fused for d in approx.diagnostics if d.component == "fast_gelu"):
            raise ValueError("the model has no exact GELU to approximate")
        return to_bertfuse_kernels(contrib, report)

    return _rewrite(rewrite, os.path.join(workdir, "kernels16_gelu.onnx"),
                    "the --gelu-approximation rewrite")


def _rewrite(make, path: str, what: str, counted=lambda op: True) -> tuple[str | None, str]:
    """Runs make(report) -> model and saves it at path: (path, 'ai.bertfuse: <census>[;
    misses]'), or (None, why) when it fails or converts nothing it counts."""
    report = PipelineReport()
    try:
        model = make(report)
    except Exception as exc:  # noqa: BLE001 (a failed rewrite is a row note, not the run's end)
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return None, f"{what} failed: {first}"
    ops = Counter(n.op_type for n in model.graph.node if n.domain == BERTFUSE_DOMAIN)
    misses = kernels_misses(report)
    if not any(counted(op) for op in ops):
        why = misses[0] if misses else "nothing to rewrite"
        return None, f"{what} converted nothing ({why})"
    onnx.save(model, path)
    note = "ai.bertfuse: " + ", ".join(f"{op} {n}" for op, n in sorted(ops.items()))
    if misses:
        note += f"; {len(misses)} left as they were (first: {misses[0]})"
    return path, note


def runtime_rows(kernels: bool, paired: bool = False) -> list[tuple[str, str, dict]]:
    """The runtime rows bench builds and times together: (label, model key, Session
    options); model key 'bertfuse16' (contrib form), else a KERNELS_ROWS model.
    paired: of the contrib form only the rows the kernels form has too (the runtime as
    shipped, raw mask only)."""
    rows = [(CONTRIB_RAW_ONLY, {"mask_variants": False}),
            (CONTRIB_DEFAULT, {}),
            ("bertfuse fp16 runtime, [B] key lengths (cuDNN attention)",
             {"right_padded": "keylen"}),
            ("bertfuse fp16 runtime, [3B+2] mask (cutlass attention)",
             {"right_padded": "keyseq"}),
            ("bertfuse fp16 runtime, synchronous pageable copy",
             {"own_stream": False, "pinned": False}),
            ("bertfuse fp16 runtime, packed path", {"packed": True})]
    if paired:
        rows = [(label, kw) for label, kw in rows if label in (CONTRIB_DEFAULT, CONTRIB_RAW_ONLY)]
    # The contrib rows hold their form (kernels='ort'); the auto row is the runtime's default
    # choice on the same contrib file, lowered at load where the library and shapes allow.
    contrib = [(label, "bertfuse16", {"kernels": "ort", **kw}) for label, kw in rows]
    auto = [(AUTO_ROW, "bertfuse16", {"kernels": "auto"})] if kernels else []
    return contrib + auto + (KERNELS_ROWS if kernels else [])


def plan_rows(kernels: KernelsSetup | None, paths: dict[str, str], paired: bool = False
              ) -> tuple[list[tuple[str, str, dict]], dict[str, str], list[tuple[str, str]]]:
    """The runtime rows one workload runs, after writing the models of the kernels rows into
    paths ('kernels16', 'kernels_fp8', 'kernels16_gelu'; their notes under '<key>_note', so
    that another workload of the same model reuses them) where the library is there and the
    rewrites convert something: (rows, {model key: note on its bertfuse ops}, [(label, 'not
    run: why')] for the kernels rows that cannot run). paired: as runtime_rows."""
    rows = runtime_rows(kernels is not None, paired)
    if kernels is None:
        return rows, {}, []
    workdir = os.path.dirname(paths["bertfuse16"])
    makers = {"kernels16": lambda: kernels_model(paths["bertfuse16"], workdir),
              "kernels_fp8": lambda: fp8_model(paths["bertfuse16"], paths["kernels16"], workdir),
              "kernels16_gelu": lambda: gelu_approximation_model(paths["bertfuse16"], workdir)}
    notes: dict[str, str] = {}
    for key, make in makers.items():
        if kernels.reason:
            notes[key] = kernels.reason
        elif key != "kernels16" and "kernels16" not in paths:
            notes[key] = notes["kernels16"]  # no bertfuse-kernels model to start from
        else:
            if f"{key}_note" not in paths:
                path, paths[f"{key}_note"] = make()
                if path:
                    paths[key] = path
            notes[key] = paths[f"{key}_note"]
    skipped = [(label, f"not run: {notes[key]}") for label, key, _ in rows
               if key != "bertfuse16" and key not in paths]
    return [row for row in rows if row[1] in paths], notes, skipped


def format_comparison(results: list) -> str:
    """The two forms side by side, one line per workload and kernels row: p50, p99, seq/s,
    GPU time (summed and busy) and kernel count (CUPTI), parity vs ORT raw fp32, and the ratios
    to the contrib form's runtime (GPU time and p50) and to the best peer's p50 (peers.py), the
    peers too."""
    lines = ["| workload | variant | p50 (us) | p99 (us) | seq/s | GPU (us) | GPU busy (us) | "
             "kernels | GPU x contrib | p50 x contrib | p50 x best peer | max diff | mean diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    labels = [CONTRIB_DEFAULT, AUTO_ROW] + [label for label, _, _ in KERNELS_ROWS] + \
        list(PEER_ROWS)
    base = {r.workload: r for r in results if r.variant == CONTRIB_DEFAULT}
    for r in results:
        if r.variant not in labels:
            continue
        if r.note.startswith("not run") or r.note.startswith("failed"):
            lines.append(f"| {r.workload} | {r.variant} | {r.note} |")
            continue
        b = base.get(r.workload)
        gpu = f"{r.gpu_us:.1f}" if r.gpu_us is not None else ""
        busy = f"{r.gpu_busy_us:.1f}" if r.gpu_busy_us is not None else ""
        gpu_x = (f"{r.gpu_us / b.gpu_us:.2f}" if b is not None and r.gpu_us and b.gpu_us
                 else "")
        p50_x = f"{r.p50_us / b.p50_us:.2f}" if b is not None else ""
        peer = best_peer(results, r.workload)
        peer_x = f"{r.p50_us / peer:.2f}" if np.isfinite(peer) else ""
        lines.append(f"| {r.workload} | {r.variant} | {r.p50_us:.1f} | {r.p99_us:.1f} | "
                     f"{r.seq_per_s:,.0f} | {gpu} | {busy} | {r.kernels if r.kernels is not None else ''}"
                     f" | {gpu_x} | {p50_x} | {peer_x} | {r.max_diff:.2e} | {r.mean_diff:.2e} |")
    return "\n".join(lines)
