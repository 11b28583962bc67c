"""`--gelu-approximation` end to end on the tiny erf checkpoint: the exact GELUs become the tanh
form on both paths (contrib FastGelu; bertfuse's DenseBiasGelu approximate = 1, the form
cuBLASLt fuses into the GEMM), the result stays within the fp16 limits against TensorFlow,
and it is refused where its error would pass the limits (fp32)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

import bertfuse
from bertfuse.cli import main
from bertfuse.errors import BertfuseError
from bertfuse.ops.evaluator import evaluate

BF = "ai.bertfuse"


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def _against_tf(ckpt, model: onnx.ModelProto, seed: int) -> dict[str, float]:
    feeds = ckpt.feeds(3, 16, seed=seed % 1000)
    want, got = ckpt.reference(feeds), evaluate(model, feeds)
    means = {}
    for name, ref in want.items():
        d = np.abs(got[name].astype(np.float64) - ref)
        assert d.max() <= 4e-2 and d.mean() <= 2e-3, (name, d.max(), d.mean(), seed)
        means[name] = float(d.mean())
    return means


@pytest.mark.parametrize("ops", ["contrib", "bertfuse"])
def test_optimize_approximates_every_gelu(ckpt_erf, tiny_onnx, seed, ops):
    layers = ckpt_erf.config.num_hidden_layers
    exact, _ = bertfuse.optimize(tiny_onnx["raw"], precision="fp16", ops=ops)
    model, report = bertfuse.optimize(tiny_onnx["raw"], precision="fp16", ops=ops,
                                      gelu_approximation=True)
    counts = _ops(model)
    assert not counts["com.microsoft.BiasGelu"] and not counts["com.microsoft.Gelu"], counts
    if ops == "contrib":
        assert counts["com.microsoft.FastGelu"] == layers
    else:
        gelus = [n for n in model.graph.node if n.op_type == "DenseBiasGelu"]
        assert len(gelus) == layers
        assert all(onnx.helper.get_attribute_value(a) == 1
                   for n in gelus for a in n.attribute if a.name == "approximate")
        assert all(any(a.name == "approximate" for a in n.attribute) for n in gelus)
    assert [d.layer for d in report.passes.diagnostics
            if d.component == "fast_gelu" and d.fused] == list(range(layers))
    _against_tf(ckpt_erf, model, seed)
    feeds = ckpt_erf.feeds(3, 16, seed=seed % 1000)
    a, b = evaluate(exact, feeds), evaluate(model, feeds)
    assert any(np.abs(a[k].astype(np.float32) - b[k]).max() > 0 for k in a)  # it took effect


def test_convert_gates_it_against_tensorflow(ckpt_erf, convert_cached, seed):
    conv = convert_cached(ckpt_erf, "--precision", "fp16", "--ops", "bertfuse",
                          "--gelu-approximation")
    assert conv.exit_code == 0, conv.report
    assert conv.report["options"]["gelu_approximation"] is True
    rows = {r["name"]: r for r in conv.report["parity"]["outputs"]}
    for out in ("sequence_output", "pooled_output"):
        assert rows[out]["ok"] and rows[out]["max_abs"] > 0  # the contrib form vs TF
    model = onnx.load(conv.onnx_path)
    assert _ops(model)[f"{BF}.DenseBiasGelu"] == ckpt_erf.config.num_hidden_layers
    _against_tf(ckpt_erf, model, seed)


def test_a_tanh_source_is_unchanged(ckpt_tanh, convert_cached):
    plain = convert_cached(ckpt_tanh, "--precision", "fp16")
    asked = convert_cached(ckpt_tanh, "--precision", "fp16", "--gelu-approximation")
    assert plain.exit_code == asked.exit_code == 0
    a, b = onnx.load(plain.onnx_path), onnx.load(asked.onnx_path)
    assert _ops(a) == _ops(b) and _ops(a)["com.microsoft.FastGelu"] > 0
    assert not [d for d in asked.report["passes"]["diagnostics"] if d["component"] == "fast_gelu"]


def test_fp32_is_refused_in_one_line(tiny_onnx, ckpt_erf, tmp_path, capsys):
    out = tmp_path / "m.onnx"
    for argv in (["optimize", tiny_onnx["raw"]], ["convert", ckpt_erf.path]):
        assert main([*argv, "-o", str(out), "--gelu-approximation", "--json"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--gelu-approximation needs --precision fp16" in err
        assert not out.exists()
    with pytest.raises(BertfuseError, match="gelu-approximation needs --precision fp16"):
        bertfuse.optimize(tiny_onnx["raw"], gelu_approximation=True)
    with pytest.raises(BertfuseError, match="gelu_approximation"):
        bertfuse.optimize(tiny_onnx["raw"], precision="fp16", gelu_approximation="yes")


def test_the_help_names_it(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = capsys.readouterr().out
    assert "--gelu-approximation" in text and "4.7e-4" in text
