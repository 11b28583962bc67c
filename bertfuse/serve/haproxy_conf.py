"""The limits bertfuse adds to the HAProxy config that Ray Serve writes. Serve renders its
config from a template with no place for them (Ray 2.60: `timeout http-request` is never
set, `timeout client` is 3600 s, the stats and Prometheus ports bind every interface), so
bertfuse points Serve at a small wrapper as its HAProxy binary
(RAY_SERVE_HAPROXY_BINARY_PATH): it rewrites the config file it is started with, then execs
the real HAProxy with a parent-death signal, so HAProxy cannot outlive the Ray worker that
runs it.

    Serve's HAProxyManager ─► WRAPPER -db -f haproxy.cfg ... ─► fix(haproxy.cfg) ─► exec haproxy

What fix() adds:
    defaults        timeout http-request HEADER_TIMEOUT_S (a client's headers, slowloris);
                    timeout server SERVER_TIMEOUT_S unless Serve's config sets one (a
                    request that its server never answers gets a 504, not an open end)
    http_frontend   at most CLIENT_CONNS connections at once from one source address; 413
                    for a Content-Length past the replicas' body limit; 401 for Serve's
                    GET /-/routes (answered by HAProxy itself, never reaching a replica)
                    without the bearer token, when the server has one: its SHA-256 compared,
                    as the replicas do (guard.check_access)
    stats, prometheus  bound to the metrics host instead of every interface
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from bertfuse.serve.guard import REALM, UNAUTHORIZED

# The headers of a request must arrive within this: one byte a second per connection
# (slowloris) holds a connection 10 s, not the hour of Serve's `timeout client`.
HEADER_TIMEOUT_S = 10
# A client idle mid-request (a body that stops short of its length) is dropped after this;
# a response being computed is timed by `timeout server`, not this.
CLIENT_TIMEOUT_S = 30
# A forwarded request whose server has not answered in this long gets HAProxy's 504. Serve
# leaves `timeout server` unset unless RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S is given, and then
# a request that was never answered (seen once: held by a HAProxy being replaced, which
# forwarded to Serve's own proxy) waited until shutdown. A bound, not a budget: it must only
# exceed the slowest honest answer (a full queue of the largest batches on a CPU replica),
# and Serve's hard-stop-after bounds a replaced HAProxy's requests to the same 120 s.
SERVER_TIMEOUT_S = 120
# Connections at once from one address: 4,200 slow connections from one client filled
# Serve's maxconn 4096 and every good request waited (issue 25); this leaves the rest to
# other clients. Load tests run 32-128 connections from one host.
CLIENT_CONNS = 256
MARK = "# bertfuse limits"
PR_SET_PDEATHSIG = 1


def fix(text: str, metrics_host: str, max_body: int,
        server_timeout_s: int = SERVER_TIMEOUT_S, token_sha256: str | None = None) -> str:
    """Serve's rendered config with bertfuse's limits (idempotent)."""
    if MARK in text:
        return text
    out, section = [], ""
    server_timeout = not _sets(text, "defaults", "timeout server")
    for line in text.splitlines():
        if line and not line[0].isspace():
            section = line.split("#", 1)[0].strip()
        stripped = line.strip()
        if section in ("frontend prometheus", "listen stats") and stripped.startswith("bind "):
            port = stripped.split()[1].rsplit(":", 1)[1]
            line = f"    bind {_bind_host(metrics_host)}:{port}"
        out.append(line)
        if section == "defaults" and line.startswith("defaults"):
            out += [f"    {MARK}", f"    timeout http-request {HEADER_TIMEOUT_S}s"]
            if server_timeout:
                out.append(f"    timeout server {server_timeout_s}s")
        elif section == "frontend http_frontend" and stripped.startswith("bind "):
            out += [f"    {MARK}",
                    "    stick-table type ipv6 size 100k expire 60s store conn_cur",
                    "    tcp-request connection track-sc0 src",
                    f"    tcp-request connection reject if {{ sc0_conn_cur gt {CLIENT_CONNS} }}",
                    # a declared length past the replicas' limit is refused here, before
                    # anyone tells an `Expect: 100-continue` client to send it
                    "    http-request deny deny_status 413 if { req.hdr_val(content-length) "
                    f"gt {max_body} }}", *_routes_guard(token_sha256)]
    return "\n".join(out) + "\n"


def _routes_guard(token_sha256: str | None) -> list[str]:
    """HAProxy lines answering 401 to /-/routes (Serve's acl: `path -i`) unless the request's
    Authorization is `Bearer TOKEN` (scheme in any case, nothing after the token)."""
    if not token_sha256:
        return []

    int(token_sha256, 16)  # hex digits only: nothing of it can end the config's word

    auth = "req.fhdr(authorization)"
    return ["    acl bf_routes path -i /-/routes",
            f"    acl bf_bearer {auth},word(1,' '),lower -m str bearer",
            f"    acl bf_token {auth},word(2,' '),digest(sha256),hex,lower -m str {token_sha256}",
            f"    acl bf_more {auth},word(3,' ') -m len gt 0",
            "    http-request return status 401 content-type application/json string "
            f"{_quoted(json.dumps({'error': UNAUTHORIZED}))} hdr WWW-Authenticate "
            f"{_quoted(REALM)} if bf_routes !bf_bearer || "
            "bf_routes !bf_token || bf_routes bf_more"]


def _quoted(text: str) -> str:
    """`text` as one HAProxy config word (double quotes: backslash and quote escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sets(text: str, section: str, directive: str) -> bool:
    """`directive` appears in the config's `section` (its first line, e.g. "defaults")."""
    inside = False
    for line in text.splitlines():
        if line and not line[0].isspace():
            inside = line.split("#", 1)[0].strip() == section
        elif inside and line.split("#", 1)[0].strip().startswith(directive + " "):
            return True
    return False


def _bind_host(host: str) -> str:
    if host in ("0.0.0.0", "::", "*", ""):
        return "*"
    return f"[{host}]" if ":" in host else host


def wrapper(real: str, metrics_host: str, max_body: int,
            token_sha256: str | None = None) -> str:
    """The wrapper script's text (run by this Python, which has bertfuse importable)."""
    return (f"#!{sys.executable}\n"
            "# bertfuse's HAProxy for Ray Serve: bertfuse/serve/haproxy_conf.py says why\n"
            "import sys\n"
            "from bertfuse.serve.haproxy_conf import main\n"
            f"main({real!r}, {metrics_host!r}, {max_body}, sys.argv[1:], {token_sha256!r})\n")


def main(real: str, metrics_host: str, max_body: int, args: list[str],
         token_sha256: str | None = None) -> None:
    """Fixes the -f config, then becomes HAProxy; it gets SIGTERM when its parent dies."""
    if "-f" in args[:-1]:
        path = args[args.index("-f") + 1]
        with open(path) as f:
            text = f.read()
        fixed = fix(text, metrics_host, max_body, token_sha256=token_sha256)
        if fixed != text:
            tmp = f"{path}.bertfuse"
            with open(tmp, "w") as f:
                f.write(fixed)
            os.replace(tmp, path)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == 1:  # the parent died before the prctl: go with it
            sys.exit(1)
    os.execv(real, [real, *args])
