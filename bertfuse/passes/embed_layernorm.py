"""EmbedLayerNormalization: word + position + token-type lookups + LayerNorm -> one node.

    input_ids ─► [Reshape] ─► Gather(word_table) ─► [Reshape] ─┐
    segment_ids ─► Gather(type_table) | OneHot ─► MatMul(type_table) ─► [Reshape] ─► Add ─┐
    Slice(position_table, 0, S) | Gather(position_table, Range(0, S)) ─► [Unsqueeze] ──► Add ─► LayerNormalization

    input_ids ─► f(ids) ─► Gather(position_table) ─► Add       (RoBERTa: computed positions)

The lookups are found structurally (a constant 2-D table read by a Gather or a one-hot
MatMul whose index is a model input; a position table read by a Slice/Gather that no
token-valued input feeds), then the whole sum is evaluated with ONNX Runtime on probe ids
and compared with word[ids] + type[segments] + position[0:S]. A table gathered at indices
computed from the ids that are not the ids themselves (RoBERTa's padding-aware
`cumsum(ids != pad) * (ids != pad) + pad`) is the position table: its index subgraph stays,
and feeds the fused node's `position_ids` input. A position Slice must start at row 0 and end
at S; where S is fixed by the ids' shape (bert-for-tf2) the slice arrives folded, as a
constant [1, S, H] term, and is the position table itself.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.ops.contrib.embed_layernorm import CONTRACT as EMBED_LN
from bertfuse.passes.base import CandidatePass, Layers, PassResult, cast_int32, const, \
    const_value, producer, replace_tensor
from bertfuse.passes.evaluate import ancestors, eval_with_ort
from bertfuse.passes.match import NotACandidate, expect, fail
from bertfuse.io.inputs import PROBE_SEQ, probe_feeds

_WRAPPERS = ("Reshape", "Unsqueeze", "Squeeze", "Cast", "Flatten", "Identity", "Expand")


class EmbedLayerNormFusion(CandidatePass):
    """Candidates: every LayerNormalization that reads a sum of embedding lookups; the first
    that fuses ends the pass (one embedding per model)."""

    name = "embed_layernorm"
    once = True

    def candidates(self, graph: gs.Graph) -> Iterator[gs.Node]:
        for ln in [n for n in graph.nodes if n.op == "LayerNormalization"]:
            if len(_add_leaves(ln.inputs[0])) >= 2:
                yield ln

    def layer(self, layers: Layers, node: gs.Node) -> int | None:
        return None  # the embeddings come before every layer

    def match(self, graph: gs.Graph, ln: gs.Node) -> tuple:
        """The structural match, confirmed numerically: (word, (position, position ids),
        segment, ids, segments)."""
        found = _match(graph, _add_leaves(ln.inputs[0]))
        word, (position, pos_ids), segment, ids, segs = found
        _check_numerically(graph, ln.inputs[0], word, position, segment, ids, segs, pos_ids)
        return found

    def finish(self, graph: gs.Graph, result: PassResult) -> None:
        if not result.diagnostics:  # say why, rather than nothing (MobileBERT has no LayerNorm)
            result.missed(self.name, "no LayerNormalization reads a sum of embedding lookups")

    def rewrite(self, graph: gs.Graph, ln: gs.Node, found: tuple) -> None:
        word, (position, pos_ids), segment, ids, segs = found
        y = ln.outputs[0]
        hidden = word.shape[1]
        # EmbedLayerNormalization requires beta; LayerNormalization's B is optional (zeros).
        beta = ln.inputs[2] if len(ln.inputs) > 2 and ln.inputs[2].name != "" else \
            const("embeddings_beta", np.zeros([hidden], dtype=_float_dtype(ln.inputs[1], word)))
        inputs = [cast_int32(graph, ids), cast_int32(graph, segs) if segs is not None else None,
                  const("embeddings_word", word), const("embeddings_position", position),
                  const("embeddings_segment", segment) if segment is not None else None,
                  ln.inputs[1], beta, None,
                  cast_int32(graph, pos_ids) if pos_ids is not None else None]
        out = gs.Variable("embeddings_output", dtype=y.dtype)
        mask_index = gs.Variable("embeddings_mask_index", dtype=np.int32)
        graph.nodes.append(EMBED_LN.node("EmbedLayerNormalization", inputs, [out, mask_index],
                                         epsilon=float(ln.attrs.get("epsilon", 1e-5))))
        if y.shape is not None and len(y.shape) == 2:
            flat = gs.Variable("embeddings_output2d", dtype=y.dtype)
            graph.nodes.append(gs.Node("Reshape", "embeddings_to2d", inputs=[
                out, const("embeddings_shape2", np.array([-1, hidden], np.int64))], outputs=[flat]))
            out = flat
        replace_tensor(graph, y, out)


def _add_leaves(t: gs.Tensor) -> list[gs.Tensor]:
    node = producer(t)
    if node is None or node.op != "Add":
        return [t]
    leaves: list[gs.Tensor] = []
    for inp in node.inputs:
        sub = producer(inp)
        # Shape consumers only size other tensors (shape_from_inputs rebuilds them later).
        if sub is not None and sub.op == "Add" and \
                len([c for c in inp.outputs if c.op != "Shape"]) == 1:
            leaves.extend(_add_leaves(inp))
        else:
            leaves.append(inp)
    return leaves


def _unwrap(t: gs.Tensor) -> gs.Tensor:
    while t.inputs and t.inputs[0].op in _WRAPPERS:
        t = t.inputs[0].inputs[0]
    return t


def _graph_input(t: gs.Tensor, graph: gs.Graph) -> gs.Variable | None:
    """The one model input an index tensor is computed from (directly, or by index
    arithmetic such as Keras' negative-index wrap-around, which the numeric check of the
    whole sum then confirms is the identity on valid ids)."""
    t = _unwrap(t)
    if any(t is i for i in graph.inputs):
        return t
    nodes, sources = ancestors([t])
    if any(n.op == "Shape" for n in nodes):
        return None  # positions (a Range over the sequence length), not a token lookup
    inputs = [s for s in sources if any(s is i for i in graph.inputs)]
    return inputs[0] if len(inputs) == 1 and len(sources) == 1 else None


def _lookup(t: gs.Tensor, graph: gs.Graph):
    """(table, model input, index) for Gather(table, index(ids)) or OneHot(ids) @ table."""
    node = producer(t)
    if node is None:
        return None
    if node.op == "Gather" and node.attrs.get("axis", 0) == 0:
        table, inp = const_value(node.inputs[0]), _graph_input(node.inputs[1], graph)
        if table is not None and table.ndim == 2 and inp is not None:
            return table, inp, node.inputs[1]
    if node.op == "MatMul":
        onehot = producer(node.inputs[0])
        table = const_value(node.inputs[1])
        if onehot is not None and onehot.op == "OneHot" and table is not None:
            depth, values = const_value(onehot.inputs[1]), const_value(onehot.inputs[2])
            inp = _graph_input(onehot.inputs[0], graph)
            if depth is not None and int(np.ravel(depth)[0]) == table.shape[0] and \
                    values is not None and list(np.ravel(values)) == [0, 1] and inp is not None:
                return table, inp, None
    return None


def _reads_input_as_is(graph: gs.Graph, index: gs.Tensor | None, inp: gs.Variable,
                       rows: int) -> bool:
    """Whether a lookup's index equals the model input on valid ids (a token lookup), as
    opposed to positions computed from the ids."""
    if index is None or _unwrap(index) is inp:
        return True
    feeds = probe_feeds(graph)
    vals = np.random.default_rng(3).integers(0, min(rows, 97), size=feeds[inp.name].shape)
    feeds[inp.name] = vals.astype(feeds[inp.name].dtype)
    try:
        (got,) = eval_with_ort(graph, [index], feeds)
    except Exception:
        return True  # not provably positions: keep today's reading (the sum check decides)
    return np.size(got) == vals.size and np.array_equal(np.reshape(got, vals.shape), vals)


def _position_table(t: gs.Tensor) -> np.ndarray | None:
    node = producer(_untile_batch(t))
    if node is not None and node.op in ("Slice", "Gather"):
        table = const_value(node.inputs[0])
        if table is not None and table.ndim == 3 and table.shape[0] == 1:
            table = table[0]  # a [1, P, H] table broadcast over the batch
        if table is not None and table.ndim == 2:
            return table
    return None


def _untile_batch(t: gs.Tensor) -> gs.Tensor:
    """The table slice under a Tile over the batch only (keras-bert's PositionEmbedding in
    ADD mode tiles its [1, S, H] slice to [B, S, H]); the numeric check of the sum confirms."""
    node = producer(t)
    if node is not None and node.op == "Tile":
        reps = const_value(node.inputs[1])
        if reps is None or np.all(np.ravel(reps)[1:] == 1):  # a constant must repeat only B
            return _unwrap(node.inputs[0])
    return t


def _match(graph: gs.Graph, leaves: list[gs.Tensor]) -> tuple:
    """(word, (position, position ids), segment, ids, segments) from the sum's terms; raises
    NotACandidate for a sum with no token lookup (a residual add), MatchFailure for an
    embedding sum that does not have BERT's terms."""
    lookups, positions, position_terms = [], [], []
    for leaf in leaves:
        core = _unwrap(leaf)
        hit = _lookup(core, graph)
        if hit is not None:
            table, inp, index = hit
            if _reads_input_as_is(graph, index, inp, table.shape[0]):
                lookups.append((table, inp))
            else:
                positions.append((table, index))
            continue
        table = _position_table(core)
        if table is None:
            table = _constant_positions(core)
        if table is None:
            if not lookups:
                raise NotACandidate
            fail("an embedding term is neither a lookup nor positions")
        positions.append((table, None))
        position_terms.append(core)
    if not lookups:
        raise NotACandidate
    expect(len(positions) == 1, f"expected one position table, found {len(positions)}")
    lookups.sort(key=lambda h: -h[0].shape[0])  # the word table has the most rows
    word, ids = lookups[0]
    for core in position_terms:
        _check_position_rows(graph, core, ids)
    segment, segs = (lookups[1] if len(lookups) > 1 else (None, None))
    expect(len(lookups) <= 2, f"{len(lookups)} lookups: more than words and token types")
    expect(ids is not segs, "word and token-type lookups read the same input")
    return word, positions[0], segment, ids, segs


