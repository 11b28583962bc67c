"""`bertfuse serve` (bertfuse/serve/) against the real Ray Serve on 127.0.0.1, on the CPU: a
tiny fused BERT (builders/onnx_graphs.py through the default passes) served by one module-wide
deployment. Answers equal a direct Session call (ids and text); 32 clients x 50 requests are
all answered right, in fewer model calls than requests; every malformed request gets a 4xx
and one message while the service goes on; shutdown leaves no Ray process and no port (the
deployment here, and `bertfuse serve` stopped by SIGTERM in a subprocess)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
import ray  # the `ray` extra, in CI's default extras: never skipped

from bertfuse.converter.example_vocab import example_vocab
from bertfuse.io.schemas import first_error
from bertfuse.runtime import Session
from bertfuse.runtime.request_checks import ConfigError
from bertfuse.serve.ingress import quiet_port
from bertfuse.serve.requests import decode, encode, encode_body
from bertfuse.text import WordPiece
from support.builders.onnx_graphs import bert
from support.paths import ROOT
from support.processes import descendants, wait_gone


VOCAB, POSITIONS, MAX_BATCH = 300, 64, 16
TOL = 1e-5  # fp32: the same kernels, only the padding differs (masked keys)


def free_port() -> int:
    """A free port below the kernel's ephemeral range (ingress.quiet_port): a port-0 pick may
    be taken as the local port of some outgoing connection before the server binds it (a
    restart on the same port failed so: "cannot bind socket (Address already in use)")."""
    return quiet_port()


def port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


class Client:
    """One keep-alive HTTP connection (per thread)."""

    def __init__(self, url: str) -> None:
        host, port = url.split("//")[1].rstrip("/").split("/")[0].split(":")
        self.prefix = "/" + "/".join(url.split("//")[1].rstrip("/").split("/")[1:])
        self.prefix = self.prefix.rstrip("/") + "/"
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
        self.conn.request(method, self.prefix + path, body=body,
                          headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        return r.status, json.loads(data)

    def infer(self, payload: dict | bytes) -> tuple[int, dict]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return self.request("POST", "v1/infer", body)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    from bertfuse.passes.manager import run_passes

    root = tmp_path_factory.mktemp("serve")
    model = bert(np.random.default_rng(0), layers=2, hidden=32, heads=2, inter=64, vocab=VOCAB,
                 positions=POSITIONS)
    fused, report = run_passes(model)
    assert report.table.fully_fused
    onnx.save(fused, root / "tiny.onnx")
    (root / "vocab.txt").write_text("".join(t + "\n" for t in example_vocab(VOCAB)))
    return {"model": str(root / "tiny.onnx"), "vocab": str(root / "vocab.txt")}


@pytest.fixture(scope="module")
def session(tiny) -> Session:
    return Session(tiny["model"], device="cpu", max_batch=MAX_BATCH)


@pytest.fixture(scope="module")
def served(tiny):
    """One local Ray (2 CPUs, no dashboard) with two applications on one Serve: 'bertfuse'
    at / (text in, its vocab) and 'ids' at /ids (no vocab, pooled_output only; its ingress
    left to auto, which is proxy in a process that runs Ray). Teardown checks that shutting
    down leaves none of the Ray processes it started, nor the port."""
    from bertfuse.serve import deploy

    before = descendants(os.getpid())
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    try:
        main = deploy(tiny["model"], port=port, vocab=tiny["vocab"], max_batch=MAX_BATCH,
                      max_wait_ms=5, cpus_per_replica=0.5, ingress="proxy")
        ids = deploy(tiny["model"], name="ids", outputs=["pooled_output"], max_batch=4,
                     batch_buckets="2,4", cpus_per_replica=0.5)
    except BaseException:
        ray.shutdown()
        raise
    started = descendants(os.getpid()) - before
    assert started, "ray.init started no process"
    yield {"main": main, "ids": ids, "port": port}
    ids.shutdown()
    main.shutdown()  # it started Serve: Serve goes
    ray.shutdown()
    left = wait_gone(started)
    assert not left, f"Ray processes left after shutdown: {sorted(left)}"
    assert port_closed(port)


def test_ids_equal_a_direct_session_call(served, session):
    rng = np.random.default_rng(1)
    client = Client(served["main"].url)
    for rows, seq in ((1, 5), (3, 17), (MAX_BATCH, POSITIONS)):
        ids = rng.integers(1, VOCAB, (rows, seq))
        mask = np.ones((rows, seq), np.int64)
        mask[0, seq // 2 + 1:] = 0  # padding in a row
        segs = rng.integers(0, 2, (rows, seq))
        status, body = client.infer({"input_ids": ids.tolist(), "input_mask": mask.tolist(),
                                     "segment_ids": segs.tolist()})
        assert status == 200, body
        got, want = decode(body), session.run(ids, mask, segs)
        assert set(got) == {"sequence_output", "pooled_output"}
        for name in got:
            assert got[name].shape == want[name].shape
            assert np.abs(got[name] - want[name]).max() <= TOL, (name, rows, seq)
    # one row as a flat list; mask and segments default to ones and zeros
    status, body = client.infer({"input_ids": [7, 8, 9], "outputs": ["pooled_output"]})
    want = session.run(np.array([[7, 8, 9]]))["pooled_output"]
    assert status == 200 and list(body["outputs"]) == ["pooled_output"]
    assert np.abs(decode(body)["pooled_output"] - want).max() <= TOL


def tensor(values: object, dtype: str = "int32", shape: list | None = None, **extra) -> dict:
    """An id role as a base64 tensor, the request form of a base64 response's outputs."""
    arr = np.asarray(values)
    return {"dtype": dtype, "shape": list(arr.shape) if shape is None else shape,
            "data": base64.b64encode(arr.astype(np.dtype(dtype).newbyteorder("<"))
                                     .tobytes()).decode(), **extra}


