"""The bearer token of a real `bertfuse serve` (HAProxy in front of one CPU replica, a tiny
BERT), given the way that most often leaks it: the environment's BERTFUSE_TOKEN. One server
for the module. The token's value is in none of the environments of the processes it starts
(Ray's, HAProxy, the watchdog: before, all 14 held it); Serve's /-/routes, answered by HAProxy
itself, wants the token as every other route but the health probes; a request with both
Content-Length and Transfer-Encoding cannot smuggle a second request past HAProxy. Without
Ray: a token file that others may read is refused, one line, exit 2, unless allowed."""

from __future__ import annotations

import json
import secrets
import socket
import time

import psutil
import pytest

from bertfuse import cli
from bertfuse.serve.config import check_config
from bertfuse.serve.guard import token_digest
from bertfuse.runtime.request_checks import ConfigError

pytest.importorskip("ray")

from hostile.test_serve_network import Server, model  # noqa: E402,F401
from support.processes import descendants, listeners, process_name  # noqa: E402
from unit.serve.test_serve import free_port  # noqa: E402

TOKEN = f"env-token-{secrets.token_hex(12)}"


@pytest.fixture(scope="module")
def server(model):
    s = Server(model, free_port(), env={"BERTFUSE_TOKEN": TOKEN})
    try:
        yield s
    finally:
        s.stop()


