"""bertfuse/serve/guard.py and the request checks that run before a body is parsed, without
Ray: JSON depth and lone surrogates (400, not json.loads' RecursionError or the tokenizer's
TypeError), content type, token and Host, a body counted as it arrives, the port check that
counts only a live listener, and HAProxy's config limits. The same paths through a real
server are in tests/hostile/test_serve_network.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np
import psutil
import pytest

from bertfuse.errors import BertfuseError
from bertfuse.runtime.request_checks import ModelFacts
from bertfuse.serve.guard import (MAX_DEPTH, Access, HTTPError, check_access, check_depth,
                                  check_post, read_body, token_digest)
from bertfuse.serve.haproxy_conf import CLIENT_CONNS, HEADER_TIMEOUT_S, SERVER_TIMEOUT_S, fix
from bertfuse.serve.requests import Limits, parse_body

FACTS = ModelFacts(inputs=["input_ids", "input_mask", "segment_ids"],
                   outputs=["pooled_output"], vocab_size=100, type_vocab_size=2,
                   max_positions=16)
LIMITS = Limits(4, 16, 1 << 20)


def _status(fn, *args) -> int:
    with pytest.raises(HTTPError) as info:
        fn(*args)
    return info.value.status


def test_deep_json_is_a_400_before_json_loads():
    deep = b"[" * 100_000 + b"]" * 100_000
    assert _status(parse_body, deep, FACTS, LIMITS, ["pooled_output"]) == 400
    assert _status(check_depth, b"{\"a\":" * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1)) \
        == 400
    # brackets inside strings (escaped quotes too) are text, not nesting
    check_depth(json.dumps({"text": ["[" * 1000 + '"' + "{" * 1000]}).encode())
    ok = parse_body(json.dumps({"input_ids": [[1, 2, 3]] * 4}).encode(), FACTS, LIMITS,
                    ["pooled_output"])
    assert ok.rows == 4


class _Tokenizer:
    """Stands in for nothing real: parse_body must refuse before any tokenizer runs."""

    def __call__(self, *args):
        raise AssertionError("tokenized a lone surrogate")


@pytest.mark.parametrize("field, value", [("text", "\\ud800 bert"), ("text", ["ok", "a\\udfff"]),
                                          ("text_pair", "x\\udc80")])
def test_a_lone_surrogate_is_a_400_before_tokenizing(field, value):
    body = ('{"text": "ok", ' if field == "text_pair" else "{") + \
        f'"{field}": {json.dumps(value).replace(chr(92) * 2, chr(92))}}}'
    with pytest.raises(HTTPError) as info:
        parse_body(body.encode(), FACTS, LIMITS, ["pooled_output"], _Tokenizer())
    assert info.value.status == 400 and "lone surrogate" in info.value.message


def test_post_needs_json_and_a_length_within_the_limit():
    json_ct = {"content-type": "application/json; charset=utf-8"}
    assert check_post(json_ct, 100) is None  # chunked: read_body counts it
    assert check_post({**json_ct, "content-length": "100"}, 100) == 100
    for headers, status in (({"content-type": "text/plain"}, 415), ({}, 415),
                            ({"content-type": "application/x-www-form-urlencoded"}, 415),
                            ({**json_ct, "content-length": "101"}, 413),
                            ({**json_ct, "content-length": "-1"}, 400)):
        assert _status(check_post, headers, 100) == status, headers


def test_token_and_host():
    access = Access(token_digest("s3cret"), loopback=True)
    good = {"host": "127.0.0.1:8000", "authorization": "Bearer s3cret"}
    check_access(good, access)
    check_access({**good, "host": "localhost"}, access)
    check_access({**good, "host": "[::1]:8000"}, access)
    for headers, status in (({**good, "authorization": "Bearer s3cre"}, 401),
                            ({"host": "127.0.0.1"}, 401),
                            ({**good, "authorization": "Basic s3cret"}, 401),
                            ({**good, "host": "evil.example:8000"}, 421)):
        assert _status(check_access, headers, access) == status, headers
    check_access({"host": "evil.example"}, Access())  # --host 0.0.0.0, no token: open


def test_a_body_is_counted_as_it_arrives_whatever_the_framing():
    pulled = []

    async def chunks(n: int, size: int, pause: float = 0.0):
        for _ in range(n):
            pulled.append(size)
            await asyncio.sleep(pause)
            yield b"x" * size

    assert asyncio.run(read_body(chunks(3, 10), 30)) == b"x" * 30
    with pytest.raises(HTTPError) as info:
        asyncio.run(read_body(chunks(10_000, 1 << 16), 1 << 20))
    assert info.value.status == 413 and info.value.headers["Connection"] == "close"
    assert sum(pulled[3:]) <= (1 << 20) + (1 << 16)  # stopped at the limit, not at the end
    start = time.monotonic()
    with pytest.raises(HTTPError) as info:
        asyncio.run(read_body(chunks(100, 1, pause=0.1), 1000, timeout_s=0.5))
    assert info.value.status == 408 and time.monotonic() - start < 2


def test_the_port_check_counts_a_listener_not_time_wait():
    from bertfuse.serve.api import port_free

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as HAProxy's listener
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end of the port sits in TIME_WAIT
    client.recv(1)
    client.close()
    with pytest.raises(BertfuseError, match="another process listens there"):
        port_free("127.0.0.1", port)
    server.close()
    time.sleep(0.1)
    assert any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_TIME_WAIT
               for c in psutil.net_connections(kind="tcp4"))  # the TIME_WAIT socket is still there
    port_free("127.0.0.1", port)  # and refuses nothing


SERVE_CFG = """global
    maxconn 4096
