"""Which kernels a session runs: ONNX Runtime's contrib ops, or bertfuse's own, chosen at load.

    model (contrib form) ─► kernels='ort', a CPU device, or an fp32 model ─► as written
                         └► 'auto' | 'bertfuse' on CUDA:
                              the op library (cached, else built on first use)
                              ─► lowered (passes/bertfuse_encoder.py: each covered layer)
                              ─► one padded batch through both forms on the device,
                                 within fp16 limits (ops/contract.TOLERANCES)
                              ─► the lowered form; else 'auto' keeps the contrib form and
                                 says why in one line, 'bertfuse' raises

A pool's replicas and later sessions of the same model file reuse the first decision (the
lowering is redone, the device check is not). A model written with `convert --ops bertfuse` (ai.bertfuse nodes already) runs as written
under 'auto' and 'bertfuse'; 'ort' cannot undo the lowering and says so. The choice is made on
the machine that runs the model: conversion usually happens on a CPU host with TensorFlow,
serving on a GPU host without it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import onnx

from bertfuse.errors import BertfuseError, CudaUnavailableError
from bertfuse.ops.contract import BERTFUSE_DOMAIN, TOLERANCES
from bertfuse.runtime.request_checks import ConfigError, model_facts
from bertfuse.io.inputs import random_inputs
from bertfuse.io.ort import make_session
from bertfuse.kernels.build import build as build_library
from bertfuse.kernels.library import KernelLibraryError, locate
from bertfuse.ops.bertfuse.bert_attention import TENSOR_CORE_HEAD_SIZES

KERNELS = ("auto", "ort", "bertfuse")
LOG = logging.getLogger("bertfuse.runtime")
CHECK_BATCH, CHECK_SEQ = 4, 64  # the device check's padded batch (seq capped by max_seq)


@dataclass
class KernelChoice:
    """What a session runs on and why. used: 'ort' or 'bertfuse'; layers: (lowered, all)
    attention layers; max_diff/mean_diff: the device check's worst output (NaN: not run)."""

    asked: str
    used: str
    reason: str
    layers: tuple[int, int] = (0, 0)
    misses: list[str] = field(default_factory=list)
    max_diff: float = float("nan")
    mean_diff: float = float("nan")
    seconds: float = 0.0
    settled: bool = True  # False: a missing library decided it, which a build can change

    def line(self) -> str:
        """One line for logs: which kernels, and why."""
        return f"kernels={self.asked}: {self.used} ({self.reason})"

    def to_json(self) -> dict[str, Any]:
        return {"asked": self.asked, "used": self.used, "reason": self.reason,
                "layers": list(self.layers), "misses": self.misses,
                "max_diff": None if np.isnan(self.max_diff) else self.max_diff,
                "mean_diff": None if np.isnan(self.mean_diff) else self.mean_diff,
                "seconds": round(self.seconds, 3)}


class KernelChoiceError(ConfigError):
    """kernels='bertfuse' asked where bertfuse's ops cannot serve this model."""


def check_kernels_option(kernels: Any) -> str:
    if not isinstance(kernels, str) or kernels not in KERNELS:
        raise ConfigError(f"kernels must be one of {', '.join(map(repr, KERNELS))}, not {kernels!r}")
    return kernels


def has_bertfuse_ops(proto: onnx.ModelProto) -> bool:
    return any(n.domain == BERTFUSE_DOMAIN for n in proto.graph.node)


def is_fp16(proto: onnx.ModelProto) -> bool:
    return any(i.data_type == onnx.TensorProto.FLOAT16 for i in proto.graph.initializer)


# Decisions already made in this process, by (model file, options): a SessionPool's replicas
# and a server's restarts of one file lower it again but skip the device check. The lowered
# models are not kept (a copy of the weights each); the decision is a few fields.
_DECIDED: dict[tuple, KernelChoice] = {}
_DECIDING: dict[tuple, threading.Lock] = {}
_DECIDED_LOCK = threading.Lock()


def choose(proto: onnx.ModelProto, kernels: str, device: str, max_seq: int,
           provider_options: Any = None, build: bool = True,
           source: tuple | None = None) -> tuple[onnx.ModelProto, KernelChoice]:
    """The model a session should open, and why. See the module docstring. `source` (the
    model file's identity: path, mtime, size) lets later sessions of the same file reuse the
    first one's decision and device check."""
    check_kernels_option(kernels)
    if source is None or kernels == "ort" or device != "cuda":
        return _timed_choice(proto, kernels, device, max_seq, provider_options, build)
    key = (source, kernels, device, max_seq, repr(sorted(dict(provider_options or {}).items())))
    with _DECIDED_LOCK:
        lock = _DECIDING.setdefault(key, threading.Lock())
    with lock:  # replicas starting together: the first decides, the others wait for it
        decided = _DECIDED.get(key)
        if decided is None:
            model, choice = _timed_choice(proto, kernels, device, max_seq, provider_options,
                                          build)
            if choice.settled:
                _DECIDED[key] = choice
            return model, choice
    start = time.perf_counter()
    model = proto
    if decided.used == "bertfuse" and not has_bertfuse_ops(proto):
        model, _, _ = lower(proto)  # deterministic: the form the device check passed
    choice = replace(decided, reason=f"{decided.reason}; as decided for this model's first "
                     "session in this process", seconds=time.perf_counter() - start)
    LOG.debug(choice.line())
    return model, choice


