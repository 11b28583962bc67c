"""The kernel choice at load (runtime/kernel_choice.py): which form a session runs, and why.

The device check itself runs on the GPU (benchmarks/kernels/auto_device.py); here, every
decision that can be made without one: the CPU, fp32 models, a missing library, models
written with bertfuse's ops, the lowering's coverage, and the comparison the check applies.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import onnx
import pytest

from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan
from bertfuse.runtime import Session, SessionOptions
from bertfuse.runtime.kernel_choice import (KernelChoiceError, check_feeds, choose, compare_outputs,
                                      has_bertfuse_ops, lower)
from bertfuse.runtime.request_checks import ConfigError
from support.builders.onnx_graphs import bert

LAYERS = 2


def contrib(rng, precision: str = "fp16", **kw) -> onnx.ModelProto:
    model, report = run_passes(bert(rng, layers=LAYERS, **kw), fusion_plan(precision))
    assert report.table.fully_fused
    return model


@pytest.fixture(scope="module")
def fp16_model() -> onnx.ModelProto:
    return contrib(np.random.default_rng(7), hidden=64, heads=2, inter=128)  # head size 32


def test_kernels_option_is_checked():
    assert SessionOptions().kernels == "auto"
    for bad in ("cuda", "", None, 1, "AUTO"):
        with pytest.raises(ConfigError, match="kernels must be one of 'auto', 'ort', 'bertfuse'"):
            SessionOptions(kernels=bad)


def test_cpu_auto_keeps_the_contrib_form(fp16_model):
    model, choice = choose(fp16_model, "auto", "cpu", 64)
    assert model is fp16_model and choice.used == "ort"
    assert "CUDA only" in choice.reason


def test_cpu_bertfuse_is_refused_with_the_reason(fp16_model):
    with pytest.raises(KernelChoiceError, match="kernels='bertfuse': .*CUDA only"):
        choose(fp16_model, "bertfuse", "cpu", 64)


def test_fp32_model_stays_contrib_and_says_to_convert_fp16(rng, caplog):
    fp32 = contrib(rng, "fp32")
    with caplog.at_level(logging.WARNING, logger="bertfuse.runtime"):
        model, choice = choose(fp32, "auto", "cuda", 64)
    assert model is fp32 and choice.used == "ort" and "--precision fp16" in choice.reason
    assert [r.getMessage() for r in caplog.records] == [choice.line()]  # one line says why
    with pytest.raises(KernelChoiceError, match="fp32"):
        choose(fp32, "bertfuse", "cuda", 64)


def test_no_library_and_no_build_falls_back_with_the_reason(fp16_model, monkeypatch, tmp_path):
    monkeypatch.setenv("BERTFUSE_KERNELS_DIR", str(tmp_path))  # an empty cache
    from bertfuse.kernels import library

    monkeypatch.setattr(library, "detect_sm", lambda: 90)
    model, choice = choose(fp16_model, "auto", "cuda", 64, build=False)
    assert model is fp16_model and choice.used == "ort"
    assert "not built" in choice.reason and str(tmp_path) in choice.reason
    with pytest.raises(KernelChoiceError, match="not built"):
        choose(fp16_model, "bertfuse", "cuda", 64, build=False)


def test_ort_runs_the_model_as_written(fp16_model):
    model, choice = choose(fp16_model, "ort", "cuda", 64)
    assert model is fp16_model and choice.used == "ort" and choice.reason == "asked"


def test_a_lowered_model_runs_as_written_and_ort_cannot_undo_it(fp16_model):
    lowered, misses, layers = lower(fp16_model)
    assert has_bertfuse_ops(lowered) and layers == (LAYERS, LAYERS) and misses == []
    for kernels in ("auto", "bertfuse"):
        model, choice = choose(lowered, kernels, "cuda", 64)
        assert model is lowered and choice.used == "bertfuse"
    with pytest.raises(KernelChoiceError, match="--ops contrib"):
        choose(lowered, "ort", "cuda", 64)
    with pytest.raises(ConfigError, match="kernels='ort'"):  # through Session, before any ORT
        Session(lowered, device="cpu", kernels="ort")


def test_lowering_past_the_covered_head_size_keeps_contrib_and_counts_layers(rng):
    wide = contrib(rng, hidden=264, heads=1, inter=528)  # head size 264 > 256
    lowered, misses, layers = lower(wide)
    assert layers == (0, LAYERS)
    assert len([m for m in misses if "head size 264" in m]) == LAYERS


def test_check_feeds_are_padded_and_in_range(fp16_model):
    feeds = check_feeds(fp16_model, 4, 16)
    assert set(feeds) == {i.name for i in fp16_model.graph.input}
    mask = feeds["input_mask"]
    assert mask.shape == (4, 16) and mask[0].all() and not mask.all()  # row 0 full, others padded
    assert (feeds["input_ids"][mask == 0] == 0).all()


def _outputs(rng, mask):
    seq = rng.standard_normal(mask.shape + (8,)).astype(np.float32)
    return {"sequence_output": seq, "pooled_output": seq[:, 0, :4].copy()}


def test_compare_watches_kept_positions_only(rng):
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)
    want = _outputs(rng, mask)
    got = {k: v.copy() for k, v in want.items()}
    got["sequence_output"][mask == 0] += 100.0  # padded positions carry no meaning
    assert compare_outputs(want, got, mask)[2] == ""
    got["sequence_output"][0, 1, 3] += 0.05  # past fp16's max on a kept position
    worst, _, why = compare_outputs(want, got, mask)
    assert "sequence_output max |diff| 0.05" in why and worst == pytest.approx(0.05, rel=1e-5)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_compare_fails_non_finite_outputs(rng, bad):
    mask = np.ones((2, 3), np.int32)
    want = _outputs(rng, mask)
    got = {k: v.copy() for k, v in want.items()}
    got["pooled_output"][1, 2] = bad
    assert "pooled_output has non-finite values" in compare_outputs(want, got, mask)[2]


def test_compare_fails_a_mean_past_fp16s_limit(rng):
    mask = np.ones((2, 3), np.int32)
    want = _outputs(rng, mask)
    got = {k: v + np.float32(0.01) for k, v in want.items()}  # max ok (1e-2), mean 1e-2 > 2e-3
    assert "mean 0.01" in compare_outputs(want, got, mask)[2]


def test_auto_keeps_contrib_where_only_the_general_path_covers_the_head_size(rng, monkeypatch,
                                                                            tmp_path):
    """Head size 26 (TinyBERT) runs on bertfuse's general path only, measured slower than ORT's
    kernels: auto keeps the contrib form and says so, before it looks for the library."""
    tiny = contrib(rng, hidden=52, heads=2, inter=104)
    from bertfuse.runtime import kernel_choice  # where choose() finds locate

    monkeypatch.setattr(kernel_choice, "locate", lambda: pytest.fail("auto looked for the library"))
    model, choice = choose(tiny, "auto", "cuda", 64)
    assert model is tiny and choice.used == "ort" and "head size 26" in choice.reason
    assert "general attention path" in choice.reason


@pytest.mark.parametrize("hidden, heads, want", [(64, 2, []), (128, 1, []), (52, 2, [26]),
                                                 (96, 2, [48])])
def test_general_path_heads_reads_num_heads_and_the_qkv_weight(rng, hidden, heads, want):
    from bertfuse.runtime.kernel_choice import general_path_heads

    assert general_path_heads(contrib(rng, hidden=hidden, heads=heads, inter=2 * hidden)) == want


def test_a_second_session_of_the_same_file_reuses_the_decision(rng, monkeypatch, tmp_path):
    """A pool's replicas (and restarts) of one model file decide once: the later ones reuse the
    first decision instead of deciding (and running the device check) again, and say so;
    another max_seq, or the file rewritten, decides anew; a missing library is not remembered
    (a build in the meantime changes it)."""
    from bertfuse.kernels import library
    from bertfuse.runtime import kernel_choice as kernels

    monkeypatch.setenv("BERTFUSE_KERNELS_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(library, "detect_sm", lambda: 90)
    monkeypatch.setattr(kernels, "_DECIDED", {})
    tiny = contrib(rng, hidden=52, heads=2, inter=104)  # head size 26: auto keeps contrib
    path = tmp_path / "model.onnx"
    onnx.save(tiny, path)
    decided = []
    real = kernels._choose
    monkeypatch.setattr(kernels, "_choose", lambda *a: decided.append(a) or real(*a))

    def open_it(model=tiny, seq=64):
        return choose(model, "auto", "cuda", seq, build=False, source=kernels.file_identity(str(path)))

    _, first = open_it()
    again_model, again = open_it()
    assert len(decided) == 1
    assert again.used == first.used == "ort" and again_model is tiny
    assert again.reason.startswith(first.reason) and "first session" in again.reason
    open_it(seq=128)
    assert len(decided) == 2  # another max_seq: another decision
    os.utime(path, ns=(1, 1))  # the file rewritten (a new mtime)
    open_it()
    assert len(decided) == 3
    onnx.save(contrib(rng, hidden=64, heads=2, inter=128), path)  # covered: needs the library
    for _ in range(2):
        _, choice = open_it(onnx.load(path))
        assert "not built" in choice.reason and "first session" not in choice.reason
    assert len(decided) == 5
    assert kernels.file_identity(tiny) is None
    assert kernels.file_identity(str(tmp_path / "missing.onnx")) is None


def test_a_model_on_bertfuse_attention_keeps_the_raw_mask(fp16_model, rng):
    """The key-length variants exist for ORT's Attention; BertAttention reads the raw mask as
    fast, so under 'auto' the lowered model adds no ReduceSum variant at any bucket length."""
    from bertfuse.runtime.variants import AUTO_KEYLEN_MIN_SEQ, VariantPolicy, has_own_attention

    lowered, _, _ = lower(fp16_model)
    assert has_own_attention(lowered) and not has_own_attention(fp16_model)
    partly = contrib(rng, hidden=264, heads=1, inter=528)  # kept contrib: Attention remains
    assert not has_own_attention(lower(partly)[0])
    own = VariantPolicy("auto", 0, True, own_attention=True)
    for kind in ("keylen", "nomask"):
        assert own.mode_for(kind, AUTO_KEYLEN_MIN_SEQ - 1) == "raw"
        assert own.mode_for(kind, AUTO_KEYLEN_MIN_SEQ) == "raw"
        # ORT's Attention keeps its key-length form from 128
        assert VariantPolicy("auto", 0, True).mode_for(kind, AUTO_KEYLEN_MIN_SEQ) == kind
    assert own.modes_used([32, 64, 128, 256]) == []
    assert VariantPolicy("keyseq", 0, True, own_attention=True).mode_for("keylen", 32) == "keyseq"