defaults
    mode http
    timeout client 3600s
frontend prometheus
    bind :9101
    http-request use-service prometheus-exporter if { path /metrics }
frontend http_frontend
    bind *:8000
    default_backend x
listen stats
  bind *:8404
  stats enable
"""


def test_haproxy_config_gets_the_limits_and_loopback_stats():
    fixed = fix(SERVE_CFG, "127.0.0.1", 1000)
    assert fix(fixed, "127.0.0.1", 1000) == fixed
    lines = [ln.strip() for ln in fixed.splitlines()]
    assert f"timeout http-request {HEADER_TIMEOUT_S}s" in lines
    assert f"tcp-request connection reject if {{ sc0_conn_cur gt {CLIENT_CONNS} }}" in lines
    assert "http-request deny deny_status 413 if { req.hdr_val(content-length) gt 1000 }" \
        in lines
    assert "bind 127.0.0.1:9101" in lines and "bind 127.0.0.1:8404" in lines
    assert "bind *:8000" in lines  # the service's own --host stays as asked
    assert "bind *:9101" in [ln.strip() for ln in fix(SERVE_CFG, "0.0.0.0", 1000).splitlines()]
    assert lines.count(f"timeout server {SERVER_TIMEOUT_S}s") == 1


def test_a_server_timeout_that_serve_sets_is_kept():
    """RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S renders `timeout server` in defaults: that one
    stands, alone; one in a backend does not count as the default."""
    own = SERVE_CFG.replace("    timeout client 3600s\n", "    timeout client 3600s\n"
                            "    timeout server 7s\n")
    assert own != SERVE_CFG
    servers = [ln.strip() for ln in fix(own, "127.0.0.1", 1000).splitlines()
               if ln.strip().startswith("timeout server")]
    assert servers == ["timeout server 7s"]
    backend = SERVE_CFG + "backend x\n    timeout server 7s\n"
    servers = [ln.strip() for ln in fix(backend, "127.0.0.1", 1000).splitlines()
               if ln.strip().startswith("timeout server")]
    assert servers == [f"timeout server {SERVER_TIMEOUT_S}s", "timeout server 7s"]


def test_depth_scan_is_cheap_on_a_large_request():
    """The scan costs about what parsing the body costs (1.6x json.loads measured on an idle
    2-core host), not a multiple of it: compared with json.loads in the same process, best of
    five each, so a loaded machine slows both alike."""
    body = json.dumps({"input_ids": np.ones((32, 512), int).tolist()}).encode()

    def best(call) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return min(times)

    assert best(lambda: check_depth(body)) < 5 * best(lambda: json.loads(body))


def test_a_start_stops_the_haproxy_of_a_serve_that_is_gone(tmp_path):
    """A HAProxy left bound to its port by a serve killed with its watchdog: the next start
    (clear_stale) stops it and removes its folder; a live serve's folder is left alone."""
    from bertfuse.serve.ingress import OWNER, SCRATCH_DIR, SCRATCH_PREFIX, _identity, \
        clear_stale, haproxy_binary

    binary = haproxy_binary()
    if binary is None:
        pytest.skip("no HAProxy binary")
    gone = subprocess.Popen(["true"])
    gone.wait()
    folders = {}
    for who, owner in (("stale", f"{gone.pid} 1"), ("live", _identity(os.getpid()))):
        folder = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=SCRATCH_DIR)
        with open(os.path.join(folder, OWNER), "w") as f:
            f.write(owner)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = os.path.join(folder, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write(f"defaults\n    mode http\n    timeout client 1s\n    timeout server 1s\n"
                    f"    timeout connect 1s\nfrontend f\n    bind 127.0.0.1:{port}\n")
        folders[who] = (folder, subprocess.Popen([binary, "-db", "-f", cfg]), port)
    try:
        deadline = time.monotonic() + 10
        for _, proc, port in folders.values():
            while time.monotonic() < deadline:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.05)
        stopped = clear_stale()
        stale_folder, stale, _ = folders["stale"]
        assert stopped == [stale.pid] and stale.wait(5) is not None
        assert not os.path.exists(stale_folder)
        live_folder, live, _ = folders["live"]
        assert live.poll() is None and os.path.exists(live_folder)
    finally:
        for folder, proc, _ in folders.values():
            proc.kill()
            proc.wait()
            shutil.rmtree(folder, ignore_errors=True)
