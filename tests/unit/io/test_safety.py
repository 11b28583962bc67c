"""Nothing the user owns is destroyed, and bad input exits 2 with one line.

* An output path that is an input (also through `..`, a symlink or a hard link), lies inside a
  source directory, or is not a regular file is refused before anything runs.
* `--in-place` rewrites through a temp file beside the input.
* `example` replaces only an empty directory or an earlier example (its marker file).
* SIGTERM, SIGHUP and SIGINT at the export, check and write stages: real processes, paused at
  the stage by the BERTFUSE_TEST_PAUSE hook; no file is left in the target directory or in the
  process's private TMPDIR, and the sources are byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from bertfuse.cli import main
from bertfuse.converter.example import MARKER

# onnxruntime (native code) keeps a 51-byte session id file `.ses` in TMPDIR; not ours.
ORT_TMP_FILES = {".ses"}


# --------------------------------------------------------------------------- helpers


def _digest(path: Path) -> dict[str, str]:
    """Every file under path (or the file itself) -> sha256: 'byte-identical' made checkable."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _one_line_failure(capsys, argv: list, code: int = 2) -> str:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert rc == code, f"exit {rc}, stderr:\n{cap.err}"
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    return lines[0]


@pytest.fixture(scope="session")
def models(ckpt_erf, convert_cached) -> dict[str, Path]:
    """The tiny checkpoint, its fused model and its raw (unfused) model."""
    fused = convert_cached(ckpt_erf)
    raw = convert_cached(ckpt_erf, "--no-fuse", "--no-verify")
    assert fused.exit_code == 0 and raw.exit_code == 0
    return {"ckpt": Path(ckpt_erf.path), "fused": Path(fused.onnx_path),
            "raw": Path(raw.onnx_path)}


@pytest.fixture
def work(tmp_path, models) -> dict[str, Path]:
    """Private copies: a checkpoint dir, a fused and a raw model, in tmp_path."""
    shutil.copytree(models["ckpt"], tmp_path / "ckpt")
    for name in ("fused", "raw"):
        shutil.copy(models[name], tmp_path / f"{name}.onnx")
    return {"root": tmp_path, "ckpt": tmp_path / "ckpt", "fused": tmp_path / "fused.onnx",
            "raw": tmp_path / "raw.onnx"}


# --------------------------------------------------------------------------- refused outputs

# (id, argv(work) -> list, needle in the error line)
REFUSED = [
    ("ckpt_data_shard", lambda w: ["convert", w["ckpt"], "-o",
                                   w["ckpt"] / "bert_model.ckpt.data-00000-of-00001"],
     "inside the source directory"),
    ("ckpt_index", lambda w: ["convert", w["ckpt"], "-o", w["ckpt"] / "bert_model.ckpt.index"],
     "inside the source directory"),
    ("ckpt_config", lambda w: ["convert", w["ckpt"], "-o", w["ckpt"] / "bert_config.json"],
     "inside the source directory"),
    ("new_file_in_ckpt_dir", lambda w: ["convert", w["ckpt"], "-o", w["ckpt"] / "m.onnx"],
     "inside the source directory"),
    ("dotdot_into_ckpt", lambda w: ["convert", w["ckpt"], "-o",
                                    w["root"] / "x" / ".." / "ckpt" / "bert_config.json"],
     "inside the source directory"),
    ("prefix_form_config", lambda w: ["convert", w["ckpt"] / "bert_model.ckpt", "-o",
                                      w["ckpt"] / "bert_config.json"], "is the input"),
    ("prefix_form_index", lambda w: ["convert", w["ckpt"] / "bert_model.ckpt", "-o",
                                     w["ckpt"] / "bert_model.ckpt.index"], "is the input"),
    ("config_option_file", lambda w: ["convert", w["ckpt"], "--config", w["root"] / "cfg.json",
                                      "-o", w["root"] / "cfg.json"], "is the input"),
    ("hard_link_to_shard", lambda w: ["convert", w["ckpt"], "-o", w["root"] / "hard.index"],
     "hard link"),
    ("symlink_to_config", lambda w: ["convert", w["ckpt"], "-o", w["root"] / "link.json"],
     "symbolic link"),
    ("strip_onto_input", lambda w: ["strip-weights", w["fused"], "-o", w["fused"]],
     "is the input"),
    ("strip_onto_hard_link", lambda w: ["strip-weights", w["fused"], "-o",
                                        w["root"] / "fused_hard.onnx"], "is the input"),
    ("optimize_onto_input", lambda w: ["optimize", w["raw"], "-o",
                                       w["root"] / "." / "raw.onnx"], "is the input"),
    ("summarize_onto_input", lambda w: ["summarize", w["fused"], "-o", w["fused"]],
     "is the input"),
    ("draw_onto_before", lambda w: ["draw", w["fused"], "--before", w["root"] / "raw.dot",
                                    "-o", w["root"] / "raw.dot"], "is the input"),
    ("char_device", lambda w: ["strip-weights", w["fused"], "-o", "/dev/null"],
     "not a regular file"),
    ("symlink_to_char_device", lambda w: ["strip-weights", w["fused"], "-o",
                                          w["root"] / "null.onnx"], "symbolic link"),
]


