"""The scan for ops that reach outside the model (converter/untrusted.py), on the committed
third-party fixtures and on small graphs built here."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertfuse.converter import untrusted
from tests.support.paths import FIXTURES

SAVEDMODELS = sorted(p.parent for p in FIXTURES.rglob("saved_model.pb"))
FROZEN = sorted(p for p in FIXTURES.rglob("*.pb")
                if p.name not in ("saved_model.pb", "fingerprint.pb", "keras_metadata.pb"))
KERAS = sorted(FIXTURES.rglob("*.keras"))


def test_the_fixtures_are_there():
    assert len(SAVEDMODELS) >= 30 and FROZEN and KERAS


@pytest.mark.parametrize("path", SAVEDMODELS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_savedmodel_passes(path):
    """transformers, keras-hub, Model Garden, TF Hub, Estimator exports (TF1 saver graph),
    tensorflow-text models (vocab tables from their own assets): nothing refused."""
    assert untrusted.scan_savedmodel(path) == []


@pytest.mark.parametrize("path", FROZEN + KERAS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_frozen_graph_and_keras_file_passes(path):
    from tensorflow.core.framework import graph_pb2

    if path.suffix == ".keras":
        assert untrusted.scan_keras(path) == []
        return
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(path.read_bytes())
    assert untrusted.scan_graph(graph) == []


@pytest.mark.parametrize("name", ["estimator/est_cls_raw", "hf_bert", "kh_bert"])
def test_the_saver_graph_alone_may_hold_checkpoint_ops(name):
    """The fixtures do hold SaveV2/RestoreV2/MergeV2Checkpoints: TF's saver graph (TF1 nodes,
    TF2 functions); read as a graph of no SavedModel, they are found."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((FIXTURES / "thirdparty" / name / "model" / "saved_model.pb")
                          .read_bytes())
    found = {f.op for f in untrusted.scan_graph(proto.meta_graphs[0].graph_def)}
    assert {"SaveV2", "RestoreV2", "MergeV2Checkpoints"} <= found


def test_the_table_names_registered_ops():
    from tensorflow.python.framework import op_def_registry

    assert [op for op in sorted(untrusted.OUTSIDE_OPS | untrusted.TEXT_FILE_TABLES)
            if op_def_registry.get(op) is None] == []


def _graph(build):
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        build(tf, x)
    return g.as_graph_def()


def test_print_to_a_file_is_found_print_to_stderr_is_not(tmp_path):
    to_file = _graph(lambda tf, x: tf.print(x, output_stream=f"file://{tmp_path}/log"))
    to_stderr = _graph(lambda tf, x: tf.print(x))
    assert [f.op for f in untrusted.scan_graph(to_file)] == ["PrintV2"]
    assert untrusted.scan_graph(to_stderr) == []


def test_a_table_from_a_path_in_the_graph_is_found(tmp_path):
    """A vocab table initialised from a path written into the graph (not the model's asset)
    reads any file."""
    def build(tf, x):
        tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            str(tmp_path / "vocab.txt"), tf.string, -2, tf.int64, -1), -1)

    (tmp_path / "vocab.txt").write_text("a\nb\n")
    assert [f.op for f in untrusted.scan_graph(_graph(build))] == \
        ["InitializeTableFromTextFileV2"]


def test_an_op_inside_a_called_function_is_named_with_its_function(tmp_path):
    import tensorflow as tf

    @tf.function
    def inner(x):
        tf.io.write_file(str(tmp_path / "out"), tf.strings.as_string(x))
        return x

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def outer(x):
        return inner(x) + 1.0

    graph = outer.get_concrete_function().graph.as_graph_def()
    found = untrusted.scan_graph(graph)
    assert [f.op for f in found] == ["WriteFile"] and found[0].function
    assert not (tmp_path / "out").exists()


def test_an_asset_outside_the_folder_is_found(tmp_path):
    import tensorflow as tf

    class Vocab(tf.Module):
        def __init__(self, path):
            super().__init__()
            self.asset = tf.saved_model.Asset(path)

    (tmp_path / "vocab.txt").write_text("a\n")
    tf.saved_model.save(Vocab(str(tmp_path / "vocab.txt")), str(tmp_path / "sm"))
    assert untrusted.scan_savedmodel(tmp_path / "sm") == []
    from tensorflow.core.protobuf import saved_model_pb2

    pb = tmp_path / "sm" / "saved_model.pb"
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(pb.read_bytes())
    proto.meta_graphs[0].asset_file_def[0].filename = "../../etc/passwd"
    pb.write_bytes(proto.SerializeToString())
    assert [(f.op, f.node) for f in untrusted.scan_savedmodel(tmp_path / "sm")] == \
        [("asset", "../../etc/passwd")]


def test_a_trusted_model_gets_a_note_naming_the_ops():
    found = [untrusted.Finding("WriteFile", "w", "f", "writes files")]
    with pytest.raises(Exception, match=r"WriteFile \(node 'w' in function 'f'\) writes files"):
        untrusted.enforce("m", found, trust=False)
    notes = untrusted.enforce("m", found, trust=True)
    assert len(notes) == 1 and "WriteFile" in notes[0] and "--trust-model" in notes[0]
    assert untrusted.enforce("m", [], trust=False) == []


@pytest.mark.parametrize("name", ["estimator/est_cls_raw", "hf_bert"])
def test_a_restore_from_another_path_is_found(name, tmp_path):
    """The saver graph restores from the path the loader feeds (variables/): rewired to a path
    written into the graph (TF1: the RestoreV2 node; TF2: the restore function's call), its
    RestoreV2 is found."""
    from tensorflow.core.framework import attr_value_pb2, tensor_pb2, types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((FIXTURES / "thirdparty" / name / "model" / "saved_model.pb")
                          .read_bytes())
    graph = proto.meta_graphs[0].graph_def
    const = graph.node.add(name="elsewhere", op="Const")
    const.attr["dtype"].type = types_pb2.DT_STRING
    const.attr["value"].CopyFrom(attr_value_pb2.AttrValue(tensor=tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING, string_val=[b"/elsewhere/model.ckpt"])))
    restore = proto.meta_graphs[0].saver_def.restore_op_name
    rewired = [n for n in graph.node if n.op == "RestoreV2" or n.name == restore
               and n.op == "StatefulPartitionedCall"]
    assert len(rewired) == 1
    rewired[0].input[0] = "elsewhere"
    (tmp_path / "saved_model.pb").write_bytes(proto.SerializeToString())
    assert [f.op for f in untrusted.scan_savedmodel(tmp_path)] == ["RestoreV2"]
