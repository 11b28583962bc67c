"""What an HTTP request must pass before its body is parsed, for every route that takes one
(POST /v1/infer here, the Open Inference Protocol routes beside it):

    headers ─► check_access: the bearer token (when the server has one), a loopback Host
               when the server listens on the loopback only (DNS rebinding)
            ─► check_post: a JSON content type (a web page's form or text/plain post is
               refused before any work: browsers send those cross-site without asking)
    body    ─► read_body: bytes counted as they arrive, whatever the framing (Content-Length
               or chunked), cut off at the limit (413) or past the body deadline (408)
            ─► check_depth: JSON nesting bounded before json.loads recurses into it

requests.py parses what passes (and raises HTTPError, defined here, the lowest room).
No Ray here: the replica (app.py) calls these, and tests call them directly.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

from bertfuse.io.limits import json_depth


class HTTPError(Exception):
    """A request answered with `status` and {"error": message} (and any `headers`); the
    service goes on."""

    def __init__(self, status: int, message: str,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})

# A request's JSON is at most 3 deep ({"input_ids": [[...]]}, {"input_ids": {"shape": [..]}});
# 32 leaves room for any client's formatting and keeps json.loads far from its recursion limit.
MAX_DEPTH = 32
# The whole body must arrive within this many seconds of the request reaching the replica: a
# body that stops short of its length, or trickles, holds a connection this long at most.
BODY_TIMEOUT_S = 30.0
LOOPBACK_NAMES = ("localhost", "localhost.", "ip6-localhost")
REALM = 'Bearer realm="bertfuse"'  # the WWW-Authenticate of a 401
UNAUTHORIZED = ("this server needs 'Authorization: Bearer <token>' (its --token-file or "
                "BERTFUSE_TOKEN)")


@dataclass(frozen=True)
class Access:
    """Who may call: token_sha256 (hex) of the bearer token, or None for no token; loopback:
    the server listens on the loopback only, so Host must name it."""

    token_sha256: str | None = None
    loopback: bool = False


def token_digest(token: str) -> str:
    """What the replicas keep of the token (the token itself never travels to Ray)."""
    return hashlib.sha256(token.encode()).hexdigest()


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_access(headers: Mapping[str, str], access: Access) -> None:
    """The token and the Host header of any route but /healthz: 401, 421 or nothing."""
    if access.loopback:
        host = headers.get("host", "")
        if host.startswith("["):  # [v6]:port
            name = host[1:host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        if host and not is_loopback(name):
            raise HTTPError(421, f"Host {host[:64]!r} is not this server: it listens on the "
                                 "loopback only (start it with --host to serve other names)")
    if access.token_sha256 is None:
        return
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
            token_digest(given.strip()), access.token_sha256):
        raise HTTPError(401, UNAUTHORIZED,
                        headers={"WWW-Authenticate": REALM})


def check_post(headers: Mapping[str, str], max_body: int) -> int | None:
    """A POST's headers before its body is read (check_access has run for every route): a
    JSON content type, and a declared length within max_body (413 before a byte is read, so
    `Expect: 100-continue` is never told to go on). Returns the declared length, or None
    (chunked: read_body counts it)."""
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/")
                                            and media.endswith("+json")):
        raise HTTPError(415, f"POST a JSON body with 'Content-Type: application/json', not "
                             f"{media or 'none'!r} (curl: -H 'Content-Type: application/json')")
    declared = headers.get("content-length")
    if declared is None:
        return None
    if not declared.strip().isdigit():
        raise HTTPError(400, f"Content-Length {declared[:24]!r} is not a byte count")
    length = int(declared)
    if length > max_body:
        raise HTTPError(413, f"request body of {length} bytes is over the limit of "
                             f"{max_body}", headers={"Connection": "close"})
    return length


async def read_body(chunks: AsyncIterator[bytes], max_body: int,
                    timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The body from `chunks` (Starlette's request.stream()), counted as it arrives: past
    max_body it is refused at once (413) with the rest never read, and a body not complete
    within timeout_s is refused (408); either way the connection is closed after."""
    parts: list[bytes] = []
    got = 0
    try:
        async with asyncio.timeout(timeout_s):  # no task of its own: cheap per request
            async for chunk in chunks:
                got += len(chunk)
                if got > max_body:
                    raise HTTPError(413, f"request body of more than {max_body} bytes is "
                                         "over the limit", headers={"Connection": "close"})
                parts.append(chunk)
    except TimeoutError:
        raise HTTPError(408, f"the request body did not arrive within {timeout_s:g} s "
                             f"({got} bytes came)", headers={"Connection": "close"}) from None
    return b"".join(parts)


def check_depth(body: bytes, limit: int = MAX_DEPTH) -> None:
    """400 when the JSON in `body` nests deeper than `limit` (json.loads would recurse once per
    level and fail with RecursionError): brackets counted outside strings, vectorised."""
    if body.count(b"[") + body.count(b"{") <= limit:  # the common case: nothing to scan
        return
    if json_depth(body) > limit:
        raise HTTPError(400, f"body is nested more than {limit} levels deep; a request is 3")


def check_text(value: Any, name: str) -> None:
    """400 for a lone surrogate (JSON's "\\ud800" decodes to one): not text a tokenizer can
    take, and not UTF-8 an error message could echo."""
    for text in ([value] if isinstance(value, str) else value if isinstance(value, list) else ()):
        if isinstance(text, str) and not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise HTTPError(400, f"{name} holds a lone surrogate (U+{ord(text[exc.start]):04X}"
                                     f") at character {exc.start}: send UTF-8 text") from None
