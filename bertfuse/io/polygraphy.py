"""Polygraphy's JSON data files, read and written without Polygraphy: its `run --save-inputs`
(a list of feed dicts, one per iteration) and `--save-outputs` (RunResults: each runner's
iterations, each a dict of outputs), and the input file its `run --load-inputs` reads.

    [ {"input_ids": ARRAY, ...}, ... ]                           --save-inputs / --load-inputs
    {"lst": [[RUNNER, [{"outputs": {"name": LAZY, ...},          --save-outputs
              "runtime": s, "runner_name": RUNNER,
              "polygraphy_class": "IterationResult"}, ...]], ...],
     "polygraphy_class": "RunResults"}
    ARRAY = {"array": base64 of np.save's .npy bytes, "polygraphy_class": "ndarray"}
    LAZY  = {"values": ARRAY, "polygraphy_class": "LazyArray"}

(Polygraphy 0.53's polygraphy/json/serde.py and comparator/struct.py; older files mark a
class as {"__polygraphy_encoded_ndarray": "polygraphy_serialized_json_type"}.) The JSON text is
read within io/limits.py's bounds by the caller; here every .npy header is checked against the
bytes that carry it before NumPy reads it (a header may declare any shape), and NumPy loads
with allow_pickle=False: an object array is refused, never unpickled.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import Any, Mapping

import numpy as np
from numpy.lib import format as npy

from bertfuse.errors import BertfuseError

MARKER = "polygraphy_class"
_LEGACY = "polygraphy_serialized_json_type"  # {"__polygraphy_encoded_NAME": _LEGACY, ...}
_HEADERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}


def kind(obj: Any) -> str | None:
    """The Polygraphy class a decoded JSON value is marked with, or None."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get(MARKER), str):
        return obj[MARKER]
    legacy = [k for k, v in obj.items() if v == _LEGACY and k.startswith("__polygraphy_encoded_")]
    return legacy[0].removeprefix("__polygraphy_encoded_") if legacy else None


def is_polygraphy(data: Any) -> bool:
    """A Polygraphy file: RunResults, or a list of feed dicts whose values are its arrays."""
    if kind(data) == "RunResults":
        return True
    return isinstance(data, list) and any(
        isinstance(feed, dict) and any(kind(v) is not None for v in feed.values())
        for feed in data)


def read(data: Any, label: str) -> dict[str, np.ndarray]:
    """name -> array of one iteration: a feed dict of --save-inputs, or the one runner's
    outputs of --save-outputs (several runners or iterations: which to compare is the
    user's choice, so it is refused in a line saying how to save one)."""
    if kind(data) == "RunResults":
        return _outputs(data, label)
    feeds = _one(data, "iterations", label, "(save one: polygraphy run --iterations 1)")
    if not isinstance(feeds, dict):
        raise BertfuseError(f"{label}: a Polygraphy input file holds feed dicts, not "
                            f"{type(feeds).__name__}")
    return {name: array(value, label, name) for name, value in feeds.items()}


def _outputs(data: dict, label: str) -> dict[str, np.ndarray]:
    runs = data.get("lst")
    if not isinstance(runs, list) or not all(isinstance(r, list) and len(r) == 2 for r in runs):
        raise BertfuseError(f"{label}: Polygraphy RunResults without its list of "
                            f"[runner, iterations]")
    names = ", ".join(str(r[0])[:80] for r in runs[:4])
    runner, iterations = _one(runs, "runners", label,
                              f"({names}; save one runner's outputs: polygraphy run with one "
                              f"backend flag)")
    result = _one(iterations, "iterations", label, f"of {str(runner)[:80]} (save one: "
                                                   f"polygraphy run --iterations 1)")
    outputs = result.get("outputs") if kind(result) == "IterationResult" else None
    if not isinstance(outputs, dict):
        raise BertfuseError(f"{label}: runner {str(runner)[:80]}'s iteration is no Polygraphy "
                            f"IterationResult with outputs")
    return {name: array(value.get("values") if kind(value) in ("LazyArray", "LazyNumpyArray")
                        else value, label, name) for name, value in outputs.items()}


def _one(items: Any, what: str, label: str, hint: str) -> Any:
    if not isinstance(items, list) or not items:
        raise BertfuseError(f"{label}: a Polygraphy file with no {what}")
    if len(items) > 1:
        raise BertfuseError(f"{label}: {len(items)} {what} {hint}; bertfuse compares one")
    return items[0]


def array(value: Any, label: str, name: str) -> np.ndarray:
    """One Polygraphy ndarray: its .npy bytes, the header's shape checked against them."""
    if kind(value) != "ndarray" or not isinstance(value.get("array"), str):
        found = kind(value) or type(value).__name__
        raise BertfuseError(f"{label}: {name!r} is not a Polygraphy NumPy array ({found}; "
                            f"torch tensors are not read)")
    text = value["array"]
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        data = text.encode("latin-1", "replace")  # Polygraphy's oldest files: latin-1 bytes
    stream = io.BytesIO(data)
    try:
        version = npy.read_magic(stream)
        reader = _HEADERS.get(version)
        if reader is None:
            raise ValueError(f".npy format version {version[0]}.{version[1]}")
        shape, fortran, dtype = reader(stream)
        if dtype.hasobject:
            raise BertfuseError(f"{label}: {name!r} holds Python objects (a pickle), which "
                                f"bertfuse never loads; save numbers")
        need = math.prod(shape) * dtype.itemsize
        have = len(data) - stream.tell()
        if need != have:
            raise ValueError(f"its header declares shape {list(shape)} {dtype} ({need:,} "
                             f"bytes), the file carries {have:,}")
        stream.seek(0)
        return np.load(stream, allow_pickle=False)
    except BertfuseError:
        raise
    except (ValueError, EOFError, OSError) as exc:
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise BertfuseError(f"{label}: {name!r} is not a readable Polygraphy array ({why})") \
            from None


def encode_inputs(arrays: Mapping[str, np.ndarray]) -> list[dict]:
    """Polygraphy's --load-inputs form of one feed dict (a list of one iteration)."""
    def one(a: np.ndarray) -> dict:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
        return {"array": base64.b64encode(buf.getvalue()).decode("ascii"), MARKER: "ndarray"}

    return [{name: one(np.asarray(a)) for name, a in arrays.items()}]
