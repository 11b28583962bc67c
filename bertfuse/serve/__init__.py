"""`bertfuse serve`: bertfuse's runtime on Ray Serve, in rooms that import only downwards:

    guard (headers, token, body read as it arrives, JSON depth, surrogates)
      ─► config (ServeConfig, checked keywords)
           ─► replica_config (ReplicaConfig: one replica's typed settings, once placed)
      ─► requests (JSON body -> checked arrays; a batch -> one run -> split)
           ─► oip (the Open Inference Protocol, KServe v2 as Triton speaks it: infer, the
                   model's metadata and Triton config)
    infer_stats (Triton's statistics: counts and nanoseconds per request and model call)
    oip, infer_stats ─► oip_routes (every /v2 route as Triton answers it)
    replica_config, requests, oip, oip_routes ─► app (the Serve deployment: a warmed Session per replica,
                                  serve.batch, the HTTP routes of both protocols)
    haproxy_conf (limits added to Serve's HAProxy config)
      ─► http_limits (the same limits in uvicorn, for the proxy and direct ingresses)
      ─► ingress (auto | proxy | direct | haproxy)
      ─► routes (start-up: ready once every HAProxy accepting on the port routes to a replica)
    quiesce (SIGTERM's drain: HAProxy's listener closed with no connection queued)
    app, ingress, routes, quiesce ─► api (deploy() -> Served) ─► command (CLI)

    served = bertfuse.serve.deploy(model="model.onnx", max_batch=32, vocab="vocab.txt")
    ... POST served.url + "v1/infer" ...
    served.shutdown()

Importing this package does not import Ray: deploy() does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bertfuse.serve.api import deploy as _deploy
from bertfuse.serve.config import ServeConfig

if TYPE_CHECKING:
    from bertfuse.serve.api import Served
    from bertfuse.serve.config import ServeConfig


def __getattr__(name: str) -> Any:  # PEP 562: the CLI's parser imports this package
    if name == "ServeConfig":
        return ServeConfig
    raise AttributeError(name)


def deploy(model: Any = None, **kwargs: Any) -> "Served":
    """bertfuse.serve.api.deploy (see there); imports Ray on call."""
    return _deploy(model, **kwargs)


__all__ = ["ServeConfig", "deploy"]
