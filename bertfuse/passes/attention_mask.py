"""The attention mask: split off the softmax input and checked numerically.

    scores ─► Add(adder) ─► Softmax          adder = (1 - mask[b, j]) * c  (any form)
    Where(cond, scores, fill) ─► Softmax     cond  = mask[b, j] != 0

The adder (or Where condition) is evaluated with ONNX Runtime on probe masks with padding at
the end, middle and start of rows and must equal (1 - mask[b, j]) * c for one large negative
constant c, for every query row; then Attention can read the model's raw 2-D mask input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import producer, reaches_op, scalar_factor, scalar_value
from bertfuse.passes.evaluate import ancestors, eval_with_ort
from bertfuse.passes.match import MatchFailure, expect, fail
from bertfuse.io.inputs import probe_feeds, probe_mask


@dataclass
class MaskTerm:
    """An additive mask tensor, or a Where(condition, scores, fill) selection."""

    tensor: gs.Tensor
    fill: float | None = None  # Where form: the value written at padded positions
    keep_when_true: bool = True  # Where form: condition true means "attend"


def split_mask(t: gs.Tensor) -> tuple[gs.Tensor, MaskTerm | None]:
    """The softmax input as scores + adder, Where(cond, scores, fill), or plain scores.
    A scalar constant added last is dropped: softmax is shift-invariant (HF's
    stable_softmax adds 1e-9)."""
    node = producer(t)
    while node is not None and node.op == "Add" and len(node.inputs) == 2 and \
            len(t.outputs) == 1 and any(scalar_value(i) is not None for i in node.inputs):
        t = next(i for i in node.inputs if scalar_value(i) is None)
        node = producer(t)
    if node is not None and node.op == "Add" and len(node.inputs) == 2:
        a, b = node.inputs
        if _leads_to_matmul(a):
            return a, MaskTerm(b)
        if _leads_to_matmul(b):
            return b, MaskTerm(a)
    if node is not None and node.op == "Where":
        cond, x, y = node.inputs
        if _leads_to_matmul(x) and scalar_value(y) is not None:
            return x, MaskTerm(cond, scalar_value(y), True)
        if _leads_to_matmul(y) and scalar_value(x) is not None:
            return y, MaskTerm(cond, scalar_value(x), False)
    return t, None


def _leads_to_matmul(t: gs.Tensor) -> bool:
    """A MatMul's output, possibly through scalar scalings (the 1/sqrt(d) of Q or K)."""
    return reaches_op(t, "MatMul", lambda n: (scalar_factor(n) or (None,))[0], nodes=4)


def check_mask(graph: gs.Graph, term: MaskTerm) -> tuple[gs.Variable, float]:
    """The model input the mask term is a function of, and the additive constant; raises
    MatchFailure (the reason for the last input tried)."""
    _, sources = ancestors([term.tensor])
    expect(sources, "mask does not depend on any model input")
    last_reason = "no model input acts as the mask"
    for cand in sources:
        if cand.dtype is not None and np.dtype(cand.dtype).kind not in "iub":
            continue
        value: float | None = None
        for seed in (7, 11):
            feeds = probe_feeds(graph)
            mask = probe_mask(seed=seed)
            feeds[cand.name] = mask.astype(feeds[cand.name].dtype)
            try:
                (got,) = eval_with_ort(graph, [term.tensor], feeds)
            except Exception as exc:
                fail(f"cannot evaluate the mask subgraph ({type(exc).__name__})")
            try:
                value = _mask_constant(np.asarray(got), mask, term)
            except MatchFailure as failure:  # not this input: try the next
                last_reason, value = failure.reason, None
                break
        if value is not None:
            return cand, value
    fail(last_reason)


def _mask_constant(got: np.ndarray, mask: np.ndarray, term: MaskTerm) -> float:
    """c such that the term is (1 - mask[b, j]) * c at every query row; raises MatchFailure."""
    b, s = mask.shape
    expect(got.ndim == 4 and got.shape[0] in (1, b) and got.shape[-1] == s,
           f"mask term has shape {list(got.shape)}, expected [B, 1|N, 1|S, S]")
    full = np.broadcast_to(got, (b, got.shape[1], got.shape[2], s))
    keep = np.broadcast_to(mask[:, None, None, :].astype(bool), full.shape)
    if term.fill is not None:  # Where form: the condition must select exactly the kept keys
        cond = full.astype(bool)
        expect(np.array_equal(cond, keep if term.keep_when_true else ~keep),
               "Where condition does not follow the mask")
        expect(term.fill < -1.0, f"Where fills padded keys with {term.fill:.3g}")
        return term.fill
    if np.abs(full[keep]).max(initial=0.0) > 1e-6:
        fail("mask term is not 0 at kept positions")
    masked = full[~keep]
    expect(masked.size, "probe has no padding")
    c = float(masked.flat[0])
    if not np.allclose(masked, c, rtol=1e-6) or c > -1.0:
        fail(f"padded positions get {c:.3g}, not one large negative constant")
    return c
