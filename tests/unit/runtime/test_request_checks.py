"""Request and argument checks (runtime/request_checks.py): refused before anything reaches ORT.
"""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.errors import BertfuseError  # noqa: E402
from bertfuse.runtime.request_checks import ConfigError, RequestError, unmask_empty_rows  # noqa: E402
from bertfuse.runtime.session import Session  # noqa: E402
from support.runtime_common import (BAD_REQUESTS, MAX_BATCH, MAX_SEQ, POSITIONS,  # noqa: E402
                            TYPE_VOCAB, _refuse_ort, _setitem, _valid, _with, new_session)


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


def test_unmask_empty_rows_copies_only_when_needed():
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.int32)
    assert unmask_empty_rows(mask) is mask
    holes = np.array([[0, 1, 0], [1, 0, 0]], np.int32)  # left padding, no empty row
    assert unmask_empty_rows(holes) is holes
    empty = np.array([[0, 0, 0], [0, 1, 1], [0, 0, 0]], np.int32)
    out = unmask_empty_rows(empty)
    assert out is not empty and (empty[[0, 2]] == 0).all()  # the caller's array untouched
    np.testing.assert_array_equal(out, [[1, 1, 1], [0, 1, 1], [1, 1, 1]])


@pytest.mark.parametrize("build,message", [c[1:] for c in BAD_REQUESTS],
                         ids=[c[0] for c in BAD_REQUESTS])
def test_cpu_refuses_bad_requests_before_ort(build, message, tiny_onnx, monkeypatch):
    s = Session(tiny_onnx["fp32"], max_batch=8, device="cpu")

    def fail(*args, **kw):
        raise AssertionError("a refused request reached onnxruntime")

    monkeypatch.setattr(s.session, "run", fail)
    with pytest.raises(RequestError, match=message):
        s.run(**build())


def test_narrow_negative_ids_are_refused(cpu):
    ids = np.ones((2, 4), np.int8)
    ids[1, 2] = -1  # 255 as uint8: under the vocabulary, but negative
    with pytest.raises(RequestError, match=r"input_ids values must be in \[0, 1000\)"):
        cpu.run(ids)


def test_bad_model_argument_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="missing.onnx: no such file"):
        Session(str(tmp_path / "missing.onnx"), device="cpu")
    with pytest.raises(ConfigError, match="model must be a path or an onnx.ModelProto"):
        Session(42, device="cpu")


BAD_WARMUPS = [([(0, 0)], r"warmup batch must be 1\.\.8 \(max_batch\), not 0"),
               ([(2, 0)], r"warmup seq must be 1\.\.128 \(max_seq\), not 0"),
               ([(MAX_BATCH + 1, 4)], r"warmup batch must be 1\.\.8"),
               ([(1, MAX_SEQ + 1)], r"warmup seq must be 1\.\.128"),
               ([(1.5, 4)], "warmup batch must be an integer"),
               ([(1, 2, 3)], r"must be a \(batch, seq\) pair"),
               ([4], r"must be a \(batch, seq\) pair"),
               ((2, 16), r"must be a \(batch, seq\) pair"),
               ("all", "must be a list of"), (8, "must be a list of")]


@pytest.mark.parametrize("buckets,message", BAD_WARMUPS, ids=[repr(b) for b, _ in BAD_WARMUPS])
def test_bad_warmup_arguments_are_refused(buckets, message, tiny_onnx):
    s = new_session(tiny_onnx["fp32"])
    with pytest.raises(ConfigError, match=message):
        s.warmup(buckets)
    with pytest.raises(ConfigError, match="packed must be True or False"):
        s.warmup([(1, 1)], packed="yes")
    assert not s._buckets  # nothing was made