def test_base64_ids_equal_lists_and_a_direct_session_call(served, session):
    """Tensors in (int32 and int64, alone or beside lists) answer as the same ids sent as
    lists do; each sequential request ran alone (no serve.batch) and was counted."""
    rng = np.random.default_rng(2)
    client = Client(served["main"].url)
    _, before = client.request("GET", "stats")
    ids = rng.integers(1, VOCAB, (3, 11))
    mask = np.ones((3, 11), np.int64)
    mask[1, 6:] = 0
    segs = rng.integers(0, 2, (3, 11))
    want = session.run(ids, mask, segs)
    as_lists = {"input_ids": ids.tolist(), "input_mask": mask.tolist(),
                "segment_ids": segs.tolist(), "encoding": "base64"}
    status, listed = client.infer(as_lists)
    assert status == 200, listed
    forms = [{r: tensor(as_lists[r], dtype) for r in ("input_ids", "input_mask", "segment_ids")}
             for dtype in ("int32", "int64")]
    forms.append({**as_lists, "input_ids": tensor(ids)})  # one role as a tensor, two as lists
    for form in forms:
        status, body = client.infer({**as_lists, **form})
        assert status == 200, body
        assert body == listed  # the same JSON, byte for byte once parsed
        got = decode(body)
        for name in want:
            assert np.abs(got[name] - want[name]).max() <= TOL, name
    _, after = client.request("GET", "stats")
    assert after["requests"] - before["requests"] == 4
    assert after["alone"] - before["alone"] == 4  # nothing else in flight: the idle path
    assert after["batches"] - before["batches"] == 4
    assert after["rows"] - before["rows"] == 4 * 3
    for stage in ("request", "parse", "queue", "model_call", "resume", "encode"):
        assert after[f"{stage}_ms_p50"] > 0, stage
    assert after["request_ms_p50"] >= after["model_call_ms_p50"]