# Positions as rows 0..S-1 of a table, S the ids' sequence length (bert-for-tf2's
# tf.slice(table, [0, 0], [S, -1]), S read from the input's fixed shape; keras-bert's and
# Google's slices). Where S is fixed, the slice of a constant table is folded into a constant
# [1, S, H] before the passes run: that constant is the positions.


def _constant_positions(t: gs.Tensor) -> np.ndarray | None:
    """A constant [1, S, H] or [S, H] embedding term (S > 1) as a [S, H] table."""
    value = const_value(t)
    if value is None or value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[0] != 1):
        return None
    rows = value.reshape(value.shape[-2:])
    return rows if rows.shape[0] > 1 else None


def _fixed_seq(ids: gs.Tensor) -> int | None:
    dims = ids.shape if ids.shape is not None and len(ids.shape) == 2 else (None, None)
    return dims[1] if isinstance(dims[1], int) and dims[1] > 0 else None


def _check_position_rows(graph: gs.Graph, term: gs.Tensor, ids: gs.Tensor) -> None:
    """Raises MatchFailure, naming the node, unless a position term is rows 0..S-1: a
    constant has S rows, S fixed by the ids' shape; a Slice of the table starts at row 0
    with step 1 and ends at S. (A Gather at Range(0, S): the sum's numeric check decides.)"""
    seq = _fixed_seq(ids)
    node = producer(term)
    if node is not None and node.op == "Tile":  # keras-bert tiles its slice over the batch
        node = producer(_unwrap(node.inputs[0]))
    if node is None and const_value(term) is not None:
        rows = const_value(term).shape[-2]
        expect(seq is not None, f"constant position term {term.name}: the sequence length "
                                f"of {ids.name} is not fixed")
        expect(rows == seq, f"constant position term {term.name} has {rows} rows, the "
                            f"sequence length of {ids.name} is {seq}")
    elif node is not None and node.op == "Slice" and const_value(node.inputs[0]) is not None:
        _check_position_slice(graph, node, ids, seq)


