"""The gate between a checked model and its file: --strict (every layer fused), then parity
(unless forced), then the write; and the one-line verdict a failed parity check prints."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from bertfuse.errors import FusionIncomplete, ParityError
from bertfuse.io.model import save_model
from bertfuse.pipeline.mask import tf_moved_on_segments

if TYPE_CHECKING:
    import onnx

    from bertfuse.pipeline.report import RunReport
    from bertfuse.pipeline.parity import ParityReport


def write_gated(model: onnx.ModelProto, out_path: str | None, report: RunReport, force: bool,
                status: Callable[[str], None] | None, strict: bool = False,
                external_data: bool = False) -> None:
    """The gate (--strict, parity), then the file; out_path None: the gate alone."""
    table = report.passes.table if report.passes else None
    what, force_hint = (f"{out_path}: not written", "use --force to write anyway") \
        if out_path is not None else ("refused", "force=True returns it anyway")
    if strict and table is not None and not table.fully_fused:
        raise FusionIncomplete(f"{what} (--strict): " + "; ".join(table.unfused()), report)
    if report.parity is not None and not report.parity.ok and not force:
        raise ParityError(f"{what}: parity check failed, {parity_failure(report.parity)} "
                          f"({force_hint})", report)
    if report.fp8 and report.fp8.get("failure") and not force:
        raise ParityError(f"{what}: FP8 accuracy below its gate, {report.fp8['failure']} "
                          f"({force_hint})", report)
    if out_path is None:
        return
    with report.stage("write", status):
        save_model(model, out_path, external_data)
    report.written = True


def parity_failure(parity: ParityReport) -> str:
    """The worst failing row, and a hint that fits it and the source kind."""
    failed = [o for o in parity.outputs if not o.ok]
    worst = max(failed, key=lambda o: (not math.isfinite(o.max_abs), o.nonfinite,
                                       o.max_abs if math.isfinite(o.max_abs) else 0.0,
                                       not o.name.startswith("mask invariance")))
    what = worst.note if not math.isfinite(worst.max_abs) else \
        f"max |diff| {worst.max_abs:.3g} exceeds tolerance {parity.tolerance.atol:g}"
    hint = ""
    if not math.isfinite(worst.max_abs):
        pass  # NaN/Inf or a missing output: the note says it all
    elif tf_moved_on_segments(worst):
        hint = (" (padded tokens change TF's own outputs: bertfuse rebuilt this checkpoint's "
                "graph wrongly, please report it)" if parity.source_kind == "checkpoint" else
                " (padded tokens change TF's own outputs: is the --inputs mapping right?)")
    elif worst.name.startswith("mask invariance"):
        hint = (" (the ONNX model lets padded tokens change the outputs and TF does not: a "
                "conversion bug, please report it; --no-fuse writes the unfused graph)")
    return f"{worst.name} {what}{hint}"
