"""Outputs named by meaning, end to end: a keras-hub BERT with a ranker's sigmoid score and a
sentence embedder's L2-normalised mean pooling beside its encoder output, exported with
Keras' own `model.export()`. The score and the embedding keep their source names (case
included), the encoder's output under another key is sequence_output; the written model
says each output's role and source name, and matches the Keras model itself."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tensorflow")
keras_hub = pytest.importorskip("keras_hub")


@pytest.fixture(scope="module")
def heads_model(tmp_path_factory):
    import keras
    from support.builders.tf_models import SEED, _randomize, keras_hub_backbone

    _, backbone = keras_hub_backbone()
    inputs = {"token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
              "padding_mask": keras.Input((None,), dtype="int32", name="padding_mask"),
              "segment_ids": keras.Input((None,), dtype="int32", name="segment_ids")}
    enc = backbone(inputs)
    seq = enc["sequence_output"]
    mask = keras.ops.expand_dims(keras.ops.cast(inputs["padding_mask"], "float32"), -1)
    mean = keras.ops.sum(seq * mask, axis=1) / keras.ops.maximum(keras.ops.sum(mask, axis=1), 1.0)
    outputs = {"Score": keras.layers.Dense(1, activation="sigmoid", name="score")(
                   enc["pooled_output"]),
               "sentence_embedding": keras.ops.normalize(mean, axis=-1, order=2),
               "Token-Vectors": seq}
    model = keras.Model(inputs, outputs)
    _randomize(model.weights, SEED + 2)
    path = tmp_path_factory.mktemp("heads") / "model"
    model.export(str(path), verbose=False)
    return model, str(path)


def test_outputs_keep_their_meaning(heads_model, tmp_path):
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    model, path = heads_model
    out = tmp_path / "heads.onnx"
    report = convert(path, str(out), ConvertOptions())
    assert report.written and report.parity.ok, report.parity.to_json()
    rows = {o["name"]: o for o in report.to_json()["outputs"]}
    assert rows == {"Score": {"name": "Score", "role": None, "source": "Score"},
                    "sentence_embedding": {"name": "sentence_embedding", "role": None,
                                           "source": "sentence_embedding"},
                    "sequence_output": {"name": "sequence_output", "role": "sequence_output",
                                        "source": "Token-Vectors"}}
    onnx_model = onnx.load(str(out))
    meta = {p.key: p.value for p in onnx_model.metadata_props}
    assert json.loads(meta["output_roles"]) == report.to_json()["outputs"]
    ops = [n.op_type for n in onnx_model.graph.node]
    assert ops.count("Attention") == 2 and ops.count("SkipLayerNormalization") == 4

    rng = np.random.default_rng(1)
    ids = rng.integers(1, 100, (3, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    segs = (np.arange(12)[None] >= 6).astype(np.int32).repeat(3, 0)
    want = model({"token_ids": ids, "padding_mask": mask, "segment_ids": segs}, training=False)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()],
                   sess.run(None, {"input_ids": ids, "input_mask": mask, "segment_ids": segs})))
    for name, source in (("Score", "Score"), ("sentence_embedding", "sentence_embedding"),
                         ("sequence_output", "Token-Vectors")):
        diff = np.abs(got[name] - np.asarray(want[source]))
        assert diff.max() <= 1e-4, (name, diff.max())
