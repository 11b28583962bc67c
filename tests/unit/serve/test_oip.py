"""The Open Inference Protocol on `bertfuse serve` (bertfuse/serve/oip.py), driven by
tritonclient.http against the real Ray Serve on 127.0.0.1, on the CPU: one module-wide
deployment of the tiny fused BERT with its vocab. Health and metadata as Triton gives them;
infer with JSON tensors and with the binary-data extension (INT32 and INT64 ids, text as a
BYTES tensor) equal a direct Session call; both protocols share the replica's batches;
every malformed request gets 400/404/405/413 and {"error": ...} while the service goes on."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import ray  # the `ray` extra, in CI's default extras: never skipped
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bertfuse.serve.requests import body_limit, decode
from bertfuse.text import WordPiece
from unit.serve.test_serve import (MAX_BATCH, POSITIONS, TOL, VOCAB, Client, descendants,
                                   free_port, port_closed, session, tiny, wait_gone)

__all__ = ["session", "tiny"]  # fixtures shared with test_serve.py
NAME = "bert"


@pytest.fixture(scope="module")
def served(tiny):
    """One local Ray (2 CPUs, no dashboard), one deployment named NAME with the vocab."""
    from bertfuse.serve import deploy

    before = descendants(os.getpid())
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    try:
        served = deploy(tiny["model"], port=port, vocab=tiny["vocab"], max_batch=MAX_BATCH,
                        max_wait_ms=5, cpus_per_replica=0.5, ingress="proxy", name=NAME)
    except BaseException:
        ray.shutdown()
        raise
    started = descendants(os.getpid()) - before
    yield {"served": served, "port": port, "url": f"127.0.0.1:{port}"}
    served.shutdown()
    ray.shutdown()
    assert not wait_gone(started)
    assert port_closed(port)


@pytest.fixture(scope="module")
def client(served):
    return httpclient.InferenceServerClient(served["url"], network_timeout=60)


def _inputs(arrays: dict[str, np.ndarray], binary: bool) -> list:
    out = []
    for name, a in arrays.items():
        t = httpclient.InferInput(name, list(a.shape), "BYTES" if a.dtype == object else
                                  "INT64" if a.dtype == np.int64 else "INT32")
        t.set_data_from_numpy(a, binary_data=binary)
        out.append(t)
    return out


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= TOL


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(NAME) and client.is_model_ready(NAME, "1")
    meta = client.get_server_metadata()
    assert meta["name"] == "bertfuse" and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata(NAME)
    assert model == client.get_model_metadata(NAME, "1")
    assert (model["name"], model["versions"]) == (NAME, ["1"])
    assert model["inputs"] == [{"name": r, "datatype": "INT32", "shape": [-1, -1]}
                               for r in ("input_ids", "input_mask", "segment_ids")]
    assert model["outputs"] == [{"name": "sequence_output", "datatype": "FP32",
                                 "shape": [-1, -1, 32]},
                                {"name": "pooled_output", "datatype": "FP32",
                                 "shape": [-1, 32]}]
    for args, words in ((("other",), "no model 'other'"), ((NAME, "2"), "version 1 only")):
        with pytest.raises(InferenceServerException) as err:
            client.get_model_metadata(*args)
        assert err.value.status() == "404" and words in str(err.value)
    assert not client.is_model_ready("other")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_ids_equal_a_direct_session_call(client, session, binary, dtype):
    rng = np.random.default_rng(1)
    for rows, seq in ((1, 5), (3, 17), (MAX_BATCH, POSITIONS)):
        ids = rng.integers(1, VOCAB, (rows, seq)).astype(dtype)
        mask = np.ones((rows, seq), dtype)
        mask[0, seq // 2 + 1:] = 0
        segs = rng.integers(0, 2, (rows, seq)).astype(dtype)
        want = session.run(ids, mask, segs)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in want]
        got = client.infer(NAME, _inputs({"input_ids": ids, "input_mask": mask,
                                          "segment_ids": segs}, binary), outputs=outputs,
                           request_id="r1")
        assert got.get_response()["id"] == "r1"
        assert got.get_response()["model_name"] == NAME
        for name in want:
            _close(got.as_numpy(name), want[name])
    # mask and segments left out (ones, zeros); no outputs named: all, in binary
    ids = np.array([[7, 8, 9]], dtype)
    got = client.infer(NAME, _inputs({"input_ids": ids}, binary))
    assert all("binary_data_size" in o["parameters"] for o in got.get_response()["outputs"])
    _close(got.as_numpy("pooled_output"), session.run(ids)["pooled_output"])


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_text_as_bytes_equals_tokenize_then_session(client, session, tiny, binary):
    texts, pairs = ["what is bert?", "The quick brown fox jumps. \u00e9"], ["a model", "a dog"]
    want = session.run(**WordPiece(tiny["vocab"], model=tiny["model"])(texts, pairs).feeds())
    got = client.infer(NAME, _inputs({"text": np.array(texts, object),
                                      "text_pair": np.array(pairs, object)}, binary),
                       outputs=[httpclient.InferRequestedOutput("pooled_output", binary)])
    assert [o["name"] for o in got.get_response()["outputs"]] == ["pooled_output"]
    _close(got.as_numpy("pooled_output"), want["pooled_output"])
    one = client.infer(NAME, _inputs({"text": np.array([["what is bert?"]], object)}, binary))
    alone = session.run(**WordPiece(tiny["vocab"], model=tiny["model"])("what is bert?")
                        .feeds())
    _close(one.as_numpy("sequence_output"), alone["sequence_output"])


def test_both_protocols_share_the_batches(served, client, session):
    """16 clients, half on /v1/infer and half through tritonclient (binary), 20 requests
    each: every answer right, in fewer model calls than requests."""
    rng = np.random.default_rng(5)
    pool = []
    for _ in range(16):
        ids = rng.integers(1, VOCAB, (int(rng.integers(1, 4)), int(rng.integers(2, 40))))
        pool.append((ids, session.run(ids, outputs=["pooled_output"])["pooled_output"]))
    before = served["served"].stats()

    def one_client(k: int) -> list[str]:
        errors = []
        v1 = Client(served["served"].url)
        v2 = httpclient.InferenceServerClient(served["url"], network_timeout=60)
        for i in range(20):
            ids, want = pool[(k * 7 + i * 5) % len(pool)]
            if k % 2:
                status, body = v1.infer({"input_ids": ids.tolist(), "outputs": "pooled_output"})
                got = decode(body)["pooled_output"] if status == 200 else None
            else:
                got = v2.infer(NAME, _inputs({"input_ids": ids.astype(np.int32)}, True),
                               outputs=[httpclient.InferRequestedOutput("pooled_output")]
                               ).as_numpy("pooled_output")
            if got is None or np.abs(got - want).max() > TOL:
                errors.append(f"client {k} request {i}")
        return errors

    with ThreadPoolExecutor(16) as threads:
        errors = sum(threads.map(one_client, range(16)), [])
    assert not errors, errors[:5]
    after = served["served"].stats()
    requests = after["requests"] - before["requests"]
    assert requests == 16 * 20  # (one replica: stats() sees all of them)
    assert after["batches"] - before["batches"] < requests


def _post(served, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{served['url']}/{path}", data=body,
                                 headers={"Content-Type": "application/json", **(headers or {})},
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _t(name: str, data: list, shape: list | None = None, dtype: str = "INT32", **kw) -> dict:
    return {"name": name, "shape": [1, len(data)] if shape is None else shape,
            "datatype": dtype, "data": data, **kw}


IDS = _t("input_ids", [1, 2, 3])
MALFORMED = [
    (b"{not json", None, 400, "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, None, 400, "nested more than"),
    ({"inputs": []}, None, 400, "non-empty list"),
    ({"inputs": [IDS], "extra": 1}, None, 400, "unknown field 'extra'"),
    ({"inputs": [_t("input_id", [1])]}, None, 400, "no input 'input_id'"),
    ({"inputs": [IDS, IDS]}, None, 400, "given twice"),
    ({"inputs": [_t("input_ids", [1, 2], dtype="FP32")]}, None, 400, "INT32 or INT64"),
    ({"inputs": [_t("input_ids", [1, 2], shape=[2])]}, None, 400, "[rows, seq]"),
    ({"inputs": [_t("input_ids", [1, 2], shape=[1, 3])]}, None, 400, "shape [1, 3] takes 3"),
    ({"inputs": [_t("input_ids", [1.5, 2])]}, None, 400, "integer ids"),
    ({"inputs": [_t("input_ids", [1, True])], "outputs": [
        {"name": "pooled_output", "parameters": {"binary_data": False}}]}, None, 400,
     "integer ids"),
    ({"inputs": [_t("input_ids", [1, VOCAB])]}, None, 400, f"[0, {VOCAB})"),
    ({"inputs": [_t("input_ids", [1] * (POSITIONS + 1))]}, None, 400, "limit of 64"),
    ({"inputs": [_t("input_ids", [1] * (MAX_BATCH + 1), shape=[MAX_BATCH + 1, 1])]}, None,
     400, "--max-batch"),
    ({"inputs": [IDS, _t("input_mask", [1, 1])]}, None, 400, "shape"),
    ({"inputs": [_t("input_mask", [1])]}, None, 400, "input_ids is required"),
    ({"inputs": [IDS], "outputs": [{"name": "logits"}]}, None, 400, "no output 'logits'"),
    ({"inputs": [IDS, _t("text", ["a"], [1], "BYTES")]}, None, 400, "not both"),
    ({"inputs": [_t("text", ["\ud800"], [1], "BYTES")]}, None, 400, "lone surrogate"),
    ({"inputs": [_t("text", ["a", "b"], [2], "BYTES"), _t("text_pair", ["c"], [1], "BYTES")]},
     None, 400, "as many rows"),
    ({"inputs": [{**IDS, "data": None, "parameters": {"binary_data_size": 12}}]}, None, 400,
     "does not fit"),
    ({"inputs": [{k: v for k, v in IDS.items() if k != "data"} | {
        "parameters": {"binary_data_size": 8}}]}, b"\0" * 8, 400, "takes 12"),
    ({"inputs": [{k: v for k, v in IDS.items() if k != "data"} | {
        "parameters": {"binary_data_size": 12}}]}, b"\0" * 16, 400, "after the inputs"),
]


def test_malformed_requests_get_4xx_and_the_service_goes_on(served, client, session):
    path = f"v2/models/{NAME}/infer"
    for payload, blob, status, words in MALFORMED:
        head = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        headers = {} if blob is None else {"Inference-Header-Content-Length": str(len(head)),
                                          "Content-Type": "application/octet-stream"}
        got, body = _post(served, path, head + (blob or b""), headers)
        assert (got, set(body)) == (status, {"error"}), (payload, got, body)
        assert words in body["error"], (words, body)
    for header in ("0", "x", "99999"):
        got, body = _post(served, path, b"{}", {"Inference-Header-Content-Length": header})
        assert got == 400 and "Inference-Header-Content-Length" in body["error"]
    assert _post(served, "v2/models/other/infer", b"{}")[0] == 404
    for media in ("text/plain", "application/x-www-form-urlencoded"):  # a web page's posts
        assert _post(served, path, json.dumps({"inputs": [IDS]}).encode(),
                     {"Content-Type": media})[0] == 415
    assert _post(served, "v2/health/ready", b"{}")[0] == 405
    assert _post(served, "v2/nothing", b"{}")[0] == 405
    got, body = _post(served, path, b" " * (body_limit(MAX_BATCH, POSITIONS) + 1))
    assert got == 413 and "limit" in body["error"]
    ids = np.array([[5, 6, 7]], np.int32)  # still answering, and right
    out = client.infer(NAME, _inputs({"input_ids": ids}, True))
    _close(out.as_numpy("pooled_output"), session.run(ids)["pooled_output"])
