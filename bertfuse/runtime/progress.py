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

from bertfuse.runtime.requests import ConfigError

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
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[shape]}"), console=Console(stderr=True),
                  transient=True) as bar:
        task = bar.add_task(what, total=total, shape="")
        yield lambda shape: bar.update(task, advance=1, shape=f"[{shape[0]}, {shape[1]}]")
