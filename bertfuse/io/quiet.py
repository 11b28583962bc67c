"""Keep TensorFlow's and ONNX Runtime's native log lines off the user's terminal.

TF 2.21 writes some lines from C++ straight to file descriptor 2 whatever
TF_CPP_MIN_LOG_LEVEL says (absl's "All log messages before absl::InitializeLog()", oneDNN's
"custom operations are on", cpu_feature_guard), and ORT logs optimizer warnings the same way.
Only redirecting fd 2 itself silences them. The CLI does that around a command (not with
--debug) and prints its own one-line error after fd 2 is back.
"""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def native_stderr_silenced(enabled: bool = True) -> Iterator[None]:
    """fd 2 (and so sys.stderr's writes, TF's Python logger among them) goes to os.devnull
    inside the block, and Python warnings are ignored (a spinner's stderr proxy would print
    them on stdout); restored on every exit path."""
    if not enabled:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _fd2_to_devnull():
            yield


@contextmanager
def _fd2_to_devnull() -> Iterator[None]:
    _flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all (a daemon): nothing to protect
        yield
        return
    try:
        sink = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(sink, 2)
        finally:
            os.close(sink)
        yield
    finally:
        _flush()
        os.dup2(saved, 2)
        os.close(saved)


def _flush() -> None:
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
