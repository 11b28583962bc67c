"""The load `bertfuse serve` holds and the faults it survives, each phase a real `bertfuse
serve` process driven by C clients (threads with keep-alive connections, each posting in a
loop; a failed request reconnects):

    load      C clients for --seconds on one server: requests, errors, p50/p99, seq/s
    replica   the same load; one of the 2 replicas killed (kill -9) midway: requests
              failed, how long failures lasted, and that requests are answered after
    node      a two-node Ray cluster on this machine (`ray start --head` and `ray start
              --address` on 127.0.0.1, a CPU each, a token of its own), `bertfuse serve
              --address` with a replica per node; the worker node's raylet killed (kill -9)
              midway: the same counts
    sigterm   the same load; SIGTERM midway: requests lost (accepted, not answered: a reset
              or a cut-off response; a refused connect once the listener closed is not
              lost), the exit code and how long the drain took

Every answer is checked (status 200 and pooled_output's shape). Each phase stops the
processes it started (by their pids only: never `ray stop`).

    bertfuse example --config tiny -o ex && bertfuse convert ex -o tiny.onnx
    python benchmarks/serve/faults.py --model tiny.onnx                  # all phases
    python benchmarks/serve/faults.py --model tiny.onnx --phases load --clients 32

Writes $OUT/serve_faults.json (--out, default $OUT or .) and prints one line per phase.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bertfuse.bench.scaling import write_report  # noqa: E402 (after the path)
from bertfuse.ray_cluster import alive, descendants  # noqa: E402

PHASES = ("load", "replica", "node", "sigterm")
UP_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def reap(pids: set[int], grace_s: float = 15.0) -> None:
    """SIGKILL for any of `pids` still there after grace_s."""
    deadline = time.monotonic() + grace_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in alive(pids):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


class Server:
    """`bertfuse serve MODEL --json ...` in its own process, up once it prints its URL."""

    def __init__(self, model: str, args: list[str], env: dict[str, str]) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bertfuse", "serve", model, "--port", str(self.port),
             "--json", "--outputs", "pooled_output", *args], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout),
                         daemon=True).start()
        deadline = time.monotonic() + UP_S
        while not self.lines and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not self.lines:
            self.proc.kill()
            raise RuntimeError(f"serve did not start: {self.proc.stderr.read()[-1500:]}")
        self.started = time.monotonic()
        self.seen = descendants(self.proc.pid)

    def replicas(self) -> list[int]:
        return sorted(p for p in descendants(self.proc.pid) if "ServeReplica" in cmdline(p))

    def stop(self) -> int | None:
        self.seen |= descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        reap(self.seen)
        return self.proc.returncode


class Load:
    """C clients posting `body` in a loop; each result (time sent, seconds, outcome)."""

    def __init__(self, port: int, body: bytes, clients: int, rows: int) -> None:
        self.port, self.body, self.rows = port, body, rows
        self.results: list[tuple[float, float, str]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True)
                        for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self) -> None:
        conn = None
        while not self.stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                try:
                    conn.connect()
                except OSError:
                    self.results.append((time.monotonic(), 0.0, "refused"))
                    conn = None
                    time.sleep(0.05)
                    continue
            start = time.monotonic()
            try:
                conn.request("POST", "/v1/infer", self.body,
                             {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                ok = r.status == 200 and \
                    len(json.loads(data)["outputs"]["pooled_output"]) == self.rows
                outcome = "ok" if ok else f"http:{r.status}"
                if r.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
                outcome = f"lost:{type(exc).__name__}"
                conn.close()
                conn = None
            self.results.append((start, time.monotonic() - start, outcome))

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)

    def summary(self, since: float = 0.0, until: float = float("inf")) -> dict:
        part = [r for r in self.results if since <= r[0] < until]
        ok = [d for _, d, o in part if o == "ok"]
        failed = [o for _, _, o in part if o not in ("ok", "refused")]
        span = (max(r[0] + r[1] for r in part) - min(r[0] for r in part)) if part else 0
        return {"requests": len(part), "answered": len(ok), "failed": len(failed),
                "refused": sum(o == "refused" for _, _, o in part),
                "failures": sorted(set(failed))[:5],
                "p50_ms": round(float(np.median(ok)) * 1e3, 2) if ok else None,
                "p99_ms": round(float(np.percentile(ok, 99)) * 1e3, 2) if ok else None,
                "seq_per_s": round(len(ok) * self.rows / span, 1) if span else None}

    def failure_window(self, since: float) -> float:
        """Seconds from `since` to the last failed request's start (0: none failed)."""
        bad = [t for t, _, o in self.results if t >= since and o not in ("ok", "refused")]
        return round(max(bad) - since, 2) if bad else 0.0


