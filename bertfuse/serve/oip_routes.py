"""The Open Inference Protocol's routes on a replica, as Triton answers them (its HTTP/REST
protocol and extensions): every call of tritonclient.http's InferenceServerClient gets
Triton's answer, or, for what serves no purpose here, the error Triton gives when that
feature is off. Behind the bearer token like every route but the health probes (app.py).

    GET  /v2                                  server metadata: name, version, extensions
    GET  /v2/health/live, /v2/health/ready    200 while the process answers / is warm
    POST /v2/repository/index                 [{name, version "1", state READY, reason}]
    POST /v2/repository/models/NAME/load, /unload
                                              501: the one model serve was started with
    GET  /v2/models/stats                     every model's statistics (this one's)
    /v2/models/NAME[/versions/1] ...
      GET  (metadata)  inputs, outputs, datatypes, shapes              (oip.py)
      GET  /ready      200 while warm
      GET  /config     Triton's model config as JSON: the ModelConfig export-triton writes
                       as config.pbtxt (io/triton_config.py), for this deployment
      GET  /stats      Triton's statistics extension: model_stats[] summed over every
                       replica (infer_stats.py; app.py keeps them in Ray's key-value store)
      POST /infer      oip.py
    GET  /v2/systemsharedmemory/status, /v2/cudasharedmemory/status   [] (no regions)
    POST .../region/R/register                501: tensors travel in the request body
    POST .../unregister                       200: nothing is registered
    /v2/trace/setting, /v2/models/NAME/trace/setting, /v2/logging   501: not supported

Errors: {"error": "<one line>"} with Triton's statuses (400, 404, 405, 501, 503). No Ray here.
"""

from __future__ import annotations

import json
from typing import Any

from bertfuse._version import __version__
from bertfuse.serve.guard import HTTPError, read_body
from bertfuse.serve.infer_stats import triton_stats
from bertfuse.serve.oip import OIP, VERSION, response
from bertfuse.optional import optional

Request = optional("starlette.requests", "Request", why="Ray Serve's HTTP types (ray extra)")
Response = optional("starlette.responses", "Response", why="Ray Serve's HTTP types (ray extra)")

EXTENSIONS = ["binary_tensor_data", "model_repository", "model_configuration", "statistics"]
# Triton's own words when model control is off (tools match them), then why. Triton's status
# for it is 503; 501 here, because Serve's HAProxy retries a 503 on another replica and then
# answers its own 500 "Internal Server Error" (seen through the haproxy ingress).
NO_LOAD = ("explicit model load / unload is not allowed: bertfuse serve serves the one model "
           "it was started with (start another serve for another model)")
NO_SHM = ("{kind} shared memory is not supported by bertfuse serve: send tensors in the "
          "request body (JSON, or binary data with Inference-Header-Content-Length)")
INDEX_BODY = 4096  # POST /v2/repository/index's body: {"ready": true} at most


async def route(oip: OIP, request: Request, path: str, method: str) -> Response:
    """Any /v2 route; an error as {"error": ...} with its status."""
    try:
        return await _route(oip, request, path, method)
    except HTTPError as exc:
        return response(exc.status, {"error": exc.message}, exc.headers)


async def _route(oip: OIP, request: Request, path: str, method: str) -> Response:
    parts = path.split("/")[2:]  # "", "v2", ...
    head = parts[:1]
    if head == ["models"]:
        return await _models(oip, request, parts[1:], method)
    if head == ["repository"]:
        return await _repository(oip, request, parts[1:], method)
    if head in (["systemsharedmemory"], ["cudasharedmemory"]):
        return _shared_memory(parts, method)
    if head in (["trace"], ["logging"]):
        raise HTTPError(501, f"{head[0]} is not supported by bertfuse serve (its logs: "
                             "--access-log and Ray's session folder)")
    _get(method, path)
    if not parts:
        return response(200, {"name": "bertfuse", "version": __version__,
                              "extensions": EXTENSIONS})
    if parts == ["health", "live"]:
        return response(200, {"live": True})
    if parts == ["health", "ready"]:
        return oip.r.readyz()
    raise HTTPError(404, f"no route {path}; the v2 routes are /v2, /v2/health/live|ready, "
                         f"/v2/repository/index, /v2/models/{oip.name}[/versions/{VERSION}]"
                         "[/ready|/config|/stats|/infer]")


