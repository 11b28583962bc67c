"""Warm-up progress (runtime/progress.py).
"""

from __future__ import annotations

import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.runtime.request_checks import ClosedError, ConfigError  # noqa: E402
from bertfuse.runtime.session import Session  # noqa: E402


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


def test_progress_bar_on_a_terminal_only(monkeypatch):
    """progress=None: a bar on stderr when it is a terminal (a real pseudo-terminal here),
    nothing otherwise; on a worker thread only when asked for (progress=True)."""
    import os
    import pty
    import sys
    import threading

    from bertfuse.runtime.progress import steps

    master, slave = pty.openpty()
    tty = os.fdopen(slave, "w")
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.setenv("TERM", "xterm")

    def warm(progress) -> None:
        with steps(progress, 3, "warming up") as step:
            for k in range(3):
                step((k + 1, 8))
        tty.flush()

    def read() -> str:
        import select

        out = b""
        while select.select([master], [], [], 0.2)[0]:
            out += os.read(master, 65536)
        return out.decode(errors="replace")

    warm(None)
    assert "warming up" in read()
    warm(False)
    assert read() == ""
    worker = threading.Thread(target=warm, args=(None,))
    worker.start()
    worker.join(30)
    assert read() == ""  # pool replicas warm up side by side, quietly
    worker = threading.Thread(target=warm, args=(True,))
    worker.start()
    worker.join(30)
    assert "warming up" in read()
    tty.close()
    os.close(master)
