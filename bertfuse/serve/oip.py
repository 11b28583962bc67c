"""The Open Inference Protocol (KServe v2, as Triton speaks it) on a bertfuse replica, beside
POST /v1/infer: the same checks, the same batch, the same session. tritonclient.http,
perf_analyzer and KServe's clients talk to `bertfuse serve` as they would to Triton. Here:
infer, and the model's metadata and Triton config; oip_routes.py routes every /v2 path.

    POST /v2/models/NAME[/versions/1]/infer   JSON tensors, or the binary-data extension:
         body = JSON header (Inference-Header-Content-Length bytes) + each binary input's
         bytes, in input order (its parameters.binary_data_size)
      ─► tensors -> int32 [rows, seq] roles (INT32/INT64 ids), or text/text_pair as BYTES
         tensors [rows] through the replica's WordPiece (with --vocab) ─► check_request
         (requests.py: a 4xx here never joins a batch) ─► the replica's batch or its
         straight path ─► outputs as FP32 tensors, JSON data or binary (binary_data, or
         binary_data_output for all)

NAME is the deployment's --name (default bertfuse), version "1". Errors: {"error": "<one
line>"}, 400 bad request, 404 no such model or route, 405, 408/413 (guard.read_body), 415 (a
content type but JSON or octet-stream: tritonclient sends none). No Ray here (app.py calls it).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np

from bertfuse.runtime.request_checks import RequestError, check_request
from bertfuse.serve.guard import HTTPError, check_depth, check_post, read_body
from bertfuse.serve.replica_config import ReplicaConfig
from bertfuse.serve.requests import Parsed, from_text, pick_outputs, request_message
from bertfuse.errors import BertfuseError
from bertfuse.io.triton_config import config_json, model_config
from bertfuse.optional import optional

Request = optional("starlette.requests", "Request", why="Ray Serve's HTTP types (ray extra)")
Response = optional("starlette.responses", "Response", why="Ray Serve's HTTP types (ray extra)")

HEADER = "inference-header-content-length"
VERSION = "1"
ID_TYPES = {"INT32": np.dtype("<i4"), "INT64": np.dtype("<i8")}
TEXT_INPUTS = ("text", "text_pair")
TENSOR_KEYS = {"name", "shape", "datatype", "parameters", "data"}
REQUEST_KEYS = {"id", "parameters", "inputs", "outputs"}


def response(status: int, data: Any, headers: dict | None = None) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status, headers,
                    media_type="application/json")


class OIP:
    """The /v2 infer of one replica (BertfuseReplica: facts, limits, outputs, tokenizer,
    config, counts, answer), its metadata and Triton model config (oip_routes.py routes to
    them). out_dims: declared output dims ('B', 'S', 768)."""

    def __init__(self, replica: Any, out_dims: dict[str, tuple], proto: Any) -> None:
        self.r = replica
        self.name = replica.config.name
        shape = lambda n: [-1 if isinstance(d, str) else d for d in out_dims.get(n, ("B",))]  # noqa: E731
        self.metadata = {"name": self.name, "versions": [VERSION], "platform": "onnxruntime_onnx",
                         "inputs": [{"name": n, "datatype": "INT32", "shape": [-1, -1]}
                                    for n in replica.facts.inputs],
                         "outputs": [{"name": n, "datatype": "FP32", "shape": shape(n)}
                                     for n in replica.outputs]}
        self.config = model_config_json(proto, replica.config)

    # -- infer ---------------------------------------------------------------------------------

    async def infer(self, request: Request) -> Response:
        start = time.perf_counter()
        try:
            headers = dict(request.headers)  # tritonclient sends no content type; binary
            if headers.get("content-type", "").split(";")[0].strip().lower() in \
                    ("", "application/octet-stream"):  # data is octet-stream: both fine here
                headers["content-type"] = "application/json"  # (text/plain, forms: 415)
            check_post(headers, self.r.limits.max_body)
            body = await read_body(request.stream(), self.r.limits.max_body)
            parsed, rid, binary = self.parse(body, request.headers.get(HEADER))
        except HTTPError as exc:
            self.r.failed(exc, start)
            raise
        result = await self.r.answer(parsed, start)  # /v1/infer's batch or straight path
        response = self.encode(result, rid, binary)
        self.r.times["request"].append(time.perf_counter() - start)
        return response

    def parse(self, body: bytes, header_length: str | None) -> tuple[Parsed, Any, set[str]]:
        """(the checked request, its id, the outputs it wants as binary data)."""
        head, blob = _split(body, header_length)
        check_depth(head)
        try:
            data = json.loads(head)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise HTTPError(400, f"the inference header is not valid JSON "
                                 f"({(str(exc).splitlines() or [''])[0][:80]})") from None
        data = _dict(data, "the inference request")
        unknown = sorted(set(data) - REQUEST_KEYS)
        if unknown:
            raise HTTPError(400, f"unknown field {unknown[0]!r}; fields are {sorted(REQUEST_KEYS)}")
        params = _dict(data.get("parameters"), "parameters")
        inputs = data.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise HTTPError(400, "inputs must be a non-empty list of tensors")
        strict = b"true" in head or b"false" in head  # numpy reads [1, true] as [1, 1]
        given: dict[str, Any] = {}
        at = 0
        for t in inputs:
            name, value, at = self._tensor(t, blob, at, strict)
            if name in given:
                raise HTTPError(400, f"input {name!r} is given twice")
            given[name] = value
        if at != len(blob):
            raise HTTPError(400, f"the body holds {len(blob) - at} bytes after the inputs' "
                                 "binary data (binary_data_size)")
        outputs, binary = self._outputs(data.get("outputs"), params.get("binary_data_output"))
        arrays = self._arrays(given)
        return Parsed(arrays, outputs, "oip"), data.get("id"), binary

    def _tensor(self, t: Any, blob: bytes, at: int, strict: bool) -> tuple[str, Any, int]:
        """One input tensor: (its name, int ids [rows, seq] or texts [rows], the new offset
        into the binary data)."""
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise HTTPError(400, "each input is an object with name, shape, datatype and data")
        name = t["name"]
        text = name in TEXT_INPUTS and self.r.tokenizer is not None
        if name not in self.r.facts.inputs and not text:
            known = [*self.r.facts.inputs, *(TEXT_INPUTS if self.r.tokenizer else ())]
            raise HTTPError(400, f"no input {name!r}; inputs are {', '.join(known)}"
                                 f"{' (text needs a server with --vocab)' * (name in TEXT_INPUTS)}")
        odd = sorted(set(t) - TENSOR_KEYS)
        if odd:
            raise HTTPError(400, f"input {name!r}: unknown field {odd[0]!r}")
        shape, dtype = t.get("shape"), t.get("datatype")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise HTTPError(400, f"input {name!r}: shape must be a list of sizes, not "
                                 f"{json.dumps(shape)[:24]}")
        want = ("BYTES",) if text else tuple(ID_TYPES)
        if dtype not in want:
            raise HTTPError(400, f"input {name!r}: datatype must be {' or '.join(want)}, not "
                                 f"{json.dumps(dtype)[:24]}")
        if len(shape) != (1 if text else 2) and not (text and shape[1:] == [1]):
            raise HTTPError(400, f"input {name!r}: shape {shape} must be "
                                 f"{'[rows]' if text else '[rows, seq]'}")
        if 0 in shape:
            raise HTTPError(400, f"input {name!r} is empty (shape {shape})")
        size = _dict(t.get("parameters"), f"input {name!r} parameters").get("binary_data_size")
        count = math.prod(shape)
        if size is not None:
            if "data" in t or type(size) is not int or not 0 <= size <= len(blob) - at:
                raise HTTPError(400, f"input {name!r}: binary_data_size {size!r} does not fit the "
                                     f"{len(blob) - at} binary bytes left (and takes no data field)")
            raw, at = blob[at:at + size], at + size
            if text:
                return name, _strings(raw, count, name), at
            if len(raw) != count * ID_TYPES[dtype].itemsize:
                raise HTTPError(400, f"input {name!r}: {len(raw)} bytes of binary data, shape "
                                     f"{shape} of {dtype} takes {count * ID_TYPES[dtype].itemsize}")
            return name, np.frombuffer(raw, ID_TYPES[dtype]).reshape(shape), at
        data = t.get("data")
        if not isinstance(data, list):
            raise HTTPError(400, f"input {name!r}: data must be a list (or binary data with "
                                 "parameters.binary_data_size)")
        if text:
            flat = _flat(data)
            if len(flat) != count or not all(isinstance(s, str) for s in flat):
                raise HTTPError(400, f"input {name!r}: data must be {count} strings")
            return name, flat, at  # lone surrogates: from_text's check_text
        return name, _ints(data, shape, name, strict), at

    def _arrays(self, given: dict[str, Any]) -> dict[str, np.ndarray]:
        """The roles checked as /v1/infer checks them (text through the replica's vocab)."""
        has_text = any(n in given for n in TEXT_INPUTS)
        if has_text and any(n in given for n in self.r.facts.inputs):
            raise HTTPError(400, "send either text (and text_pair) or ids, not both")
        if has_text:
            if "text_pair" in given and len(given["text_pair"]) != len(given.get("text", [])):
                raise HTTPError(400, "text_pair must have as many rows as text")
            feeds = from_text(given, self.r.tokenizer)
            given = {r: v for r, v in feeds.items() if r in self.r.facts.inputs}
        if "input_ids" not in given:
            raise HTTPError(400, "input_ids is required (or text, when the server has a vocab)")
        if "input_mask" in self.r.facts.inputs and "input_mask" not in given:
            given["input_mask"] = np.ones(given["input_ids"].shape, np.int32)
        try:
            return check_request(given, self.r.facts, self.r.limits.max_rows,
                                 self.r.limits.max_seq)
        except RequestError as exc:
            raise HTTPError(400, request_message(str(exc), self.r.limits)) from None

    def _outputs(self, value: Any, all_binary: Any) -> tuple[list[str], set[str]]:
        if all_binary is not None and not isinstance(all_binary, bool):
            raise HTTPError(400, "parameters.binary_data_output must be true or false")
        if value is None:
            names = pick_outputs(None, self.r.outputs)
            return names, set(names) if all_binary else set()
        if not isinstance(value, list) or not all(
                isinstance(o, dict) and isinstance(o.get("name"), str) for o in value):
            raise HTTPError(400, "outputs must be a list of {\"name\": ...} objects")
        names = pick_outputs([o["name"] for o in value], self.r.outputs)
        binary = set()
        for o in value:
            flag = _dict(o.get("parameters"), f"output {o['name']!r} parameters").get(
                "binary_data", bool(all_binary))
            if not isinstance(flag, bool):
                raise HTTPError(400, f"output {o['name']!r}: binary_data must be true or false")
            if flag:
                binary.add(o["name"])
        return names, binary

    def encode(self, result: dict[str, np.ndarray], rid: Any, binary: set[str]) -> Response:
        """The response: JSON, or a JSON header and the binary outputs' bytes after it."""
        outs, blobs = [], []
        for name, a in result.items():
            a = np.ascontiguousarray(a, "<f4")
            out: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": list(a.shape)}
            if name in binary:
                blobs.append(a.data)
                out["parameters"] = {"binary_data_size": a.nbytes}
            else:
                out["data"] = a.ravel().tolist()
            outs.append(out)
        head = {"model_name": self.name, "model_version": VERSION, "outputs": outs,
                **({} if rid is None else {"id": rid})}
        text = json.dumps(head, separators=(",", ":")).encode()
        if not blobs:
            return Response(text, media_type="application/json")
        return Response(b"".join([text, *blobs]), media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(len(text))})