def test_encode_body_is_json_dumps_of_encode():
    """The response built as bytes is the compact JSON of encode(), for both encodings."""
    rng = np.random.default_rng(3)
    result = {"pooled_output": rng.standard_normal((3, 5)).astype(np.float32),
              "sequence_output": rng.standard_normal((3, 4, 2)).astype(np.float16),
              'odd "name"\u00e9': np.arange(3, dtype=np.float32)}
    for encoding in ("base64", "json"):
        body = encode_body(result, encoding)
        assert body == json.dumps(encode(result, encoding), separators=(",", ":")).encode()
        got = decode(json.loads(body))
        for name, arr in result.items():
            assert got[name].dtype == np.float32 and np.array_equal(got[name], arr), name


def test_text_equals_tokenize_then_session(served, session, tiny):
    client = Client(served["main"].url)
    texts, pairs = ["what is bert?", "The quick brown fox jumps."], ["a model", "a dog"]
    status, body = client.infer({"text": texts, "text_pair": pairs, "encoding": "base64"})
    assert status == 200, body
    batch = WordPiece(tiny["vocab"], model=tiny["model"])(texts, pairs)
    want = session.run(**batch.feeds())
    got = decode(body)
    assert body["outputs"]["pooled_output"]["shape"] == [2, 32]
    for name in got:
        assert np.abs(got[name] - want[name]).max() <= TOL, name
    status, one = client.infer({"text": "what is bert?", "outputs": "pooled_output"})
    alone = session.run(**WordPiece(tiny["vocab"], model=tiny["model"])("what is bert?")
                        .feeds())["pooled_output"]
    assert status == 200 and np.abs(decode(one)["pooled_output"] - alone).max() <= TOL


def test_32_clients_x_50_requests_batched(served, session):
    """Each client sends 50 requests of 1-3 rows of their own lengths, drawn from 64 whose
    answers the session gave beforehand; every answer is checked; the replica ran fewer
    batches than it answered requests."""
    rng = np.random.default_rng(100)
    pool = []
    for _ in range(64):
        ids = rng.integers(1, VOCAB, (int(rng.integers(1, 4)), int(rng.integers(2, 40))))
        body = json.dumps({"input_ids": ids.tolist(), "outputs": ["pooled_output"]}).encode()
        pool.append((body, session.run(ids, outputs=["pooled_output"])["pooled_output"]))
    client = Client(served["main"].url)
    _, before = client.request("GET", "stats")
    errors: list[str] = []

    def one_client(k: int) -> int:
        c, done = Client(served["main"].url), 0
        for i in range(50):
            body, want = pool[(k * 7 + i * 13) % len(pool)]
            status, got = c.infer(body)
            if status != 200:
                errors.append(f"{status} {got}")
                continue
            diff = float(np.abs(decode(got)["pooled_output"] - want).max())
            if diff > TOL:
                errors.append(f"client {k}: |diff| {diff}")
            done += 1
        return done

    with ThreadPoolExecutor(32) as threads:
        answered = sum(threads.map(one_client, range(32)))
    assert not errors, errors[:5]
    assert answered == 32 * 50
    _, after = client.request("GET", "stats")
    requests = after["requests"] - before["requests"]
    batches = after["batches"] - before["batches"]
    assert requests == 32 * 50
    assert batches < requests, (batches, requests)
    assert after["max_batch_rows"] > 3  # some model call held several requests' rows
    # requests alone in the replica skip serve.batch: the rest were batched
    assert after["alone"] - before["alone"] < requests
    print(f"{requests} requests in {batches} model calls, "
          f"{after['alone'] - before['alone']} alone")


