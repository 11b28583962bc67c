"""A write that fails (a full disk, a quota, a file-size limit, a read-only or forbidden folder)
becomes one line naming the file being written and what to do: BertfuseError, exit 2.

The OSError of a failed write(2) carries no file name ("[Errno 28] No space left on device"),
and onnx and NumPy pass it on as it is; the caller knows the path, so it says it here.
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from typing import Iterator

from bertfuse.errors import BertfuseError

_WHAT_TO_DO = {
    errno.ENOSPC: "free space there, or write to another file system",
    errno.EDQUOT: "free space within your quota, or write to another file system",
    errno.EFBIG: "the file-size limit (ulimit -f) or the file system's largest file is "
                 "smaller than the model: raise the limit, or write to another file system",
    errno.EROFS: "the file system is read-only: write to another folder",
    errno.EACCES: "you may not write there: write to another folder, or get write permission",
    errno.EPERM: "you may not write there: write to another folder, or get write permission",
}


@contextmanager
def naming_the_path(path: str | os.PathLike, what: str = "it") -> Iterator[None]:
    """OSError in the block -> BertfuseError `PATH: cannot write WHAT (REASON); WHAT TO DO`.
    Temporaries made in the block are removed by their own blocks (io/safety.py) as the
    error passes through them."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        todo = _WHAT_TO_DO.get(exc.errno)
        raise BertfuseError(f"{path}: cannot write {what} ({reason})"
                            + (f"; {todo}" if todo else "")) from None
