"""`bertfuse serve --gpus N` for N in a list: how serving scales over the GPUs of one host.

For each N, a real server (its own process; on the CPU, `--device cpu --replicas N` stands in
for N GPUs) driven over loopback by client processes (spawned; each a few threads with
keep-alive connections, every request bounded by --timeout-s):

    closed   C = --clients-per-gpu x N clients post back to back for --seconds: the
             saturation throughput (seq/s), and the host's CPU per request, from psutil: the
             server's process tree (bertfuse serve, Ray, HAProxy, the replicas) and the whole
             host (clients included)
    open     requests sent on a fixed schedule at --load (0.7) of the closed loop's rate for
             --seconds: p50/p99 from each request's scheduled time (a late send counts)
    kill     (--kill) the open loop again, one replica process killed (kill -9) halfway:
             the outcome of every request (status codes, resets, timeouts), the seconds from
             the kill to the last failure, what was answered after it, and that every client
             thread ended (nothing hangs)

Then a table: seq/s and its scaling against N=1 (target >= 0.9 x N), p50/p99 at the fixed
load and p99 against N=1's (target <= 1.5x), CPU ms per request.

    python benchmarks/serve/multi_gpu.py --model model.onnx --gpus-list 1,2,4,8
    python benchmarks/serve/multi_gpu.py --model tiny.onnx --device cpu --smoke   # a check

N past the GPUs CUDA sees is left out. Writes $OUT/serve_multi_gpu.json (--out, default $OUT
or .) and prints the table last.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import ROOT, Server, child_env, cmdline, request_body, versions  # noqa: E402
from faults import _cpu_name, _mem_gb  # noqa: E402

sys.path.insert(0, ROOT)
from bertfuse.bench.scaling import (add_arguments, gpu_counts, report_head,  # noqa: E402
                                    versus_one, write_report)
from bertfuse.ray_cluster import descendants  # noqa: E402


def _post(conn: http.client.HTTPConnection | None, port: int, body: bytes,
          timeout_s: float) -> tuple[str, http.client.HTTPConnection | None]:
    """One request: its outcome ('200', 'http:5xx', 'reset', 'timeout') and the connection
    to reuse (None after a failure)."""
    try:
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        conn.request("POST", "/v1/infer", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        return ("200" if r.status == 200 else f"http:{r.status}"), conn
    except TimeoutError:
        outcome = "timeout"
    except (OSError, http.client.HTTPException):
        outcome = "reset"
    conn.close()
    return outcome, None


def _client(port: int, body: bytes, threads: int, seconds: float, rate: float | None,
            timeout_s: float, start_at: float, out: "mp.Queue") -> None:
    """`threads` clients until start_at + seconds: back to back (rate None), or each on a
    fixed schedule of rate / threads requests per second. Puts [(scheduled, sent, end,
    outcome)] and whether every thread ended."""
    results: list[tuple[float, float, float, str]] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        conn, mine = None, []
        _post(conn, port, body, timeout_s)  # connect and warm before the clock
        step = threads / rate if rate else 0.0
        at = start_at + (k * step / threads if rate else 0.0)
        while at < start_at + seconds:
            now = time.time()
            if now < at:
                time.sleep(at - now)
            sent = time.time()
            outcome, conn = _post(conn, port, body, timeout_s)
            end = time.time()
            mine.append((at if rate else sent, sent, end, outcome))
            at = at + step if rate else end
        with lock:
            results.extend(mine)

    ts = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(seconds + 2 * timeout_s + 30)
    out.put((results, all(not t.is_alive() for t in ts)))


def drive(port: int, body: bytes, clients: int, procs: int, seconds: float,
          rate: float | None, timeout_s: float, during=None) -> tuple[list, bool]:
    """Clients over `procs` processes for `seconds`; `during(start_at)` runs meanwhile."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = max(1, min(procs, clients))
    shares = [clients // procs + (i < clients % procs) for i in range(procs)]
    start_at = time.time() + 3.0 + 0.2 * procs  # every process spawned and warmed by then
    ps = [ctx.Process(target=_client, args=(port, body, n, seconds,
                                             rate * n / clients if rate else None,
                                             timeout_s, start_at, queue)) for n in shares]
    for p in ps:
        p.start()
    if during is not None:
        during(start_at)
    got = [queue.get(timeout=seconds + 3 * timeout_s + 120) for _ in ps]
    for p in ps:
        p.join(30)
    return [r for g in got for r in g[0]], all(g[1] for g in got)


def _tree_cpu(pids: set[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.Error:
            continue
    return out


def _host_busy() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def latency(results: list, rows: int, span_s: float) -> dict:
    ok = [end - sched for sched, _, end, o in results if o == "200"]
    a = np.asarray(ok or [np.nan]) * 1e3
    return {"requests": len(results), "answered": len(ok),
            "failed": len(results) - len(ok),
            "p50_ms": round(float(np.percentile(a, 50)), 2) if ok else None,
            "p99_ms": round(float(np.percentile(a, 99)), 2) if ok else None,
            "seq_per_s": round(len(ok) * rows / span_s, 1)}


def one_n(args, n: int, body: bytes, env: dict) -> dict:
    place = ["--device", "cpu", "--replicas", str(n)] if args.device == "cpu" \
        else ["--gpus", str(n)]
    server = Server(args.model, ["--max-batch", str(args.max_batch), *place, *args.serve_args],
                    env)
    try:
        up = json.loads(server.lines[0])
        clients, procs = args.clients_per_gpu * n, args.procs_per_gpu * n
        tree = descendants(server.proc.pid) | {server.proc.pid}
        cpu: dict[str, float] = {}

        def mark(start_at: float) -> None:  # CPU counters at the window's two ends
            time.sleep(max(0.0, start_at - time.time()))
            cpu["tree0"], cpu["host0"] = sum(_tree_cpu(tree).values()), _host_busy()
            time.sleep(args.seconds)
            cpu["tree1"], cpu["host1"] = sum(_tree_cpu(tree).values()), _host_busy()

        closed, ended = drive(server.port, body, clients, procs, args.seconds, None,
                              args.timeout_s, mark)
        res = {"n": n, "device": up.get("device"), "replicas": up.get("replicas"),
               "ingress": up.get("ingress"), "gpus": up.get("gpus"), "clients": clients,
               "client_processes": min(procs, clients),
               "closed": latency(closed, args.rows, args.seconds), "closed_ended": ended}
        done = max(1, res["closed"]["answered"])
        res["server_cpu_ms_per_request"] = round((cpu["tree1"] - cpu["tree0"]) * 1e3 / done, 3)
        res["host_cpu_ms_per_request"] = round((cpu["host1"] - cpu["host0"]) * 1e3 / done, 3)
        rate = args.load * res["closed"]["answered"] / args.seconds
        res["open"] = {"load": args.load, "rate_per_s": round(rate, 1)}
        if rate > 0:
            opened, ended = drive(server.port, body, clients, procs, args.seconds, rate,
                                  args.timeout_s)
            res["open"].update(latency(opened, args.rows, args.seconds), ended=ended)
        if args.kill and rate > 0 and (res["replicas"] or 0) > 1:  # one left to answer
            res["kill"] = kill_one(server, body, clients, procs, rate, args)
        return res
    finally:
        server.stop()


def kill_one(server: Server, body: bytes, clients: int, procs: int, rate: float, args) -> dict:
    """The open loop with one replica killed (kill -9) halfway through."""
    replicas = server.replicas()
    at: dict[str, float] = {}

    killed = cmdline(replicas[0])[:80] or str(replicas[0])

    def kill(start_at: float) -> None:
        time.sleep(max(0.0, start_at + args.seconds / 2 - time.time()))
        at["kill"], at["end"] = time.time(), start_at + args.seconds
        os.kill(replicas[0], signal.SIGKILL)

    results, ended = drive(server.port, body, clients, procs, args.seconds, rate,
                           args.timeout_s, kill)
    k = at["kill"]
    outcomes: dict[str, int] = {}
    for _, sent, end, o in results:
        if sent <= k <= end or (sent >= k and o != "200"):
            outcomes[o] = outcomes.get(o, 0) + 1
    bad = [sent for _, sent, _, o in results if sent >= k - args.timeout_s and o != "200"
           and sent <= k + args.seconds]
    after = [r for r in results if r[1] >= k + args.settle_s]
    return {"replicas": len(replicas), "killed": killed,
            "in_flight_or_after_kill": outcomes,
            "last_failure_after_kill_s": round(max(bad) - k, 2) if bad else 0.0,
            "after_settle": latency(after, args.rows, max(1e-9, at["end"] - k - args.settle_s)),
            "every_client_ended": ended, "serve_running": server.proc.poll() is None,
            "longest_request_s": round(max((e - s for _, s, e, _ in results), default=0), 2)}


def table(results: list[dict]) -> str:
    base = results[0] if results and results[0]["n"] == 1 else None
    lines = ["| N | replicas | seq/s (closed) | x N=1 | of 0.9 x N | p50 ms (open) | p99 ms "
             "(open) | p99 / N=1 | server CPU ms/req | host CPU ms/req |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c, o = r["closed"], r["open"]
        x = c["seq_per_s"] / base["closed"]["seq_per_s"] if base and \
            base["closed"]["seq_per_s"] else None
        p99 = o.get("p99_ms") / base["open"]["p99_ms"] if base and o.get("p99_ms") and \
            base["open"].get("p99_ms") else None
        xs, eff = versus_one(x, r["n"])
        p99s = f"{p99:.2f}" if p99 else "-"
        lines.append(f"| {r['n']} | {r['replicas']} | {c['seq_per_s']:,.0f} | {xs} | {eff} | "
                     f"{o.get('p50_ms')} | {o.get('p99_ms')} | {p99s} | "
                     f"{r['server_cpu_ms_per_request']} | {r['host_cpu_ms_per_request']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--rows", type=int, default=20, help="rows per request (b)")
    ap.add_argument("--seq", type=int, default=64, help="tokens per row (s)")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--clients-per-gpu", type=int, default=32)
    ap.add_argument("--procs-per-gpu", type=int, default=4,
                    help="client processes per GPU (a process's threads share one GIL)")
    ap.add_argument("--seconds", type=float, default=20.0, help="each loop's length")
    ap.add_argument("--load", type=float, default=0.7, help="open loop: of the closed rate")
    ap.add_argument("--timeout-s", type=float, default=30.0, help="every request's bound")
    ap.add_argument("--kill", action="store_true", help="a replica killed mid-load (each N)")
    ap.add_argument("--settle-s", type=float, default=5.0)
    ap.add_argument("--serve-args", default="", help="more `bertfuse serve` flags")
    ap.add_argument("--smoke", action="store_true",
                    help="a check, not a measurement: 2 clients, 3 s loops, b4 s16")
    args = ap.parse_args(argv)
    args.serve_args = args.serve_args.split()
    if args.smoke:
        args.clients_per_gpu, args.procs_per_gpu, args.seconds = 2, 1, 3.0
        args.rows, args.seq, args.settle_s, args.timeout_s = 4, 16, 1.0, 20.0
    ns, seen = gpu_counts(ap, args)
    env = child_env()
    body = request_body(args.rows, args.seq)
    report = report_head(argv, args.model, f"{os.uname().machine}, {os.cpu_count()} CPUs, "
                         f"{_cpu_name()}, {_mem_gb()} GB, {seen} GPUs", versions=versions(),
                         request={"rows": args.rows, "seq": args.seq, "bytes": len(body)})
    for n in ns:
        report["results"].append(one_n(args, n, body, env))
        print(json.dumps(report["results"][-1]), flush=True)
    write_report(report, args.out, "serve_multi_gpu.json", table(report["results"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