MALFORMED = [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    ({"input_ids": [[1.5, 2]]}, 400, "integer ids"),
    ({"input_ids": [["a"]]}, 400, "integer ids"),
    ({"input_ids": [[True, 1]]}, 400, "integer ids"),
    ({"input_ids": [[1, True]]}, 400, "integer ids"),
    ({"input_ids": [[1, 2 ** 70]]}, 400, "64 bits"),
    ({"input_ids": [[1], 2]}, 400, "a mix of rows and ids"),
    ({"input_ids": [[[1, 2]]]}, 400, "nested deeper"),
    ({"input_ids": 5}, 400, "list of integer ids"),
    ({"input_ids": [[1] * (POSITIONS + 1)]}, 400, "over the server's limit of 64"),
    ({"input_ids": [[1, VOCAB]]}, 400, f"[0, {VOCAB})"),
    ({"input_ids": [[1, -1]]}, 400, f"[0, {VOCAB})"),
    ({"input_ids": [[1, 2]], "segment_ids": [[0, 2]]}, 400, "segment_ids values"),
    ({"input_ids": []}, 400, "empty"),
    ({"input_ids": [[]]}, 400, "empty"),
    ({"input_ids": [[1, 2], [3]]}, 400, "different lengths"),
    ({"input_ids": [[1, 2]], "input_mask": [[1, 1, 1]]}, 400, "shape"),
    ({"input_ids": [[1]] * (MAX_BATCH + 1)}, 400, "--max-batch"),
    ({"input_mask": [[1]]}, 400, "input_ids is required"),
    ({"input_ids": [[1]], "outputs": ["logits"]}, 400, "no output 'logits'"),
    ({"input_ids": [[1]], "encoding": "hex"}, 400, "encoding"),
    ({"input_ids": [[1]], "text": "a"}, 400, "not both"),
    ({"text": 7}, 400, "str"),
    ({"input_id": [[1]]}, 400, "unknown field 'input_id'"),
    # ids as base64 tensors
    ({"input_ids": tensor([[1.0, 2.0]], "float32")}, 400, "dtype must be 'int32' or 'int64'"),
    ({"input_ids": tensor([[1, 2]], "uint8")}, 400, "dtype must be"),
    ({"input_ids": tensor([1, 2])}, 400, "shape must be [rows, seq]"),
    ({"input_ids": tensor([[[1, 2]]])}, 400, "shape must be [rows, seq]"),
    ({"input_ids": tensor([[1, 2]], shape=[1, "2"])}, 400, "shape must be [rows, seq]"),
    ({"input_ids": tensor([[1, 2]], shape=[1, True])}, 400, "shape must be [rows, seq]"),
    ({"input_ids": tensor([[1, 2]], shape=None) | {"shape": "1,2"}}, 400, "shape must be"),
    ({"input_ids": tensor(np.zeros((0, 2), int))}, 400, "empty"),
    ({"input_ids": tensor([[1, 2]], shape=[1, 3])}, 400, "holds 8 bytes"),
    ({"input_ids": tensor([[1, 2]], "int64", shape=[1, 3])}, 400, "holds 16 bytes"),
    ({"input_ids": tensor([[1, 2]]) | {"data": "AQAAAAIAAA*="}}, 400, "not valid base64"),
    ({"input_ids": tensor([[1, 2]]) | {"data": "AQAAAAIAAAA"}}, 400, "not valid base64"),
    ({"input_ids": tensor([[1, 2]]) | {"data": "\u00e9"}}, 400, "not valid base64"),
    ({"input_ids": tensor([[1, 2]]) | {"data": [1, 2]}}, 400, "base64 string"),
    ({"input_ids": {"dtype": "int32", "shape": [1, 2]}}, 400, "no field 'data'"),
    ({"input_ids": tensor([[1, 2]], order="C")}, 400, "unknown field 'order'"),
    ({"input_ids": tensor([[1, 2 ** 40]], "int64")}, 400, f"[0, {VOCAB})"),
    ({"input_ids": tensor([[1, -1]])}, 400, f"[0, {VOCAB})"),
    ({"input_ids": tensor([[1, 2]]), "segment_ids": tensor([[0, 2]])}, 400,
     "segment_ids values"),
    ({"input_ids": tensor([[1, 2]]), "input_mask": [[1, 1, 1]]}, 400, "shape"),
    ({"input_ids": tensor([[1]] * (MAX_BATCH + 1))}, 400, "--max-batch"),
    ({"input_ids": tensor([[1] * (POSITIONS + 1)])}, 400, "over the server's limit of 64"),
]


