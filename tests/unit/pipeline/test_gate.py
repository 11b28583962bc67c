"""The parity gate cannot be fooled: TF's own oneDNN rewrites, NaN outputs, NaN tolerances,
a model that legitimately reads padded ids, a wrong --inputs mapping; and the TF/ORT native
log lines stay off the user's terminal.

The oneDNN trap: tf.contrib.layers.layer_norm (every frozen Google BERT) reduces over a
positive axis with constant gamma/beta; with oneDNN on, grappler fuses that into
_MklLayerNorm with epsilon 0.001 instead of 1e-12, and TF itself is off by ~0.1-1.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SEED, tiny_config
from onnx import TensorProto, helper

from bertfuse.cli import main
from bertfuse.errors import BertfuseError
from bertfuse.pipeline.options import ConvertOptions
from support.paths import ROOT

TOL = 1e-4


def _env(**extra: str | None) -> dict[str, str]:
    """This environment without the log-level crutch, with `extra` set (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    for key, value in extra.items():
        env.pop(key, None)
        if value is not None:
            env[key] = value
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _cli(*argv: str) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    text = out.getvalue()
    return code, (json.loads(text) if text.strip().startswith("{") else {}), err.getvalue()


def _rows(parity: dict) -> dict[str, dict]:
    return {o["name"]: o for o in parity["outputs"]}


# ------------------------------------------------------------------------------ sources


@pytest.fixture(scope="module")
def contrib_pb(tmp_path_factory) -> Path:
    """A frozen Google BERT (tiny) whose layer norms are tf.contrib.layers.layer_norm's:
    moments over the positive last axis, gamma/beta as Const."""
    import tensorflow as tf

    from bertfuse.converter import modeling

    def contrib_layer_norm(tf, x, prefix, w):
        axis = x.shape.rank - 1  # layer_norm(begin_norm_axis=-1) turns -1 into rank - 1
        mean, variance = tf.nn.moments(x, axes=[axis], keepdims=True)
        return tf.nn.batch_normalization(x, mean, variance, offset=w(f"{prefix}/beta"),
                                         scale=w(f"{prefix}/gamma"), variance_epsilon=1e-12)

    cfg = tiny_config("gelu")
    weights = {k: v for k, v in modeling.random_weights(cfg, SEED).items()
               if k.startswith("bert/") and v.dtype == np.float32}
    graph, original = tf.Graph(), modeling._layer_norm
    modeling._layer_norm = contrib_layer_norm
    try:
        with graph.as_default():
            consts = {k: tf.constant(v, name=k) for k, v in weights.items()}
            ids = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_ids")
            mask = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_mask")
            segs = tf.compat.v1.placeholder(tf.int32, [None, None], name="segment_ids")
            modeling.build_bert_graph(tf, cfg, consts.__getitem__, ids, mask, segs)
    finally:
        modeling._layer_norm = original
    assert {n.op for n in graph.as_graph_def().node} >= {"SquaredDifference", "Rsqrt"}
    path = tmp_path_factory.mktemp("gate") / "contrib_bert.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return path


@pytest.fixture(scope="module")
def neighbour_pb(tmp_path_factory) -> Path:
    """A small encoder whose own outputs read padded ids, as MobileBERT (each token adds its
    next token's embedding) and RoBERTa (positions count the non-pad ids) do; the mask keeps
    padded tokens out of a masked mean that every token receives (attention's role)."""
    import tensorflow as tf

    rng = np.random.default_rng(SEED)
    H, vocab = 32, 100  # the word table is the largest gathered table: the vocab
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int32, [None, None], name="ids")
        mask = tf.compat.v1.placeholder(tf.int32, [None, None], name="attention_mask")
        types = tf.compat.v1.placeholder(tf.int32, [None, None], name="types")
        table = tf.constant(rng.standard_normal((vocab, H)).astype(np.float32))
        type_table = tf.constant(rng.standard_normal((2, H)).astype(np.float32))
        pos_table = tf.constant(rng.standard_normal((64, H)).astype(np.float32))
        e = tf.gather(table, ids)
        nxt = tf.concat([e[:, 1:], tf.zeros_like(e[:, :1])], axis=1)  # the trigram's right half
        not_pad = tf.cast(tf.not_equal(ids, 1), tf.int32)
        positions = tf.cumsum(not_pad, axis=1) * not_pad + 1  # RoBERTa's position ids
        h = e + 0.5 * nxt + tf.gather(pos_table, positions) + tf.gather(type_table, types)
        m = tf.cast(mask, tf.float32)[..., None]
        ctx = tf.reduce_sum(h * m, axis=1, keepdims=True) / tf.reduce_sum(m, axis=1,
                                                                          keepdims=True)
        tf.identity(tf.tanh(h + ctx), name="sequence_output")
    path = tmp_path_factory.mktemp("gate") / "neighbour.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return path


