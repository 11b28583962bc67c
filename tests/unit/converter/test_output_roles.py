"""Output roles: which source outputs become which canonical output, and what the mask checks
watch on each (per-token outputs at kept positions only, per-row outputs on kept rows)."""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.converter.frozen import canonical_output_name
from bertfuse.converter.source import per_token
from bertfuse.pipeline.mask import IDS, SEGMENTS, mask_rows, watched
from bertfuse.pipeline.parity import OutputParity, tolerance_for


@pytest.mark.parametrize("name,rank,canon", [
    ("last_hidden_state", 3, "sequence_output"),
    ("pooler_output", 2, "pooled_output"),
    ("logits", 2, "logits"),
    ("logits", 3, "token_logits"),  # token classification: [B, S, C]
    ("start_logits", 2, "start_logits"),  # not the `...logits` classifier's
    ("end_logits", 2, "end_logits"),
    ("bert/pooler/dense/Tanh", 2, "bert/pooler/dense/Tanh"),  # no alias: the name, case kept
    ("encoder_outputs_1", 3, "encoder_outputs_1"),  # a per-layer output keeps its name
])
def test_canonical_output_name(name, rank, canon):
    assert canonical_output_name(name, rank, set()) == canon


def test_per_token_roles():
    assert [n for n in ("sequence_output", "pooled_output", "logits", "token_logits",
                        "start_logits", "end_logits") if per_token(n)] == \
        ["sequence_output", "token_logits", "start_logits", "end_logits"]
    assert watched(["pooled_output", "sequence_output"]) == (["sequence_output"], True)
    assert watched(["end_logits", "start_logits"]) == (["end_logits", "start_logits"], True)
    assert watched(["logits"]) == (["logits"], False)


def _sets(shape, rng):
    """TF and ONNX outputs that agree; the perturbed runs move the padded positions only."""
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)
    base = rng.standard_normal(shape).astype(np.float32)
    moved = base.copy()
    moved[~mask.astype(bool)] += 0.4  # a padded token's own logits follow its segment id
    return mask, base, moved


@pytest.mark.parametrize("names,shape", [(["token_logits"], (2, 4, 5)),
                                         (["start_logits", "end_logits"], (2, 4))])
def test_token_heads_watched_at_kept_positions(names, shape):
    mask, base, moved = _sets(shape, np.random.default_rng(0))
    refs = {"base": {n: base for n in names}, "ids": {n: base for n in names},
            "segments": {n: moved for n in names}}
    cands = {k: dict(v) for k, v in refs.items()}
    rows = [OutputParity(*r) for r in mask_rows(mask, refs, cands, tolerance_for("fp32"))]
    assert [r.name for r in rows] == [IDS, SEGMENTS] and all(r.ok for r in rows), rows
    # A kept position moving is still caught, on any watched output.
    bad = moved.copy()
    bad[0, 0] += 0.3
    cands["segments"][names[-1]] = bad
    rows = [OutputParity(*r) for r in mask_rows(mask, refs, cands, tolerance_for("fp32"))]
    assert not rows[1].ok and rows[1].max_abs == pytest.approx(0.3, abs=1e-5), rows


def test_per_row_logits_still_watched_whole():
    """A classifier's [B, C] logits: a row whose [CLS] is kept may not move at all."""
    mask = np.array([[1, 1, 0, 0]], np.int32)
    base = np.zeros((1, 3), np.float32)
    refs = {"base": {"logits": base}, "segments": {"logits": base}}
    cands = {"base": {"logits": base}, "segments": {"logits": base + 0.1}}
    (row,) = [OutputParity(*r) for r in mask_rows(mask, refs, cands, tolerance_for("fp32"))]
    assert row.name == SEGMENTS and not row.ok and row.note.startswith("the ONNX model moves")


def _module_savedmodel(path, outputs):
    """A tf.Module whose serving signature returns `outputs` (name -> 'seq' | 'row')."""
    tf = pytest.importorskip("tensorflow")

    class Enc(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(np.random.default_rng(0).standard_normal((50, 8)),
                                     dtype=tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name=n)
                                      for n in ("input_word_ids", "input_mask",
                                                "input_type_ids")])
        def serve(self, input_word_ids, input_mask, input_type_ids):
            seq = tf.gather(self.table, input_word_ids) * tf.cast(
                input_mask + 0 * input_type_ids, tf.float32)[..., None]
            return {k: seq if v == "seq" else seq[:, 0] for k, v in outputs.items()}

    enc = Enc()
    tf.saved_model.save(enc, str(path), signatures={"serving_default": enc.serve})
    return str(path)


def test_outputs_without_a_role_keep_their_names(tmp_path):
    """An output that has no role is kept under its own name, not refused; TF Hub's per-layer
    `encoder_outputs` are still left out unless --outputs names them."""
    from bertfuse.converter import load_source

    path = _module_savedmodel(tmp_path / "m", {"sequence_output": "seq", "attn_probs": "seq",
                                               "encoder_outputs_0": "seq"})
    src = load_source(path, "savedmodel", "serving_default")
    assert sorted(src.outputs) == ["attn_probs", "sequence_output"]
    assert src.output_roles["attn_probs"] is None
    src = load_source(path, "savedmodel", "serving_default",
                      outputs=["sequence_output", "encoder_outputs_0"])
    assert sorted(src.outputs) == ["encoder_outputs_0", "sequence_output"]


def test_tfhub_extras_left_out(tmp_path):
    from bertfuse.converter import load_source

    path = _module_savedmodel(tmp_path / "m", {
        "sequence_output": "seq", "pooled_output": "row", "default": "row",
        "encoder_outputs_0": "seq", "encoder_outputs_1": "seq"})
    src = load_source(path, "savedmodel", "serving_default")
    assert sorted(src.outputs) == ["pooled_output", "sequence_output"]
