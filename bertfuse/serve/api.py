"""`deploy(model=..., ...)`: Ray up (a local one, or the cluster at `address`), Serve up on
host:port, the bertfuse deployment running with every replica warm; returns a `Served`
handle (`.url`, `.stats()`, `.shutdown()`). Shutting down undoes only what deploy started:
Serve and Ray when it started them, else just its own application.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import urllib.request
from dataclasses import dataclass
from typing import Any
import signal
import time

from bertfuse.errors import BertfuseError
from bertfuse.gpu_plan import GpuPlan, host_plan
from bertfuse.ray_cluster import connect, disconnect, first_line, signal_handlers_kept
from bertfuse.serve import quiesce
from bertfuse.serve.config import ServeConfig, check_config, replicas_per_gpu, resolve
from bertfuse.serve.haproxy_conf import SERVER_TIMEOUT_S
from bertfuse.serve.replica_config import replica_config
from bertfuse.serve.requests import body_limit
from bertfuse.serve.ingress import (auto_ingress, haproxy_pids, ingress_environment, remove,
                                    replica_urls)
from bertfuse.serve.routes import wait_routed
from bertfuse.serve.token import restore, withhold
from bertfuse.optional import optional

# SIGTERM's grace: requests in flight are answered within this (a request takes ms; a full
# queue of max_batch-row calls on a 2-core CPU, well under a second), then Serve stops.
DRAIN_S = 10.0


@dataclass
class Served:
    """A running deployment. `url` is its base (POST url + 'v1/infer'); `urls` where clients
    post: [url], or with ingress 'direct' each replica's own base URL. config holds the
    ingress and gpus_per_replica in use (never 'auto' nor None); ingress_why says why when
    the ingress was left to 'auto'."""

    url: str
    config: ServeConfig
    device: str
    replicas: int
    started_ray: bool    # deploy() started a local Ray: shutdown() stops it
    connected: bool      # deploy() connected this process to Ray: shutdown() disconnects
    started_serve: bool  # deploy() started Serve on the cluster: shutdown() stops it
    deployed: bool = True  # the application was (perhaps partly) deployed
    closed: bool = False
    urls: list[str] = dataclasses.field(default_factory=list)
    scratch: str | None = None  # HAProxy's files (ingress 'haproxy'): removed on shutdown
    ingress_why: str | None = None
    # The secrets taken out of this process's environment while it serves (token.withhold)
    withheld: dict = dataclasses.field(default_factory=dict, repr=False)
    gpus: GpuPlan | None = None  # the plan of `gpus` (gpu_plan.py); None: not asked for

    def metrics_urls(self) -> list[str]:
        """Each Ray node's Prometheus endpoint (Ray's and Serve's metrics, and bertfuse_*)."""
        ray = optional("ray", why="Ray Serve (ray extra)")

        return [f"http://{_url_host(n['NodeManagerAddress'])}:{n['MetricsExportPort']}/metrics"
                for n in ray.nodes() if n.get("Alive") and n.get("MetricsExportPort")]

    def stats(self, timeout: float = 10.0) -> dict[str, Any]:
        """GET /stats: the counters of the replica that answers (one of them)."""
        with urllib.request.urlopen(self.url + "stats", timeout=timeout) as r:
            return json.loads(r.read())

    def shutdown(self, drain_s: float = 0.0) -> None:
        """Stops what deploy() started; idempotent. drain_s > 0: first stop taking requests
        and let those in flight finish, for drain_s at most (drain())."""
        if self.closed:
            return
        self.closed = True
        serve = optional("ray", "serve", why="Ray Serve (ray extra)")

        try:
            if drain_s > 0 and self.deployed:
                self.drain(drain_s)
            if self.started_serve:
                serve.shutdown()
            elif self.deployed:
                serve.delete(self.config.name)
        finally:
            try:
                if self.connected:
                    disconnect()
            finally:
                remove(self.scratch)
                restore(self.withheld)

    def drain(self, grace_s: float) -> None:
        """Stop accepting, finish what is in flight, within grace_s. Behind HAProxy: its soft
        stop (SIGUSR1: the listener closes, each connection ends after its response, idle
        ones at once), waited for; first, no new connection completes and HAProxy accepts
        those queued, which its close would reset (quiesce.py). Else the application is
        deleted: Serve stops routing to its replicas and each one ends once its requests
        are answered (graceful_shutdown_timeout_s, DRAIN_S)."""
        serve = optional("ray", "serve", why="Ray Serve (ray extra)")

        if self.config.ingress == "haproxy" and self.scratch:
            held = quiesce.hold(self.scratch, self.config.port)
            try:
                quiesce.quiet(held)
                for pid in haproxy_pids(self.scratch):
                    try:
                        os.kill(pid, signal.SIGUSR1)
                    except OSError:
                        pass
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and haproxy_pids(self.scratch):
                    time.sleep(0.05)
            finally:  # the port closes now, with nothing queued: later clients are refused
                for s in held:
                    s.close()
            return
        serve.delete(self.config.name, _blocking=True)
        self.deployed = False

    def __enter__(self) -> "Served":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _importable_by_workers() -> None:
    """Ray's workers must import bertfuse: a source checkout goes on their PYTHONPATH (the
    workers of a local Ray inherit this process's environment)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *parts])


def port_free(host: str, port: int) -> None:
    """Refuses host:port only when something listens there: a connect probe, then a bind
    with SO_REUSEADDR (as HAProxy's and Serve's own), so the TIME_WAIT sockets a stopped
    server leaves for a minute after traffic do not refuse its restart."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    with socket.socket(family) as s:
        s.settimeout(2)
        if s.connect_ex((probe, port)) == 0:
            raise BertfuseError(f"cannot serve on {host}:{port}: another process listens "
                                "there")
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise BertfuseError(f"cannot serve on {host}:{port} ({exc.strerror or exc})") \
                from None