def file_identity(model: Any) -> tuple | None:
    """(real path, mtime ns, size) of a model given as a path: the key under which choose()
    remembers its decision; None for a ModelProto (nothing tells two protos apart cheaply)."""
    if not isinstance(model, (str, os.PathLike)):
        return None
    try:
        st = os.stat(model)
    except OSError:
        return None
    return (os.path.realpath(model), st.st_mtime_ns, st.st_size)


def _timed_choice(proto: onnx.ModelProto, kernels: str, device: str, max_seq: int,
                  provider_options: Any, build: bool) -> tuple[onnx.ModelProto, KernelChoice]:
    start = time.perf_counter()
    model, choice = _choose(proto, kernels, device, max_seq, provider_options, build)
    choice.seconds = time.perf_counter() - start
    if kernels != "ort" and device == "cuda":
        (LOG.info if choice.used == "bertfuse" else LOG.warning)(choice.line())
    return model, choice


def _choose(proto: onnx.ModelProto, kernels: str, device: str, max_seq: int,
            provider_options: Any, build: bool) -> tuple[onnx.ModelProto, KernelChoice]:
    lowered_already = has_bertfuse_ops(proto)
    if lowered_already:
        if kernels == "ort":
            raise KernelChoiceError(
                "kernels='ort': this model was written with bertfuse's ops (convert --ops "
                "bertfuse) and cannot be run on ONNX Runtime's contrib ops; convert it with "
                "--ops contrib, or open it with kernels='auto'")
        return proto, KernelChoice(kernels, "bertfuse", "written with bertfuse's ops")
    if kernels == "ort":
        return proto, KernelChoice(kernels, "ort", "asked")

    def fall_back(why: str) -> tuple[onnx.ModelProto, KernelChoice]:
        if kernels == "bertfuse":
            raise KernelChoiceError(f"kernels='bertfuse': {why}")
        return proto, KernelChoice(kernels, "ort", why)

    if device != "cuda":
        return fall_back("bertfuse's ops run on CUDA only; this session is on the CPU")
    if not is_fp16(proto):
        return fall_back("the model is fp32 and bertfuse's ops are fp16: convert it with "
                         "--precision fp16")
    slow = general_path_heads(proto)
    if slow and kernels == "auto":
        # Measured on an H200 (docs/journal/kernels.md): TinyBERT's head size 26 on the
        # general path is ~1.7x slower than ONNX Runtime's kernels, so auto keeps those.
        return fall_back(f"head size {slow[0]} runs on bertfuse's general attention path only, "
                         "slower than ONNX Runtime's kernels (kernels='bertfuse' uses it anyway)")
    try:
        library = ensure_library(build)
    except BertfuseError as exc:
        model, choice = fall_back(str(exc).splitlines()[0])
        choice.settled = False
        return model, choice
    lowered, misses, layers = lower(proto)
    if layers[0] == 0:
        return fall_back("no layer could be lowered" + (f" ({misses[0]})" if misses else ""))
    try:
        worst_max, worst_mean, bad = device_check(proto, lowered, library, max_seq,
                                                  provider_options)
    except CudaUnavailableError:  # no CUDA at all: the session itself cannot open either
        raise
    except Exception as exc:  # noqa: BLE001 (any failure to run the lowered form is a fallback)
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:240]
        return fall_back(f"the lowered form failed on the device ({first})")
    if bad:
        return fall_back(f"the lowered form differs from the contrib form on the device: {bad}")
    lowered_all = layers[0] == layers[1] and not misses
    reason = (f"{layers[0]} of {layers[1]} layers on bertfuse's ops" +
              ("" if lowered_all else f"; kept contrib: {misses[0]}"
               + (f" (+{len(misses) - 1} more)" if len(misses) > 1 else "")) +
              f"; device check max {worst_max:.2e}, mean {worst_mean:.2e}")
    choice = KernelChoice(kernels, "bertfuse", reason, layers, misses, worst_max, worst_mean)
    return lowered, choice


def ensure_library(build: bool = True, say: Callable[[str], None] | None = None) -> str:
    """The op library's path for this GPU: the platform wheel's where it runs here, else the
    cache's, else built now into the cache (first use) where `build`."""
    try:
        path = str(locate())
        LOG.debug("bertfuse op library: %s", path)
        return path
    except KernelLibraryError:
        if not build:
            raise

    say = say or (lambda msg: LOG.warning("bertfuse op library: %s", msg))
    say("not built for this GPU yet: building it once into the cache (about a minute)")
    start = time.perf_counter()
    path = build_library(say=say)
    say(f"built in {time.perf_counter() - start:.0f} s: {path}")
    return str(path)


