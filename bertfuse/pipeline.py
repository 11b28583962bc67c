"""convert / optimize / verify as stages, each timed and counted for the report."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import onnx

from bertfuse.errors import BertfuseError, FusionIncomplete, ParityError, require
from bertfuse.modelio import check_model, save_model
from bertfuse.safety import check_output, convert_inputs
from bertfuse.passes.manager import PipelineReport, default_passes, run_passes
from bertfuse.safety import pause_point
from bertfuse.verify import DEFAULT_SEED, ParityReport, check_seed, tolerance_for, \
    verify_against_tf


@dataclass
class Stage:
    name: str
    seconds: float = 0.0
    nodes: int | None = None
    detail: str = ""


@dataclass
class RunReport:
    stages: list[Stage] = field(default_factory=list)
    passes: PipelineReport | None = None
    parity: ParityReport | None = None
    original_names: dict[str, str] = field(default_factory=dict)
    output: str | None = None
    written: bool = False
    command: str = ""  # convert | optimize | verify

    @contextmanager
    def stage(self, name: str, status: Callable[[str], None] | None = None) -> Iterator[Stage]:
        if status:
            status(name)
        pause_point(name)  # a no-op outside tests (bertfuse/safety.py)
        st = Stage(name)
        start = time.perf_counter()
        try:
            yield st
        finally:
            st.seconds = round(time.perf_counter() - start, 3)
            self.stages.append(st)

    def to_json(self) -> dict:
        """The documented JSON report (README, "JSON reports"); bump SCHEMA_VERSION in
        report.py when a field changes meaning or goes away."""
        from bertfuse.report import SCHEMA_VERSION, tool_versions

        return {
            "schema_version": SCHEMA_VERSION,
            "command": self.command,
            "tools": tool_versions(),
            "output": self.output,
            "written": self.written,
            "stages": [s.__dict__ for s in self.stages],
            "original_names": self.original_names,
            "passes": self.passes.to_json() if self.passes else None,
            "parity": self.parity.to_json() if self.parity else None,
        }


@dataclass
class ConvertOptions:
    opset: int = 17
    signature: str = "serving_default"
    kind: str = "auto"
    inputs: str | dict[str, str] | None = None  # ROLE=NAME,... or {role: name}
    outputs: list[str] | None = None
    config: str | None = None
    verify: bool = True
    force: bool = False
    precision: str = "fp32"
    seed: int | None = DEFAULT_SEED  # None: a fresh random draw
    atol: float | None = None  # None: the fp32/fp16 table in verify.py
    rtol: float | None = None  # None: 0
    batch: int = 4
    seq: int = 32
    strict: bool = False
    fuse: bool = True
    packed: bool = False
    kernels: str = "ort"  # ort | bertfuse (kernels_form.py)
    fp8: bool = False  # FP8 weights for the bertfuse dense ops (kernels_fp8.py)


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
    _check_gate(opts)
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
            from bertfuse.kernels_form import emit

            model = emit(model, report, status, opts.batch, opts.seq, opts.seed, opts.verify,
                         refuse_drift=False, strict=opts.strict, fp8=opts.fp8,
                         fp32_reference=(lambda feeds: source.run_many([feeds])[0])
                         if opts.verify else None)
    finally:
        source.close()
    if opts.packed:
        model = _pack(model, report, status)
    _write(model, out_path, report, opts.force, status, opts.strict)
    return model, report


def _pack(model: onnx.ModelProto, report: RunReport,
          status: Callable[[str], None] | None) -> onnx.ModelProto:
    """The verified padded model, turned into its packed form (checked by onnx's checker:
    PackedAttention/RestorePadding have CUDA kernels only, so ORT's CPU cannot load it). A
    model on bertfuse kernels (BertAttention) takes the device-packed form instead."""
    from bertfuse.custom_ops import BERTFUSE_DOMAIN
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


def _write(model: onnx.ModelProto, out_path: str | None, report: RunReport, force: bool,
           status: Callable[[str], None] | None, strict: bool = False) -> None:
    """The gate (--strict, parity), then the file; out_path None: the gate alone."""
    table = report.passes.table if report.passes else None
    what, force_hint = (f"{out_path}: not written", "use --force to write anyway") \
        if out_path is not None else ("refused", "force=True returns it anyway")
    if strict and table is not None and not table.fully_fused:
        raise FusionIncomplete(f"{what} (--strict): " + "; ".join(table.unfused()))
    if report.parity is not None and not report.parity.ok and not force:
        raise ParityError(f"{what}: parity check failed, {parity_failure(report.parity)} "
                          f"({force_hint})", report)
    if out_path is None:
        return
    with report.stage("write", status):
        save_model(model, out_path)
    report.written = True


PRECISIONS = ("fp32", "fp16")
MAX_VERIFY_TOKENS = 1 << 16  # random verification inputs past this only exhaust memory


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise BertfuseError(f"precision {precision!r} is not supported (choose "
                            f"{' or '.join(PRECISIONS)})")


def check_verify_size(batch: int, seq: int) -> None:
    tokens = batch * seq
    if tokens > MAX_VERIFY_TOKENS:
        raise BertfuseError(f"--batch {batch} x --seq {seq} is {tokens} tokens; the "
                            f"comparison takes at most {MAX_VERIFY_TOKENS}")


def _check_inputs_text(inputs: str | dict[str, str] | None) -> None:
    """An empty --inputs is a mistake (the API's {} means "every input by name")."""
    if isinstance(inputs, str) and not inputs.strip():
        raise BertfuseError("--inputs: expected ROLE=NAME,... (roles: input_ids, input_mask, "
                            "segment_ids)")


def _check_gate(opts: ConvertOptions) -> None:
    """Before the slow TF load: a NaN or negative tolerance or seed is bad input, and TF is
    asked to start with oneDNN's rewrites off (see converter/reference.py)."""
    from bertfuse.converter.reference import prefer_onednn_off

    check_precision(opts.precision)
    _check_kernels(opts.kernels, opts.precision, opts.packed, opts.fp8)
    _check_inputs_text(opts.inputs)
    check_seed(opts.seed)
    check_verify_size(opts.batch, opts.seq)
    tolerance_for(opts.precision, opts.atol, opts.rtol)
    if not opts.fuse:  # these act on the fused graph: without it they would silently do nothing
        asked = [flag for flag, on in (("--strict", opts.strict), ("--packed", opts.packed),
                                       ("--precision fp16", opts.precision != "fp32"),
                                       ("--kernels bertfuse", opts.kernels != "ort")) if on]
        if asked:
            raise BertfuseError(f"{asked[0]} needs the fusion passes; it cannot be combined "
                                f"with --no-fuse")
    if opts.verify:
        prefer_onednn_off()


def _check_kernels(kernels: str, precision: str, packed: bool, fp8: bool = False) -> None:
    from bertfuse.kernels_form import check_kernels

    check_kernels(kernels, precision, packed, fp8)


def parity_failure(parity: ParityReport) -> str:
    """The worst failing row, and a hint that fits it and the source kind."""
    from bertfuse.verify_mask import tf_moved_on_segments

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
    from bertfuse.modelio import check_input_model, load_model

    check_precision(precision)
    _check_kernels(kernels, precision, packed, fp8)
    _check_inputs_text(inputs)
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
        from bertfuse.kernels_form import emit

        from bertfuse.verify import ort_session, run_onnx

        model = emit(model, report, status, 4, 32, DEFAULT_SEED, check=True,
                     refuse_drift=True, strict=strict, fp8=fp8,  # fp32: the model as given
                     fp32_reference=lambda feeds: run_onnx(ort_session(raw), feeds))
    if packed:
        model = _pack(model, report, status)
    _write(model, out_path, report, True, status, strict)
    return model, report


def verify(model_path: str, src_path: str, opts: ConvertOptions,
           status: Callable[[str], None] | None = None) -> RunReport:
    from bertfuse.converter import load_source
    from bertfuse.converter.interface import match_interface
    from bertfuse.converter.roles import parse_override
    from bertfuse.modelio import load_model

    _check_gate(opts)
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
