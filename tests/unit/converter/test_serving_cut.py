"""Serving-signature surgery (converter/serving_cut.py) on small real TF graphs: each parse
form is cut after its parse op, and the cut graph, fed the features as int32, computes what
the serving graph computes from the serialized tf.Example protos."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bertfuse.converter.serving_cut import cut  # noqa: E402
from bertfuse.errors import BertfuseError  # noqa: E402

v1 = tf.compat.v1
SEQ = 4
IDS = np.array([[5, 6, 7, 8], [9, 3, 0, 0]], np.int32)
MASK = (IDS > 0).astype(np.int32)


def _example(**features) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={
        k: tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(v).tolist()))
        if np.asarray(v).dtype != object else
        tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.item()]))
        for k, v in features.items()})).SerializeToString()


def _model(ids, mask):
    """Stands in for the model: reads ids and mask as the graph gives them (int64)."""
    x = tf.cast(ids, tf.float32) * 2.0 + tf.cast(mask, tf.float32)
    return tf.identity(tf.reduce_sum(x, axis=1), name="score")


def _graph(build):
    """(graph_def, {input: tensor}, {output: tensor}) of a serving graph on string examples."""
    with tf.Graph().as_default() as g:
        examples = v1.placeholder(tf.string, [None], name="examples")
        outputs = build(examples)
    return g.as_graph_def(), {"examples": "examples:0"}, {k: t.name for k, t in outputs.items()}


def _copy(graph_def):
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    return out


def _run(graph_def, feeds: dict, fetch: str):
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph_def, name="")
        with v1.Session(graph=g) as sess:
            return sess.run(fetch, feeds)


SPEC = {"input_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "input_mask": tf.io.FixedLenFeature([SEQ], tf.int64),
        "label_ids": tf.io.FixedLenFeature([], tf.int64)}
SERIALIZED = np.array([_example(input_ids=IDS[b], input_mask=MASK[b], label_ids=b)
                       for b in range(2)], dtype=object)


def _parse_v2(examples):
    f = tf.io.parse_example(examples, SPEC)  # ParseExampleV2
    return {"score": _model(f["input_ids"], f["input_mask"])}


def _parse_v1(examples):
    keys = sorted(SPEC)  # TF1's ParseExample: one scalar key input per feature
    out = tf.raw_ops.ParseExample(
        serialized=examples, names=tf.constant([], tf.string), sparse_keys=[],
        dense_keys=[tf.constant(k) for k in keys],
        dense_defaults=[tf.constant([], tf.int64) for _ in keys], sparse_types=[],
        dense_shapes=[SPEC[k].shape for k in keys])
    f = dict(zip(keys, out.dense_values))
    return {"score": _model(f["input_ids"], f["input_mask"])}


@pytest.mark.parametrize("build,op", [(_parse_v2, "ParseExampleV2"), (_parse_v1, "ParseExample")])
def test_parse_example_cut_to_int32_inputs(build, op):
    graph_def, inputs, outputs = _graph(build)
    want = _run(graph_def, {"examples:0": SERIALIZED}, outputs["score"])
    c = cut(graph_def, inputs, outputs, {})
    assert sorted(c.inputs) == ["input_ids", "input_mask"]  # the string input and label gone
    nodes = {n.name: n for n in c.graph_def.node}
    assert not any(n.op == op or n.name == "examples" for n in c.graph_def.node)
    for name in c.inputs:
        assert nodes[name].op == "Placeholder" and nodes[name].attr["dtype"].type == \
            tf.int32.as_datatype_enum
        assert [d.size for d in nodes[name].attr["shape"].shape.dim] == [-1, SEQ]
    got = _run(c.graph_def, {"input_ids:0": IDS, "input_mask:0": MASK}, outputs["score"])
    np.testing.assert_array_equal(got, want)
    notes = " | ".join(c.notes)
    assert "label_ids" in notes and f"cut after {op}" in notes and "input examples" in notes


def _single_v2(one):
    """TF2's tf.io.parse_single_example: ParseExampleV2 on a scalar."""
    return tf.io.parse_single_example(one, {k: SPEC[k] for k in ("input_ids", "input_mask")})


def _single_v1(one):
    """TF1's op, ParseSingleExample: keys as attributes."""
    keys = ["input_ids", "input_mask"]
    out = tf.raw_ops.ParseSingleExample(
        serialized=one, dense_defaults=[tf.constant([], tf.int64)] * 2, num_sparse=0,
        sparse_keys=[], dense_keys=keys, sparse_types=[], dense_shapes=[[SEQ]] * 2)
    return dict(zip(keys, out.dense_values))


@pytest.mark.parametrize("parse", [_single_v2, _single_v1])
def test_parse_single_example_cut_after_its_batch_dimension(parse):
    def build(examples):
        f = parse(tf.reshape(examples, []))  # a server sending one example a call
        return {"score": _model(tf.expand_dims(f["input_ids"], 0),
                                tf.expand_dims(f["input_mask"], 0))}

    graph_def, inputs, outputs = _graph(build)
    want = [_run(graph_def, {"examples:0": SERIALIZED[b:b + 1]}, outputs["score"])
            for b in range(2)]  # one example a call
    c = cut(graph_def, inputs, outputs, {})
    assert sorted(c.inputs) == ["input_ids", "input_mask"]
    # batched now: both rows at once give what the serving graph gives one at a time
    got = _run(c.graph_def, {"input_ids:0": IDS, "input_mask:0": MASK}, outputs["score"])
    np.testing.assert_array_equal(got, np.concatenate(want))


