"""Third-party TF BERT-family models, built by the libraries themselves, through `convert`.

The fixtures (tests/fixtures/thirdparty/, rebuilt by the build_*.py scripts there) are tiny
random models from transformers (TF classes, token and span heads included), keras-hub,
TF Model Garden, TF Hub's encoder form (plain and in hub.KerasLayer) and the TF1 checkpoints
of Google's own ALBERT and ELECTRA code, with every bias
and LayerNorm parameter perturbed so a dropped bias or a wrong gamma shows. Each carries its
library's own eager outputs on padded inputs (reference.npz, computed with oneDNN's rewrites
off). For every fixture, with default flags (ELECTRA's checkpoint: `--config` with the
--hparams it was trained with, which it keeps nowhere else; meta.json's convert_options):

* `convert` writes the model: the parity gate against TensorFlow passes;
* the graph is fused: Attention L, SkipLayerNormalization 2L, one GELU op per layer,
  EmbedLayerNormalization 1, no Softmax and no LayerNormalization left, about 7L + 4 nodes
  plus the head (MobileBERT: converts, fusion optional);
* the written model reproduces the library's eager outputs: fp32 max |diff| <= 1e-4, and its
  fp16 form max <= 4e-2, mean <= 2e-3.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from support import paths

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tensorflow")

FIXTURES = paths.FIXTURES / "thirdparty"
GELU_OPS = ("FastGelu", "BiasGelu", "Gelu")
# Nodes a fused model may have beyond 7 per layer + 4: the pooler (Gather, Gemm, Tanh), a
# classifier Gemm, ALBERT/ELECTRA's embedding projection (MatMul, Add), RoBERTa's position
# index subgraph (Equal, Not, Cast, CumSum, Mul, Add).
EXTRA_NODES = 3 + 1 + 2 + 6
# A masked-LM head's transform (Dense + GELU + LayerNorm) keeps its own GELU and LayerNorm;
# its decoder reads the tied word-embedding table through Gemm(transB=1) between two Reshapes.
MLM_CLASSES = ("TFBertForMaskedLM",)


def _options(name: str, **extra):
    """ConvertOptions with the fixture's own convert_options (paths relative to its dir)."""
    from bertfuse.pipeline.options import ConvertOptions

    given = json.loads((FIXTURES / name / "meta.json").read_text()).get("convert_options", {})
    if "config" in given:
        given = {**given, "config": str(FIXTURES / name / given["config"])}
    return ConvertOptions(**given, **extra)