NEIGHBOUR_ROLES = "input_ids=ids,input_mask=attention_mask,segment_ids=types"
NEIGHBOUR_SWAPPED = "input_ids=ids,input_mask=types,segment_ids=attention_mask"


# ------------------------------------------------------------------------------ oneDNN


def test_convert_with_onednn_requested_is_exact_and_quiet(contrib_pb, tmp_path):
    """A real `bertfuse convert` process with TF_ENABLE_ONEDNN_OPTS=1 in its environment:
    the reference is computed with oneDNN's rewrites off (on every CPU), parity holds, and
    nothing reaches stderr."""
    out = tmp_path / "contrib.onnx"
    proc = subprocess.run([sys.executable, "-m", "bertfuse.cli", "convert", str(contrib_pb),
                           "-o", str(out), "--json", "--batch", "5"], capture_output=True,
                          text=True, env=_env(TF_ENABLE_ONEDNN_OPTS="1"), timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout[-2000:]
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [], proc.stderr
    parity = json.loads(proc.stdout)["parity"]
    assert parity["ok"] and parity["seed"] == 0, parity
    assert "oneDNN rewrites off" in parity["reference"], parity["reference"]
    rows = _rows(parity)
    for name in ("sequence_output", "pooled_output"):
        assert rows[name]["max_abs"] <= TOL, rows[name]
    assert out.is_file()


_IN_PROCESS = textwrap.dedent("""
    import json, sys
    import tensorflow  # first, with TF_ENABLE_ONEDNN_OPTS=1: what a notebook has
    from bertfuse.pipeline import stages
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.converter.reference import onednn_on
    report = stages.convert(sys.argv[1], sys.argv[2], ConvertOptions(batch=3))
    print(json.dumps({"onednn_on": onednn_on(), "parity": report.parity.to_json()}))
""")


def test_python_api_after_tf_imported_with_onednn(contrib_pb, tmp_path):
    """TF already imported with oneDNN on: the reference comes from a worker process, and
    its temporary directory is gone afterwards."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "api.onnx"
    proc = subprocess.run([sys.executable, "-c", _IN_PROCESS, str(contrib_pb), str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=_env(TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="3",
                                   TMPDIR=str(tmp)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    parity = result["parity"]
    assert parity["ok"], parity
    assert _rows(parity)["sequence_output"]["max_abs"] <= TOL
    where = "subprocess" if result["onednn_on"] else "in-process"
    assert parity["reference"].endswith(f"oneDNN rewrites off, {where}"), parity["reference"]
    left = [p.name for p in [*tmp.iterdir(), *tmp_path.iterdir()] if "bertfuse-" in p.name]
    assert left == [], f"the reference worker's temp dir was left behind: {left}"


def test_worker_failure_is_tfs_error_and_cleans_up(contrib_pb, tmp_path, monkeypatch):
    """An id past the vocabulary: the worker's InvalidArgumentError comes back as one (which
    the CLI reports as bad input), and the temp dir goes."""
    import tempfile

    import tensorflow as tf

    from bertfuse.converter import load_source, reference
    from bertfuse.io.inputs import random_inputs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    source = load_source(str(contrib_pb), ConvertOptions().kind, ConvertOptions().signature)
    try:
        good = random_inputs(2, 8, source.vocab_size, seed=1)
        got = reference.run_in_subprocess(source, [good])[0]
        assert got["sequence_output"].shape == (2, 8, 128)
        assert np.isfinite(got["sequence_output"]).all()
        bad = dict(good, input_ids=np.full((2, 8), 10 ** 6, np.int32))
        with pytest.raises(tf.errors.InvalidArgumentError):
            reference.run_in_subprocess(source, [bad])
    finally:
        source.close()
    assert [p for p in tmp_path.iterdir() if p.name.startswith("bertfuse-")] == []


@pytest.mark.parametrize("onednn", [None, "0", "1"], ids=["unset", "off", "on"])
def test_failing_process_prints_one_line(tmp_path, onednn):
    """TF is imported (and logs from C++) before the bad input is found: still one line."""
    pb = tmp_path / "garbage.pb"
    pb.write_bytes(b"\x89PNG not a graph \xff\xfe\x00" * 20)
    proc = subprocess.run([sys.executable, "-m", "bertfuse.cli", "convert", str(pb),
                           "-o", str(tmp_path / "m.onnx")], capture_output=True, text=True,
                          env=_env(TF_ENABLE_ONEDNN_OPTS=onednn), timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("bertfuse: error:"), proc.stderr
    assert not (tmp_path / "m.onnx").exists()


# ------------------------------------------------------------------------------ mask checks


def test_model_reading_padded_ids_is_not_refused(neighbour_pb, tmp_path):
    """TF's own outputs move when padded ids change; the ONNX model moves the same way."""
    code, report, err = _cli("convert", neighbour_pb, "-o", tmp_path / "n.onnx", "--inputs",
                             NEIGHBOUR_ROLES, "--json")
    assert code == 0, err
    rows = _rows(report["parity"])
    ids = rows["mask invariance (padded ids changed)"]
    assert ids["ok"] and ids["note"].startswith("TF's own outputs move by"), ids
    moved = float(ids["note"].split()[-1])
    assert moved > 1e-2  # the check really saw TF move, and let it
    assert rows["mask invariance (padded segment ids changed)"]["ok"]
    assert rows["sequence_output"]["max_abs"] <= TOL


