"""What the pass tests share: run a graph with ORT before and after, compare, count ops.

Every case runs ORT CPU (no graph optimisation) on the graph before and after the pass(es) on
the same fresh random inputs (masks padded at the end, in the middle and at the start of rows,
never all zeros), requires max |diff| <= 1e-4 (fp32), and counts the ops by (domain, op).
The seed of every test is printed in its failure message; BERTFUSE_TEST_SEED=<n> replays one.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.passes.cleanup import Cleanup  # noqa: E402
from bertfuse.passes.manager import run_passes  # noqa: E402

from support.builders.onnx_graphs import census, mask_rows  # noqa: E402

TOL = 1e-4
H, N, INTER = 16, 2, 32
B, S = 4, 6  # differs from the passes' probe shape (3, 7) on purpose


def session(model: onnx.ModelProto):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    ins = {i.name for i in sess.get_inputs()}
    return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in ins})))


def fuse(model: onnx.ModelProto, *passes):
    """The given passes plus Cleanup (or the fusion plan, plans.fusion_plan, with none given)."""
    return run_passes(model, [*passes, Cleanup()] if passes else None)


def assert_same(before: onnx.ModelProto, after: onnx.ModelProto, feeds, seed: int,
                tol: float = TOL) -> dict[str, np.ndarray]:
    want, got = run(before, feeds), run(after, feeds)
    assert set(want) == set(got), f"outputs changed: {sorted(want)} -> {sorted(got)}"
    for name in want:
        assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
        diff = float(np.abs(got[name].astype(np.float64) - want[name]).max())
        assert diff <= tol, f"{name}: max |diff| {diff:.3g} > {tol} (seed {seed})"
    return got


def count(model, op: str, domain: str = "") -> int:
    return census(model)[(domain, op)]


def node(model, op: str) -> onnx.NodeProto:
    (n,) = [n for n in model.graph.node if n.op_type == op]
    return n


def attr(n: onnx.NodeProto, name: str, default=None):
    for a in n.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def missed(report, component: str) -> list[str]:
    return [d.reason for d in report.diagnostics if d.component == component and not d.fused]


def fused_in(report, component: str) -> list[int | None]:
    """The layers of the component's fused diagnostics, in order."""
    return [d.layer for d in report.diagnostics if d.component == component and d.fused]


def vec(rng, n, s=0.3, o=0.0):
    return (rng.standard_normal(n) * s + o).astype(np.float32)


def bert_feeds(rng, dtype=np.int32):
    """Feeds for support.builders.onnx_graphs.bert (vocab 40, 2 token types)."""
    return {"input_ids": rng.integers(0, 40, (B, S)).astype(dtype),
            "segment_ids": rng.integers(0, 2, (B, S)).astype(dtype),
            "input_mask": mask_rows(B, S, rng, dtype)}
