"""Scale-out as users run it: a real two-node Ray cluster on this machine (`ray start --head`
and `ray start --address`, each node on 127.0.0.1 with its own ports, temp dir and a custom
resource naming it), `bertfuse serve --address` and `bertfuse score --address` against it,
and the worker node killed (its raylet, kill -9) mid-load and mid-job: serve goes on
answering from the head node's replica, score finishes with every row written exactly once.

Each node's `ray start --block` is a child of this test, so every process of the cluster is
one of its descendants: teardown stops those pids only (never `ray stop`, which would stop
every Ray of this user on the machine)."""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("ray")

from hostile.test_serve_network import model  # noqa: E402,F401
from support.paths import ROOT  # noqa: E402
from support.processes import cmdline, descendants, process_name, wait_gone  # noqa: E402
from unit.serve.test_serve import free_port  # noqa: E402

UP_S = 120


def _env(token_path: str) -> dict[str, str]:
    """This cluster's environment: Ray's token authentication (on by default for a `ray
    start --head` in Ray 2.60 once a token exists) with a token of its own, never the
    user's ~/.ray/auth_token; an explicit --address needs RAY_AUTH_MODE=token said."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]), "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path}
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        env.pop(name, None)
    return env


class TwoNodes:
    """A head (`cpus` CPUs, resource node_head) and a worker (resource node_worker) on
    127.0.0.1, every port chosen free, each with its own temp dir."""

    def __init__(self, head_cpus: int, worker_cpus: int) -> None:
        self.temp = tempfile.mkdtemp(prefix="bf2n", dir="/tmp")  # short: Ray's socket paths
        token = os.path.join(self.temp, "auth_token")
        with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        self.env = _env(token)
        self.address = f"127.0.0.1:{free_port()}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.seen: set[int] = set()
        try:
            self._start("head", head_cpus, "--head", "--port", self.address.split(":")[1],
                        "--ray-client-server-port", str(free_port()), "--include-dashboard",
                        "false", "--dashboard-port", str(free_port()))
            self._wait_nodes(1)
            self._start("worker", worker_cpus, "--address", self.address)
            self._wait_nodes(2)
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, cpus: int, *args: str) -> None:
        temp = os.path.join(self.temp, name)
        os.makedirs(temp)
        cmd = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--block",
               "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus), "--num-gpus", "0",
               "--resources", json.dumps({f"node_{name}": 1}), "--temp-dir", temp,
               "--object-store-memory", str(200 << 20), "--disable-usage-stats",
               "--node-manager-port", str(free_port()),
               "--object-manager-port", str(free_port()),
               "--dashboard-agent-listen-port", str(free_port()),
               "--dashboard-agent-grpc-port", str(free_port()),
               "--runtime-env-agent-port", str(free_port()),
               "--metrics-export-port", str(free_port()), *args]
        self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)

    def _wait_nodes(self, count: int) -> None:
        script = ("import ray, sys, time\n"
                  f"ray.init(address={self.address!r}, logging_level='ERROR')\n"
                  f"end = time.monotonic() + {UP_S}\n"
                  f"while sum(n['Alive'] for n in ray.nodes()) < {count}:\n"
                  "    if time.monotonic() > end: sys.exit(1)\n"
                  "    time.sleep(0.5)\n")
        deadline = time.monotonic() + UP_S
        while True:
            ran = subprocess.run([sys.executable, "-c", script], env=self.env,
                                 capture_output=True, text=True, timeout=UP_S + 60)
            if ran.returncode == 0:
                break
            assert time.monotonic() < deadline, f"{count} node(s) never up: {ran.stderr[-1500:]}"
            time.sleep(1)
        self.snapshot()

    def snapshot(self) -> None:
        for p in self.procs.values():
            self.seen |= descendants(p.pid) | {p.pid}

    def node_pids(self, name: str) -> set[int]:
        return descendants(self.procs[name].pid)

    def kill_worker(self) -> None:
        """kill -9 of the worker node's raylet: its workers and agents go with it."""
        self.snapshot()
        raylets = [p for p in self.node_pids("worker") if process_name(p) == "raylet"]
        assert len(raylets) == 1, raylets
        os.kill(raylets[0], signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM to each `ray start --block` (it stops its node's processes), then
        SIGKILL for any process of this cluster still there."""
        self.snapshot()
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                pass
        for pid in wait_gone(self.seen, 15):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        left = wait_gone(self.seen, 15)
        import shutil

        shutil.rmtree(self.temp, ignore_errors=True)
        assert not left, sorted((p, process_name(p)) for p in left)


@pytest.fixture
def cluster(request):
    head, worker = request.param
    nodes = TwoNodes(head, worker)
    try:
        yield nodes
    finally:
        nodes.stop()


def _post(port: int, body: bytes) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/infer", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        return str(r.status)
    except (OSError, http.client.HTTPException) as exc:
        return f"lost:{type(exc).__name__}"
    finally:
        conn.close()


@pytest.mark.parametrize("cluster", [(1, 1)], indirect=True)  # one replica fits each node
def test_serve_goes_on_from_the_head_when_the_worker_node_dies(cluster, model):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertfuse", "serve", model["model"], "--address",
         cluster.address, "--port", str(port), "--replicas", "2", "--max-batch", "4",
         "--outputs", "pooled_output", "--json"], env=cluster.env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=model["root"])
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 240
        while not lines and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lines, f"no URL (exit {proc.poll()}): {proc.stderr.read()[-2000:]}"
        # a replica on each node: the worker's ray start has one among its processes
        replicas = [p for p in cluster.node_pids("worker") if "ServeReplica" in cmdline(p)]
        assert replicas, sorted(cmdline(p)[:60] for p in cluster.node_pids("worker"))
        body = json.dumps({"input_ids": [[5, 6, 7, 8]] * 2}).encode()
        results: list[tuple[float, str]] = []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                results.append((time.monotonic(), _post(port, body)))

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(3)
        killed = time.monotonic()
        cluster.kill_worker()
        time.sleep(20)
        stop.set()
        for t in threads:
            t.join(40)
        before = [s for t, s in results if t < killed]
        after = [s for t, s in results if t > killed + 10]  # Serve has dropped the dead replica
        assert before and all(s == "200" for s in before), before[:5]
        assert len(after) > 20 and all(s == "200" for s in after), \
            (len(after), [s for s in after if s != "200"][:5])
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, proc.stderr.read()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("cluster", [(2, 2)], indirect=True)  # 2 actors + a read task
def test_score_finishes_every_row_once_when_the_worker_node_dies(cluster, model, tmp_path):
    rows, part_rows = 6000, 500
    rng = np.random.default_rng(5)
    ids = [rng.integers(1, 300, n).tolist() for n in rng.integers(2, 17, rows)]
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"doc": np.arange(rows, dtype=np.int64) * 7 + 3,
                             "ids": pa.array(ids, pa.list_(pa.int32()))}), source,
                   row_group_size=part_rows)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertfuse", "score", "--model", model["model"], "--input",
         str(source), "--output", str(out), "--ids-column", "ids", "--key-columns", "doc",
         "--actors", "2", "--batch-size", "8", "--part-rows", str(part_rows), "--address",
         cluster.address], env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline and \
                not list((out / "scores").glob("part-*.parquet")):
            time.sleep(0.1)
        assert proc.poll() is None, f"finished before the kill: {proc.stderr.read()[-2000:]}"
        on_worker = sorted({cmdline(p)[:40] for p in cluster.node_pids("worker")})
        cluster.kill_worker()
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode:
        print(f"on the worker before the kill: {on_worker}\n{stderr[-3000:]}")
    assert proc.returncode == 0, stderr.strip().splitlines()[-1:]
    table = pq.read_table(out / "scores")
    docs = table.column("doc").to_pylist()
    assert len(docs) == rows and sorted(docs) == list(range(3, rows * 7 + 3, 7)), \
        (len(docs), len(set(docs)))
    assert len(list((out / "scores").glob("part-*.parquet"))) == rows // part_rows
