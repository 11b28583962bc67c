"""Which models need bertfuse's op library, and registering it on a session for one.

Apart from library.py, which finds and loads the library: that module is what the platform
wheel's build imports (setup.py -> kernels/prebuild.py -> build.py -> library.py), in a build
environment that has setuptools and wheel but not onnx, which this module reads models with.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import onnx

from bertfuse.kernels.library import DOMAIN, KernelLibraryError, register


def uses_library(model: Any) -> bool:
    """Whether a model (ModelProto, serialized bytes or a path) has ai.bertfuse nodes."""
    if isinstance(model, (bytes, bytearray)):
        if DOMAIN.encode() not in model:  # cheap: most models never mention the domain
            return False
        model = onnx.ModelProto.FromString(bytes(model))
    elif isinstance(model, (str, os.PathLike)):
        if not file_mentions(model, DOMAIN.encode()):
            return False
        model = onnx.load(str(model), load_external_data=False)
    graphs = [model.graph]
    while graphs:  # nodes of subgraphs (If/Loop/Scan bodies) too
        g = graphs.pop()
        for node in g.node:
            if node.domain == DOMAIN:
                return True
            graphs += [a.g for a in node.attribute if a.HasField("g")]
            graphs += [sg for a in node.attribute for sg in a.graphs]
    return any(n.domain == DOMAIN for f in model.functions for n in f.node)


def file_mentions(path: str | os.PathLike, needle: bytes, chunk: int = 1 << 24) -> bool:
    """Whether the file holds `needle`, read in chunks (a model's weights need no parsing)."""
    tail = b""
    with open(path, "rb") as f:
        while block := f.read(chunk):
            if needle in tail + block[:len(needle)] or needle in block:
                return True
            tail = block[-len(needle):]
    return False


def prepare(session_options: Any, model: Any, device: str, uses: bool | None = None,
            path: str | Path | None = None) -> bool:
    """Registers the library (`path`, default the cached build) on `session_options` when
    `model` has ai.bertfuse ops (`uses`: the caller already knows whether it has).

    Returns whether it did. On a CPU device such a model cannot run: KernelLibraryError."""
    if not (uses_library(model) if uses is None else uses):
        return False
    if device != "cuda":
        raise KernelLibraryError(
            f"this model uses bertfuse's own CUDA ops (domain {DOMAIN}), which run only on a CUDA GPU: "
            "open it with device='cuda', or convert it with --ops contrib for CPU")
    register(session_options, path)
    return True