@pytest.mark.parametrize("argv_fn, needle", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_output_that_could_destroy_is_refused(work, capsys, argv_fn, needle):
    root = work["root"]
    (root / "x").mkdir()
    (root / "cfg.json").write_text((work["ckpt"] / "bert_config.json").read_text())
    (root / "raw.dot").write_text("digraph g {}\n")
    os.link(work["ckpt"] / "bert_model.ckpt.index", root / "hard.index")
    os.link(work["fused"], root / "fused_hard.onnx")
    (root / "link.json").symlink_to(work["ckpt"] / "bert_config.json")
    (root / "null.onnx").symlink_to("/dev/null")
    before = _digest(root)
    line = _one_line_failure(capsys, argv_fn(work))
    assert needle in line, line
    assert _digest(root) == before  # nothing changed, nothing added
    assert (root / "null.onnx").is_symlink() and Path("/dev/null").is_char_device()


def test_output_path_is_printed_literally(work, capsys):
    """Rich markup in a path ([/x]) used to raise after the write: exit 3."""
    odd = work["root"] / "d["
    odd.mkdir()
    out = odd / "x].onnx"
    assert main(["strip-weights", str(work["fused"]), "-o", str(out)]) == 0
    assert f"-> {out}" in capsys.readouterr().out
    out2 = odd / "s].summary.json"
    assert main(["summarize", str(work["fused"]), "-o", str(out2)]) == 0
    assert str(out2) in capsys.readouterr().out
    assert sorted(p.name for p in odd.iterdir()) == ["s].summary.json", "x].onnx"]


# --------------------------------------------------------------------------- --in-place


def test_strip_in_place_through_a_symlink(work, capsys):
    link = work["root"] / "link.onnx"
    link.symlink_to(work["fused"])
    os.chmod(work["fused"], 0o600)
    assert main(["strip-weights", str(link), "--in-place"]) == 0
    assert link.is_symlink()  # the link stays; its target was rewritten
    model = onnx.load(str(work["fused"]))
    assert any(p.key == "bertfuse_stripped" for p in model.metadata_props)
    assert (work["fused"].stat().st_mode & 0o777) == 0o600  # mode kept
    assert sorted(p.name for p in work["root"].iterdir()) == ["ckpt", "fused.onnx",
                                                               "link.onnx", "raw.onnx"]


def test_optimize_in_place(work, capsys):
    assert main(["optimize", str(work["raw"]), "--in-place", "--json"]) == 0
    ops = {n.op_type for n in onnx.load(str(work["raw"])).graph.node}
    assert "Attention" in ops and "SkipLayerNormalization" in ops
    assert sorted(p.name for p in work["root"].iterdir()) == ["ckpt", "fused.onnx", "raw.onnx"]


@pytest.mark.parametrize("argv", [["strip-weights", "M"], ["optimize", "M"],
                                  ["strip-weights", "M", "-o", "x.onnx", "--in-place"]],
                         ids=["strip_no_target", "optimize_no_target", "both"])
def test_in_place_or_output_exactly_one(work, capsys, argv):
    line = _one_line_failure(capsys, [work["fused"] if a == "M" else a for a in argv])
    assert "--in-place" in line


# --------------------------------------------------------------------------- example


def test_example_never_replaces_a_real_checkpoint(work, capsys, monkeypatch):
    ckpt = work["ckpt"]
    (ckpt / MARKER).unlink()  # a user's checkpoint: same file names, no marker
    before = _digest(ckpt)
    line = _one_line_failure(capsys, ["example", "--config", "tiny", "-o", ckpt])
    assert "did not write" in line
    monkeypatch.chdir(ckpt)  # `-o .` inside it: the reported case that deleted everything
    line = _one_line_failure(capsys, ["example", "--config", "tiny", "-o", "."])
    assert "current directory" in line
    assert _digest(ckpt) == before
    assert sorted(p.name for p in work["root"].iterdir()) == ["ckpt", "fused.onnx", "raw.onnx"]


def test_example_replaces_an_earlier_example_and_fills_an_empty_dir(work, capsys):
    ckpt = work["ckpt"]  # written by `bertfuse example` (it holds the marker)
    old = (ckpt / "bert_model.ckpt.data-00000-of-00001").read_bytes()
    assert main(["example", "--config", "tiny", "--seed", "5", "-o", str(ckpt)]) == 0
    assert (ckpt / MARKER).is_file()
    assert (ckpt / "bert_model.ckpt.data-00000-of-00001").read_bytes() != old
    empty = work["root"] / "empty"
    empty.mkdir()
    assert main(["example", "--config", "tiny", "-o", str(empty)]) == 0
    assert (empty / "bert_config.json").is_file()
    assert sorted(p.name for p in work["root"].iterdir()) == ["ckpt", "empty", "fused.onnx",
                                                               "raw.onnx"]


def test_example_negative_seed(tmp_path, capsys):
    line = _one_line_failure(capsys, ["example", "--config", "tiny", "--seed", "-1",
                                      "-o", tmp_path / "ex"])
    assert "--seed" in line
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- source consistency


@pytest.fixture(scope="session")
def ckpt_3_layers(tmp_path_factory) -> Path:
    from bertfuse.converter.config import EXAMPLE_CONFIGS, BertConfig
    from bertfuse.converter.example import write_example

    cfg = BertConfig(**{**EXAMPLE_CONFIGS["tiny"].__dict__})
    cfg.num_hidden_layers = 3
    return write_example(cfg, str(tmp_path_factory.mktemp("three") / "ckpt"), seed=1)


@pytest.mark.parametrize("layers, needle", [
    (2, "the checkpoint has bert/encoder/layer_2/"),
    (4, "needs bert/encoder/layer_3/"),
], ids=["config_fewer_layers", "config_more_layers"])
def test_config_layer_count_must_match_checkpoint(ckpt_3_layers, tmp_path, capsys, layers,
                                                  needle):
    cfg = json.loads((ckpt_3_layers / "bert_config.json").read_text())
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, "num_hidden_layers": layers}))
    line = _one_line_failure(capsys, ["convert", ckpt_3_layers, "--config",
                                      tmp_path / "cfg.json", "-o", tmp_path / "m.onnx"])
    assert "config does not match checkpoint" in line and needle in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.json"]