@pytest.mark.parametrize("payload,status,words", MALFORMED,
                         ids=[w.split()[0] + str(i) for i, (_, _, w) in enumerate(MALFORMED)])
def test_malformed_request_is_a_4xx_and_service_goes_on(served, payload, status, words):
    client = Client(served["main"].url)
    got, body = client.infer(payload)
    assert got == status and list(body) == ["error"], (got, body)
    message = body["error"]
    assert words in message and "\n" not in message and "Traceback" not in message, message
    ok, _ = client.infer({"input_ids": [[1, 2, 3]], "outputs": ["pooled_output"]})
    assert ok == 200


def test_other_4xx_routes_and_text_without_a_vocab(served):
    client = Client(served["main"].url)
    assert client.request("GET", "v1/infer")[0] == 405
    status, body = client.request("GET", "nowhere")
    assert status == 404 and "v1/infer" in body["error"]
    status, body = client.infer(b"{" + b" " * (2 << 20) + b"}")
    assert status == 413 and "over the limit" in body["error"]
    ids = Client(served["ids"].url)  # started without a vocab
    status, body = ids.infer({"text": ["what is bert?"]})
    assert status == 400 and "without --vocab" in body["error"], body
    status, body = ids.infer({"input_ids": [[1, 2]] * 5})
    assert status == 400 and "1..4 rows" in body["error"], body
    status, body = ids.infer({"input_ids": [[1, 2]]})
    assert status == 200 and list(body["outputs"]) == ["pooled_output"]


def test_health_readiness_and_stats(served):
    client = Client(served["main"].url)
    assert client.request("GET", "healthz") == (200, {"status": "ok"})
    status, ready = client.request("GET", "readyz")
    assert status == 200 and ready["ready"] and ready["device"] == "cpu"
    assert ready["warm_buckets"] >= 1  # warmed before it took traffic
    stats = served["main"].stats()
    assert stats["max_batch"] == MAX_BATCH and stats["max_seq"] == POSITIONS
    assert stats["ingress"] == "proxy" and served["main"].ingress_why is None  # as asked
    ids = served["ids"]  # ingress left to auto: Ray already ran here, so Serve's proxy
    assert ids.config.ingress == "proxy" and ids.config.gpus_per_replica == 1.0
    assert ids.ingress_why == "this process already runs Ray"
    assert served["main"].url == f"http://127.0.0.1:{served['port']}/"
    assert served["ids"].url == f"http://127.0.0.1:{served['port']}/ids/"
    (metrics,) = served["main"].metrics_urls()  # Ray's Prometheus endpoint of the one node
    with urllib.request.urlopen(metrics, timeout=30) as r:
        assert r.status == 200 and b"# TYPE ray_" in r.read()


def test_cuda_replicas_need_gpus_in_the_cluster(served, tiny):
    from bertfuse.errors import BertfuseError
    from bertfuse.serve import deploy

    with pytest.raises(BertfuseError, match="has no GPU"):
        deploy(tiny["model"], device="cuda", name="gpu")
    assert Client(served["main"].url).infer({"input_ids": [[1, 2]]})[0] == 200  # still up


