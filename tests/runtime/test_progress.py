"""Warm-up progress (runtime/progress.py).
"""

from __future__ import annotations

import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.runtime.requests import ClosedError, ConfigError  # noqa: E402
from bertfuse.runtime.router import Session  # noqa: E402


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
