"""The serving runtime on the CPU EP: Session, mask variants, request validation, threads,
warm-up, weight stripping/refilling, and the GPU benchmark's host-side helpers.

The models are the ckpt_erf fixture converted by `bertfuse convert` (fp32, and with
`--precision fp16`), plus its raw tf2onnx form (`--no-fuse --no-verify`) for the weight
pipeline. Every comparison is against a plain onnxruntime InferenceSession on the same inputs:
sequence_output at valid (unmasked) positions, pooled_output everywhere.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

ort = pytest.importorskip("onnxruntime")

from bertfuse import cli  # noqa: E402
from bertfuse.errors import BertfuseError  # noqa: E402
from bertfuse.passes.manager import default_passes, run_passes  # noqa: E402
from bertfuse.bench import padded as bench  # noqa: E402
from bertfuse.bench.timing import compare, time_interleaved  # noqa: E402
from bertfuse.inputs import padded_request  # noqa: E402
from bertfuse.runtime.requests import RequestError  # noqa: E402
from bertfuse.runtime.router import Session  # noqa: E402
from bertfuse.runtime.variants import attention_mask_variant, mask_mode  # noqa: E402
from bertfuse.runtime.weights import (META_KEY, MIN_ELEMENTS, fill_weights,  # noqa: E402
                                      is_stripped, strip_weights)

VOCAB, TYPE_VOCAB, POSITIONS = 1000, 2, 128  # EXAMPLE_CONFIGS['tiny']
MAX_BATCH, MAX_SEQ = 8, 128
BATCH_BUCKETS, SEQ_BUCKETS = (1, 2, 4, 8), (8, 16, 32, 64)  # + the limit 128
TOL = {"fp32": 1e-5, "fp16": 1e-3}
KINDS = ("full", "right", "hole", "left")
OUTPUTS = ("sequence_output", "pooled_output")


# ------------------------------------------------------------------------------ helpers


def padded_mask(rng: np.random.Generator, batch: int, seq: int,
                kinds: tuple[str, ...] = KINDS) -> np.ndarray:
    """[batch, seq] int32: row r gets kinds[r % len(kinds)] padding (never an empty row;
    a kind a row is too short for falls back to a full row)."""
    mask = np.ones((batch, seq), np.int32)
    for r in range(batch):
        kind = kinds[r % len(kinds)]
        if kind == "right" and seq >= 2:
            mask[r, rng.integers(1, seq):] = 0
        elif kind == "hole" and seq >= 3:
            lo = int(rng.integers(1, seq - 1))
            mask[r, lo:int(rng.integers(lo + 1, seq))] = 0
        elif kind == "left" and seq >= 2:
            mask[r, :rng.integers(1, seq)] = 0
    return mask


def make_request(rng: np.random.Generator, batch: int, seq: int,
                 kinds: tuple[str, ...] = KINDS) -> dict[str, np.ndarray]:
    mask = padded_mask(rng, batch, seq, kinds)
    ids = rng.integers(1, VOCAB, size=(batch, seq)).astype(np.int32)
    ids[mask == 0] = 0
    segs = rng.integers(0, TYPE_VOCAB, size=(batch, seq)).astype(np.int32)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segs}


def plain_session(model: str | onnx.ModelProto):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def plain_run(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def max_diff(got: dict, want: dict, mask: np.ndarray) -> float:
    """Worst |diff|: sequence_output at valid positions, pooled_output everywhere."""
    worst = 0.0
    for name in OUTPUTS:
        assert got[name].shape == want[name].shape, (name, got[name].shape, want[name].shape)
        d = np.abs(got[name].astype(np.float64) - want[name])
        if d.ndim == 3:
            d = d[mask.astype(bool)]
        worst = max(worst, float(d.max()))
    return worst


def new_session(path: str, **kw) -> Session:
    """A CPU session with the GPU's machinery (buckets, mask variants), so CI exercises it."""
    kw = {"max_batch": MAX_BATCH, "max_seq": MAX_SEQ, "batch_buckets": BATCH_BUCKETS,
          "seq_buckets": SEQ_BUCKETS, "device": "cpu", "pad_to_buckets": True,
          "mask_variants": True, **kw}
    return Session(path, **kw)


