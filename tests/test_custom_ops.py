"""ORT CPU kernels vs the NumPy references in bertfuse.custom_ops.

Every test draws fresh random inputs. The seed comes from Python's ``random`` (which
pytest-randomly reseeds per test when installed) and is printed in every failure message;
set BERTFUSE_TEST_SEED=<n> to replay one.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.custom_ops import CONTRACTS, attention, embed_layernorm, gelu, layernorm, skip_layernorm  # noqa: E402
from bertfuse.custom_ops.contract import one_node_model  # noqa: E402

FP32_ATOL = 1e-5
ATTENTION_ATOL = 1e-4
README = Path(__file__).resolve().parents[1] / "bertfuse" / "custom_ops" / "README.md"


# ----------------------------------------------------------------------------- helpers




def session(model: onnx.ModelProto) -> ort.InferenceSession:
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    # No fusions/constant folding: the node under test must be the kernel that runs.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return session(model).run(None, feeds)


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def assert_close(actual: np.ndarray, expected: np.ndarray, atol: float, seed: int, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    d = max_diff(actual, expected)
    assert d <= atol, f"{what}: max|diff| {d:.3g} > {atol:g} (replay: BERTFUSE_TEST_SEED={seed})"


def assert_fp16_within_ulp(actual: np.ndarray, expected: np.ndarray, seed: int, what: str, ulps: int = 1) -> None:
    """fp16 check: ORT's result within `ulps` fp16 ulps of the float64 reference rounded to fp16.

    Plus a 2**-18 absolute floor: near 0, float32 cancellation inside the kernel (x_hat*gamma + beta)
    is a few subnormal fp16 ulps.
    """
    assert actual.dtype == np.float16 and expected.dtype == np.float16, what
    tol = ulps * np.spacing(np.abs(expected)).astype(np.float64) + 2.0**-18
    excess = np.abs(actual.astype(np.float64) - expected.astype(np.float64)) - tol
    assert excess.max() <= 0, (
        f"{what}: {int((excess > 0).sum())} values off by > {ulps} fp16 ulp "
        f"(max|diff| {max_diff(actual, expected):.3g}; replay: BERTFUSE_TEST_SEED={seed})"
    )


def random_key_mask(rng: np.random.Generator, b: int, s: int) -> np.ndarray:
    """0/1 int32 [B,S] with padding anywhere; row 0 pads in the middle; every row attends somewhere."""
    m = (rng.random((b, s)) < 0.7).astype(np.int32)
    m[np.arange(b), rng.integers(0, s, b)] = 1
    m[0] = 1
    m[0, s // 3: s // 3 + 2] = 0  # padding in the middle of a row
    return m


def ort_cpu_float_types(op_type: str, domain: str, opset: int) -> set[str]:
    """Float types of the native CPU kernels ORT registers for (domain, op_type) at opset."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    if not hasattr(C, "get_all_opkernel_def"):
        pytest.skip("this onnxruntime build does not expose its kernel registry")
    names = {"tensor(float)": "float32", "tensor(float16)": "float16",
             "tensor(double)": "float64", "tensor(bfloat16)": "bfloat16"}
    found: set[str] = set()
    for k in C.get_all_opkernel_def():
        lo, hi = k.version_range
        if (k.op_name, k.domain or "", k.provider) == (op_type, domain, "CPUExecutionProvider") and lo <= opset <= hi:
            found |= {names[t] for t in k.type_constraints.get("T", []) if t in names}
    return found


# ----------------------------------------------------------------------------- registry


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


# ----------------------------------------------------------------------------- Attention

B, S, H, N = 3, 7, 32, 4


def attention_inputs(rng: np.random.Generator, b: int = B, s: int = S, h: int = H) -> dict[str, np.ndarray]:
    # 2/sqrt(H) weight scale gives O(1..3) logits: peaky softmax, so mask/packing errors show.
    return {
        "input": rng.standard_normal((b, s, h)).astype(np.float32),
        "weights": (rng.standard_normal((h, 3 * h)) * (2.0 / np.sqrt(h))).astype(np.float32),
        "bias": (0.1 * rng.standard_normal(3 * h)).astype(np.float32),
    }


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


