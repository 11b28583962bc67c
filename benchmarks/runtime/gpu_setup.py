"""What the GPU-host runtime benchmarks (host_path.py, pdl_ab.py) share: their workloads, their
arguments, ONNX Runtime with pip's CUDA libraries loaded, and the fused fp16 model of a config
refilled from its weight-stripped skeleton (once per config)."""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

WORKLOADS = [("shenma-3l", 20, 64), ("base", 1, 128), ("base", 32, 128)]


def parse_args(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--skeletons", default="out/skeletons")
    ap.add_argument("--iters", type=int, default=3000)
    return ap.parse_args()


def start_ort() -> Any:
    import onnxruntime as ort

    ort.preload_dlls()
    return ort


def fused_model(models: dict[str, str], skeletons: str, config: str) -> str:
    """The bertfuse fp16 model of `config` (cached in `models`)."""
    from bertfuse.bench.models import prepare_models

    if config not in models:
        models[config] = prepare_models(os.path.join(skeletons, f"{config}_raw.skel.onnx"),
                                        tempfile.mkdtemp(prefix=f"bench-{config}-"),
                                        anchors=False)["bertfuse16"]
    return models[config]
