"""`bertfuse export-triton`: a model repository for Triton Inference Server's stock
onnxruntime backend (what NVIDIA's Triton container runs).

    REPO/NAME/config.pbtxt      platform "onnxruntime_onnx", max_batch_size, dynamic batching,
                                instance group, every input and output of the model
    REPO/NAME/1/model.onnx      a copy of the model (and of its external weight files)
    REPO/NAME/libbertfuse_ops.so  for a model with bertfuse's own ops (ai.bertfuse): the op
                                library built for this GPU, named in model_operations

Batching is Triton's: each tensor's first (batch) dimension is left out of `dims`, and
max_batch_size bounds it; the sequence dimension is -1. The repository entry is built in a
temporary directory beside REPO/NAME and renamed into place.

Only options the onnxruntime backend documents are written. It has no CUDA-graph option for
the CUDA execution provider (`optimization { cuda { graphs } }` is read by the TensorRT
backend only), so --cuda-graphs is refused with the reason rather than written and ignored.
What Triton could not load is refused too (BertfuseError, exit 2): bertfuse's CUDA ops or a
packed model on KIND_CPU, a packed model at all (its inputs are built per batch, which Triton's
batching would concatenate per request), a model without inputs or outputs, numbers past the
schema's int32. config.pbtxt is written by protobuf's text format from the ModelConfig that
io/triton_config.py builds (serve's /v2/models/NAME/config is the same message), so a
tensor name cannot write config of its own.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from bertfuse.errors import BertfuseError
from bertfuse.io.triton_config import INT32_MAX, Tensor, config_pbtxt, describe, model_config, \
    precision_of
from bertfuse.io.onnx_in import check_stranger
from bertfuse.io.safety import swap_dir_in, temp_dir
from bertfuse.io.write_errors import naming_the_path
from bertfuse.kernels.library import DOMAIN, KernelLibraryError, LIB_NAME, locate
from bertfuse.kernels.model_ops import uses_library
from bertfuse.runtime.request_checks import servable_model

CUDA_GRAPHS_REFUSED = (
    "--cuda-graphs: Triton's onnxruntime backend has no CUDA-graph option for the CUDA "
    "execution provider (optimization.cuda.graphs is read by the TensorRT backend only), and "
    "ONNX Runtime replays a captured graph on the addresses it was captured with, which "
    "Triton's per-request buffers do not keep; serve with bertfuse's Session for CUDA graphs")
PACKED_INPUTS = ("token_index", "token_offset", "cumulative_sequence_length", "token_bucket")


@dataclass
class TritonExport:
    """What export_triton wrote."""

    repo: str
    name: str
    config: str  # the config.pbtxt path
    model: str  # the copied model.onnx
    precision: str
    op_library: str | None = None  # the copied op library (a model with ai.bertfuse ops)
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[Tensor] = field(default_factory=list)

    def to_json(self) -> dict:
        io = lambda ts: [t.__dict__ for t in ts]  # noqa: E731
        return {"repo": self.repo, "name": self.name, "config": self.config, "model": self.model,
                "precision": self.precision, "op_library": self.op_library,
                "inputs": io(self.inputs),
                "outputs": io(self.outputs)}


def config_text(model: onnx.ModelProto, name: str, max_batch: int = 32, instances: int = 1,
                kind: str = "gpu", delay_us: int = 100, threads: int | None = None,
                op_library: str | None = None) -> str:
    """config.pbtxt for `model` (io/triton_config.py's ModelConfig in protobuf's text
    format, after two comment lines); op_library: the op library's path as Triton will see
    it (model_operations)."""
    cfg = model_config(model, name, max_batch, instances, kind, delay_us, threads, op_library)
    outputs = sorted({t.data_type for t in describe(model)[1]})
    return config_pbtxt(cfg, ["Written by bertfuse export-triton for Triton's onnxruntime "
                              "backend.", f"Model precision: {precision_of(model)} weights and "
                              f"activations; outputs {', '.join(outputs)}."])


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or name.startswith(".") or \
            not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise BertfuseError(f"--name {name!r}: a model name is letters, digits, '_', '-' and "
                            f"'.', not starting with '.'")


def _check_target(model_path: Path, data: list[str], repo: Path, target: Path,
                  force: bool) -> None:
    """REPO/NAME may replace nothing the command reads, and nothing it did not ask to."""
    if repo.exists() and not repo.is_dir():
        raise BertfuseError(f"{repo}: exists and is not a directory")
    if target.is_symlink():
        raise BertfuseError(f"{target}: is a symbolic link; not replacing it")
    if target.exists() and not target.is_dir():
        raise BertfuseError(f"{target}: exists and is not a directory")
    real_target = os.path.realpath(target)
    for f in [model_path, *(model_path.parent / d for d in data)]:
        real = os.path.realpath(f)
        if real == real_target or real.startswith(real_target + os.sep):
            raise BertfuseError(f"{target}: holds the input {f}; refusing to replace it "
                                f"(export to another repository or --name)")
    cwd = os.path.realpath(os.getcwd())
    if target.is_dir() and (real_target == cwd or cwd.startswith(real_target + os.sep)):
        raise BertfuseError(f"{target}: is the current directory (or holds it); not "
                            f"replacing it")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise BertfuseError(f"{target}: exists and is not empty; pass --force to replace it")


def _check_servable(model: onnx.ModelProto, src: Path, kind: str) -> bool:
    """Refuses what Triton's onnxruntime backend could not load or batch; returns whether the
    model needs bertfuse's op library."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if not inputs or not model.graph.output:
        what = "outputs" if inputs else "inputs"
        raise BertfuseError(f"{src}: the model has no {what}; Triton serves tensors in and out")
    packed = [i.name for i in model.graph.input if i.name in PACKED_INPUTS] or \
        [n.op_type for n in model.graph.node if n.op_type in ("PackedAttention", "RestorePadding")]
    if packed and kind == "cpu":
        raise BertfuseError(f"{src}: a packed model (bertfuse convert --packed: {packed[0]}) runs "
                            "on CUDA only, not --kind cpu; export the padded model")
    if packed:
        raise BertfuseError(f"{src}: a packed model's inputs ({packed[0]}, ...) describe one whole "
                            "batch, which Triton's batching would concatenate request by "
                            "request; export the padded model (convert without --packed)")
    uses = uses_library(model)
    if uses and kind == "cpu":
        raise BertfuseError(f"{src}: the model uses bertfuse's own CUDA ops ({DOMAIN}), which run "
                            "only on a GPU, not --kind cpu; convert it with --ops contrib for CPU")
    return uses