def request_body(rows: int, seq: int) -> bytes:
    rng = np.random.default_rng(0)
    # ids below 1000: within any BERT vocabulary (the tiny example's has 1000)
    return json.dumps({"input_ids": rng.integers(100, 1000, (rows, seq)).tolist()}).encode()


def phase_load(args, env, body) -> dict:
    server = Server(args.model, ["--max-batch", str(args.max_batch)], env)
    try:
        Load(server.port, body, 2, args.rows).finish()  # nothing: warms connections
        load = Load(server.port, body, args.clients, args.rows)
        time.sleep(args.seconds)
        load.finish()
        return {"clients": args.clients, "seconds": args.seconds, **load.summary(),
                "ingress": json.loads(server.lines[0]).get("ingress")}
    finally:
        server.stop()


def phase_replica(args, env, body) -> dict:
    server = Server(args.model, ["--max-batch", str(args.max_batch), "--replicas", "2"], env)
    try:
        before = server.replicas()
        load = Load(server.port, body, args.clients, args.rows)
        time.sleep(args.seconds / 2)
        killed_at = time.monotonic()
        os.kill(before[0], signal.SIGKILL)
        time.sleep(args.seconds / 2)
        load.finish()
        back = [p for p in server.replicas() if p not in before]
        return {"clients": args.clients, "replicas": len(before), **load.summary(),
                "failed_after_kill_s": load.failure_window(killed_at),
                "after_kill": load.summary(since=killed_at + args.settle_s),
                "replaced": bool(back), "serve_running": server.proc.poll() is None}
    finally:
        server.stop()


class TwoNodes:
    """A head and a worker node on 127.0.0.1 (`ray start --block`, children of this
    process, so their processes are its descendants), a CPU and a token each of their own."""

    def __init__(self, env: dict[str, str]) -> None:
        self.temp = tempfile.mkdtemp(prefix="bf2n", dir="/tmp")
        token = os.path.join(self.temp, "auth_token")
        with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token}
        self.address = f"127.0.0.1:{free_port()}"
        self.procs: dict[str, subprocess.Popen] = {}
        self._start("head", "--head", "--port", self.address.split(":")[1],
                    "--ray-client-server-port", str(free_port()), "--include-dashboard",
                    "false", "--dashboard-port", str(free_port()))
        self._wait(1)
        self._start("worker", "--address", self.address)
        self._wait(2)

    def _start(self, name: str, *extra: str) -> None:
        temp = os.path.join(self.temp, name)
        os.makedirs(temp)
        ports = [f"--{k}-port" for k in ("node-manager", "object-manager",
                                           "dashboard-agent-listen", "dashboard-agent-grpc",
                                           "runtime-env-agent", "metrics-export")]
        cmd = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--block",
               "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--num-gpus", "0",
               "--temp-dir", temp, "--object-store-memory", str(200 << 20),
               "--disable-usage-stats", *[a for p in ports for a in (p, str(free_port()))],
               *extra]
        self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)

    def _wait(self, count: int) -> None:
        script = (f"import ray, sys, time\nray.init(address={self.address!r}, "
                  f"logging_level='ERROR')\nend = time.monotonic() + {UP_S}\n"
                  f"while sum(n['Alive'] for n in ray.nodes()) < {count}:\n"
                  "    if time.monotonic() > end: sys.exit(1)\n    time.sleep(0.5)\n")
        ran = subprocess.run([sys.executable, "-c", script], env=self.env,
                             capture_output=True, text=True, timeout=UP_S + 60)
        if ran.returncode:
            raise RuntimeError(f"{count} Ray node(s) never up: {ran.stderr[-1500:]}")

    def worker_raylet(self) -> int:
        return next(p for p in descendants(self.procs["worker"].pid)
                    if psutil.Process(p).name() == "raylet")

    def stop(self) -> None:
        seen = set()
        for p in self.procs.values():
            seen |= descendants(p.pid) | {p.pid}
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        reap(seen, 30)
        for p in self.procs.values():
            p.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