def test_config_nested_too_deeply(models, tmp_path, capsys):
    (tmp_path / "cfg.json").write_text("[" * 100_000 + "]" * 100_000)
    line = _one_line_failure(capsys, ["convert", models["ckpt"], "--config",
                                      tmp_path / "cfg.json", "-o", tmp_path / "m.onnx"])
    assert "nested too deeply" in line


# --------------------------------------------------------------------------- bad input, not bugs


def _with_meta(src: Path, dst: Path, key: str, value: str) -> Path:
    model = onnx.load(str(src))
    props = [p for p in model.metadata_props if p.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(dst))
    return dst


@pytest.mark.parametrize("record", [
    "not json", "[" * 100_000 + "]" * 100_000, json.dumps({"a": 1}),
    json.dumps([{"name": "nosuch", "shape": [3], "dtype": "float32"}]),
    json.dumps([{"name": "embeddings_word", "shape": [-3], "dtype": "float32"}]),
    json.dumps([{"name": "embeddings_word", "shape": [1000, 128], "dtype": "banana"}]),
    "wrong_shape",
], ids=["not_json", "nested", "not_list", "unknown_name", "negative_dim", "bad_dtype",
        "wrong_shape"])
def test_fill_with_damaged_record(work, capsys, record):
    skel = work["root"] / "skel.onnx"
    assert main(["strip-weights", str(work["fused"]), "-o", str(skel)]) == 0
    if record == "wrong_shape":  # well-formed, but one shape edited: only the digest sees it
        meta = json.loads({p.key: p.value for p in onnx.load(str(skel)).metadata_props}
                          ["bertfuse_stripped"])
        meta[0]["shape"] = [7, 7]
        record = json.dumps(meta)
    _with_meta(skel, skel, "bertfuse_stripped", record)
    line = _one_line_failure(capsys, ["strip-weights", skel, "--fill", "1",
                                      "-o", work["root"] / "filled.onnx"])
    assert "bertfuse_stripped metadata is damaged" in line
    assert not (work["root"] / "filled.onnx").exists()