def _get(method: str, what: str) -> None:
    if method not in ("GET", "HEAD"):
        raise HTTPError(405, f"{what} takes GET, not {method}")


def _ready(oip: OIP) -> bool:
    return bool(oip.r.ready and not oip.r.pool.closed)


async def _repository(oip: OIP, request: Request, parts: list[str], method: str) -> Response:
    if parts == ["index"]:
        if method != "POST":
            raise HTTPError(405, f"/v2/repository/index takes POST, not {method}")
        body = (await read_body(request.stream(), INDEX_BODY)).strip()
        try:
            ask = json.loads(body) if body else {}
        except (UnicodeDecodeError, ValueError):
            raise HTTPError(400, "the repository index request is not JSON") from None
        if not isinstance(ask, dict) or not isinstance(ask.get("ready", False), bool):
            raise HTTPError(400, 'the repository index request is {"ready": true|false}')
        ready = _ready(oip)
        entry = {"name": oip.name, "version": VERSION, "state": "READY" if ready else
                 "UNAVAILABLE", "reason": "" if ready else "the session is closed"}
        return response(200, [entry] if ready or not ask.get("ready") else [])
    if len(parts) == 3 and parts[0] == "models" and parts[2] in ("load", "unload"):
        if method != "POST":
            raise HTTPError(405, f"{parts[2]} takes POST, not {method}")
        raise HTTPError(501, NO_LOAD)
    raise HTTPError(404, f"no route /v2/repository/{'/'.join(parts)}; the repository routes "
                         "are /v2/repository/index and /v2/repository/models/NAME/load|unload")


def _shared_memory(parts: list[str], method: str) -> Response:
    kind = "system" if parts[0] == "systemsharedmemory" else "CUDA"
    action = parts[-1] if len(parts) > 1 else ""
    if action == "status" and len(parts) in (2, 4):
        _get(method, "status")
        if len(parts) == 4:  # a named region: none exists
            raise HTTPError(404, f"Unable to find {kind} shared memory region: {parts[2]!r}")
        return response(200, [])
    if action in ("register", "unregister") and len(parts) in (2, 4):
        if method != "POST":
            raise HTTPError(405, f"{action} takes POST, not {method}")
        if action == "register":
            raise HTTPError(501, NO_SHM.format(kind=kind))
        return response(200, {})  # nothing was registered, so nothing is left to unregister
    raise HTTPError(404, f"no route /v2/{'/'.join(parts)}")


async def _models(oip: OIP, request: Request, parts: list[str], method: str) -> Response:
    if parts == ["stats"]:  # every model's
        _get(method, "stats")
        return response(200, {"model_stats": [_stats(oip)]})
    if parts[:1] != [oip.name]:
        raise HTTPError(404, f"no model {(parts or [''])[0]!r}; this server serves {oip.name!r}")
    rest = parts[1:]
    if rest[:1] == ["versions"]:
        if rest[1:2] != [VERSION]:
            raise HTTPError(404, f"model {oip.name!r} has version {VERSION} only")
        rest = rest[2:]
    if rest == ["infer"]:
        if method == "POST":
            return await oip.infer(request)
        raise HTTPError(405, f"infer takes POST, not {method}")
    if rest == ["trace", "setting"]:
        raise HTTPError(501, "trace is not supported by bertfuse serve")
    _get(method, f"model {(rest or ['metadata'])[0]}")
    if not rest:
        return response(200, oip.metadata)
    if rest == ["ready"]:
        return oip.r.readyz()
    if rest == ["config"]:
        if "error" in oip.config:
            raise HTTPError(500, f"no Triton model config: {oip.config['error']}")
        return response(200, oip.config)
    if rest == ["stats"]:
        return response(200, {"model_stats": [_stats(oip)]})
    raise HTTPError(404, f"no route {'/'.join(rest)!r} of model {oip.name!r}: metadata, ready, "
                         "config, stats, infer")


def _stats(oip: OIP) -> dict[str, Any]:
    try:
        summed = oip.r.all_stats()
    except Exception as exc:  # Ray's store (the GCS) unreachable: no partial sums
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise HTTPError(503, f"the replicas' statistics could not be read from Ray's "
                             f"key-value store: {why}") from None
    return triton_stats(oip.name, VERSION, summed)
