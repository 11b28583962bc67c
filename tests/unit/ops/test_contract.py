"""The contracts: ORT's own schemas and kernel registry, the README, and the node builder
the passes build fused nodes with."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from bertfuse.ops import CONTRACTS
from bertfuse.ops.contrib import attention
from bertfuse.ops.contrib import layernorm
from bertfuse.ops.contrib import skip_layernorm
from support.ops_common import ATTENTION_ATOL, B, H, N, S, attention_inputs, ort_cpu_float_types, run
from support.paths import ROOT

README = ROOT / "bertfuse" / "ops" / "README.md"


def test_registry_lists_every_emitted_op() -> None:
    assert set(CONTRACTS) == {
        "Attention", "SkipLayerNormalization", "EmbedLayerNormalization",
        "BiasGelu", "FastGelu", "Gelu", "GemmFastGelu", "LayerNormalization",
        "PackedAttention", "RestorePadding",
    }
    for name, c in CONTRACTS.items():
        assert c.op_type == name
        assert c.domain == ("" if name == "LayerNormalization" else "com.microsoft")
        assert c.inputs and c.outputs


@pytest.mark.parametrize("op_type", sorted(CONTRACTS))
def test_contract_cpu_types_match_ort_kernel_registry(op_type: str) -> None:
    """The fp16 skips below rely on cpu_kernel_types: check it against what ORT really registers."""
    c = CONTRACTS[op_type]
    assert set(c.cpu_kernel_types) == ort_cpu_float_types(op_type, c.domain, c.since_version)


@pytest.mark.parametrize("op_type", sorted(CONTRACTS))
def test_contract_matches_ort_schema(op_type: str) -> None:
    """Slot names/order and attribute names are ORT's own (guards against doc drift)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    if not hasattr(C, "get_all_operator_schema"):
        pytest.skip("this onnxruntime build does not expose its schemas")
    c = CONTRACTS[op_type]
    schemas = [s for s in C.get_all_operator_schema()
               if s.name == op_type and (s.domain or "") == c.domain and s.since_version <= c.since_version]
    schema = max(schemas, key=lambda s: s.since_version)
    assert [i.name for i in schema.inputs] == [t.name for t in c.inputs]
    assert [o.name for o in schema.outputs] == [t.name for t in c.outputs]
    assert set(schema.attributes) == {a.name for a in c.attributes}
    for spec, formal in zip(c.inputs, schema.inputs):
        assert spec.optional == (formal.option == type(formal.option).Optional), spec.name


def test_readme_documents_every_op() -> None:
    text = README.read_text()
    for c in CONTRACTS.values():
        assert f"## {c.op_type}" in text, c.op_type
        for t in c.inputs + c.outputs:
            assert f"`{t.name}`" in text, (c.op_type, t.name)


# node builder: how the passes build fused nodes through the contracts


def _skip_node(*inputs):
    import onnx_graphsurgeon as gs

    t = [gs.Variable(n, dtype=np.float32) if n else None for n in inputs]
    return skip_layernorm.CONTRACT.node("skip", t, [gs.Variable("out", dtype=np.float32)],
                                        epsilon=1e-12)


def test_node_builder_skips_optional_slots() -> None:
    n = _skip_node("input", "skip", "gamma", None, "bias")  # no beta, a bias
    assert [t.name for t in n.inputs] == ["input", "skip", "gamma", "", "bias"]
    assert n.domain == "com.microsoft" and n.attrs == {"epsilon": 1e-12}
    trailing = _skip_node("input", "skip", "gamma", None, None)
    assert [t.name for t in trailing.inputs] == ["input", "skip", "gamma"]
    ln = layernorm.CONTRACT.node("ln", trailing.inputs[:2], trailing.outputs, axis=-1, epsilon=1)
    assert ln.domain in (None, "") and ln.attrs == {"axis": -1, "epsilon": 1.0}  # int widened
    assert isinstance(ln.attrs["epsilon"], float)


@pytest.mark.parametrize("inputs,attrs,error", [
    (("input", "skip", None), {}, "input 2 (gamma) is required"),
    (("input", "skip", "gamma", "beta", "bias", "extra"), {}, "at most 5 inputs"),
    (("input", "skip", "gamma"), {"alpha": 1.0}, "no attribute alpha"),
    (("input", "skip", "gamma"), {"epsilon": "small"}, "must be float"),
])
def test_node_builder_refuses_what_the_contract_does_not_allow(inputs, attrs, error) -> None:
    import onnx_graphsurgeon as gs

    t = [gs.Variable(n, dtype=np.float32) if n else None for n in inputs]
    with pytest.raises((ValueError, TypeError), match=re.escape(error)):
        skip_layernorm.CONTRACT.node("skip", t, [gs.Variable("out")], **attrs)


def test_node_builder_requires_required_attributes() -> None:
    import onnx_graphsurgeon as gs

    x = [gs.Variable(n, dtype=np.float32) for n in ("input", "weights")]
    with pytest.raises(ValueError, match="num_heads"):
        attention.CONTRACT.node("att", x, [gs.Variable("out")])
    with pytest.raises(TypeError, match="num_heads"):
        attention.CONTRACT.node("att", x, [gs.Variable("out")], num_heads=2.0)


def test_node_builder_node_runs_as_the_reference(rng: np.random.Generator, seed: int) -> None:
    """An Attention node built the way the passes build it, run by ORT, against the reference."""
    import onnx_graphsurgeon as gs

    feeds = attention_inputs(rng)
    mask = np.ones((B, S), np.int32)
    mask[0, -2:] = 0
    mask[1, 1:3] = 0
    x = gs.Variable("input", dtype=np.float32, shape=[B, S, H])
    m = gs.Variable("mask_index", dtype=np.int32, shape=[B, S])
    out = gs.Variable("output", dtype=np.float32, shape=[B, S, H])
    node = attention.CONTRACT.node(
        "att", [x, gs.Constant("weights", feeds["weights"]), gs.Constant("bias", feeds["bias"]), m],
        [out], num_heads=N, mask_filter_value=-10000.0, scale=None)
    assert "scale" not in node.attrs  # None leaves an attribute unset
    model = gs.export_onnx(gs.Graph(nodes=[node], inputs=[x, m], outputs=[out], opset=17))
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    model.ir_version = 8
    (got,) = run(model, {"input": feeds["input"], "mask_index": mask})
    want = attention.reference(feeds["input"], feeds["weights"], feeds["bias"], mask, num_heads=N)
    assert np.abs(got - want).max() <= ATTENTION_ATOL, f"seed {seed}"
