"""Ray up and down for `bertfuse serve` and `bertfuse score`.

    started = connect(address)          # a local Ray of our own (None), or the cluster there
    with ray_for(address) as ours:      # the process's Ray if it has one, else ours for the block
        ...

Both keep the process's signal handlers: ray.init (and Serve's start) replace SIGTERM's with a
bare sys.exit in the driver, and the CLI's (io/safety.py) must stay so that SIGTERM unwinds
(temporaries removed, Serve shut down). An address that cannot be reached is one line, not
minutes of Ray's retries. Ray is imported on the first call: `import bertfuse` never loads it.
"""

from __future__ import annotations

import signal
import socket
import threading
from contextlib import contextmanager
from typing import Iterator

from bertfuse.errors import BertfuseError

_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """The SIGINT/SIGTERM/SIGHUP handlers as they were before the block, put back after it
    (main thread only: elsewhere Python cannot set them, and Ray does not either)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, handler in saved.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(s, handler)


def check_reachable(address: str) -> None:
    """A HOST:PORT address must take a TCP connection (ray.init would retry for minutes);
    'auto' and URLs (ray://...) are left to Ray."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise BertfuseError(f"--address must be 'auto' or HOST:PORT, not {address!r}")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=10).close()
    except OSError as exc:
        why = exc.strerror or exc
        raise BertfuseError(f"cannot reach a Ray cluster at {address} ({why}); start one "
                            "with ray start --head, or leave out --address") from None


def connect(address: str | None, logging_level: int | None = None) -> bool:
    """ray.init for this process: a local Ray of our own when `address` is None ("local":
    never someone's cluster found on this machine), else the cluster at `address`. Returns
    whether it started a local Ray. logging_level: Ray's driver logger (default Ray's)."""
    import ray

    kwargs: dict = {"log_to_driver": False}
    if logging_level is not None:
        kwargs["logging_level"] = logging_level
    if address is not None:
        check_reachable(address)
    with signal_handlers_kept():
        try:
            if address is None:
                ray.init(address="local", include_dashboard=False, **kwargs)
            else:
                ray.init(address=address, **kwargs)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = "start a local Ray" if address is None else f"join the Ray cluster at {address}"
            raise BertfuseError(f"cannot {where}: {first_line(exc)}") from None
    return address is None


def disconnect() -> None:
    """ray.shutdown: stops a local Ray we started, or leaves a joined cluster."""
    import ray

    ray.shutdown()


@contextmanager
def ray_for(address: str | None, logging_level: int | None = None) -> Iterator[bool]:
    """Ray for the block: the one this process already runs (used and left running; yields
    False), else connect(address) and ray.shutdown on every exit path (yields True)."""
    import ray

    if ray.is_initialized():
        yield False
        return
    connect(address, logging_level)
    try:
        yield True
    finally:
        disconnect()


def first_line(exc: BaseException) -> str:
    """The line of a (often many-line) Ray error that says what failed, at most 300 chars."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (useful[-1] if useful else lines[0] if lines else type(exc).__name__)[:300]