def test_attention_2d_raw_mask(rng: np.random.Generator, seed: int) -> None:
    feeds = attention_inputs(rng)
    feeds["mask_index"] = random_key_mask(rng, B, S)
    (y,) = run(attention.make_model(B, S, H, N, mask_shape=(B, S)), feeds)
    ref = attention.reference(**feeds, num_heads=N)
    assert_close(y, ref, ATTENTION_ATOL, seed, "Attention 2-D raw mask")


def test_attention_padding_in_middle_of_row(rng: np.random.Generator, seed: int) -> None:
    """[1,1,0,0,1,1,0]: only the raw 2-D form can express it; padded keys must have zero influence."""
    feeds = attention_inputs(rng)
    mask = np.ones((B, S), np.int32)
    mask[0] = [1, 1, 0, 0, 1, 1, 0]
    mask[1] = [0, 1, 1, 1, 0, 1, 1]
    feeds["mask_index"] = mask
    model = attention.make_model(B, S, H, N, mask_shape=(B, S))
    (y,) = run(model, feeds)
    assert_close(y, attention.reference(**feeds, num_heads=N), ATTENTION_ATOL, seed, "middle padding")

    # Rewrite the hidden states at padded positions: outputs at real tokens must not move.
    noisy = dict(feeds)
    noisy["input"] = feeds["input"].copy()
    noisy["input"][mask == 0] = 5.0 * rng.standard_normal((int((mask == 0).sum()), H))
    (y2,) = run(model, noisy)
    real = mask.astype(bool)
    assert max_diff(y2[real], y[real]) <= 1e-6, f"padded keys leak into real tokens (seed={seed})"
    # ... while a mask that ignores the padding does see the change (the check above has teeth).
    assert max_diff(attention.reference(**{**noisy, "mask_index": None}, num_heads=N)[real], y[real]) > 1e-3


def test_attention_1d_lengths_equal_2d_raw_for_right_padding(rng: np.random.Generator, seed: int) -> None:
    feeds = attention_inputs(rng)
    lengths = rng.integers(1, S + 1, B).astype(np.int32)
    lengths[0] = S - 2  # at least one row really padded
    raw = (np.arange(S)[None, :] < lengths[:, None]).astype(np.int32)
    (y1,) = run(attention.make_model(B, S, H, N, mask_shape=(B,)), {**feeds, "mask_index": lengths})
    (y2,) = run(attention.make_model(B, S, H, N, mask_shape=(B, S)), {**feeds, "mask_index": raw})
    assert_close(y1, y2, FP32_ATOL, seed, "1-D lengths vs 2-D raw")
    assert_close(y1, attention.reference(**feeds, mask_index=lengths, num_heads=N), ATTENTION_ATOL, seed, "1-D")


@pytest.mark.parametrize("form", ["none", "left_padding_2B", "raw_3d", "mask_value_2"])
def test_attention_other_mask_forms(form: str, rng: np.random.Generator, seed: int) -> None:
    feeds = attention_inputs(rng)
    mask: np.ndarray | None
    if form == "none":
        mask = None
    elif form == "left_padding_2B":  # exclusive ends, then inclusive starts
        starts = rng.integers(0, S - 1, B)
        mask = np.concatenate([np.full(B, S), starts]).astype(np.int32)
    elif form == "raw_3d":
        mask = rng.integers(0, 2, (B, S, S)).astype(np.int32)
        mask[:, :, 0] = 1
    else:  # ORT's rule is mask > 0, not (1 - mask) * filter
        mask = random_key_mask(rng, B, S) * 2
    model = attention.make_model(B, S, H, N, mask_shape=None if mask is None else mask.shape)
    (y,) = run(model, feeds if mask is None else {**feeds, "mask_index": mask})
    assert_close(y, attention.reference(**feeds, mask_index=mask, num_heads=N), ATTENTION_ATOL, seed, form)


