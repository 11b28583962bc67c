"""The FP8 gate: FP8's accuracy against fp32 in a ranking or retrieval user's terms (cosine of
L2-normalised vectors, argmax agreement of logits, top-k agreement), `--precision fp8` and
its refusal line, `--force`."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import bertfuse
from bertfuse.cli import main
from bertfuse.errors import BertfuseError
from bertfuse.ops.evaluator import evaluate
from bertfuse.pipeline.fp8_gate import Fp8Gate, measure


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_cosine_is_per_row_of_normalised_vectors(rng):
    want = rng.standard_normal((6, 16))
    got = want * rng.uniform(0.5, 2.0, (6, 1))  # scaled rows: the same direction
    got[2] += 0.3 * rng.standard_normal(16)  # one row turned
    (terms,) = measure({"pooled_output": want}, {"pooled_output": got}, None)
    cos = np.sum(_unit_rows(want) * _unit_rows(got), axis=-1)
    assert terms.kind == "vectors" and terms.count == 6
    assert np.isclose(terms.cosine_min, cos[2]) and np.isclose(terms.cosine_mean, cos.mean())
    assert terms.cosine_min < 0.999 < np.delete(cos, 2).min() + 1e-12
    assert terms.argmax_agreement is None and terms.k == 5 and 0 <= terms.topk_agreement <= 1


def test_token_vectors_count_the_valid_tokens_only(rng):
    want = rng.standard_normal((2, 5, 8))
    got = want.copy()
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    got[0, 4] = -want[0, 4]  # a padded token turned around: not counted
    (terms,) = measure({"sequence_output": want}, {"sequence_output": got}, mask)
    assert terms.kind == "token vectors" and terms.count == 5
    assert np.isclose(terms.cosine_min, 1.0) and np.isclose(terms.token_cosine_min, 1.0)
    got[1, 1] = -want[1, 1]  # a valid one: cosine -1
    (terms,) = measure({"sequence_output": want}, {"sequence_output": got}, mask)
    assert np.isclose(terms.token_cosine_min, -1.0) and np.isclose(terms.token_cosine_mean, 0.6)
    # the gated cosine is the mean-pooled sentence embedding's: row 1 is (t0 - t1) / 2 now
    pooled_a, pooled_b = want[1, :2].mean(0), (want[1, 0] - want[1, 1]) / 2
    cos = pooled_a @ pooled_b / np.linalg.norm(pooled_a) / np.linalg.norm(pooled_b)
    assert np.isclose(terms.cosine_min, min(cos, 1.0)) and np.isclose(terms.cosine_mean, (1 + cos) / 2)
    assert "mean-pooled cosine" in Fp8Gate(min_cosine=0.9999).failure([terms]) or cos >= 0.9999


def test_logits_are_held_to_argmax_agreement(rng):
    want = rng.standard_normal((200, 3))
    got = want.copy()
    flip = [5, 17]
    for r in flip:  # the runner-up wins
        order = np.argsort(want[r])
        got[r, order[-2]] = want[r, order[-1]] + 1.0
    (terms,) = measure({"logits": want}, {"logits": got}, None)
    assert terms.kind == "logits" and terms.cosine_min is None
    assert np.isclose(terms.argmax_agreement, 198 / 200)
    assert "argmax agreement 99.00% < 99.50%" in Fp8Gate().failure([terms])
    assert Fp8Gate(min_argmax=0.99).failure([terms]) == ""


def test_scores_are_ranked_over_the_batch(rng):
    want = np.arange(20, dtype=np.float64)[:, None]  # [B, 1]: a ranker's score per candidate
    got = want.copy()
    got[9, 0], got[10, 0] = 100.0, -1.0  # 9 jumps into the top 10, 10 falls out of it
    (terms,) = measure({"score": want}, {"score": got}, None)
    assert terms.kind == "scores" and terms.k == 10 and np.isclose(terms.topk_agreement, 0.9)
    assert Fp8Gate().failure([terms]) == ""  # stated, not gated


def test_nan_or_inf_always_fails(rng):
    want = rng.standard_normal((4, 8))
    got = want.copy()
    got[1, 3] = np.nan
    terms = measure({"pooled_output": want, "logits": want}, {"pooled_output": got, "logits": got},
                    None)
    assert all(t.nonfinite == 1 for t in terms)
    assert "NaN/Inf" in Fp8Gate(min_cosine=1e-9, min_argmax=1e-9).failure(terms)
    assert json.dumps([t.to_json() for t in terms], allow_nan=False)  # strict JSON


@pytest.mark.parametrize("bad", ["0", "1.5", "nan", "-1"])
def test_gate_limits_are_fractions(ckpt_erf, tmp_path, capsys, bad):
    out = tmp_path / "m.onnx"
    assert main(["convert", ckpt_erf.path, "-o", str(out), "--precision", "fp8",
                 "--fp8-min-cosine", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fp8" in err and not out.exists(), err
    with pytest.raises(BertfuseError, match="fp8_min_argmax"):
        bertfuse.convert(ckpt_erf.path, precision="fp8", fp8_min_argmax=float("nan"))


def test_precision_fp8_is_refused_below_its_gate_and_forced(ckpt_erf, convert_cached, tmp_path,
                                                           capsys):
    """Past a gate it cannot meet: one line naming the measured value, exit 1, nothing
    written; --force writes it. The report's numbers are the written model's (NumPy
    references) against TensorFlow's on the parity inputs."""
    strict = ("--precision", "fp8", "--fp8-min-cosine", "0.9999999")
    out = tmp_path / "m.onnx"
    code = main(["convert", ckpt_erf.path, "-o", str(out), *strict, "--batch", "5", "--seed", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and not out.exists()
    assert len(err) == 1 and "FP8 accuracy below its gate" in err[0], err
    assert "cosine 0.99" in err[0] and "< 0.9999999" in err[0] and "--force" in err[0]

    conv = convert_cached(ckpt_erf, *strict, "--force")
    assert conv.exit_code == 0 and conv.report["written"], conv.report
    fp8 = conv.report["fp8"]
    assert fp8["ok"] is False and fp8["gate"] == {"min_cosine": 0.9999999, "min_argmax": 0.995}
    assert fp8["failure"] in err[0] and fp8["inputs"] == "random"
    opts = conv.report["options"]
    assert (opts["precision"], opts["kernels"], opts["fp8"]) == ("fp16", "bertfuse", True)
    model = onnx.load(conv.onnx_path)
    assert any(n.op_type == "DenseBiasGeluFp8" for n in model.graph.node)
    feeds = ckpt_erf.feeds(5, 32, seed=0)
    want, got = ckpt_erf.reference(feeds), evaluate(model, feeds)
    rows = {t["name"]: t for t in fp8["outputs"]}
    pooled = np.sum(_unit_rows(want["pooled_output"].astype(np.float64))
                    * _unit_rows(got["pooled_output"].astype(np.float64)), axis=-1)
    assert np.isclose(rows["pooled_output"]["cosine_min"], pooled.min(), atol=1e-6)
    assert np.isclose(rows["pooled_output"]["cosine_mean"], pooled.mean(), atol=1e-6)
    assert rows["sequence_output"]["count"] == int(feeds["input_mask"].sum())
    keep = feeds["input_mask"].astype(np.float64)[..., None]
    mean = [np.sum(x.astype(np.float64) * keep, 1) / keep.sum(1) for x in
            (want["sequence_output"], got["sequence_output"])]
    sentence = np.sum(_unit_rows(mean[0]) * _unit_rows(mean[1]), axis=-1)
    assert np.isclose(rows["sequence_output"]["cosine_min"], sentence.min(), atol=1e-6)


def test_default_gate_holds_the_converters_fp8_model(ckpt_erf, convert_cached):
    """--precision fp8 and --precision fp16 --ops bertfuse --fp8 are one model, held to the
    default gate (min cosine 0.999): this small checkpoint's vectors stay within it."""
    conv = convert_cached(ckpt_erf, "--precision", "fp8")
    old = convert_cached(ckpt_erf, "--precision", "fp16", "--ops", "bertfuse", "--fp8")
    assert conv.exit_code == old.exit_code == 0, conv.report
    assert conv.report["fp8"]["ok"] and conv.report["fp8"]["outputs"] == old.report["fp8"]["outputs"]
    assert all(t["cosine_min"] >= 0.999 for t in conv.report["fp8"]["outputs"])
    assert onnx.load(conv.onnx_path).graph == onnx.load(old.onnx_path).graph


FP8_OPS = ("DenseBiasFp8", "DenseBiasGeluFp8", "DenseBiasSkipLayerNormFp8")


def _fp8_inputs_from(model: onnx.ModelProto) -> dict[str, str]:
    """Each FP8 op reading an e4m3 X (a hand-off): the op type that wrote it."""
    made_by = {o: n.op_type for n in model.graph.node for o in n.output}
    e4m3 = {v.name for v in model.graph.value_info
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT8E4M3FN}
    return {n.name: made_by.get(n.input[0], "graph input") for n in model.graph.node
            if n.op_type in FP8_OPS and n.input[0] in e4m3}


def test_fp8_gemms_names_the_places(tiny_onnx):
    """--fp8-gemms up,down: FFN up and down in e4m3, QKV and attention-out in fp16; FFN down
    reads FFN up's e4m3 output (an FP8 op's hand-off), nothing reads one an fp16 dense op
    would have to write."""
    model, report = bertfuse.optimize(tiny_onnx["raw"], precision="fp8", fp8_gemms="up,down",
                                      fp8_min_cosine=0.5)
    ops = [n.op_type for n in model.graph.node]
    layers = ops.count("BertAttention")
    assert ops.count("DenseBiasGeluFp8") == ops.count("DenseBiasSkipLayerNormFp8") == layers
    assert ops.count("DenseBiasFp8") == 0 and ops.count("DenseBias") == layers
    assert ops.count("DenseBiasSkipLayerNorm") == layers  # attention out
    # down reads up's e4m3 output; up quantises attention-out's fp16 Y itself
    assert set(_fp8_inputs_from(model).values()) == {"DenseBiasGeluFp8"}
    assert report.fp8["gemms"] == ["up", "down"] and report.fp8["tried"] == []
    only_out, _ = bertfuse.optimize(tiny_onnx["raw"], precision="fp8", fp8_gemms="out",
                                    fp8_min_cosine=0.5)
    assert set(_fp8_inputs_from(only_out).values()) == {"BertAttention"}  # its Yq hand-off
    only_down, _ = bertfuse.optimize(tiny_onnx["raw"], precision="fp8", fp8_gemms="down",
                                     fp8_min_cosine=0.5)
    assert _fp8_inputs_from(only_down) == {}  # quantises the fp16 GELU op's Y itself
    assert [n.op_type for n in only_down.graph.node].count("DenseBiasSkipLayerNormFp8") == layers


def test_fp8_gemms_auto_keeps_e4m3_where_the_gate_allows(tiny_onnx):
    """auto: every place first; below the gate, each place alone, then the places within it
    alone added, the most GEMM work first, while the gate holds. The limit is put between
    what every place gives and what the best place alone gives, as measured."""
    _, probe = bertfuse.optimize(tiny_onnx["raw"], precision="fp8", fp8_gemms="auto",
                                 fp8_min_cosine=0.9999999, force=True)
    tried = {tuple(t["places"]): t["margin"] + 0.9999999 for t in probe.fp8["tried"]}
    assert json.dumps(probe.fp8, allow_nan=False)
    every, alone = tried[("qkv", "out", "up", "down")], {p: tried[(p,)] for p in
                                                         ("qkv", "out", "up", "down")}
    best = max(alone.values())
    assert every < best, tried
    limit = (every + best) / 2
    model, report = bertfuse.optimize(tiny_onnx["raw"], precision="fp8", fp8_gemms="auto",
                                      fp8_min_cosine=limit)
    fp8 = report.fp8
    assert fp8["ok"] and fp8["failure"] == "" and 0 < len(fp8["gemms"]) < 4
    assert all(alone[p] >= limit for p in fp8["gemms"])  # each within the gate alone
    assert fp8["tried"][0]["places"] == ["qkv", "out", "up", "down"] and fp8["tried"][0]["failure"]
    assert min(t["cosine_min"] for t in fp8["outputs"]) >= limit  # the written model's own
    assert any(n.op_type in FP8_OPS for n in model.graph.node)


@pytest.mark.parametrize("args, says", [(("--precision", "fp8", "--fp8-gemms", "qkv,mlp"), "fp8-gemms"),
                                        (("--precision", "fp8", "--fp8-gemms", "up,up"), "fp8-gemms"),
                                        (("--precision", "fp16", "--fp8-gemms", "auto"), "needs FP8")])
def test_fp8_gemms_refuses_what_it_cannot_do(ckpt_erf, tmp_path, capsys, args, says):
    out = tmp_path / "m.onnx"
    assert main(["convert", ckpt_erf.path, "-o", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and not out.exists(), err
