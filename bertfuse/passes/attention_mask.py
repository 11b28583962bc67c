"""The attention mask: split off the softmax input and checked numerically.

    scores ─► Add(adder) ─► Softmax          adder = (1 - mask[b, j]) * c  (any form)
    Where(cond, scores, fill) ─► Softmax     cond  = mask[b, j] != 0

The adder (or Where condition) is evaluated with ONNX Runtime on probe masks with padding at
the end, middle and start of rows and must equal (1 - mask[b, j]) * c for one large negative
constant c, for every query row; then Attention can read the model's raw 2-D mask input.

The mask may also be computed in the graph (bert4keras: the ids' `!= 0`, key 0 always kept):

    ids ─► Equal(0) ─► Not ─► Slice[:, 1:] ─┐
          ConstantOfShape(true)[B, 1] ──────┴► Concat ─► m[B, S] ─► Unsqueeze ─► Where | adder

A [B, S] tensor whose values are 0/1 by construction (`is_binary`: a bool, a Cast of one, a
Concat of such and ones ...) is then fed the probe masks in place (cut there) and must pass
the same check; Attention reads it cast to int32. A model input that holds token ids (it
indexes an embedding) is a mask only where its values are read as "is it 0": one probe puts
ids > 1 at kept positions, so raw ids used as a mask are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.bertfuse.embed_layernorm import EMBEDDING_OPS
from bertfuse.passes.base import const_value, producer, reaches_op, scalar_factor, scalar_value
from bertfuse.passes.evaluate import ancestors, eval_with_ort
from bertfuse.passes.match import MatchFailure, expect, fail
from bertfuse.io.inputs import PROBE_BATCH, PROBE_SEQ, probe_feeds, probe_mask

# Ops whose output is 0/1 whenever their data inputs are (data inputs: all but index/shape).
_KEEPS_BINARY = {"Cast": 1, "Slice": 1, "Reshape": 1, "Unsqueeze": 1, "Squeeze": 1,
                 "Identity": 1, "Flatten": 1, "Transpose": 1, "Expand": 1, "Tile": 1,
                 "Gather": 1, "Concat": None, "Mul": None, "Min": None, "Max": None}
_BOOL_OPS = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or",
             "Xor", "IsNaN", "IsInf")
_ID_READERS = {"Gather": 1, **{op: (0, 1) for op in EMBEDDING_OPS}}  # slots that index a table


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
    """The model input, or the 0/1 [B, S] tensor computed in the graph, the mask term is a
    function of, and the additive constant; raises MatchFailure (the reason for the last
    one tried)."""
    _, sources = ancestors([term.tensor])
    expect(sources, "mask does not depend on any model input")
    last_reason = "no model input acts as the mask"
    for cand in sources:
        if cand.dtype is not None and np.dtype(cand.dtype).kind not in "iub":
            continue
        try:
            return cand, _probe_term(graph, term, cand)
        except MatchFailure as failure:  # not this input: try the next
            last_reason = failure.reason
    for cand in computed_masks(graph, [term.tensor]):
        try:
            return cand, _probe_term(graph, term, cand)
        except MatchFailure as failure:
            last_reason = f"0/1 mask {producer(cand).name}: {failure.reason}"
    fail(last_reason)


def _probe_term(graph: gs.Graph, term: MaskTerm, cand: gs.Variable) -> float:
    """c of the term with the probe masks fed to `cand` (an input, or an inner tensor cut
    there); raises MatchFailure."""
    inner = bool(cand.inputs)
    cut = {cand.name: cand} if inner else None
    value = 0.0
    for seed in (7, 11):
        feeds = probe_feeds(graph)
        mask = probe_mask(seed=seed)
        feeds[cand.name] = mask.astype(cand.dtype if inner else feeds[cand.name].dtype)
        try:
            (got,) = eval_with_ort(graph, [term.tensor], feeds, cut=cut)
            value = _mask_constant(np.asarray(got), mask, term)
            if not inner and holds_ids(cand):
                feeds[cand.name] = id_probe(mask, seed).astype(feeds[cand.name].dtype)
                (wide,) = eval_with_ort(graph, [term.tensor], feeds, cut=cut)
                expect(np.array_equal(np.asarray(wide), np.asarray(got)),
                       f"{cand.name} holds token ids and the mask term reads their values "
                       f"({reader(cand, [term.tensor])}), not only which are 0")
        except MatchFailure:
            raise
        except Exception as exc:
            fail(f"cannot evaluate the mask subgraph ({type(exc).__name__})")
    return value


def is_binary(t: gs.Tensor, depth: int = 0) -> bool:
    """Whether every value of `t` is 0 or 1 by construction: a bool, a 0/1 constant, or
    casts, slices, concats and products of such."""
    if t.dtype is not None and np.dtype(t.dtype) == np.bool_:
        return True
    value = const_value(t)
    if value is not None:
        return value.size > 0 and bool(np.isin(value, (0, 1)).all())
    node = producer(t)
    if node is None or depth > 48:
        return False
    if node.op in _BOOL_OPS:
        return True
    if node.op == "ConstantOfShape":  # its value attribute, 0 when absent
        fill = node.attrs.get("value")
        return fill is None or bool(np.isin(np.asarray(fill.values), (0, 1)).all())
    if node.op == "Where":
        return all(is_binary(i, depth + 1) for i in node.inputs[1:])
    if node.op not in _KEEPS_BINARY:
        return False
    data = node.inputs[:_KEEPS_BINARY[node.op]] if _KEEPS_BINARY[node.op] else node.inputs
    return all(is_binary(i, depth + 1) for i in data)


def computed_masks(graph: gs.Graph, outputs: list[gs.Tensor], cut: tuple = (),
                   shape: tuple[int, int] = (PROBE_BATCH, PROBE_SEQ)) -> list[gs.Variable]:
    """The 0/1 tensors computed from the model inputs that `outputs` read (not through
    `cut`) and that are [B, S] on probe inputs of that shape, nearest the inputs first."""
    nodes, _ = ancestors(outputs, cut)
    inputs = {id(t) for t in graph.inputs}
    found = [t for n in nodes if n.op not in ("Shape", "Constant") for t in n.outputs
             if isinstance(t, gs.Variable) and (t.shape is None or len(t.shape) == 2)
             and all(id(s) in inputs for s in ancestors([t])[1]) and is_binary(t)]
    if not found:
        return []
    try:
        values = eval_with_ort(graph, found, probe_feeds(graph, batch=shape[0], seq=shape[1]))
    except Exception:
        return []
    kept = []
    for t, v in zip(found, values):
        if np.shape(v) == tuple(shape):
            t.dtype = t.dtype or np.asarray(v).dtype  # the cut's feed and the Cast read it
            kept.append(t)
    return kept


def holds_ids(t: gs.Tensor) -> bool:
    """Whether a model input holds token ids (or token types): it indexes a table, through
    casts and reshapes, or it is named for that role."""
    if t.name in ("input_ids", "segment_ids"):
        return True
    todo, seen = [t], set()
    while todo:
        cur = todo.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        for node in cur.outputs:
            slots = _ID_READERS.get(node.op, ())
            if any(node.inputs[i] is cur for i in np.atleast_1d(slots) if i < len(node.inputs)):
                return True
            if node.op in ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten"):
                todo.append(node.outputs[0])
    return False


def id_probe(mask: np.ndarray, seed: int) -> np.ndarray:
    """The probe mask with token-id-like values (2 to 50) where it keeps, 0 where it pads."""
    return mask * np.random.default_rng(seed).integers(2, 51, size=mask.shape)


def reader(t: gs.Tensor, outputs: list[gs.Tensor]) -> str:
    """The name of the node feeding `outputs` that reads `t` (for a reason that names it)."""
    nodes, _ = ancestors(outputs)
    return next((n.name for n in nodes if n.op != "Shape" and any(i is t for i in n.inputs)),
                t.name)


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
