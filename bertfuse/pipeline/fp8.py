"""`--fp8`: the bertfuse-kernels model with FP8 (e4m3) weights for its dense ops, calibrated
on the parity inputs, with its own accuracy report.

1. calibrate: run the fp16 contrib model (ORT CPU) on the parity inputs with every dense op's
   input X added as a graph output; x_scale = max|X| / 448 per X (padded positions included:
   they go through the same GEMM).
2. rewrite: passes/fp8_weights.py (w_scale = max|W| / 448 per weight), then
   passes/fp8_handoff.py (each FP8 GEMM after a dense op reads that op's e4m3 output).
3. report: the FP8 model run through the NumPy references (ops/evaluator.py) against
   the fp32 reference (TensorFlow for convert, the fp32 model as given for optimize) on the
   same inputs: max and mean |diff| and the cosine per output, stated, not held to the fp16
   limits (NaN or Inf still fails). The references accumulate exactly: what Hopper's fast
   FP8 accumulation adds on the GPU is measured by benchmarks/runtime/fp8_ab.py.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Callable

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from bertfuse.ops.contract import BERTFUSE_DOMAIN, FP8_IR_VERSION
from bertfuse.ops.bertfuse.dense_fp8 import FP8_OF
from bertfuse.ops.evaluator import evaluate
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fp8_plan
from bertfuse.passes.fp8_weights import PLACES, dense_place
from bertfuse.pipeline.fp8_gate import Fp8Gate, UserTerms, measure
from bertfuse.pipeline.parity import Tolerance, compare_output, ort_session, run_onnx

if TYPE_CHECKING:
    from bertfuse.passes.manager import PipelineReport
    from bertfuse.pipeline.parity import OutputParity

ROW_PREFIX = "fp8 vs fp32: "
Fp32Reference = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def dense_inputs(kernels_model: onnx.ModelProto) -> list[str]:
    """The X tensor of every fp16 bertfuse dense op (what FP8 quantises on the fly)."""
    return sorted({n.input[0] for n in kernels_model.graph.node
                   if n.domain == BERTFUSE_DOMAIN and n.op_type in FP8_OF})


def calibrate(contrib: onnx.ModelProto, names: list[str], feeds: dict[str, np.ndarray]
              ) -> dict[str, float]:
    """max |X| per tensor name, from one ORT CPU run of the contrib model on `feeds`."""
    probe = copy.deepcopy(contrib)
    present = {o.name for o in probe.graph.output}
    elem = {v.name: v.type.tensor_type.elem_type for v in probe.graph.value_info}
    for name in names:
        if name not in present:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(
                name, elem.get(name, onnx.TensorProto.FLOAT16), None))
    out = run_onnx(ort_session(probe), feeds)
    return {n: float(np.abs(np.asarray(out[n], np.float32)).max()) for n in names}


def to_fp8(kernels_model: onnx.ModelProto, amax: dict[str, float],
           report: PipelineReport | None = None, places: tuple[str, ...] | None = None
           ) -> onnx.ModelProto:
    """The FP8 plan on the bertfuse-kernels model with the given activation maxima, at
    `places` (None: every dense op); its records join `report`."""
    model, freport = run_passes(kernels_model, fp8_plan(amax, places))
    model.ir_version = max(model.ir_version, FP8_IR_VERSION)
    if report is not None:
        report.join(freport, model)
    return model


def fp8_form(contrib: onnx.ModelProto, kernels_model: onnx.ModelProto,
             feeds: dict[str, np.ndarray], report: PipelineReport | None = None,
             places: tuple[str, ...] | None = None) -> onnx.ModelProto:
    """The `--fp8` form: the bertfuse-kernels model of `contrib` with FP8 weights (at
    `places`; None: all), activation scales calibrated by running `contrib` on `feeds` (the
    parity inputs)."""
    amax = calibrate(contrib, dense_inputs(kernels_model), feeds)
    return to_fp8(kernels_model, amax, report, places)


def accuracy_rows(fp8_model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                  want: dict[str, np.ndarray]) -> tuple[list[OutputParity], list[UserTerms]]:
    """The FP8 model (NumPy references) against the fp32 reference's outputs `want` on
    `feeds`, per output: max and mean |diff| rows (stated, not held to the fp16 limits), and
    the user terms the FP8 gate holds (fp8_gate.py)."""
    got = evaluate(fp8_model, feeds)
    rows = []
    for name, ref in want.items():
        row = compare_output(ROW_PREFIX + name, ref, got.get(name), Tolerance(math.inf))
        if not row.note:
            row.note = (f"FP8: measured, not held to the fp16 limits; cosine "
                        f"{cosine(ref, got[name]):.6f}")
        rows.append(row)
    return rows, measure(want, got, feeds.get("input_mask"))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine of two tensors taken as vectors (1.0: the same direction; for a pooled
    output, how far FP8 turns the embedding a ranker scores)."""
    x, y = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y / norm) if norm > 0 else float("nan")


def choose_places(kernels_model: onnx.ModelProto, amax: dict[str, float],
                  feeds: dict[str, np.ndarray], want: dict[str, np.ndarray], gate: Fp8Gate
                  ) -> tuple[tuple[str, ...], list[dict]]:
    """`--fp8-gemms auto`: the places (PLACES) whose GEMMs go to e4m3 within the gate, and
    each trial made (`places`, `failure`, `margin`). Every place first; else each place alone,
    then those within the gate alone added while it holds, the most GEMM work first (the
    weights' K x N; the least error alone between equals). None within it alone: every place
    (the gate then refuses the model unless forced)."""
    mask = feeds.get("input_mask")
    tried: list[dict] = []
    margins: dict[tuple[str, ...], float] = {}

    def trial(places: tuple[str, ...]) -> bool:
        model = to_fp8(kernels_model, amax, None, places)
        if not any(n.op_type in FP8_OF.values() for n in model.graph.node):
            return False  # no dense op at these places
        got = evaluate(model, feeds)
        terms = measure(want, got, mask)
        failure, margin = gate.failure(terms), gate.margin(terms)
        margins[places] = margin
        tried.append({"places": list(places), "failure": failure,  # strict JSON: no -inf
                      "margin": round(margin, 7) if math.isfinite(margin) else None})
        return not failure

    if trial(PLACES):
        return PLACES, tried
    alone = {p: (trial((p,)), margins.get((p,), -math.inf)) for p in PLACES}
    work = place_weights(kernels_model)  # the most GEMM work in e4m3 first
    order = sorted((p for p in PLACES if alone[p][0]), key=lambda p: (-work[p], -alone[p][1]))
    if not order:
        return PLACES, tried
    chosen = (order[0],)
    for place in order[1:]:
        more = tuple(p for p in PLACES if p in (*chosen, place))  # in the layer's order
        if trial(more):
            chosen = more
    return tuple(p for p in PLACES if p in chosen), tried


def place_weights(kernels_model: onnx.ModelProto) -> dict[str, int]:
    """Per place, the K x N of its dense ops' weights (what an FP8 GEMM there speeds up)."""
    from_graph = gs.import_onnx(kernels_model)
    work = dict.fromkeys(PLACES, 0)
    for node in from_graph.nodes:
        place = dense_place(node) if node.domain == BERTFUSE_DOMAIN else None
        if place in work and isinstance(node.inputs[1], gs.Constant):
            work[place] += int(np.prod(node.inputs[1].values.shape))
    return work

