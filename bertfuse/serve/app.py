"""The Ray Serve deployment: one replica = one bertfuse Session on its own worker thread (a
one-replica SessionPool, which owns the CUDA graphs it captured), warmed before Serve marks
the replica ready, and HTTP served straight from the replica (no extra hop).

    HTTP ─► Serve proxy ─► replica.__call__ ─► parse + check (requests.py; a 4xx here never
            reaches a batch) ─► serve.batch (rows up to max_batch, waiting up to
            max_wait_ms for company) ─► combine ─► Session.run on the pool's thread ─► split
            ─► encode_body (JSON bytes)
    A request alone in the replica (nothing queued or running) skips serve.batch: combine
    ─► Session.run ─► split, as a batch of one would, without the batch queue's hops.

Routes: POST /v1/infer; GET /healthz (the process answers), /readyz (this replica's
session is warm and open), /stats (this replica's counters: requests, model calls, rows,
and the p50 of each stage of a request's time in it); the Open Inference Protocol's /v2
routes beside them (oip_routes.py; infer in oip.py: its own tensors, the same checks, batch
and session), with Triton's statistics of every request (infer_stats.py), each replica's
kept in Ray's key-value store and summed by GET /v2/models/NAME/stats.
Imported by api.deploy() only, so `import bertfuse` never imports Ray.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import deque
from typing import Any

import numpy as np

from bertfuse.gpu_plan import pin_to_gpu
from bertfuse.serve.config import switch_interval_s
from bertfuse.serve.guard import Access, check_access, check_post, is_loopback, read_body
from bertfuse.serve.infer_stats import InferStats, merge
from bertfuse.serve.oip import OIP
from bertfuse.serve.oip_routes import route as v2_route
from bertfuse.serve.replica_config import ReplicaConfig
from bertfuse.serve.requests import HTTPError, Limits, Parsed, body_limit, combine, \
    encode_body, parse_body, split
from bertfuse.optional import optional
from bertfuse.runtime import Session, SessionPool
from bertfuse.runtime.request_checks import declared_output_dims, model_facts, servable_model
from bertfuse.text import WordPiece

serve = optional("ray", "serve", why="Ray Serve (ray extra)")
Counter, Histogram = optional("ray.serve.metrics", "Counter", "Histogram",
                              why="Ray Serve (ray extra)")
Request = optional("starlette.requests", "Request", why="Ray Serve's HTTP types (ray extra)")
Response = optional("starlette.responses", "Response", why="Ray Serve's HTTP types (ray extra)")

BATCH_ROWS_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TIMES_KEPT = 1000
STAGES = ("request", "body_wait", "parse", "queue", "model_call", "resume", "encode")
# Probes a load balancer sends without credentials; every other route checks the token
OPEN_ROUTES = ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready")
# A replica's inference statistics reach Ray's key-value store (the GCS) at most this long
# after they change; the /v2 stats route sums every replica's from there.
STATS_PUBLISH_S = 0.2


def _rows(items: list[Parsed]) -> int:
    return sum(p.rows for p in items)


def _timed(fn: Any, **kwargs: Any) -> tuple[Any, tuple[float, float]]:
    start = time.perf_counter()  # CLOCK_MONOTONIC: comparable with the event loop thread's
    return fn(**kwargs), (start, time.perf_counter())


def _p50_ms(times: deque) -> float | None:
    return round(float(np.median(times)) * 1e3, 3) if times else None


def json_response(status: int, data: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status_code=status,
                    media_type="application/json", headers=headers)


def body_response(body: bytes) -> Response:
    return Response(body, media_type="application/json")


@serve.deployment(name="BertfuseModel")
class BertfuseReplica:
    """A Serve replica of `config` (replica_config.py: a checked ServeConfig, placed)."""

    def __init__(self, config: ReplicaConfig) -> None:
        if not isinstance(config, ReplicaConfig):
            raise TypeError(f"BertfuseReplica takes a ReplicaConfig (bertfuse.serve."
                            f"replica_config), not {type(config).__name__}")

        self.config = config
        sys.setswitchinterval(switch_interval_s())
        proto = servable_model(config.model)
        self.facts = model_facts(proto)
        dims = declared_output_dims(proto) or {}
        self.outputs = list(config.outputs)
        self.seq_axis = {n: dims.get(n, ("B", "S"))[1:2] == ("S",) for n in self.facts.outputs}
        self.limits = Limits(config.max_batch, config.max_seq,
                             body_limit(config.max_batch, config.max_seq))
        self.access = Access(config.token_sha256, is_loopback(config.host))
        self.tokenizer = None
        if config.vocab:
            self.tokenizer = WordPiece(config.vocab, lower_case=config.lower_case,
                                       max_length=config.max_seq, model=config.model)
        self.warm: list[tuple[int, int]] = []
        # Before the session's thread and buffers exist: they stay on the GPU's NUMA node
        self.pinned = pin_to_gpu(config.gpus)

        def make() -> Session:
            buckets = {"batch_buckets": config.batch_buckets} if config.batch_buckets else {}
            return Session(config.model, max_batch=config.max_batch, max_seq=config.max_seq,
                           device=config.device, kernels=config.kernels,
                           intra_op_threads=config.cpu_threads, **buckets)

        def prepare(session: Session) -> None:
            if config.warmup:  # every bucket's buffers and CUDA graph before any traffic
                self.warm = session.warmup()

        self.pool = SessionPool(make, replicas=1, prepare=prepare)
        self.session = self.pool.replicas[0]
        self.ready = True
        self.wait_s = config.max_wait_ms / 1000
        self._batch.set_max_batch_size(config.max_batch)
        self._batch.set_batch_wait_timeout_s(self.wait_s)
        self.inflight = 0  # requests between parse and answer: queued, batched or running
        self.counts = {"requests": 0, "errors": 0, "batches": 0, "rows": 0, "max_batch_rows": 0,
                       "alone": 0}
        # The last requests' times in this replica, request in to response out, and its
        # stages: body_wait (Serve's replica fetches the body from its proxy: one more actor
        # call), parse, queue (joined a batch -> its Session.run starts on the session's
        # thread: waiting for company and for the session), model_call (Session.run),
        # resume (Session.run returned -> the request's coroutine runs again on the event
        # loop), encode. What the client sees beyond `request` is Serve's and HTTP's.
        self.times = {k: deque(maxlen=TIMES_KEPT) for k in STAGES}
        self.m_requests = Counter("bertfuse_requests", "HTTP inference requests answered",
                                  tag_keys=("status",))
        self.m_batches = Counter("bertfuse_model_calls", "Session runs (batches of requests)")
        self.m_rows = Histogram("bertfuse_batch_rows", "rows per Session run",
                                boundaries=BATCH_ROWS_BOUNDARIES)
        self.infer_stats = InferStats()  # Triton's statistics (infer_stats.py)
        context = serve.get_replica_context()
        replica = getattr(getattr(context, "replica_id", None), "unique_id", None)
        self.stats_key = f"bertfuse/stats/{config.run}/{replica or os.getpid()}"
        self.publish_at: asyncio.TimerHandle | None = None
        self.oip = OIP(self, dims, proto)  # the /v2 routes (Open Inference Protocol)

    # -- routes -------------------------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        path, root = request.scope["path"], request.scope.get("root_path", "")
        if root and path.startswith(root):  # under a route prefix (/NAME on a shared Serve)
            path = path[len(root):]
        path, method = path.rstrip("/") or "/", request.method
        if path not in OPEN_ROUTES:
            try:  # before any route, /v2's included: token and Host
                check_access(request.headers, self.access)
            except HTTPError as exc:
                return json_response(exc.status, {"error": exc.message}, exc.headers)
        if path == "/v2" or path.startswith("/v2/"):  # its own checks and error form
            return await v2_route(self.oip, request, path, method)
        try:
            if path == "/v1/infer":
                if method != "POST":
                    raise HTTPError(405, f"{path} takes POST with a JSON body, not {method}")
                return await self._infer(request)
            if method not in ("GET", "HEAD"):
                raise HTTPError(405, f"{path} takes GET, not {method}")
            if path == "/healthz":
                return json_response(200, {"status": "ok"})
            if path == "/readyz":
                return self.readyz()
            if path == "/stats":
                return json_response(200, self.stats())
            raise HTTPError(404, f"no route {path}; routes: POST /v1/infer, GET /healthz, "
                                 "/readyz, /stats")
        except HTTPError as exc:
            return json_response(exc.status, {"error": exc.message}, exc.headers)

    async def _infer(self, request: Request) -> Response:
        start = time.perf_counter()
        try:
            check_post(request.headers, self.limits.max_body)
            body = await read_body(request.stream(), self.limits.max_body)
            got = time.perf_counter()
            parsed = parse_body(body, self.facts, self.limits, self.outputs, self.tokenizer)
        except HTTPError as exc:
            self.failed(exc, start)
            raise
        joined = time.perf_counter()
        result = await self.answer(parsed, start)
        back = time.perf_counter()
        response = body_response(encode_body(result, parsed.encoding))
        end = time.perf_counter()
        run_start, run_end = parsed.ran
        for stage, took in (("body_wait", got - start), ("parse", joined - got),
                            ("queue", run_start - joined), ("resume", back - run_end),
                            ("encode", end - back), ("request", end - start)):
            self.times[stage].append(took)
        return response

    def failed(self, exc: HTTPError, start: float) -> None:
        """A request refused before it reached the model, counted."""
        self.counts["errors"] += 1
        self.m_requests.inc(tags={"status": str(exc.status)})
        self.infer_stats.fail(start)
        self.publish_soon()

    async def answer(self, parsed: Parsed, start: float) -> dict[str, np.ndarray]:
        """A checked request's outputs, for /v1/infer and /v2's infer alike, counted. Alone in
        this replica, a request neither waits for company that is not coming nor goes through
        serve.batch's queue and tasks: straight to the session. With others in flight it
        joins a batch (a batch of one takes the same combine, run and split). A bug or a
        device failure is a 500 with one line, not a traceback. start: the request's
        arrival (perf_counter), for its statistics."""
        checked = time.perf_counter()
        alone = self.inflight == 0
        self.inflight += 1
        try:
            if alone:
                self.counts["alone"] += 1
                result = (await self._run([parsed], parsed.outputs))[0]
            else:
                result = await self._batch(parsed)
        except Exception as exc:
            self.m_requests.inc(tags={"status": "500"})
            self.infer_stats.fail(start)
            self.publish_soon()
            why = (str(exc).strip().splitlines() or [""])[0][:200]
            raise HTTPError(500, f"internal error: {type(exc).__name__}: {why}") from None
        finally:
            self.inflight -= 1
        self.counts["requests"] += 1
        self.m_requests.inc(tags={"status": "200"})
        self.infer_stats.success(parsed.rows, start, checked, parsed.ran, time.perf_counter())
        self.publish_soon()
        return result

    def publish_soon(self) -> None:
        """This replica's statistics to Ray's key-value store within STATS_PUBLISH_S."""
        if self.publish_at is None:
            self.publish_at = asyncio.get_running_loop().call_later(STATS_PUBLISH_S,
                                                                    self.publish)

    def publish(self) -> None:
        _internal_kv_put = optional("ray.experimental.internal_kv", "_internal_kv_put",
                                    why="Ray Serve (ray extra)")

        self.publish_at = None
        _internal_kv_put(self.stats_key, json.dumps(self.infer_stats.snapshot()))

    def all_stats(self) -> dict[str, Any]:
        """Every replica's statistics of this deployment summed (this one's as of now)."""
        _internal_kv_get, _internal_kv_list = optional("ray.experimental.internal_kv",
                                                       "_internal_kv_get", "_internal_kv_list",
                                                       why="Ray Serve (ray extra)")

        prefix = self.stats_key.rsplit("/", 1)[0] + "/"
        others = [json.loads(_internal_kv_get(k)) for k in _internal_kv_list(prefix)
                  if k.decode() != self.stats_key]
        return merge([self.infer_stats.snapshot(), *others])

    def readyz(self) -> Response:
        if self.ready and not self.pool.closed:
            return json_response(200, {"ready": True, "device": self.config.device,
                                       "warm_buckets": len(self.warm)})
        return json_response(503, {"ready": False, "error": "the session is closed"})

    def stats(self) -> dict[str, Any]:
        """This replica's counters (each replica counts its own)."""
        context = serve.get_replica_context()
        replica = getattr(getattr(context, "replica_id", None), "unique_id", None)
        return {**self.counts, "replica": replica or str(os.getpid()),
                "pid": os.getpid(), "device": self.config.device,
                "max_batch": self.config.max_batch, "max_seq": self.config.max_seq,
                "max_wait_ms": self.config.max_wait_ms, "warm_buckets": len(self.warm),
                "ingress": self.config.ingress,
                # its GPU (one per replica: Ray sets CUDA_VISIBLE_DEVICES to it), the CPUs it
                # is pinned to (0: none), and its queue: inflight of max_ongoing_requests
                "gpu": os.environ.get("CUDA_VISIBLE_DEVICES") if self.config.device == "cuda"
                else None, "pinned_cpus": len(self.pinned), "inflight": self.inflight,
                "max_ongoing_requests": self.config.max_ongoing_requests,
                "intra_op_threads": self.session.sessions["raw"].get_session_options()
                .intra_op_num_threads,  # 0: ORT's default (one per physical core)
                "switch_interval_ms": round(sys.getswitchinterval() * 1e3, 3),
                **{f"{k}_ms_p50": _p50_ms(v) for k, v in self.times.items()}}

    # -- the batch ----------------------------------------------------------------------------

    # Two batches in flight: the next is formed (and queued on the session's thread) while one
    # runs, so the thread does not wait for this busy event loop to wake between model calls.
    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002, batch_size_fn=_rows,
                 max_concurrent_batches=2)
    async def _batch(self, items: list[Parsed]) -> list[dict[str, np.ndarray]]:
        """Requests (already checked) -> one Session run per group -> each request's rows.
        Without an input_mask in the model, rows of different lengths cannot share a run."""
        if "input_mask" in self.facts.inputs:
            groups = [items]
        else:
            by_seq: dict[int, list[Parsed]] = {}
            for p in items:
                by_seq.setdefault(p.seq, []).append(p)
            groups = list(by_seq.values())
        names = list(dict.fromkeys(n for p in items for n in p.outputs))
        results: dict[int, dict[str, np.ndarray]] = {}
        for group in groups:
            for p, r in zip(group, await self._run(group, names)):
                results[id(p)] = r
        return [results[id(p)] for p in items]

    async def _run(self, group: list[Parsed], names: list[str]) -> list[dict[str, np.ndarray]]:
        """One Session run of `group` (rows that may share one) on the session's thread."""
        start = time.perf_counter()
        feeds = combine(group, self.facts.inputs)
        combined = time.perf_counter()
        outputs, ran = await asyncio.wrap_future(self.pool.submit(
            lambda s: _timed(s.run, **feeds, outputs=names)))
        self.times["model_call"].append(ran[1] - ran[0])
        rows = int(feeds["input_ids"].shape[0])
        self.counts["batches"] += 1
        self.counts["rows"] += rows
        self.counts["max_batch_rows"] = max(self.counts["max_batch_rows"], rows)
        self.m_batches.inc()
        self.m_rows.observe(rows)
        for p in group:
            p.ran = ran
        split_start = time.perf_counter()
        rows_out = split(outputs, group, self.seq_axis)
        self.infer_stats.execution(rows, combined - start, ran[1] - ran[0],
                                   time.perf_counter() - split_start)
        return rows_out

    def check_health(self) -> None:
        """Serve's periodic health check: a closed session makes Serve replace the replica."""
        if self.pool.closed:
            raise RuntimeError("the replica's session is closed")

    def __del__(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()