def test_parse_single_example_without_a_batch_is_refused():
    def build(examples):
        f = tf.io.parse_single_example(tf.reshape(examples, []), {"input_ids": SPEC["input_ids"]})
        return {"score": tf.identity(tf.reduce_sum(f["input_ids"]), name="score")}

    graph_def, inputs, outputs = _graph(build)
    with pytest.raises(BertfuseError, match="no batch dimension.*--inputs ROLE=TENSOR"):
        cut(graph_def, inputs, outputs, {})


def test_decode_raw_feature_cut_after_the_decoding():
    def build(examples):
        f = tf.io.parse_example(examples, {"ids": tf.io.FixedLenFeature([], tf.string)})
        ids = tf.reshape(tf.io.decode_raw(f["ids"], tf.int32), [-1, SEQ])
        return {"score": _model(ids, tf.cast(ids > 0, tf.int32))}

    graph_def, inputs, outputs = _graph(build)
    raw = np.array([_example(ids=np.array(IDS[b].tobytes(), dtype=object)) for b in range(2)],
                   dtype=object)
    want = _run(graph_def, {"examples:0": raw}, outputs["score"])
    c = cut(graph_def, inputs, outputs, {})
    assert list(c.inputs) == ["ids"]
    assert any("DecodeRaw" in n for n in c.notes), c.notes
    got = _run(c.graph_def, {"ids:0": IDS}, outputs["score"])
    np.testing.assert_array_equal(got, want)


def test_inputs_may_name_a_graph_tensor_to_cut_at():
    """A parse the recognition does not know (ids as text): --inputs ROLE=TENSOR cuts there."""
    def build(examples):
        words = tf.strings.split(examples, " ").to_tensor("0")
        ids = tf.strings.to_number(words, tf.int64, name="ids_from_text")
        return {"score": _model(ids, tf.cast(ids > 0, tf.int64))}

    graph_def, inputs, outputs = _graph(build)
    text = np.array([" ".join(map(str, row)) for row in IDS], dtype=object)
    want = _run(graph_def, {"examples:0": text}, outputs["score"])
    c = cut(graph_def, inputs, outputs, {"input_ids": "ids_from_text:0"})
    assert c.override == {"input_ids": "input_ids"} and list(c.inputs) == ["input_ids"]
    got = _run(c.graph_def, {"input_ids:0": IDS}, outputs["score"])
    np.testing.assert_array_equal(got, want)
    assert any("--inputs input_ids=ids_from_text:0" in n for n in c.notes), c.notes


def test_passed_through_output_left_out_unless_asked():
    def build(examples):
        f = tf.io.parse_example(examples, {**SPEC, "unique_ids": tf.io.FixedLenFeature(
            [], tf.int64)})
        return {"unique_ids": tf.identity(f["unique_ids"]),
                "score": _model(f["input_ids"], f["input_mask"])}

    graph_def, inputs, outputs = _graph(build)
    c = cut(_copy(graph_def), inputs, dict(outputs), {}, select=lambda m: m)
    assert list(c.outputs) == ["score"] and "unique_ids" not in c.inputs
    assert any(n.startswith("output unique_ids passes the input unique_ids") for n in c.notes)
    kept = cut(graph_def, inputs, dict(outputs), {})  # --outputs named it: kept
    assert sorted(kept.outputs) == ["score", "unique_ids"] and "unique_ids" in kept.inputs


def test_unread_placeholder_removed_and_others_untouched():
    with tf.Graph().as_default() as g:
        ids = v1.placeholder(tf.int32, [None, SEQ], name="input_ids")
        v1.placeholder(tf.int32, [None], name="label_ids")
        tf.identity(tf.reduce_sum(ids, axis=1), name="score")
    graph_def = g.as_graph_def()
    inputs = {"input_ids": "input_ids:0", "label_ids": "label_ids:0"}
    c = cut(_copy(graph_def), inputs, {"score": "score:0"}, {})
    assert list(c.inputs) == ["input_ids"]
    assert "label_ids" not in {n.name for n in c.graph_def.node}
    assert c.notes == ["input label_ids is read by no kept output: left out"]
    same = cut(graph_def, {"input_ids": "input_ids:0"}, {"score": "score:0"}, {})
    assert same.graph_def is graph_def and same.notes == []  # nothing to change: untouched


def test_inputs_naming_a_string_tensor_is_refused():
    graph_def, inputs, outputs = _graph(_parse_v2)
    with pytest.raises(BertfuseError, match="a string tensor cannot be fed as int32 ids"):
        cut(graph_def, inputs, outputs, {"input_ids": "ParseExample/ParseExampleV2/dense_keys:0"})
