"""Ray up and down for `bertfuse serve` and `bertfuse score`.

    started = connect(address)          # a local Ray of our own (None), or the cluster there
    with ray_for(address) as ours:      # the process's Ray if it has one, else ours for the block
        ...

Both keep the process's signal handlers: ray.init (and Serve's start) replace SIGTERM's with a
bare sys.exit in the driver, and the CLI's (io/safety.py) must stay so that SIGTERM unwinds
(temporaries removed, Serve shut down). A local Ray's processes start with SIGTERM and
SIGHUP blocked, as Ray starts them with SIGINT blocked: a signal to the whole process group
(`kill -- -PGID`, supervisord's stopasgroup) reaches this process, which drains and stops
them, instead of killing Ray under the requests in flight. An address that cannot
be reached is one line, not minutes of Ray's retries. Ray is imported on the first call:
`import bertfuse` never loads it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
from contextlib import contextmanager
from typing import Iterator
import select
import shutil
import subprocess
import sys
import time

import psutil

from bertfuse.errors import BertfuseError
from bertfuse.optional import optional

LOOPBACK = "127.0.0.1"
# The logs folder of the Ray this process joined last (its session's `logs/`): where Ray's
# own lines went, named by the CLI's error line when serve or score fails.
_logs: list[str] = []


def logs_dir() -> str | None:
    return _logs[-1] if _logs else None
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
WATCH_S = 0.5  # how often the watchdog notes Ray's processes
KILL_AFTER_S = 3.0  # SIGTERM, then SIGKILL for what is left this much later
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
# Blocked in a local Ray's processes (Ray blocks SIGINT there itself): see the module's note
_SHIELDED = tuple(s for s in _SIGNALS if s != getattr(signal, "SIGINT", None))


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


def connect(address: str | None, logging_level: int | None = None,
            metrics_host: str = LOOPBACK, leftovers: tuple[str, ...] = (),
            num_gpus: int | None = None) -> bool:
    """ray.init for this process: a local Ray of our own when `address` is None ("local":
    never someone's cluster found on this machine), else the cluster at `address`. Returns
    whether it started a local Ray. logging_level: Ray's driver logger (default Ray's).

    A local Ray's node address is the loopback unless metrics_host asks for more: Ray binds
    its metrics, dashboard-agent and runtime-env ports to the node address (every interface
    otherwise), and turns a loopback address given as _node_ip_address into the machine's;
    its single-machine mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, what it runs on macOS)
    keeps the loopback. A watchdog process stops that Ray's processes, and removes `leftovers`
    (folders), if this process dies without disconnect() (kill -9). num_gpus: the local Ray
    has this many GPUs, the first of those CUDA_VISIBLE_DEVICES lists (None: all it finds)."""
    ray = optional("ray", why="Ray (ray extra)")

    global _watchdog
    kwargs: dict = {"log_to_driver": False}
    if logging_level is not None:
        kwargs["logging_level"] = logging_level
    if num_gpus is not None and address is None:
        kwargs["num_gpus"] = num_gpus
    if address is not None:
        check_reachable(address)
    elif _watchdog is None:
        _watchdog = Watchdog(leftovers)
    with _blocked(_SHIELDED if address is None else ()), signal_handlers_kept(), \
            _single_machine(address is None and _is_loopback(metrics_host)):
        try:
            if address is None:
                ctx = ray.init(address="local", include_dashboard=False, **kwargs)
            else:
                ctx = ray.init(address=address, **kwargs)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            _end_watch()
            where = "start a local Ray" if address is None else f"join the Ray cluster at {address}"
            raise BertfuseError(f"cannot {where}: {first_line(exc)}") from None
    session = (getattr(ctx, "address_info", None) or {}).get("session_dir")
    if session:
        _logs.append(os.path.join(session, "logs"))
    return address is None


def disconnect() -> None:
    """ray.shutdown: stops a local Ray we started, or leaves a joined cluster."""
    ray = optional("ray", why="Ray (ray extra)")

    try:
        ray.shutdown()
    finally:
        _end_watch()


@contextmanager
def _blocked(signals: tuple[int, ...]) -> Iterator[None]:
    """These signals blocked in this thread for the block: the processes it starts inherit
    the mask (exec keeps it), so they never see them. Outermost, so that a signal that came
    meanwhile reaches the handler put back by signal_handlers_kept, when the mask is
    restored. (Stopping those processes then waits 1 s each for the SIGTERM they never see
    before Ray's SIGKILL: a few seconds more at shutdown.)"""
    if not signals or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    saved = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, saved)


@contextmanager
def _single_machine(on: bool) -> Iterator[None]:
    """Ray's single-machine mode while a local Ray starts (its processes inherit it); the
    flag is read when Ray is imported, so the imported constant is set for the block too."""
    if not on:
        yield
        return

    try:
        constants = optional("ray._private.ray_constants",
                             why="Ray reads its single-machine flag at import (ray extra)")
    except ImportError:  # a Ray without it: the environment alone
        constants = None
    saved_env = os.environ.get(SINGLE_MACHINE_ENV)
    saved = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[SINGLE_MACHINE_ENV] = "0"
    if saved is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved is not None:
            constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(SINGLE_MACHINE_ENV, None)
        else:
            os.environ[SINGLE_MACHINE_ENV] = saved_env


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _end_watch() -> None:
    global _watchdog
    if _watchdog is not None:
        _watchdog.close()
        _watchdog = None


