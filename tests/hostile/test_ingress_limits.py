"""HAProxy's limits with the other two ingresses: a real `bertfuse serve --ingress proxy` and
`--ingress direct` (Serve's proxy, or the replica's own uvicorn), loopback only, each case
bounded in seconds: `Expect: 100-continue` with a length past the limit gets 413 and never
100, headers sent a byte a second are cut off after HEADER_TIMEOUT_S, and one address
cannot hold more than CLIENT_CONNS connections while another address is still answered;
Serve's /-/routes wants the token."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

pytest.importorskip("ray")

from bertfuse.serve.haproxy_conf import CLIENT_CONNS, HEADER_TIMEOUT_S  # noqa: E402
from hostile.test_serve_network import TOKEN, Server, model, raw  # noqa: E402,F401
from hostile.test_serve_network import good as good_at  # noqa: E402
from unit.serve.test_serve import free_port  # noqa: E402


class Endpoint:
    """Where clients post: Serve's proxy on --port, or (direct) the replica's own port."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.port = urlsplit(server.info["urls"][0]).port

    def good(self, source: str = "127.0.0.1") -> None:
        good_at(self.port, source)


@pytest.fixture(scope="module", params=["proxy", "direct"])
def endpoint(request, model):
    s = Server(model, free_port(), "--token-file", model["token"], "--ingress", request.param)
    try:
        yield Endpoint(s)
    finally:
        s.stop()


def test_expect_continue_with_a_huge_length_is_413_not_100(endpoint):
    got = raw(endpoint.port, (f"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                              f"application/json\r\nAuthorization: Bearer {TOKEN}\r\n"
                              f"Content-Length: 1000000000\r\nExpect: 100-continue\r\n\r\n"
                              ).encode())
    assert got.startswith(b"HTTP/1.1 413"), got[:100]
    endpoint.good()


def test_headers_a_byte_a_second_are_cut_off(endpoint):
    """The request line and headers, one byte a second, never finished: the server answers
    408 or closes after HEADER_TIMEOUT_S, not when the client gives up."""
    line = b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    closed = threading.Event()
    answer: list[bytes] = []
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as s:
        def reader() -> None:
            s.settimeout(HEADER_TIMEOUT_S + 15)
            try:
                answer.append(s.recv(200))
            except OSError:
                answer.append(b"")
            closed.set()

        threading.Thread(target=reader, daemon=True).start()
        start = time.monotonic()
        for byte in line:
            if closed.is_set() or time.monotonic() - start > HEADER_TIMEOUT_S + 10:
                break
            try:
                s.send(bytes([byte]))
            except OSError:
                break
            closed.wait(1.0)
        closed.wait(5)
        took = time.monotonic() - start
    assert closed.is_set() and took < HEADER_TIMEOUT_S + 5, (took, answer)
    assert answer[0] == b"" or answer[0].startswith(b"HTTP/1.1 408"), answer
    endpoint.good()


def test_one_client_cannot_take_every_connection(endpoint):
    """CLIENT_CONNS + 20 connections from 127.0.0.1, stuck in their headers: the ones past the
    cap are closed at once, and a client at 127.0.0.2 is answered meanwhile."""
    stuck = []
    try:
        for _ in range(CLIENT_CONNS + 20):
            s = socket.create_connection(("127.0.0.1", endpoint.port), timeout=5)
            s.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            stuck.append(s)
        time.sleep(1.0)
        open_ = 0
        for s in stuck:
            s.settimeout(0.05)
            try:
                if s.recv(1) != b"":
                    open_ += 1
            except socket.timeout:
                open_ += 1  # still held open by the server
            except OSError:
                pass
        assert open_ <= CLIENT_CONNS and len(stuck) - open_ >= 20, open_
        endpoint.good(source="127.0.0.2")
    finally:
        for s in stuck:
            s.close()
    endpoint.good()


def test_serves_route_table_wants_the_token(endpoint):
    """GET /-/routes, which Serve's proxy (and a replica's direct port) answers without
    reaching bertfuse's code: 401 without the token, Serve's route table with it. The
    health probes stay open."""
    def get(path: str, auth: str) -> bytes:
        return raw(endpoint.port, (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
                                   "Connection: close\r\n\r\n").encode())

    for auth in ("", "Authorization: Bearer wrong\r\n"):
        got = get("/-/routes", auth)
        assert got.startswith(b"HTTP/1.1 401"), got[:200]
    assert get("/-/routes", f"Authorization: Bearer {TOKEN}\r\n").startswith(b"HTTP/1.1 200")
    for path in ("/-/healthz", "/healthz", "/readyz"):
        assert get(path, "").startswith(b"HTTP/1.1 200"), path
    endpoint.good()
