"""Bad input never gives a traceback: one line on stderr, exit 2, no output file left behind.

Every case runs through `bertfuse.cli.main([...])`. The TF-made inputs (a tiny checkpoint, a
toy frozen graph, a toy SavedModel) are built once per session in one directory.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bertfuse.cli import main
from bertfuse.errors import BertfuseError


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def bad(tmp_path_factory) -> dict[str, Path]:
    """All the inputs, good and bad, in one session directory."""
    import tensorflow as tf

    from bertfuse.converter.example import write_example

    root = tmp_path_factory.mktemp("bad_input")
    p: dict[str, Path] = {"root": root}
    p["tiny"] = write_example("tiny", str(root / "tiny"), seed=0)
    cfg = json.loads((p["tiny"] / "bert_config.json").read_text())

    def ckpt_copy(name: str, config_text: str | None) -> Path:
        d = root / name
        shutil.copytree(p["tiny"], d)
        if config_text is not None:
            (d / "bert_config.json").write_text(config_text)
        return d

    p["not_json"] = ckpt_copy("not_json", "{not json, 'vocab_size': 1000")
    p["hidden_mismatch"] = ckpt_copy("hidden_mismatch", json.dumps({**cfg, "hidden_size": 256}))
    p["no_vocab"] = ckpt_copy("no_vocab", json.dumps(
        {k: v for k, v in cfg.items() if k != "vocab_size"}))
    p["zero_heads"] = ckpt_copy("zero_heads", json.dumps({**cfg, "num_attention_heads": 0}))
    p["truncated"] = ckpt_copy("truncated", None)
    data = next(p["truncated"].glob("bert_model.ckpt.data-*"))
    data.write_bytes(data.read_bytes()[:1000])

    p["empty_dir"] = root / "empty_dir"
    p["empty_dir"].mkdir()

    p["corrupt"] = root / "corrupt"
    p["corrupt"].mkdir()
    (p["corrupt"] / "bert_config.json").write_text(json.dumps(cfg))
    (p["corrupt"] / "bert_model.ckpt.index").write_bytes(b"\x00garbage\xff" * 50)
    (p["corrupt"] / "bert_model.ckpt.data-00000-of-00001").write_bytes(b"\x01junk" * 100)

    p["unrelated"] = root / "unrelated"
    p["unrelated"].mkdir()
    (p["unrelated"] / "bert_config.json").write_text(json.dumps(cfg))
    tf.raw_ops.SaveV2(prefix=str(p["unrelated"] / "model.ckpt"),
                      tensor_names=["dense/kernel", "global_step"], shape_and_slices=["", ""],
                      tensors=[np.ones((3, 4), np.float32), np.array(7, np.int64)])

    p["garbage_pb"] = root / "garbage.pb"
    p["garbage_pb"].write_bytes(b"\x89PNG not a graph \xff\xfe\x00" * 20)

    # A frozen graph whose inputs are called alpha/beta: no role can be recognised.
    g = tf.Graph()
    with g.as_default():
        ids = tf.compat.v1.placeholder(tf.int32, [None, None], name="alpha")
        mask = tf.compat.v1.placeholder(tf.int32, [None, None], name="beta")
        table = tf.constant(np.random.default_rng(0).standard_normal((100, 64))
                            .astype(np.float32), name="word_table")
        x = tf.gather(table, ids) * tf.expand_dims(tf.cast(mask, tf.float32), -1)
        tf.identity(x, name="sequence_output")
    p["odd_pb"] = root / "odd_names.pb"
    p["odd_pb"].write_bytes(g.as_graph_def().SerializeToString())
    # Names that tell nothing, and one input the graph cannot place either: a float tensor
    # added to the output is no lookup and no mask.
    g = tf.Graph()
    with g.as_default():
        ids = tf.compat.v1.placeholder(tf.int32, [None, None], name="alpha")
        extra = tf.compat.v1.placeholder(tf.float32, [None, None, 64], name="gamma")
        table = tf.constant(np.random.default_rng(0).standard_normal((100, 64))
                            .astype(np.float32), name="word_table")
        tf.identity(tf.gather(table, ids) + extra, name="sequence_output")
    p["odd2_pb"] = root / "odd_untold.pb"
    p["odd2_pb"].write_bytes(g.as_graph_def().SerializeToString())

    class Toy(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(np.random.default_rng(1).standard_normal((100, 16))
                                     .astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids"),
                                      tf.TensorSpec([None, None], tf.int32, name="input_mask")])
        def serve(self, input_ids, input_mask):
            x = tf.gather(self.table, input_ids)
            return {"sequence_output": x * tf.expand_dims(tf.cast(input_mask, tf.float32), -1)}

    toy = Toy()
    p["savedmodel"] = root / "savedmodel"
    tf.saved_model.save(toy, str(p["savedmodel"]), signatures={"serving_default": toy.serve})

    p["not_onnx"] = root / "not_onnx.onnx"
    p["not_onnx"].write_text("hello, I am not an ONNX model\n")
    p["empty_onnx"] = root / "empty.onnx"
    p["empty_onnx"].write_bytes(b"")

    # A small valid ONNX model (no TF needed) for optimize.
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "input_ids"], ["g"]),
         helper.make_node("Relu", ["g"], ["sequence_output"])], "toy",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "seq"])],
        [helper.make_tensor_value_info("sequence_output", TensorProto.FLOAT,
                                       ["batch", "seq", 8])],
        [numpy_helper.from_array(np.random.default_rng(2).random((50, 8), np.float32), "emb")])
    p["toy_onnx"] = root / "toy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(p["toy_onnx"]))
    return p


@pytest.fixture
def out_dir(tmp_path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


def _expect_failure(capsys, argv: list[str], code: int = 2) -> str:
    """Runs the CLI; asserts exit code and exactly one clean stderr line; returns that line."""
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert rc == code, f"exit {rc}, stderr:\n{cap.err}"
    assert len(lines) == 1, f"expected one stderr line, got:\n{cap.err}"
    assert "Traceback" not in cap.err + cap.out
    return lines[0]


def _assert_nothing_written(out_dir: Path, keep: tuple[str, ...] = ()) -> None:
    """No output and no temp file (.NAME.*.tmp, .NAME.*.tmp.data) in the output directory."""
    left = sorted(f.name for f in out_dir.iterdir() if f.name not in keep)
    assert left == [], f"left behind in {out_dir}: {left}"


# --------------------------------------------------------------------------- bad input

# (id, argv builder(paths, out), substring the message must hold)
BAD_CONVERT = [
    ("missing_source", lambda p, o: ["convert", p["root"] / "no_such_model", "-o", o],
     "no such file"),
    ("missing_frozen", lambda p, o: ["convert", p["root"] / "no_such.pb", "-o", o],
     "no such file"),
    ("empty_dir", lambda p, o: ["convert", p["empty_dir"], "-o", o],
     "neither a SavedModel nor a checkpoint"),
    ("corrupt_checkpoint", lambda p, o: ["convert", p["corrupt"], "-o", o],
     "cannot read checkpoint"),
    ("truncated_checkpoint_data", lambda p, o: ["convert", p["truncated"], "-o", o],
     "cannot read variable values"),
    ("config_not_json", lambda p, o: ["convert", p["not_json"], "-o", o], "not valid JSON"),
    ("config_hidden_size_mismatch", lambda p, o: ["convert", p["hidden_mismatch"], "-o", o],
     "does not match checkpoint"),
    ("config_missing_vocab_size", lambda p, o: ["convert", p["no_vocab"], "-o", o],
     "vocab_size"),
    ("config_zero_heads", lambda p, o: ["convert", p["zero_heads"], "-o", o],
     "num_attention_heads"),
    ("config_is_a_directory", lambda p, o: ["convert", p["tiny"], "--config", p["empty_dir"],
                                            "-o", o], "cannot read bert_config.json"),
    ("checkpoint_without_bert_variables", lambda p, o: ["convert", p["unrelated"], "-o", o],
     "checkpoint layout not recognised"),
    ("frozen_garbage_bytes", lambda p, o: ["convert", p["garbage_pb"], "-o", o],
     "not a TensorFlow GraphDef"),
    ("frozen_unrecognised_inputs", lambda p, o: ["convert", p["odd2_pb"], "-o", o],
     "--inputs"),
    ("frozen_override_names_missing_input",
     lambda p, o: ["convert", p["odd_pb"], "--inputs", "input_ids=[/bold]gamma", "-o", o],
     "no input"),
    ("format_frozen_on_directory",
     lambda p, o: ["convert", p["tiny"], "--format", "frozen", "-o", o], "is a directory"),
    ("format_savedmodel_on_checkpoint",
     lambda p, o: ["convert", p["tiny"], "--format", "savedmodel", "-o", o],
     "cannot load SavedModel"),
    ("savedmodel_unknown_signature",
     lambda p, o: ["convert", p["savedmodel"], "--signature", "nosuch", "-o", o],
     "no signature 'nosuch'"),
    ("inputs_bad_role",
     lambda p, o: ["convert", p["odd_pb"], "--inputs", "token=alpha", "-o", o], "ROLE=NAME"),
    ("inputs_no_equals", lambda p, o: ["convert", p["tiny"], "--inputs", "input_ids", "-o", o],
     "ROLE=NAME"),
    ("opset_19", lambda p, o: ["convert", p["tiny"], "--opset", "19", "-o", o], "--opset 19"),
    ("seq_1", lambda p, o: ["convert", p["tiny"], "--seq", "1", "-o", o], "--seq"),
    ("batch_not_int", lambda p, o: ["convert", p["tiny"], "--batch", "four", "-o", o],
     "--batch"),
    ("missing_output_option", lambda p, o: ["convert", p["tiny"]], "-o/--output"),
    ("unknown_format", lambda p, o: ["convert", p["tiny"], "--format", "torch", "-o", o],
     "--format"),
]


@pytest.mark.parametrize("argv_fn, needle", [c[1:] for c in BAD_CONVERT],
                         ids=[c[0] for c in BAD_CONVERT])
def test_convert_bad_input(bad, out_dir, capsys, argv_fn, needle):
    out = out_dir / "model.onnx"
    line = _expect_failure(capsys, argv_fn(bad, out))
    assert needle in line
    _assert_nothing_written(out_dir)


def test_output_directory_missing(bad, out_dir, capsys):
    out = out_dir / "no_such_dir" / "model.onnx"
    line = _expect_failure(capsys, ["convert", bad["tiny"], "-o", out])
    assert "does not exist" in line
    _assert_nothing_written(out_dir)


def test_output_parent_is_a_file(bad, out_dir, capsys):
    (out_dir / "afile").write_text("x")
    line = _expect_failure(capsys, ["convert", bad["tiny"], "-o", out_dir / "afile" / "m.onnx"])
    assert "not a directory" in line
    _assert_nothing_written(out_dir, keep=("afile",))


def test_output_path_is_a_directory(bad, out_dir, capsys):
    target = out_dir / "adir"
    target.mkdir()
    line = _expect_failure(capsys, ["convert", bad["tiny"], "-o", target])
    assert "is a directory" in line
    _assert_nothing_written(out_dir, keep=("adir",))
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("which", ["not_onnx", "garbage_pb", "empty_onnx", "empty_dir"])
def test_optimize_not_onnx(bad, out_dir, capsys, which):
    line = _expect_failure(capsys, ["optimize", bad[which], "-o", out_dir / "m.onnx"])
    assert str(bad[which]) in line
    _assert_nothing_written(out_dir)


def test_optimize_missing_model(bad, out_dir, capsys):
    line = _expect_failure(capsys, ["optimize", bad["root"] / "nope.onnx",
                                    "-o", out_dir / "m.onnx"])
    assert "no such file" in line
    _assert_nothing_written(out_dir)


def test_verify_missing_model(bad, capsys):
    line = _expect_failure(capsys, ["verify", bad["root"] / "nope.onnx", "--against", bad["tiny"]])
    assert "no such file" in line


def test_verify_model_of_another_source(bad, capsys):
    # toy.onnx has another vocabulary and outputs: a mismatch, not an internal error.
    line = _expect_failure(capsys, ["verify", bad["toy_onnx"], "--against", bad["tiny"],
                                    "--seed", "0"])
    assert str(bad["toy_onnx"]) in line


def test_verify_missing_against(bad, capsys):
    line = _expect_failure(capsys, ["verify", bad["toy_onnx"]])
    assert "--against" in line


def test_example_unknown_config(out_dir, capsys):
    line = _expect_failure(capsys, ["example", "--config", "nosuch", "-o", out_dir / "ex"])
    assert "nosuch" in line
    _assert_nothing_written(out_dir)


def test_example_bad_hidden_act(out_dir, capsys):
    line = _expect_failure(capsys, ["example", "--config", "tiny", "--hidden-act", "swish",
                                    "-o", out_dir / "ex"])
    assert "hidden_act" in line
    _assert_nothing_written(out_dir)


def test_example_never_replaces_a_foreign_directory(out_dir, capsys):
    precious = out_dir / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    line = _expect_failure(capsys, ["example", "--config", "tiny", "-o", precious])
    assert "not replacing" in line
    assert (precious / "notes.txt").read_text() == "keep me"
    _assert_nothing_written(out_dir, keep=("precious",))


def test_example_output_is_a_file(out_dir, capsys):
    (out_dir / "afile").write_text("x")
    line = _expect_failure(capsys, ["example", "--config", "tiny", "-o", out_dir / "afile"])
    assert "not a directory" in line
    _assert_nothing_written(out_dir, keep=("afile",))


def test_unknown_subcommand(capsys):
    _expect_failure(capsys, ["frobnicate"])


def test_json_mode_error_is_one_stderr_line_and_the_report_says_it(bad, out_dir, capsys):
    rc = main(["convert", str(bad["root"] / "nope"), "-o", str(out_dir / "m.onnx"), "--json"])
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1
    report = json.loads(cap.out)  # CI still gets a report: ok false, the same line
    assert report["ok"] is False and report["error"]["exit_code"] == 2
    assert lines[0].endswith(report["error"]["message"]) and "nope" in lines[0]


# --------------------------------------------------------------------------- --debug


def test_debug_lets_the_exception_through(bad, out_dir):
    with pytest.raises(BertfuseError, match="no such file"):
        main(["convert", str(bad["root"] / "nope"), "-o", str(out_dir / "m.onnx"), "--debug"])
    _assert_nothing_written(out_dir)


def test_internal_error_is_one_line_exit_3(bad, out_dir, capsys, monkeypatch):
    import bertfuse.pipeline.stages  # where convert's stages find load_source

    def boom(*a, **k):
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(bertfuse.pipeline.stages, "load_source", boom)
    line = _expect_failure(capsys, ["convert", bad["tiny"], "-o", out_dir / "m.onnx"], code=3)
    assert "internal error" in line and "--debug" in line
    with pytest.raises(RuntimeError, match="something broke"):
        main(["convert", str(bad["tiny"]), "-o", str(out_dir / "m.onnx"), "--debug"])
    _assert_nothing_written(out_dir)


def test_failed_write_leaves_no_temp_file(bad, out_dir, capsys, monkeypatch):
    import bertfuse.io.model

    def full_disk(src, dst):
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr(bertfuse.io.model.os, "replace", full_disk)
    line = _expect_failure(capsys, ["optimize", bad["toy_onnx"], "-o", out_dir / "m.onnx"])
    assert "No space left" in line
    _assert_nothing_written(out_dir)


# --------------------------------------------------------------------------- good paths


def test_optimize_toy_model_succeeds(bad, out_dir, capsys):
    assert main(["optimize", str(bad["toy_onnx"]), "-o", str(out_dir / "m.onnx")]) == 0
    assert (out_dir / "m.onnx").is_file()
    assert sorted(f.name for f in out_dir.iterdir()) == ["m.onnx"]


def test_frozen_inputs_override_succeeds(bad, out_dir, capsys):
    out = out_dir / "odd.onnx"
    rc = main(["convert", str(bad["odd_pb"]), "--inputs", "input_ids=alpha,input_mask=beta",
               "-o", str(out), "--seed", "0", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    report = json.loads(cap.out)
    assert report["written"] and report["parity"]["ok"]
    assert report["original_names"]["input_ids"] == "alpha"
    assert sorted(f.name for f in out_dir.iterdir()) == ["odd.onnx"]
    # One interface: a source without token types still gets segment_ids (ignored).
    assert [i.name for i in onnx.load(str(out)).graph.input] == ["input_ids", "input_mask",
                                                                 "segment_ids"]


# --------------------------------------------------------------------------- parity gate


@pytest.fixture
def drifting_export(monkeypatch):
    """Corrupts the largest weight after the passes, so the ONNX drifts from TF."""
    from bertfuse.pipeline import stages

    original = stages._passes

    def drift(*args, **kwargs):
        model = original(*args, **kwargs)
        init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
        arr = numpy_helper.to_array(init).astype(np.float32)
        init.CopyFrom(numpy_helper.from_array(arr * 1.5 + 0.1, init.name))
        return model

    monkeypatch.setattr(stages, "_passes", drift)


def test_parity_failure_writes_nothing(bad, out_dir, capsys, drifting_export):
    out = out_dir / "tiny.onnx"
    line = _expect_failure(capsys, ["convert", bad["tiny"], "-o", out, "--seed", "0"], code=1)
    assert str(out) in line and "not written" in line and "--force" in line
    _assert_nothing_written(out_dir)


def test_parity_failure_with_force_writes(bad, out_dir, capsys, drifting_export):
    out = out_dir / "tiny.onnx"
    rc = main(["convert", str(bad["tiny"]), "-o", str(out), "--seed", "0", "--force", "--json"])
    cap = capsys.readouterr()
    assert rc == 1  # written on request, but the drift is still reported as a failure
    report = json.loads(cap.out)
    assert report["written"] and not report["parity"]["ok"]
    assert sorted(f.name for f in out_dir.iterdir()) == ["tiny.onnx"]
    # verify reports the same drift on the written model.
    assert main(["verify", str(out), "--against", str(bad["tiny"]), "--seed", "0"]) == 1


# --------------------------------------------------------------------------- verify's name matching


@pytest.fixture(scope="session")
def tiny_onnx(bad, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_onnx") / "tiny.onnx"
    assert main(["convert", str(bad["tiny"]), "-o", str(out), "--seed", "0", "--json"]) == 0
    return out


def _with_tf_names(src: Path, dst: Path, int64: bool) -> None:
    """The model as a user's own tf2onnx export names it: TF tensor names, maybe int64 ids."""
    from bertfuse.converter.export import rename_values

    model = onnx.load(str(src))
    graph = model.graph
    rename_values(graph, {"input_ids": "input_word_ids:0", "input_mask": "input_mask:0",
                    "segment_ids": "input_type_ids:0", "sequence_output": "sequence_output:0"})
    if int64:
        for inp in graph.input:
            inner = inp.name + "_int32"
            for node in graph.node:
                node.input[:] = [inner if x == inp.name else x for x in node.input]
            graph.node.insert(0, helper.make_node("Cast", [inp.name], [inner],
                                                  to=TensorProto.INT32))
            inp.type.tensor_type.elem_type = TensorProto.INT64
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))