class Watchdog:
    """A process of its own (its own session: Ctrl-C in a terminal does not reach it) that
    outlives this one: every WATCH_S it notes this process's descendants (Ray's processes),
    and when this process dies without close() (its pipe ends: kill -9, a crash) it stops
    those still running (SIGTERM, then SIGKILL after KILL_AFTER_S) and removes `leftovers`."""

    def __init__(self, leftovers: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bertfuse.ray_cluster", str(os.getpid()), *leftovers],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def close(self) -> None:
        """This process ended its Ray itself: the watchdog leaves."""
        try:
            self.proc.stdin.write(b"ok")
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, ValueError):
            pass
        except Exception:  # noqa: BLE001  (TimeoutExpired: it is on its way out anyway)
            self.proc.kill()


_watchdog: Watchdog | None = None


def process_start(pid: int) -> str | None:
    """pid's start time in clock ticks after boot (a reused pid does not match), or None when
    it is gone or a zombie.

    Read from /proc/PID/stat by hand, not psutil: this value is written down (temporaries'
    names, io/stale.py; serve's owner file, serve/ingress.py) and compared by another process
    later, and psutil's public Process.create_time() adds to these ticks a boot time it reads
    afresh from the wall clock on every call (psutil 7.2; giampaolo/psutil#2541): a clock step
    between the two reads would make a live run look gone, its temporaries swept and its
    HAProxy stopped. psutil keeps the ticks themselves private."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (zombies included; psutil's walk of the process tree)."""
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def alive(pids: set[int]) -> set[int]:
    """The pids still running (a zombie has exited)."""
    left = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.add(pid)
        except psutil.Error:
            continue
    return left


def _running(proc: psutil.Process) -> bool:
    """The process is still the one first seen (psutil checks its start time) and no zombie."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _watch(owner: int, leftovers: list[str]) -> None:
    """The watchdog's loop (python -m bertfuse.ray_cluster OWNER [FOLDER...])."""
    me, known = os.getpid(), {}
    while True:
        ready, _, _ = select.select([0], [], [], WATCH_S)
        if ready:
            if os.read(0, 16).startswith(b"ok"):
                return
            break  # the pipe ended: the owner is gone
        for pid in descendants(owner) - {me} - known.keys():
            try:
                proc = psutil.Process(pid)
            except psutil.Error:
                continue
            if _running(proc):
                known[pid] = proc
    for sig, wait in ((signal.SIGTERM, KILL_AFTER_S), (signal.SIGKILL, 0)):
        live = [p for p in known.values() if _running(p)]
        for proc in live:
            try:
                proc.send_signal(sig)  # refused where the pid now names another process
            except psutil.Error:
                pass
        deadline = time.monotonic() + wait
        while live and time.monotonic() < deadline:
            time.sleep(0.1)
            live = [p for p in live if _running(p)]
    for folder in leftovers:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    import sys

    _watch(int(sys.argv[1]), sys.argv[2:])


@contextmanager
def ray_for(address: str | None, logging_level: int | None = None,
            num_gpus: int | None = None) -> Iterator[bool]:
    """Ray for the block: the one this process already runs (used and left running; yields
    False), else connect(address) and ray.shutdown on every exit path (yields True)."""
    ray = optional("ray", why="Ray (ray extra)")

    if ray.is_initialized():
        yield False
        return
    connect(address, logging_level, num_gpus=num_gpus)
    try:
        yield True
    finally:
        disconnect()


# Ray colours the task name in a task error's text (cyan), also when no terminal reads it
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CHAINED = re.compile(r"^(The above exception was the direct cause of the following exception|"
                      r"During handling of the above exception, another exception occurred):$",
                      re.M)


def task_error(exc: BaseException) -> str:
    """What failed inside a Ray task, 'Type: message' as the task raised it. A task error
    reaches the driver as text (RayTaskError(UserCodeException) keeps no cause object): its
    innermost traceback is the first one, and the line after its last frame is the user's
    exception. Without a traceback, first_line's pick; never colour codes."""
    text = _ANSI.sub("", str(exc))
    inner = _CHAINED.split(text)[0].splitlines()
    frames = [i for i, ln in enumerate(inner) if ln.startswith("  File ")]
    if frames:
        after = [ln for ln in inner[frames[-1] + 1:] if ln.strip() and not ln[0].isspace()]
        if after:
            return after[0].strip()[:300]
    return first_line(exc)


def first_line(exc: BaseException) -> str:
    """The line of a (often many-line) Ray error that says what failed, at most 300 chars."""
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    useful = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (useful[-1] if useful else lines[0] if lines else type(exc).__name__)[:300]
