"""Input roles from the graph (bert4keras / keras-bert names, float inputs, positional
signatures), and the BroadcastArgs lowering that bert4keras's masking needs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

tf = pytest.importorskip("tensorflow")
ort = pytest.importorskip("onnxruntime")

VOCAB, HIDDEN = 100, 8


def _savedmodel(path, names=("Input_Token", "Input_Segment", "input_3")):
    """Float32 ids, segments and mask under names that tell nothing (bert4keras's form)."""
    rng = np.random.default_rng(0)

    class Enc(tf.Module):
        def __init__(self):
            super().__init__()
            self.words = tf.Variable(rng.standard_normal((VOCAB, HIDDEN)), dtype=tf.float32)
            self.types = tf.Variable(rng.standard_normal((2, HIDDEN)), dtype=tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name=n)
                                      for n in names])
        def serve(self, a, b, c):
            x = tf.gather(self.words, tf.cast(a, tf.int32)) + \
                tf.gather(self.types, tf.cast(b, tf.int32))
            m = c[..., None]
            pooled = tf.reduce_sum(x * m, axis=1) / tf.reduce_sum(m, axis=1)
            return {"sequence_output": x * m, "pooled_output": pooled}

    enc = Enc()
    tf.saved_model.save(enc, str(path), signatures={"serving_default": enc.serve})
    return str(path)


def test_roles_from_the_graph(tmp_path):
    from bertfuse.converter import load_source

    src = load_source(_savedmodel(tmp_path / "m"), "savedmodel", "serving_default")
    # (TF lower-cases a saved function's placeholders; the report keeps the signature's names)
    roles = {r: t.split(":")[0] for r, t in src.inputs.items()}
    assert roles == {"input_ids": "input_token", "segment_ids": "input_segment",
                     "input_mask": "input_3"}, roles
    assert {r: src.original_names[r] for r in roles} == {
        "input_ids": "Input_Token", "segment_ids": "Input_Segment", "input_mask": "input_3"}
    assert all(d == np.float32 for d in src.input_dtypes.values())


def test_inputs_override_wins_and_takes_keras_names(tmp_path):
    from bertfuse.converter import load_source

    path = _savedmodel(tmp_path / "m")
    # `--inputs` takes the Keras layer's name (Input-Token) for the signature's Input_Token.
    src = load_source(path, "savedmodel", "serving_default",
                      inputs="input_ids=Input-Token,segment_ids=Input-Segment,"
                             "input_mask=input_3")
    assert src.original_names["input_ids"] == "Input_Token"


def test_unknown_roles_are_named(tmp_path):
    from bertfuse.converter import load_source
    from bertfuse.errors import BertfuseError

    class Odd(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name="p"),
                                      tf.TensorSpec([None, None], tf.float32, name="q")])
        def serve(self, p, q):
            return {"sequence_output": (p + q)[..., None]}

    odd = Odd()
    tf.saved_model.save(odd, str(tmp_path / "odd"), signatures={"serving_default": odd.serve})
    with pytest.raises(BertfuseError, match=r"cannot tell the role of inputs p, q .*--inputs"):
        load_source(str(tmp_path / "odd"), "savedmodel", "serving_default")


def test_float_inputs_converted_and_cast(tmp_path):
    """The written model takes int32 input_ids/input_mask/segment_ids and casts them to the
    source's float32; TF and ONNX agree on padded inputs."""
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    out = tmp_path / "m.onnx"
    report = convert(_savedmodel(tmp_path / "m"), str(out), ConvertOptions(fuse=False))
    assert report.written and report.parity.ok, report.parity.to_json()
    model = onnx.load(out)
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == \
        [(r, onnx.TensorProto.INT32) for r in ("input_ids", "input_mask", "segment_ids")]
    assert report.original_names["input_ids"] == "Input_Token"


def test_broadcast_args_lowered():
    """tf.broadcast_to(x, BroadcastArgs(shape(x), shape(y))), as bert4keras masks scores."""
    import tf2onnx

    from bertfuse.converter.handlers import custom_op_handlers

    @tf.function(input_signature=[tf.TensorSpec([None, 1, None], tf.float32, name="x"),
                                  tf.TensorSpec([None, 4, 1], tf.float32, name="y")])
    def f(x, y):
        shape = tf.raw_ops.BroadcastArgs(s0=tf.shape(x), s1=tf.shape(y))
        return tf.identity(tf.broadcast_to(x, shape) * 2.0, name="out")

    graph_def = f.get_concrete_function().graph.as_graph_def()
    assert any(n.op == "BroadcastArgs" for n in graph_def.node)
    model, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=["x:0", "y:0"],
                                              output_names=["out:0"], opset=17,
                                              custom_op_handlers=custom_op_handlers())
    x = np.random.default_rng(0).standard_normal((2, 1, 5)).astype(np.float32)
    y = np.zeros((2, 4, 1), np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"x:0": x, "y:0": y})
    np.testing.assert_array_equal(got, f(x, y).numpy())