@pytest.mark.parametrize("scale,mask_filter_value", [(None, -10000.0), (0.37, -10000.0), (None, -2.5)])
def test_attention_scale_and_mask_filter_value(
    scale: float | None, mask_filter_value: float, rng: np.random.Generator, seed: int
) -> None:
    feeds = attention_inputs(rng)
    feeds["mask_index"] = random_key_mask(rng, B, S)
    model = attention.make_model(B, S, H, N, mask_shape=(B, S), scale=scale, mask_filter_value=mask_filter_value)
    (y,) = run(model, feeds)
    ref = attention.reference(**feeds, num_heads=N, scale=scale, mask_filter_value=mask_filter_value)
    assert_close(y, ref, ATTENTION_ATOL, seed, f"scale={scale} mask_filter_value={mask_filter_value}")
    if mask_filter_value != -10000.0:  # the attribute is an additive value, honoured as given
        bert = attention.reference(**feeds, num_heads=N, scale=scale)
        assert max_diff(y, bert) > 1e-3


@pytest.mark.parametrize("a,b", [(0, 1), (1, 2), (0, 2)], ids=["Q<->K", "K<->V", "Q<->V"])
def test_attention_packing_swap_is_caught(a: int, b: int, rng: np.random.Generator, seed: int) -> None:
    """Packing Q/K/V in the wrong order still runs; only the reference comparison notices."""
    feeds = attention_inputs(rng)
    feeds["mask_index"] = random_key_mask(rng, B, S)
    w_blocks = np.split(feeds["weights"], 3, axis=1)
    b_blocks = np.split(feeds["bias"], 3)
    for blocks in (w_blocks, b_blocks):
        blocks[a], blocks[b] = blocks[b], blocks[a]
    swapped = {**feeds, "weights": np.concatenate(w_blocks, axis=1), "bias": np.concatenate(b_blocks)}
    (y,) = run(attention.make_model(B, S, H, N, mask_shape=(B, S)), swapped)
    assert_close(y, attention.reference(**swapped, num_heads=N), ATTENTION_ATOL, seed, "swapped vs its reference")
    assert max_diff(y, attention.reference(**feeds, num_heads=N)) > 1e-2, f"swap went unnoticed (seed={seed})"


def test_attention_pack_helpers_keep_qkv_order(rng: np.random.Generator) -> None:
    wq, wk, wv = (rng.standard_normal((H, H)) for _ in range(3))
    w = attention.pack_qkv(wq, wk, wv)
    assert w.shape == (H, 3 * H)
    np.testing.assert_array_equal(w[:, :H], wq)
    np.testing.assert_array_equal(w[:, H:2 * H], wk)
    np.testing.assert_array_equal(w[:, 2 * H:], wv)


def test_attention_rejects_int64_mask(rng: np.random.Generator) -> None:
    with pytest.raises(TypeError):
        attention.reference(**attention_inputs(rng), mask_index=np.ones((B, S), np.int64), num_heads=N)


# ----------------------------------------------------------------------------- SkipLayerNormalization


