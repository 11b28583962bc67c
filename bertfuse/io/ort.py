"""The one place bertfuse opens an ONNX Runtime session.

    sess = make_session(model, device="cuda", cuda_options={"enable_cuda_graph": "1"})

`make_session` owns what every caller used to set by hand: the provider list (the CPU EP, or
the CUDA EP with its options), the SessionOptions (log severity, graph optimisation, config
entries), and bertfuse's op library: a model with ai.bertfuse nodes gets libbertfuse_ops.so
registered on CUDA, and a KernelLibraryError (kernels/library.py) on the CPU.

onnxruntime is imported on the first call only: `import bertfuse` never loads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Union

from bertfuse.errors import CudaUnavailableError
from bertfuse.kernels.model_ops import prepare
from bertfuse.optional import optional

if TYPE_CHECKING:
    import onnx

Model = Union[str, os.PathLike, bytes, "onnx.ModelProto"]
DEVICES = ("cpu", "cuda")


def make_session(model: Model, *, device: str = "cpu",
                 cuda_options: Mapping[str, str] | None = None, optimize: bool = True,
                 log_severity: int = 3, register_kernels: bool | Literal["auto"] = "auto",
                 kernels_library: str | Path | None = None,
                 config: Mapping[str, str] | None = None,
                 optimized_model_path: str | Path | None = None,
                 intra_op_threads: int | None = None) -> Any:
    """An onnxruntime.InferenceSession of `model` (a path, serialized bytes or a ModelProto
    under protobuf's 2 GB; a larger one goes by io.model.scratch_file).

    device: 'cpu' (CPUExecutionProvider) or 'cuda' (CUDAExecutionProvider with `cuda_options`).
    optimize=False: ORT_DISABLE_ALL (the graph exactly as written). log_severity: ORT's
    session log level (3 errors only, 4 fatal only: run errors come back as exceptions).
    register_kernels: 'auto' registers bertfuse's op library when the model has ai.bertfuse
    nodes; True always (the caller knows it does); False never (ORT then refuses such a model
    itself). kernels_library: that library's path (default: the cached build for this GPU).
    config: session config entries (e.g. session.disable_cpu_ep_fallback).
    optimized_model_path: where ORT writes the graph it placed and optimised.
    intra_op_threads: the session's intra-op thread pool size (None: ORT's default, one
    thread per physical core)."""
    ort = optional("onnxruntime", why="ONNX Runtime (cpu or gpu extra)")

    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    opts = ort.SessionOptions()
    opts.log_severity_level = log_severity
    if intra_op_threads is not None:
        opts.intra_op_num_threads = intra_op_threads
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for key, value in (config or {}).items():
        opts.add_session_config_entry(key, value)
    if optimized_model_path is not None:
        opts.optimized_model_filepath = str(optimized_model_path)
    if register_kernels is not False:  # ai.bertfuse ops: CUDA + the op library, else refused
        uses = None if register_kernels == "auto" else True
        prepare(opts, model, device, uses=uses, path=kernels_library)
    providers: list = [("CUDAExecutionProvider", dict(cuda_options or {}))] \
        if device == "cuda" else ["CPUExecutionProvider"]
    if isinstance(model, (str, os.PathLike)):
        data: str | bytes = os.fspath(model)
    elif isinstance(model, (bytes, bytearray)):
        data = bytes(model)
    else:  # a ModelProto past protobuf's 2 GB: save it first (io.model.scratch_file)
        data = model.SerializeToString()
    if device == "cuda":
        _preload_cuda(ort)
    sess = ort.InferenceSession(data, opts, providers=providers)
    if device == "cuda" and "CUDAExecutionProvider" not in sess.get_providers():
        # ORT falls back to the CPU with a warning; every device-bound call would then fail
        # on the first request, far from the cause.
        raise CudaUnavailableError(
            f"ONNX Runtime {ort.__version__} did not start its CUDA execution provider (no "
            "GPU or driver, onnxruntime without CUDA, or a CUDA/cuDNN library it needs not "
            "found: ONNX Runtime's log line above says which); pip install "
            "'bertfuse[gpu]' on a CUDA 13 host, or use device='cpu'")
    return sess


_preloaded = False


def _preload_cuda(ort: Any) -> None:
    """CUDA and cuDNN from pip's nvidia-* wheels (onnxruntime-gpu >= 1.21 finds them only
    when asked), once per process, before the first CUDA session of any caller (verify,
    bench, the runtime's device check)."""
    global _preloaded
    if not _preloaded and hasattr(ort, "preload_dlls") and \
            "CUDAExecutionProvider" in ort.get_available_providers():
        ort.preload_dlls()
    _preloaded = True
