"""SessionOptions (runtime/options.py): every field checked before any work.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.errors import BertfuseError  # noqa: E402
from bertfuse.runtime.options import SessionOptions  # noqa: E402
from bertfuse.runtime.request_checks import ConfigError  # noqa: E402
from bertfuse.runtime.session import Session  # noqa: E402
from support.runtime_common import POSITIONS, new_session  # noqa: E402


BAD_SESSION_ARGS = [
    ({"max_batch": -1}, "max_batch must be at least 1, not -1"),
    ({"max_batch": 0}, "max_batch must be at least 1"),
    ({"max_batch": 2.5}, "max_batch must be an integer"),
    ({"max_batch": True}, "max_batch must be an integer"),
    ({"max_seq": 0}, r"max_seq must be 1\.\.128"),
    ({"max_seq": -4}, r"max_seq must be 1\.\.128"),
    ({"max_seq": "64"}, "max_seq must be an integer"),
    ({"max_seq": POSITIONS + 1}, "position table has 128 rows"),
    ({"batch_buckets": (0, 4)}, "each of batch_buckets must be at least 1, not 0"),
    ({"seq_buckets": (16, -8)}, "each of seq_buckets must be at least 1"),
    ({"seq_buckets": 64}, "seq_buckets must be a sequence of integers"),
    ({"batch_buckets": (2.0,)}, "each of batch_buckets must be an integer"),
    ({"token_steps": 0}, "token_steps must be at least 1"),
    ({"variant_min_seq": -1}, "variant_min_seq must be at least 0"),
    ({"pack_below_fill": -0.1}, "pack_below_fill must be a fraction"),
    ({"pack_below_fill": float("nan")}, "pack_below_fill must be a fraction"),
    ({"cuda_graph": "no"}, "cuda_graph must be True or False"),
    ({"validate": 0}, "validate must be True or False"),
    ({"provider_options": ["x"]}, "provider_options must be a mapping"),
    ({"right_padded": "left"}, "right_padded must be 'auto'"),
    ({"device": "tpu"}, "device must be 'cuda' or 'cpu'"),
]


@pytest.mark.parametrize("kw,message", BAD_SESSION_ARGS, ids=[str(k) for k, _ in BAD_SESSION_ARGS])
def test_bad_session_arguments_are_refused(kw, message, tiny_onnx, monkeypatch):
    def no_session(*args, **kwargs):
        raise AssertionError("an ORT session was made for bad arguments")

    monkeypatch.setattr(ort, "InferenceSession", no_session)  # refused before any work
    with pytest.raises(ConfigError, match=message) as info:
        new_session(tiny_onnx["fp32"], **kw)
    assert isinstance(info.value, BertfuseError) and isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_good_session_arguments_still_accepted(tiny_onnx):
    s = Session(onnx.load(tiny_onnx["fp32"]), max_batch=np.int64(2), seq_buckets=[16],
                batch_buckets=(1, 2, 64), device="cpu", pack_below_fill=1.01)
    assert (s.max_batch, s.max_seq) == (2, POSITIONS)  # max_seq: the position table
    assert s.batch_buckets == [1, 2] and s.seq_buckets == [16, POSITIONS]
    assert Session(tiny_onnx["raw"], max_batch=1, device="cpu").max_seq == POSITIONS


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


def test_intra_op_threads_size_each_cpu_sessions_pool(tmp_path):
    """intra_op_threads reaches ONNX Runtime: the session's options say it, and the threads
    its pool starts (N - 1 beside the caller's) appear in this process."""
    import psutil

    from bertfuse.passes.manager import run_passes
    from support.builders.onnx_graphs import bert

    fused, _ = run_passes(bert(np.random.default_rng(0), layers=1, hidden=32, heads=2, inter=64,
                               vocab=50, positions=16))
    onnx.save(fused, tmp_path / "m.onnx")
    threads = psutil.Process().num_threads
    for n in (1, 4):
        before = threads()
        s = Session(str(tmp_path / "m.onnx"), device="cpu", max_batch=2, intra_op_threads=n)
        try:
            assert s.sessions["raw"].get_session_options().intra_op_num_threads == n
            assert threads() - before == n - 1
        finally:
            s.close()
    for bad in (0, 2.5, True):
        with pytest.raises(ConfigError, match="intra_op_threads must be"):
            SessionOptions(device="cpu", intra_op_threads=bad)