def phase_node(args, env, body) -> dict:
    nodes = TwoNodes(env)
    try:
        server = Server(args.model, ["--max-batch", str(args.max_batch), "--replicas", "2",
                                     "--address", nodes.address], nodes.env)
        try:
            on_worker = [p for p in descendants(nodes.procs["worker"].pid)
                         if "ServeReplica" in cmdline(p)]
            load = Load(server.port, body, args.clients, args.rows)
            time.sleep(args.seconds / 2)
            killed_at = time.monotonic()
            os.kill(nodes.worker_raylet(), signal.SIGKILL)
            time.sleep(args.seconds / 2)
            load.finish()
            return {"clients": args.clients, "replica_on_worker": bool(on_worker),
                    **load.summary(), "failed_after_kill_s": load.failure_window(killed_at),
                    "after_kill": load.summary(since=killed_at + args.settle_s),
                    "serve_running": server.proc.poll() is None,
                    "exit_code": server.stop()}
        finally:
            server.stop()
    finally:
        nodes.stop()


def phase_sigterm(args, env, body) -> dict:
    server = Server(args.model, ["--max-batch", str(args.max_batch)], env)
    try:
        load = Load(server.port, body, args.clients, args.rows)
        time.sleep(args.seconds / 2)
        answered = sum(o == "ok" for _, _, o in load.results)
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        rc = server.proc.wait(120)
        drained = time.monotonic() - sent
        load.finish()
        s = load.summary()
        return {"clients": args.clients, "answered_before_sigterm": answered,
                "requests_lost": s["failed"], "refused_after_close": s["refused"],
                "failures": s["failures"], "exit_code": rc, "drain_s": round(drained, 2),
                "last_line": json.loads(server.lines[-1])}
    finally:
        server.stop()


def versions() -> dict:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for name in ("ray", "onnxruntime", "uvicorn", "bertfuse"):
        try:
            out[name] = version(name)
        except Exception:  # noqa: BLE001
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a fused .onnx (bertfuse convert)")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"of {', '.join(PHASES)}")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0, help="load per phase")
    ap.add_argument("--settle-s", type=float, default=5.0,
                    help="after a kill, requests from this long on make the 'after' counts")
    ap.add_argument("--rows", type=int, default=4, help="rows per request")
    ap.add_argument("--seq", type=int, default=32, help="tokens per row")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    bad = [p for p in phases if p not in PHASES]
    if bad:
        ap.error(f"unknown phase {bad[0]!r}; phases: {', '.join(PHASES)}")
    env = child_env()
    body = request_body(args.rows, args.seq)
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                         f"{_cpu_name()}, {_mem_gb()} GB",
              "versions": versions(), "model": os.path.basename(args.model),
              "request": {"rows": args.rows, "seq": args.seq, "bytes": len(body)},
              "phases": {}}
    run = {"load": phase_load, "replica": phase_replica, "node": phase_node,
           "sigterm": phase_sigterm}
    for name in phases:
        start = time.monotonic()
        report["phases"][name] = result = run[name](args, env, body)
        result["phase_s"] = round(time.monotonic() - start, 1)
        print(f"{name:8s} {json.dumps(result)}", flush=True)
    write_report(report, args.out, "serve_faults.json")
    return 0


def child_env() -> dict[str, str]:
    """The environment of the server processes started here: this checkout importable, and
    no RAY_ADDRESS (each starts its own local Ray)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    return env


def _cpu_name() -> str:
    # /proc/cpuinfo by hand: psutil has no CPU model name
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _mem_gb() -> int:
    return round(psutil.virtual_memory().total / 2**30)


if __name__ == "__main__":
    raise SystemExit(main())
