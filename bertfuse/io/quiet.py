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
from typing import Any, Callable, Iterator, TextIO


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
def native_logs_silenced(enabled: bool = True) -> Iterator[None]:
    """The Python API's form: fd 2 to os.devnull inside the block (TF's and ORT's C++ lines),
    Python warnings left alone. Wrap a caller's callback in `let_through` so that what it
    prints to stderr still shows."""
    if not enabled:
        yield
        return
    with _fd2_to_devnull():
        yield


def let_through(fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """`fn` run with fd 2 as it was before the silencing (a user's progress callback)."""
    if fn is None:
        return None

    def call(*args: Any, **kwargs: Any) -> Any:
        if not _saved:
            return fn(*args, **kwargs)
        _flush()
        os.dup2(_saved[0], 2)
        try:
            return fn(*args, **kwargs)
        finally:
            _flush()
            sink = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(sink, 2)
            finally:
                os.close(sink)

    return call


_saved: list[int] = []  # fd 2 as it was before each silencing, outermost first
_streams: dict[int, TextIO] = {}  # a text stream on each, made on first use


def user_stderr() -> TextIO:
    """Where a progress line goes (runtime/progress.py): the process's own stderr, fd 2 as
    the command started (while fd 2 is silenced, the saved one), not a sys.stderr replaced
    in-process: a caller that captures sys.stderr for the one-line error gets that alone."""
    if not _saved:
        return sys.__stderr__ or sys.stderr
    fd = _saved[0]
    if fd not in _streams:
        _streams[fd] = os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8",
                                 errors="replace")
    return _streams[fd]


@contextmanager
def _fd2_to_devnull() -> Iterator[None]:
    _flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all (a daemon): nothing to protect
        yield
        return
    _saved.append(saved)
    try:
        sink = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(sink, 2)
        finally:
            os.close(sink)
        yield
    finally:
        _flush()
        _saved.remove(saved)
        stream = _streams.pop(saved, None)
        if stream is not None:
            stream.close()
        os.dup2(saved, 2)
        os.close(saved)


def _flush() -> None:
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