def test_swapped_mask_and_segments_are_refused(neighbour_pb, tmp_path):
    out = tmp_path / "swapped.onnx"
    code, report, err = _cli("convert", neighbour_pb, "-o", out, "--inputs", NEIGHBOUR_SWAPPED,
                             "--json")
    assert code == 1, err
    rows = _rows(report["parity"])
    seg = rows["mask invariance (padded segment ids changed)"]
    assert not seg["ok"] and seg["note"].startswith("TF's own outputs move"), seg
    assert rows["sequence_output"]["ok"]  # plain parity cannot see it
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "mask invariance" in lines[0] and "--inputs" in lines[0], err
    assert not out.exists()


def test_mask_check_fails_on_nan():
    from bertfuse.pipeline.parity import OutputParity, tolerance_for
    from bertfuse.pipeline.mask import IDS, mask_rows

    mask = np.array([[1, 1, 0, 0]], np.int32)
    base = np.zeros((1, 4, 2), np.float32)
    nan = base.copy()
    nan[0, 2] = np.nan  # at a padded position: the kept positions alone would hide it
    refs = {"base": {"sequence_output": base}, "ids": {"sequence_output": base}}
    cands = {"base": {"sequence_output": base}, "ids": {"sequence_output": nan}}
    (row,) = [OutputParity(*r) for r in mask_rows(mask, refs, cands, tolerance_for("fp32"))]
    assert row.name == IDS and not row.ok and row.nonfinite == 2
    json.dumps(row.to_json(), allow_nan=False)


# ------------------------------------------------------------------------------ NaN, tolerances


def test_compare_fails_closed():
    from bertfuse.pipeline.parity import compare, tolerance_for

    ref = {"a": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32),
           "c": np.ones(3, np.float32)}
    cand = {"a": np.where(np.eye(2, 3) > 0, np.nan, 1.0), "b": np.full(3, np.inf)}
    rows = {r.name: r for r in compare(ref, cand, tolerance_for("fp32", atol=1e9))}
    assert not rows["a"].ok and rows["a"].nonfinite == 2
    assert not rows["b"].ok and rows["b"].nonfinite == 3
    assert not rows["c"].ok and "missing" in rows["c"].note
    for r in rows.values():
        json.dumps(r.to_json(), allow_nan=False)


@pytest.fixture(scope="module")
def nan_pb(contrib_pb) -> Path:
    """contrib_pb with one NaN in the pooler's bias: TF and ONNX both give NaN pooled
    outputs, and agreeing on NaN must still fail."""
    import tensorflow as tf

    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(contrib_pb.read_bytes())
    (node,) = [n for n in graph_def.node if n.name == "bert/pooler/dense/bias"]
    value = tf.make_ndarray(node.attr["value"].tensor).copy()
    value[3] = np.nan
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    path = contrib_pb.with_name("nan_bert.pb")
    path.write_bytes(graph_def.SerializeToString())
    return path


def test_nan_model_fails_convert_and_verify(nan_pb, tmp_path):
    out = tmp_path / "nan.onnx"
    code, report, err = _cli("convert", nan_pb, "-o", out, "--json", "--batch", "2")
    assert code == 1 and not out.exists(), err
    assert "pooled_output" in err and "NaN/Inf" in err and "--inputs" not in err, err
    pooled = _rows(report["parity"])["pooled_output"]
    assert not pooled["ok"] and pooled["nonfinite"] > 0 and pooled["max_abs"] is None, pooled
    assert _rows(report["parity"])["sequence_output"]["ok"]
    code, report, err = _cli("convert", nan_pb, "-o", out, "--json", "--force", "--batch", "2")
    assert code == 1 and out.exists()
    code, report, _ = _cli("verify", out, "--against", nan_pb, "--json", "--batch", "2")
    assert code == 1 and not _rows(report["parity"])["pooled_output"]["ok"]


