"""When `bertfuse serve` behind HAProxy is ready to print its URL: every HAProxy that can
accept a connection on the port routes to a replica, and a request through it is answered.

Serve starts HAProxy before any replica, with Serve's own Python proxy as its only server (a
`backup`), and replaces it whenever the replicas change: the new process takes the listening
socket over (`-x`), the old one gets SIGUSR1 and finishes what it accepted. GET /readyz
answered 200 does not tell the two apart (the old one answers through Serve's proxy), and a
client that reached the old one in that window went to Serve's proxy, not to a replica (once,
such requests were never answered until shutdown). So:

    the HAProxy processes listening on the port (psutil; each started with `-f CONFIG`)
      ─► each CONFIG lists a server that is not a `backup`      (holders, fallback_only)
    GET URL/readyz through the port ─► 200                        (wait_routed)

Where the processes cannot be read (another user's), readyz alone decides, as before.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import psutil

from bertfuse.serve.ingress import haproxy_pids, listening_ports


def holders(folder: str, port: int) -> dict[int, str]:
    """{pid: its -f config path} of the HAProxy processes under `folder` that hold a socket
    listening on `port`, i.e. that can accept its next connection."""
    found = {}
    for pid in haproxy_pids(folder):
        try:
            argv = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if port in listening_ports(pid) and "-f" in argv[:-1]:
            found[pid] = argv[argv.index("-f") + 1]
    return found


def fallback_only(config: str) -> bool:
    """The config's backends list servers, and all of them are `backup` (Serve's own proxy,
    before a replica is known); False where it lists none at all or a real one."""
    servers = [line.split() for line in config.splitlines()
               if line.strip().startswith("server ")]
    return bool(servers) and all("backup" in words for words in servers)


def stale(folder: str, port: int) -> list[int]:
    """HAProxy processes that can accept on `port` but route only to the fallback."""
    out = []
    for pid, path in holders(folder, port).items():
        try:
            with open(path) as f:
                if fallback_only(f.read()):
                    out.append(pid)
        except OSError:  # unreadable: readyz decides
            continue
    return out


def wait_routed(url: str, port: int, folder: str | None, timeout_s: float = 60.0) -> None:
    """Waits until no HAProxy under `folder` that accepts on `port` routes to the fallback
    alone, and GET url/readyz through the port is answered 200 (module docstring)."""
    deadline = time.monotonic() + timeout_s
    while True:
        old = stale(folder, port) if folder else []
        if not old and _ready(url):
            return
        if time.monotonic() > deadline:
            why = (f" (HAProxy pid {', '.join(map(str, old))} still routes only to Serve's own "
                   "proxy: Serve's reload did not replace it; its log says why)") if old else ""
            raise RuntimeError(f"HAProxy at {url} routed no request to a ready replica in "
                               f"{timeout_s:.0f} s{why}")
        time.sleep(0.1)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "readyz", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False
