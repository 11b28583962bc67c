"""convert / optimize / verify as stages, each timed and counted for the report.

The stages' parts live beside it: the options and their checks before any slow work
(pipeline_options.py), the report (run_report.py), the gate and the write (gate.py)."""

from __future__ import annotations

from typing import Callable

import onnx

from bertfuse.errors import BertfuseError, require
from bertfuse.pipeline.gate import parity_failure, write_gated
from bertfuse.io.model import check_model
from bertfuse.passes.manager import default_passes, run_passes
from bertfuse.pipeline.options import (MAX_VERIFY_TOKENS, PRECISIONS, ConvertOptions,
                                       check_gate, check_inputs_text, check_kernels,
                                       check_precision, check_verify_size)
from bertfuse.pipeline.report import RunReport, Stage
from bertfuse.io.safety import check_output, convert_inputs
from bertfuse.pipeline.parity import DEFAULT_SEED, verify_against_tf

# Imported from here by the API, the CLI, tools and tests.
__all__ = ["MAX_VERIFY_TOKENS", "PRECISIONS", "ConvertOptions", "RunReport", "Stage",
           "check_precision", "check_verify_size", "convert", "convert_model", "optimize",
           "optimize_model", "parity_failure", "verify"]


def convert(src_path: str, out_path: str, opts: ConvertOptions,
            status: Callable[[str], None] | None = None) -> RunReport:
    """Export, passes, verification; writes only a model that passed (unless forced)."""
    return convert_model(src_path, out_path, opts, status)[1]


def convert_model(src_path: str, out_path: str | None, opts: ConvertOptions,
                  status: Callable[[str], None] | None = None
                  ) -> tuple[onnx.ModelProto, RunReport]:
    """convert, returning the model too; out_path None: checked and gated, not written."""
    from bertfuse.converter.export import SUPPORTED_OPSETS

    if opts.opset not in SUPPORTED_OPSETS:  # before the (slow) TF load
        raise BertfuseError(f"--opset {opts.opset} is not supported by tf2onnx 1.17 "
                            f"(choose {' or '.join(map(str, SUPPORTED_OPSETS))})")
    check_gate(opts)
    require("tensorflow", "tf2onnx", "onnxruntime")
    # The Python API gets the CLI's guarantee too: the output is none of the source's files.
    if out_path is not None:
        check_output(out_path, *convert_inputs(src_path, opts.config, opts.kind))
    from bertfuse.converter import load_source
    from bertfuse.converter.export import tf_to_onnx

    report = RunReport(output=out_path, command="convert")
    with report.stage("load TF model", status) as st:
        source = load_source(src_path, opts.kind, opts.signature, opts.inputs, opts.outputs,
                             opts.config)
        st.nodes = source.tf_node_count
        st.detail = f"{source.kind}, {len(source.weights)} weight tensors"
        report.original_names = source.original_names
    try:
        with report.stage("tf2onnx export", status) as st:
            raw = tf_to_onnx(source, opts.opset)
            st.nodes = len(raw.graph.node)
            st.detail = f"opset {opts.opset}"
        model = _optimize(raw, report, status, opts.precision) if opts.fuse else raw
        del raw
        with report.stage("check (onnx checker + ORT load)", status) as st:
            check_model(model)
        if opts.verify:
            with report.stage("verify vs TensorFlow", status) as st:
                report.parity = verify_against_tf(model, source, opts.precision, opts.batch,
                                                  opts.seq, opts.seed, atol=opts.atol,
                                                  rtol=opts.rtol)
                st.detail = "ok" if report.parity.ok else "DRIFT"
        if opts.kernels == "bertfuse":  # the verified contrib form, rewritten, checked equal
            from bertfuse.pipeline.lowering import emit

            model = emit(model, report, status, opts.batch, opts.seq, opts.seed, opts.verify,
                         refuse_drift=False, strict=opts.strict, fp8=opts.fp8,
                         fp32_reference=(lambda feeds: source.run_many([feeds])[0])
                         if opts.verify else None)
    finally:
        source.close()
    if opts.packed:
        model = _pack(model, report, status)
    write_gated(model, out_path, report, opts.force, status, opts.strict)
    return model, report


def _pack(model: onnx.ModelProto, report: RunReport,
          status: Callable[[str], None] | None) -> onnx.ModelProto:
    """The verified padded model, turned into its packed form (checked by onnx's checker:
    PackedAttention/RestorePadding have CUDA kernels only, so ORT's CPU cannot load it). A
    model on bertfuse kernels (BertAttention) takes the device-packed form instead."""
    from bertfuse.ops import BERTFUSE_DOMAIN
    from bertfuse.passes.cleanup import Cleanup
    from bertfuse.passes.packing import PackingPass
    from bertfuse.passes.packing_kernels import PackingKernelsPass

    on_kernels = any(n.op_type == "BertAttention" and n.domain == BERTFUSE_DOMAIN
                     for n in model.graph.node)
    first = PackingKernelsPass() if on_kernels else PackingPass()
    with report.stage("packing (on the device)" if on_kernels else "packing", status) as st:
        packed, pack_report = run_passes(model, [first, Cleanup()])
        misses = [d for d in pack_report.diagnostics if not d.fused]
        if misses:
            raise BertfuseError(f"cannot pack: {misses[0].reason}")
        check_model(packed, load=False)
        st.nodes = len(packed.graph.node)
        st.detail = "verified padded; packed runs on CUDA"
    return packed


