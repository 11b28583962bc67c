"""Serving exports through `convert`: Estimator exports of google-research/bert's own
model_fns (serialized tf.Example in, or raw placeholders with a label input), and XLA-compiled
serving functions (`tf.function(jit_compile=True)`) around real library models.

The Estimator fixtures (tests/fixtures/thirdparty/estimator/, build_estimator.py) carry the
exported signature's own outputs on padded rows fed as serialized tf.Example protos. For each:
the graph is cut after the parse op, the ONNX model takes int32 input_ids, input_mask,
segment_ids, `label_ids` / `unique_ids` are left out and said so, the gate passes, every
layer is fused, and the written model reproduces the signature: fp32 max |diff| <= 1e-4,
fp16 max <= 4e-2, mean <= 2e-3.
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
tf = pytest.importorskip("tensorflow")

THIRDPARTY = paths.FIXTURES / "thirdparty"
ESTIMATOR = THIRDPARTY / "estimator"
GELU_OPS = ("FastGelu", "BiasGelu", "Gelu")
ROLES = ["input_ids", "input_mask", "segment_ids"]
EXPECTED = {  # fixture: (ONNX outputs, what the notes name as left out)
    "est_cls_example": (["probabilities"], ["label_ids", "input examples"]),
    "est_cls_raw": (["probabilities"], ["input label_ids"]),
    "est_squad_example": (["end_logits", "start_logits"], ["output unique_ids", "unique_ids",
                                                           "input examples"]),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    out_dir = tmp_path_factory.mktemp("serving")
    cache: dict[str, tuple[str, object]] = {}

    def get(src: Path, key: str, **opts):
        if key not in cache:
            out = out_dir / f"{key}.onnx"
            cache[key] = (str(out), convert(str(src), str(out), ConvertOptions(**opts)))
        return cache[key]

    return get


def _run(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _fused(model: onnx.ModelProto, layers: int, head_softmax: int = 0) -> None:
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Attention"] == layers, ops
    assert ops["SkipLayerNormalization"] == 2 * layers, ops
    assert sum(ops[g] for g in GELU_OPS) == layers, ops
    assert ops["EmbedLayerNormalization"] == 1 and ops["LayerNormalization"] == 0, ops
    # No Softmax left in the encoder; a classifier's probabilities are its output's Softmax.
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert len(softmax) == head_softmax, ops
    assert all(n.output[0] in {o.name for o in model.graph.output} for n in softmax)


def _check_against(model: onnx.ModelProto, feeds: dict, expected: dict) -> None:
    """fp32 within 1e-4 of the library's outputs; the fp16 pipeline within its limits."""
    from bertfuse.passes.cleanup import Cleanup
    from bertfuse.passes.fp16 import Fp16Pass
    from bertfuse.passes.manager import run_passes
    from bertfuse.passes.shared_weights import SharedWeights

    got = _run(model, feeds)
    for out, want in expected.items():
        diff = np.abs(got[out].astype(np.float64) - want)
        assert np.isfinite(got[out]).all() and diff.max() <= 1e-4, (out, diff.max())
    half, _ = run_passes(model, [Fp16Pass(), Cleanup(), SharedWeights()])
    got16 = _run(half, feeds)
    for out, want in expected.items():
        diff = np.abs(got16[out].astype(np.float64) - want)
        assert np.isfinite(got16[out]).all(), out
        assert diff.max() <= 4e-2 and diff.mean() <= 2e-3, (out, diff.max(), diff.mean())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_estimator_export_cut_fused_and_exact(name, converted):
    meta = json.loads((ESTIMATOR / name / "meta.json").read_text())
    path, report = converted(ESTIMATOR / name / "model", name)
    assert report.written and report.parity.ok, report.parity.to_json()
    checks = [o.name for o in report.parity.outputs if o.name.startswith("mask invariance")]
    assert len(checks) == 2, checks
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ROLES
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.INT32 for i in model.graph.input)
    outputs, left_out = EXPECTED[name]
    assert sorted(o.name for o in model.graph.output) == outputs
    notes = " | ".join(report.notes)
    for what in left_out:
        assert what in notes, report.notes
    _fused(model, meta["layers"], head_softmax=1 if "cls" in name else 0)

    ref = np.load(ESTIMATOR / name / "reference.npz")  # the signature's own outputs
    feeds = {r: ref[f"in/{r}"].astype(np.int32) for r in ROLES}
    _check_against(model, feeds, {o: ref[f"out/{o}"] for o in outputs})


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_estimator_export_lowers_to_bertfuse_kernels(name, converted):
    """`--ops bertfuse` lowers every encoder layer of the cut export (checked on the CPU);
    run through the NumPy references it still matches the signature's own outputs."""
    from bertfuse.ops.evaluator import evaluate
    from support.lowering import lowered

    meta = json.loads((ESTIMATOR / name / "meta.json").read_text())
    path, _ = converted(ESTIMATOR / name / "model", name)
    model = lowered(path, meta["layers"])
    ref = np.load(ESTIMATOR / name / "reference.npz")
    got = evaluate(model, {r: ref[f"in/{r}"].astype(np.int32) for r in ROLES})
    for out in EXPECTED[name][0]:
        diff = np.abs(got[out].astype(np.float64) - ref[f"out/{out}"])
        assert diff.max() <= 4e-2 and diff.mean() <= 2e-3, (out, diff.max(), diff.mean())


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_estimator_classifier_passes_strict(precision, tmp_path):
    """--strict: the classifier's probabilities Softmax is no unfused attention layer."""
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    out = tmp_path / "strict.onnx"
    report = convert(str(ESTIMATOR / "est_cls_raw" / "model"), str(out),
                     ConvertOptions(strict=True, precision=precision))
    assert report.written and report.passes.table.fully_fused
    assert len(report.passes.table.layers) == 2


