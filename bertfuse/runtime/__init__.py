"""The serving runtime, in rooms that import only downwards:

    request_checks (checks, model facts)
    -> kernel_choice (contrib or bertfuse's ops, chosen at load)
    -> options -> progress -> pinned -> graphs (CUDA graphs captured around ORT's run)
    -> device (providers, staging, capture gate, replay)
    -> variants -> staging (the native fast lane for warm buckets)
    -> buckets (a bucket's buffers, bindings, own graphs, checked variants)
    -> padded (PaddedSession) -> packed -> session (Session) -> pool

`from bertfuse.runtime import Session, SessionOptions, SessionPool` is the entry point.
"""

from bertfuse.runtime.device import GATE, CaptureGate, ThreadError
from bertfuse.runtime.options import SessionOptions
from bertfuse.runtime.packed import PackedSession
from bertfuse.runtime.pool import NestedCallError, SessionPool
from bertfuse.runtime.request_checks import ClosedError, ConfigError, RequestError
from bertfuse.runtime.session import Session
from bertfuse.runtime.padded import PaddedSession

__all__ = ["GATE", "CaptureGate", "ClosedError", "ConfigError", "NestedCallError",
           "PackedSession", "PaddedSession", "RequestError", "Session", "SessionOptions",
           "SessionPool", "ThreadError"]
