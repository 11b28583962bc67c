"""Every TF source form converts end to end: canonical I/O, names recorded, parity with TF.

Parity is checked twice: by bertfuse's own gate (its frozen copy of the model vs ORT, padded
inputs, batch 5 in `convert` and batch 1 in `verify`), and against the ORIGINAL model (the
SavedModel signature, the .keras model, or Google's math on the checkpoint's weights), which
is what catches an input or output wired to the wrong name.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import ROLES, SOURCE_FIXTURES, TFModel
from onnx import TensorProto

from bertfuse import cli
from bertfuse.pipeline.parity import ort_session, run_onnx

TOL = 1e-4


def _cli_json(*argv: str) -> tuple[int, dict]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main([*argv, "--json"])
    text = buf.getvalue()
    return code, (json.loads(text) if text.strip() else {})


def _parity_ok(parity: dict, names=("sequence_output", "pooled_output")) -> dict[str, float]:
    got = {o["name"]: o["max_abs"] for o in parity["outputs"]}
    for name in names:
        assert name in got, f"parity report lacks {name}: {got}"
        assert got[name] <= TOL, f"{name} max |diff| {got[name]:.3g} > {TOL}"
    assert parity["ok"], parity
    return got


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(params=SOURCE_FIXTURES)
def converted(request, convert_cached):
    model: TFModel = request.getfixturevalue(request.param)
    return convert_cached(model)


def test_convert_interface_and_parity(converted):
    m = converted.source
    assert converted.exit_code == 0, converted.report
    assert Path(converted.onnx_path).is_file()
    assert converted.report["written"] is True
    model = onnx.load(converted.onnx_path)

    # Inputs: exactly the three roles, int32, [batch, seq] both dynamic.
    assert [i.name for i in model.graph.input] == list(ROLES)
    for inp in model.graph.input:
        assert inp.type.tensor_type.elem_type == TensorProto.INT32, inp
        dims = inp.type.tensor_type.shape.dim
        assert len(dims) == 2 and all(d.dim_param and not d.dim_value for d in dims), inp

    # Outputs: sequence_output [batch, seq, hidden], pooled_output [batch, hidden] (+ logits).
    outs = {o.name: o for o in model.graph.output}
    assert {"sequence_output", "pooled_output"} <= set(outs)
    assert _dims(outs["sequence_output"]) == ["batch", "seq", m.hidden]
    assert _dims(outs["pooled_output"]) == ["batch", m.hidden]
    if m.head:
        assert "logits" in outs
    assert set(outs) == set(m.outputs)

    # The model's own names, recorded.
    meta = {p.key: p.value for p in model.metadata_props}
    original = json.loads(meta["original_names"])
    for role, name in m.inputs.items():
        assert original[role] == name
    for canon, name in m.outputs.items():
        assert original[canon] == name
    assert meta["source_kind"] == m.kind

    # bertfuse's parity gate, batch 5, padded.
    assert converted.report["parity"]["batch"] == 5
    _parity_ok(converted.report["parity"], tuple(m.outputs))


@pytest.mark.parametrize("batch", [1, 5])
def test_matches_original_model(converted, batch):
    """ORT on the converted model vs the original TF model (not bertfuse's frozen copy)."""
    m = converted.source
    session = ort_session(converted.onnx_path)
    for seq, seed in ((19, 10 + batch), (64, 20 + batch)):
        feeds = m.feeds(batch, seq, seed=seed)
        ref = m.reference(feeds)
        got = run_onnx(session, feeds)
        for name, want in ref.items():
            assert got[name].shape == want.shape, name
            diff = float(np.abs(got[name].astype(np.float64) - want).max())
            assert diff <= TOL, f"{m.name} {name} batch {batch} seq {seq}: max |diff| {diff:.3g}"


def test_verify_command_batch1(converted):
    m = converted.source
    code, report = _cli_json("verify", converted.onnx_path, "--against", m.path, "--batch", "1",
                             "--seed", "3")
    assert code == 0, report
    assert report["parity"]["batch"] == 1
    _parity_ok(report["parity"], tuple(m.outputs))


def test_convert_json_report(ckpt_erf, convert_cached):
    res = convert_cached(ckpt_erf)
    rep = res.report
    assert res.exit_code == 0
    assert rep["output"] == res.onnx_path and rep["written"] is True
    stages = [s["name"] for s in rep["stages"]]
    assert stages[0] == "load TF model" and "tf2onnx export" in stages
    assert "verify vs TensorFlow" in stages and stages[-1] == "write"
    assert all(s["seconds"] >= 0 for s in rep["stages"])
    assert rep["original_names"]["input_ids"] == "input_ids"
    assert rep["passes"]["ops_before"] and rep["passes"]["ops_after"]
    par = rep["parity"]
    assert par["precision"] == "fp32" and par["tolerance"]["max"] == TOL and par["seq"] > 1


def test_opset18(ckpt_erf, convert_cached):
    res = convert_cached(ckpt_erf, "--opset", "18")
    assert res.exit_code == 0, res.report
    model = onnx.load(res.onnx_path)
    assert {o.domain: o.version for o in model.opset_import}[""] == 18
    _parity_ok(res.report["parity"])


def test_finetune_checkpoint_with_head(ckpt_finetune, convert_cached):
    """adam_m/adam_v slots and global_step are ignored; the ranking head becomes `logits`."""
    res = convert_cached(ckpt_finetune)
    assert res.exit_code == 0, res.report
    model = onnx.load(res.onnx_path)
    outs = {o.name: _dims(o) for o in model.graph.output}
    assert outs["logits"] == ["batch", 1]
    assert not any("adam" in i.name or "global_step" in i.name for i in model.graph.initializer)
    _parity_ok(res.report["parity"], ("sequence_output", "pooled_output", "logits"))
    feeds = ckpt_finetune.feeds(3, 24, seed=5)
    got = run_onnx(ort_session(res.onnx_path), feeds)
    want = ckpt_finetune.reference(feeds)
    assert float(np.abs(got["logits"] - want["logits"]).max()) <= TOL


def test_frozen_outputs_by_node_name(frozen_pb, convert_cached):
    """--outputs takes the node names of a frozen graph (no :0)."""
    res = convert_cached(frozen_pb, "--outputs", "pooled_output,sequence_output")
    assert res.exit_code == 0, res.report
    model = onnx.load(res.onnx_path)
    assert {o.name for o in model.graph.output} == {"sequence_output", "pooled_output"}
    assert res.report["original_names"]["pooled_output"] == "pooled_output"


def test_tf_nn_gelu_converts(tmp_path):
    """TF 2.21 has no `Gelu` op: tf.nn.gelu lowers to Erfc (exact) or Pow/Tanh (approximate).
    tf2onnx 1.17 does not map Erfc; bertfuse's handler does."""
    import tensorflow as tf

    assert not hasattr(tf.raw_ops, "Gelu")
    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        table = tf.constant(rng.standard_normal((200, 64)).astype(np.float32), name="table")
        kernel = tf.constant(rng.standard_normal((64, 64)).astype(np.float32), name="kernel")
        ids = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_ids")
        mask = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_mask")
        x = tf.matmul(tf.gather(table, ids), kernel) * 3.0 * tf.cast(mask, tf.float32)[..., None]
        tf.identity(tf.nn.gelu(x) + tf.nn.gelu(x * 0.5, approximate=True), name="sequence_output")
    ops = {n.op for n in graph.as_graph_def().node}
    assert "Erfc" in ops and "Gelu" not in ops
    pb = tmp_path / "gelu.pb"
    pb.write_bytes(graph.as_graph_def().SerializeToString())
    code, report = _cli_json("convert", str(pb), "-o", str(tmp_path / "gelu.onnx"), "--seed", "0")
    assert code == 0, report
    _parity_ok(report["parity"], ("sequence_output",))
    model = onnx.load(str(tmp_path / "gelu.onnx"))
    # No token types in the source: the canonical segment_ids input is there, unused.
    assert [i.name for i in model.graph.input] == ["input_ids", "input_mask", "segment_ids"]
    assert "Erf" in {n.op_type for n in model.graph.node}
