"""What a Serve replica is built from (serve/replica_config.py): a typed, frozen ReplicaConfig
made from a checked ServeConfig and placement's choices, checked against its annotations when
made, unchanged through pickle and Ray's cloudpickle (how Serve ships it to a replica's
worker); the replica refuses anything else, a dict included."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import onnx
import pytest

ray = pytest.importorskip("ray")

from bertfuse.serve.config import check_config, resolve  # noqa: E402
from support.builders.onnx_graphs import bert  # noqa: E402


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """A ServeConfig as deploy() has it before placement: checked and resolved."""
    path = tmp_path_factory.mktemp("replica") / "tiny.onnx"
    onnx.save(bert(np.random.default_rng(0), layers=1, hidden=16, heads=2, inter=32, vocab=50,
                   positions=16), path)
    return resolve(check_config(path, max_batch=8, max_wait_ms=5, batch_buckets="4,2",
                                outputs=["pooled_output"], kernels="ort", cpu_threads=2),
                   "proxy")


@pytest.fixture(scope="module")
def placed(checked):
    """(the ServeConfig, its ReplicaConfig as deploy() makes it: placed on 3 CPU replicas)."""
    from bertfuse.serve.replica_config import replica_config

    return checked, replica_config(checked, "cpu", 3, run="0123abcd")


def test_replica_config_is_the_checked_config_placed(placed):
    cfg, config = placed
    assert dataclasses.asdict(config) == {
        "model": cfg.model, "name": "bertfuse", "host": "127.0.0.1", "device": "cpu",
        "replicas": 3, "max_batch": 8, "max_seq": 16, "max_wait_ms": 5,
        "batch_buckets": (2, 4), "outputs": ("pooled_output",), "vocab": None,
        "lower_case": None, "kernels": "ort", "cpu_threads": 2, "warmup": True,
        "ingress": "proxy", "token_sha256": None, "run": "0123abcd",
        "max_ongoing_requests": 32, "gpus": None}  # 4 x max_batch, at least 16
    assert type(config.max_wait_ms) is int  # as given: /stats reports 5, not 5.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_batch = 9  # type: ignore[misc]


def test_replica_config_round_trips_through_pickle_and_cloudpickle(placed):
    from ray import cloudpickle

    from bertfuse.serve.replica_config import ReplicaConfig

    _, config = placed
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, pickle.loads)):
        data = dumps(config)
        assert b"bertfuse.serve.replica_config" in data  # by reference: workers import it
        back = loads(data)
        assert type(back) is ReplicaConfig and back == config
        assert dataclasses.asdict(back) == dataclasses.asdict(config)


@pytest.mark.parametrize("change,error,words", [
    ({"max_batch": "8"}, TypeError, "ReplicaConfig.max_batch must be int, not '8'"),
    ({"max_batch": True}, TypeError, "ReplicaConfig.max_batch must be int"),
    ({"outputs": ["pooled_output"]}, TypeError, "ReplicaConfig.outputs must be tuple[str, ...]"),
    ({"batch_buckets": (2, 4.0)}, TypeError, "ReplicaConfig.batch_buckets"),
    ({"token_sha256": b"ab"}, TypeError, "ReplicaConfig.token_sha256 must be str | None"),
    ({"device": "auto"}, ValueError, "placement resolves 'auto'"),
    ({"ingress": "auto"}, ValueError, "config.resolve decides 'auto'"),
    ({"max_seq": 0}, ValueError, "max_seq of 1 or more"),
    ({"run": ""}, ValueError, "a run key"),
])
def test_replica_config_is_checked_when_made(placed, change, error, words):
    _, config = placed
    with pytest.raises(error, match=words.replace("[", r"\[").replace("|", r"\|")):
        dataclasses.replace(config, **change)


def test_the_replica_refuses_a_dict(checked):
    """The dict deploy() once built (ServeConfig.to_spec(): its fields, placed) is refused
    with the type it wants, before any model is read."""
    from bertfuse.serve.app import BertfuseReplica

    as_dict = {**dataclasses.asdict(checked), "device": "cpu", "replicas": 1}
    with pytest.raises(TypeError, match=r"BertfuseReplica takes a ReplicaConfig "
                                        r"\(bertfuse.serve.replica_config\), not dict"):
        BertfuseReplica.func_or_class(as_dict)


def test_token_sha256_is_filled_by_check_config_not_an_argument(checked):
    with pytest.raises(Exception, match="unknown argument 'token_sha256'; arguments are "
                                        "replicas, max_batch"):
        check_config(checked.model, token_sha256="0" * 64)