def model_config_json(proto: Any, config: ReplicaConfig) -> dict[str, Any]:
    """The deployment's Triton model config (io/triton_config.py, export-triton's builder):
    the served outputs, max_batch, a replica per instance, --max-wait-ms as the queue delay,
    --cpu-threads as ORT's intra-op threads. A model it cannot describe: {"error": why}."""
    try:
        return config_json(model_config(
            proto, config.name, config.max_batch, config.replicas,
            "gpu" if config.device == "cuda" else "cpu", round(config.max_wait_ms * 1000),
            config.cpu_threads, outputs=config.outputs))
    except BertfuseError as exc:
        return {"error": str(exc)}


# -- pieces -----------------------------------------------------------------------------------


def _split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(the JSON header, the binary data after it)."""
    if header_length is None:
        return body, b""
    n = int(header_length) if header_length.strip().isdigit() else -1
    if not 0 < n <= len(body):
        raise HTTPError(400, f"Inference-Header-Content-Length {header_length[:24]!r} is not "
                             f"a length within the body's {len(body)} bytes")
    return body[:n], body[n:]


def _dict(value: Any, what: str) -> dict:
    if value is not None and not isinstance(value, dict):
        raise HTTPError(400, f"{what} must be a JSON object")
    return value or {}


def _flat(data: list) -> list:
    """Nested lists (row-major) flattened; the protocol allows both forms."""
    out, todo = [], [iter(data)]
    while todo:
        for v in todo[-1]:
            if isinstance(v, list):
                todo.append(iter(v))
                break
            out.append(v)
        else:
            todo.pop()
    return out


def _ints(data: list, shape: list[int], name: str, strict: bool) -> np.ndarray:
    """JSON ids, flat or nested, as an int64 array of `shape`. numpy's own conversion is
    the fast path; `strict` (the header holds true/false) looks at each value in Python."""
    try:
        arr = np.array(data)
    except (ValueError, OverflowError):  # ragged nesting, or past int64: looked at below
        arr = None
    if arr is None or arr.dtype.kind not in "iu" or strict:
        flat = _flat(data)
        bad = next((v for v in flat if type(v) is not int), None)
        if bad is not None or not flat:
            raise HTTPError(400, f"input {name!r} must hold integer ids, got {json.dumps(bad)[:24]}")
        try:
            arr = np.array(flat, np.int64)
        except OverflowError:
            raise HTTPError(400, f"input {name!r}: an id does not fit in 64 bits") from None
    if arr.size != math.prod(shape):
        raise HTTPError(400, f"input {name!r}: {arr.size} values, shape {shape} takes {math.prod(shape)}")
    return arr.reshape(shape)


def _strings(raw: bytes, count: int, name: str) -> list[str]:
    """The binary BYTES form: each element a 4-byte little-endian length and its bytes."""
    out, at = [], 0
    while at + 4 <= len(raw) and len(out) < count:
        n = int.from_bytes(raw[at:at + 4], "little")
        out.append(raw[at + 4:at + 4 + n])
        at += 4 + n
    if len(out) != count or at != len(raw):
        raise HTTPError(400, f"input {name!r}: the data is not {count} length-prefixed strings")
    try:
        return [b.decode("utf-8") for b in out]
    except UnicodeDecodeError:
        raise HTTPError(400, f"input {name!r}: text is not UTF-8") from None