@pytest.mark.parametrize("skip_shape", [(B, S, H), (1, S, H), (S, H)], ids=["BSH", "1SH", "SH"])
@pytest.mark.parametrize("with_beta,with_bias", [(True, True), (True, False), (False, True)])
def test_skip_layernorm_fp32(
    skip_shape: tuple[int, ...], with_beta: bool, with_bias: bool, rng: np.random.Generator, seed: int
) -> None:
    feeds = {
        "input": rng.standard_normal((B, S, H)).astype(np.float32),
        "skip": rng.standard_normal(skip_shape).astype(np.float32),
        "gamma": (1.0 + 0.5 * rng.standard_normal(H)).astype(np.float32),
    }
    if with_beta:
        feeds["beta"] = rng.standard_normal(H).astype(np.float32)
    if with_bias:
        feeds["bias"] = rng.standard_normal(H).astype(np.float32)
    model = skip_layernorm.make_model(
        (B, S, H), skip_shape=skip_shape, with_beta=with_beta, with_bias=with_bias, all_outputs=True
    )
    got = run(model, feeds)
    ref = skip_layernorm.reference_outputs(**feeds)
    for name, g, r in zip(ref._fields, got, ref):
        assert_close(g, r, FP32_ATOL, seed, f"SkipLayerNormalization.{name}")
    assert got[1].shape == (B, S, 1) and got[1].dtype == np.float32


def test_skip_layernorm_main_output_only(rng: np.random.Generator, seed: int) -> None:
    feeds = {k: rng.standard_normal(s).astype(np.float32)
             for k, s in (("input", (B, S, H)), ("skip", (B, S, H)), ("gamma", (H,)), ("beta", (H,)), ("bias", (H,)))}
    (y,) = run(skip_layernorm.make_model((B, S, H)), feeds)
    assert_close(y, skip_layernorm.reference(**feeds), FP32_ATOL, seed, "SkipLayerNormalization")


def fp16_skip_layernorm(rng: np.random.Generator, seed: int) -> None:
    feeds = {k: rng.standard_normal(s).astype(np.float16)
             for k, s in (("input", (B, S, H)), ("skip", (B, S, H)), ("gamma", (H,)), ("beta", (H,)), ("bias", (H,)))}
    got = run(skip_layernorm.make_model((B, S, H), np.float16, epsilon=1e-5, all_outputs=True), feeds)
    ref = skip_layernorm.reference_outputs(**feeds, epsilon=1e-5)
    assert_fp16_within_ulp(got[0], ref.output, seed, "SkipLayerNormalization fp16 output")
    assert_fp16_within_ulp(got[3], ref.input_skip_bias_sum, seed, "SkipLayerNormalization fp16 sum")
    for i, name in ((1, "mean"), (2, "inv_std_var")):
        assert got[i].dtype == np.float32, f"{name} is type U=float32 even for fp16 T"
        assert_close(got[i], ref[i], 1e-4, seed, f"SkipLayerNormalization fp16 {name}")


# ----------------------------------------------------------------------------- EmbedLayerNormalization

VOCAB, MAXPOS, TYPES = 50, 16, 2


def embed_inputs(rng: np.random.Generator, with_segments: bool = True) -> dict[str, np.ndarray | None]:
    return {
        "input_ids": rng.integers(0, VOCAB, (B, S)).astype(np.int32),
        "segment_ids": rng.integers(0, TYPES, (B, S)).astype(np.int32) if with_segments else None,
        "word_embedding": rng.standard_normal((VOCAB, H)).astype(np.float32),
        "position_embedding": rng.standard_normal((MAXPOS, H)).astype(np.float32),
        "segment_embedding": rng.standard_normal((TYPES, H)).astype(np.float32) if with_segments else None,
        "gamma": (1.0 + 0.5 * rng.standard_normal(H)).astype(np.float32),
        "beta": rng.standard_normal(H).astype(np.float32),
    }


