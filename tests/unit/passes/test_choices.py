"""FlattenChoices / RestoreChoices: a [batch, choices, seq] model's encoder fused on its flat
rows, the model still taking rank-3 inputs (passes/choices.py).

The tiny Google-style BERT of the builders behind transformers' multiple-choice wrapper:
each input Reshape(x, [-1, S]) to [B*C, S], the pooled output folded back to [B, C, H] with
C read off the input's shape. ORT before/after on the same random inputs, ops counted.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan
from support.builders.onnx_graphs import bert, mask_rows
from support.passes_common import assert_same, missed

ROLES = ("input_ids", "input_mask", "segment_ids")
B, C, S = 2, 3, 6


def multiple_choice(rng, flatten_to_rows: bool = True) -> onnx.ModelProto:
    """bert() on [B*C, S] rows behind rank-3 inputs. flatten_to_rows=False: the ids are
    reshaped to [B, C*S] instead (not the rows: must not be taken for them)."""
    model = bert(rng, layers=2)
    g = model.graph
    nodes = []
    for inp in g.input:
        inner = f"{inp.name}_rows"
        for n in g.node:
            n.input[:] = [inner if i == inp.name else i for i in n.input]
        shape, dims = f"{inp.name}_shape", f"{inp.name}_dims"
        nodes.append(helper.make_node("Shape", [inp.name], [shape]))
        if flatten_to_rows or inp.name != "input_ids":
            nodes += [helper.make_node("Slice", [shape, "i2", "i3"], [f"{inp.name}_s"]),
                      helper.make_node("Concat", ["m1", f"{inp.name}_s"], [dims], axis=0)]
        else:
            nodes.append(helper.make_node("Slice", [shape, "i0", "i1"], [f"{inp.name}_b"]))
            nodes.append(helper.make_node("Concat", [f"{inp.name}_b", "m1"], [dims], axis=0))
        nodes.append(helper.make_node("Reshape", [inp.name, dims], [inner]))
        inp.type.tensor_type.shape.ClearField("dim")
        for d in ("B", "C", "S"):
            inp.type.tensor_type.shape.dim.add().dim_param = d
    # pooled_output [B*C, H] -> [B, C, H], C from input_ids' shape
    for n in g.node:
        n.output[:] = ["pooled_rows" if o == "pooled_output" else o for o in n.output]
    nodes += [helper.make_node("Slice", ["input_ids_shape", "i1", "i2"], ["choices"]),
              helper.make_node("Concat", ["m1", "choices", "hid"], ["pooled_dims"], axis=0),
              helper.make_node("Reshape", ["pooled_rows", "pooled_dims"], ["pooled_output"])]
    g.initializer.extend(helper.make_tensor(f"i{k}", TensorProto.INT64, [1], [k])
                         for k in range(4))
    g.initializer.extend([helper.make_tensor("m1", TensorProto.INT64, [1], [-1]),
                          helper.make_tensor("hid", TensorProto.INT64, [1], [16])])
    head = [n for n in nodes if n.output[0] != "pooled_output" and "pooled" not in n.output[0]
            and n.output[0] != "choices"]
    tail = [n for n in nodes if n not in head]
    old = list(g.node)
    del g.node[:]
    g.node.extend(head + old + tail)
    # sequence_output stays [B*C, S, H]
    return model


def feeds(rng) -> dict[str, np.ndarray]:
    return {"input_ids": rng.integers(0, 40, (B, C, S)).astype(np.int32),
            "segment_ids": rng.integers(0, 2, (B, C, S)).astype(np.int32),
            "input_mask": mask_rows(B * C, S, rng).reshape(B, C, S)}


def test_multiple_choice_encoder_is_fully_fused_behind_rank3_inputs(rng, seed):
    model = multiple_choice(rng)
    fused, report = run_passes(model, fusion_plan("fp32"))
    assert report.table.fully_fused, report.table
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("Attention") == 2 and ops.count("SkipLayerNormalization") == 4, ops
    assert ops.count("EmbedLayerNormalization") == 1 and "Softmax" not in ops, ops
    assert [i.name for i in fused.graph.input] == list(ROLES)
    assert all(len(i.type.tensor_type.shape.dim) == 3 for i in fused.graph.input)
    assert ops.count("Flatten") == 3, ops
    assert [d.fused for d in report.diagnostics if d.component == "choices"] == [True] * 3
    got = assert_same(model, fused, feeds(rng), seed)
    assert got["pooled_output"].shape == (B, C, 16)


def test_a_reshape_that_is_not_the_rows_is_missed(rng, seed):
    model = multiple_choice(rng, flatten_to_rows=False)
    fused, report = run_passes(model, fusion_plan("fp32"))
    (reason,) = [r for r in missed(report, "choices") if "input_ids" in r]
    assert "no Reshape of input_ids gives its flat rows" in reason, reason
    assert [i.name for i in fused.graph.input] == list(ROLES)
    f = feeds(rng)
    # [B, C*S] rows of the ids against [B*C, S] of the rest: only runs where C == 1
    f = {k: v[:, :1] for k, v in f.items()}
    assert_same(model, fused, f, seed)
