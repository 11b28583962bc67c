"""optimize's parity: the fused model against the model it was given, both in ONNX Runtime on
the CPU, on the random padded inputs and with the limits convert uses against TensorFlow.

    the given model (inputs renamed to roles with --inputs; an Erfc as 1 - Erf: erfc.py)
        │ ONNX Runtime, CPU                                          the reference
    random_inputs(batch, seq, the model's vocab; padding at the end, middle and start)
        │ ONNX Runtime, CPU                                          compare per output:
    the fused model, in ONNX Runtime's contrib ops                   fp32 max 1e-4,
                                                                     fp16 max 4e-2 mean 2e-3

What is compared is always the contrib form: `--ops bertfuse` lowers it afterwards (held
to it by the lowering's own check, pipeline/lowering.py) and `--packed` packs it afterwards,
and neither of those runs on ONNX Runtime's CPU.
"""

from __future__ import annotations

import re

import numpy as np
import onnx

from bertfuse.errors import BertfuseError
from bertfuse.io.inputs import random_inputs
from bertfuse.pipeline.parity import (CHOICES, OrtRunError, ParityReport, compare, ort_session,
                                      run_onnx, tolerance_for)
from bertfuse.converter.handlers import custom_op_handlers
from bertfuse.converter.roles import assign_roles
from bertfuse.converter.source import ROLES
from bertfuse.io.model import check_input_model, load_model
from bertfuse.passes.erfc import erfc_nodes, rewrite_erfc
from bertfuse.runtime.request_checks import model_facts

_INTS = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def verify_against_onnx(fused: onnx.ModelProto, given: onnx.ModelProto, label: str,
                        precision: str, batch: int, seq: int, seed: int | None,
                        atol: float | None = None, rtol: float | None = None) -> ParityReport:
    """`fused` against `given` (label: how the report and errors name it) on random padded
    inputs; the given model failing in ONNX Runtime is bad input (exit 2), the fused one
    failing where the given one runs is a failed optimize (OrtRunError, exit 1)."""
    tol = tolerance_for(precision, atol, rtol)
    try:
        reference = ort_session(given)
    except Exception as exc:  # a custom op, a CUDA-only kernel: nothing to compare against
        raise BertfuseError(f"{label}: ONNX Runtime's CPU cannot run the model as given "
                            f"({_first(exc)}), so optimize cannot compare the result with it; "
                            f"--no-verify writes it unchecked") from None
    names = [i.name for i in reference.get_inputs()]
    roles = {n: n for n in names} if all(n in ROLES for n in names) else assign_roles(names)
    facts = model_facts(fused)
    if facts.vocab_size is None:
        facts = model_facts(given)
    shapes = {i.name: i.shape for i in reference.get_inputs()}
    ids_shape = shapes[roles["input_ids"]]
    fixed = ids_shape[-1] if isinstance(ids_shape[-1], int) and ids_shape[-1] > 0 else None
    seq = fixed or min(seq, facts.max_positions or seq)
    choices = len(ids_shape) == 3
    if isinstance(ids_shape[0], int) and ids_shape[0] > 0:  # an export with a fixed batch
        batch = ids_shape[0]
    rows = batch * (CHOICES if choices else 1)
    feeds = random_inputs(rows, seq, facts.vocab_size or 2, facts.type_vocab_size or 2,
                          seed=seed, pad_anywhere=True)
    if choices:  # multiple choice: [batch, choices, seq]
        feeds = {k: v.reshape(batch, CHOICES, seq) for k, v in feeds.items()}
    types = {i.name: i.type for i in reference.get_inputs()}
    by_name = {name: feeds[role].astype(_INTS.get(types[name], np.int32))
               for role, name in roles.items() if name in types}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise BertfuseError(f"{label}: cannot tell the role of input {missing[0]!r} to make "
                            f"inputs for the comparison; name it with --inputs, or pass "
                            f"--no-verify")
    try:
        expected = run_onnx(reference, by_name)
    except Exception as exc:
        raise BertfuseError(f"{label}: the model as given fails in ONNX Runtime on random "
                            f"padded inputs ({_first(exc)}); --no-verify writes the optimized "
                            f"model unchecked") from None
    try:
        got = run_onnx(ort_session(fused), by_name)
    except Exception as exc:
        if not type(exc).__module__.startswith("onnxruntime"):
            raise
        raise OrtRunError(f"the optimized model fails in ONNX Runtime on the inputs the model "
                          f"as given runs: {_first(exc)}", _first(exc)) from None
    return ParityReport(precision, batch, seq, compare(expected, got, tol), tol, seed,
                        f"{label} (ONNX Runtime, CPU)", "onnx", device="cpu")


def _first(exc: BaseException) -> str:
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", msg)[:300]


def load_given(source, report, status) -> onnx.ModelProto:
    """optimize's `load ONNX` stage: the file read and checked as every user's .onnx is
    (a ModelProto is taken as is, left unchanged), tf2onnx's unmapped Erfc rewritten as
    1 - Erf first (passes/erfc.py), with a note in the report."""
    with report.stage("load ONNX", status) as st:
        from_file = not isinstance(source, onnx.ModelProto)
        raw = load_model(source) if from_file else source
        erfc = len(erfc_nodes(raw))
        if erfc and not from_file:
            raw = onnx.ModelProto.FromString(raw.SerializeToString())  # leave the caller's
        if erfc:
            rewrite_erfc(raw)
            st.detail = f"{erfc} Erfc as 1 - Erf"
            report.notes.append(f"{erfc} Erfc node(s) rewritten as 1 - Erf before the passes "
                                f"(ONNX has no Erfc; tf2onnx leaves TensorFlow's unmapped, as "
                                f"in TF's exact GELU); parity compares with the model as given "
                                f"after the same rewrite")
        _refuse_tf_ops(raw, str(source) if from_file else "the given model")
        if from_file:
            check_input_model(raw, source, changed=bool(erfc))
        st.nodes = len(raw.graph.node)
    return raw


def _refuse_tf_ops(model: onnx.ModelProto, label: str) -> None:
    """A TF op tf2onnx left unmapped that `convert` maps in tf2onnx (converter/handlers.py):
    onnx's checker would only say 'No Op registered'; say what works instead."""
    mapped = set(custom_op_handlers())
    left = next((n for n in model.graph.node if n.domain in ("", "ai.onnx")
                 and n.op_type in mapped), None)
    if left is not None:
        raise BertfuseError(f"{label}: node {left.name[:120]!r} is TensorFlow's {left.op_type}, "
                            f"which tf2onnx leaves unmapped and ONNX has no op for; run "
                            f"`bertfuse convert` on the TF model instead (it maps "
                            f"{left.op_type} in its export)")


def verify_stage(model: onnx.ModelProto, given: onnx.ModelProto, source, opts, report,
                 status) -> None:
    """optimize's `verify vs the given model` stage (unless --no-verify)."""
    if not opts.verify:
        return
    label = str(source) if not isinstance(source, onnx.ModelProto) else "the given model"
    with report.stage("verify vs the given model", status) as st:
        report.parity = verify_against_onnx(model, given, label, opts.precision, opts.batch,
                                            opts.seq, opts.seed, opts.atol, opts.rtol)
        st.detail = "ok" if report.parity.ok else "DRIFT"
    later = [what for what, on in (("lowered to bertfuse's ops", opts.ops == "bertfuse"),
                                   ("packed", opts.packed)) if on]
    if later:
        report.notes.append(f"parity compared the fused model in ONNX Runtime's contrib ops "
                            f"with the model as given; the written form is then "
                            f"{' and '.join(later)} (CUDA only)")
