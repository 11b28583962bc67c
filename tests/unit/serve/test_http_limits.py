"""http_limits on a real uvicorn (the server Serve's proxy and replicas run), without Ray: a
length past the limit is 413 before the app runs (never 100 Continue), headers that do not
finish in time get 408, one address's connections past the cap are closed, and the rest of
uvicorn's behaviour (a good request, keep-alive) is unchanged."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("httptools")

import uvicorn.protocols.http.auto as auto  # noqa: E402

from bertfuse.serve import http_limits  # noqa: E402
from bertfuse.serve.guard import token_digest  # noqa: E402
from bertfuse.serve.http_limits import HTTPLimits  # noqa: E402

TOKEN = "limits-token"
LIMITS = HTTPLimits(max_body=1000, header_timeout_s=1.0, client_conns=3,
                    token_sha256=token_digest(TOKEN))


async def app(scope, receive, send) -> None:
    body = b""
    while True:  # reading the body: uvicorn sends 100 Continue here, if asked
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    out = b"got %d" % len(body)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


@pytest.fixture(scope="module")
def port():
    original = auto.AutoHTTPProtocol
    assert http_limits.install(LIMITS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        number = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=number,
                                           log_level="critical", lifespan="off"))
    server.install_signal_handlers = lambda: None
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield number
    finally:
        server.should_exit = True
        thread.join(10)
        auto.AutoHTTPProtocol = original


def exchange(port: int, data: bytes, wait_s: float = 3.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(4096):
                out += chunk
                last = out.rsplit(b"HTTP/1.1 ", 1)[-1]  # after any 100 Continue
                head, sep, body = last.partition(b"\r\n\r\n")
                if sep and not last.startswith(b"100"):
                    length = [ln.split(b":")[1] for ln in head.lower().split(b"\r\n")
                              if ln.startswith(b"content-length:")]
                    if len(body) >= int(length[0]) if length else True:
                        break
        except (socket.timeout, ConnectionResetError):
            pass
        return out


def test_the_limits_travel_in_one_variable():
    assert HTTPLimits.from_env(LIMITS.to_env()) == LIMITS
    env = http_limits.env(1234)
    assert env[http_limits.SERVE_CALLBACK] == http_limits.CALLBACK
    assert HTTPLimits.from_env(env[http_limits.ENV]).max_body == 1234
    assert HTTPLimits.from_env(env[http_limits.ENV]).token_sha256 is None


@pytest.mark.parametrize("path", [b"/-/routes", b"/-/routes?x=1", b"/-/%72outes", b"/-/ROUTES"])
@pytest.mark.parametrize("auth", [b"", b"Authorization: Bearer wrong\r\n",
                                  b"Authorization: Basic limits-token\r\n"])
def test_serves_route_table_wants_the_token(port, path, auth):
    """Serve's proxy answers GET /-/routes itself (the replicas' token check never runs):
    the protocol answers 401 first, as the replicas would."""
    got = exchange(port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n")
    assert got.startswith(b"HTTP/1.1 401") and b"Bearer <token>" in got, got
    assert b'www-authenticate: bearer realm="bertfuse"' in got.lower(), got


def test_serves_route_table_with_the_token_and_other_routes_without(port):
    got = exchange(port, b"GET /-/routes HTTP/1.1\r\nHost: x\r\nAuthorization: bearer "
                         b"limits-token\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"got 0"), got  # the app ran
    for path in (b"/-/healthz", b"/healthz", b"/-/routes/x"):  # the replicas' own checks
        got = exchange(port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200"), (path, got)


def test_content_length_beside_chunked_is_400(port):
    """Conflicting framing (RFC 9112 6.3): uvicorn's parser refuses it before the app runs,
    whichever header comes first; the connection is closed."""
    for headers in (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                    b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"):
        got = exchange(port, b"POST / HTTP/1.1\r\nHost: x\r\n" + headers +
                       b"\r\n5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 400") and got.count(b"HTTP/1.1 ") == 1, got


def test_a_good_request_is_answered(port):
    got = exchange(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"got 5"), got


def test_expect_continue_past_the_limit_is_413_not_100(port):
    got = exchange(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n"
                         b"Expect: 100-continue\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 413") and b"connection: close" in got.lower(), got
    within = exchange(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                            b"Expect: 100-continue\r\n\r\n" + b"a" * 1000)
    assert within.startswith(b"HTTP/1.1 100") or within.startswith(b"HTTP/1.1 200"), within


def test_headers_late_get_408(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        start = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finished
        got = s.recv(200)
        took = time.monotonic() - start
    assert got.startswith(b"HTTP/1.1 408") and LIMITS.header_timeout_s - 0.2 < took < 4, (got, took)


def test_an_idle_connection_is_closed_silently(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        assert s.recv(200) == b""


def test_one_address_holds_at_most_the_cap(port):
    held = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(5)]
    try:
        time.sleep(0.3)
        closed = 0
        for s in held:
            s.settimeout(0.1)
            try:
                closed += s.recv(1) == b""
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed == 2, closed
        other = socket.create_connection(("127.0.0.1", port), timeout=2,
                                         source_address=("127.0.0.2", 0))
        with other:
            other.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na")
            assert other.recv(200).startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()


CALLED: list[str] = []


def user_callback() -> list:
    """A user's own Serve proxy callback (its import path set before bertfuse serve ran)."""
    CALLED.append("yes")
    return ["a middleware"]


def test_a_users_own_callback_is_still_called(monkeypatch):
    import uvicorn.protocols.http.auto as auto

    monkeypatch.setattr(auto, "AutoHTTPProtocol", auto.AutoHTTPProtocol)  # put back after
    monkeypatch.setenv(http_limits.SERVE_CALLBACK, f"{__name__}.user_callback")
    env = http_limits.env(1000)
    assert env[http_limits.SERVE_CALLBACK] == http_limits.CALLBACK
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert http_limits.callback() == ["a middleware"] and CALLED == ["yes"]
