"""Progress during warm-up: a caller's callback, a rich bar on stderr, or nothing.

progress=None (the default) shows a transient bar when stderr is a terminal and the call is
on the main thread (pool replicas warm up on worker threads, side by side: they stay quiet);
True shows it wherever stderr is a terminal; False is quiet; a callable gets
(done, total, shape) after each step.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Iterator
import time

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn)

from bertfuse.runtime.request_checks import ConfigError
from bertfuse.io.quiet import user_stderr

Step = Callable[[tuple[int, int]], None]


def check_progress(progress: Any) -> None:
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        raise ConfigError(f"progress must be True, False or a callable, not {progress!r}")


@contextlib.contextmanager
def steps(progress: Any, total: int, what: str) -> Iterator[Step]:
    """A step(shape) function to call after each of `total` steps."""
    if callable(progress):
        done = [0]

        def call(shape: tuple[int, int]) -> None:
            done[0] += 1
            progress(done[0], total, shape)

        yield call
        return
    show = progress is not False and total > 1 and sys.stderr.isatty() and \
        (progress is True or threading.current_thread() is threading.main_thread())
    if not show:
        yield lambda shape: None
        return

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[shape]}"), console=Console(stderr=True),
                  transient=True) as bar:
        task = bar.add_task(what, total=total, shape="")
        yield lambda shape: bar.update(task, advance=1, shape=f"[{shape[0]}, {shape[1]}]")


# -- a command's stages -------------------------------------------------------------------

QUIET, NORMAL, VERBOSE = -1, 0, 1


class StageLines:
    """A command's progress on stderr, fit for a person and for a CI log alike: call it with
    each stage's name as the stage starts.

    Not a terminal (a pipe, a file, CI): one line as each stage ends, with its seconds and the
    seconds since the command began, `bertfuse convert: tf2onnx export 4.2s (7.3s in all)`.
    A stage that fails prints nothing: the command's one-line error says it. A terminal: a
    spinner naming the running stage with the elapsed time, cleared at the end. verbosity
    QUIET (-q): nothing; VERBOSE (-v): sub-steps too on a pipe, as they start. A message
    whose first word ends in ':' ("pass: gelu", "replica: 2/4 warm") is a sub-step.

        with StageLines("serve", verbosity) as say:   # or say.close(ok) at the end
            say("starting Ray")
            say("warming replicas")

    Thread-safe: replicas or workers may report from their own threads."""

    def __init__(self, command: str, verbosity: int = NORMAL, stream: Any = None,
                 tty: bool | None = None) -> None:
        if stream is None:
            stream = user_stderr()
        self.command, self.verbosity, self.stream = command, verbosity, stream
        self.tty = _isatty(stream) if tty is None else tty
        self._clock = time.perf_counter
        self._start = self._since = self._clock()
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None
        self._stage = ""  # the running stage, printed when it ends (not a terminal)

    def __call__(self, message: str) -> None:
        if self.verbosity <= QUIET:
            return
        sub = message.split(" ", 1)[0].endswith(":")
        with self._lock:
            if self.tty:
                self._spin(message)
            elif sub:
                if self.verbosity >= VERBOSE:
                    self._write(f"  {message}")
            else:
                self._end_stage()
                self._stage, self._since = message, self._clock()

    def _end_stage(self) -> None:
        if self._stage:
            now = self._clock()
            self._write(f"{self._stage} {now - self._since:.1f}s ({now - self._start:.1f}s "
                        f"in all)")
            self._stage = ""

    def _write(self, text: str) -> None:
        try:
            self.stream.write(f"bertfuse {self.command}: {text}\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed stderr: progress is never worth failing
            pass

    def _spin(self, message: str) -> None:
        if self._bar is None:
            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), transient=True,
                                 console=Console(file=self.stream))
            self._bar.start()
            self._task = self._bar.add_task(message, total=None)
        self._bar.update(self._task, description=f"[bold]{self.command}[/bold]: {message}")

    def close(self, ok: bool = True) -> None:
        """The end: the last stage's line (when it succeeded), or the spinner cleared."""
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None
            if ok:
                self._end_stage()
            self._stage = ""

    def __enter__(self) -> StageLines:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.close(ok=kind is None)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False