@pytest.mark.parametrize("edit", ["encoder", "ops", "drop_producer", "init_entry", "nested"])
def test_diff_with_edited_summary(work, capsys, edit):
    summ = work["root"] / "golden.json"
    assert main(["summarize", str(work["fused"]), "-o", str(summ)]) == 0
    data = json.loads(summ.read_text())
    if edit == "encoder":
        data["encoder"] = "x"
    elif edit == "ops":
        data["ops"] = [1, 2]
    elif edit == "drop_producer":
        del data["producer"]
    elif edit == "init_entry":
        data["initializers"]["a"] = 5
    summ.write_text(json.dumps(data) if edit != "nested" else
                    '{"format": "%s", "x": %s}' % (data["format"], "[" * 99_999 + "]" * 99_999))
    capsys.readouterr()
    line = _one_line_failure(capsys, ["diff", summ, work["fused"]])
    assert str(summ) in line and ("was it edited" in line or "nested too deeply" in line)


def test_diff_numeric_with_edited_bert_config(work, capsys):
    edited = _with_meta(work["fused"], work["root"] / "edited.onnx", "bert_config",
                        "[" * 100_000 + "]" * 100_000)
    assert main(["diff", str(work["fused"]), str(edited), "--numeric", "--json"]) == 0


@pytest.mark.parametrize("argv", [
    ["verify", "FUSED", "--against", "CKPT", "--batch", "100000000"],
    ["convert", "CKPT", "-o", "OUT", "--batch", "4096", "--seq", "512"],
    ["diff", "FUSED", "FUSED", "--numeric", "--batch", "100000000"],
], ids=["verify", "convert", "diff_numeric"])
def test_verification_size_is_capped(work, capsys, argv):
    names = {"FUSED": work["fused"], "CKPT": work["ckpt"], "OUT": work["root"] / "m.onnx"}
    line = _one_line_failure(capsys, [names.get(a, a) for a in argv])
    assert "tokens" in line and "at most" in line
    assert not (work["root"] / "m.onnx").exists()


def test_verify_source_with_another_hidden_size(models, tmp_path, capsys):
    """Another hidden size: a clear refusal (2) or a parity failure (1), never a crash (3)."""
    from bertfuse.converter.config import EXAMPLE_CONFIGS, BertConfig
    from bertfuse.converter.example import write_example

    cfg = BertConfig(**{**EXAMPLE_CONFIGS["tiny"].__dict__})
    cfg.hidden_size = 64
    other = write_example(cfg, str(tmp_path / "h64"), seed=0)
    rc = main(["verify", str(models["fused"]), "--against", str(other), "--seed", "0"])
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert rc in (1, 2), cap.err
    assert len(lines) <= 1 and "Traceback" not in cap.err, cap.err
    assert "[4, 32, 64]" in cap.err + cap.out  # TF's shape is named


