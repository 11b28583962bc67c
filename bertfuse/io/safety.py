"""Nothing the user owns is destroyed: output-path checks, and temp files that go on every exit.

* `check_output` refuses an output path that is one of the command's inputs (also through a
  symlink, a hard link or `..`), that lies inside a source directory, or that is anything but a
  regular file or absent (a device, a pipe, a symlink, a directory).
* `temp_file` / `temp_dir` make temporaries that are registered while they exist and removed
  when their block ends, however it ends.
* `handle_signals` turns SIGTERM and SIGHUP into a `Terminated` exception (SIGINT stays a
  KeyboardInterrupt), so every `finally`/`with` block runs and removes its temporaries; a
  signal that arrives while a temporary is being created or renamed waits until that is done.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from bertfuse.errors import BertfuseError
from bertfuse.io.stale import scratch_folder, sweep, tagged

_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP"))
                 if s is not None)
_MAX_WALK = 20_000  # entries looked at per source directory for hard links


class Terminated(BaseException):
    """SIGTERM/SIGHUP, raised like KeyboardInterrupt so cleanup code runs (`except Exception`
    does not catch it)."""

    def __init__(self, signo: int) -> None:
        super().__init__(signo)
        self.signo = signo


class _State:
    hold = 0          # > 0: inside held(); a signal waits in `pending`
    pending: int | None = None
    fired = False     # a signal was raised: later ones must not interrupt the cleanup
    extra = 0         # signals after the first
    live: dict[str, bool] = {}  # temp path -> is a directory
    paused = False    # pause_point has paused once


def _on_signal(signo: int, frame) -> None:
    if _State.fired:
        _State.extra += 1
        if _State.extra >= 3:  # the cleanup hangs and the user insists: go now
            remove_all()
            os._exit(128 + signo)
        return
    if _State.hold:
        _State.pending = signo
        return
    _fire(signo)


def _fire(signo: int) -> None:
    _State.fired = True
    if signo == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signo)


@contextmanager
def held() -> Iterator[None]:
    """Defers SIGINT/SIGTERM/SIGHUP until the block ends (create-and-register, rename pairs).

    Only the main thread's blocks defer: Python runs handlers there, so a signal deferred by a
    worker thread's block would be raised in that worker (its future's error, seen late or
    never while the main thread waits elsewhere). A worker's block needs no deferral: the
    main thread's unwinding waits for the workers before it removes the temps."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _State.hold += 1
    try:
        yield
    finally:
        _State.hold -= 1
        if not _State.hold and _State.pending is not None and not _State.fired:
            signo, _State.pending = _State.pending, None
            _fire(signo)


