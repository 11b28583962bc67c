"""convert / optimize / verify as one plan of stages, each timed and counted for the report.

    convert   load TF model -> tf2onnx export ---.
    optimize  load ONNX [-> rename inputs to roles] +-> passes -> check (onnx + ORT load)
                                                     -> [verify vs TensorFlow]     convert
                                                     -> [verify vs the given model]  optimize
                                                     -> [bertfuse kernels]         --ops bertfuse
                                                     -> [packing]                  --packed
                                                     -> gate (--strict, parity) -> write
    verify    load ONNX -> [kernels: runtime/kernel_choice.choose on CUDA] -> load TF model
                        -> match the interface -> verify vs TensorFlow (on --device)

convert and optimize differ only in their front (where the raw graph and the fp32
reference come from); from the passes on they run the same `_back`. The options and their
checks are options.py, the report report.py, the gate and the write gate.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import onnx

from bertfuse.errors import BertfuseError, require
from bertfuse.io.model import check_model, check_source_form
from bertfuse.io.safety import check_output, convert_inputs
from bertfuse.io.sidecars import find_vocab
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan, packing_plan
from bertfuse.pipeline.gate import write_gated
from bertfuse.pipeline.options import (OPTIMIZE_OPTIONS, ConvertOptions, check_fusion, check_gate,
                                       check_parity_options)
from bertfuse.pipeline.data import ParityData
from bertfuse.pipeline.parity import OrtRunError, verify_against_tf
from bertfuse.pipeline.report import RunReport
from bertfuse.pipeline import text_parity
from bertfuse.converter import load_source
from bertfuse.converter.export import SUPPORTED_OPSETS, tf_to_onnx
from bertfuse.converter.interface import match_interface, role_inputs
from bertfuse.converter.roles import parse_override
from bertfuse.io.model import load_model
from bertfuse.ops import BERTFUSE_DOMAIN
from bertfuse.optional import optional
from bertfuse.pipeline.lowering import emit
from bertfuse.pipeline.fp8_gate import Fp8Gate
from bertfuse.pipeline.onnx_parity import load_given, verify_stage
from bertfuse.pipeline.parity import ort_session, run_onnx, verify_against_saved
from bertfuse.runtime.kernel_choice import check_kernels_option, choose
from bertfuse.runtime.request_checks import model_facts

if TYPE_CHECKING:
    from bertfuse.pipeline.fp8 import Fp32Reference

Status = Callable[[str], None]


def convert(src_path: str, out_path: str, opts: ConvertOptions,
            status: Status | None = None) -> RunReport:
    """Export, passes, verification; writes only a model that passed (unless forced)."""
    return convert_model(src_path, out_path, opts, status)[1]


def convert_model(src_path: str, out_path: str | None, opts: ConvertOptions,
                  status: Status | None = None) -> tuple[onnx.ModelProto, RunReport]:
    """convert, returning the model too; out_path None: checked and gated, not written."""
    if opts.opset not in SUPPORTED_OPSETS:  # before the (slow) TF load
        raise BertfuseError(f"--opset {opts.opset}: bertfuse writes opset "
                            f"{' or '.join(map(str, SUPPORTED_OPSETS))} (its fusion passes and "
                            f"the contrib ops they emit are built and tested on those)")
    check_gate(opts)
    check_source_form(src_path, opts.kind)
    # Every package missing in one line (tokenizers before the user's text is tokenized).
    require("tensorflow", "tf2onnx", "onnxruntime", *(("tokenizers",) * bool(opts.text_file)))
    data = _parity_data(opts, [src_path, opts.config])  # the user's files: read before TF
    # The Python API gets the CLI's guarantee too: the output is none of the source's files.
    if out_path is not None:
        files, dirs = convert_inputs(src_path, opts.config, opts.kind)
        check_output(out_path, [*files, *(data.read_files() if data else [])], dirs)

    report = RunReport(output=out_path, command="convert", options=opts.to_json())
    with report.stage("load TF model", status) as st:
        source = load_source(src_path, opts.kind, opts.signature, opts.inputs, opts.outputs,
                             opts.config, opts.trust_model)
        st.nodes = source.tf_node_count
        st.detail = f"{source.kind}, {len(source.weights)} weight tensors"
        report.original_names, report.notes = source.original_names, list(source.notes)
        report.outputs = source.output_table()
        if source.text is not None:  # text in: the tokenizer cut off (text_parity.py)
            report.text = text_parity.begin(source.text, st, out_path,
                                            convert_inputs(src_path, opts.config, opts.kind))
    try:
        with report.stage("tf2onnx export", status) as st:
            raw = tf_to_onnx(source, opts.opset)
            st.nodes = len(raw.graph.node)
            st.detail = f"opset {opts.opset}"
        reference = (lambda feeds: source.run_many([feeds])[0]) if opts.verify else None
        model = _fuse_and_check(raw, opts, report, status, source, data)
        del raw
        model = _lower(model, opts, report, status, reference, against_tf=True)
    finally:
        source.close()
    model = _pack_and_write(model, out_path, opts, report, status, force=opts.force)
    if source.text is not None and report.written:
        report.text["vocab"] = text_parity.write_vocab(source.text, out_path)
    return model, report


def optimize(in_path: str, out_path: str, status: Status | None = None,
             opts: ConvertOptions | None = None, in_place: bool = False) -> RunReport:
    """Passes on an ONNX model a user exported themselves. `out_path` may be `in_path` only
    with `in_place` (the file is then replaced after success, never half-written). Of
    `opts`, optimize reads options.OPTIMIZE_OPTIONS; `inputs` renames the inputs to the
    canonical roles."""
    return optimize_model(in_path, out_path, status, opts, in_place)[1]


def optimize_model(source: str | onnx.ModelProto, out_path: str | None,
                   status: Status | None = None, opts: ConvertOptions | None = None,
                   in_place: bool = False) -> tuple[onnx.ModelProto, RunReport]:
    """optimize, returning the model too; `source` a path or a ModelProto; out_path None:
    checked (and --strict gated), not written."""
    opts = opts or ConvertOptions()
    check_fusion(opts)
    check_parity_options(opts)
    override = parse_override(opts.inputs) if opts.inputs is not None else None
    from_file = not isinstance(source, onnx.ModelProto)
    if out_path is not None and not in_place:
        check_output(out_path, [source] if from_file else [])
    require("onnxruntime")  # the check loads the model in ONNX Runtime
    report = RunReport(output=out_path, command="optimize",
                       options=opts.to_json(OPTIMIZE_OPTIONS))
    raw = load_given(source, report, status)
    if override is not None:  # before the passes, as convert does: they see the roles

        with report.stage("rename inputs to roles", status):
            renamed = role_inputs(raw, override)
            report.original_names = {i.name: o.name for i, o in
                                     zip(renamed.graph.input, raw.graph.input)}
            raw = renamed

    def reference(feeds: dict) -> dict:  # fp32: the model as given

        return run_onnx(ort_session(raw), feeds)

    model = _fuse_and_check(raw, opts, report, status, source=None)
    verify_stage(model, raw, source, opts, report, status)  # the contrib form vs the given
    model = _lower(model, opts, report, status, reference, against_tf=False)
    return _pack_and_write(model, out_path, opts, report, status, force=opts.force), report


def _parity_data(opts: ConvertOptions, inputs: list[str | None]) -> ParityData | None:
    """--load-inputs and the rest (data.py): their files read and the save paths checked
    before any slow work."""
    data = ParityData.from_options(opts)
    if data is not None:
        if not opts.verify:
            raise BertfuseError("--load-inputs, --text-file, --load-outputs and --save-* act "
                                "on the comparison; they cannot be combined with --no-verify")
        data.check_targets([p for p in inputs if p])
    return data


def _fuse_and_check(raw: onnx.ModelProto, opts: ConvertOptions, report: RunReport,
                    status: Status | None, source, data: ParityData | None = None
                    ) -> onnx.ModelProto:
    """passes (unless --no-fuse), the checker and an ORT load, then parity vs TensorFlow
    where there is a TF source to compare with."""
    model = _passes(raw, report, status, opts) if opts.fuse else raw
    with report.stage("check (onnx checker + ORT load)", status):
        check_model(model)
    if source is not None and opts.verify:
        with report.stage("verify vs TensorFlow", status) as st:
            report.parity = verify_against_tf(model, source, opts.precision, opts.batch,
                                              opts.seq, opts.seed, atol=opts.atol,
                                              rtol=opts.rtol, data=data)
            if source.text is not None:  # and on text, through its own tokenizer
                report.parity.outputs += text_parity.text_rows(
                    model, source, report.parity.tolerance, opts.seed)
            st.detail = "ok" if report.parity.ok else "DRIFT"
    return model


def _lower(model: onnx.ModelProto, opts: ConvertOptions, report: RunReport,
           status: Status | None, reference: Fp32Reference | None,
           against_tf: bool) -> onnx.ModelProto:
    """--ops bertfuse: the checked contrib form, rewritten into ai.bertfuse ops and checked
    equal to it. After convert the parity gate decides (--force); after optimize, which has
    no TF reference and no --force, a drift is refused here."""
    if opts.ops != "bertfuse":
        return model

    return emit(model, report, status, opts.batch, opts.seq, opts.seed,
                check=opts.verify or not against_tf, refuse_drift=not against_tf,
                strict=opts.strict, fp8=opts.fp8, fp32_reference=reference,
                fp8_gate=Fp8Gate(opts.fp8_min_cosine, opts.fp8_min_argmax),
                fp8_gemms=opts.fp8_gemms)


def _pack_and_write(model: onnx.ModelProto, out_path: str | None, opts: ConvertOptions,
                    report: RunReport, status: Status | None, force: bool) -> onnx.ModelProto:
    if opts.packed:
        model = _pack(model, report, status)
    write_gated(model, out_path, report, force, status, opts.strict, opts.external_data)
    return model


def _pack(model: onnx.ModelProto, report: RunReport, status: Status | None) -> onnx.ModelProto:
    """The verified padded model, turned into its packed form (checked by onnx's checker:
    PackedAttention/RestorePadding have CUDA kernels only, so ORT's CPU cannot load it). A
    model on bertfuse kernels (BertAttention) takes the device-packed form instead."""
    on_kernels = any(n.op_type == "BertAttention" and n.domain == BERTFUSE_DOMAIN
                     for n in model.graph.node)
    with report.stage("packing (on the device)" if on_kernels else "packing", status) as st:
        packed, pack_report = run_passes(model, packing_plan(on_kernels))
        misses = [d for d in pack_report.diagnostics if not d.fused]
        if misses:
            raise BertfuseError(f"cannot pack: {misses[0].reason}")
        check_model(packed, load=False)
        st.nodes = len(packed.graph.node)
        st.detail = "verified padded; packed runs on CUDA"
    return packed


def _passes(raw: onnx.ModelProto, report: RunReport, status: Status | None,
            opts: ConvertOptions) -> onnx.ModelProto:
    with report.stage("passes", status) as st:
        plan = fusion_plan(opts.precision, opts.gelu_approximation)
        model, report.passes = run_passes(raw, plan,
                                          progress=(lambda n: status(f"pass: {n}")) if status
                                          else None)
        st.nodes = len(model.graph.node)
    return model


VERIFY_DEVICES = ("auto", "cpu", "cuda")


def verify(model_path: str, src_path: str | None, opts: ConvertOptions,
           status: Status | None = None, device: str = "auto", kernels: str = "auto"
           ) -> RunReport:
    """The model against its TF source; src_path None: against --load-outputs, no TF.

    device: where ONNX Runtime runs the model ('auto': CUDA where this onnxruntime has its
    EP). kernels: as a Session on that device would run it (runtime/kernel_choice.py choose(): on
    CUDA, 'auto' and 'bertfuse' lower the covered layers to bertfuse's ops, so those are
    what is checked against TensorFlow); the parity report says which ran and why."""
    check_gate(opts)
    if opts.text_file and not opts.vocab:  # a text-in model's vocab, written beside it
        opts = replace(opts, vocab=find_vocab(model_path))
    require(*(("tensorflow",) if src_path is not None else ()), "onnxruntime",
            *(("tokenizers",) * bool(opts.text_file)))
    data = _parity_data(opts, [model_path, src_path, opts.config])
    if src_path is None and (data is None or not data.load_outputs):
        raise BertfuseError("verify needs the reference: --against SOURCE (TensorFlow), or "
                            "--load-outputs FILE with the inputs they came from")
    asked, device = device, verify_device(device, kernels)
    # options: the convert-time kernels mean nothing here; these are the session's
    report = RunReport(command="verify", options={**opts.to_json(), "kernels": kernels,
                                                  "device": asked})
    # The ONNX first: a missing/corrupt model fails before the slow TF load.
    with report.stage("load ONNX", status) as st:
        model = load_model(model_path)
        st.nodes = len(model.graph.node)
    model, choice = _session_kernels(model, kernels, device, report, status)
    _verify(model, model_path, src_path, opts, status, device, data, report)
    if report.parity is not None:
        report.parity.kernels = choice.to_json()
    return report


def verify_device(device: str, kernels: str = "auto") -> str:
    """'cpu' or 'cuda' for verify's --device, and --kernels checked against it: bad input
    (one line, exit 2) before any slow work."""
    if device not in VERIFY_DEVICES:
        raise BertfuseError(f"device must be one of {', '.join(VERIFY_DEVICES)}, not {device!r}")
    check_kernels_option(kernels)
    ort = optional("onnxruntime", why="ONNX Runtime (cpu or gpu extra)")

    have = ort.get_available_providers()
    if device == "auto":
        device = "cuda" if "CUDAExecutionProvider" in have else "cpu"
    elif device == "cuda" and "CUDAExecutionProvider" not in have:
        raise BertfuseError(f"--device cuda: onnxruntime {ort.__version__} has no CUDA "
                            f"execution provider (it has {', '.join(have)}); install "
                            "onnxruntime-gpu, or verify with --device cpu")
    if kernels == "bertfuse" and device != "cuda":
        raise BertfuseError("--kernels bertfuse: bertfuse's ops run on CUDA only, and this "
                            "verify runs on the CPU (--kernels auto or ort checks the model "
                            "as ONNX Runtime's CPU runs it)")
    return device


def _session_kernels(model: onnx.ModelProto, kernels: str, device: str, report: RunReport,
                     status: Status | None):
    """The model a Session on `device` would run, and its KernelChoice: choose() itself (on
    the CPU instant, the model as written; on CUDA a stage of its own: the op library, the
    lowering and its check on the device)."""
    max_seq = model_facts(model).max_positions or 512
    if device != "cuda":
        return choose(model, kernels, device, max_seq)
    with report.stage("kernels (on the device)", status) as st:
        model, choice = choose(model, kernels, device, max_seq, {"use_tf32": "0"})
        st.nodes, st.detail = len(model.graph.node), choice.line()
    return model, choice


def _verify(model: onnx.ModelProto, model_path: str, src_path: str | None,
            opts: ConvertOptions, status: Status | None, device: str,
            data: ParityData | None, report: RunReport) -> RunReport:
    if src_path is None:
        with report.stage("verify vs saved outputs", status) as st:
            report.parity = verify_against_saved(model, data, _precision_of(model), opts.atol,
                                                 opts.rtol, model_path, device)
            st.detail = "ok" if report.parity.ok else "DRIFT"
        return report
    check_source_form(src_path, opts.kind)
    with report.stage("load TF model", status) as st:
        source = load_source(src_path, opts.kind, opts.signature, opts.inputs, opts.outputs,
                             opts.config, opts.trust_model)
        st.nodes, report.notes = source.tf_node_count, list(source.notes)
    try:
        model = match_interface(model, source, model_path, src_path,
                                parse_override(opts.inputs))
        with report.stage("verify vs TensorFlow", status) as st:
            try:
                report.parity = verify_against_tf(model, source, _precision_of(model),
                                                  opts.batch, opts.seq, opts.seed,
                                                  atol=opts.atol, rtol=opts.rtol, data=data,
                                                  model_path=model_path, device=device)
            except Exception as exc:
                if not (isinstance(exc, OrtRunError)
                        or type(exc).__module__.startswith("onnxruntime")):
                    raise
                # The user's pairing of model and source is wrong (e.g. another vocab size).
                first = exc.detail if isinstance(exc, OrtRunError) else \
                    (str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
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