def _optimize(raw: onnx.ModelProto, report: RunReport, status: Callable[[str], None] | None,
              precision: str = "fp32") -> onnx.ModelProto:
    with report.stage("passes", status) as st:
        model, report.passes = run_passes(raw, default_passes(precision),
                                          progress=(lambda n: status(f"pass: {n}")) if status
                                          else None)
        st.nodes = len(model.graph.node)
    return model


def optimize(in_path: str, out_path: str, status: Callable[[str], None] | None = None,
             strict: bool = False, precision: str = "fp32", packed: bool = False,
             in_place: bool = False, inputs: str | dict[str, str] | None = None,
             kernels: str = "ort", fp8: bool = False) -> RunReport:
    """Passes on an ONNX model a user exported themselves. `out_path` may be `in_path` only
    with `in_place` (the file is then replaced after success, never half-written).
    `inputs` (ROLE=NAME,... or {role: name}): rename the inputs to the canonical roles."""
    return optimize_model(in_path, out_path, status, strict, precision, packed, in_place,
                          inputs, kernels, fp8)[1]


def optimize_model(source: str | onnx.ModelProto, out_path: str | None,
                   status: Callable[[str], None] | None = None, strict: bool = False,
                   precision: str = "fp32", packed: bool = False, in_place: bool = False,
                   inputs: str | dict[str, str] | None = None, kernels: str = "ort",
                   fp8: bool = False) -> tuple[onnx.ModelProto, RunReport]:
    """optimize, returning the model too; `source` a path or a ModelProto; out_path None:
    checked (and --strict gated), not written."""
    from bertfuse.converter.roles import parse_override
    from bertfuse.io.model import check_input_model, load_model

    check_precision(precision)
    check_kernels(kernels, precision, packed, fp8)
    check_inputs_text(inputs)
    override = parse_override(inputs) if inputs is not None else None
    from_file = not isinstance(source, onnx.ModelProto)
    if out_path is not None and not in_place:
        check_output(out_path, [source] if from_file else [])
    require("onnxruntime")  # the check loads the model in ONNX Runtime
    report = RunReport(output=out_path, command="optimize")
    with report.stage("load ONNX", status) as st:
        if from_file:
            raw = load_model(source)
            check_input_model(raw, source)
        else:
            raw = source
        st.nodes = len(raw.graph.node)
    if override is not None:  # before the passes, as convert does: they see the roles
        from bertfuse.converter.interface import role_inputs

        with report.stage("rename inputs to roles", status):
            renamed = role_inputs(raw, override)
            report.original_names = {i.name: o.name for i, o in
                                     zip(renamed.graph.input, raw.graph.input)}
            raw = renamed
    model = _optimize(raw, report, status, precision)
    with report.stage("check (onnx checker + ORT load)", status):
        check_model(model)
    if kernels == "bertfuse":  # the contrib form, rewritten; checked equal before writing
        from bertfuse.pipeline.lowering import emit

        from bertfuse.pipeline.parity import ort_session, run_onnx

        model = emit(model, report, status, 4, 32, DEFAULT_SEED, check=True,
                     refuse_drift=True, strict=strict, fp8=fp8,  # fp32: the model as given
                     fp32_reference=lambda feeds: run_onnx(ort_session(raw), feeds))
    if packed:
        model = _pack(model, report, status)
    write_gated(model, out_path, report, True, status, strict)
    return model, report


def verify(model_path: str, src_path: str, opts: ConvertOptions,
           status: Callable[[str], None] | None = None) -> RunReport:
    from bertfuse.converter import load_source
    from bertfuse.converter.interface import match_interface
    from bertfuse.converter.roles import parse_override
    from bertfuse.io.model import load_model

    check_gate(opts)
    require("tensorflow", "onnxruntime")
    report = RunReport(command="verify")
    # The ONNX first: a missing/corrupt model fails before the slow TF load.
    with report.stage("load ONNX", status) as st:
        model = load_model(model_path)
        st.nodes = len(model.graph.node)
    with report.stage("load TF model", status) as st:
        source = load_source(src_path, opts.kind, opts.signature, opts.inputs, opts.outputs,
                             opts.config)
        st.nodes = source.tf_node_count
    try:
        model = match_interface(model, source, model_path, src_path,
                                parse_override(opts.inputs))
        with report.stage("verify vs TensorFlow", status) as st:
            try:
                report.parity = verify_against_tf(model, source, _precision_of(model),
                                                  opts.batch, opts.seq, opts.seed,
                                                  atol=opts.atol, rtol=opts.rtol)
            except Exception as exc:
                if not type(exc).__module__.startswith("onnxruntime"):
                    raise
                # The user's pairing of model and source is wrong (e.g. another vocab size).
                first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                raise BertfuseError(f"{model_path}: ONNX Runtime fails on inputs for "
                                    f"{src_path} ({first}); is it converted from that "
                                    f"source?") from None
    finally:
        source.close()
    return report


def _precision_of(model: onnx.ModelProto) -> str:
    """fp16 tolerances for a model that holds fp16 weights."""
    half = onnx.TensorProto.FLOAT16
    return "fp16" if any(i.data_type == half for i in model.graph.initializer) else "fp32"