def _serve_running() -> bool:
    SERVE_CONTROLLER_NAME, SERVE_NAMESPACE = optional("ray.serve._private.constants",
                                                      "SERVE_CONTROLLER_NAME", "SERVE_NAMESPACE",
                                                      why="Ray Serve (ray extra)")
    ray = optional("ray", why="Ray Serve (ray extra)")

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True


def _placement(cfg: ServeConfig, plan: GpuPlan | None = None) -> tuple[str, int,
                                                                       dict[str, float]]:
    """(device, replicas, each replica's Ray resources): gpus_per_replica of a GPU each where
    the cluster has GPUs (device 'auto' or 'cuda'), as many as its GPUs and CPUs hold unless
    replicas says; else CPU replicas. With a plan (gpus): as many as the plan's GPUs hold."""
    ray = optional("ray", why="Ray Serve (ray extra)")

    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if plan is not None:
        if gpus < plan.count:  # a Ray this process already ran, with fewer GPUs
            raise BertfuseError(f"gpus {plan.count}: the Ray cluster has {gpus} GPUs")
        gpus = plan.count
    device = cfg.device if cfg.device != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        raise BertfuseError("device cuda, but the Ray cluster has no GPU (ray status shows "
                            "its resources)")
    if device == "cuda":
        share, cpu = cfg.gpus_per_replica, cfg.cpus_per_replica
        fit = int(gpus / share + 1e-9)  # replicas the cluster's GPUs hold
        cpus = resources.get("CPU", 0)
        if cpu > 0:  # and its CPUs: a replica that cannot be placed would wait forever
            fit = min(fit, int(cpus / cpu + 1e-9))
        replicas = cfg.replicas or (plan.replicas if plan else max(fit, 1))
        if replicas > fit:
            raise BertfuseError(f"{replicas} replicas of {share:g} GPU and {cpu:g} CPU each "
                                f"need {replicas * share:g} GPUs and {replicas * cpu:g} CPUs; "
                                f"the Ray cluster has {gpus} GPUs and {cpus:g} CPUs")
        return device, replicas, {"num_gpus": share, "num_cpus": cfg.cpus_per_replica}
    return device, cfg.replicas or 1, {"num_cpus": cfg.cpus_per_replica}


class ServeFailed(BertfuseError):
    """The Ray cluster failed under the service while it started (not the user's input)."""

    exit_code = 1


def deploy(model: Any = None, **kwargs: Any) -> Served:
    """Serves `model` (a bertfuse-converted .onnx) on Ray Serve; keywords are ServeConfig's
    fields (bertfuse/serve/config.py), checked before Ray starts. Returns when every replica
    is warm and taking requests. status: called with each start-up stage's name as it
    starts (the CLI's progress lines)."""
    say = kwargs.pop("status", None) or (lambda stage: None)
    cfg = check_config(model, **kwargs)
    # The token is read (its digest is in cfg): no process started from here on (HAProxy's
    # probe, the watchdog, Ray's processes, HAProxy) inherits it; shutdown() puts it back
    withheld = withhold()
    try:
        return _deploy(cfg, say, withheld)
    except BaseException:
        restore(withheld)
        raise


