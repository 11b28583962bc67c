"""Weight stripping and seeded refilling (runtime/weights.py, `bertfuse strip-weights`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

ort = pytest.importorskip("onnxruntime")

from bertfuse import cli  # noqa: E402
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan  # noqa: E402
from bertfuse.runtime.weights import (DIGEST_KEY, META_KEY, MIN_ELEMENTS, fill_weights,  # noqa: E402
                                      is_stripped, strip_weights)
from support.runtime_common import (_valid, make_request, max_diff, new_session,  # noqa: E402
                            plain_run, plain_session)


def initializer_scales(model: onnx.ModelProto) -> set[str]:
    """LayerNorm scales, found independently of bertfuse: the op slot that reads them
    (contrib ops) or the TF name (raw graphs)."""
    slots = {("LayerNormalization", 1), ("SkipLayerNormalization", 2),
             ("EmbedLayerNormalization", 5)}
    names = {n.input[i] for n in model.graph.node for (op, i) in slots
             if n.op_type == op and len(n.input) > i}
    names |= {i.name for i in model.graph.initializer if "layernorm/gamma" in i.name.lower()}
    return names


def _meta(model: onnx.ModelProto) -> list[dict]:
    return next(json.loads(p.value) for p in model.metadata_props if p.key == META_KEY)


@pytest.mark.parametrize("which", ["fp32", "fp16", "raw"])
def test_strip_keeps_names_shapes_dtypes(which, models, tmp_path):
    orig = onnx.load(models[which])
    stripped = copy.deepcopy(orig)
    count = strip_weights(stripped)
    assert is_stripped(stripped) and not is_stripped(orig)
    meta = {e["name"]: e for e in _meta(stripped)}
    assert count == len(meta) > 0
    assert [i.name for i in stripped.graph.initializer] == [i.name for i in orig.graph.initializer]
    by_name = {i.name: i for i in stripped.graph.initializer}
    for init in orig.graph.initializer:
        numel = int(np.prod(init.dims)) if init.dims else 1
        if numel >= MIN_ELEMENTS:
            entry = meta[init.name]
            assert entry["shape"] == list(init.dims), init.name
            dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
            assert np.dtype(entry["dtype"]) == dtype, init.name
            assert not by_name[init.name].raw_data and not by_name[init.name].float_data
        else:
            assert init.name not in meta
            assert by_name[init.name].SerializeToString() == init.SerializeToString(), init.name
    # The other metadata (bert_config, original_names, ...) survives.
    keys = {p.key for p in orig.metadata_props}
    assert keys | {META_KEY, DIGEST_KEY} == {p.key for p in stripped.metadata_props}
    path = tmp_path / "skel.onnx"
    onnx.save(stripped, str(path))
    size, full = path.stat().st_size, Path(models[which]).stat().st_size
    assert size < 100_000 and size < full / 20, (size, full)


def test_strip_twice_keeps_the_record(models):
    once = onnx.load(models["fp32"])
    strip_weights(once)
    twice = copy.deepcopy(once)
    strip_weights(twice)
    assert _meta(twice) == _meta(once)
    fill_weights(twice, 0)
    assert all(list(i.dims) != [0] for i in twice.graph.initializer)


def test_fill_is_deterministic_per_seed(models):
    orig = onnx.load(models["fp32"])
    skeleton = copy.deepcopy(orig)
    n = strip_weights(skeleton)
    filled = {}
    for key, seed in (("a", 7), ("b", 7), ("c", 8)):
        m = copy.deepcopy(skeleton)
        assert fill_weights(m, seed) == n
        assert not is_stripped(m)
        filled[key] = m
    assert filled["a"].SerializeToString() == filled["b"].SerializeToString()
    assert filled["a"].SerializeToString() != filled["c"].SerializeToString()
    by_name = {i.name: numpy_helper.to_array(i) for i in filled["a"].graph.initializer}
    other = {i.name: numpy_helper.to_array(i) for i in filled["c"].graph.initializer}
    for init in orig.graph.initializer:
        want = numpy_helper.to_array(init)
        assert by_name[init.name].shape == want.shape and by_name[init.name].dtype == want.dtype
    stripped_names = {e["name"] for e in _meta(skeleton)}
    assert all(not np.array_equal(by_name[k], other[k]) for k in stripped_names)
    assert fill_weights(copy.deepcopy(orig), 0) == 0  # not stripped: nothing to fill
    # A refilled model runs.
    out = plain_run(plain_session(filled["a"]), _valid(2, 6))
    assert all(np.isfinite(v).all() for v in out.values())


@pytest.mark.parametrize("which", ["fp32", "fp16", "raw"])
def test_fill_statistics(which, models):
    """LayerNorm scales near 1, everything else normal(0, 0.02): stripped down to 100
    elements so the 128-wide scales and biases are refilled too."""
    model = onnx.load(models[which])
    strip_weights(model, min_elements=100)
    names = {e["name"] for e in _meta(model)}
    scales = initializer_scales(model) & names
    assert len(scales) == 5, scales  # embeddings + 2 per layer
    fill_weights(model, 3)
    values = {i.name: numpy_helper.to_array(i).astype(np.float64)
              for i in model.graph.initializer if i.name in names}
    for name, v in values.items():
        if name in scales:
            assert abs(v.mean() - 1) < 0.1, (name, v.mean())
            assert abs(v.std() - 0.02) < 0.01, (name, v.std())
        elif v.dtype.kind == "f":
            assert abs(v.std() - 0.02) < 0.005, (name, v.std())
            assert abs(v.mean()) < 0.01, (name, v.mean())
    others = [n for n in values if n not in scales]
    assert len(others) >= 10


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_strip_and_fill(models, tmp_path, capsys):
    src = models["fp32"]
    skel, refilled = tmp_path / "skel.onnx", tmp_path / "refilled.onnx"
    code, out, err = _cli(capsys, "strip-weights", src, "-o", str(skel), "--json")
    assert code == 0, err
    assert json.loads(out) == {"schema_version": 1, "command": "strip-weights", "ok": True,
                               "output": str(skel), "stripped": 11}
    assert skel.stat().st_size < Path(src).stat().st_size / 20
    loaded = onnx.load(str(skel))
    assert is_stripped(loaded)

    code, out, err = _cli(capsys, "strip-weights", str(skel), "-o", str(refilled), "--fill", "5")
    assert code == 0, err
    assert "refilled 11 initializers" in out
    got = onnx.load(str(refilled))
    assert not is_stripped(got)
    want = copy.deepcopy(loaded)
    fill_weights(want, 5)
    assert [i.SerializeToString() for i in got.graph.initializer] == \
           [i.SerializeToString() for i in want.graph.initializer]
    orig = {i.name: tuple(i.dims) for i in onnx.load(src).graph.initializer}
    assert {i.name: tuple(i.dims) for i in got.graph.initializer} == orig
    s = new_session(str(refilled))
    out = s.run(**_valid(2, 6))
    assert all(np.isfinite(v).all() for v in out.values())


def test_cli_fill_on_unstripped_model_is_one_line(models, tmp_path, capsys):
    target = tmp_path / "never.onnx"
    code, out, err = _cli(capsys, "strip-weights", models["fp32"], "-o", str(target),
                          "--fill", "1")
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "not a stripped model" in err and "bertfuse: error:" in err
    assert not target.exists()
    assert not list(tmp_path.iterdir())


def test_fill_raw_skeleton_then_passes_matches_raw(models):
    """The benchmark's pipeline: raw skeleton -> seeded weights -> bertfuse's passes."""
    raw = onnx.load(models["raw"])
    strip_weights(raw)
    skeleton = onnx.load_from_string(raw.SerializeToString())  # as if read from disk
    fill_weights(skeleton, 11)
    fused, report = run_passes(copy.deepcopy(skeleton), fusion_plan("fp32"))
    ops = {n.op_type for n in fused.graph.node}
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"} <= ops, ops
    raw_sess, fused_sess = plain_session(skeleton), plain_session(fused)
    rng = np.random.default_rng(18)
    for batch, seq in ((1, 1), (4, 12), (8, 128), (3, 37)):
        feeds = make_request(rng, batch, seq)
        d = max_diff(plain_run(fused_sess, feeds), plain_run(raw_sess, feeds), feeds["input_mask"])
        assert d <= 1e-4, ((batch, seq), d)
    # ... and the runtime Session serves the result the same way.
    s = new_session(fused)
    feeds = make_request(rng, 5, 20)
    d = max_diff(s.run(**feeds), plain_run(raw_sess, feeds), feeds["input_mask"])
    assert d <= 1e-4