class ModeRecorder:
    """Stands in for one of Session.sessions' InferenceSessions; records which one ran."""

    def __init__(self, inner, mode: str, log: list[str]):
        self._inner, self._mode, self._log = inner, mode, log

    def run_with_iobinding(self, *args, **kw):
        self._log.append(self._mode)
        return self._inner.run_with_iobinding(*args, **kw)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def record_modes(s: Session) -> list[str]:
    log: list[str] = []
    s.sessions = {mode: ModeRecorder(sess, mode, log) for mode, sess in s.sessions.items()}
    return log


def initializer_scales(model: onnx.ModelProto) -> set[str]:
    """LayerNorm scales, found independently of bertfuse: the op slot that reads them
    (contrib ops) or the TF name (raw graphs)."""
    slots = {("LayerNormalization", 1), ("SkipLayerNormalization", 2),
             ("EmbedLayerNormalization", 5)}
    names = {n.input[i] for n in model.graph.node for (op, i) in slots
             if n.op_type == op and len(n.input) > i}
    names |= {i.name for i in model.graph.initializer if "layernorm/gamma" in i.name.lower()}
    return names


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def models(tiny_onnx) -> dict[str, str]:
    """'fp32' / 'fp16' fused models and the 'raw' unfused graph, as paths."""
    return tiny_onnx


@pytest.fixture(scope="module")
def sessions(models) -> dict[str, Session]:
    """Module-wide runtime sessions: 'fp32', 'fp16' (mask variants on at every length, so the
    tests reach them below the GPU-measured default of seq 128), 'fp32-raw' (variants off)."""
    return {"fp32": new_session(models["fp32"], right_padded="keylen"),
            "fp16": new_session(models["fp16"], right_padded="keylen"),
            "fp32-raw": new_session(models["fp32"], mask_variants=False)}


@pytest.fixture(scope="module")
def references(models) -> dict:
    return {k: plain_session(models[k]) for k in ("fp32", "fp16")}


# ------------------------------------------------------------------- Session vs plain ORT


PARITY_SHAPES = [(1, 1), (MAX_BATCH, 1), (1, MAX_SEQ), (MAX_BATCH, MAX_SEQ), (3, 5), (5, 37),
                 (2, 64), (7, 3), (4, 8), (6, 100), (1, 17), (8, 2)]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_session_matches_plain_ort(precision, sessions, references):
    s, ref = sessions[precision], references[precision]
    assert list(s.sessions) == ["raw", "keylen", "nomask"]
    assert (s.max_batch, s.max_seq) == (MAX_BATCH, MAX_SEQ)
    rng = np.random.default_rng(10)
    buckets = set()
    for batch, seq in PARITY_SHAPES:
        # Batch 1: one request per padding kind, so the only row gets each of them.
        rotations = [KINDS[i:] + KINDS[:i] for i in range(len(KINDS))] if batch == 1 else [KINDS]
        for kinds in rotations:
            feeds = make_request(rng, batch, seq, kinds)
            got = s.run(**feeds)
            assert set(got) == set(OUTPUTS)
            assert got["sequence_output"].shape == (batch, seq, 128)
            assert got["pooled_output"].shape == (batch, 128)
            d = max_diff(got, plain_run(ref, feeds), feeds["input_mask"])
            assert d <= TOL[precision], f"{precision} [{batch}, {seq}] kinds {kinds}: {d:.3g}"
            buckets.add(s.bucket_for(batch, seq))
    assert len(buckets) >= 8, buckets  # the shapes really spread over the buckets
    assert {(1, 8), (8, 8), (1, 128), (8, 128)} <= buckets


def test_session_defaults_and_missing_inputs(sessions, references):
    """mask None = all ones; segment_ids None = zeros."""
    s, ref = sessions["fp32"], references["fp32"]
    rng = np.random.default_rng(11)
    feeds = make_request(rng, 3, 20)
    ones = np.ones_like(feeds["input_mask"])
    zeros = np.zeros_like(feeds["segment_ids"])
    got = s.run(feeds["input_ids"])
    want = plain_run(ref, {**feeds, "input_mask": ones, "segment_ids": zeros})
    assert max_diff(got, want, ones) <= TOL["fp32"]
    # int64 and Python lists are accepted too.
    got = s.run(feeds["input_ids"].astype(np.int64).tolist(),
                feeds["input_mask"].astype(np.int64), feeds["segment_ids"].astype(np.uint8))
    assert max_diff(got, plain_run(ref, feeds), feeds["input_mask"]) <= TOL["fp32"]


