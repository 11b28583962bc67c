"""Multiple choice: the encoder of a [batch, choices, seq] model is fused on its flat rows.

A multiple-choice model (transformers' TFBertForMultipleChoice) takes ids, mask and segment
ids as [batch, choices, seq], flattens each to [batch*choices, seq] before the encoder, and
reads `choices` off the input's shape again to fold its logits back to [batch, choices]:

    input_ids [B, C, S] ─┬─► Reshape[-1, S] ─► (encoder on B*C rows) ─► logits [B*C, 1]
                         └─► Shape ─► C ─────────────────────────────► Reshape[-1, C] ─► [B, C]

The fusions want [batch, seq] model inputs (the mask, B and S of the rows). FlattenChoices, run
first, gives them the flat rows as a graph input of their own, `<name>__flat`; the rank-3
input stays for what reads its shape. RestoreChoices, run after the fusions, makes that input
a Flatten(axis=2) of the rank-3 one again, so the model still takes [batch, choices, seq]:

    FlattenChoices:  Reshape(input_ids)[B*C, S]  ==>  graph input input_ids__flat [B*C, S]
    RestoreChoices:  graph input input_ids__flat ==>  Flatten(input_ids, axis=2)

The probes (io/inputs.py probe_feeds) fill a rank-3 input as [batch, 1, seq], consistent with
the flat input's [batch, seq]; the flattening Reshape is checked by evaluation: [3, 2, 7] in,
[6, 7] out. Another Reshape of the input to a constant shape (a flatten to [-1]) reads the
flat rows too: the same values in the same order give the same result.

Candidates: every rank-3 integer graph input; each ends flattened (fused) or missed (no
Reshape reads it, or one that is not [batch*choices, seq]). RestoreChoices has no misses.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.base import CandidatePass, Layers, PassResult, const_value, \
    replace_tensor
from bertfuse.passes.evaluate import eval_with_ort
from bertfuse.passes.match import expect, fail
from bertfuse.io.inputs import PROBE_SEQ, probe_feeds

SUFFIX = "__flat"


def _rank3_int(t: gs.Tensor) -> bool:
    return t.shape is not None and len(t.shape) == 3 and t.dtype is not None and \
        np.dtype(t.dtype).kind in "iu"


class FlattenChoices(CandidatePass):
    name = "choices"

    def candidates(self, graph: gs.Graph) -> list[gs.Tensor]:
        return [t for t in graph.inputs if _rank3_int(t)]

    def layer(self, layers: Layers, node) -> None:
        return None

    def match(self, graph: gs.Graph, x: gs.Tensor) -> tuple[list[gs.Node], list[gs.Node]]:
        """(the Reshapes of x to its flat rows [batch*choices, seq], its other Reshapes: to a
        constant shape with no 0, which read the rows as well); raises MatchFailure."""
        reshapes = [n for n in x.outputs if n.op == "Reshape" and n.inputs[0] is x]
        expect(reshapes, f"no Reshape flattens the [batch, choices, seq] input {x.name}")
        feeds = probe_feeds(graph)
        seq = {}
        for t in graph.inputs:
            if _rank3_int(t):
                seq[t.name] = t.shape[2] if isinstance(t.shape[2], int) and t.shape[2] > 0 \
                    else PROBE_SEQ
                feeds[t.name] = np.ones((3, 2, seq[t.name]), feeds[t.name].dtype)
        try:
            shapes = [np.shape(v) for v in
                      eval_with_ort(graph, [r.outputs[0] for r in reshapes], feeds)]
        except Exception as exc:  # noqa: BLE001 (any ORT failure is a reason to miss)
            fail(f"cannot evaluate the Reshapes of {x.name} ({type(exc).__name__})")
        rows = (6, seq[x.name])
        flat = [r for r, shape in zip(reshapes, shapes) if shape == rows]
        expect(flat, f"no Reshape of {x.name} gives its flat rows ([3, 2, {rows[1]}] gives "
                     f"{' or '.join(str(list(s)) for s in shapes)}, not {list(rows)})")
        other = [r for r in reshapes if r not in flat]
        for r in other:
            expect(_plain_target(r), f"Reshape {r.name} of {x.name} is neither to its flat rows "
                                     f"nor to a constant shape")
        return flat, other

    def rewrite(self, graph: gs.Graph, x: gs.Tensor, found: tuple) -> None:
        reshapes, other = found
        flat = gs.Variable(f"{x.name}{SUFFIX}", dtype=x.dtype,
                           shape=[f"{x.name}_rows", x.shape[2]])
        for r in reshapes:
            replace_tensor(graph, r.outputs[0], flat)
        for r in other:  # the same values in the same order: the same result from the rows
            r.inputs[0] = flat
        graph.inputs.append(flat)


def _plain_target(reshape: gs.Node) -> bool:
    """A Reshape to a constant shape that copies no dim (no 0): it gives the same from any
    tensor of the same values in the same order."""
    target = const_value(reshape.inputs[1])
    return target is not None and not np.any(np.asarray(target) == 0)


class RestoreChoices:
    """The flat inputs FlattenChoices made become Flatten(axis=2) of the rank-3 ones again."""

    name = "choices"

    def __call__(self, graph: gs.Graph) -> PassResult:
        result = PassResult()
        by_name = {t.name: t for t in graph.inputs}
        for flat in [t for t in graph.inputs if t.name.endswith(SUFFIX)]:
            x = by_name.get(flat.name[:-len(SUFFIX)])
            if x is None or not _rank3_int(x):
                continue
            graph.inputs.remove(flat)
            if flat.outputs:  # read by the fused encoder: made from the rank-3 input
                graph.nodes.append(gs.Node("Flatten", f"{x.name}_rows", {"axis": 2},
                                           inputs=[x], outputs=[flat]))
        return result