def exchange(port: int, data: bytes, wait_s: float = 10.0) -> bytes:
    """Sends `data` on a fresh connection; everything that comes back until the server closes
    it (or wait_s passes)."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        deadline = time.monotonic() + wait_s
        try:
            while time.monotonic() < deadline and (chunk := s.recv(65536)):
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    return out


def get(port: int, path: str, auth: str | None) -> tuple[int, bytes]:
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if auth is not None:
        head += f"Authorization: {auth}\r\n"
    answer = exchange(port, (head + "\r\n").encode())
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split()[1]), answer.partition(b"\r\n\r\n")[2]


def _environ(pid: int) -> bytes | None:
    """The process's environment as it was started, NUL-separated (psutil parses it into a
    dict; the raw bytes let a value be found under any name)."""
    try:
        return b"\0".join(f"{k}={v}".encode("utf-8", "surrogateescape")
                           for k, v in psutil.Process(pid).environ().items())
    except psutil.Error:  # gone, or another user's
        return None


def test_the_token_is_in_no_environment_of_the_processes_serve_starts(server):
    """Every descendant of the serve process (the watchdog, gcs_server, raylet, Ray's
    workers, HAProxy under Serve's worker), and any other process of this machine that we
    can read, holds the token's value nowhere in /proc/PID/environ. The serve process itself
    is left out: its environ is the one it was started with (os.environ changes do not show
    there)."""
    children = descendants(server.proc.pid)
    names = {pid: process_name(pid) for pid in children}
    assert {"gcs_server", "raylet", "haproxy"} <= set(names.values()), names
    assert any(n.startswith("ray::") for n in names.values()), names
    value = TOKEN.encode()
    everyone = psutil.pids()
    held = [(pid, names.get(pid, "?")) for pid in everyone
            if pid != server.proc.pid and value in (_environ(pid) or b"")]
    assert not held, f"the token is in the environment of {held}"
    assert sum(_environ(pid) is not None for pid in children) >= 8, names  # all read
    # the replicas still check it: the token came through the deployment's config
    assert get(server.port, "/stats", None)[0] == 401
    assert get(server.port, "/stats", f"Bearer {TOKEN}")[0] == 200


@pytest.mark.parametrize("auth", [None, "", "Bearer wrong", f"Basic {TOKEN}",
                                  f"Bearer {TOKEN} more"])
def test_serves_route_table_wants_the_token(server, auth):
    status, body = get(server.port, "/-/routes", auth)
    assert status == 401 and "Bearer" in json.loads(body)["error"], (status, body[:200])


def test_serves_route_table_with_the_token_and_the_health_probes_without(server):
    status, body = get(server.port, "/-/routes", f"bearer  {TOKEN}")
    assert status == 200 and json.loads(body) == {"/": "bertfuse"}, (status, body[:200])
    for path in ("/-/healthz", "/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
        assert get(server.port, path, None)[0] == 200, path


def test_no_port_of_the_service_gives_the_route_table_without_the_token(server):
    """Behind HAProxy, Serve's fallback proxy and the replica's own port listen too (on the
    loopback) and answered /-/routes to anyone: every port that serve's processes listen on
    is asked; none gives the route table, and the three HTTP ones of Serve refuse."""
    refused, leaks, other = [], [], []
    ask = b"GET /-/routes HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    # names taken before asking: a process may be gone by the time its answer is read
    # (HAProxy's old worker after a reload answered, then exited: it showed as '?')
    ports = [(port, process_name(pid))
             for _, port, pid in listeners(descendants(server.proc.pid))]
    for port, name in ports:
        got = b""
        # 3 s for the many gRPC ports that never answer HTTP; Serve's own HTTP ports get a
        # second, longer try (a loaded 2-core CI host answered one of them late).
        for wait_s in (3, 20) if name.startswith(("haproxy", "ray::")) else (3,):
            try:
                got = exchange(port, ask, wait_s=wait_s)
            except OSError:
                break
            if got.startswith(b"HTTP/"):
                break
        if b"bertfuse" in got.partition(b"\r\n\r\n")[2] and got.startswith(b"HTTP/1.1 200"):
            leaks.append((port, name))
        elif got.startswith(b"HTTP/1.1 401") and b"Bearer <token>" in got:
            refused.append(name)
        else:
            other.append((port, name, got[:80]))
    assert not leaks, leaks
    # (process names as /proc/PID/comm keeps them: 15 characters)
    assert {"haproxy", "ray::ProxyActor", "ray::ServeRepli"} <= set(refused), (refused, other)


def test_content_length_beside_chunked_cannot_smuggle_a_request(server):
    """HAProxy 2.8 keeps no Content-Length beside `Transfer-Encoding: chunked` (RFC 9112
    6.3: the chunked framing wins): it reads the chunked body, forwards it without the
    length, answers once and closes the connection, so the request hidden after the body
    (which a server trusting Content-Length would read as the next one) is never read. Its
    rules never see the removed header, so the edge cannot answer 400 instead; Serve's proxy
    and a replica's uvicorn refuse such a request with 400 (test_http_limits)."""
    body = json.dumps({"input_ids": [[5, 6]]}).encode()
    smuggled = (f"GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}"
                "\r\n\r\n").encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    request = (f"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
               f"\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {len(chunked)}\r\n"
               "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked
    answer = exchange(server.port, request + smuggled)
    assert answer.count(b"HTTP/1.1 ") == 1, answer[:600]
    head = answer.partition(b"\r\n\r\n")[0].lower()
    assert b"connection: close" in head, answer[:600]
    assert answer.startswith(b"HTTP/1.1 200"), answer[:600]  # the chunked body was the body
    assert b'"requests"' not in answer  # nothing of /stats


def test_a_token_file_others_may_read_is_refused_before_ray(model, tmp_path, capsys):
    token = tmp_path / "token"
    token.write_text("file-token\n")
    token.chmod(0o644)
    code = cli.main(["serve", model["model"], "--token-file", str(token), "--address",
                     "127.0.0.1:1"])  # never reached: the token file is refused first
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert str(token) in err[0] and "0644" in err[0] and f"chmod 600 {token}" in err[0], err
    assert "--allow-readable-token-file" in err[0], err
    token.chmod(0o640)  # group-readable: the same
    with pytest.raises(ConfigError, match="mode 0640"):
        check_config(model["model"], token_file=str(token))
    cfg = check_config(model["model"], token_file=str(token), allow_readable_token_file=True)
    assert cfg.token_sha256 == token_digest("file-token")
    token.chmod(0o600)
    assert check_config(model["model"], token_file=str(token)).token_sha256 == \
        token_digest("file-token")