VIEW_BUG = ("BUG: on the CPU EP Session.run(to_host=True) returns views of the bucket's "
            "output OrtValues (OrtValue.numpy() shares memory for CPU tensors; session.py "
            "`host = value.numpy(); out[name] = host[:batch, :seq]`), so the next request in "
            "the same bucket, from this or any other thread, overwrites results already "
            "returned. Needs a .copy() (the CUDA path copies device->host and is unaffected)")


def test_results_survive_the_next_request(sessions):
    s = sessions["fp32"]
    rng = np.random.default_rng(21)
    a, b = make_request(rng, 3, 12), make_request(rng, 4, 16)  # same bucket (4, 16)
    assert s.bucket_for(3, 12) == s.bucket_for(4, 16)
    got_a = s.run(**a)
    kept = {k: v.copy() for k, v in got_a.items()}
    s.run(**b)
    for k in OUTPUTS:  # a returned array must not change under the caller
        np.testing.assert_array_equal(got_a[k], kept[k])


def test_to_host_false_gives_bucket_sized_device_values(sessions, references):
    s, ref = sessions["fp32"], references["fp32"]
    b = make_request(np.random.default_rng(22), 3, 12)
    dev = s.run(**b, to_host=False)
    assert (dev["batch"], dev["seq"]) == (3, 12)
    full = {k: dev[k].numpy() for k in OUTPUTS}
    assert full["sequence_output"].shape == (4, 16, 128) and full["pooled_output"].shape == (4, 128)
    got = {"sequence_output": full["sequence_output"][:3, :12].copy(),
           "pooled_output": full["pooled_output"][:3].copy()}
    assert max_diff(got, plain_run(ref, b), b["input_mask"]) <= TOL["fp32"]


def test_outputs_selects_what_is_returned(sessions, references):
    s, ref = sessions["fp32"], references["fp32"]
    b = make_request(np.random.default_rng(23), 3, 12)
    want = plain_run(ref, b)
    only = s.run(**b, outputs=["pooled_output"])
    assert list(only) == ["pooled_output"] and only["pooled_output"].shape == (3, 128)
    np.testing.assert_allclose(only["pooled_output"], want["pooled_output"], atol=TOL["fp32"])
    assert list(s.run(**b, outputs="sequence_output")) == ["sequence_output"]
    dev = s.run(**b, to_host=False, outputs=["pooled_output"])
    assert set(dev) == {"batch", "seq", "pooled_output"}
    for bad, message in ((["logits"], "no output 'logits'"), ([], "outputs is empty")):
        with pytest.raises(RequestError, match=message) as info:
            s.run(**b, outputs=bad)
        assert "pooled_output" in str(info.value)  # the message lists what there is


def test_replay_call_runs_what_run_would(models):
    """The benchmarks' bare replay: the same variant session and bucket run() uses."""
    s = new_session(models["fp32"], right_padded="keylen")
    log = record_modes(s)
    for kinds in (("right",), ("hole",)):
        b = make_request(np.random.default_rng(24), 3, 12, kinds)
        s.run(**b)
        s.replay_call(b["input_mask"])()
        assert log[-1] == log[-2], log


def test_session_rejects_bad_construction(models):
    with pytest.raises(BertfuseError, match="device must be 'cuda' or 'cpu'"):
        Session(models["fp32"], device="tpu")
    model = onnx.load(models["fp32"])
    model.graph.input[0].name = "ids"
    with pytest.raises(BertfuseError, match=r"model inputs \['ids'\]"):
        Session(model, device="cpu")


# ------------------------------------------------------------------------- mask variants


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


