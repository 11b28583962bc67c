"""HAProxy's limits (haproxy_conf.py) for the ingresses without HAProxy. Serve's proxy and each
direct-ingress replica answer HTTP with uvicorn, which has no header-read timeout (a client
sending one header byte a second holds its connection for ever), no cap on one client's
connections, and tells an `Expect: 100-continue` client to go on as soon as Serve's code
reads the body, before the replica could refuse its length. Serve builds uvicorn's Config
itself, with no place for any of this, but calls RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH in
both processes just before it starts uvicorn: callback() swaps uvicorn's protocol class for
a subclass with the limits.

    Serve's proxy / replica ─► configure_http_middlewares ─► callback() ─► install(limits)
                            ─► uvicorn.Config.load (resolves "auto": the subclass) ─► serve

What the subclass adds, per connection (behind HAProxy, which holds to the first two
itself, only the last two: Serve's fallback proxy and each replica's own port listen there
too, on the loopback):
    the request line and headers within HEADER_TIMEOUT_S of their first byte (or of the
    connection): else 408 and closed (closed silently where no byte came)
    at most CLIENT_CONNS connections at once from one address (the rest closed at once)
    a Content-Length past max_body answered 413 before the app runs: never `100 Continue`
    GET /-/routes (Serve's own route table, answered by Serve's proxy and by a replica's
    direct port without reaching bertfuse's code) answered 401 without the server's bearer
    token, as every route of the replicas but the health probes (guard.check_access)

The limits travel in ENV (ingress_env sets it for the local Ray's processes, which inherit
it); a process without it gets nothing changed. The body's own deadline and byte count are
the replica's (guard.read_body), whichever ingress.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from bertfuse.optional import optional
from bertfuse.serve.guard import Access, HTTPError, check_access
from bertfuse.serve.haproxy_conf import CLIENT_CONNS, HEADER_TIMEOUT_S

ENV = "BERTFUSE_HTTP_LIMITS"  # "MAX_BODY HEADER_TIMEOUT_S CLIENT_CONNS [TOKEN_SHA256]"
CALLBACK = "bertfuse.serve.http_limits.callback"
SERVE_CALLBACK = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
# A callback of the user's own (SERVE_CALLBACK set before bertfuse serve started): still called
NEXT = "BERTFUSE_HTTP_NEXT_CALLBACK"


@dataclass(frozen=True)
class HTTPLimits:
    max_body: int
    header_timeout_s: float
    client_conns: int
    token_sha256: str | None = None  # the digest only: the token never reaches Ray

    def to_env(self) -> str:
        return " ".join([str(self.max_body), f"{self.header_timeout_s:g}",
                         str(self.client_conns), *([self.token_sha256] * bool(self.token_sha256))])

    @classmethod
    def from_env(cls, value: str) -> "HTTPLimits":
        body, timeout, conns, *token = value.split()
        return cls(int(body), float(timeout), int(conns), token[0] if token else None)


def callback() -> list[Any]:
    """Serve's proxy callback: installs the limits in ENV (if any); adds no middleware."""
    value = os.environ.get(ENV, "")
    if value:
        install(HTTPLimits.from_env(value))
    if os.environ.get(NEXT):
        import_attr = optional("ray._common.utils", "import_attr", why="Ray Serve (ray extra)")

        return list(import_attr(os.environ[NEXT])())
    return []


def env(max_body: int, token_sha256: str | None = None,
        behind_haproxy: bool = False) -> dict[str, str]:
    """The flags that put the limits (haproxy_conf's, max_body, the token's digest for
    /-/routes) in the local Ray's uvicorns. behind_haproxy: HAProxy holds to the timeout and
    the per-address cap itself (and is the replicas' one client address), so only the
    /-/routes check is added (header_timeout_s and client_conns 0: off)."""
    timeout, conns = (0, 0) if behind_haproxy else (HEADER_TIMEOUT_S, CLIENT_CONNS)
    out = {ENV: HTTPLimits(max_body, timeout, conns, token_sha256).to_env(),
           SERVE_CALLBACK: CALLBACK}
    if os.environ.get(SERVE_CALLBACK, CALLBACK) != CALLBACK:
        out[NEXT] = os.environ[SERVE_CALLBACK]
    return out


