"""A TF model from someone else runs its own graph when bertfuse converts or verifies it: ops
that reach outside the model (files, Python code) are refused in one line, before TensorFlow
runs any of it, unless --trust-model is given.

The models are tiny (a 1000 x 8 embedding, one signature), built here with real TensorFlow;
each side effect points into the test's own temporary directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertfuse.cli import main

ROLES = ("input_ids", "input_mask", "segment_ids")


def _savedmodel(out: Path, effect) -> Path:
    """A SavedModel whose serving signature computes a lookup and runs `effect(x) -> x`."""
    import tensorflow as tf

    spec = [tf.TensorSpec([None, None], tf.int32, name=n) for n in ROLES]

    class Stranger(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(np.random.default_rng(0).standard_normal((1000, 8))
                                     .astype(np.float32))

        @tf.function(input_signature=spec)
        def serve(self, input_ids, input_mask, segment_ids):
            x = tf.gather(self.table, input_ids) * tf.cast(input_mask, tf.float32)[..., None]
            x = x + tf.cast(segment_ids, tf.float32)[..., None]
            return {"sequence_output": effect(x)}

    module = Stranger()
    tf.saved_model.save(module, str(out), signatures={"serving_default": module.serve})
    return out


@pytest.fixture(scope="module")
def strangers(tmp_path_factory) -> dict[str, Path]:
    import tensorflow as tf

    root = tmp_path_factory.mktemp("stranger_tf")
    p: dict[str, Path] = {"root": root, "secret": root / "secret.txt"}
    p["secret"].write_text("not the model's\n")
    target = str(root / "written_by_model.txt")

    def write(x):
        tf.io.write_file(target, tf.strings.as_string(tf.reduce_sum(x)))
        return x

    def read(x):
        return x + tf.cast(tf.strings.length(tf.io.read_file(str(p["secret"]))), tf.float32)

    def match(x):
        return x + tf.cast(tf.size(tf.io.matching_files(str(root / "*"))), tf.float32)

    def python(x):
        y = tf.py_function(lambda t: t * 1.0, [x], tf.float32)
        y.set_shape(x.shape)
        return y

    for name, effect in (("write", write), ("read", read), ("match", match),
                         ("python", python)):
        p[name] = _savedmodel(root / name, effect)

    # A frozen graph (what freeze_graph writes) that writes a file beside its lookup.
    g = tf.Graph()
    with g.as_default():
        ids, mask, segs = (tf.compat.v1.placeholder(tf.int32, [None, None], name=n)
                           for n in ROLES)
        table = tf.constant(np.random.default_rng(1).standard_normal((1000, 8))
                            .astype(np.float32), name="word_table")
        x = tf.gather(table, ids) * tf.expand_dims(tf.cast(mask, tf.float32), -1)
        x = x + tf.expand_dims(tf.cast(segs, tf.float32), -1)
        wrote = tf.io.write_file(str(root / "written_by_frozen.txt"), tf.strings.as_string(
            tf.reduce_sum(x)))
        with tf.control_dependencies([wrote]):
            tf.identity(x, name="sequence_output")
    p["frozen_write"] = root / "frozen_write.pb"
    p["frozen_write"].write_bytes(g.as_graph_def().SerializeToString())
    return p


def _run(capsys, argv: list) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _refused(capsys, argv: list, op: str) -> str:
    """Exit 2, one stderr line naming the op and --trust-model, no traceback."""
    rc, out, err = _run(capsys, argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, f"exit {rc}, stderr:\n{err}"
    assert len(lines) == 1, f"expected one stderr line, got:\n{err}"
    assert "Traceback" not in out + err
    assert op in lines[0] and "--trust-model" in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("name, op", [("write", "WriteFile"), ("read", "ReadFile"),
                                      ("match", "MatchingFiles"), ("python", "EagerPyFunc"),
                                      ("frozen_write", "WriteFile")])
def test_convert_refuses_ops_that_reach_outside(strangers, tmp_path, capsys, name, op):
    out = tmp_path / "m.onnx"
    line = _refused(capsys, ["convert", strangers[name], "-o", out], op)
    assert str(strangers[name]) in line
    assert not out.exists()
    assert not (strangers["root"] / "written_by_model.txt").exists()
    assert not (strangers["root"] / "written_by_frozen.txt").exists()


def test_a_text_format_savedmodel_is_read_too(strangers, tmp_path, capsys):
    """TensorFlow loads saved_model.pbtxt where there is no saved_model.pb: so does the scan."""
    import shutil

    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    folder = tmp_path / "as_text"
    shutil.copytree(strangers["write"], folder)
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((folder / "saved_model.pb").read_bytes())
    (folder / "saved_model.pbtxt").write_text(text_format.MessageToString(proto))
    (folder / "saved_model.pb").unlink()
    (folder / "fingerprint.pb").unlink(missing_ok=True)
    _refused(capsys, ["convert", folder, "--format", "savedmodel", "-o", tmp_path / "m.onnx"],
             "WriteFile")
    assert not (strangers["root"] / "written_by_model.txt").exists()


def test_trust_model_runs_the_write_and_says_so(strangers, tmp_path, capsys):
    """With --trust-model the graph runs as written: the parity run writes the file (tf2onnx
    drops the op: the ONNX model has no trace of it), and the report's notes name the op."""
    written = strangers["root"] / "written_by_model.txt"
    out = tmp_path / "m.onnx"
    try:
        rc, stdout, err = _run(capsys, ["convert", strangers["write"], "-o", out,
                                        "--trust-model", "--json"])
        assert rc == 0, err
        report = json.loads(stdout)
        assert report["options"]["trust_model"] is True
        assert any("--trust-model" in n and "WriteFile" in n for n in report["notes"]), \
            report["notes"]
        assert written.exists()  # TensorFlow ran the model's own write
        import onnx

        assert "WriteFile" not in {n.op_type for n in onnx.load(str(out)).graph.node}

        written.unlink()
        rc, _, err = _run(capsys, ["verify", out, "--against", strangers["write"],
                                   "--trust-model"])
        assert rc == 0, err
        assert written.exists()
    finally:
        written.unlink(missing_ok=True)