# (name, batch, seq, kinds or None for no mask, the variant the session must pick)
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
    """Default right_padded='auto' (measured, docs/benchmarks.md): for fp16 models the
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


# ---------------------------------------------------------------------- request validation


def _refuse_ort(monkeypatch, s: Session) -> None:
    def fail(*args, **kw):
        raise AssertionError("a refused request reached onnxruntime")

    for sess in s.sessions.values():
        monkeypatch.setattr(sess, "run_with_iobinding", fail)


def _valid(batch=2, seq=6):
    return make_request(np.random.default_rng(15), batch, seq, ("full", "right"))


def _with(**changes):
    def build():
        feeds = _valid()
        for role, fn in changes.items():
            feeds[role] = fn(feeds[role])
        return feeds
    return build


def _setitem(index, value):
    def fn(a):
        a = a.copy()
        a[index] = value
        return a
    return fn


BAD_REQUESTS = [  # (id, feeds builder, message regex)
    ("float ids", _with(input_ids=lambda a: a.astype(np.float32)),
     r"input_ids must be an integer array, got float32"),
    ("float mask", _with(input_mask=lambda a: a.astype(np.float64)),
     r"input_mask must be an integer array, got float64"),
    ("1-D ids", _with(input_ids=lambda a: a[0], input_mask=lambda a: a[0],
                      segment_ids=lambda a: a[0]),
     r"input_ids must be \[batch, seq\], got shape \(6,\)"),
    ("3-D ids", _with(input_ids=lambda a: a[None]), r"input_ids must be \[batch, seq\]"),
    ("mask shorter than ids", _with(input_mask=lambda a: a[:, :-1]),
     r"input_mask has shape \(2, 5\), input_ids \(2, 6\)"),
    ("segments with another batch", _with(segment_ids=lambda a: a[:1]),
     r"segment_ids has shape \(1, 6\), input_ids \(2, 6\)"),
    ("batch > max_batch", lambda: _valid(MAX_BATCH + 1, 4), rf"batch 9 outside 1\.\.{MAX_BATCH}"),
    ("empty batch", lambda: _valid(0, 4), r"batch 0 outside"),
    ("empty sequence", _with(input_ids=lambda a: a[:, :0], input_mask=lambda a: a[:, :0],
                             segment_ids=lambda a: a[:, :0]), r"sequence length 0 outside"),
    ("ids >= vocab", _with(input_ids=_setitem((1, 2), VOCAB)),
     r"input_ids values must be in \[0, 1000\), got 0\.\.1000"),
    ("negative ids", _with(input_ids=_setitem((0, 0), -1)),
     r"input_ids values must be in \[0, 1000\), got -1\.\."),
    ("huge int64 ids", _with(input_ids=lambda a: _setitem((0, 1), 2**32 + 5)(
        a.astype(np.int64))), r"input_ids values must be in \[0, 1000\)"),
    ("segment ids >= type vocab", _with(segment_ids=_setitem((1, 0), TYPE_VOCAB)),
     r"segment_ids values must be in \[0, 2\)"),
    ("negative segment ids", _with(segment_ids=_setitem((1, 0), -1)),
     r"segment_ids values must be in \[0, 2\)"),
    ("mask value 2", _with(input_mask=_setitem((0, 3), 2)),
     r"input_mask values must be in \[0, 2\)"),
    ("mask value -1", _with(input_mask=_setitem((1, 5), -1)),
     r"input_mask values must be in \[0, 2\)"),
]


@pytest.mark.parametrize("build,message", [c[1:] for c in BAD_REQUESTS],
                         ids=[c[0] for c in BAD_REQUESTS])
def test_bad_request_is_refused_before_ort(build, message, models, monkeypatch):
    assert issubclass(RequestError, ValueError) and issubclass(RequestError, BertfuseError)
    s = new_session(models["fp32"])
    _refuse_ort(monkeypatch, s)
    with pytest.raises(RequestError, match=message):
        s.run(**build())
    assert not s._buckets  # not even a bucket was made for it


@pytest.mark.parametrize("build,message", [c[1:] for c in BAD_REQUESTS if "values" in c[2]],
                         ids=[c[0] for c in BAD_REQUESTS if "values" in c[2]])
def test_bad_values_refused_in_a_warm_bucket(build, message, models, monkeypatch):
    """Warm buckets check host values once staged (one reduction): still refused before ORT."""
    s = new_session(models["fp32"])
    s.warmup()
    _refuse_ort(monkeypatch, s)
    with pytest.raises(RequestError, match=message):
        s.run(**build())


def test_seq_limits_are_refused_before_ort(models, monkeypatch):
    # The caller's max_seq ...
    s = new_session(models["fp32"], max_seq=64)
    _refuse_ort(monkeypatch, s)
    with pytest.raises(RequestError, match=r"sequence length 65 outside 1\.\.64"):
        s.run(**_valid(2, 65))
    # ... and the model's position table (128): the default, and a limit on what is asked.
    with pytest.raises(BertfuseError, match="position table has 128 rows"):
        new_session(models["fp32"], max_seq=512)
    s = new_session(models["fp32"], max_seq=None, seq_buckets=(32, 256, 512))
    assert s.max_seq == POSITIONS and s.seq_buckets == [32, POSITIONS]
    _refuse_ort(monkeypatch, s)
    with pytest.raises(RequestError, match=r"sequence length 129 outside 1\.\.128"):
        s.run(**_valid(2, POSITIONS + 1))
    assert not s._buckets


def test_raw_model_seq_beyond_positions_is_refused(models, monkeypatch):
    s = new_session(models["raw"], max_seq=None, seq_buckets=(32, 512))
    assert s.max_seq == POSITIONS  # read off the raw graph's position table
    _refuse_ort(monkeypatch, s)
    with pytest.raises(RequestError):
        s.run(**_valid(2, POSITIONS + 1))


def test_raw_model_segment_ids_beyond_type_vocab_are_refused(models, monkeypatch):
    s = new_session(models["raw"])
    _refuse_ort(monkeypatch, s)
    with pytest.raises(RequestError, match="segment_ids"):
        s.run(**_with(segment_ids=_setitem((1, 0), TYPE_VOCAB))())


# --------------------------------------------------------------------------- concurrency


def _thread_requests(seed: int, batch_for_thread=None) -> list[dict]:
    """200 mixed-shape requests (every padding kind, some without a mask); request i belongs
    to thread i % 4. With batch_for_thread, thread k's batches come from its own range."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(200):
        lo, hi = batch_for_thread[i % 4] if batch_for_thread else (1, 4)
        batch, seq = int(rng.integers(lo, hi + 1)), int(rng.integers(1, 17))  # small: 2-CPU CI
        kinds = (KINDS, ("full",), ("full", "right"), ("hole", "left"))[(i // 4) % 4]
        feeds = make_request(rng, batch, seq, kinds)
        if i % 7 == 0:
            del feeds["input_mask"]
        reqs.append(feeds)
    return reqs


def _run_threads(s: Session, reqs: list[dict], copy_results: bool) -> list:
    got: list = [None] * len(reqs)
    errors: list = []
    barrier = threading.Barrier(4)

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for i in range(k, len(reqs), 4):  # interleaved: shapes and variants mix
                out = s.run(**reqs[i])
                got[i] = {n: v.copy() for n, v in out.items()} if copy_results else out
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(g is not None for g in got)
    return got


def _assert_same(got: list, want: list) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        for name in OUTPUTS:
            np.testing.assert_allclose(g[name], w[name], atol=1e-6, rtol=0,
                                       err_msg=f"request {i} {name}")


def test_threads_match_sequential(sessions):
    """4 threads x 50 mixed-shape requests sharing buckets, results read after all ran."""
    s = sessions["fp32"]
    reqs = _thread_requests(16)
    want = [{n: v.copy() for n, v in s.run(**f).items()} for f in reqs]
    _assert_same(_run_threads(s, reqs, copy_results=False), want)


def test_threads_match_sequential_own_buckets(sessions):
    """The same with each thread in its own batch bucket and copying what it gets at once,
    which the view bug above cannot disturb: the lock, the bucket table and the variant
    sessions under concurrent callers."""
    s = sessions["fp32"]
    ranges = [(1, 1), (2, 2), (3, 4), (5, 8)]
    assert len({s.bucket_for(hi, 1)[0] for _, hi in ranges}) == 4
    reqs = _thread_requests(17, ranges)
    want = [{n: v.copy() for n, v in s.run(**f).items()} for f in reqs]
    _assert_same(_run_threads(s, reqs, copy_results=True), want)


def test_pool_replicas_match_one_session(models, sessions):
    """SessionPool: 4 threads on 2 replicas give one session's results; every bucket a
    replica makes under load is made while no other request runs (the capture gate)."""
    from bertfuse.runtime.device import GATE
    from bertfuse.runtime.pool import SessionPool

    made: list[tuple[int, bool]] = []
    ran_on: set[str] = set()

    def make() -> Session:
        s = new_session(models["fp32"], right_padded="keylen")
        inner_bucket, inner_run = s._new_bucket, s.run

        def watched(batch: int, seq: int):
            made.append((GATE._running, GATE._capturing))
            return inner_bucket(batch, seq)

        def run(*args, **kwargs):
            ran_on.add(threading.current_thread().name)
            return inner_run(*args, **kwargs)

        s._new_bucket, s.run = watched, run
        return s

    with SessionPool(make, replicas=2) as pool:
        reqs = _thread_requests(18)
        want = [{n: v.copy() for n, v in sessions["fp32"].run(**f).items()} for f in reqs]
        _assert_same(_run_threads(pool, reqs, copy_results=False), want)
    assert len(made) >= 2 and all(m == (0, True) for m in made), made
    assert ran_on == {"bertfuse-replica-0", "bertfuse-replica-1"}  # the workers, both of them


def test_pool_device_outputs_only_inside_the_replicas_turn(models):
    from bertfuse.runtime.pool import SessionPool

    feeds = make_request(np.random.default_rng(3), 2, 5)
    with SessionPool(lambda: new_session(models["fp32"]), replicas=1) as pool:
        with pytest.raises(ValueError, match="outlive"):
            pool.run(**feeds, to_host=False)
        shape = pool.call(lambda s: s.run(**feeds, to_host=False)["sequence_output"].shape())
        assert shape[:2] == list(new_session(models["fp32"]).bucket_for(2, 5))
        bad = dict(feeds, input_ids=feeds["input_ids"] + VOCAB)  # refused on the worker ...
        with pytest.raises(RequestError, match="input_ids values"):
            pool.run(**bad)
        assert set(pool.run(**feeds)) == set(OUTPUTS)  # ... which goes on serving
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(**feeds)
    with pytest.raises(ValueError, match="at least 1"):
        SessionPool(lambda: new_session(models["fp32"]), replicas=0)
    with pytest.raises(BertfuseError, match="must be 'auto'"):  # make() fails on its worker
        SessionPool(lambda: new_session(models["fp32"], right_padded="left"), replicas=2)


def test_a_graph_session_serves_one_thread(models):
    """With CUDA graphs (ORT keeps them per thread) a second thread is refused, clearly."""
    from bertfuse.runtime.device import ThreadError

    s = new_session(models["fp32"])
    s.cuda_graph = True  # the CPU EP has no graphs: only the thread check is under test
    feeds = make_request(np.random.default_rng(4), 2, 5)
    s.run(**feeds)
    errors: list = []
    t = threading.Thread(target=lambda: errors.append(_raises(lambda: s.run(**feeds))))
    t.start()
    t.join(30)
    assert isinstance(errors[0], ThreadError) and "SessionPool" in str(errors[0])
    s.run(**feeds)  # the owner thread still runs


def _raises(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:
        return exc
    return None


def test_capture_gate_waits_for_running_requests_and_blocks_new_ones():
    from bertfuse.runtime.device import CaptureGate

    gate = CaptureGate()
    a_inside, a_release, log = threading.Event(), threading.Event(), []

    def holder() -> None:
        with gate.running():
            a_inside.set()
            a_release.wait(10)
            log.append("a done")

    def capturer() -> None:
        with gate.running():
            with gate.capturing():
                log.append("capture start")
                c.start()  # a new request must wait for the capture to end
                threading.Event().wait(0.1)
                log.append("capture end")

    def newcomer() -> None:
        with gate.running():
            log.append("c ran")

    a, b, c = (threading.Thread(target=f) for f in (holder, capturer, newcomer))
    a.start()
    assert a_inside.wait(10)
    b.start()
    threading.Event().wait(0.1)
    assert log == []  # the capture waits for the running request
    a_release.set()
    for t in (a, b):
        t.join(10)
    c.join(10)
    assert log == ["a done", "capture start", "capture end", "c ran"]


def test_capture_gate_two_capturers_inside_requests_do_not_deadlock():
    from bertfuse.runtime.device import CaptureGate

    gate = CaptureGate()
    barrier, done = threading.Barrier(2), []

    def both() -> None:
        with gate.running():
            barrier.wait(10)  # both are running before either captures
            with gate.capturing():
                assert gate._running == 0
                done.append(1)

    threads = [threading.Thread(target=both) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert done == [1, 1] and gate._running == 0 and not gate._capturing


def test_capture_gate_nests():
    """Nested runs count once; a capture inside a capture, or a run inside a capture (a
    bucket verifying itself), passes through instead of waiting on its own thread."""
    from bertfuse.runtime.device import CaptureGate

    gate = CaptureGate()
    with gate.running():
        with gate.running():
            assert gate._running == 1
            with gate.capturing():
                assert gate._running == 0 and gate._capturing
                with gate.capturing(), gate.running():
                    assert gate._running == 0
            assert gate._running == 1 and not gate._capturing
    assert gate._running == 0


# -------------------------------------------------------------------------------- warm-up


def test_warmup_creates_every_bucket_and_nothing_after(models):
    s = Session(models["fp32"], max_batch=MAX_BATCH, max_seq=64, device="cpu",
                pad_to_buckets=True)
    assert s.batch_buckets == [1, 2, 4, 8] and s.seq_buckets == [32, 64]
    assert s.cuda_graph is False
    assert not s._buckets
    s.run(**_valid(3, 10))
    assert set(s._buckets) == {(4, 32)}  # lazily: only the request's bucket
    s.warmup()
    every = set(itertools.product(s.batch_buckets, s.seq_buckets))
    assert set(s._buckets) == every
    before = {k: (id(b), b.packed.data_ptr(), {n: v.data_ptr() for n, v in b.outputs.items()})
              for k, b in s._buckets.items()}
    rng = np.random.default_rng(17)
    shapes = [(1, 1), (MAX_BATCH, 64), (3, 33), (8, 1), (1, 64), (5, 32), (2, 63)]
    shapes += [(int(rng.integers(1, 9)), int(rng.integers(1, 65))) for _ in range(20)]
    for i, (batch, seq) in enumerate(shapes):
        feeds = make_request(rng, batch, seq, (KINDS, ("full",), ("right",))[i % 3])
        s.run(**feeds)
        assert len(s._buckets) == len(every), (batch, seq)
    after = {k: (id(b), b.packed.data_ptr(), {n: v.data_ptr() for n, v in b.outputs.items()})
             for k, b in s._buckets.items()}
    assert after == before  # the same buffers: nothing reallocated after warm-up


def test_warmup_of_given_buckets(models):
    s = new_session(models["fp32"])
    s.warmup([(2, 16), (8, 128)])
    assert set(s._buckets) == {(2, 16), (8, 128)}
    s.run(**_valid(2, 9))  # (2, 16)
    assert len(s._buckets) == 2


# -------------------------------------------------------------------------------- weights


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
    assert keys | {META_KEY} == {p.key for p in stripped.metadata_props}
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
    assert json.loads(out) == {"output": str(skel), "stripped": 11}
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
    fused, report = run_passes(copy.deepcopy(skeleton), default_passes("fp32"))
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


# ----------------------------------------------------------------------- bench (host side)


def test_bench_request_shapes_and_padding():
    for batch, seq in ((1, 2), (20, 64), (32, 128), (3, 7), (16, 1)):
        r = padded_request(batch, seq, VOCAB, seed=4)
        assert set(r) == {"input_ids", "input_mask", "segment_ids"}
        for v in r.values():
            assert v.shape == (batch, seq) and v.dtype == np.int32
        ids, mask, seg = r["input_ids"], r["input_mask"], r["segment_ids"]
        assert ids.min() >= 1 and ids.max() < VOCAB
        assert mask_mode(mask) in ("keylen", "nomask")  # right padding only
        lengths = mask.sum(1)
        assert (lengths >= seq // 2).all() and (lengths >= 1).all()
        assert (seg[:, : seq // 2] == 0).all() and (seg[:, seq // 2:] == 1).all()
        again = padded_request(batch, seq, VOCAB, seed=4)
        assert all(np.array_equal(r[k], again[k]) for k in r)
    a, b = padded_request(8, 64, VOCAB, seed=1), padded_request(8, 64, VOCAB, seed=2)
    assert not np.array_equal(a["input_ids"], b["input_ids"])
    padded = padded_request(32, 128, VOCAB, seed=1)["input_mask"]
    assert (padded == 0).any()  # the benchmark's rows really are padded


def test_bench_compare_only_counts_valid_positions():
    rng = np.random.default_rng(19)
    mask = padded_mask(rng, 4, 10, ("full", "right"))
    ref = {"sequence_output": rng.standard_normal((4, 10, 8)),
           "pooled_output": rng.standard_normal((4, 8))}
    outs = {k: v.astype(np.float32).astype(np.float64) for k, v in ref.items()}
    outs["sequence_output"][mask == 0] = 1e6  # garbage in the padding is not a difference
    outs["extra"] = np.zeros(3)  # an output with no reference is ignored
    worst, mean = compare(outs, ref, mask)
    assert worst < 1e-6 and mean < 1e-6
    r, c = np.argwhere(mask == 1)[-1]
    outs["sequence_output"][r, c, 3] += 0.5
    worst, _ = compare(outs, ref, mask)
    assert worst == pytest.approx(0.5, abs=1e-6)
    outs["sequence_output"][r, c, 3] -= 0.5
    outs["pooled_output"][3, 0] += 0.25  # 2-D outputs count everywhere
    worst, mean = compare(outs, ref, mask)
    assert worst == pytest.approx(0.25, abs=1e-6)
    assert mean == pytest.approx((0.25 / 32) / 2, rel=1e-3)
    del outs["sequence_output"]  # a missing output is skipped, not an error
    assert compare(outs, ref, mask)[0] == pytest.approx(0.25, abs=1e-6)


def test_bench_format_table():
    R = bench.Result
    results = [R("base b1 s128", "ORT raw fp32", 400.0, 500.0, 2500.0, 0.0, 0.0),
               R("base b1 s128", "bertfuse fp16 plain session", 150.0, 170.0, 6666.7, 1e-3,
                 1e-4, note="memcpy nodes: 0"),
               R("base b1 s128", "bertfuse fp16 runtime (arena + CUDA graph)", 100.0, 120.0,
                 10000.0, 2e-3, 2e-4, note="CUDA graph"),
               R("large b1 s128", "ORT bert_tf fp16", note="failed: out of memory"),
               R("large b1 s128", "bertfuse fp16 runtime (arena + CUDA graph)", 300.0, 330.0,
                 3333.3, 1e-3, 1e-4)]
    lines = bench.format_table(results).splitlines()
    assert len(lines) == 2 + len(results)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:6] == ["workload", "variant", "p50 (us)", "p99 (us)", "seq/s", "x bertfuse"]
    assert lines[1].count("---") == len(header)
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]
    assert all(len(row) == len(header) for row in rows)
    assert [(row[0], row[1]) for row in rows] == [(r.workload, r.variant) for r in results]
    ratio = [row[5] for row in rows]
    assert ratio == ["4.00", "1.50", "1.00", "nan", "1.00"]
    assert rows[0][2] == "400.0" and rows[0][4] == "2,500"
    assert rows[2][6] == "2.00e-03" and rows[2][8] == "CUDA graph"
    assert rows[3][8] == "failed: out of memory"


def test_time_interleaved_alternates_and_counts():
    calls: list[str] = []
    fns = {name: (lambda n=name: calls.append(n)) for name in ("a", "b", "c")}
    timed = time_interleaved(fns, iters=40, rounds=4, warmup=2)
    assert set(timed) == {"a", "b", "c"}
    assert all(p50 >= 0 and p99 >= p50 for p50, p99 in timed.values())
    timed_calls = calls[6:]  # after 2 warm-up calls each
    assert len(timed_calls) == 3 * 40
    # Rounds alternate: a x10, b x10, c x10, then a again.
    assert timed_calls[:10] == ["a"] * 10 and timed_calls[10:20] == ["b"] * 10
    assert timed_calls[30:40] == ["a"] * 10


def test_staging_falls_back_to_numpy_without_cuda():
    from bertfuse.runtime.device import staging

    host = staging((3, 2, 4), pinned=False)
    assert host.shape == (3, 2, 4) and host.dtype == np.int32 and not host.any()
    pinned = staging((3, 2, 4), pinned=True)  # page-locked where libcudart exists
    assert pinned.shape == (3, 2, 4) and not pinned.any()


def test_bench_refuses_a_missing_skeleton_in_one_line(tmp_path, capsys):
    """`bertfuse bench` is an ordinary subcommand: argparse, one stderr line, exit 2."""
    assert cli.main(["bench", "--skeletons", str(tmp_path), "--packed"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "no skeleton for base, large, shenma-3l" in err[0], cap.err
    assert not cap.out
    assert cli.main(["bench", "--skeletons", str(tmp_path), "--iters", "x"]) == 2
    assert "--iters" in capsys.readouterr().err