def _op_library(src: Path, path: str | None) -> Path:
    """The op library to copy: `path`, else the one built for this machine's GPU."""
    if path is not None:
        if not Path(path).is_file():
            raise BertfuseError(f"--op-library {path}: no such file")
        return Path(path)
    try:
        return locate()
    except KernelLibraryError as exc:
        why = str(exc).split(": build it")[0]
        raise BertfuseError(f"{src} uses bertfuse's own CUDA ops ({DOMAIN}), whose op library goes "
                            f"into the repository, and none is found ({why}): run `bertfuse "
                            "kernels build` first, or pass --op-library PATH") from None


def export_triton(model_path: str, repo: str, name: str | None = None, max_batch: int = 32,
                  instances: int = 1, kind: str = "gpu", delay_us: int = 100,
                  force: bool = False, cuda_graphs: bool = False,
                  threads: int | None = None, op_library: str | None = None,
                  triton_repo: str | None = None) -> TritonExport:
    """Writes REPO/NAME/config.pbtxt and REPO/NAME/1/model.onnx (plus external data, and the
    op library for a model with ai.bertfuse ops). triton_repo: where Triton will see REPO
    (an absolute path, e.g. /models in a container; default REPO's own absolute path)."""
    if cuda_graphs:
        raise BertfuseError(CUDA_GRAPHS_REFUSED)
    if kind not in ("gpu", "cpu"):
        raise BertfuseError(f"--kind must be gpu or cpu, not {kind!r}")
    for what, value, low, high in (
            ("--max-batch", max_batch, 1, INT32_MAX), ("--instances", instances, 1, INT32_MAX),
            ("--dynamic-batching-delay-us", delay_us, 0, 2**64 - 1),
            ("--intra-op-threads", 1 if threads is None else threads, 1, INT32_MAX)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise BertfuseError(f"{what} must be an integer in [{low}, {high}] (Triton's "
                                f"model config), got {value!r}")
    if triton_repo is not None and not os.path.isabs(triton_repo):
        raise BertfuseError(f"--triton-repo-path {triton_repo!r} must be absolute: Triton opens "
                            "the op library at that path, not relative to the repository")
    src = Path(model_path)
    model = servable_model(str(src))  # weights stay where they are; a skeleton is refused
    name = name if name is not None else src.name.removesuffix(".onnx")
    _check_name(name)
    library = _op_library(src, op_library) if _check_servable(model, src, kind) else None
    data = check_stranger(model, src)  # the external data files, each inside src's folder
    repo_dir, target = Path(os.path.abspath(repo)), Path(os.path.abspath(repo)) / name
    seen = os.path.join(triton_repo or str(repo_dir), name, LIB_NAME) if library else None
    text = config_text(model, name, max_batch, instances, kind, delay_us, threads, seen)
    _check_target(src, data, repo_dir, target, force)
    repo_dir.mkdir(parents=True, exist_ok=True)
    with naming_the_path(target, "the model's repository"), \
            temp_dir(repo_dir, prefix=f".{name}.") as tmp:
        os.chmod(tmp, 0o755)
        (tmp / "1").mkdir()
        shutil.copyfile(src, tmp / "1" / "model.onnx")
        for rel in data:
            (tmp / "1" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src.parent / rel, tmp / "1" / rel)
        if library is not None:
            shutil.copyfile(library, tmp / LIB_NAME)
            os.chmod(tmp / LIB_NAME, 0o755)
        (tmp / "config.pbtxt").write_text(text)
        swap_dir_in(tmp, target)
    return TritonExport(str(Path(repo)), name, str(Path(repo) / name / "config.pbtxt"),
                        str(Path(repo) / name / "1" / "model.onnx"), precision_of(model),
                        str(Path(repo) / name / LIB_NAME) if library else None,
                        *describe(model))
