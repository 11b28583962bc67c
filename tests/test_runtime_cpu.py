"""The runtime on the CPU as users get it by default: each request at its own shape through
one ORT session (no buckets, no GPU-only mask variants), warm-up progress, SessionOptions.

Models: conftest's `tiny_onnx` (the ckpt_erf fixture converted by `bertfuse convert`).
Results are compared with a plain onnxruntime InferenceSession on the request as sent.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.runtime import ClosedError, ConfigError, RequestError, Session  # noqa: E402
from bertfuse.runtime.options import SessionOptions  # noqa: E402
from test_runtime import (BAD_REQUESTS, OUTPUTS, make_request, max_diff, plain_run,  # noqa: E402
                          plain_session)


@pytest.fixture(scope="module")
def cpu(tiny_onnx) -> Session:
    return Session(tiny_onnx["fp32"], max_batch=8, device="cpu")


@pytest.fixture(scope="module")
def reference(tiny_onnx):
    return plain_session(tiny_onnx["fp32"])


def test_cpu_defaults_run_each_request_at_its_own_shape(cpu, reference):
    assert list(cpu.sessions) == ["raw"] and not cpu.pad  # no variant sessions to build
    rng = np.random.default_rng(40)
    for batch, seq in ((4, 40), (1, 1), (8, 128), (3, 17)):
        feeds = make_request(rng, batch, seq)
        got = cpu.run(**feeds)
        assert got["sequence_output"].shape == (batch, seq, 128)
        assert cpu.bucket_for(batch, seq) == (batch, seq)
        # The same ORT session on the same shape as plain ORT: no padding changes the sums.
        assert max_diff(got, plain_run(reference, feeds), feeds["input_mask"]) <= 1e-6
    assert not cpu._buckets
    only = cpu.run(**make_request(rng, 2, 9), outputs="pooled_output")
    assert list(only) == ["pooled_output"]


def test_cpu_defaults_fill_missing_inputs_and_keep_device_outputs(cpu, reference):
    feeds = make_request(np.random.default_rng(41), 3, 11)
    ones = np.ones_like(feeds["input_mask"])
    want = plain_run(reference, {**feeds, "input_mask": ones,
                                 "segment_ids": np.zeros_like(ones)})
    assert max_diff(cpu.run(feeds["input_ids"].tolist()), want, ones) <= 1e-6
    dev = cpu.run(**feeds, to_host=False)
    assert (dev["batch"], dev["seq"]) == (3, 11)
    assert dev["sequence_output"].shape() == [3, 11, 128]
    got = {n: dev[n].numpy() for n in OUTPUTS}
    assert max_diff(got, plain_run(reference, feeds), feeds["input_mask"]) <= 1e-6
    cpu.replay_call(feeds["input_mask"])()  # the benchmarks' bare call runs here too


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


def test_warmup_progress(tiny_onnx, capsys):
    s = Session(tiny_onnx["fp32"], max_batch=4, max_seq=32, device="cpu")
    seen: list = []
    assert s.warmup(progress=lambda *a: seen.append(a)) == [(4, 32)]  # the largest request
    assert seen == [(1, 1, (4, 32))]
    seen.clear()
    s.warmup([(2, 5), (3, 7), (2, 5)], progress=lambda *a: seen.append(a))
    assert seen == [(1, 2, (2, 5)), (2, 2, (3, 7))]
    s.warmup([(1, 3), (2, 4)])  # default: a bar only on a terminal's stderr
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match="progress must be"):
        s.warmup(progress="yes")
    # Padded, the callback sees every bucket as it is made.
    p = Session(tiny_onnx["fp32"], max_batch=4, max_seq=32, batch_buckets=(2, 4),
                seq_buckets=(16,), device="cpu", pad_to_buckets=True)
    seen.clear()
    p.warmup(progress=lambda *a: seen.append(a))
    assert [a[2] for a in seen] == [(2, 16), (2, 32), (4, 16), (4, 32)]
    assert set(p._buckets) == {(2, 16), (2, 32), (4, 16), (4, 32)}
    s.close()
    with pytest.raises(ClosedError):
        s.warmup()


def test_session_options_object(tiny_onnx):
    opts = SessionOptions(max_batch=4, max_seq=32, device="cpu")
    s = Session(tiny_onnx["fp32"], opts)
    assert (s.max_batch, s.max_seq, s.options) == (4, 32, opts)
    s = Session(onnx.load(tiny_onnx["fp32"]), opts, max_batch=2)  # keywords override
    assert s.max_batch == 2 and s.options.max_seq == 32
    with pytest.raises(ConfigError, match="options must be a SessionOptions"):
        Session(tiny_onnx["fp32"], 8)
    with pytest.raises(TypeError):
        SessionOptions(max_batches=4)
    padded = Session(tiny_onnx["fp32"], opts, max_seq=128, pad_to_buckets=True,
                     mask_variants=True)
    assert padded.pad and len(padded.sessions) > 1  # asked for: the GPU's machinery on the CPU
    # Variants serve buckets only: asked for without padding, none are made.
    assert list(Session(tiny_onnx["fp32"], opts, mask_variants=True).sessions) == ["raw"]


@pytest.mark.parametrize("kw,message", [
    ({"pad_to_buckets": False}, "pad_to_buckets=False serves the CPU only"),
    ({"pad_to_buckets": "no"}, "pad_to_buckets must be True or False, or 'auto'"),
    ({"mask_variants": None}, "mask_variants must be True or False, or 'auto'"),
])
def test_bad_options_refused_before_any_session(kw, message, tiny_onnx, monkeypatch):
    def no_session(*args, **kwargs):
        raise AssertionError("an ORT session was made for bad arguments")

    monkeypatch.setattr(ort, "InferenceSession", no_session)
    with pytest.raises(ConfigError, match=message):
        Session(tiny_onnx["fp32"], device="cuda", **kw)
