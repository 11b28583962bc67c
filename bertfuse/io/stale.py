"""Temporaries a killed bertfuse left behind: named after their process, removed by the next run.

Every temporary bertfuse makes (io/safety.py's `temp_file` and `temp_dir`) holds a tag in its
name: `bertfuse-SPACE-PID-START-`, SPACE a hash of the host name and of the PID namespace, START
the process's start time in clock ticks after boot (/proc/PID/stat), so a PID the system gave
to another process later does not count as the same one. A process killed with SIGKILL runs no
cleanup; the next bertfuse that makes a temporary in the same folder first removes every entry
of the folder that

* is named exactly as bertfuse names its temporaries (`_NAME`),
* carries this host's and PID namespace's SPACE (another machine writing to the same network
  folder, or another container, keeps its own),
* belongs to this user, and is a regular file or a directory (never a link),
* and whose process is gone: no such PID, a zombie, or a PID that started at another time.

Nothing else is touched: a file that only looks similar (no tag, another SPACE, a live PID) stays,
and so do temporaries of bertfuse releases before this naming (`.NAME.XXXX.tmp`, which a user's
file may look like). Where /proc cannot tell (not Linux) nothing is swept. The start time is
read by ray_cluster.process_start, as serve's stale-HAProxy check does: the clock ticks from
/proc/PID/stat, not psutil's create_time(), which follows the wall clock (the reason is
there). The PID namespace is /proc/self/ns/pid's link, read by hand: psutil has no call for it.

`scratch_beside(out)` makes a run's scratch copies (the model saved for the checker and ONNX
Runtime) go into the output's folder instead of the system temp folder: nothing is written
outside the folder the user named, and the next run there sweeps what a kill left.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import re
import shutil
import socket
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
import tempfile

from bertfuse.ray_cluster import process_start

# mkstemp/mkdtemp's random part: 8 of [a-z0-9_]
_NAME = re.compile(r"(?:^|\.)bertfuse-(?P<space>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)-"
                   r"(?:[a-z]+-)?[a-z0-9_]{8}(?:\.tmp)?$")
_SWEPT: set[str] = set()  # folders this process has swept already
_TAG: dict[int, str] = {}  # pid -> its tag (a forked child computes its own)
_SCRATCH: contextvars.ContextVar[Path | None] = contextvars.ContextVar("bertfuse_scratch",
                                                                      default=None)


def _space() -> str:
    """This host and PID namespace, in 8 hex digits."""
    try:
        ns = os.readlink("/proc/self/ns/pid")  # by hand: psutil has no namespaces
    except OSError:
        ns = ""
    return hashlib.sha256(f"{socket.gethostname()}\0{ns}".encode()).hexdigest()[:8]


def tag() -> str:
    """`bertfuse-SPACE-PID-START-`: the part of a temporary's name that names its process."""
    pid = os.getpid()
    if pid not in _TAG:
        _TAG[pid] = f"bertfuse-{_space()}-{pid}-{process_start(pid) or 0}-"
    return _TAG[pid]


def tagged(prefix: str) -> str:
    """A temporary's name prefix with this process's tag: `.NAME.` -> `.NAME.bertfuse-ID-`,
    `bertfuse-WORD-` -> `bertfuse-ID-WORD-` (mkstemp/mkdtemp add 8 random characters)."""
    m = re.fullmatch(r"(\.?)bertfuse-([a-z]+-)?", prefix)
    return m[1] + tag() + (m[2] or "") if m else prefix + tag()


def _dead(pid: int, start: str) -> bool:
    """The process that made a temporary is gone (or the PID now names another process)."""
    now = process_start(pid)
    return now is None or now != start


def sweep(folder: str | Path | None) -> list[Path]:
    """Removes the temporaries of gone bertfuse processes in `folder` (None: the system temp
    folder), once per folder and process; returns what it removed."""
    folder = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    key = os.path.realpath(folder)
    if key in _SWEPT:
        return []
    _SWEPT.add(key)
    if process_start(os.getpid()) is None:  # no /proc: no telling a gone process from a live one
        return []
    space, uid = tag().split("-")[1], os.getuid()
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        m = _NAME.search(entry.name)
        if not m or m["space"] != space or not _dead(int(m["pid"]), m["start"]):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if st.st_uid != uid:
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(entry.path)
            elif stat.S_ISREG(st.st_mode):
                os.unlink(entry.path)
            else:
                continue
        except OSError:  # gone meanwhile, or not ours to remove: left as it is
            continue
        removed.append(Path(entry.path))
    return removed


@contextmanager
def scratch_beside(out_path: str | os.PathLike | None) -> Iterator[None]:
    """Scratch copies made in the block go to `out_path`'s folder (None: the system temp
    folder, for runs that write no file)."""
    folder = Path(os.path.abspath(out_path)).parent if out_path is not None else None
    token = _SCRATCH.set(folder)
    try:
        yield
    finally:
        _SCRATCH.reset(token)


def scratch_folder() -> Path | None:
    """Where scratch copies go now: the output's folder, or None (the system temp folder)."""
    return _SCRATCH.get()
