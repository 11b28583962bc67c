"""inspect / summarize / diff / draw, and the golden summaries of the fused example models.

Golden files: tests/fixtures/golden/<model>_<precision>.summary.json. The test regenerates each and
fails with `bertfuse diff` output when fusion is lost or the I/O changed (the default
policy). BERTFUSE_UPDATE_GOLDEN=1 rewrites them; BERTFUSE_GOLDEN_ALL=1 also checks shenma-3l
(it converts a 3-layer model from TF: slow).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import onnx
import pytest

from bertfuse import cli
from bertfuse.inspect.diff import diff_summaries, diff_text
from bertfuse.inspect.summary import dumps, load_light, summarize
from support.paths import GOLDEN

LAYER1_REASON = "test: layer 1 attention made unfusable"


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def models(tiny_onnx, tmp_path_factory) -> dict[str, str]:
    """'fp32' / 'fp16' fused, 'raw' (tf2onnx, canonical I/O), and 'partial': attention of
    layer 1 left unfused (the passes made to give up there)."""
    out = dict(tiny_onnx)
    partial = tmp_path_factory.mktemp("inspect") / "partial.onnx"
    mp = pytest.MonkeyPatch()
    try:
        _layer1_unfusable(mp)
        assert cli.main(["optimize", out["raw"], "-o", str(partial), "--json"]) == 0
    finally:
        mp.undo()
    out["partial"] = str(partial)
    return out


def _layer1_unfusable(mp: pytest.MonkeyPatch) -> None:
    """AttentionFusion.match (the structural match, then the numeric one) fails for layer 1
    only."""
    from bertfuse.passes import attention
    from bertfuse.passes.match import fail

    orig_match = attention.AttentionFusion.match

    def match(self, graph, softmax):
        if "layer_1/" in softmax.name:
            fail(LAYER1_REASON)
        return orig_match(self, graph, softmax)

    mp.setattr(attention.AttentionFusion, "match", match)


# ------------------------------------------------------------------------------ inspect


def test_load_light_keeps_structure_drops_values(models):
    for name in ("fp32", "raw"):
        light, full = load_light(models[name]), onnx.load(models[name])
        assert [n.SerializeToString() for n in light.graph.node] == \
               [n.SerializeToString() for n in full.graph.node]
        assert list(light.graph.input) == list(full.graph.input)
        assert list(light.opset_import) == list(full.opset_import)
        for lt, ft in zip(light.graph.initializer, full.graph.initializer, strict=True):
            assert (lt.name, list(lt.dims), lt.data_type) == (ft.name, list(ft.dims), ft.data_type)
            assert not lt.raw_data and not lt.float_data and not lt.int64_data
        real = sum(onnx.numpy_helper.to_array(t).nbytes for t in full.graph.initializer)
        assert summarize(light)["weights"]["bytes"] == real


def test_inspect_json_text_markdown(models, capsys):
    code, out, err = _cli(capsys, "inspect", models["fp32"], "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["inputs"][0] == {"name": "input_ids", "dtype": "int32", "shape": ["batch", "seq"]}
    assert s["ops"]["Attention"] == 2 and s["encoder"]["fully_fused"]
    assert s["opsets"]["ai.onnx"] == 17 and s["producer"]["name"] == "bertfuse"
    assert s["weights"]["by_dtype"]["float32"]["bytes"] > 2_000_000
    code, out, _ = _cli(capsys, "inspect", models["raw"])
    assert code == 0 and "[batch, seq]" in out and "encoder fusion" in out and "Softmax" in out
    code, out, _ = _cli(capsys, "inspect", models["partial"], "--markdown")
    assert code == 0 and "| op | count |" in out
    assert "| 1 | **no** | 2/2 | fused | Softmax x1 |" in out, out


def test_summarize_is_stable_and_weightless(models, tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert _cli(capsys, "summarize", models["fp32"], "-o", a)[0] == 0
    assert _cli(capsys, "summarize", models["fp32"], "-o", b)[0] == 0
    assert a.read_bytes() == b.read_bytes()
    text = a.read_text()
    assert json.loads(text) == summarize(models["fp32"]) and text == dumps(json.loads(text))
    assert len(text) < 8000  # names, shapes, dtypes: no values
    code, out, _ = _cli(capsys, "summarize", models["fp32"])
    assert code == 0 and out == text


# ------------------------------------------------------------------------------ diff


def test_diff_self_exits_0(models, tmp_path, capsys):
    code, out, err = _cli(capsys, "diff", models["fp32"], models["fp32"])
    assert code == 0 and "no differences" in out, out + err
    summary = tmp_path / "s.json"
    _cli(capsys, "summarize", models["fp32"], "-o", summary)
    code, out, _ = _cli(capsys, "diff", summary, models["fp32"], "--fail-on", "all")
    assert code == 0, out


def test_diff_one_layer_unfused_exits_1_and_names_it(models, capsys):
    code, out, _ = _cli(capsys, "diff", models["fp32"], models["partial"])
    assert code == 1, out
    assert "layer 1: lost Attention" in out and "Softmax x1" in out
    assert "layer 0" not in out
    code, out, _ = _cli(capsys, "diff", models["fp32"], models["partial"], "--json")
    res = json.loads(out)
    assert code == 1 and [f["layer"] for f in res["failing"]] == [1]
    assert res["failing"][0]["category"] == "fusion-loss"
    code, out, _ = _cli(capsys, "diff", models["fp32"], models["partial"], "--markdown")
    assert code == 1 and ":x:" in out and "**fail**" in out and "layer 1" in out
    # Not failed on when the policy leaves fusion out.
    assert _cli(capsys, "diff", models["fp32"], models["partial"], "--fail-on",
                "io-change")[0] == 0


def test_diff_raw_vs_fused_every_layer_gained(models, capsys):
    code, out, _ = _cli(capsys, "diff", models["raw"], models["fp32"], "--json", "--numeric")
    res = json.loads(out)
    assert code == 0, res["failing"]
    gained = {f["layer"] for f in res["findings"] if f["category"] == "fusion-gain"}
    layers = summarize(models["fp32"])["encoder"]["layers"]
    assert gained == {-1} | {l["layer"] for l in layers}
    assert all(r["max_abs"] < 1e-4 for r in res["numeric"]), res["numeric"]
    assert res["ops"]["Attention"] == {"a": 0, "b": 2, "delta": 2}
    # Fused -> raw is the same change backwards: every layer lost fusion.
    code, out, _ = _cli(capsys, "diff", models["fp32"], models["raw"])
    assert code == 1 and all(f"layer {i}: lost Attention, GELU" in out for i in range(2))


def test_diff_categories(models, tmp_path, capsys):
    s = summarize(models["fp32"])
    changed = json.loads(json.dumps(s))
    changed["outputs"][1]["name"] = "pooled"
    changed["opsets"]["ai.onnx"] = 18
    (tmp_path / "changed.json").write_text(dumps(changed))
    code, out, _ = _cli(capsys, "diff", models["fp32"], tmp_path / "changed.json")
    assert code == 1 and "output 'pooled_output' removed" in out and "FAIL" in out
    assert "opset ai.onnx: 17 -> 18" in out
    # fp32 -> fp16: weights change dtype, I/O does not: passes the default policy.
    code, out, _ = _cli(capsys, "diff", models["fp32"], models["fp16"])
    assert code == 0 and "dtype float32 -> float16" in out, out
    assert _cli(capsys, "diff", models["fp32"], models["fp16"], "--fail-on",
                "init-change")[0] == 1
    # fp16 drifts past a tight tolerance.
    code, out, _ = _cli(capsys, "diff", models["fp32"], models["fp16"], "--numeric",
                        "--atol", "1e-7", "--batch", "2", "--seq", "8")
    assert code == 1 and "max |diff|" in out


def test_bad_input_exits_2_one_line(models, tmp_path, capsys):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\xfe not a model at all \x00" * 10)
    other_json = tmp_path / "other.json"
    other_json.write_text('{"hello": 1}')
    summary = tmp_path / "s.json"
    summary.write_text(dumps(summarize(models["fp32"])))
    cases = [("diff", tmp_path / "missing.onnx", models["fp32"]),
             ("diff", garbage, models["fp32"]),
             ("diff", other_json, models["fp32"]),
             ("diff", models["fp32"], models["fp32"], "--fail-on", "fusion-loss,speed"),
             ("diff", summary, models["fp32"], "--numeric"),
             ("inspect", tmp_path),
             ("summarize", models["fp32"], "-o", tmp_path / "no" / "s.json"),
             ("draw", models["fp32"], "--layer", "7", "-o", tmp_path / "x.svg"),
             ("draw", models["fp32"], "-o", tmp_path / "x.gif")]
    for args in cases:
        code, out, err = _cli(capsys, *args)
        assert code == 2, (args, out, err)
        assert len(err.strip().splitlines()) == 1 and "error" in err, (args, err)
        assert "Traceback" not in err


# ------------------------------------------------------------------------------ draw


def test_draw_dot_marks_fused_and_leftovers(models, tmp_path, capsys):
    out = tmp_path / "layer1.dot"
    code, _, err = _cli(capsys, "draw", models["partial"], "--layer", "1", "--before",
                        models["raw"], "-o", out)
    assert code == 0, err
    dot = out.read_text()
    assert "cluster_b" in dot and "cluster_a" in dot  # raw beside the model
    assert "left unfused" in dot and "#d62828" in dot  # layer 1's Softmax, highlighted
    assert "SkipLayerNormalization" in dot and "rank=same" in dot
    out0 = tmp_path / "layer0.dot"
    assert _cli(capsys, "draw", models["partial"], "--layer", "0", "-o", out0)[0] == 0
    assert "<b>Attention</b>" in out0.read_text()
    assert "<b>Softmax</b>" not in out0.read_text()


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot not installed")
def test_draw_svg_and_png(models, tmp_path, capsys):
    for ext in ("svg", "png"):
        out = tmp_path / f"layer0.{ext}"
        code, _, err = _cli(capsys, "draw", models["fp32"], "--before", models["raw"],
                            "--layer", "0", "-o", out)
        assert code == 0, err
        data = out.read_bytes()
        assert data.startswith(b"\x89PNG") if ext == "png" else b"<svg" in data
    assert b"Attention" in (tmp_path / "layer0.svg").read_bytes()


# ------------------------------------------------------------------------------ golden


def _check_golden(name: str, path: str) -> None:
    golden = GOLDEN / f"{name}.summary.json"
    new = summarize(path)
    if os.environ.get("BERTFUSE_UPDATE_GOLDEN") == "1" or not golden.exists():
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(dumps(new))
        if os.environ.get("BERTFUSE_UPDATE_GOLDEN") != "1":
            pytest.fail(f"{golden} was missing: written now, check it in")
        return
    old = json.loads(golden.read_text())
    res = diff_summaries(old, new, str(golden.relative_to(GOLDEN.parent.parent)),
                         f"{name} (converted now)")
    assert res.exit_code == 0, (
        f"{name}: fusion lost or I/O changed against the golden summary\n{diff_text(res)}"
        f"(if intended: BERTFUSE_UPDATE_GOLDEN=1 pytest tests/unit/inspect/test_inspect.py)")
    if old != new:  # gains, op or weight changes: allowed, but the golden file is stale
        warnings.warn(f"{golden.name} is stale (not a failure):\n{diff_text(res)}")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_golden_tiny(models, precision):
    _check_golden(f"tiny_{precision}", models[precision])


@pytest.mark.skipif(os.environ.get("BERTFUSE_GOLDEN_ALL") != "1",
                    reason="slow (TF conversion of shenma-3l): BERTFUSE_GOLDEN_ALL=1")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_golden_shenma_3l(tmp_path_factory, precision):
    from bertfuse.converter.example import write_example

    base = tmp_path_factory.getbasetemp() / "shenma-3l"
    if not (base / "bert_config.json").exists():
        write_example("shenma-3l", str(base), seed=0)
    out = tmp_path_factory.mktemp("shenma") / f"shenma_{precision}.onnx"
    assert cli.main(["convert", str(base), "-o", str(out), "--no-verify", "--json",
                     "--precision", precision]) == 0
    _check_golden(f"shenma-3l_{precision}", str(out))