def present(feeds: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {k: v for k, v in feeds.items() if v is not None}


def test_embed_layernorm_all_outputs(rng: np.random.Generator, seed: int) -> None:
    feeds = embed_inputs(rng)
    feeds["mask"] = random_key_mask(rng, B, S)  # row 0 has padding in the middle
    model = embed_layernorm.make_model(B, S, H, VOCAB, MAXPOS, TYPES, with_embedding_sum=True)
    y, mask_index, emb_sum = run(model, present(feeds))
    ref = embed_layernorm.reference_outputs(**feeds)
    assert_close(y, ref.output, FP32_ATOL, seed, "EmbedLayerNormalization.output")
    assert_close(emb_sum, ref.embedding_sum, FP32_ATOL, seed, "EmbedLayerNormalization.embedding_sum")
    assert mask_index.dtype == np.int32 and mask_index.shape == (B,)
    np.testing.assert_array_equal(mask_index, ref.mask_index, err_msg=f"seed={seed}")


def test_embed_layernorm_mask_index_semantics() -> None:
    """CPU counts ones; CUDA finds the first zero. Same only for right-padded 0/1 rows."""
    mask = np.array([[1, 1, 1, 0, 0, 0, 0],   # right padded
                     [1, 0, 1, 1, 0, 1, 1],   # padding in the middle
                     [2, 1, 1, 0, 0, 0, 0],   # non-0/1 value
                     [1, 1, 1, 1, 1, 1, 1]], np.int32)
    b = mask.shape[0]
    ids = np.zeros((b, S), np.int32)
    model = embed_layernorm.make_model(b, S, H, VOCAB, MAXPOS, None, with_mask=True)
    ones = np.ones(H, np.float32)
    word = np.tile(np.arange(H, dtype=np.float32), (VOCAB, 1))  # non-constant rows: LN stays well defined
    feeds = {"input_ids": ids, "word_embedding": word, "position_embedding": np.ones((MAXPOS, H), np.float32),
             "gamma": ones, "beta": ones, "mask": mask}
    _, mask_index = run(model, feeds)
    np.testing.assert_array_equal(mask_index, [3, 5, 2, 7])
    np.testing.assert_array_equal(embed_layernorm.mask_index_from_mask(mask, b, S, "cpu"), [3, 5, 2, 7])
    np.testing.assert_array_equal(embed_layernorm.mask_index_from_mask(mask, b, S, "cuda"), [3, 1, 3, 7])


def test_embed_layernorm_no_segments_no_mask(rng: np.random.Generator, seed: int) -> None:
    feeds = embed_inputs(rng, with_segments=False)
    model = embed_layernorm.make_model(B, S, H, VOCAB, MAXPOS, None, with_mask=False)
    y, mask_index = run(model, present(feeds))
    assert_close(y, embed_layernorm.reference(**feeds), FP32_ATOL, seed, "EmbedLayerNormalization (DistilBERT)")
    np.testing.assert_array_equal(mask_index, np.zeros(B, np.int32))  # zeros, not S


@pytest.mark.parametrize("pos_rows", [1, B], ids=["1xS", "BxS"])
def test_embed_layernorm_position_ids(pos_rows: int, rng: np.random.Generator, seed: int) -> None:
    feeds = embed_inputs(rng)
    feeds["position_ids"] = rng.integers(0, MAXPOS, (pos_rows, S)).astype(np.int32)
    model = embed_layernorm.make_model(
        B, S, H, VOCAB, MAXPOS, TYPES, with_mask=False, position_ids_shape=(pos_rows, S), with_mask_index=False
    )
    (y,) = run(model, present(feeds))
    assert_close(y, embed_layernorm.reference(**feeds), FP32_ATOL, seed, f"position_ids {pos_rows}xS")


def test_embed_layernorm_single_output_needs_mask_index_type_0() -> None:
    f = np.float32
    ins = [("input_ids", np.int32, (B, S)), None, ("word_embedding", f, (VOCAB, H)),
           ("position_embedding", f, (MAXPOS, H)), None, ("gamma", f, (H,)), ("beta", f, (H,))]
    outs = [("output", f, (B, S, H))]
    with pytest.raises(Exception, match="out of range"):
        session(one_node_model("EmbedLayerNormalization", "com.microsoft", ins, outs, {"epsilon": 1e-12}))
    session(one_node_model("EmbedLayerNormalization", "com.microsoft", ins, outs, {"mask_index_type": 0}))


def test_embed_layernorm_ids_must_be_int32(rng: np.random.Generator) -> None:
    f = np.float32
    ins = [("input_ids", np.int64, (B, S)), None, ("word_embedding", f, (VOCAB, H)),
           ("position_embedding", f, (MAXPOS, H)), None, ("gamma", f, (H,)), ("beta", f, (H,))]
    with pytest.raises(Exception, match="int64"):
        session(one_node_model("EmbedLayerNormalization", "com.microsoft", ins, [("output", f, (B, S, H))],
                               {"mask_index_type": 0}))
    feeds = embed_inputs(rng)
    feeds["input_ids"] = feeds["input_ids"].astype(np.int64)
    with pytest.raises(TypeError):
        embed_layernorm.reference(**feeds)


# ----------------------------------------------------------------------------- GELU family

GELU_CASES = [("Gelu", False), ("BiasGelu", True), ("FastGelu", True), ("FastGelu", False)]


@pytest.mark.parametrize("op_type,with_bias", GELU_CASES, ids=["Gelu", "BiasGelu", "FastGelu+bias", "FastGelu"])
def test_gelu_family_fp32(op_type: str, with_bias: bool, rng: np.random.Generator, seed: int) -> None:
    model = gelu.make_model(op_type, (B, S, H), with_bias=with_bias)
    names = [i.name for i in model.graph.input]
    x = (3.0 * rng.standard_normal((B, S, H))).astype(np.float32)  # covers the curved region and tails
    args = [x] + ([rng.standard_normal(H).astype(np.float32)] if with_bias else [])
    (y,) = run(model, dict(zip(names, args)))
    assert_close(y, gelu.reference_for(op_type, *args), FP32_ATOL, seed, op_type)


def test_exact_and_tanh_gelu_are_distinguishable(rng: np.random.Generator, seed: int) -> None:
    """Fusing TF BERT's tanh gelu into BiasGelu (erf) is a numeric change these tests would flag."""
    x = (3.0 * rng.standard_normal((B, S, H))).astype(np.float32)
    bias = rng.standard_normal(H).astype(np.float32)
    (y_erf,) = run(gelu.make_model("BiasGelu", (B, S, H)), {"A": x, "B": bias})
    (y_tanh,) = run(gelu.make_model("FastGelu", (B, S, H)), {"X": x, "bias": bias})
    assert max_diff(y_erf, y_tanh) > 10 * FP32_ATOL, f"seed={seed}"


@pytest.mark.parametrize("op_type,names", [("BiasGelu", ("A", "B")), ("FastGelu", ("X", "bias"))])
def test_gelu_bias_must_be_1d(op_type: str, names: tuple[str, str], rng: np.random.Generator) -> None:
    """A [1,H] bias (what a naive Add-folding produces) is rejected by the kernel, not broadcast."""
    f = np.float32
    model = one_node_model(op_type, "com.microsoft", [(names[0], f, (B, S, H)), (names[1], f, (1, H))],
                           [("Y", f, (B, S, H))])
    feeds = {names[0]: rng.standard_normal((B, S, H)).astype(f), names[1]: rng.standard_normal((1, H)).astype(f)}
    with pytest.raises(Exception, match="expected to have 1 dimensions"):
        run(model, feeds)


def test_gemm_fast_gelu(rng: np.random.Generator, seed: int) -> None:
    model = gelu.make_model("GemmFastGelu", (B * S, H), n_out=4 * H)
    try:
        sess = session(model)
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        if "NOT_IMPLEMENTED" in str(e) or "Could not find an implementation" in str(e):
            pytest.skip("GemmFastGelu has no ONNX Runtime CPU kernel (NOT_IMPLEMENTED); ORT implements it only "
                        "on a GPU EP (ROCm) — emit MatMul + FastGelu(bias) for CPU/CUDA")
        raise
    x = rng.standard_normal((B * S, H)).astype(np.float32)
    w = (rng.standard_normal((H, 4 * H)) / np.sqrt(H)).astype(np.float32)
    bias = rng.standard_normal(4 * H).astype(np.float32)
    (y,) = sess.run(None, {"X": x, "W": w, "bias": bias})
    assert_close(y, gelu.gemm_fast_gelu_reference(x, w, bias), FP32_ATOL, seed, "GemmFastGelu")


def test_gemm_fast_gelu_reference_is_matmul_then_fast_gelu(rng: np.random.Generator) -> None:
    x, w, bias = rng.standard_normal((5, 8)), rng.standard_normal((8, 6)), rng.standard_normal(6)
    np.testing.assert_allclose(gelu.gemm_fast_gelu_reference(x, w, bias),
                               gelu.reference(x @ w, bias, approximate=True), rtol=1e-12)


# ----------------------------------------------------------------------------- LayerNormalization


@pytest.mark.parametrize("epsilon", [1e-12, 1e-5])
@pytest.mark.parametrize("stash_type", [1, 0])
def test_layernorm_fp32(epsilon: float, stash_type: int, rng: np.random.Generator, seed: int) -> None:
    feeds = {"X": (2.0 * rng.standard_normal((B, S, H)) + 0.5).astype(np.float32),
             "Scale": rng.standard_normal(H).astype(np.float32),
             "B": rng.standard_normal(H).astype(np.float32)}
    model = layernorm.make_model((B, S, H), epsilon=epsilon, stash_type=stash_type, with_stats=True)
    got = run(model, feeds)
    ref = layernorm.reference_outputs(**feeds, epsilon=epsilon, stash_type=stash_type)
    for name, g, r in zip(ref._fields, got, ref):
        assert_close(g, r, FP32_ATOL, seed, f"LayerNormalization.{name}")


def test_layernorm_without_bias(rng: np.random.Generator, seed: int) -> None:
    feeds = {"X": rng.standard_normal((B, S, H)).astype(np.float32), "Scale": rng.standard_normal(H).astype(np.float32)}
    (y,) = run(layernorm.make_model((B, S, H), with_bias=False), feeds)
    assert_close(y, layernorm.reference(**feeds, epsilon=1e-12), FP32_ATOL, seed, "LayerNormalization no B")


def fp16_layernorm(rng: np.random.Generator, seed: int) -> None:
    feeds = {"X": rng.standard_normal((B, S, H)).astype(np.float16),
             "Scale": rng.standard_normal(H).astype(np.float16),
             "B": rng.standard_normal(H).astype(np.float16)}
    got = run(layernorm.make_model((B, S, H), np.float16, epsilon=1e-5, with_stats=True), feeds)
    ref = layernorm.reference_outputs(**feeds, epsilon=1e-5)
    assert_fp16_within_ulp(got[0], ref.Y, seed, "LayerNormalization fp16")
    assert got[1].dtype == np.float32 and got[2].dtype == np.float32  # U follows stash_type, not T


# ----------------------------------------------------------------------------- fp16

FP16_TESTS = {"SkipLayerNormalization": fp16_skip_layernorm, "LayerNormalization": fp16_layernorm}


@pytest.mark.parametrize("op_type", sorted(CONTRACTS))
def test_fp16_cpu(op_type: str, rng: np.random.Generator, seed: int) -> None:
    c = CONTRACTS[op_type]
    if not c.cpu_kernel_types:
        pytest.skip(f"{c.qualified_name}: ORT has no CPU kernel for it in any dtype (see test_gemm_fast_gelu)")
    if "float16" not in c.cpu_kernel_types:
        pytest.skip(
            f"{c.qualified_name}: ORT CPU registers no float16 kernel (only {', '.join(c.cpu_kernel_types)}). "
            "A float16 model still runs because ORT's InsertCastTransformer wraps the node in fp16<->fp32 "
            "Casts, but that would only re-test the fp32 kernel; fp16 numerics need a GPU EP."
        )
    FP16_TESTS[op_type](rng, seed)