def test_tf_graph_execution_error_is_one_clear_line(tmp_path, capsys):
    """The source graph fails in TF on the verification inputs (ids past a 10-row table):
    TF's first line, 'Graph execution error:', said nothing."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        ids = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_ids")
        mask = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_mask")
        table = tf.constant(np.ones((10, 16), np.float32), name="word_table")
        x = tf.gather(table, ids * 1000) * tf.expand_dims(tf.cast(mask, tf.float32), -1)
        tf.identity(x, name="sequence_output")
    pb = tmp_path / "small.pb"
    pb.write_bytes(g.as_graph_def().SerializeToString())
    line = _one_line_failure(capsys, ["convert", pb, "-o", tmp_path / "m.onnx", "--seed", "0"])
    assert "TensorFlow failed running the source model" in line
    assert "is not in [0, 10)" in line and "GatherV2" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.pb"]


def test_bench_without_gpu(tmp_path):
    from bertfuse.bench.models import no_cuda as _no_cuda

    if _no_cuda() is None:
        pytest.skip("a CUDA GPU is here")
    tmpdir, skeletons = tmp_path / "tmp", tmp_path / "skel"
    tmpdir.mkdir()
    skeletons.mkdir()
    from bertfuse.bench.workloads import PADDED_WORKLOADS

    for config in {c for c, _, _ in PADDED_WORKLOADS.values()}:  # found; never read without a GPU
        (skeletons / f"{config}_raw.skel.onnx").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "bertfuse", "bench", "--skeletons",
                           str(skeletons)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmpdir)})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "CUDA" in lines[0], proc.stderr
    assert {p.name for p in tmpdir.iterdir()} <= ORT_TMP_FILES


# --------------------------------------------------------------------------- signals


def _case_argv(case: str, w: dict[str, Path], out: Path) -> list[str]:
    return {
        "convert": ["convert", w["ckpt"], "-o", out, "--seed", "0", "--batch", "2", "--seq", "8"],
        "optimize": ["optimize", w["raw"], "-o", out],
        "strip": ["strip-weights", w["fused"], "-o", out],
        "strip_in_place": ["strip-weights", w["fused"], "--in-place"],
        "example": ["example", "--config", "tiny", "--seed", "3", "-o", w["ckpt"]],
    }[case]


# (command, stage it is paused at, signal): every stage, every signal, in few processes.
SIGNAL_CASES = [
    ("convert", "tf2onnx export", signal.SIGHUP),
    ("convert", "check-tmp", signal.SIGTERM),
    ("convert", "save-tmp", signal.SIGTERM),
    ("optimize", "check-tmp", signal.SIGINT),
    ("strip", "save-tmp", signal.SIGHUP),
    ("strip_in_place", "save-tmp", signal.SIGINT),
    ("strip_in_place", "save-tmp", signal.SIGTERM),
    ("example", "example-tmp", signal.SIGTERM),
]


# stage -> (where its temporary lives, how its name starts)
TEMP_AT = {"save-tmp": ("target", "."), "check-tmp": ("target", ".bertfuse-"),
           "example-tmp": ("target", ".ckpt.")}


@pytest.mark.parametrize("case, stage, signo", SIGNAL_CASES,
                         ids=[f"{c}-{s.split()[-1]}-{g.name}" for c, s, g in SIGNAL_CASES])
def test_signal_leaves_nothing_behind(work, case, stage, signo):
    root = work["root"]
    tmpdir, flags = root / "tmp", root / "flags"
    tmpdir.mkdir()
    flags.mkdir()
    out = root / "out.onnx"
    before = _digest(root)
    flag = flags / "paused"
    env = {**os.environ, "TMPDIR": str(tmpdir), "BERTFUSE_TEST_PAUSE": f"{stage}:{flag}",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "bertfuse",
                             *map(str, _case_argv(case, work, out))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), f"never reached {stage!r}: {proc.communicate(timeout=60)}"
        if stage in TEMP_AT:  # the stage's temporary is there when the signal comes
            where, prefix = TEMP_AT[stage]
            assert any(p.name.startswith(prefix) for p in (tmpdir if where == "tmp" else
                                                          root).iterdir()), stage
        proc.send_signal(signo)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    expected = "interrupted" if signo == signal.SIGINT else "terminated"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 128 + signo, err
    assert lines and lines[-1] == f"bertfuse: {expected}" and "Traceback" not in err, err
    assert {p.name for p in tmpdir.iterdir()} <= ORT_TMP_FILES, list(tmpdir.iterdir())
    for p in [flag, *tmpdir.iterdir()]:
        p.unlink()
    assert _digest(root) == before  # sources intact, no output, no temp file or directory
    assert sorted(p.name for p in root.iterdir()) == ["ckpt", "flags", "fused.onnx", "raw.onnx",
                                                      "tmp"]


def test_external_data_write_is_atomic_pair(work, capsys, monkeypatch):
    """Past protobuf's 2 GB (here: a lowered threshold) the model and its .data file are
    written in a private directory beside the target and renamed into place; a .data name
    that is not a regular file is refused."""
    import bertfuse.io.model as modelio

    plain = work["root"] / "plain.onnx"
    assert main(["optimize", str(work["raw"]), "-o", str(plain)]) == 0
    monkeypatch.setattr(modelio, "EXTERNAL_DATA_THRESHOLD", 1000)
    out = work["root"] / "ext.onnx"
    assert main(["optimize", str(work["raw"]), "-o", str(out)]) == 0
    assert (work["root"] / "ext.onnx.data").is_file()
    a, b = onnx.load(str(plain)), onnx.load(str(out))  # b reads its weights from ext.onnx.data
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in a.graph.initializer}
    assert {t.name for t in b.graph.initializer} == set(weights)
    for t in b.graph.initializer:
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(t), weights[t.name])
    (work["root"] / "ext2.onnx.data").symlink_to("/dev/null")
    line = _one_line_failure(capsys, ["optimize", work["raw"], "-o", work["root"] / "ext2.onnx"])
    assert "ext2.onnx.data" in line and "symbolic link" in line
    assert sorted(p.name for p in work["root"].iterdir()) == [
        "ckpt", "ext.onnx", "ext.onnx.data", "ext2.onnx.data", "fused.onnx", "plain.onnx",
        "raw.onnx"]


def test_a_signal_waits_for_a_held_block_and_temps_go():
    """A signal inside held() (temp creation, rename pairs) is raised when the block ends;
    the registered temporaries are gone when handle_signals() ends."""
    from bertfuse.io import safety

    done, made = [], []
    with pytest.raises(safety.Terminated) as info:
        with safety.handle_signals():
            with safety.temp_dir(prefix="bertfuse-test-") as tmp:
                made.append(tmp)
                with safety.held():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.05)
                    done.append("held block finished")
                done.append("after")  # never reached
    assert info.value.signo == signal.SIGTERM
    assert done == ["held block finished"] and not made[0].exists()
    assert signal.getsignal(signal.SIGTERM) is not safety._on_signal  # handlers restored


def test_a_worker_threads_held_block_does_not_keep_the_signal_from_the_main_thread():
    """A writer thread inside held() while SIGTERM arrives: the main thread, where Python runs
    the handler, raises at once (deferred, it would be raised later in the worker, and the main
    thread would go on waiting); the worker's block still ends whole."""
    import threading

    from bertfuse.io import safety

    inside, release, worker_done = threading.Event(), threading.Event(), []

    def worker() -> None:
        with safety.held():
            inside.set()
            release.wait(10)
            worker_done.append("held block finished")

    t = threading.Thread(target=worker)
    start = time.monotonic()
    with pytest.raises(safety.Terminated):
        with safety.handle_signals():
            t.start()
            inside.wait(10)
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the handler runs between these sleeps
                time.sleep(0.01)
    release.set()
    t.join(10)
    assert time.monotonic() - start < 5
    assert worker_done == ["held block finished"]


@pytest.mark.parametrize("api", ["convert", "optimize"])
def test_python_api_refuses_an_output_that_is_an_input(work, api):
    """The guarantee is the pipeline's, not only the CLI's."""
    from bertfuse.errors import BertfuseError
    from bertfuse.pipeline import stages
    from bertfuse.pipeline.options import ConvertOptions

    root = work["root"]
    before = _digest(root)
    with pytest.raises(BertfuseError, match="source directory|is the input"):
        if api == "convert":
            stages.convert(str(work["ckpt"]), str(work["ckpt"] / "bert_config.json"),
                           ConvertOptions())
        else:
            stages.optimize(str(work["raw"]), str(work["raw"]))
    assert _digest(root) == before
