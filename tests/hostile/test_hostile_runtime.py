"""Hostile input to the runtime API on the CPU EP (bertfuse.runtime: Session, SessionPool):
bad requests, constructor and warm-up arguments raise one clear error before any work, a pool
job calling its pool raises instead of deadlocking, closed sessions and pools refuse calls.
The model: conftest's ckpt_erf converted once (convert_cached)."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bertfuse.errors import BertfuseError
from bertfuse.runtime.pool import NestedCallError, SessionPool
from bertfuse.runtime.request_checks import ConfigError, RequestError
from bertfuse.runtime import ClosedError, Session
from support.hostile_cases import (BAD_FILES, CONSTRUCTORS, IDS, LIBRARY, MASK, POOL_REPLICAS,
                           REQUESTS, SEGS, WARMUPS)
from support.hostile_workspace import Workspace, assert_nothing_left, derive_models, digest


@pytest.fixture(scope="module")
def hostile_lib(tmp_path_factory, ckpt_erf, convert_cached) -> dict[str, Path]:
    fused = convert_cached(ckpt_erf)
    assert fused.exit_code == 0
    lib = tmp_path_factory.mktemp("hostile_runtime_lib")
    p = {name: lib / file for name, file in LIBRARY.items()}
    shutil.copy(fused.onnx_path, p["fused"])
    derive_models(p["fused"], p)
    return p


@pytest.fixture
def ws(tmp_path, hostile_lib, monkeypatch) -> Workspace:
    root = tmp_path / "w"
    root.mkdir()
    monkeypatch.chdir(root)
    return Workspace(root, hostile_lib)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


SMALL = {"max_batch": 4, "max_seq": 16, "batch_buckets": (1, 2, 4), "seq_buckets": (8, 16),
         "device": "cpu"}


@pytest.fixture(scope="module")
def served(hostile_lib):
    """One CPU session and its answer to the valid request."""
    s = Session(str(hostile_lib["fused"]), **SMALL)
    good = s.run(IDS, MASK, SEGS)
    yield s, good
    s.close()


def _one_line_error(exc: BaseException, needle: str) -> None:
    text = str(exc)
    assert "\n" not in text and needle in text, text


@pytest.mark.parametrize("kwargs, needle", [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS])
def test_runtime_refuses_bad_request(kwargs, needle, served):
    session, good = served
    sent = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in kwargs.items()}
    with pytest.raises(RequestError) as info:
        session.run(**kwargs)
    assert isinstance(info.value, BertfuseError) and isinstance(info.value, ValueError)
    _one_line_error(info.value, needle)
    for k, v in kwargs.items():  # the caller's arrays are not rewritten
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, sent[k])
    again = session.run(IDS, MASK, SEGS)  # and the session serves on, unchanged
    for name, value in good.items():
        np.testing.assert_array_equal(again[name], value)


def _model_arg(kind: str | None, ws: Workspace):
    if kind is None:
        return str(ws.path("fused"))
    if kind in ("none", "bytes"):
        return None if kind == "none" else b"\x08\x01"
    if kind in ("skel", "raw"):
        return str(ws.path(kind))
    setup, token, _ = BAD_FILES[kind]
    ws.setup(setup)
    return ws.fmt(token)


@pytest.mark.parametrize("kind, kwargs, needle", [c[1:] for c in CONSTRUCTORS],
                         ids=[c[0] for c in CONSTRUCTORS])
def test_runtime_refuses_bad_constructor(kind, kwargs, needle, ws, private_tmp):
    model = _model_arg(kind, ws)
    before = digest(ws.root)
    with pytest.raises(BertfuseError) as info:
        Session(model, **{**SMALL, **kwargs})
    _one_line_error(info.value, needle)
    assert_nothing_left(before, digest(ws.root), set(), private_tmp)


@pytest.mark.parametrize("buckets, needle", [w[1:] for w in WARMUPS], ids=[w[0] for w in WARMUPS])
def test_runtime_refuses_bad_warmup(buckets, needle, hostile_lib):
    with Session(str(hostile_lib["fused"]), **SMALL) as s:
        with pytest.raises(ConfigError) as info:
            s.warmup(buckets)
        _one_line_error(info.value, needle)
        assert not s._buckets  # nothing was made for a refused list


@pytest.mark.parametrize("replicas", POOL_REPLICAS, ids=[repr(r) for r in POOL_REPLICAS])
def test_pool_refuses_bad_replicas(replicas):
    threads = threading.active_count()
    with pytest.raises(ConfigError, match="replicas must be"):
        SessionPool(lambda: pytest.fail("a replica was built"), replicas=replicas)
    assert threading.active_count() == threads


class _Boom(ValueError):
    pass


@pytest.mark.parametrize("where", ["make", "prepare"])
def test_pool_build_failure_is_raised_and_stops_workers(where, hostile_lib):
    def boom(*_):
        raise _Boom(f"{where} failed")

    make = boom if where == "make" else (lambda: Session(str(hostile_lib["fused"]), **SMALL))
    threads = threading.active_count()
    with pytest.raises(_Boom, match=f"{where} failed"):
        SessionPool(make, replicas=2, prepare=boom if where == "prepare" else None)
    deadline = time.monotonic() + 30
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == threads  # no worker left waiting


@pytest.mark.parametrize("nested", ["run", "call", "submit"])
def test_pool_nested_call_raises_instead_of_deadlock(nested, hostile_lib):
    with SessionPool(lambda: Session(str(hostile_lib["fused"]), **SMALL), replicas=1) as pool:
        inner = {"run": lambda s: pool.run(IDS, MASK, SEGS),
                 "call": lambda s: pool.call(lambda r: 1),
                 "submit": lambda s: pool.submit(lambda r: 1)}[nested]
        with pytest.raises(NestedCallError, match="SessionPool job called"):
            pool.submit(inner).result(timeout=60)
        assert set(pool.run(IDS, MASK, SEGS)) == {"sequence_output", "pooled_output"}


def test_pool_device_outputs_refused_and_closed_pool(hostile_lib):
    pool = SessionPool(lambda: Session(str(hostile_lib["fused"]), **SMALL), replicas=1)
    with pytest.raises(ValueError, match="pool.call"):
        pool.run(IDS, MASK, SEGS, to_host=False)
    replica = pool.replicas[0]
    pool.close()
    pool.close()
    assert replica._closed
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(IDS, MASK, SEGS)


@pytest.mark.parametrize("call", ["run", "warmup", "warmup_list", "replay_call"])
def test_closed_session_refuses_calls(call, hostile_lib):
    with Session(str(hostile_lib["fused"]), **SMALL) as s:
        s.run(IDS, MASK, SEGS)
    s.close()  # idempotent after the with block closed it
    fn = {"run": lambda: s.run(IDS, MASK, SEGS), "warmup": lambda: s.warmup(),
          "warmup_list": lambda: s.warmup([(1, 8)]), "replay_call": lambda: s.replay_call(MASK)}
    with pytest.raises(ClosedError, match="closed"):
        fn[call]()
