"""LayerNormalization from any elementwise form a TF graph takes.

TF's tf.nn.moments + batch_normalization (Google's modeling.py, Keras) as tf2onnx exports it:

    x ─┬─► ReduceMean|GlobalAveragePool ─► m ─┬───────────────────────► Mul(m, g) ─► Sub(beta, ·) ─┐
       ├─► Sub(x, m) ─► Mul(self)|Pow(2) ─► ReduceMean ─► Add(eps) ─► Sqrt ─► Reciprocal ─► g=Mul(γ)│
       └─► Mul(x, g) ──────────────────────────────────────────────────────────────────► Add ◄────┘ ─► y

and Keras/HF's direct form  y = (x - m) / Sqrt(var + eps) * γ + β  (or Neg(m)*g + β, ...).

Matching is on math, not shape: from each mean-like reduce the pass takes the closed
elementwise region that x feeds, requires it to have one output y and exactly two reductions,
reads eps off the Add on the variance, then evaluates the region in float64 on random probes:
y must equal normalize(x) * γ + β for some per-channel γ, β, which it solves for and checks on
a fresh probe. Reductions over anything but the last axis fail that check.

Keras 2 libraries guard the divisor: keras-layer-normalization (keras-bert) takes
Sqrt(Max(var + eps, 0)), bert4keras also divides with div_no_nan, Where(Equal(s, 0), 0, d / s).
Both are no-ops on the math (var + eps > 0), so Max, Min, Equal and Where join the region and
the same probe check decides; eps added after the Sqrt is refused (no Add(eps) on the variance).

Candidates: every mean-like reduce whose output a Sub reads (a plain mean, such as pooling, is
not one); each ends fused or missed, in its encoder layer.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contrib.layernorm import CONTRACT as LAYER_NORM
from bertfuse.passes.base import CandidatePass, const, detach, replace_tensor, scalar_value
from bertfuse.passes.evaluate import ELEMENTWISE, GUARDS, closed_region, eval_elementwise, \
    region_outputs
from bertfuse.passes.match import MatchFailure, expect, fail

REDUCE = ("ReduceMean", "GlobalAveragePool")


class LayerNormFusion(CandidatePass):
    name = "layernorm"

    def candidates(self, graph: gs.Graph) -> Iterator[gs.Node]:
        for node in list(graph.nodes):
            # A fused region is detached (its reduces have no inputs left): not looked at again.
            if node.op not in REDUCE or not node.inputs:
                continue
            if any(c.op == "Sub" for c in node.outputs[0].outputs):
                yield node  # else a plain mean (pooling), not the start of a normalisation

    def match(self, graph: gs.Graph, node: gs.Node) -> tuple:
        return match_layernorm(graph, node.inputs[0])

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: tuple) -> None:
        region, y, gamma, beta, eps = found
        x = node.inputs[0]
        ln_out = gs.Variable(f"{y.name}_ln", dtype=y.dtype, shape=y.shape)
        ln = LAYER_NORM.node(f"{region[-1].name}_LayerNorm",
                             [x, const(f"{y.name}_gamma", gamma), const(f"{y.name}_beta", beta)],
                             [ln_out], axis=-1, epsilon=eps)
        graph.nodes.append(ln)
        replace_tensor(graph, y, ln_out)
        detach(region)


def match_layernorm(graph: gs.Graph, x: gs.Tensor) -> tuple:
    """(region, y, gamma, beta, eps) of the LayerNorm that x feeds; raises MatchFailure."""
    full = closed_region([x], ELEMENTWISE | GUARDS)
    expect(region_outputs(graph, full), "normalisation output not found")
    # Constant-only ops after the LN output (a mean pooling, a Tanh, ...) also land in the
    # closed region, so its last output need not be the LN's. Every tensor made in the region
    # is a candidate y, latest first (so γ and β are taken in, and an op after them that keeps
    # the result affine in normalize(x) too); y's ancestors in the region must hold exactly
    # the two reductions, be read outside only through y, and compute a LayerNorm.
    candidates = [t for n in reversed(full) for t in reversed(n.outputs)]
    reason = ""
    for y in candidates:
        region = _ancestors_within(full, y)
        if sum(n.op in REDUCE for n in region) != 2:
            continue
        try:
            return _fit(graph, x, region, y)
        except MatchFailure as failure:
            reason = reason or failure.reason  # the reason for the latest candidate
    if reason:
        fail(reason)
    reduces = [n for n in full if n.op in REDUCE]
    fail(f"expected 2 reductions (mean, variance), found {len(reduces)}")


def _fit(graph: gs.Graph, x: gs.Tensor, region: list[gs.Node], y: gs.Tensor) -> tuple:
    """(region, y, gamma, beta, eps) when `region` is closed with output y and computes
    normalize(x) * γ + β; raises MatchFailure otherwise."""
    expect(region_outputs(graph, region) == [y],
           "an intermediate of the normalisation is read outside it")
    reduces = [n for n in region if n.op in REDUCE]
    expect(len(reduces) == 2, f"expected 2 reductions (mean, variance), found {len(reduces)}")
    eps = _epsilon(reduces[1])
    expect(eps is not None, "variance is not followed by Add(epsilon)")
    hidden = _hidden_size(x, region)
    expect(hidden is not None, "hidden size unknown")
    rank = len(x.shape) if x.shape is not None else 2
    rng = np.random.default_rng(1234)
    probes = [rng.standard_normal((2,) * (max(rank, 2) - 1) + (hidden,)) * s + o
              for s, o in ((1.0, 0.0), (3.0, 0.5), (0.5, -1.0))]
    try:
        ys = [eval_elementwise(region, {id(x): p})[id(y)] for p in probes]
    except (KeyError, ValueError, FloatingPointError) as exc:
        fail(f"cannot evaluate the pattern ({exc})")
    ns = [_normalize(p, eps) for p in probes]
    expect(all(yv.shape == p.shape for yv, p in zip(ys, probes)),
           "output shape differs from input: not a last-axis normalisation")
    dn = (ns[0] - ns[1]).reshape(-1, hidden)
    dy = (ys[0] - ys[1]).reshape(-1, hidden)
    gamma = (dn * dy).sum(0) / (dn * dn).sum(0)
    beta = (ys[0] - ns[0] * gamma).reshape(-1, hidden).mean(0)
    check = ns[2] * gamma + beta
    err = np.abs(check - ys[2]).max() / (1.0 + np.abs(ys[2]).max())
    if not np.isfinite(err) or err > 1e-6:
        fail(f"does not compute a last-axis LayerNorm (rel. error {err:.2g})")
    return region, y, gamma.astype(np.float32), beta.astype(np.float32), float(eps)


def _normalize(x: np.ndarray, eps: float) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps)


def _epsilon(variance: gs.Node) -> float | None:
    for c in variance.outputs[0].outputs:
        if c.op == "Add":
            other = [t for t in c.inputs if t is not variance.outputs[0]]
            if other:
                eps = scalar_value(other[0])
                if eps is not None and 0 <= eps < 1e-2:
                    return eps
    return None


def _hidden_size(x: gs.Tensor, region: list[gs.Node]) -> int | None:
    if x.shape and isinstance(x.shape[-1], int) and x.shape[-1] > 0:
        return int(x.shape[-1])
    for node in region:
        for t in node.inputs:
            if isinstance(t, gs.Constant) and t.values.ndim >= 1 and t.values.size > 1:
                return int(t.values.shape[-1])
    return None


def _ancestors_within(region: list[gs.Node], y: gs.Tensor) -> list[gs.Node]:
    inside = {id(n): n for n in region}
    keep: set[int] = set()
    stack = [y]
    while stack:
        t = stack.pop()
        if t.inputs and id(t.inputs[0]) in inside and id(t.inputs[0]) not in keep:
            keep.add(id(t.inputs[0]))
            stack.extend(t.inputs[0].inputs)
    return [n for n in region if id(n) in keep]