def _slice_arg(node: gs.Node, i: int, default: list[int]) -> np.ndarray | None:
    if len(node.inputs) > i and node.inputs[i].name:
        value = const_value(node.inputs[i])
        return None if value is None else np.ravel(value).astype(np.int64)
    return np.array(default, np.int64)


def _check_position_slice(graph: gs.Graph, node: gs.Node, ids: gs.Tensor,
                          seq: int | None) -> None:
    table = const_value(node.inputs[0])
    rows_axis, n_rows = table.ndim - 2, table.shape[-2]  # [P, H], or [1, P, H]
    starts = _slice_arg(node, 1, [])
    expect(starts is not None, f"position slice {node.name}: its start is not a constant")
    axes = _slice_arg(node, 3, list(range(starts.size)))
    steps = _slice_arg(node, 4, [1] * starts.size)
    expect(axes is not None, f"position slice {node.name}: its axes are not constants")
    at_rows = [i for i, a in enumerate(axes) if a % table.ndim == rows_axis]
    expect(at_rows, f"position slice {node.name} does not slice the table's rows")
    k = at_rows[0]
    start = int(starts[k]) + (n_rows if starts[k] < 0 else 0)
    expect(start == 0, f"position slice {node.name} starts at row {start}, not 0")
    expect(steps is not None and steps[k] == 1, f"position slice {node.name}: step is not 1")
    ends = _slice_arg(node, 2, [])
    if ends is not None:  # a constant end: S must be the ids' fixed length
        end = int(ends[k]) + n_rows if ends[k] < 0 else min(int(ends[k]), n_rows)
        expect(seq is not None and end == seq,
               f"position slice {node.name} takes rows 0..{end - 1}, the sequence length of "
               f"{ids.name} is {seq if seq is not None else 'not fixed'}")
        return
    for probe in (PROBE_SEQ, PROBE_SEQ + 2):  # a computed end: S at two sequence lengths
        feeds = probe_feeds(graph, seq=probe)
        try:
            (got,) = eval_with_ort(graph, [node.inputs[2]], feeds)
        except Exception:
            return  # not evaluable here: the sum's numeric check decides
        end, want = int(np.ravel(got)[k]), feeds[ids.name].shape[1]
        expect(min(end, n_rows) == want, f"position slice {node.name} ends at row {end} for "
                                         f"sequence length {want}")