def install(limits: HTTPLimits) -> bool:
    """uvicorn's "auto" HTTP protocol becomes one with `limits`, for every uvicorn Config
    loaded after this in this process. False where uvicorn's protocol is not httptools'
    (its h11 one has other hooks): nothing changed."""
    auto = optional("uvicorn.protocols.http.auto", why="Ray Serve's HTTP server (ray extra)")

    base = getattr(auto.AutoHTTPProtocol, "_bertfuse_base", auto.AutoHTTPProtocol)
    try:
        HttpToolsProtocol = optional("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol",
                                     why="Ray Serve's HTTP server (ray extra)")
    except ImportError:
        return False
    if not issubclass(base, HttpToolsProtocol):
        return False
    auto.AutoHTTPProtocol = limited(base, limits)
    return True


def limited(base: type, limits: HTTPLimits) -> type:
    """A subclass of uvicorn's HttpToolsProtocol `base` that holds to `limits`."""
    per_client: Counter[str] = Counter()  # open connections by source address, this process

    # Answers without reading the body (so uvicorn never sends 100 Continue)
    too_large = _error_app(HTTPError(413, f"request body of more than {limits.max_body} bytes "
                                          "is over the limit", {"Connection": "close"}))

    class Limited(base):  # type: ignore[misc, valid-type]
        _bertfuse_base = base
        _bertfuse_limits = limits

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._peer = (self.client or ("?", 0))[0]
            per_client[self._peer] += 1
            self._began = False
            self._header_timer = None
            if 0 < limits.client_conns < per_client[self._peer]:
                transport.abort()  # as HAProxy's `tcp-request connection reject`
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            per_client[self._peer] -= 1
            if per_client[self._peer] <= 0:
                del per_client[self._peer]
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is None and limits.header_timeout_s > 0:
                self._header_timer = self.loop.call_later(limits.header_timeout_s,
                                                          self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self._began:
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n"
                                     b"connection: close\r\n\r\n")
            self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._began = True
            self._arm()  # a kept-alive connection's next request: its headers' clock starts

        def on_headers_complete(self) -> None:
            self._disarm()
            self._began = False
            declared = next((v for k, v in self.headers if k == b"content-length"), b"")
            refuse = None
            if declared.strip().isdigit() and int(declared) > limits.max_body:
                refuse = too_large
            elif limits.token_sha256 and b"/-/" in self.url and _routes(self.url):
                denied = _denied(self.headers, limits.token_sha256)
                refuse = _error_app(denied) if denied else None
            if refuse is not None:
                app, self.app = self.app, refuse
                try:
                    super().on_headers_complete()
                finally:
                    self.app = app
                return
            super().on_headers_complete()

    Limited.__name__ = Limited.__qualname__ = f"Limited{base.__name__}"
    return Limited


def _routes(url: bytes) -> bool:
    """The request line's target is Serve's /-/routes (as its proxy decodes the path)."""
    httptools = optional("httptools", why="uvicorn's HTTP parser (ray extra)")

    try:
        path = httptools.parse_url(url).path
    except httptools.HttpParserInvalidURLError:
        return False
    return unquote(path.decode("latin-1")).lower() == "/-/routes"


def _denied(headers: list[tuple[bytes, bytes]], token_sha256: str) -> Any:
    """guard.check_access's 401 (an HTTPError) where the request lacks the token, else None."""
    value = next((v for k, v in headers if k.lower() == b"authorization"), b"")
    try:
        check_access({"authorization": value.decode("latin-1")}, Access(token_sha256))
    except HTTPError as exc:
        return exc
    return None


def _error_app(error: Any) -> Any:
    """An ASGI app answering guard's HTTPError `error` ({"error": message}), body unread."""
    body = json.dumps({"error": error.message}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               *((k.lower().encode(), v.encode()) for k, v in error.headers.items())]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    return app