@pytest.mark.parametrize("name, op", [("read", "ReadFile"), ("python", "EagerPyFunc")])
def test_trust_model_then_tf2onnx_has_no_such_op(strangers, tmp_path, capsys, name, op):
    """Trusted, the model loads and freezes; tf2onnx has no ONNX form of a read or of Python
    code, and says so in one line (nothing written)."""
    out = tmp_path / "m.onnx"
    rc, _, err = _run(capsys, ["convert", strangers[name], "-o", out, "--trust-model"])
    lines = [ln for ln in err.splitlines() if ln.strip() and "bertfuse:" in ln]
    assert rc == 2 and f"could not map TF op '{op}'" in lines[-1], err
    assert not out.exists()


def test_verify_against_refuses_before_running(strangers, tmp_path, capsys):
    """verify --against loads and runs the source too: refused before the parity run."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(2).standard_normal((1000, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["sequence_output"])], "lookup",
        [helper.make_tensor_value_info(r, TensorProto.INT32, ["batch", "seq"]) for r in ROLES],
        [helper.make_tensor_value_info("sequence_output", TensorProto.FLOAT,
                                       ["batch", "seq", 8])],
        [numpy_helper.from_array(table, "table")])
    model = tmp_path / "lookup.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    for name in ("write", "frozen_write"):
        _refused(capsys, ["verify", model, "--against", strangers[name]], "WriteFile")
    assert not (strangers["root"] / "written_by_model.txt").exists()
    assert not (strangers["root"] / "written_by_frozen.txt").exists()


def test_api_takes_trust_model(strangers, tmp_path):
    import bertfuse
    from bertfuse.errors import BertfuseError

    with pytest.raises(BertfuseError, match="MatchingFiles"):
        bertfuse.convert(strangers["match"], verify=False)
    _, report = bertfuse.convert(strangers["match"], verify=False, trust_model=True)
    assert any("MatchingFiles" in n for n in report.notes)


def test_keras_lambda_refusal_is_one_whole_line(tmp_path, capsys):
    """A .keras Lambda holding Python bytecode: one complete line (was Keras' message cut at
    200 characters, mid-sentence); --trust-model loads it outside Keras' safe mode."""
    import keras

    ids = keras.Input((None,), dtype="int32", name="input_ids")
    x = keras.layers.Embedding(1000, 8)(ids)
    x = keras.layers.Lambda(lambda t: t * 2.0, name="double")(x)
    path = tmp_path / "lambda.keras"
    keras.Model({"input_ids": ids}, {"sequence_output": x}).save(str(path))
    line = _refused(capsys, ["convert", path, "-o", tmp_path / "m.onnx"], "Lambda")
    assert "'double'" in line and line.rstrip().endswith("if you trust its author"), line
    rc, _, err = _run(capsys, ["convert", path, "-o", tmp_path / "m.onnx", "--trust-model"])
    assert rc == 0, err
