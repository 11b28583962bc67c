"""ai.bertfuse dense ops (ops/bertfuse/dense.py): contracts, one-node models, and the NumPy
references against independent math: ONNX Runtime's own CPU kernels for the two-kernel form
they replace (MatMul, then BiasGelu / FastGelu / SkipLayerNormalization), run in float32 on
the same fp16 values. The ops have no CPU kernel; their CUDA kernels are checked against
these references on the GPU (`bertfuse kernels check`)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bertfuse.ops import BERTFUSE_CONTRACTS, BERTFUSE_DOMAIN, CONTRACTS
from bertfuse.ops.bertfuse import dense
from bertfuse.ops.contrib import gelu
from bertfuse.ops.contrib import skip_layernorm
from bertfuse.ops.contract import MS_DOMAIN, one_node_model
from support.ops_common import assert_fp16_within_ulp, run, session

K, N = 24, 40


def _inputs(rng, lead=(3, 5), k=K, n=N, spread=1.0) -> dict[str, np.ndarray]:
    # 1/sqrt(K) weights: pre-activations of O(spread), where erf and tanh GELU differ most.
    return {"X": (rng.standard_normal(lead + (k,)) * spread).astype(np.float16),
            "W": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16),
            "bias": (0.3 * rng.standard_normal(n)).astype(np.float16),
            "skip": rng.standard_normal(lead + (n,)).astype(np.float16),
            "gamma": (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float16),
            "beta": (0.2 * rng.standard_normal(n)).astype(np.float16)}


def _ort_two_kernels(op: str, f: dict[str, np.ndarray], **attrs) -> np.ndarray:
    """MatMul then the contrib op, on ORT's CPU kernels in float32 (inputs widened exactly)."""
    from onnx import helper

    f32 = {k: v.astype(np.float32) for k, v in f.items()}
    ins = {"BiasGelu": ["h", "bias"], "FastGelu": ["h", "bias"],
           "SkipLayerNormalization": ["h", "skip", "gamma", "beta", "bias"]}[op]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["h"]),
             helper.make_node(op, ins, ["Y"], domain=MS_DOMAIN, **attrs)]
    names = ["X", "W"] + [i for i in ins if i != "h"]
    graph = helper.make_graph(nodes, "two", [
        helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(f32[n].shape)) for n in names],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, list(f32["X"].shape[:-1]) + [f32["W"].shape[1]])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 8
    (y,) = run(model, {n: f32[n] for n in names})
    return y


def test_contracts_are_bertfuse_domain_and_apart_from_ort_ones() -> None:
    encoder_ops = {"DenseBias", "DenseBiasGelu", "DenseBiasSkipLayerNorm", "BertAttention",
                   "DenseBiasFp8", "DenseBiasGeluFp8", "DenseBiasSkipLayerNormFp8"}
    assert encoder_ops <= set(BERTFUSE_CONTRACTS)
    assert not set(BERTFUSE_CONTRACTS) & set(CONTRACTS)
    for c in BERTFUSE_CONTRACTS.values():
        assert c.domain == BERTFUSE_DOMAIN == "ai.bertfuse" and c.since_version == 1
        assert c.cpu_kernel_types == ()  # CUDA EP only
    fp8 = {"Wt": "float8e4m3fn", "w_scale": "float32", "Yq": "float8e4m3fn", "Y32": "float32"}
    for op in encoder_ops:
        c = BERTFUSE_CONTRACTS[op]
        # an FP8 op's X: fp16, or e4m3 as the op before wrote it (its Yq)
        x_fp8 = {"X": ("float16", "float8e4m3fn")} if op.endswith("Fp8") else {}
        assert all(t.dtypes == x_fp8.get(t.name, (fp8.get(t.name, "int32" if t.name == "mask"
                                                          else "float16"),))
                   for t in c.inputs + c.outputs), c.op_type
    assert [t.name for t in dense.DENSE_BIAS_SKIP_LAYERNORM.inputs] == \
        ["X", "W", "bias", "skip", "gamma", "beta"]
    # Y required; Yq (all) and Y32 (the SkipLayerNorm ops) optional, in the kernels' slots
    assert [(t.name, t.optional) for t in dense.DENSE_BIAS_SKIP_LAYERNORM.outputs] == \
        [("Y", False), ("Yq", True), ("Y32", True)]
    assert [t.name for t in dense.DENSE_BIAS_GELU.outputs] == ["Y", "Yq"]
    assert dense.DENSE_BIAS_GELU.attribute("approximate").default == 0
    assert dense.DENSE_BIAS_SKIP_LAYERNORM.attribute("epsilon").default == 1e-12


@pytest.mark.parametrize("op", ["DenseBias", "DenseBiasGelu", "DenseBiasSkipLayerNorm"])
def test_one_node_model_is_valid_and_cpu_has_no_kernel(op: str) -> None:
    model = dense.make_model(op, ("B", "S", K), N, approximate=1 if op == "DenseBiasGelu" else None)
    onnx.checker.check_model(model, full_check=True)
    assert {(o.domain, o.version) for o in model.opset_import} >= {(BERTFUSE_DOMAIN, 1)}
    (node,) = model.graph.node
    assert node.domain == BERTFUSE_DOMAIN
    assert [i.name for i in model.graph.input] == [t.name for t in BERTFUSE_CONTRACTS[op].inputs]
    with pytest.raises(Exception, match="ai.bertfuse|NOT_IMPLEMENTED|not a registered"):
        session(model)


