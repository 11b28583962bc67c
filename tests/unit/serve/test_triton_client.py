"""Every call of the stock Open Inference Protocol client (tritonclient.http's
InferenceServerClient) against the real `bertfuse serve`: its own process, the default
ingress (HAProxy), two CPU replicas of a tiny BERT with a vocab, a bearer token and
--cpu-threads 1, started once for the module. Each call gets Triton's answer: health,
metadata, the model config (the message export-triton writes as config.pbtxt), the
repository index, statistics summed over both replicas, infer (JSON and binary, ids and
text, with and without model_version "1"); the calls that serve no purpose here (load and
unload, shared memory, trace and log settings) get the error Triton gives with the feature
off. The start-up line names the /v2 URL and the model."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest

pytest.importorskip("ray")
httpclient = pytest.importorskip("tritonclient.http")

from google.protobuf import json_format, text_format  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from bertfuse.io.triton_config import config_json, model_config  # noqa: E402
from bertfuse.runtime.session import Session  # noqa: E402
from bertfuse.serve.config import check_config  # noqa: E402
from bertfuse.serve.infer_stats import InferStats, merge, triton_stats  # noqa: E402
from bertfuse.runtime.request_checks import ConfigError  # noqa: E402
from bertfuse.text import WordPiece  # noqa: E402
from hostile.test_serve_network import TOKEN, Server, model  # noqa: E402
from unit.export.test_triton import PB2  # noqa: E402
from unit.serve.test_oip import _inputs  # noqa: E402
from unit.serve.test_serve import free_port  # noqa: E402

__all__ = ["model"]  # the tiny model, its vocab and token (a fixture shared with hostile/)
NAME = "bert"
AUTH = {"Authorization": f"Bearer {TOKEN}"}  # copied per call: tritonclient adds to it
FLAGS = ("--token-file", "--replicas", "2", "--cpus-per-replica", "0.5", "--cpu-threads", "1",
         "--name", NAME, "--max-wait-ms", "2")


@pytest.fixture(scope="module")
def server(model):
    s = Server(model, free_port(), FLAGS[0], model["token"], *FLAGS[1:])
    try:
        yield s
    finally:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
            try:
                s.proc.wait(90)
            except Exception:
                s.stop()


@pytest.fixture(scope="module")
def client(server):
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=60)


@pytest.fixture(scope="module")
def session(model):
    return Session(model["model"], device="cpu", max_batch=4)


def _raises(call, status: str, words: str) -> None:
    with pytest.raises(InferenceServerException) as err:
        call()
    assert err.value.status() == status and words in str(err.value), (err.value.status(),
                                                                       str(err.value))


def _get(server, path: str, auth: bool = True) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}",
                                 headers={**AUTH} if auth else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_startup_line_names_the_v2_url_and_the_model(server):
    info = server.info
    assert (info["v2"], info["model"]) == (info["url"] + "v2", NAME)
    assert info["v2_model"] == f"{info['url']}v2/models/{NAME}"


def test_health_and_metadata(client):
    assert client.is_server_live(headers={**AUTH}) and client.is_server_ready(headers={**AUTH})
    assert client.is_model_ready(NAME, headers={**AUTH})
    assert client.is_model_ready(NAME, "1", headers={**AUTH})
    assert not client.is_model_ready(NAME, "2", headers={**AUTH})
    meta = client.get_server_metadata(headers={**AUTH})
    assert meta["name"] == "bertfuse"
    assert {"binary_tensor_data", "model_repository", "model_configuration",
            "statistics"} <= set(meta["extensions"])
    model = client.get_model_metadata(NAME, headers={**AUTH})
    assert model == client.get_model_metadata(NAME, "1", headers={**AUTH})
    assert (model["name"], model["versions"], model["platform"]) == \
        (NAME, ["1"], "onnxruntime_onnx")
    assert [o["name"] for o in model["outputs"]] == ["pooled_output"]


def test_model_config_is_what_export_triton_writes(client, model, tmp_path, capsys):
    """GET /v2/models/NAME/config: Triton's ModelConfig (tritonclient's schema reads it)
    for this deployment, equal to the config.pbtxt export-triton writes with its options."""
    from bertfuse.cli import main

    got = client.get_model_config(NAME, headers={**AUTH})
    assert got == client.get_model_config(NAME, "1", headers={**AUTH})
    cfg = json_format.ParseDict(got, PB2.ModelConfig())  # an unknown field would raise
    assert (cfg.name, cfg.platform, cfg.max_batch_size) == (NAME, "onnxruntime_onnx", 4)
    assert [(t.name, PB2.DataType.Name(t.data_type), list(t.dims)) for t in cfg.input] == \
        [(n, "TYPE_INT32", [-1]) for n in ("input_ids", "input_mask", "segment_ids")]
    assert [(t.name, PB2.DataType.Name(t.data_type), list(t.dims)) for t in cfg.output] == \
        [("pooled_output", "TYPE_FP32", [32])]
    assert [(g.kind, g.count) for g in cfg.instance_group] == \
        [(PB2.ModelInstanceGroup.KIND_CPU, 2)]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000
    assert cfg.parameters["intra_op_thread_count"].string_value == "1"
    assert got["input"][0]["dims"] == [-1]  # numbers, as Triton gives them
    assert main(["export-triton", model["model"], "-o", str(tmp_path), "--name", NAME,
                 "--max-batch", "4", "--instances", "2", "--kind", "cpu",
                 "--dynamic-batching-delay-us", "2000", "--intra-op-threads", "1"]) == 0
    capsys.readouterr()
    written = text_format.Parse((tmp_path / NAME / "config.pbtxt").read_text(),
                                PB2.ModelConfig())
    del written.output[0]  # sequence_output: not served (--outputs pooled_output)
    assert json_format.MessageToDict(written, preserving_proto_field_name=True) == \
        json_format.MessageToDict(cfg, preserving_proto_field_name=True)


def test_repository_index(client):
    assert client.get_model_repository_index(headers={**AUTH}) == \
        [{"name": NAME, "version": "1", "state": "READY", "reason": ""}]


@pytest.mark.parametrize("version", ["", "1"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_equals_a_direct_session_call(client, session, model, binary, version):
    rng = np.random.default_rng(2)
    ids = rng.integers(1, 300, (3, 9)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    want = session.run(ids, mask, np.zeros_like(ids))["pooled_output"]
    got = client.infer(NAME, _inputs({"input_ids": ids, "input_mask": mask}, binary),
                       model_version=version, request_id="r7", headers={**AUTH},
                       outputs=[httpclient.InferRequestedOutput("pooled_output", binary)])
    assert got.get_response()["id"] == "r7" and got.get_response()["model_version"] == "1"
    assert np.abs(got.as_numpy("pooled_output") - want).max() <= 1e-4
    texts = np.array(["what is bert?", "a dog"], object)
    want = session.run(**WordPiece(model["vocab"], model=model["model"])(list(texts)).feeds())
    got = client.infer(NAME, _inputs({"text": texts}, binary), model_version=version,
                       headers={**AUTH})
    assert np.abs(got.as_numpy("pooled_output") - want["pooled_output"]).max() <= 1e-4


def test_statistics_count_every_request_of_both_replicas(client, server):
    """Triton's statistics extension: 6 requests of 2 rows through tritonclient, one through
    /v1/infer, one refused (400): counted by whichever replica answered, summed."""
    time.sleep(1.0)  # the earlier tests' counts reach Ray's store within 0.2 s (app.py)
    before = client.get_inference_statistics(NAME, headers={**AUTH})["model_stats"][0]
    start_ms = int(time.time() * 1000)
    ids = np.ones((2, 6), np.int32)
    for _ in range(6):
        client.infer(NAME, _inputs({"input_ids": ids}, True), headers={**AUTH})
    body = json.dumps({"text": "what is bert"}).encode()  # one row
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/infer", body,
                                 {**AUTH, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    _raises(lambda: client.infer(NAME, _inputs({"input_idz": ids}, False), headers={**AUTH}),
            "400", "no input 'input_idz'")
    time.sleep(1.0)  # every replica's counts reach Ray's store within 0.2 s (app.py)
    stats = client.get_inference_statistics(NAME, headers={**AUTH})
    assert stats == client.get_inference_statistics(NAME, "1", headers={**AUTH})
    assert stats == client.get_inference_statistics(headers={**AUTH})  # every model's
    after = stats["model_stats"][0]
    assert (after["name"], after["version"]) == (NAME, "1")
    delta = {k: after[k] - before[k] for k in ("inference_count", "execution_count")}
    stage = {k: {f: v[f] - before["inference_stats"][k][f] for f in ("count", "ns")}
             for k, v in after["inference_stats"].items()}
    assert delta["inference_count"] == 6 * 2 + 1
    assert 1 <= delta["execution_count"] <= 7
    assert stage["success"]["count"] == 7 and stage["fail"]["count"] == 1
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stage[k]["count"] == 7 and stage[k]["ns"] > 0, (k, stage)
    assert stage["success"]["ns"] >= stage["compute_infer"]["ns"] > 0
    assert stage["cache_hit"] == stage["cache_miss"] == {"count": 0, "ns": 0}
    assert after["last_inference"] >= start_ms
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert sum(n * c for n, c in sizes.items()) == after["inference_count"]  # every row
    # each replica answers /stats with its own counts: both served, and the sum saw both
    seen = {}
    for _ in range(30):
        one = _get(server, "/stats")[1]
        seen[one["replica"]] = one["requests"]
        assert one["intra_op_threads"] == 1  # --cpu-threads reached ONNX Runtime
        if len(seen) == 2:
            break
    assert len(seen) == 2 and all(seen.values()), seen


def test_triton_only_calls_get_tritons_feature_off_errors(client):
    for call in (lambda: client.load_model(NAME, headers={**AUTH}),
                 lambda: client.unload_model(NAME, headers={**AUTH})):
        _raises(call, "501", "explicit model load / unload is not allowed")
    for kind in ("system", "cuda"):
        status = getattr(client, f"get_{kind}_shared_memory_status")
        assert status(headers={**AUTH}) == []
        _raises(lambda: status("r0", headers={**AUTH}), "404", "Unable to find")
        register = getattr(client, f"register_{kind}_shared_memory")
        args = ("r0", "/r0", 64) if kind == "system" else ("r0", "AAAA", 0, 64)
        _raises(lambda: register(*args, headers={**AUTH}), "501",
                "shared memory is not supported by bertfuse serve")
        getattr(client, f"unregister_{kind}_shared_memory")(headers={**AUTH})  # nothing there
    for call in (lambda: client.get_trace_settings(headers={**AUTH}),
                 lambda: client.get_trace_settings(NAME, headers={**AUTH}),
                 lambda: client.update_trace_settings(settings={"trace_level": ["OFF"]},
                                                      headers={**AUTH}),
                 lambda: client.get_log_settings(headers={**AUTH}),
                 lambda: client.update_log_settings({"log_info": False}, headers={**AUTH})):
        _raises(call, "501", "is not supported by bertfuse serve")


def test_every_v2_route_but_health_needs_the_token(client, server):
    for call in (lambda: client.get_model_config(NAME),
                 lambda: client.get_inference_statistics(NAME),
                 lambda: client.get_model_repository_index(),
                 lambda: client.get_model_metadata(NAME, "1")):
        _raises(call, "401", "")
    assert client.is_server_live() and client.is_server_ready()
    assert _get(server, f"/v2/models/{NAME}/config", auth=False)[0] == 401


# -- no server ---------------------------------------------------------------------------------


def test_cpu_threads_is_checked_before_ray(model):
    for bad in (0, 2.5, True, 5000):
        with pytest.raises(ConfigError, match="cpu_threads must be"):
            check_config(model["model"], cpu_threads=bad)
    assert check_config(model["model"], cpu_threads=3).cpu_threads == 3


def test_statistics_merge_and_triton_form():
    a, b = InferStats(), InferStats()
    a.success(2, 0.0, 0.001, (0.002, 0.005), 0.006)
    b.success(1, 0.0, 0.001, (0.001, 0.002), 0.003)
    b.fail(0.0)
    a.execution(2, 1e-4, 3e-3, 1e-4)
    b.execution(2, 1e-4, 1e-3, 1e-4)
    got = triton_stats("m", "1", merge([a.snapshot(), b.snapshot()]))
    assert (got["inference_count"], got["execution_count"]) == (3, 2)
    assert got["inference_stats"]["success"]["count"] == 2
    assert got["inference_stats"]["compute_infer"] == {"count": 2, "ns": 4_000_000}
    assert got["inference_stats"]["fail"]["count"] == 1
    assert got["batch_stats"] == [{"batch_size": 2, "compute_input": {"count": 2, "ns": 200_000},
                                   "compute_infer": {"count": 2, "ns": 4_000_000},
                                   "compute_output": {"count": 2, "ns": 200_000}}]


def test_served_config_is_the_builders(model):
    """The deployment's config is io/triton_config's message for its options."""
    from bertfuse.serve.config import resolve
    from bertfuse.serve.oip import model_config_json
    from bertfuse.serve.replica_config import replica_config

    proto = onnx.load(model["model"])
    cfg = resolve(check_config(model["model"], name="x", max_batch=8, max_wait_ms=0.5,
                               outputs=["pooled_output"]), "proxy")
    assert model_config_json(proto, replica_config(cfg, "cuda", 3, run="r")) == \
        config_json(model_config(proto, "x", 8, 3, "gpu", 500, None, outputs=["pooled_output"]))