def test_deploy_checks_its_arguments_before_ray(tiny, tmp_path):
    from bertfuse.serve import deploy

    cases = [({"max_batch": 0}, "max_batch"), ({"replicas": 1.5}, "replicas"),
             ({"max_wait_ms": -1}, "max_wait_ms"), ({"port": 70000}, "port"),
             ({"device": "tpu"}, "device"), ({"outputs": ["nope"]}, "no output 'nope'"),
             ({"max_seq": POSITIONS + 1}, "position table"), ({"bogus": 1}, "unknown argument"),
             ({"vocab": str(tmp_path / "missing.txt")}, "not found"),
             ({"batch_buckets": [0, 4]}, "batch_buckets"), ({"batch_buckets": "4,x"}, "row count"),
             ({"batch_buckets": [MAX_BATCH * 2 + 1]}, "(max_batch)"),
             ({"gpus_per_replica": 0}, "above 0"), ({"gpus_per_replica": 2}, "gpus_per_replica"),
             ({"device": "cuda", "max_batch": 0}, "max_batch")]
    for kwargs, words in cases:
        with pytest.raises(Exception) as info:
            deploy(tiny["model"], **kwargs)
        assert words in str(info.value), (kwargs, info.value)
    with pytest.raises(ConfigError, match="none.onnx: no such file"):
        deploy(str(tmp_path / "none.onnx"))


