"""Runtime fixtures: the ckpt_erf fixture converted by `bertfuse convert` (fp32, fp16, raw),
module-wide sessions and plain onnxruntime references.
"""

from __future__ import annotations

import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.runtime.session import Session  # noqa: E402
from support.runtime_common import new_session, plain_session  # noqa: E402


@pytest.fixture(scope="module")
def models(tiny_onnx) -> dict[str, str]:
    """'fp32' / 'fp16' fused models and the 'raw' unfused graph, as paths."""
    return tiny_onnx


@pytest.fixture(scope="module")
def sessions(models) -> dict[str, Session]:
    """Module-wide runtime sessions: 'fp32', 'fp16' (mask variants on at every length, so the
    tests reach them below the GPU-measured default of seq 128), 'fp32-raw' (variants off)."""
    return {"fp32": new_session(models["fp32"], right_padded="keylen"),
            "fp16": new_session(models["fp16"], right_padded="keylen"),
            "fp32-raw": new_session(models["fp32"], mask_variants=False)}


@pytest.fixture(scope="module")
def references(models) -> dict:
    return {k: plain_session(models[k]) for k in ("fp32", "fp16")}


@pytest.fixture(scope="module")
def cpu(tiny_onnx) -> Session:
    return Session(tiny_onnx["fp32"], max_batch=8, device="cpu")


@pytest.fixture(scope="module")
def reference(tiny_onnx):
    return plain_session(tiny_onnx["fp32"])