def lower(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], tuple[int, int]]:
    """The contrib model rewritten into ai.bertfuse ops where each layer is covered; the
    reasons for what stayed contrib; (attention layers lowered, attention layers)."""
    from bertfuse.passes.manager import run_passes
    from bertfuse.passes.plans import lowering_plan

    model, report = run_passes(proto, lowering_plan())
    misses = [str(d) for d in report.diagnostics if not d.fused]
    total = sum(n.op_type == "Attention" and n.domain == "com.microsoft" for n in proto.graph.node)
    done = sum(n.op_type == "BertAttention" and n.domain == BERTFUSE_DOMAIN
               for n in model.graph.node)
    return model, misses, (done, total)


def general_path_heads(proto: onnx.ModelProto) -> list[int]:
    """Head sizes of the model's contrib Attention layers that no tensor-core kernel covers."""
    shapes = {t.name: list(t.dims) for t in proto.graph.initializer}
    found = []
    for node in proto.graph.node:
        if node.op_type != "Attention" or node.domain != "com.microsoft":
            continue
        heads = next((a.i for a in node.attribute if a.name == "num_heads"), 0)
        weight = shapes.get(node.input[1]) if len(node.input) > 1 else None
        if heads > 0 and weight and len(weight) == 2 and weight[1] % (3 * heads) == 0:
            size = weight[1] // (3 * heads)
            if size not in TENSOR_CORE_HEAD_SIZES and size not in found:
                found.append(size)
    return found


def check_feeds(proto: onnx.ModelProto, batch: int, seq: int) -> dict[str, np.ndarray]:
    """A padded batch (padding at the end, in the middle and at the start of rows) for the
    canonical inputs, ids within the vocab read off the model."""
    facts = model_facts(proto)
    seq = min(seq, facts.max_positions or seq)
    feeds = random_inputs(batch, seq, facts.vocab_size or 100, facts.type_vocab_size or 1,
                          seed=0, pad_anywhere=True)
    return {name: feeds[name] for name in facts.inputs if name in feeds}


def device_check(contrib: onnx.ModelProto, lowered: onnx.ModelProto, library: str,
                 max_seq: int, provider_options: Any = None) -> tuple[float, float, str]:
    """Both forms on the GPU on one padded batch: (worst max |diff|, worst mean |diff|, why it
    fails or ''). Kept positions only: padded rows of [B, S, ...] outputs carry no meaning."""
    feeds = check_feeds(contrib, CHECK_BATCH, min(CHECK_SEQ, max_seq))
    options = dict(provider_options or {})
    want_sess = make_session(contrib.SerializeToString(), device="cuda", cuda_options=options,
                             register_kernels=False)
    got_sess = make_session(lowered.SerializeToString(), device="cuda", cuda_options=options,
                            register_kernels=True, kernels_library=library)
    names = [o.name for o in want_sess.get_outputs()]
    want = dict(zip(names, want_sess.run(names, feeds)))
    got = dict(zip(names, got_sess.run(names, feeds)))
    del want_sess, got_sess
    return compare_outputs(want, got, feeds.get("input_mask"))


def compare_outputs(want: dict[str, np.ndarray], got: dict[str, np.ndarray],
                    mask: np.ndarray | None) -> tuple[float, float, str]:
    """(worst max |diff|, worst mean |diff|, why the lowered form fails or '') over every
    output, at kept positions where an output is [B, S, ...]; NaN or Inf fails."""
    limit = TOLERANCES["fp16"]
    worst_max = worst_mean = 0.0
    for name, a in want.items():
        b = got.get(name)
        if b is None or np.shape(a) != np.shape(b):
            return worst_max, worst_mean, f"{name} has shape {np.shape(b)}, not {np.shape(a)}"
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if mask is not None and a.ndim >= 2 and a.shape[:2] == mask.shape:
            keep = mask.astype(bool)
            a, b = a[keep], b[keep]
        if not np.isfinite(b).all():
            return worst_max, worst_mean, f"{name} has non-finite values"
        if b.size == 0:
            continue
        diff = np.abs(a - b)
        d_max, d_mean = float(diff.max()), float(diff.mean())
        worst_max, worst_mean = max(worst_max, d_max), max(worst_mean, d_mean)
        if not (d_max <= limit["max"] and d_mean <= limit["mean"]):
            return worst_max, worst_mean, (f"{name} max |diff| {d_max:.3g}, mean {d_mean:.3g} "
                                           f"(limits {limit['max']}, {limit['mean']})")
    return worst_max, worst_mean, ""
