"""XLA-compiled serving functions (`tf.function(jit_compile=True)`) through `convert`.

Two real library models are wrapped the way a user serves them with XLA and saved with
tf.saved_model.save: keras-hub's BertBackbone (the kh_bert fixture's .keras, called inside
the function) and Model Garden's BertEncoder (the mg_bert_encoder fixture's SavedModel,
restored and called inside it). Freezing the saved signature as it is fails (the function is
never inlined, so its body still reads the variables: "expected type resource"), or leaves a
StatefulPartitionedCall that tf2onnx cannot map; bertfuse loads a copy without the XLA marks
(converter/xla.py), and the written model is fused and reproduces the library's own outputs
(the fixture's reference.npz) within fp32's 1e-4.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from support import paths

ort = pytest.importorskip("onnxruntime")
tf = pytest.importorskip("tensorflow")

THIRDPARTY = paths.FIXTURES / "thirdparty"


def _save_jit(fn, specs: dict, keep: object, path) -> str:
    module = tf.Module()
    module.keep = keep  # the model's variables, tracked for the SavedModel
    serve = tf.function(fn, jit_compile=True)
    module.serve = serve
    tf.saved_model.save(module, str(path), signatures={
        "serving_default": serve.get_concrete_function(**specs)})
    return str(path)


def _keras_hub(path) -> str:
    import keras

    model = keras.saving.load_model(str(THIRDPARTY / "kh_bert" / "model.keras"), compile=False)
    spec = tf.TensorSpec([None, None], tf.int32)

    def serve(token_ids, padding_mask, segment_ids):
        out = model({"token_ids": token_ids, "padding_mask": padding_mask,
                     "segment_ids": segment_ids}, training=False)
        return {"sequence_output": out["sequence_output"], "pooled_output": out["pooled_output"]}

    return _save_jit(serve, {k: spec for k in ("token_ids", "padding_mask", "segment_ids")},
                     model, path)


def _model_garden(path) -> str:
    restored = tf.saved_model.load(str(THIRDPARTY / "mg_bert_encoder" / "model"))
    sig = restored.signatures["serving_default"]
    return _save_jit(lambda **kw: sig(**kw), sig.structured_input_signature[1], restored, path)


MODELS = {"kh_bert": _keras_hub, "mg_bert_encoder": _model_garden}


def _frozen_ops(path: str) -> Counter:
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    loaded = tf.saved_model.load(path)  # held: its variables live as long as it does
    frozen = convert_variables_to_constants_v2(loaded.signatures["serving_default"])
    return Counter(n.op for n in frozen.graph.as_graph_def().node)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_xla_signature_converts_fused_and_exact(name, tmp_path):
    from bertfuse.converter.xla import freezable
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    src = MODELS[name](tmp_path / "jit")
    # As saved, freezing cannot inline the XLA function (what convert used to hit).
    if name == "mg_bert_encoder":
        with pytest.raises(ValueError, match="expected type resource"):
            _frozen_ops(src)
    else:
        assert _frozen_ops(src)["StatefulPartitionedCall"] == 1
    notes: list[str] = []
    with freezable(src, notes) as unmarked:
        assert unmarked != src and notes == ["XLA-compiled functions (jit_compile=True) "
                                             "inlined to freeze the graph"]
        ops = _frozen_ops(unmarked)
        assert not ops["StatefulPartitionedCall"] and not ops["PartitionedCall"], ops

    out = tmp_path / "model.onnx"
    report = convert(src, str(out), ConvertOptions())
    assert report.written and report.parity.ok, report.parity.to_json()
    assert report.notes == notes
    model = onnx.load(out)
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Attention"] == 2 and ops["SkipLayerNormalization"] == 4, ops
    assert ops["EmbedLayerNormalization"] == 1, ops
    assert sum(ops[g] for g in ("FastGelu", "BiasGelu", "Gelu")) == 2, ops
    assert ops["Softmax"] == 0 and ops["LayerNormalization"] == 0, ops

    meta = json.loads((THIRDPARTY / name / "meta.json").read_text())
    ref = np.load(THIRDPARTY / name / "reference.npz")
    feeds = {r: ref[f"in/{meta['inputs'][r]}"].astype(np.int32)
             for r in ("input_ids", "input_mask", "segment_ids")}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for key in ("sequence_output", "pooled_output"):
        assert np.abs(got[key] - ref[f"out/{key}"]).max() <= 1e-4, key


def test_unmarked_savedmodel_left_alone(tmp_path):
    from bertfuse.converter.xla import freezable

    notes: list[str] = []
    src = str(THIRDPARTY / "mg_bert_encoder" / "model")
    with freezable(src, notes) as path:
        assert path == src and notes == []
