"""`--ops bertfuse`: the verified ORT-contrib model rewritten into ai.bertfuse ops, and the
check that the rewrite changed nothing.

ONNX Runtime's CPU EP has no kernel for the ai.bertfuse ops (they are CUDA-only), so a CPU
host cannot run the emitted model. The gate is therefore two links of one chain:

1. the contrib form (the same math, op for op) is checked against TensorFlow as always
   (ORT CPU, convert's parity gate);
2. the bertfuse form is checked equal to the contrib form: both run in onnx's
   ReferenceEvaluator, every custom node (com.microsoft and ai.bertfuse alike) through its
   NumPy reference (ops/evaluator.py), on random padded inputs (padding at the end,
   in the middle and at the start of rows), within the fp16 tolerances.

The CUDA kernels themselves are checked against the same references on the GPU
(`bertfuse kernels check`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
import onnx

from bertfuse.errors import FusionIncomplete, ParityError
from bertfuse.ops.bertfuse.embed_layernorm import EMBEDDING_OPS
from bertfuse.io.inputs import random_inputs
from bertfuse.io.model import check_model
from bertfuse.ops import BERTFUSE_DOMAIN
from bertfuse.ops.bertfuse.dense_fp8 import CONTRACTS as FP8_CONTRACTS
from bertfuse.ops.evaluator import evaluate
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import lowering_plan
from bertfuse.passes.fp8_weights import PLACES
from bertfuse.pipeline.fp8 import (accuracy_rows, calibrate, choose_places, dense_inputs,
                                   to_fp8)
from bertfuse.pipeline.fp8_gate import Fp8Gate
from bertfuse.pipeline.gate import parity_failure
from bertfuse.pipeline.parity import OutputParity, ParityReport, compare_output, tolerance_for

if TYPE_CHECKING:
    from bertfuse.pipeline.fp8 import Fp32Reference
    from bertfuse.passes.manager import PipelineReport
    from bertfuse.pipeline.parity import OutputParity, Tolerance

ROW_PREFIX = "bertfuse ops vs contrib form: "


def to_bertfuse_kernels(contrib: onnx.ModelProto, report: PipelineReport | None = None
                        ) -> onnx.ModelProto:
    """The contrib model with its encoder in ai.bertfuse ops; the plan's records join
    `report` (census, encoder table and diagnostics then describe the emitted model)."""
    model, kreport = run_passes(contrib, lowering_plan())
    if report is not None:
        report.join(kreport, model)
    return model


def kernels_misses(report: PipelineReport | None) -> list[str]:
    """What the bertfuse kernels pass left in contrib ops, one line each."""
    if report is None:
        return []
    return [str(d) for d in report.diagnostics
            if not d.fused and (d.component.startswith("kernels_") or
                                d.component == "fp8_weights")]


def model_feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int | None
                ) -> dict[str, np.ndarray]:
    """Random padded inputs for a BERT model's graph inputs, by role (mask, segment/type,
    else ids), in their dtypes; vocab, positions and token types read off the embedding
    tables of the embedding op (ids stay in range)."""
    vocab, types, positions = 100, 2, seq
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type in EMBEDDING_OPS:
            dims = [inits.get(name, [0])[0] if name else 0 for name in list(n.input)[2:5]]
            vocab, positions = dims[0] or vocab, dims[1] or positions
            types = dims[2] if len(dims) > 2 and dims[2] else 1
            break
    # a multiple-choice model's inputs are [batch, choices, seq]: 2 choices of each row
    choices = 2 if any(len(i.type.tensor_type.shape.dim) == 3 for i in model.graph.input) else 0
    base = random_inputs(batch * (choices or 1), min(seq, positions), vocab, types, seed=seed,
                         pad_anywhere=True)
    if choices:
        base = {k: v.reshape(batch, choices, -1) for k, v in base.items()}
    feeds = {}
    for i in model.graph.input:
        low = i.name.lower()
        role = ("input_mask" if "mask" in low else
                "segment_ids" if "segment" in low or "type" in low else "input_ids")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        feeds[i.name] = base[role].astype(dtype)
    return feeds


def compare_forms(contrib: onnx.ModelProto, kernels_model: onnx.ModelProto,
                  feeds: dict[str, np.ndarray], tolerance: Tolerance) -> list[OutputParity]:
    """Both forms in the ReferenceEvaluator on the same feeds; one row per output."""
    try:
        want, got = evaluate(contrib, feeds), evaluate(kernels_model, feeds)
    except Exception as exc:  # an op without a NumPy reference: the check cannot vouch
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return [OutputParity(ROW_PREFIX + "all outputs", float("nan"), float("nan"), False,
                             note=f"cannot evaluate the models with the NumPy references "
                                  f"({first})")]
    return [compare_output(ROW_PREFIX + name, want[name], got.get(name), tolerance)
            for name in want]


def emit(model: onnx.ModelProto, report, status: Callable[[str], None] | None,
         batch: int, seq: int, seed: int | None, check: bool, refuse_drift: bool,
         strict: bool = False, fp8: bool = False, fp32_reference: Fp32Reference | None = None,
         fp8_gate: Fp8Gate | None = None, fp8_gemms: str | None = None) -> onnx.ModelProto:
    """The bertfuse form of a checked contrib model, as pipeline stages on `report` (a
    pipeline.RunReport). check: compare it with the contrib form (rows join the parity
    report); refuse_drift: raise ParityError on a failed comparison (optimize has no --force);
    strict: a contrib op left over is FusionIncomplete. fp8: FP8 weights calibrated on the
    parity inputs (fp8.py) at the GEMMs fp8_gemms names, measured against fp32_reference
    when given, in user terms held to fp8_gate (report.fp8; pipeline/gate.py refuses a miss
    unless forced)."""
    with report.stage("bertfuse kernels", status) as st:
        kmodel = to_bertfuse_kernels(model, report.passes)
        check_model(kmodel, load=False)  # onnx's checker; ORT's CPU EP has no bertfuse kernels
        ops = sum(n.domain == BERTFUSE_DOMAIN for n in kmodel.graph.node)
        st.nodes = len(kmodel.graph.node)
        st.detail = f"{ops} ai.bertfuse ops (CUDA EP with the bertfuse library)"
    _refuse_misses(report, strict)
    if report.parity is not None:  # the very inputs of the parity gate
        batch, seq = report.parity.batch, report.parity.seq
    feeds = model_feeds(model, batch, seq, seed)
    if check:
        _check_forms(model, kmodel, report, status, feeds, batch, seq, seed, refuse_drift)
    if fp8:
        if report.parity is not None and report.parity.feeds is not None:
            feeds = report.parity.feeds  # the compared inputs: the user's own where given
        kmodel = _fp8(model, kmodel, report, status, feeds, fp32_reference,
                      fp8_gate or Fp8Gate(), fp8_gemms)
        _refuse_misses(report, strict)
    return kmodel


def _refuse_misses(report, strict: bool) -> None:
    misses = kernels_misses(report.passes)
    if strict and misses:
        raise FusionIncomplete(f"not written (--strict): {'; '.join(misses)}", report)


def _check_forms(model: onnx.ModelProto, kmodel: onnx.ModelProto, report, status,
                 feeds: dict[str, np.ndarray], batch: int, seq: int, seed: int | None,
                 refuse_drift: bool) -> None:
    with report.stage("check bertfuse ops vs contrib form (NumPy references)", status) as st:
        tol = tolerance_for("fp16")
        rows = compare_forms(model, kmodel, feeds, tol)
        if report.parity is None:
            report.parity = ParityReport("fp16", batch, seq, rows, tol, seed,
                                         reference="contrib form, NumPy references")
        else:
            report.parity.outputs.extend(rows)
        ok = all(r.ok for r in rows)
        st.detail = "ok" if ok else "DRIFT"
    if refuse_drift and not ok:
        raise ParityError(f"not written: the bertfuse ops differ from the contrib form, "
                          f"{parity_failure(report.parity)}", report)


def _fp8(model: onnx.ModelProto, kmodel: onnx.ModelProto, report, status,
         feeds: dict[str, np.ndarray], fp32_reference: Fp32Reference | None,
         gate: Fp8Gate, gemms: str | None) -> onnx.ModelProto:
    """The FP8 form at the places `gemms` names (all or None, auto: chosen against the gate,
    or a comma list), then its accuracy in user terms (report.fp8)."""
    tried: list[dict] = []
    # the fp32 reference (TF for convert) runs once: every measure reads its outputs
    want = fp32_reference(feeds) if fp32_reference is not None else None
    with report.stage("fp8 weights (calibrated on the parity inputs)", status) as st:
        amax = calibrate(model, dense_inputs(kmodel), feeds)
        places = PLACES if gemms in (None, "all", "auto") else \
            tuple(p for p in PLACES if p in gemms.split(","))
        if gemms == "auto" and want is not None:
            places, tried = choose_places(kmodel, amax, feeds, want, gate)
        kmodel = to_fp8(kmodel, amax, report.passes, None if places == PLACES else places)
        check_model(kmodel, load=False)
        st.nodes = len(kmodel.graph.node)
        st.detail = f"{sum(n.op_type in FP8_CONTRACTS for n in kmodel.graph.node)} FP8 dense " \
                    f"ops ({', '.join(places)}{'; auto' if tried else ''}) on bertfuse's own " \
                    f"ops (ai.bertfuse: a CUDA GPU with the op library runs the model), the " \
                    f"rest fp16"
    fp8 = {"gate": gate.to_json(), "gemms": list(places), "tried": tried}
    if want is not None and report.parity is not None:
        with report.stage("fp8 accuracy vs fp32 (NumPy references)", status) as st:
            rows, terms = accuracy_rows(kmodel, feeds, want)
            report.parity.outputs.extend(rows)
            failure = gate.failure(terms)
            report.fp8 = {**fp8, "ok": not failure, "failure": failure,
                          "inputs": report.parity.inputs or "random",
                          "outputs": [t.to_json() for t in terms]}
            st.detail = "; ".join(t.summary() for t in terms) + \
                (f"; BELOW THE FP8 GATE: {failure}" if failure else "; within the FP8 gate")
    elif report.parity is not None:
        report.fp8 = {**fp8, "ok": None, "failure": "",
                      "inputs": "not measured (--no-verify)", "outputs": []}
    return kmodel
