"""Mask variants (runtime/variants.py): mask_mode, the variant each request takes, equality
with the raw mask, the auto policy, the per-bucket check that turns a misreading one off.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.runtime.variants import attention_mask_variant, mask_mode  # noqa: E402
from support.runtime_common import (KINDS, make_request, max_diff, new_session,  # noqa: E402
                            padded_mask, plain_run, plain_session, record_modes)


def test_mask_mode_classifies():
    ones = np.ones((3, 6), np.int32)
    assert mask_mode(ones) == "nomask"
    assert mask_mode(np.ones((1, 1), np.int32)) == "nomask"
    right = ones.copy()
    right[1, 4:] = 0
    right[2, 1:] = 0
    assert mask_mode(right) == "keylen"
    assert mask_mode(right[1:2]) == "keylen"
    hole = ones.copy()
    hole[1, 2:4] = 0
    assert mask_mode(hole) == "raw"
    left = ones.copy()
    left[2, :3] = 0
    assert mask_mode(left) == "raw"
    mixed = right.copy()
    mixed[0, 0] = 0  # left padding in one row, right padding in the others
    assert mask_mode(mixed) == "raw"
    empty_row = right.copy()
    empty_row[2] = 0  # a row with no key at all has no key length
    assert mask_mode(empty_row) == "raw"
    rng = np.random.default_rng(12)
    assert mask_mode(padded_mask(rng, 6, 10, ("right",))) == "keylen"
    assert mask_mode(padded_mask(rng, 6, 10, ("full", "right"))) == "keylen"
    assert mask_mode(padded_mask(rng, 6, 10, ("hole",))) == "raw"
    assert mask_mode(padded_mask(rng, 6, 10, ("left",))) == "raw"


def test_mask_mode_on_every_small_mask():
    """Against the definition, on every 0/1 mask of up to 8 cells: 'nomask' iff all ones,
    'keylen' iff every row is ones then zeros with at least one one."""
    import itertools

    for b, s in ((1, 1), (1, 5), (2, 3), (2, 4), (4, 2), (1, 8)):
        for bits in itertools.product((0, 1), repeat=b * s):
            mask = np.array(bits, np.int32).reshape(b, s)
            lengths = mask.sum(axis=1)
            right = all(r[:n].all() and not r[n:].any() and n > 0
                        for r, n in zip(mask, lengths))
            want = "nomask" if mask.all() else "keylen" if right else "raw"
            assert mask_mode(mask) == want, mask


MASK_CASES = [
    ("ones at a bucket shape", 4, 16, ("full",), "nomask"),
    ("ones off a bucket shape", 3, 10, ("full",), "keylen"),
    ("no mask at a bucket shape", 2, 32, None, "nomask"),
    ("no mask off a bucket shape", 5, 30, None, "keylen"),
    ("right-padded at a bucket shape", 4, 16, ("full", "right"), "keylen"),
    ("right-padded off a bucket shape", 5, 37, ("right",), "keylen"),
    ("holes", 4, 16, ("full", "hole"), "raw"),
    ("left padding", 3, 10, ("left", "full"), "raw"),
    ("every kind", 8, 128, KINDS, "raw"),
    ("batch 1 seq 8", 1, 8, ("full",), "nomask"),
    ("batch 1 seq 1 (bucket padded)", 1, 1, ("full",), "keylen"),
]


@pytest.mark.parametrize("name,batch,seq,kinds,expected", MASK_CASES,
                         ids=[c[0] for c in MASK_CASES])
def test_mask_variants_equal_raw_mask(name, batch, seq, kinds, expected, models, sessions):
    fast, slow = sessions["fp32"], sessions["fp32-raw"]
    assert list(slow.sessions) == ["raw"]
    rng = np.random.default_rng(13)
    feeds = make_request(rng, batch, seq, kinds or ("full",))
    if kinds is None:
        del feeds["input_mask"]
    log = record_modes(fast)
    try:
        got = fast.run(**feeds)
        used = log[-1]
    finally:
        fast.sessions = {m: r._inner for m, r in fast.sessions.items()}
    want = slow.run(**feeds)
    assert used == expected, f"{name}: ran the {used!r} variant"
    mask = feeds.get("input_mask", np.ones((batch, seq), np.int32))
    assert max_diff(got, want, mask) <= 1e-5, name


@pytest.mark.parametrize("name,batch,seq,kinds,expected", MASK_CASES[4:8],
                         ids=[c[0] for c in MASK_CASES[4:8]])
def test_keyseq_variant_equals_raw_mask(name, batch, seq, kinds, expected, models, sessions):
    """right_padded='keyseq': right-padded rows go to the [3B+2] form (lengths + row starts
    computed in the graph), which must equal the raw mask; other rows keep their path."""
    s = new_session(models["fp32"], right_padded="keyseq")
    assert set(s.sessions) == {"raw", "keyseq", "nomask"}
    feeds = make_request(np.random.default_rng(14), batch, seq, kinds)
    log = record_modes(s)
    got = s.run(**feeds)
    assert log[-1] == ("keyseq" if expected == "keylen" else expected)
    want = sessions["fp32-raw"].run(**feeds)
    assert max_diff(got, want, feeds["input_mask"]) <= 1e-5, name


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_auto_policy_splits_at_seq_128(precision, models):
    """Default right_padded='auto' (measured, docs/journal/gpu.md): for fp16 models the
    [3B+2] form below bucket length 128, [B] key lengths / no mask from 128. fp32 models
    keep the raw mask below 128 ([3B+2] selects the fast kernel in fp16 only)."""
    s = new_session(models[precision], max_batch=4)
    short = "keyseq" if precision == "fp16" else "raw"
    assert s.right_padded == "auto"
    assert set(s.sessions) == {"raw", "keylen", "nomask"} | {short}
    log = record_modes(s)
    rng = np.random.default_rng(20)
    for batch, seq, kinds, expected in ((4, 16, ("full",), short),
                                        (4, 64, ("right",), short),
                                        (4, 64, ("right", "hole"), "raw"),
                                        (2, 128, ("full",), "nomask"),
                                        (3, 100, ("full", "right"), "keylen"),
                                        (4, 128, ("right", "hole"), "raw")):
        s.run(**make_request(rng, batch, seq, kinds))
        assert log[-1] == expected, (batch, seq, kinds, log[-1])
    assert not s.variant_notes


def test_a_variant_that_misreads_the_mask_is_turned_off(models):
    """Each bucket checks its variants against the raw mask when it is made; one that gives
    other answers (here: a no-mask model standing in for the [3B+2] one, as happens when ORT
    picks a kernel that misreads that form) never serves a request."""
    s = new_session(models["fp32"], right_padded="keyseq")
    s.sessions["keyseq"] = s.sessions["nomask"]
    log = record_modes(s)
    feeds = make_request(np.random.default_rng(22), 4, 16, ("right",))
    feeds["input_mask"][:, -3:] = 0
    got = s.run(**feeds)
    assert log[-1] == "raw"
    assert list(s.variant_notes) == [(4, 16, "keyseq")]
    assert "vs the raw mask" in s.variant_notes[(4, 16, "keyseq")]
    want = new_session(models["fp32"], mask_variants=False).run(**feeds)
    assert max_diff(got, want, feeds["input_mask"]) == 0.0


def test_variant_min_seq_keeps_the_raw_mask_below_it(models):
    s = new_session(models["fp32"], max_batch=4, variant_min_seq=128)
    assert "keyseq" not in s.sessions  # no bucket below 128 can use it
    log = record_modes(s)
    rng = np.random.default_rng(21)
    s.run(**make_request(rng, 4, 64, ("right",)))
    assert log[-1] == "raw"
    s.run(**make_request(rng, 2, 128, ("right",)))
    assert log[-1] == "keylen"


def test_keylen_variant_needs_the_host_check(models):
    """keylen equals the raw mask for right padding and differs for a hole or left padding:
    the per-request host check (mask_mode) is what keeps it correct."""
    model = onnx.load(models["fp32"])
    raw = plain_session(model)
    keylen_model = attention_mask_variant(model, "keylen")
    nomask_model = attention_mask_variant(model, "nomask")
    assert keylen_model is not None and nomask_model is not None
    assert [i.name for i in keylen_model.graph.input] == [i.name for i in model.graph.input]
    assert [i.name for i in nomask_model.graph.input] == [i.name for i in model.graph.input]
    keylen, nomask = plain_session(keylen_model), plain_session(nomask_model)
    rng = np.random.default_rng(14)
    for batch, seq in ((4, 12), (1, 9), (8, 64)):
        right = make_request(rng, batch, seq, ("right", "full"))
        assert mask_mode(right["input_mask"]) == "keylen"
        assert max_diff(plain_run(keylen, right), plain_run(raw, right),
                        right["input_mask"]) <= 1e-5
        full = make_request(rng, batch, seq, ("full",))
        assert max_diff(plain_run(nomask, full), plain_run(raw, full),
                        full["input_mask"]) <= 1e-5
        for kinds in (("hole",), ("left",)):
            bad = make_request(rng, batch, seq, kinds)
            assert mask_mode(bad["input_mask"]) == "raw"
            d = max_diff(plain_run(keylen, bad), plain_run(raw, bad), bad["input_mask"])
            assert d > 1e-3, f"keylen variant ignored a {kinds[0]} mask ({d:.3g})"


def test_all_masked_row_takes_the_narrow_mask_forms(tiny_onnx):
    """Unmasked, the row is a full row: a request that is otherwise right-padded keeps its
    key-length variant instead of falling back to the raw mask."""
    s = new_session(tiny_onnx["fp32"], right_padded="keylen")
    log = record_modes(s)
    feeds = make_request(np.random.default_rng(32), 3, 12, ("right",))
    feeds["input_mask"][1] = 0
    s.run(**feeds)
    s.replay_call(feeds["input_mask"])()
    assert log[-2:] == ["keylen", "keylen"], log


def test_variant_policy_table():
    """VariantPolicy.mode_for against the documented table: 'auto' takes [3B+2] below bucket
    length 128 in fp16 only, the request's own kind from 128; min_seq keeps 'raw' below it."""
    from bertfuse.runtime.variants import AUTO_KEYLEN_MIN_SEQ, VariantPolicy

    fp16, fp32 = VariantPolicy("auto", 0, True), VariantPolicy("auto", 0, False)
    for kind in ("keylen", "nomask"):
        assert fp16.mode_for(kind, AUTO_KEYLEN_MIN_SEQ - 1) == "keyseq"
        assert fp32.mode_for(kind, AUTO_KEYLEN_MIN_SEQ - 1) == "raw"
        assert fp16.mode_for(kind, AUTO_KEYLEN_MIN_SEQ) == kind
        assert VariantPolicy("keyseq", 0, False).mode_for(kind, 16) == \
            ("keyseq" if kind == "keylen" else "nomask")
        assert VariantPolicy("keylen", 64, True).mode_for(kind, 32) == "raw"
    assert all(p.mode_for("raw", s) == "raw" for p in (fp16, fp32) for s in (8, 512))
    assert fp16.modes_used([32, 64, 128]) == ["keylen", "keyseq", "nomask"]
    assert fp32.modes_used([32, 64]) == []
    assert VariantPolicy("auto", 256, True).modes_used([32, 128]) == []
    # No mask in a larger bucket: the bucket's padded keys make every row right-padded.
    assert VariantPolicy.request_kind(None, (4, 16), (4, 16)) == "nomask"
    assert VariantPolicy.request_kind(None, (4, 16), (3, 16)) == "keylen"
    assert VariantPolicy.request_kind(np.ones((3, 16), np.int32), (4, 16), (3, 16)) == "keylen"
    assert VariantPolicy.request_kind(object(), (4, 16), (4, 16)) == "raw"  # a device mask
