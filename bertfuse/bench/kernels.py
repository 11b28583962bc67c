"""bertfuse's own CUDA ops (domain ai.bertfuse) in `bertfuse bench`, beside the ORT-contrib form.

    bertfuse16.onnx (contrib ops) --bertfuse_kernels pass--> kernels16.onnx (ai.bertfuse ops)
    op library: `bertfuse kernels build` -> cache (custom_ops/library.py) -> found by the
    runtime, which registers it on its sessions

The rewrite is the one `--kernels bertfuse` makes (kernels_form.to_bertfuse_kernels), applied
to the same fused fp16 model the contrib rows run, so both forms see the same weights and
inputs and are compared against the same ORT raw fp32 outputs. The library is looked up once,
before any workload; where it or the rewrite is missing, the rows say why and the rest runs.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

KERNELS_FORMS = ("ort", "both")  # bench --kernels: the contrib form alone, or both forms
# The runtime rows of the bertfuse-kernels form: (label, Session options). The first is the
# runtime as shipped (mask variants as the runtime picks them: key lengths for right padding).
KERNELS_ROWS: list[tuple[str, dict]] = [
    ("bertfuse fp16 runtime, bertfuse kernels", {}),
    ("bertfuse fp16 runtime, bertfuse kernels, raw mask only", {"mask_variants": False}),
]
CONTRIB_DEFAULT = "bertfuse fp16 runtime (arena + CUDA graph)"


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
    from pathlib import Path

    from bertfuse.custom_ops import library as lib

    try:
        path = lib.locate(sm=sm, root=Path(root) if root else None)
        return KernelsSetup(str(path), info=lib.library_info(path))
    except lib.KernelLibraryError as exc:
        return KernelsSetup(reason=str(exc).splitlines()[0])


def kernels_model(fused16: str, workdir: str) -> tuple[str | None, str]:
    """The fused fp16 model rewritten into ai.bertfuse ops, saved under workdir: (path, note
    with the op census and what stayed in contrib ops), or (None, why not)."""
    import onnx

    from bertfuse.custom_ops import BERTFUSE_DOMAIN
    from bertfuse.kernels_form import kernels_misses, to_bertfuse_kernels
    from bertfuse.passes.manager import PipelineReport

    report = PipelineReport()
    try:
        model = to_bertfuse_kernels(onnx.load(fused16), report)
    except Exception as exc:  # noqa: BLE001 (the pass failing is a row note, not the run's end)
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return None, f"the bertfuse kernels pass failed: {first}"
    ops = Counter(n.op_type for n in model.graph.node if n.domain == BERTFUSE_DOMAIN)
    misses = kernels_misses(report)
    if not ops:
        why = misses[0] if misses else "no fused contrib op to rewrite"
        return None, f"the bertfuse kernels pass converted nothing ({why})"
    path = os.path.join(workdir, "kernels16.onnx")
    onnx.save(model, path)
    census = ", ".join(f"{op} {n}" for op, n in sorted(ops.items()))
    note = f"ai.bertfuse: {census}"
    if misses:
        note += f"; {len(misses)} left in contrib ops (first: {misses[0]})"
    return path, note


def runtime_rows(kernels: bool) -> list[tuple[str, str, dict]]:
    """The runtime rows bench builds and times together: (label, model key, Session
    options); model key 'bertfuse16' (contrib form) or 'kernels16' (bertfuse kernels)."""
    rows = [("bertfuse fp16 runtime, raw 2-D mask only", {"mask_variants": False}),
            (CONTRIB_DEFAULT, {}),
            ("bertfuse fp16 runtime, [B] key lengths (cuDNN attention)",
             {"right_padded": "keylen"}),
            ("bertfuse fp16 runtime, [3B+2] mask (cutlass attention)",
             {"right_padded": "keyseq"}),
            ("bertfuse fp16 runtime, synchronous pageable copy",
             {"own_stream": False, "pinned": False}),
            ("bertfuse fp16 runtime, packed path", {"packed": True})]
    out = [(label, "bertfuse16", kw) for label, kw in rows]
    if kernels:
        out += [(label, "kernels16", kw) for label, kw in KERNELS_ROWS]
    return out


def plan_rows(kernels: KernelsSetup | None, paths: dict[str, str]
              ) -> tuple[list[tuple[str, str, dict]], str, list[tuple[str, str]]]:
    """The runtime rows one workload runs, after writing paths['kernels16'] where the library
    is there and the pass converts something: (rows, note on the bertfuse ops, [(label,
    'not run: why')] for the kernels rows that cannot run)."""
    rows = runtime_rows(kernels is not None)
    if kernels is None:
        return rows, "", []
    path, note = (None, kernels.reason) if kernels.reason else \
        kernels_model(paths["bertfuse16"], os.path.dirname(paths["bertfuse16"]))
    if path:
        paths["kernels16"] = path
        return rows, note, []
    return ([row for row in rows if row[1] != "kernels16"], note,
            [(label, f"not run: {note}") for label, key, _ in rows if key == "kernels16"])


def format_comparison(results: list) -> str:
    """The two forms side by side, one line per workload and kernels row: p50, p99, seq/s,
    GPU time and kernel count (CUPTI), parity vs ORT raw fp32, and the ratios to the contrib
    form's runtime (GPU time and p50)."""
    lines = ["| workload | variant | p50 (us) | p99 (us) | seq/s | GPU (us) | kernels | "
             "GPU x contrib | p50 x contrib | max diff | mean diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    labels = [CONTRIB_DEFAULT] + [label for label, _ in KERNELS_ROWS]
    base = {r.workload: r for r in results if r.variant == CONTRIB_DEFAULT}
    for r in results:
        if r.variant not in labels:
            continue
        if r.note.startswith("not run") or r.note.startswith("failed"):
            lines.append(f"| {r.workload} | {r.variant} | {r.note} |")
            continue
        b = base.get(r.workload)
        gpu = f"{r.gpu_us:.1f}" if r.gpu_us is not None else ""
        gpu_x = (f"{r.gpu_us / b.gpu_us:.2f}" if b is not None and r.gpu_us and b.gpu_us
                 else "")
        p50_x = f"{r.p50_us / b.p50_us:.2f}" if b is not None else ""
        lines.append(f"| {r.workload} | {r.variant} | {r.p50_us:.1f} | {r.p99_us:.1f} | "
                     f"{r.seq_per_s:,.0f} | {gpu} | {r.kernels if r.kernels is not None else ''}"
                     f" | {gpu_x} | {p50_x} | {r.max_diff:.2e} | {r.mean_diff:.2e} |")
    return "\n".join(lines)