def test_ingress_is_checked_before_ray(served, tiny):
    """--ingress: one of auto/proxy/direct/haproxy; the experimental ones are switched on when
    Ray starts, so not with --address, nor in a process whose Ray is already up (this one);
    auto goes with an address (it is proxy there)."""
    from bertfuse.errors import BertfuseError
    from bertfuse.serve import deploy
    from bertfuse.serve.config import check_config

    with pytest.raises(ConfigError, match="ingress must be one of auto, proxy, direct, haproxy"):
        deploy(tiny["model"], ingress="nginx")
    for ingress in ("direct", "haproxy"):
        with pytest.raises(ConfigError, match="leave out address"):
            deploy(tiny["model"], ingress=ingress, address="auto")
    assert check_config(tiny["model"], address="auto").ingress == "auto"  # decided in deploy
    assert check_config(tiny["model"]).gpus_per_replica is None
    with pytest.raises(ConfigError, match="gpus_per_replica must be a number 0..1"):
        deploy(tiny["model"], gpus_per_replica="all")
    with pytest.raises(BertfuseError, match="already runs Ray"):
        deploy(tiny["model"], ingress="haproxy", name="hx")
    assert Client(served["main"].url).infer({"input_ids": [[1, 2]]})[0] == 200  # still up
    out = subprocess.run([sys.executable, "-m", "bertfuse", "serve", tiny["model"],
                          "--ingress", "nginx"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 2 and "--ingress" in out.stderr, out.stderr


def test_auto_ingress_decides_as_serve_finds_haproxy(tiny, tmp_path, monkeypatch):
    """ingress 'auto' is proxy with an address or a Ray already running here; for a local Ray
    it is haproxy exactly where this Linux's Ray is >= 2.55 and the HAProxy binary that Ray
    Serve's own lookup finds runs; RAY_SERVE_HAPROXY_BINARY_PATH, Serve's override, counts
    too. gpus_per_replica left out: 0.25 behind HAProxy, else 1; an explicit one stays."""
    from ray.serve._private.haproxy import _resolve_haproxy_binary

    from bertfuse.serve.config import check_config, resolve
    from bertfuse.serve.ingress import auto_ingress, haproxy_binary

    assert auto_ingress("auto", False)[0] == auto_ingress("10.0.0.1:6379", False)[0] == "proxy"
    assert auto_ingress(None, True) == ("proxy", "this process already runs Ray")
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    try:
        serves = _resolve_haproxy_binary()
    except FileNotFoundError:
        serves = None
    runs = serves is not None and subprocess.run([serves, "-v"], capture_output=True,
                                                 timeout=30).returncode == 0
    assert haproxy_binary() == (serves if runs else None)
    release = tuple(int(p) for p in ray.__version__.split(".")[:2])
    want = "haproxy" if sys.platform.startswith("linux") and release >= (2, 55) and runs \
        else "proxy"
    assert auto_ingress(None, False)[0] == want, auto_ingress(None, False)
    not_run = tmp_path / "haproxy"
    not_run.write_text("#!/bin/sh\nexit 1\n")
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(not_run))  # not executable
    assert haproxy_binary() is None
    not_run.chmod(0o755)  # executable, but `haproxy -v` fails
    assert haproxy_binary() is None
    assert auto_ingress(None, False)[0] == "proxy"
    if runs:
        monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", serves)
        assert haproxy_binary() == serves
    cfg = check_config(tiny["model"])
    assert (resolve(cfg, "haproxy").ingress, resolve(cfg, "haproxy").gpus_per_replica) \
        == ("haproxy", 0.25)
    assert (resolve(cfg, "proxy").ingress, resolve(cfg, "proxy").gpus_per_replica) \
        == ("proxy", 1.0)
    assert resolve(check_config(tiny["model"], gpus_per_replica=0.5), "haproxy") \
        .gpus_per_replica == 0.5
    direct = resolve(check_config(tiny["model"], ingress="direct"), "haproxy")
    assert (direct.ingress, direct.gpus_per_replica) == ("direct", 1.0)


@pytest.mark.parametrize("ingress", ["default", "proxy", "direct"])
def test_cli_serve_until_sigterm_leaves_nothing(tiny, session, tmp_path, ingress):
    """`bertfuse serve --json` in its own process: the URL on stdout once ready, a request
    answered as a direct Session call answers it, SIGTERM: exit 0, every process it started
    gone (HAProxy too), the port closed. 'default': no --ingress, so auto (haproxy here
    where auto_ingress finds it, this CPU's one replica behind HAProxy), shown in --json and
    /stats. With --ingress direct, ids as a base64 tensor and the replica's /stats."""
    from bertfuse.serve.ingress import auto_ingress

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "RAY_ADDRESS": ""}
    flags = [] if ingress == "default" else ["--ingress", ingress]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertfuse", "serve", tiny["model"], "--port", str(port),
         "--max-batch", "4", "--outputs", "pooled_output", *flags, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not lines and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lines, f"no URL printed (exit {proc.poll()}): {proc.stderr.read()[-2000:]}"
        info = json.loads(lines[0])
        assert first_error(info, "serve.json") is None, first_error(info, "serve.json")
        assert info["url"] == f"http://127.0.0.1:{port}/" and info["device"] == "cpu"
        chosen, why = auto_ingress(None, False) if ingress == "default" else (ingress, None)
        assert (info["ingress"], info["ingress_why"]) == (chosen, why), info
        client = Client(info["urls"][0])
        status, body = client.infer({"input_ids": [[5, 6]]})
        assert status == 200, body
        got = np.asarray(body["outputs"]["pooled_output"])
        want = session.run(np.array([[5, 6]]), outputs=["pooled_output"])["pooled_output"]
        assert got.shape == (1, 32) and np.abs(got - want).max() <= TOL
        assert client.request("GET", "stats")[1]["ingress"] == chosen
        if ingress == "direct":
            status, again = client.infer({"input_ids": tensor([[5, 6]]), "encoding": "base64"})
            assert status == 200 and np.array_equal(
                decode(again)["pooled_output"], np.asarray(body["outputs"]["pooled_output"],
                                                           np.float32)), again
            status, stats = client.request("GET", "stats")
            assert status == 200 and stats["requests"] == 2 and stats["alone"] == 2, stats
        started = descendants(proc.pid)
        assert started
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    assert rc == 0, proc.stderr.read()[-2000:]
    # stdout holds our two lines only (Ray's own prints go to stderr)
    assert len(lines) == 2 and json.loads(lines[1]) == {
        "schema_version": 1, "command": "serve", "ok": True, "stopped": "SIGTERM"}, lines
    assert not wait_gone(started), "processes left behind by bertfuse serve"
    assert port_closed(port)


