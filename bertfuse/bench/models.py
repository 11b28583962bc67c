"""The models every benchmark runs: a weight-stripped raw skeleton refilled with seeded
weights, ORT's own optimizer output, bertfuse's passes (fp32/fp16, packed); ORT sessions with
inputs on the device; and the check that the CUDA EP can run here at all."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

from bertfuse.io.model import load_model
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan, packing_plan
from bertfuse.runtime.weights import fill_weights, is_stripped
from bertfuse.io.ort import make_session
from bertfuse.optional import optional


def bound_session(path: str, feeds: dict[str, np.ndarray], graph: bool = False,
                  strict_gpu: bool = False, extra: dict | None = None,
                  from_host: bool = False):
    """A CUDA session with inputs on the device and outputs bound to device buffers.
    from_host: each call first copies `feeds` (the request's host arrays) into the bound
    device inputs (OrtValue.update_inplace), as a server would per request."""
    ort = optional("onnxruntime", why="ONNX Runtime's fusions, the bench's rival")

    def open_bound(cuda_graph: bool):
        sess = make_session(path, device="cuda",
                            cuda_options={"enable_cuda_graph": "1" if cuda_graph else "0",
                                          **(extra or {})},
                            config={"session.disable_cpu_ep_fallback": "1"} if strict_gpu
                            else None)
        io = sess.io_binding()
        names = {i.name for i in sess.get_inputs()}
        for k, v in feeds.items():
            if k in names:
                ov = ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0)
                keep.append(ov)
                io.bind_ortvalue_input(k, ov)
        return sess, io

    keep: list = []
    # One probe run with ORT-allocated outputs gives the shapes, then fixed buffers are bound.
    # With CUDA graphs the probe runs on a session of its own: the graph session's first run
    # captures, and a graph captured into the probe's buffers would keep writing there.
    probe, io = open_bound(False)
    for o in probe.get_outputs():
        io.bind_output(o.name, "cuda")
    probe.run_with_iobinding(io)
    shapes = [v.shape() for v in io.get_outputs()]
    if graph:
        del probe, io
        keep.clear()
        sess, io = open_bound(True)
    else:
        sess = probe
        io.clear_binding_outputs()
    outs = {}
    for o, shape in zip(sess.get_outputs(), shapes):
        outs[o.name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, "cuda", 0)
        io.bind_ortvalue_output(o.name, outs[o.name])
    ro = ort.RunOptions()
    if not from_host:
        return (lambda: sess.run_with_iobinding(io, ro)), outs, sess, keep
    names = {i.name for i in sess.get_inputs()}
    copies = [(ov, feeds[k]) for k, ov in zip([k for k in feeds if k in names], keep)]

    def run_from_host() -> None:
        for ov, array in copies:
            ov.update_inplace(array)
        sess.run_with_iobinding(io, ro)

    return run_from_host, outs, sess, keep


def prepare_models(skeleton: str, workdir: str, seed: int = 0, anchors: bool = True,
                   ort_models: bool = True) -> dict[str, str]:
    """raw fp32 (refilled), raw fp16, ORT-optimized fp16, bertfuse fp32/fp16: paths by
    variant (anchors=False: the bertfuse models only; ort_models=False: raw fp32, the parity
    reference, without ORT's raw fp16 and optimizer models, most of a large model's setup)."""
    raw = load_model(skeleton)  # the user's file: limits, external data, the graph
    if is_stripped(raw):
        fill_weights(raw, seed)
    if not anchors:
        return _bertfuse_models(raw, workdir, {})
    paths = {"raw32": os.path.join(workdir, "raw32.onnx")}
    onnx.save(raw, paths["raw32"])
    if ort_models:
        paths.update(_ort_models(raw, paths["raw32"], workdir))
    return _bertfuse_models(raw, workdir, paths)


def _ort_models(raw: onnx.ModelProto, raw32: str, workdir: str) -> dict[str, str]:
    """ORT's own fp16 forms of the raw model: plain and through its transformer optimizer."""
    float16, optimizer = optional("onnxruntime.transformers", "float16", "optimizer",
                                  why="ONNX Runtime's fusions, the bench's rival")

    paths = {"raw16": os.path.join(workdir, "raw16.onnx")}
    r16 = float16.convert_float_to_float16(onnx.load(raw32), keep_io_types=True)
    onnx.save(r16, paths["raw16"])
    heads, hidden = _heads_hidden(raw)
    opt = optimizer.optimize_model(raw32, model_type="bert_tf", num_heads=heads,
                                   hidden_size=hidden, use_gpu=True)
    paths["ort_fused"] = json.dumps({k: v for k, v in opt.get_fused_operator_statistics().items()
                                     if v})
    opt.convert_float_to_float16(keep_io_types=True)
    paths["opt16"] = os.path.join(workdir, "opt16.onnx")
    opt.save_model_to_file(paths["opt16"])
    return paths


def _bertfuse_models(raw: onnx.ModelProto, workdir: str, paths: dict[str, str]) -> dict[str, str]:
    fused32, _ = run_passes(raw, fusion_plan("fp32"))
    paths["bertfuse32"] = os.path.join(workdir, "bertfuse32.onnx")
    onnx.save(fused32, paths["bertfuse32"])
    fused, report = run_passes(raw, fusion_plan("fp16"))
    paths["bertfuse16"] = os.path.join(workdir, "bertfuse16.onnx")
    onnx.save(fused, paths["bertfuse16"])
    paths["bertfuse_ops"] = json.dumps(dict(report.census_after))
    return paths


def _heads_hidden(raw: onnx.ModelProto) -> tuple[int, int]:
    meta = {p.key: p.value for p in raw.metadata_props}
    if "bert_config" in meta:
        cfg = json.loads(meta["bert_config"])
        return cfg["num_attention_heads"], cfg["hidden_size"]
    return 0, 0


def memcpy_nodes(path: str) -> int:
    """Memcpy nodes ORT inserts when it places the model on the CUDA EP."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "placed.onnx")
        make_session(path, device="cuda", optimized_model_path=out)
        model = onnx.load(out, load_external_data=False)
        return sum(1 for n in model.graph.node if n.op_type.startswith("Memcpy"))


def packed_form(fused: onnx.ModelProto) -> onnx.ModelProto:
    """The contrib form's packed model (PackedAttention; the runtime packs the requests)."""
    model, _ = run_passes(fused, packing_plan(on_kernels=False))
    return model


def no_cuda() -> str | None:
    """Why ONNX Runtime's CUDA EP cannot run here, or None: a one-node model in memory."""
    ort = optional("onnxruntime", why="ONNX Runtime's fusions, the bench's rival")

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider; install " \
               f"onnxruntime-gpu"
    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from pip's nvidia-* wheels, as main() does
        ort.preload_dlls()
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    probe = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])],
                                                "probe", io[:1], io[1:]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    try:
        sess = make_session(probe, device="cuda", log_severity=4, register_kernels=False)
    except Exception as exc:
        return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    if "CUDAExecutionProvider" not in sess.get_providers():
        return "the CUDA execution provider did not start (no GPU, or no CUDA driver)"
    return None