def _nan_model(path: Path) -> None:
    """input_ids -> sqrt(-1 - ids): NaN everywhere, a real model ORT runs."""
    nodes = [helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Neg", ["f"], ["n"]),
             helper.make_node("Sub", ["n", "one"], ["m"]),
             helper.make_node("Sqrt", ["m"], ["sequence_output"])]
    graph = helper.make_graph(
        nodes, "nan", [helper.make_tensor_value_info("input_ids", TensorProto.INT32,
                                                     ["batch", "seq"])],
        [helper.make_tensor_value_info("sequence_output", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_diff_numeric_fails_on_nan(tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    _nan_model(a)
    _nan_model(b)
    code, report, err = _cli("diff", a, b, "--numeric", "--json", "--fail-on", "numeric")
    assert code == 1, (report, err)
    assert any("NaN/Inf" in f["message"] for f in report["failing"]), report
    json.dumps(report, allow_nan=False)


@pytest.mark.parametrize("argv", [
    ["convert", "SRC", "-o", "OUT", "--atol", "nan"],
    ["convert", "SRC", "-o", "OUT", "--atol", "-1"],
    ["convert", "SRC", "-o", "OUT", "--atol", "inf"],
    ["convert", "SRC", "-o", "OUT", "--rtol", "nan"],
    ["convert", "SRC", "-o", "OUT", "--seed", "-1"],
    ["verify", "OUT", "--against", "SRC", "--atol", "nan"],
    ["verify", "OUT", "--against", "SRC", "--seed", "-3"],
    ["diff", "OUT", "OUT", "--numeric", "--atol", "nan"],
    ["diff", "OUT", "OUT", "--numeric", "--atol", "-1e-3"],
    ["diff", "OUT", "OUT", "--numeric", "--seed", "-1"],
], ids=lambda a: " ".join(a[:1] + a[-2:]))
def test_bad_tolerance_or_seed_is_one_line_exit_2(tmp_path, argv):
    src, out = tmp_path / "src.pb", tmp_path / "m.onnx"
    src.write_bytes(b"unused")
    out.write_bytes(b"unused")
    code, _, err = _cli(*[{"SRC": src, "OUT": out}.get(a, a) for a in argv])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "--atol" in lines[0] or "--rtol" in lines[0] or "--seed" in lines[0], lines[0]


@pytest.mark.parametrize("field,value", [("atol", float("nan")), ("rtol", -1.0),
                                         ("seed", -1), ("atol", float("inf"))])
def test_python_api_checks_tolerances_and_seed(field, value, tmp_path):
    from bertfuse.pipeline import stages
    from bertfuse.pipeline.options import ConvertOptions

    opts = ConvertOptions(**{field: value})
    with pytest.raises(BertfuseError, match=f"--{field}"):
        stages.convert(str(tmp_path / "missing.pb"), str(tmp_path / "m.onnx"), opts)


def test_gate_uses_atol_rtol_and_a_fixed_seed(ckpt_erf, convert_cached):
    conv = convert_cached(ckpt_erf)
    assert conv.exit_code == 0, conv.report
    args = ("verify", conv.onnx_path, "--against", ckpt_erf.path, "--json", "--batch", "2")
    code, first, _ = _cli(*args)
    assert code == 0 and first["parity"]["seed"] == 0
    code, strict, _ = _cli(*args, "--atol", "0")
    assert code == 1 and strict["parity"]["tolerance"] == {"max": 0.0, "rtol": 0.0, "mean": None}
    # The same inputs without --seed: the same differences, now over the limit.
    for name, row in _rows(first["parity"]).items():
        assert _rows(strict["parity"])[name]["max_abs"] == row["max_abs"], name
    assert _rows(strict["parity"])["sequence_output"]["max_abs"] > 0
    code, loose, _ = _cli(*args, "--atol", "1e-3", "--rtol", "1e-2")
    assert code == 0
    assert loose["parity"]["tolerance"] == {"max": 1e-3, "rtol": 1e-2, "mean": None}


def test_hint_fits_the_source_kind():
    from bertfuse.pipeline.gate import parity_failure
    from bertfuse.pipeline.parity import OutputParity, ParityReport
    from bertfuse.pipeline.mask import SEGMENTS

    row = OutputParity(SEGMENTS, 0.5, 0.1, False,
                       note="TF's own outputs move: input_mask does not act as the attention "
                            "mask")
    for kind, inputs in (("checkpoint", False), ("savedmodel", True), ("frozen", True)):
        text = parity_failure(ParityReport("fp32", 4, 32, [row], source_kind=kind))
        assert ("--inputs" in text) == inputs, (kind, text)
