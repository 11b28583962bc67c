"""One HTTP request's JSON body -> checked int32 arrays, and a batch of them -> one model call
and back. Everything here runs before a request joins a batch, so a bad request is answered
alone (a 4xx and one message) and never fails the others' batch.

    body ─► JSON object ─► ids (input_ids/input_mask/segment_ids: lists, or base64 tensors)
            or text (/text_pair, with a vocab) ─► runtime.request_checks.check_request ─► Parsed
    [Parsed, ...] ─► concatenated rows, padded to the longest (mask 0) ─► one run ─► split back
    outputs ─► encode_body: JSON bytes (base64 tensors assembled as bytes, no escaping pass)

An id role may come as a list (one row) or a list of rows, or as a base64 tensor, the form
a base64 response uses: {"dtype": "int32"|"int64", "shape": [rows, seq], "data": base64 of
the little-endian integers}. The tensor is read in place (np.frombuffer): no JSON numbers to
parse, which is most of a list request's cost; its dtype, shape, byte count and values
(check_request) are checked as strictly as a list's.

No Ray here: the replica (app.py) calls it, and tests call it directly.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from bertfuse.errors import BertfuseError
from bertfuse.runtime.request_checks import ROLES, ModelFacts, RequestError, check_request
from bertfuse.serve.guard import HTTPError, check_depth, check_text

FIELDS = (*ROLES, "text", "text_pair", "outputs", "encoding")
ENCODINGS = ("json", "base64")
TENSOR_FIELDS = ("dtype", "shape", "data")
ID_DTYPES = {"int32": np.dtype("<i4"), "int64": np.dtype("<i8")}


@dataclass
class Limits:
    """What one request may hold: rows (the session's max_batch), tokens per row (max_seq)
    and body bytes."""

    max_rows: int
    max_seq: int
    max_body: int


@dataclass
class Parsed:
    """A checked request: int32 [rows, seq] arrays (input_mask always present), the outputs it
    asked for and how it wants them encoded."""

    arrays: dict[str, np.ndarray]
    outputs: list[str]
    encoding: str
    ran: tuple[float, float] = (0.0, 0.0)  # its model call's start and end (perf_counter)

    @property
    def rows(self) -> int:
        return int(self.arrays["input_ids"].shape[0])

    @property
    def seq(self) -> int:
        return int(self.arrays["input_ids"].shape[1])


def body_limit(max_rows: int, max_seq: int) -> int:
    """Bytes a body may take: three roles of max_rows x max_seq ids of up to 11 characters,
    or texts of as many characters, with room to spare."""
    return 1 << 20 | max_rows * max_seq * 3 * 12 * 2


def parse_body(body: bytes, facts: ModelFacts, limits: Limits, served: Sequence[str],
               tokenizer: Any = None) -> Parsed:
    """The request in `body`, checked, or an HTTPError saying what is wrong with it."""
    if len(body) > limits.max_body:
        raise HTTPError(413, f"request body of {len(body)} bytes is over the limit of "
                             f"{limits.max_body}")
    check_depth(body)
    try:
        data = json.loads(body)
    except RecursionError:  # check_depth's bound is far below this: never reached
        raise HTTPError(400, "body is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise HTTPError(400, f"body is not valid JSON ({str(exc).splitlines()[0][:80]})") \
            from None
    if not isinstance(data, dict):
        raise HTTPError(400, f"body must be a JSON object, not {type(data).__name__} "
                             "(see docs/serving.md, The API)")
    unknown = sorted(k for k in data if k not in FIELDS)
    if unknown:
        raise HTTPError(400, f"unknown field {unknown[0]!r}; fields are {', '.join(FIELDS)}")
    outputs = pick_outputs(data.get("outputs"), served)
    encoding = data.get("encoding", "json")
    if encoding not in ENCODINGS:
        raise HTTPError(400, f"encoding must be 'json' or 'base64', not {encoding!r}")
    has_text = "text" in data or "text_pair" in data
    if has_text and any(r in data for r in ROLES):
        raise HTTPError(400, "send either text (and text_pair) or ids, not both")
    bools = b"true" in body or b"false" in body  # else numpy's conversion is exact
    given = from_text(data, tokenizer) if has_text else \
        {r: _ids(data.get(r), r, bools) for r in ROLES}
    if given["input_ids"] is None:
        raise HTTPError(400, "input_ids is required (or text, when the server has a vocab)")
    if "input_mask" in facts.inputs and given["input_mask"] is None:
        given["input_mask"] = np.ones(given["input_ids"].shape, np.int32)  # rows get padded
    if has_text:  # the tokenizer makes all three; a model may take fewer
        given = {r: v for r, v in given.items() if r in facts.inputs}
    try:
        arrays = check_request(given, facts, limits.max_rows, limits.max_seq)
    except RequestError as exc:
        raise HTTPError(400, request_message(str(exc), limits)) from None
    return Parsed(arrays, outputs, encoding)


def pick_outputs(value: Any, served: Sequence[str]) -> list[str]:
    """The outputs a request names (a name or a list; None: every served one), checked
    against those the server serves."""
    if value is None:
        return list(served)
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or \
            not all(isinstance(n, str) for n in names):
        raise HTTPError(400, "outputs must be a non-empty list of output names")
    unknown = [n for n in names if n not in served]
    if unknown:
        raise HTTPError(400, f"no output {unknown[0]!r} served; served: {', '.join(served)}")
    return list(dict.fromkeys(names))


def _ids(value: Any, role: str, bools: bool = True) -> np.ndarray | None:
    """A JSON list as an int64 array: one row ([..]) or several ([[..], ..]); ranges and
    lengths are checked by check_request. The fast path is numpy's own conversion, taken when
    it gives integers of a good shape and the body holds no true/false (numpy reads [1, true]
    as [1, 1]); anything else is looked at in Python, for the message."""
    if value is None:
        return None
    if isinstance(value, dict):
        return _tensor(value, role)
    if not bools and isinstance(value, list):
        try:
            arr = np.array(value)
        except (ValueError, OverflowError):  # ragged, or out of int64: said below
            arr = None
        if arr is not None and arr.dtype.kind == "i" and arr.ndim in (1, 2) and arr.size:
            return arr if arr.ndim == 2 else arr[None]
    return _ids_checked(value, role)


def _ids_checked(value: Any, role: str) -> np.ndarray:
    if not isinstance(value, list):
        raise HTTPError(400, f"{role} must be a list of integer ids (one row), a list of "
                             f"rows or a base64 tensor, not {type(value).__name__}")
    rows = value if value and isinstance(value[0], list) else [value]
    if not rows or not all(isinstance(r, list) and r for r in rows):
        what = "empty" if not rows or any(r == [] for r in rows) else "a mix of rows and ids"
        raise HTTPError(400, f"{role} is {what}: send one row of ids or a list of rows, each "
                             "of at least one id")
    if not all(type(v) is int for row in rows for v in row):
        bad = next(v for row in rows for v in row if type(v) is not int)
        if isinstance(bad, list):
            raise HTTPError(400, f"{role} must be [rows, seq]: it is nested deeper")
        raise HTTPError(400, f"{role} must hold integer ids, got {json.dumps(bad)[:24]}")
    lengths = sorted({len(r) for r in rows})
    if len(lengths) > 1:
        raise HTTPError(400, f"{role}: rows of different lengths ({lengths[0]}..{lengths[-1]}"
                             "); pad them to one length and send input_mask")
    try:
        return np.array(rows, dtype=np.int64)
    except OverflowError:
        raise HTTPError(400, f"{role}: an id does not fit in 64 bits") from None


def _tensor(value: dict, role: str) -> np.ndarray:
    """{"dtype", "shape": [rows, seq], "data": base64} as a read-only array over the decoded
    bytes; the values are checked by check_request."""
    if set(value) != set(TENSOR_FIELDS):
        odd = sorted(set(value) ^ set(TENSOR_FIELDS))[0]
        raise HTTPError(400, f"{role} as a tensor takes dtype, shape and data "
                             f"({'no' if odd in TENSOR_FIELDS else 'unknown'} field {odd!r})")
    dtype = ID_DTYPES.get(value["dtype"]) if isinstance(value["dtype"], str) else None
    if dtype is None:
        raise HTTPError(400, f"{role}: dtype must be 'int32' or 'int64', not "
                             f"{json.dumps(value['dtype'])[:24]}")
    shape = value["shape"]
    if not isinstance(shape, list) or len(shape) != 2 \
            or not all(type(n) is int for n in shape):
        raise HTTPError(400, f"{role}: shape must be [rows, seq], not {json.dumps(shape)[:24]}")
    if min(shape) < 1:
        raise HTTPError(400, f"{role} is empty (shape {shape}): send at least one row of at "
                             "least one id")
    data = value["data"]
    if not isinstance(data, str):
        raise HTTPError(400, f"{role}: data must be a base64 string, not "
                             f"{type(data).__name__}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):  # bad characters or padding; non-ASCII text
        raise HTTPError(400, f"{role}: data is not valid base64") from None
    need = shape[0] * shape[1] * dtype.itemsize
    if len(raw) != need:
        raise HTTPError(400, f"{role}: data holds {len(raw)} bytes, shape {shape} of "
                             f"{value['dtype']} takes {need}")
    return np.frombuffer(raw, dtype).reshape(shape)


def from_text(data: dict, tokenizer: Any) -> dict[str, Any]:
    """data's text (and text_pair) through the server's tokenizer: its feeds, or a 400."""
    if tokenizer is None:
        raise HTTPError(400, "this server takes ids only: it was started without --vocab, so "
                             "it cannot tokenize text")
    text, pair = data.get("text"), data.get("text_pair")
    if text is None:
        raise HTTPError(400, "text_pair without text")
    check_text(text, "text")
    check_text(pair, "text_pair")
    try:
        batch = tokenizer(text, pair)
    except BertfuseError as exc:
        raise HTTPError(400, str(exc)) from None
    return batch.feeds()


def request_message(message: str, limits: Limits) -> str:
    """The runtime's words, with the server's limits where they are meant."""
    if message.startswith("batch "):
        return f"{message.split(' outside')[0]} rows: a request holds 1..{limits.max_rows} " \
               "rows (the server's --max-batch)"
    if message.startswith("sequence length "):
        return f"{message.split(' outside')[0]} tokens is over the server's limit of " \
               f"{limits.max_seq} (the model's positions or --max-seq)"
    return message


# -- a batch of requests through one call -------------------------------------------------


def combine(items: Sequence[Parsed], roles: Sequence[str]) -> dict[str, np.ndarray]:
    """The requests' rows as one [sum rows, longest seq] batch per role; shorter requests
    padded on the right with id 0, mask 0, segment 0 (their mask keeps the padding out of
    every kept position's attention)."""
    rows = sum(p.rows for p in items)
    seq = max(p.seq for p in items)
    out = {}
    for role in roles:
        arr = np.zeros((rows, seq), np.int32)
        at = 0
        for p in items:
            part = p.arrays.get(role)
            if part is not None:
                arr[at:at + p.rows, :p.seq] = part
            at += p.rows
        out[role] = arr
    return out


def split(outputs: dict[str, np.ndarray], items: Sequence[Parsed],
          seq_axis: dict[str, bool]) -> list[dict[str, np.ndarray]]:
    """Each request's rows of each output it asked for, [rows, its own seq, ...] where the
    output has a sequence axis."""
    results, at = [], 0
    for p in items:
        mine = {}
        for name in p.outputs:
            part = outputs[name][at:at + p.rows]
            mine[name] = part[:, :p.seq] if seq_axis.get(name) else part
        results.append(mine)
        at += p.rows
    return results


def encode(result: dict[str, np.ndarray], encoding: str) -> dict[str, Any]:
    """The response body: {"outputs": {name: nested lists}} or, with encoding 'base64',
    {name: {"dtype", "shape", "data": little-endian bytes, base64}} (fast for wide outputs)."""
    if encoding == "base64":
        return {"outputs": {n: {"dtype": "float32", "shape": list(a.shape),
                                "data": base64.b64encode(
                                    np.ascontiguousarray(a, "<f4").tobytes()).decode()}
                            for n, a in result.items()}}
    return {"outputs": {n: a.tolist() for n, a in result.items()}}


def encode_body(result: dict[str, np.ndarray], encoding: str) -> bytes:
    """json.dumps(encode(result, encoding)), compact, as bytes. base64 is assembled from the
    encoded bytes directly: its alphabet needs no escaping in JSON, so the (wide) data need
    not pass through json.dumps's escaping scan and back."""
    if encoding != "base64":
        return json.dumps(encode(result, encoding), separators=(",", ":")).encode()
    parts = [b'{"outputs":{']
    for i, (name, a) in enumerate(result.items()):
        shape = ",".join(str(n) for n in a.shape)
        parts += [b"," if i else b"",
                  f'{json.dumps(name)}:{{"dtype":"float32","shape":[{shape}],"data":"'.encode(),
                  binascii.b2a_base64(np.ascontiguousarray(a, "<f4").data, newline=False),
                  b'"}']
    parts.append(b"}}")
    return b"".join(parts)


def decode(body: dict) -> dict[str, np.ndarray]:
    """A response's outputs as arrays (either encoding): for clients and tests."""
    out = {}
    for name, value in body["outputs"].items():
        if isinstance(value, dict):
            out[name] = np.frombuffer(base64.b64decode(value["data"]), "<f4") \
                .reshape(value["shape"])
        else:
            out[name] = np.asarray(value, np.float32)
    return out