def _deploy(cfg: ServeConfig, say: Any, withheld: dict[str, str]) -> Served:
    ray = optional("ray", why="Ray Serve (ray extra)")
    serve = optional("ray", "serve", why="Ray Serve (ray extra)")
    RayError = optional("ray.exceptions", "RayError", why="Ray Serve (ray extra)")

    from bertfuse.serve.app import BertfuseReplica  # lazy: loads ray, starlette at import

    ingress, why = auto_ingress(cfg.address, ray.is_initialized()) if cfg.ingress == "auto" \
        else (cfg.ingress, None)
    cfg = resolve(cfg, ingress)  # before Ray starts: the ingress's flags go to its processes
    plan = host_plan(cfg.gpus, cfg.device, cfg.address, replicas_per_gpu(cfg.gpus_per_replica)) \
        if cfg.gpus is not None else None
    connected = started_ray = started_serve = deployed = False
    scratch = None
    if cfg.ingress != "proxy" and ray.is_initialized():
        raise BertfuseError(f"ingress {cfg.ingress!r} is switched on when Ray starts; this "
                            "process already runs Ray: deploy() must start it")
    if not ray.is_initialized():
        say("ray cluster")
        _importable_by_workers()
        max_body = body_limit(cfg.max_batch, cfg.max_seq)
        with ingress_environment(cfg.ingress, cfg.metrics_host, max_body,
                                 cfg.token_sha256) as scratch:
            started_ray = connect(cfg.address, metrics_host=cfg.metrics_host,
                                  leftovers=(scratch,) if scratch else (),
                                  num_gpus=plan.count if plan else None)
        connected = True
    try:
        device, replicas, resources = _placement(cfg, plan)
        if _serve_running():
            if cfg.name in serve.status().applications:
                raise BertfuseError(f"an application named {cfg.name!r} already runs on this "
                                    "Ray cluster's Serve; choose another name")
            url_host, url_port = _running_http(cfg)
        else:
            say("serve start")
            port_free(cfg.host, cfg.port)
            with signal_handlers_kept():
                # request_timeout_s: Serve's proxy (`--ingress proxy`, and HAProxy's fallback)
                # bounds a request end to end as HAProxy's `timeout server` does; unset, a
                # request its replica never answers has no end.
                serve.start(http_options={"host": cfg.host, "port": cfg.port,
                                          "request_timeout_s": SERVER_TIMEOUT_S},
                            logging_config=_logging(cfg))
            started_serve = True
            url_host, url_port = cfg.host, cfg.port
        # run: this deployment's key for the statistics its replicas share
        config = replica_config(cfg, device, replicas, run=os.urandom(8).hex(), gpus=plan)
        app = BertfuseReplica.options(
            num_replicas=replicas, ray_actor_options=resources, logging_config=_logging(cfg),
            max_ongoing_requests=config.max_ongoing_requests,
            graceful_shutdown_timeout_s=DRAIN_S).bind(config)
        prefix = "/" if started_serve else f"/{cfg.name}"
        say("deploy replicas")  # each replica builds and warms its Session
        with signal_handlers_kept():
            try:
                deployed = True
                serve.run(app, name=cfg.name, route_prefix=prefix)
            except RuntimeError as exc:  # a replica failed to build or warm up
                raise BertfuseError(f"the deployment failed: {first_line(exc)}") from None
        url = f"http://{_url_host(url_host)}:{url_port}{prefix.rstrip('/')}/"
        urls = replica_urls(cfg.name, _url_host(url_host)) if cfg.ingress == "direct" else [url]
        if cfg.ingress == "haproxy":
            say("haproxy routes")
            try:
                wait_routed(url, url_port, scratch)
            except RuntimeError as exc:  # nothing of the user's input: a start-up failure
                raise ServeFailed(str(exc)) from None
    except BaseException as exc:
        try:
            Served("", cfg, "", 0, started_ray, connected, started_serve, deployed,
                   scratch=scratch, withheld=withheld).shutdown()
        except Exception:  # noqa: S110  (the first error is the one to report)
            pass
        if isinstance(exc, RayError):  # e.g. a Ray process killed for memory
            raise ServeFailed(f"Ray failed while the service was starting "
                              f"({type(exc).__name__}: {first_line(exc)[:300]}); nothing was "
                              "left running; Ray's logs say why") from None
        raise
    return Served(url, cfg, device, replicas, started_ray, connected, started_serve,
                  urls=urls, scratch=scratch, ingress_why=why, withheld=withheld, gpus=plan)


def _logging(cfg: ServeConfig) -> dict[str, Any]:
    """Serve writes a log line per request (proxy and replica) unless told not to: off by
    default, it costs every request a file write."""
    return {"enable_access_log": cfg.access_log}


def _running_http(cfg: ServeConfig) -> tuple[str, int]:
    """Where an already-running Serve listens (its own http_options, not ours)."""
    serve = optional("ray", "serve", why="Ray Serve (ray extra)")

    try:
        opts = serve.context._get_global_client().http_config
        return opts.host, opts.port
    except Exception:  # older/newer Serve: the usual default
        return cfg.host, 8000


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