@contextmanager
def handle_signals() -> Iterator[None]:
    """For the CLI's main(): signals become exceptions; on the way out every registered temp
    is removed and the previous handlers come back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        signal.signal(s, _on_signal)
    try:
        yield
    finally:
        remove_all()
        for s, handler in previous.items():
            signal.signal(s, handler)
        _State.fired, _State.pending, _State.extra = False, None, 0


def remove_all() -> None:
    """Removes every temporary still registered (a last resort; each block removes its own)."""
    for path, is_dir in list(_State.live.items()):
        _remove(path, is_dir)


def _remove(path: str, is_dir: bool) -> None:
    try:
        if is_dir:
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
    except OSError:
        pass
    _State.live.pop(path, None)


@contextmanager
def _registered(make: Callable[[], str], is_dir: bool) -> Iterator[Path]:
    """A temporary made by `make`, registered while it exists (a signal waits while it is
    made or removed) and removed when the block ends unless it was renamed away."""
    with held():
        name = make()
        _State.live[name] = is_dir
    try:
        yield Path(name)
    finally:
        with held():
            _remove(name, is_dir)


def temp_file(beside: str | Path) -> AbstractContextManager[Path]:
    """An empty file `.NAME.bertfuse-SPACE-PID-START-XXXX.tmp` in the directory of `beside`,
    for a write-then-rename; those of killed processes there go first (io/stale.py)."""
    beside = Path(beside)
    sweep(beside.parent)  # not in make(): a signal may stop a long sweep

    def make() -> str:
        fd, name = tempfile.mkstemp(prefix=tagged(f".{beside.name}."), suffix=".tmp",
                                    dir=beside.parent)
        os.close(fd)
        return name
    return _registered(make, False)


def temp_dir(parent: str | Path | None = None, prefix: str = "bertfuse-"
             ) -> AbstractContextManager[Path]:
    """A fresh directory `PREFIX` tagged with this process (io/stale.py's `tagged`), in
    `parent` or the system temp dir; those of killed processes there go first."""
    sweep(parent)
    return _registered(lambda: tempfile.mkdtemp(prefix=tagged(prefix), dir=parent), True)


def scratch_dir(prefix: str = "bertfuse-") -> AbstractContextManager[Path]:
    """A temp_dir where the run keeps its scratch copies: hidden beside its output (io/stale.py's
    scratch_beside), or in the system temp dir for a run that writes no file."""
    folder = scratch_folder()
    return temp_dir(folder, "." + prefix if folder else prefix)


def replace_file(tmp: Path, target: Path) -> None:
    """Renames a finished temp over `target`, which must be absent or a regular file."""
    check_replaceable(target)
    with held():
        os.replace(tmp, target)


def swap_dir_in(tmp: Path, out: Path) -> None:
    """Renames a finished temp directory to `out` (absent or empty, or a directory the caller
    may replace: moved aside first and removed after); a signal cannot fall between the two
    renames."""
    if not out.exists() or not any(out.iterdir()):
        with held():
            os.replace(tmp, out)
        return
    with temp_dir(out.parent, prefix=f".{out.name}.old.") as old:
        with held():
            os.replace(out, old / out.name)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old / out.name, out)
                raise


def write_text(path: str | Path, text: str) -> None:
    """Writes a small text file atomically (temp beside it, then rename)."""
    path = Path(path)
    mode = mode_of(path)
    with temp_file(path) as tmp:
        tmp.write_text(text)
        os.chmod(tmp, mode)
        replace_file(tmp, path)


def mode_of(path: Path) -> int:
    """A replaced file keeps its permission bits; a new one is rw-r--r--."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0o644
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o644


# ----------------------------------------------------------------------------- output paths


def check_replaceable(path: str | Path) -> None:
    """Absent or a regular file: never a device, pipe, socket, symlink or directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode):
        raise BertfuseError(f"{path}: is a symbolic link; bertfuse does not replace links "
                            f"(name the file itself, or a new path)")
    if stat.S_ISDIR(st.st_mode):
        raise BertfuseError(f"{path}: is a directory, expected a file path")
    raise BertfuseError(f"{path}: is not a regular file (a device, pipe or socket); bertfuse "
                        f"writes only new or regular files")


def check_output(path: str, inputs: Iterable[str | None] = (), source_dirs: Iterable[str] = (),
                 model: bool = True) -> None:
    """Refuses (BertfuseError, exit 2) an output path that could destroy anything: see the
    module docstring. `inputs` are files the command reads, `source_dirs` directories; a
    `model` output may also write PATH.data (weights past protobuf's 2 GB)."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise BertfuseError(f"{path}: {parent} is not a directory")
    if not os.path.isdir(parent):
        raise BertfuseError(f"{path}: output directory {parent} does not exist")
    written = (path, path + ".data") if model else (path,)
    for p in written:
        check_replaceable(p)
    real = os.path.realpath(path)
    for inp in inputs:
        if not inp:
            continue
        for p in written:
            if _same_file(p, inp) or os.path.realpath(p) == os.path.realpath(inp):
                raise BertfuseError(f"{path}: is the input {inp}; refusing to overwrite it "
                                    f"(write to another path)")
    for d in source_dirs:
        if not d or not os.path.isdir(d):
            continue
        if _within(real, os.path.realpath(d)):
            raise BertfuseError(f"{path}: is inside the source directory {d}; refusing to "
                                f"write there (write the output elsewhere)")
        ids = {_file_id(p) for p in written} - {None}
        if ids:
            hit = _find_file_id(d, ids)
            if hit:
                raise BertfuseError(f"{path}: is a hard link to {hit} in the source "
                                    f"directory {d}; refusing to overwrite it")


def convert_inputs(source: str, config: str | None, kind: str
                   ) -> tuple[list[str], list[str]]:
    """(files, directories) that `convert SOURCE` reads: its output may be none of them, nor
    inside one of the directories."""
    files, dirs = [config] if config else [], []
    if os.path.isdir(source):
        return files, [source]
    files.append(source)
    prefix = re.sub(r"(\.index|\.data-\d+-of-\d+)$", "", source)
    if kind == "checkpoint" or os.path.exists(prefix + ".index"):
        # A checkpoint prefix: its shards, and the config and `checkpoint` file beside it.
        beside = os.path.dirname(os.path.abspath(prefix))
        files += glob.glob(glob.escape(prefix) + ".*")
        files += [os.path.join(beside, n) for n in ("bert_config.json", "checkpoint")]
    return files, dirs


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _same_file(a: str, b: str) -> bool:
    ia = _file_id(a)
    return ia is not None and ia == _file_id(b)


def _within(path: str, directory: str) -> bool:
    try:
        return os.path.commonpath([path, directory]) == directory
    except ValueError:  # different drives
        return False


def _find_file_id(directory: str, ids: set[tuple[int, int]]) -> str | None:
    seen = 0
    for root, dirs, files in os.walk(directory):
        for name in files:
            full = os.path.join(root, name)
            if _file_id(full) in ids:
                return full
            seen += 1
            if seen > _MAX_WALK:
                return None
    return None


# ----------------------------------------------------------------------------- test hook


def pause_point(stage: str) -> None:
    """Tests only: with BERTFUSE_TEST_PAUSE=STAGE:FLAGFILE the process writes its pid to
    FLAGFILE on reaching STAGE and sleeps (60 s at most), so a test can signal it there."""
    spec = os.environ.get("BERTFUSE_TEST_PAUSE")
    if not spec:
        return
    name, _, flag = spec.partition(":")
    if name != stage or not flag:
        return
    if _State.paused:  # once per process: the test signals the first arrival
        return
    _State.paused = True
    Path(flag).write_text(str(os.getpid()))
    end = time.monotonic() + 60
    while time.monotonic() < end:
        time.sleep(0.05)
