"""converter/text_cut.py on small graphs made of TensorFlow's own string and ragged ops (a
tokenizer's shape without tensorflow-text): strings -> ragged ids -> dense -> "encoder"."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bertfuse.converter.text_cut import cut_at_dense_ids  # noqa: E402
from bertfuse.errors import BertfuseError  # noqa: E402

TABLE = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
TEXTS = ["the cat sat", "a dog", "one two three four five"]


def _frozen(body):
    """(graph_def, text placeholder, output tensors) of body(text) traced and frozen."""
    fn = tf.function(body, input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    graph = fn.get_concrete_function().graph
    return graph.as_graph_def(), [t.name for t in graph.outputs]


def _ids(text):
    words = tf.strings.split(text)
    return tf.strings.to_hash_bucket_fast(words, 50).to_tensor(shape=[None, 8])  # int64


def _run(graph_def, feeds: dict, fetches: list[str]):
    with tf.Graph().as_default() as g:
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=g) as sess:
            return sess.run(fetches, feeds)


def test_cut_at_the_dense_ids_gives_the_same_outputs():
    def body(text):
        ids = tf.cast(_ids(text), tf.int32)
        mask = tf.cast(ids > 0, tf.float32)
        return tf.reduce_sum(tf.gather(TABLE, ids), -1) * mask + tf.cast(tf.shape(ids)[1],
                                                                        tf.float32)

    graph_def, outputs = _frozen(body)
    cut = cut_at_dense_ids(graph_def, ["text"], outputs, "m", names=["input_word_ids"])
    assert list(cut.replaced) == ["input_word_ids"] and cut.seq == 8
    # The int64 -> int32 Cast is the only reader: the cut moves past it.
    assert _node(graph_def, cut.replaced["input_word_ids"]).op == "Cast"
    ops = {n.op for n in cut.graph_def.node}
    assert not ops & {"StringSplit", "StringSplitV2", "StringToHashBucketFast",
                      "RaggedTensorToTensor"}, ops
    ph = _node(cut.graph_def, "input_word_ids:0")
    assert ph.op == "Placeholder" and ph.attr["dtype"].type == tf.int32.as_datatype_enum
    full, ids = _run(graph_def, {"text:0": TEXTS}, [outputs[0], cut.replaced["input_word_ids"]])
    (again,) = _run(cut.graph_def, {"input_word_ids:0": ids}, [outputs[0]])
    np.testing.assert_array_equal(full, again)


def test_an_int64_cut_is_fed_as_int32_and_cast_inside():
    graph_def, outputs = _frozen(lambda text: tf.gather(TABLE, _ids(text)))
    cut = cut_at_dense_ids(graph_def, ["text"], outputs, "m")
    assert list(cut.replaced) == ["cut_0"]
    cast = _node(cut.graph_def, "cut_0/to_int64:0")
    assert cast.op == "Cast" and list(cast.input) == ["cut_0"]


def test_outputs_that_still_read_the_text_are_refused():
    def body(text):  # the batch size read off the strings themselves, below the ids
        return tf.gather(TABLE, _ids(text)) * tf.cast(tf.size(text), tf.float32)

    graph_def, outputs = _frozen(body)
    with pytest.raises(BertfuseError, match=r"hands the encoder text:0 \(string"):
        cut_at_dense_ids(graph_def, ["text"], outputs, "m")


def test_no_dense_ids_is_refused():
    graph_def, outputs = _frozen(lambda text: tf.strings.length(text))
    with pytest.raises(BertfuseError, match="never becomes dense token ids"):
        cut_at_dense_ids(graph_def, ["text"], outputs, "m")


def test_a_float_handed_to_the_encoder_is_refused():
    def body(text):
        lengths = tf.strings.length(tf.strings.split(text))
        return tf.cast(lengths, tf.float32).to_tensor() * 2.0

    graph_def, outputs = _frozen(body)
    with pytest.raises(BertfuseError, match=r"not \[batch, seq\] integer ids"):
        cut_at_dense_ids(graph_def, ["text"], outputs, "m")


def _node(graph_def, tensor: str):
    return next(n for n in graph_def.node if n.name == tensor.split(":")[0])
