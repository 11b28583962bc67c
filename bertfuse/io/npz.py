""".npz files from users (--load-inputs, --load-outputs), read within io/limits.py's bounds.

A small .npz can declare gigabytes: a deflated member of zeros expands ~1000 times, and a
.npy header's shape is what NumPy allocates before it reads a byte of data. So before any
member is decompressed, the zip directory's declared uncompressed sizes and every .npy
header's shape and dtype are read and summed against MAX_ARRAYS_BYTES; only then does NumPy
read the arrays, each within what its header declared. Pickled (object) arrays are never
loaded.
"""

from __future__ import annotations

import math
import struct
import zipfile

import numpy as np
from numpy.lib import format as npy

from bertfuse.errors import BertfuseError
from bertfuse.io.limits import (MAX_ARRAYS_BYTES, MAX_NPZ_MEMBERS, check_size,
                                size_text)

# A savez entry in the central directory: 46 bytes, its name ("input_ids.npy"), zip64's
# extra field (up to 32 bytes); 1 KiB leaves room for long names.
_ENTRY_BYTES = 1024
_EOCD = struct.Struct("<4s4H2LH")  # signature, disks, entries here, entries, size, offset, comment
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # signature, disk, the zip64 record's offset, disks
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")  # ..., entries here, entries, size, offset
_HEADER_READERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}


def read_npz(path: str, label: str) -> dict[str, np.ndarray]:
    """name -> array of a numpy.savez file, its declared sizes checked first (`label`: how
    the one-line refusal names the file, e.g. '--load-inputs x.npz')."""
    check_size(path, MAX_ARRAYS_BYTES + MAX_NPZ_MEMBERS * _ENTRY_BYTES, "an .npz of arrays",
               label)
    if not zipfile.is_zipfile(path):
        raise BertfuseError(f"{label}: not an .npz file (numpy.savez writes one)")
    entries, directory = _directory(path)
    if entries > MAX_NPZ_MEMBERS or directory > MAX_NPZ_MEMBERS * _ENTRY_BYTES:
        raise BertfuseError(f"{label}: {entries:,} members in a zip directory of "
                            f"{size_text(directory)}, over the limit of {MAX_NPZ_MEMBERS:,} "
                            f"arrays in an .npz")
    with zipfile.ZipFile(path) as zf:
        members = zf.infolist()
        if len(members) > MAX_NPZ_MEMBERS:
            raise BertfuseError(f"{label}: {len(members):,} members, over the limit of "
                                f"{MAX_NPZ_MEMBERS:,} arrays in an .npz")
        declared = sum(m.file_size for m in members)
        if declared > MAX_ARRAYS_BYTES:
            raise BertfuseError(f"{label}: its members declare {size_text(declared)} "
                                f"uncompressed, over the {size_text(MAX_ARRAYS_BYTES)} limit "
                                f"for arrays; save fewer rows")
        total = 0
        for m in members:
            total += _declared_bytes(zf, m, label)
            if total > MAX_ARRAYS_BYTES:
                raise BertfuseError(f"{label}: its arrays declare {total:,} bytes or more, "
                                    f"over the {size_text(MAX_ARRAYS_BYTES)} limit for arrays "
                                    f"({MAX_ARRAYS_BYTES:,} bytes); save fewer rows")
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _directory(path: str) -> tuple[int, int]:
    """(members, bytes) of the zip's central directory, from its end records (APPNOTE.TXT
    4.3.14-4.3.16, zip64's too), before zipfile turns every entry into a ZipInfo: a directory
    of millions of entries costs gigabytes and minutes there. Found as zipfile finds it: the
    last end-of-directory signature within a comment's reach of the end."""
    with open(path, "rb") as f:
        end = f.seek(0, 2)
        f.seek(max(0, end - _EOCD.size - 0xFFFF - _ZIP64_LOCATOR.size))
        tail = f.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < _EOCD.size:
            return 0, 0  # zipfile refuses it
        entries, size = _EOCD.unpack_from(tail, at)[4:6]
        loc = at - _ZIP64_LOCATOR.size
        if (entries == 0xFFFF or size == 0xFFFFFFFF) and loc >= 0 and \
                tail[loc:loc + 4] == b"PK\x06\x07":
            f.seek(_ZIP64_LOCATOR.unpack_from(tail, loc)[2])
            record = f.read(_ZIP64_EOCD.size)
            if len(record) == _ZIP64_EOCD.size and record[:4] == b"PK\x06\x06":
                entries, size = _ZIP64_EOCD.unpack(record)[7:9]
    return entries, size


def _declared_bytes(zf: zipfile.ZipFile, member: zipfile.ZipInfo, label: str) -> int:
    """What NumPy would allocate for one member: its .npy header's shape times its dtype's
    item size (a member that is no .npy: its declared size, read as bytes)."""
    if not member.filename.endswith(".npy"):
        return member.file_size
    name = member.filename[:-4]
    try:
        with zf.open(member) as f:
            version = npy.read_magic(f)
            reader = _HEADER_READERS.get(version)
            if reader is None:
                raise ValueError(f".npy format version {version[0]}.{version[1]}")
            shape, _, dtype = reader(f)
    except (ValueError, EOFError, OSError, RuntimeError, zipfile.BadZipFile) as exc:
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise BertfuseError(f"{label}: {name!r} is not a readable .npy array ({why})") \
            from None
    if dtype.hasobject:
        raise BertfuseError(f"{label}: {name!r} holds Python objects (a pickle), which bertfuse "
                            f"never loads; save numbers")
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes > MAX_ARRAYS_BYTES:
        raise BertfuseError(f"{label}: {name!r} declares shape {list(shape)} {dtype} "
                            f"({size_text(nbytes)}), over the {size_text(MAX_ARRAYS_BYTES)} "
                            f"limit for arrays; save fewer rows")
    return nbytes