@pytest.mark.parametrize("case", ["bad model", "no cluster there", "bad address"])
def test_cli_bad_input_is_one_line(tmp_path, tiny, case):
    bad = tmp_path / "x.onnx"
    bad.write_bytes(b"not a model")
    argv, words = {"bad model": ([str(bad)], "x.onnx: not a readable ONNX model"),
                   "no cluster there": ([tiny["model"], "--address", f"127.0.0.1:{free_port()}"],
                                        "cannot reach a Ray cluster"),
                   "bad address": ([tiny["model"], "--address", "head"], "HOST:PORT")}[case]
    out = subprocess.run([sys.executable, "-m", "bertfuse", "serve", *argv],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and words in lines[0], out.stderr


def test_import_bertfuse_does_not_load_ray():
    code = ("import sys, bertfuse, bertfuse.cli.parser, bertfuse.serve, bertfuse.cli.serve; "
            "bertfuse.cli.parser.build_parser(); "
            "assert 'ray' not in sys.modules and 'onnxruntime' not in sys.modules, 'loaded'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_ray_failure_while_starting_is_one_line_and_leaves_nothing(served, tiny, monkeypatch,
                                                                    capsys):
    """A Ray process dying while the service starts (here: the placement step raising Ray's
    own ActorDiedError, as when a worker is killed for memory) is a ServeFailed, exit 1 in the
    CLI with one line, not an internal error; the Serve already running keeps serving."""
    from ray.exceptions import ActorDiedError

    import bertfuse.serve.api as api
    from bertfuse import cli

    def died(cfg, plan=None):
        raise ActorDiedError()

    monkeypatch.setattr(api, "_placement", died)
    with pytest.raises(api.ServeFailed, match="Ray failed while the service was starting "
                                              r"\(ActorDiedError"):
        api.deploy(tiny["model"], name="dies", ingress="proxy")
    assert cli.main(["serve", tiny["model"], "--name", "dies", "--ingress", "proxy"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ActorDiedError" in err[0], err
    assert Client(served["main"].url).infer({"input_ids": [[1, 2]]})[0] == 200


def test_switch_interval_variable_is_checked_before_ray(tiny, monkeypatch):
    """BERTFUSE_SERVE_SWITCH_MS (every replica reads it) is checked with the arguments: a bad
    value is one ConfigError before any Ray process starts, a good one is taken."""
    from bertfuse.serve.config import check_config, switch_interval_s

    for bad in ("fast", "0", "-1", "5000"):
        monkeypatch.setenv("BERTFUSE_SERVE_SWITCH_MS", bad)
        with pytest.raises(ConfigError, match="BERTFUSE_SERVE_SWITCH_MS"):
            check_config(tiny["model"])
    monkeypatch.setenv("BERTFUSE_SERVE_SWITCH_MS", "2")
    assert switch_interval_s() == 0.002 and check_config(tiny["model"]).model == tiny["model"]
    monkeypatch.delenv("BERTFUSE_SERVE_SWITCH_MS")
    assert switch_interval_s() == 0.0005


def test_kernels_choice_is_checked_and_reaches_the_replicas(tiny):
    """serve's replicas choose their kernels at load (runtime/kernel_choice.py): auto by default,
    ort or bertfuse when asked; anything else is refused before Ray starts."""
    from bertfuse.errors import BertfuseError
    from bertfuse.serve.config import check_config, resolve
    from bertfuse.serve.replica_config import replica_config

    def replica_kernels(**kwargs) -> str:
        cfg = resolve(check_config(tiny["model"], **kwargs), "proxy")
        return replica_config(cfg, "cpu", 1, run="r").kernels

    assert replica_kernels() == "auto" and replica_kernels(kernels="ort") == "ort"
    with pytest.raises(BertfuseError, match="kernels must be one of 'auto', 'ort', 'bertfuse'"):
        check_config(tiny["model"], kernels="tensorrt")
    from bertfuse import cli

    assert cli.main(["serve", tiny["model"], "--kernels", "tensorrt"]) == 2  # argparse's choices