def _check_numerically(graph, total, word, position, segment, ids, segs, pos_ids=None) -> None:
    """Raises MatchFailure unless `total` is word[ids] + type[segments] + position[0:S] on
    probe ids."""
    rng = np.random.default_rng(5)
    feeds = probe_feeds(graph)
    id_vals = rng.integers(0, min(word.shape[0], 97), size=feeds[ids.name].shape)
    feeds[ids.name] = id_vals.astype(feeds[ids.name].dtype)
    if pos_ids is None:
        expected = word[id_vals] + position[None, :id_vals.shape[1]]  # a fixed S, or the probe's
    else:
        try:
            (pos_vals,) = eval_with_ort(graph, [pos_ids], feeds)
        except Exception as exc:
            fail(f"cannot evaluate the position indices ({type(exc).__name__})")
        pos_vals = np.broadcast_to(np.reshape(pos_vals, (-1, id_vals.shape[1])), id_vals.shape)
        expect(pos_vals.min() >= 0 and pos_vals.max() < position.shape[0],
               "computed position indices fall outside the position table")
        expected = word[id_vals] + position[pos_vals]
    if segs is not None:
        seg_vals = rng.integers(0, segment.shape[0], size=feeds[segs.name].shape)
        feeds[segs.name] = seg_vals.astype(feeds[segs.name].dtype)
        expected = expected + segment[seg_vals]
    try:
        (got,) = eval_with_ort(graph, [total], feeds)
    except Exception as exc:
        fail(f"cannot evaluate the embedding sum ({type(exc).__name__})")
    got = np.asarray(got).reshape(expected.shape) if np.size(got) == expected.size else got
    if np.shape(got) != expected.shape or np.abs(got - expected).max() > 1e-5:
        fail("sum is not word[ids] + type[segments] + position[0:S]")


def _float_dtype(gamma: gs.Tensor, table: np.ndarray) -> np.dtype:
    """gamma's float dtype (the embedding table's when gamma's is unknown)."""
    value = const_value(gamma)
    if value is not None:
        return value.dtype
    return np.dtype(gamma.dtype) if gamma.dtype is not None else table.dtype


