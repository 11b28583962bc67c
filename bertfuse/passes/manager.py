"""The pass manager: runs a plan (plans.py), cleans up and toposorts after every pass, keeps a
census, and the report a pipeline's plans add up to (PipelineReport.join)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import onnx
import onnx_graphsurgeon as gs

from bertfuse.ops.contract import MS_DOMAIN, MS_OPSET
from bertfuse.inspect.encoder_table import EncoderTable, encoder_table
from bertfuse.passes.base import Diagnostic, Pass, census
from bertfuse.passes.plans import fusion_plan
from bertfuse._version import __version__

# gs logs every folded tensor at INFO.
gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR
logging.getLogger("onnx_graphsurgeon").setLevel(logging.ERROR)


@dataclass
class PassRecord:
    name: str
    seconds: float
    rewrites: int
    nodes_before: int
    nodes_after: int
    delta: dict[str, int]  # op -> change in count


@dataclass
class PipelineReport:
    records: list[PassRecord] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    census_before: Counter = field(default_factory=Counter)
    census_after: Counter = field(default_factory=Counter)
    table: "EncoderTable | None" = None

    @property
    def nodes_before(self) -> int:
        return sum(self.census_before.values())

    @property
    def nodes_after(self) -> int:
        return sum(self.census_after.values())

    def join(self, more: PipelineReport, model: onnx.ModelProto) -> None:
        """Appends a later plan's run (`more`) to this report, which then describes `model`,
        that run's output (census, encoder table over every diagnostic)."""
        self.records.extend(more.records)
        self.diagnostics.extend(more.diagnostics)
        self.census_after = more.census_after
        self.table = encoder_table([n.op_type for n in model.graph.node], self.diagnostics)

    def to_json(self) -> dict:
        return {
            "passes": [r.__dict__ for r in self.records],
            "ops_before": dict(sorted(self.census_before.items())),
            "ops_after": dict(sorted(self.census_after.items())),
            "diagnostics": [d.__dict__ for d in self.diagnostics],
            "encoder": self.table.to_json() if self.table else None,
        }


def run_passes(model: onnx.ModelProto, passes: Sequence[Pass] | None = None,
               progress: Callable[[str], None] | None = None) -> tuple[onnx.ModelProto, PipelineReport]:
    """Runs the passes (a plan; the fusion plan when None) over a model; returns the rewritten
    model and what each pass did."""
    passes = list(passes) if passes is not None else fusion_plan("fp32")
    model = _with_shapes(model)
    graph = gs.import_onnx(model)
    report = PipelineReport(census_before=census(graph))
    for p in passes:
        if progress:
            progress(p.name)
        before = census(graph)
        start = time.perf_counter()
        result = p(graph)
        graph.cleanup(remove_unused_graph_inputs=False).toposort()
        after = census(graph)
        delta = {op: after[op] - before[op] for op in sorted(set(before) | set(after))
                 if after[op] != before[op]}
        report.records.append(PassRecord(p.name, round(time.perf_counter() - start, 3),
                                         result.rewrites, sum(before.values()),
                                         sum(after.values()), delta))
        # A pass that runs again (cleanup) finds the same misses again: each is kept once.
        report.diagnostics.extend(d for d in result.diagnostics
                                  if d.fused or d not in report.diagnostics)
    report.census_after = census(graph)
    out = gs.export_onnx(graph, do_type_check=False)
    out.ir_version = model.ir_version
    del out.metadata_props[:]
    out.metadata_props.extend(model.metadata_props)

    out.producer_name, out.producer_version = "bertfuse", __version__
    _ensure_opsets(out, model)
    report.table = encoder_table([n.op_type for n in out.graph.node], report.diagnostics)
    return out, report


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference gives passes dtypes and static dims; a model it cannot infer still runs.

    Inference needs the initializers' dims, not their bytes: the large ones are set aside
    while it runs on the light model, its value_info is copied back, and the bytes return.
    (Inferring on the full model would serialise and copy every weight.)"""
    stash = {}
    for init in model.graph.initializer:
        if len(init.raw_data) > 4096:
            stash[init.name] = init.raw_data
            init.ClearField("raw_data")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        for part in ("value_info", "output"):
            target = getattr(model.graph, part)
            del target[:]
            target.extend(getattr(inferred.graph, part))
        del inferred
    except Exception:
        pass  # a model onnx cannot infer still goes through the passes, with fewer shapes
    finally:
        for init in model.graph.initializer:
            if init.name in stash:
                init.raw_data = stash.pop(init.name)
    return model


def _ensure_opsets(out: onnx.ModelProto, original: onnx.ModelProto) -> None:
    have = {o.domain for o in out.opset_import}
    for o in original.opset_import:
        if o.domain not in have:
            out.opset_import.append(o)
    if any(n.domain == MS_DOMAIN for n in out.graph.node) and MS_DOMAIN not in \
            {o.domain for o in out.opset_import}:
        out.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, MS_OPSET))