def _cases() -> list:
    cases = []
    for meta_path in sorted(FIXTURES.glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        if meta.get("text_input"):
            continue  # text in (tensorflow-text in front): test_textin.py
        name = meta_path.parent.name
        cases.append(pytest.param(name, meta["path"], id=name))
        if meta.get("keras_path"):
            cases.append(pytest.param(name, meta["keras_path"], id=f"{name}.keras"))
    return cases


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from bertfuse.pipeline.stages import convert

    out_dir = tmp_path_factory.mktemp("thirdparty")
    cache: dict[tuple[str, str], tuple[str, object]] = {}

    def get(name: str, rel: str):
        if (name, rel) not in cache:
            out = out_dir / f"{name}_{Path(rel).name}.onnx"
            report = convert(str(FIXTURES / name / rel), str(out), _options(name))
            cache[(name, rel)] = (str(out), report)
        return cache[(name, rel)]

    return get


def _feeds_and_expected(name: str, model: onnx.ModelProto):
    """The fixture's padded inputs under bertfuse's input names, and the library's outputs
    under bertfuse's output names (the model's metadata maps them)."""
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    ref = np.load(FIXTURES / name / "reference.npz")
    original = json.loads({p.key: p.value for p in model.metadata_props}["original_names"])
    ids = ref[f"in/{meta['inputs']['input_ids']}"]
    feeds = {}
    for inp in model.graph.input:
        source_name = meta["inputs"].get(inp.name)
        feeds[inp.name] = (ref[f"in/{source_name}"] if source_name else np.zeros_like(ids)
                           ).astype(np.int32)
    expected = {}
    for out in model.graph.output:
        key = f"out/{original.get(out.name, out.name)}"
        if key not in ref.files:  # a .keras source names its single output `output`
            outs = [k for k in ref.files if k.startswith("out/")]
            assert len(outs) == 1 == len(model.graph.output), (out.name, ref.files)
            key = outs[0]
        expected[out.name] = ref[key]
    return feeds, expected, meta


def _run(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("name,rel", _cases())
def test_thirdparty_fused_and_exact(name, rel, converted):
    path, report = converted(name, rel)
    assert report.written and report.parity is not None and report.parity.ok, \
        report.parity.to_json() if report.parity else None
    # The mask checks run on every model with a mask input, heads included (a classifier's
    # logits); keras-bert and bert4keras mask where the token id is 0 and have none.
    model = onnx.load(path)
    feeds, expected, meta = _feeds_and_expected(name, model)
    checks = [o.name for o in report.parity.outputs if o.name.startswith("mask invariance")]
    want = (2 if meta["has_segment_ids"] else 1) if meta.get("has_mask_input", True) else 0
    assert len(checks) == want, checks
    ops = Counter(n.op_type for n in model.graph.node)
    layers = meta["layers"]
    head = 1 if meta["class"] in MLM_CLASSES else 0
    if "mobilebert" not in name:  # MobileBERT: fusion optional
        assert ops["Attention"] == layers, ops
        assert ops["SkipLayerNormalization"] == 2 * layers, ops
        assert sum(ops[g] for g in GELU_OPS) == layers + head, ops
        assert ops["EmbedLayerNormalization"] == 1, ops
        assert ops["Softmax"] == 0 and ops["LayerNormalization"] == head, ops
        assert sum(ops.values()) <= 7 * layers + 4 + EXTRA_NODES, ops
    # Outputs by meaning: each output the fixture's meta names, under its role.
    assert sorted(o.name for o in model.graph.output) == sorted(meta["outputs"].values())
    # One interface for every model: a model without token types ignores segment_ids.
    assert [i.name for i in model.graph.input] == ["input_ids", "input_mask", "segment_ids"]

    got = _run(model, feeds)
    for out, want in expected.items():
        diff = np.abs(got[out].astype(np.float64) - want)
        assert np.isfinite(got[out]).all() and diff.max() <= 1e-4, (out, diff.max())

    if rel.endswith(".keras"):
        return  # the same graph as the SavedModel row: fp16 is checked there
    from bertfuse.io.model import load_model
    from bertfuse.passes.cleanup import Cleanup
    from bertfuse.passes.fp16 import Fp16Pass
    from bertfuse.passes.manager import run_passes
    from bertfuse.passes.shared_weights import SharedWeights

    # The fp16 pipeline is the fp32 one followed by these passes (passes.manager).
    half, _ = run_passes(load_model(path), [Fp16Pass(), Cleanup(), SharedWeights()])
    got16 = _run(half, feeds)
    for out, want in expected.items():
        diff = np.abs(got16[out].astype(np.float64) - want)
        assert np.isfinite(got16[out]).all(), out
        assert diff.max() <= 4e-2 and diff.mean() <= 2e-3, (out, diff.max(), diff.mean())


@pytest.mark.parametrize("name", ["hf_albert", "gr_albert"])
def test_shared_layer_weights_stay_shared(name, converted):
    """ALBERT runs one layer L times: one set of initializers feeds every fused layer."""
    path, _ = converted(name, "model")
    model = onnx.load(path)
    attention = [n for n in model.graph.node if n.op_type == "Attention"]
    assert len(attention) == 2
    assert attention[0].input[1:3] == attention[1].input[1:3]  # one packed QKV weight and bias
    big = [i for i in model.graph.initializer if np.prod(i.dims) >= 32 * 32]
    assert len({i.name for i in big}) == len(big)
    names = [i.name for i in model.graph.initializer]
    assert len(names) == len(set(names))


def test_head_with_mask_and_segments_swapped_is_refused(tmp_path):
    """A classifier has no sequence_output: its logits carry the mask check."""
    from bertfuse.errors import ParityError
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    out = tmp_path / "swapped.onnx"
    opts = ConvertOptions(inputs="input_ids=input_ids,input_mask=token_type_ids,"
                                 "segment_ids=attention_mask")
    with pytest.raises(ParityError, match="mask invariance"):
        convert(str(FIXTURES / "hf_bert_cls" / "model"), str(out), opts)
    assert not out.exists()


@pytest.mark.parametrize("name,outputs", [("hf_bert_token", ["token_logits"]),
                                          ("hf_bert_qa", ["end_logits", "start_logits"])])
def test_token_level_heads_have_their_own_roles(name, outputs, converted):
    """Token classification's [B, S, C] logits are token_logits, a span head's start/end
    logits keep their names; the mask checks watch them at kept positions only, so the gate
    passes (padded positions' own logits move with their segment ids, in TF as in ONNX)."""
    path, report = converted(name, "model")
    model = onnx.load(path)
    assert sorted(o.name for o in model.graph.output) == outputs
    rows = {o.name: o for o in report.parity.outputs}
    assert rows["mask invariance (padded segment ids changed)"].ok, rows
    original = json.loads({p.key: p.value for p in model.metadata_props}["original_names"])
    assert original.get("token_logits", "logits") == "logits"


@pytest.mark.parametrize("name", ["hub_bert_encoder", "hub_keras_layer"])
def test_tfhub_outputs_mapped_to_roles(name, converted):
    """A TF Hub-style encoder's signature names its outputs after Keras layers (`bert_1`,
    `keras_layer_1`, ...): the outputs are read off the model's own dict, as sequence_output
    and pooled_output; `default` and the per-layer `encoder_outputs` are left out."""
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    assert not {"sequence_output", "pooled_output"} & set(meta["signature_outputs"])
    path, _ = converted(name, "model")
    model = onnx.load(path)
    assert sorted(o.name for o in model.graph.output) == ["pooled_output", "sequence_output"]


def test_tfhub_per_layer_outputs_on_request(tmp_path):
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    out = tmp_path / "hub.onnx"
    src = FIXTURES / "hub_bert_encoder"
    report = convert(str(src / "model"), str(out),
                     ConvertOptions(outputs=["sequence_output", "encoder_outputs_0"]))
    assert report.written and report.parity.ok
    model = onnx.load(out)
    assert [o.name for o in model.graph.output] == ["sequence_output", "encoder_outputs_0"]
    feeds, _, _ = _feeds_and_expected("hub_bert_encoder", model)
    ref = np.load(src / "reference.npz")
    got = _run(model, feeds)
    for key in ("sequence_output", "encoder_outputs_0"):
        assert np.abs(got[key] - ref[f"out/{key}"]).max() <= 1e-4, key


def _lowering_cases() -> list:
    """Every SavedModel / checkpoint / frozen source but MobileBERT's (left unfused)."""
    return [c for c in _cases() if "mobilebert" not in c.values[0]
            and not c.values[1].endswith(".keras")]


@pytest.mark.parametrize("name,rel", _lowering_cases())
def test_every_family_lowers_to_bertfuse_kernels(name, rel, converted):
    """`--ops bertfuse` lowers every encoder layer of every family (a graph rewrite,
    checked here on the CPU): the converted model through optimize's fp16 + lowering, which
    checks the lowered model against the fp32 one itself; the lowered model, run through the
    NumPy references, still matches the library's own outputs within the fp16 limits."""
    from bertfuse.ops.evaluator import evaluate
    from support.lowering import lowered

    path, _ = converted(name, rel)
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    # A masked-LM head's transform has a GELU of its own, lowered too.
    model = lowered(path, meta["layers"], head_gelus=int(meta["class"] in MLM_CLASSES))
    feeds, expected, _ = _feeds_and_expected(name, model)
    got = evaluate(model, feeds)
    for key, want in expected.items():
        diff = np.abs(got[key].astype(np.float64) - want)
        assert diff.max() <= 4e-2 and diff.mean() <= 2e-3, (key, diff.max(), diff.mean())