def test_inputs_names_graph_tensors_as_cut_points(tmp_path):
    """--inputs ROLE=TENSOR: the parse op's outputs named by hand give the same model."""
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    parse = "ParseExample/ParseExampleV2"  # dense outputs in key order: ids, mask, label, types
    out = tmp_path / "cut.onnx"
    report = convert(str(ESTIMATOR / "est_cls_example" / "model"), str(out), ConvertOptions(
        inputs=f"input_ids={parse}:0,input_mask={parse}:1,segment_ids={parse}:3"))
    assert report.written and report.parity.ok
    assert any(n.startswith(f"cut after --inputs input_ids={parse}:0") for n in report.notes)
    model = onnx.load(out)
    assert [i.name for i in model.graph.input] == ROLES
    ref = np.load(ESTIMATOR / "est_cls_example" / "reference.npz")
    got = _run(model, {r: ref[f"in/{r}"] for r in ROLES})
    assert np.abs(got["probabilities"] - ref["out/probabilities"]).max() <= 1e-4


def test_inputs_naming_nothing_is_one_line():
    from bertfuse.converter import load_source
    from bertfuse.errors import BertfuseError

    with pytest.raises(BertfuseError, match="no input and no graph tensor 'nowhere:0'"):
        load_source(str(ESTIMATOR / "est_cls_example" / "model"), "savedmodel",
                    "serving_default", inputs="input_ids=nowhere:0")


def test_frozen_estimator_graph_is_cut_too(tmp_path):
    """The same export frozen to a .pb (parse op and string placeholder in it)."""
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    loaded = tf.saved_model.load(str(ESTIMATOR / "est_cls_example" / "model"))
    frozen = convert_variables_to_constants_v2(loaded.signatures["serving_default"])
    pb = tmp_path / "cls.pb"
    pb.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    out = tmp_path / "cls.onnx"
    report = convert(str(pb), str(out), ConvertOptions())  # outputs: what nothing reads
    assert report.written and report.parity.ok, report.notes
    assert any("cut after ParseExampleV2" in n for n in report.notes), report.notes
    assert any("label_ids" in n for n in report.notes), report.notes
    model = onnx.load(out)
    assert [i.name for i in model.graph.input] == ROLES
    (output,) = model.graph.output
    ref = np.load(ESTIMATOR / "est_cls_example" / "reference.npz")
    got = _run(model, {r: ref[f"in/{r}"] for r in ROLES})[output.name]
    assert np.abs(got - ref["out/probabilities"]).max() <= 1e-4


def test_verify_against_the_estimator_export(converted):
    """`bertfuse verify MODEL --against EXPORT` cuts the export the same way."""
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import verify

    src = ESTIMATOR / "est_squad_example" / "model"
    path, _ = converted(src, "est_squad_example")
    report = verify(path, str(src), ConvertOptions(), device="cpu", kernels="ort")
    assert report.parity.ok, report.parity.to_json()
    assert any(n.startswith("cut after ParseExampleV2") for n in report.notes), report.notes
    assert sorted(o.name for o in report.parity.outputs if "invariance" not in o.name) == \
        ["end_logits", "start_logits"]