@pytest.mark.parametrize("int64", [False, True], ids=["int32", "int64"])
def test_verify_matches_tf_names_of_own_export(bad, tiny_onnx, tmp_path, capsys, int64):
    renamed = tmp_path / "own.onnx"
    _with_tf_names(tiny_onnx, renamed, int64)
    capsys.readouterr()
    rc = main(["verify", str(renamed), "--against", str(bad["tiny"]), "--seed", "0", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    parity = json.loads(cap.out)["parity"]
    names = {o["name"] for o in parity["outputs"]}
    assert parity["ok"] and names == {"sequence_output", "pooled_output",
                                      "mask invariance (padded ids changed)",
                                      "mask invariance (padded segment ids changed)"}


# --------------------------------------------------------------------------- a real process


def test_real_process_stderr_is_one_line(bad, out_dir):
    """TF/ORT log from C++ straight to fd 2, past capsys: check one run as a real process."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "bertfuse.cli", "convert", str(bad["corrupt"]),
                           "-o", str(out_dir / "m.onnx")], capture_output=True, text=True,
                          env=env, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "cannot read checkpoint" in lines[0], proc.stderr
    assert proc.stdout == ""
    _assert_nothing_written(out_dir)


def test_checkpoint_refuses_inputs_and_outputs_overrides(bad, out_dir, capsys):
    line = _expect_failure(capsys, ["convert", bad["tiny"], "-o", out_dir / "m.onnx",
                                    "--inputs", "input_ids=ids"])
    assert "do not apply to a checkpoint" in line
    _assert_nothing_written(out_dir)


@pytest.mark.parametrize("flags", [["--strict"], ["--packed"], ["--precision", "fp16"]],
                         ids=["strict", "packed", "fp16"])
def test_no_fuse_refuses_options_that_need_fusion(bad, out_dir, capsys, flags):
    """They act on the fused graph: with --no-fuse they would silently do nothing."""
    line = _expect_failure(capsys, ["convert", bad["tiny"], "-o", out_dir / "m.onnx",
                                    "--no-fuse", *flags])
    assert "cannot be combined with --no-fuse" in line and flags[0] in line
    _assert_nothing_written(out_dir)
