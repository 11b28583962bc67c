"""SessionPool (runtime/pool.py): replicas on worker threads, nested calls, closing.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.errors import BertfuseError  # noqa: E402
from bertfuse.runtime.device import GATE  # noqa: E402
from bertfuse.runtime.pool import NestedCallError, SessionPool  # noqa: E402
from bertfuse.runtime.request_checks import ClosedError, ConfigError, RequestError  # noqa: E402
from bertfuse.runtime.session import Session  # noqa: E402
from support.runtime_common import (OUTPUTS, VOCAB, _assert_same, _run_threads,  # noqa: E402
                            _thread_requests, make_request, new_session)


def test_pool_replicas_match_one_session(models, sessions):
    """SessionPool: 4 threads on 2 replicas give one session's results; every bucket a
    replica makes under load is made while no other request runs (the capture gate)."""
    from bertfuse.runtime.device import GATE
    from bertfuse.runtime.pool import SessionPool

    made: list[tuple[int, bool]] = []
    ran_on: set[str] = set()

    def make() -> Session:
        s = new_session(models["fp32"], right_padded="keylen")
        inner_bucket, inner_run = s._new_bucket, s.run

        def watched(batch: int, seq: int):
            made.append((GATE._running, GATE._capturing))
            return inner_bucket(batch, seq)

        def run(*args, **kwargs):
            ran_on.add(threading.current_thread().name)
            return inner_run(*args, **kwargs)

        s._new_bucket, s.run = watched, run
        return s

    with SessionPool(make, replicas=2) as pool:
        reqs = _thread_requests(18)
        want = [{n: v.copy() for n, v in sessions["fp32"].run(**f).items()} for f in reqs]
        _assert_same(_run_threads(pool, reqs, copy_results=False), want)
    assert len(made) >= 2 and all(m == (0, True) for m in made), made
    assert ran_on == {"bertfuse-replica-0", "bertfuse-replica-1"}  # the workers, both of them


def test_pool_device_outputs_only_inside_the_replicas_turn(models):
    from bertfuse.runtime.pool import SessionPool

    feeds = make_request(np.random.default_rng(3), 2, 5)
    with SessionPool(lambda: new_session(models["fp32"]), replicas=1) as pool:
        with pytest.raises(ValueError, match="outlive"):
            pool.run(**feeds, to_host=False)
        shape = pool.call(lambda s: s.run(**feeds, to_host=False)["sequence_output"].shape())
        assert shape[:2] == list(new_session(models["fp32"]).bucket_for(2, 5))
        bad = dict(feeds, input_ids=feeds["input_ids"] + VOCAB)  # refused on the worker ...
        with pytest.raises(RequestError, match="input_ids values"):
            pool.run(**bad)
        assert set(pool.run(**feeds)) == set(OUTPUTS)  # ... which goes on serving
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(**feeds)
    with pytest.raises(ValueError, match="at least 1"):
        SessionPool(lambda: new_session(models["fp32"]), replicas=0)
    with pytest.raises(BertfuseError, match="must be 'auto'"):  # make() fails on its worker
        SessionPool(lambda: new_session(models["fp32"], right_padded="left"), replicas=2)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_pool_job_calling_its_own_pool_is_refused(replicas, tiny_onnx):
    feeds = make_request(np.random.default_rng(33), 2, 5)
    with SessionPool(lambda: new_session(tiny_onnx["fp32"]), replicas=replicas) as pool:
        for nested in (lambda s: pool.run(**feeds), lambda s: pool.call(lambda r: 1),
                       lambda s: pool.submit(lambda r: 1)):
            future = pool.submit(nested)
            with pytest.raises(NestedCallError, match="job called a SessionPool"):
                future.result(timeout=60)  # a deadlock would time out here instead
        assert issubclass(NestedCallError, BertfuseError)
        assert set(pool.run(**feeds)) == set(OUTPUTS)  # it goes on serving
        # Another pool neither: the job would wait inside the capture gate's running count,
        # and the other pool's first request in a new bucket waits for that count to drop.
        with SessionPool(lambda: new_session(tiny_onnx["fp32"]), replicas=1) as other:
            future = pool.submit(lambda s: other.run(**feeds))
            with pytest.raises(NestedCallError):
                future.result(timeout=60)
            assert set(other.run(**feeds)) == set(OUTPUTS)


def test_pool_close_closes_its_replicas(tiny_onnx):
    feeds = make_request(np.random.default_rng(38), 2, 5)
    with SessionPool(lambda: new_session(tiny_onnx["fp32"]), replicas=2) as pool:
        assert set(pool.run(**feeds)) == set(OUTPUTS)
        replicas = list(pool.replicas)
    assert all(r._closed for r in replicas)
    with pytest.raises(ClosedError):
        replicas[0].run(**feeds)
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(**feeds)
    pool.close()  # idempotent


def test_pool_closes_a_replica_whose_prepare_failed(tiny_onnx):
    made: list[Session] = []

    def make() -> Session:
        made.append(new_session(tiny_onnx["fp32"]))
        return made[-1]

    with pytest.raises(ConfigError, match="warmup batch"):
        SessionPool(make, replicas=2, prepare=lambda s: s.warmup([(0, 1)]))
    assert len(made) == 2 and all(s._closed for s in made)


def test_pool_closed_is_public_and_follows_close(tmp_path):
    """`closed` (read-only) is what serve's readiness and health checks read. (A graph
    built without TensorFlow: this needs no converted model.)"""
    from support.builders.onnx_graphs import bert

    path = tmp_path / "tiny.onnx"
    onnx.save(bert(np.random.default_rng(0), layers=1, hidden=16, heads=2, inter=32, vocab=50,
                   positions=128), path)
    pool = SessionPool(lambda: new_session(str(path)), replicas=1)
    assert pool.closed is False
    pool.close()
    assert pool.closed is True
    with pytest.raises(AttributeError):
        pool.closed = False  # type: ignore[misc]
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(lambda s: None)
