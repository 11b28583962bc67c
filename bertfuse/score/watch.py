"""The stall watchdog: Ray Data's blocks read on a thread of their own, the driver waiting for
each with a limit; past it the run is cancelled and the job reruns what is left (job.py).

    consumer thread: ds.iter_batches ─► queue (2 blocks) ─► watched() ─► gather (driver)
                                                              │ no block for `limit` s
                                                              ▼
                                  the run's StreamingExecutor shut down (its actors killed),
                                  Stalled raised: job.py reruns the parts not yet committed

A lost node that Ray Data never reports (its actors waiting for resources, a block whose
object went with the node) is otherwise an endless wait without an error. The limit (StallClock)
is the user's, or one derived from the job's own waits. No Ray import at module level.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

from bertfuse.io.quiet import user_stderr

# The limits: a wait for the next block longer than STALL_FACTOR x the longest wait seen so
# far between two blocks of this job, and never shorter than STALL_FLOOR_S (or the user's
# stall_s instead); a run's first block (its actors starting: the model loaded, warmed) gets
# at least STARTUP_FACTOR x the longest start-up seen, or STARTUP_S before any block came back.
STALL_FLOOR_S = 120.0
STALL_FACTOR = 10.0
STARTUP_FACTOR = 3.0
STARTUP_S = 600.0
_POLL_S = 0.5  # how often the waiting driver looks at the clock
_JOIN_S = 30.0  # the consumer's own unwinding once cancelled (Ray Data's shutdown: ~2 s)


class Stalled(Exception):
    """No block reached the driver for `waited` seconds (the limit: `limit`)."""

    def __init__(self, waited: float, limit: float, first: bool) -> None:
        since = " since the run started" if first else ""
        super().__init__(f"no rows came back for {waited:.0f} s{since} (stall limit "
                         f"{limit:.0f} s)")
        self.waited, self.limit, self.first = waited, limit, first


class StallClock:
    """The limit on one wait for a block: between two blocks `fixed` seconds, or (None) one
    derived from the waits observed across the job's attempts; a run's first block gets the
    start-up allowance on top (never less than the limit between blocks)."""

    def __init__(self, fixed: float | None = None) -> None:
        self.fixed = fixed
        self.startup = 0.0  # longest wait for an attempt's first block
        self.gap = 0.0  # longest wait between two blocks of one attempt
        self.seen = False  # any block came back in this job

    def limit(self, first: bool) -> float:
        between = self.fixed if self.fixed is not None else \
            max(STALL_FLOOR_S, STALL_FACTOR * self.gap)
        if not first:
            return between
        return max(between, STARTUP_FACTOR * self.startup if self.seen else STARTUP_S)

    def waited(self, seconds: float, first: bool) -> None:
        if first:
            self.startup = max(self.startup, seconds)
        else:
            self.gap = max(self.gap, seconds)
        self.seen = True


_STARTED: dict[int, list] = {}  # id(a watched run's DataContext) -> its executors, as they start


class CaptureExecutor:
    """A Ray Data execution callback (DataContext.custom_execution_callback_classes) that
    notes each StreamingExecutor started with a watched dataset's context. Defined here, not
    in the closure of a run, since the context (and so this class) is pickled to Ray's
    workers: by reference, never with an executor inside. Every other callback is a no-op."""

    def before_execution_starts(self, executor: Any) -> None:
        found = _STARTED.get(id(getattr(executor, "_data_context", None)))
        if found is not None:
            found.append(executor)

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


def capture_executor(ds: Any) -> list:
    """A list that gets the StreamingExecutor of `ds`'s run as it starts (Ray Data's execution
    callbacks, on this dataset's context only; release() it after the run); stays empty
    where this Ray lacks them."""
    ctx = ds.context
    found = _STARTED.setdefault(id(ctx), [])
    if hasattr(ctx, "custom_execution_callback_classes") and \
            CaptureExecutor not in ctx.custom_execution_callback_classes:
        ctx.custom_execution_callback_classes = [*ctx.custom_execution_callback_classes,
                                                 CaptureExecutor]
    return found


def release(ds: Any) -> None:
    _STARTED.pop(id(ds.context), None)


def cancel(ds: Any, executors: list) -> None:
    """The run of `ds` shut down now, its tasks cancelled and its actors killed (their CPUs
    and GPUs free for the rerun): Ray Data's own shutdown of a run, as on an error."""
    for ex in [*executors, getattr(ds, "_current_executor", None)]:
        if ex is not None:
            try:
                ex.shutdown(force=True)
            except Exception:  # noqa: BLE001  (a run that ended on its own meanwhile)
                pass


def watched(ds: Any, clock: StallClock, open_blocks: Callable[[], Iterator[Any]],
            now: Callable[[], float] = time.monotonic) -> Iterator[Any]:
    """The blocks of `open_blocks()` (ds.iter_batches), read on a consumer thread; a wait for
    one past clock.limit() cancels the run and raises Stalled. An error of the run is raised
    here as the iterator raised it. On every exit (the end, an error, a stall, close()) the
    run is over and its consumer gone (or, stuck in Ray, left behind as a daemon)."""
    executors = capture_executor(ds)
    got: queue.Queue = queue.Queue(maxsize=2)  # the driver behind: Ray Data's backpressure
    stop = threading.Event()

    def put(item: tuple) -> bool:
        while not stop.is_set():
            try:
                got.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def consume() -> None:
        blocks = None
        try:
            blocks = iter(open_blocks())
            for block in blocks:
                if not put(("block", block)):
                    return
            put(("end", None))
        except BaseException as exc:  # noqa: BLE001  (handed to the driver, raised there)
            put(("error", exc))
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001
                    pass

    thread = threading.Thread(target=consume, name="bertfuse-score-blocks", daemon=True)
    thread.start()
    first, ended = True, False
    try:
        while True:
            start = now()
            while True:
                try:
                    kind, item = got.get(timeout=_POLL_S)
                    break
                except queue.Empty:
                    waited, limit = now() - start, clock.limit(first)
                    if waited >= limit:
                        raise Stalled(waited, limit, first) from None
            if kind == "end":
                ended = True
                return
            if kind == "error":
                ended = True
                raise item
            clock.waited(now() - start, first)
            first = False
            yield item
    finally:
        stop.set()
        if not ended:
            cancel(ds, executors)
        thread.join(_JOIN_S)
        release(ds)


def note(line: str) -> None:
    """One line on the user's stderr (io/quiet.py), whatever the progress lines' verbosity."""
    try:
        stream = user_stderr()
        stream.write(f"bertfuse score: {line}\n")
        stream.flush()
    except (OSError, ValueError):  # a closed stderr: the summary's reruns still say it
        pass