def test_dense_bias_is_one_rounding_of_the_exact_affine(rng, seed) -> None:
    f = _inputs(rng)
    got = dense.reference("DenseBias", f["X"], f["W"], f["bias"])
    exact = np.einsum("abk,kn->abn", f["X"].astype(np.float64), f["W"].astype(np.float64)) + \
        f["bias"].astype(np.float64)
    assert got.dtype == np.float16 and got.shape == (3, 5, N)
    assert_fp16_within_ulp(got, exact.astype(np.float16), seed, "DenseBias")


@pytest.mark.parametrize("approximate,contrib", [(0, "BiasGelu"), (1, "FastGelu")])
def test_dense_bias_gelu_matches_ort_matmul_then_gelu(rng, seed, approximate, contrib) -> None:
    f = _inputs(rng, spread=2.0)
    got = dense.dense_bias_gelu(f["X"], f["W"], f["bias"], approximate=approximate)
    want = _ort_two_kernels(contrib, f)
    assert_fp16_within_ulp(got, want.astype(np.float16), seed, f"DenseBiasGelu({contrib})")
    other = _ort_two_kernels("FastGelu" if contrib == "BiasGelu" else "BiasGelu", f)
    # The flavour matters: the other GELU is visibly off (erf vs tanh differ by up to ~5e-4).
    assert np.abs(other.astype(np.float64) - got.astype(np.float64)).max() > 1e-4


def test_dense_bias_skip_layernorm_matches_ort_matmul_then_skip_ln(rng, seed) -> None:
    f = _inputs(rng)
    got = dense.dense_bias_skip_layernorm(f["X"], f["W"], f["bias"], f["skip"], f["gamma"],
                                          f["beta"], epsilon=1e-5)
    want = _ort_two_kernels("SkipLayerNormalization", f, epsilon=1e-5)
    assert_fp16_within_ulp(got, want.astype(np.float16), seed, "DenseBiasSkipLayerNorm")
    # and equal to the contrib reference fed the exact (unrounded) product
    h = f["X"].astype(np.float64) @ f["W"].astype(np.float64)
    contrib = skip_layernorm.reference(h, f["skip"], f["gamma"], f["beta"], f["bias"],
                                       epsilon=1e-5)
    np.testing.assert_array_equal(got, contrib.astype(np.float16))


def test_gelu_reference_equals_contrib_reference_on_the_exact_product(rng) -> None:
    f = _inputs(rng, lead=(7,), spread=2.0)
    h = f["X"].astype(np.float64) @ f["W"].astype(np.float64)
    for approximate in (0, 1):
        got = dense.dense_bias_gelu(f["X"], f["W"], f["bias"], approximate=approximate)
        want = gelu.reference(h, f["bias"], approximate=bool(approximate)).astype(np.float16)
        np.testing.assert_array_equal(got, want)


def test_references_refuse_what_the_contract_excludes(rng) -> None:
    f = _inputs(rng)
    with pytest.raises(ValueError, match="expected X"):
        dense.dense_bias(f["X"], f["W"].T, f["bias"])
    with pytest.raises(ValueError, match="bias"):
        dense.dense_bias(f["X"], f["W"], f["bias"][None])
    with pytest.raises(ValueError, match="approximate"):
        dense.dense_bias_gelu(f["X"], f["W"], f["bias"], approximate=2)
    with pytest.raises(ValueError, match="skip"):  # SkipLayerNormalization's broadcast skip
        dense.dense_bias_skip_layernorm(f["X"], f["W"], f["bias"], f["skip"][:1], f["gamma"],
                                        f["beta"])


def test_node_builder_checks_slots_and_attributes() -> None:
    import onnx_graphsurgeon as gs

    t = {n: gs.Variable(n, dtype=np.float16) for n in ("x", "w", "b", "s", "g", "be", "y")}
    node = dense.DENSE_BIAS_GELU.node("n", [t["x"], t["w"], t["b"]], [t["y"]], approximate=1)
    assert node.domain == BERTFUSE_DOMAIN and node.attrs == {"approximate": 1}
    with pytest.raises(ValueError, match="bias"):  # every slot is required
        dense.DENSE_BIAS.node("n", [t["x"], t["w"], None], [t["y"]])
    with pytest.raises(ValueError, match="no attribute"):
        dense.DENSE_BIAS.node("n", [t["x"], t["w"], t["b"]], [t["y"]], approximate=1)
    with pytest.raises(TypeError, match="epsilon"):
        dense.DENSE_BIAS_SKIP_LAYERNORM.node(
            "n", [t["x"], t["w"], t["b"], t["s"], t["g"], t["be"]], [t["y"]], epsilon="small")


def test_one_node_model_keeps_ms_opset_for_contrib_ops() -> None:
    model = one_node_model("Gelu", MS_DOMAIN, [("X", np.float32, (2,))], [("Y", np.float32, (2,))])
    assert BERTFUSE_DOMAIN not in {o.domain for o in model.opset_import}
