"""runtime/graphs.py: which sessions capture their own CUDA graphs, and what a bucket does when
its capture fails. The capture itself needs a GPU: benchmarks/runtime/own_graph.py runs it
there against ONNX Runtime's graphs.
"""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.runtime import graphs  # noqa: E402
from support.runtime_common import (MAX_SEQ, TOL, make_request, max_diff, new_session,  # noqa: E402
                                    plain_run, plain_session)


@pytest.mark.parametrize("value, want", [("0", False), ("off", False), ("false", False),
                                         ("1", True), ("on", True)])
def test_the_environment_can_keep_ort_graphs(monkeypatch, value, want):
    monkeypatch.setenv(graphs.ENV, value)
    assert graphs.wanted() is want


def test_a_cpu_session_captures_nothing(models):
    s = new_session(models["fp32"])
    s.run(**make_request(np.random.default_rng(3), 3, 9))
    assert s._maker.own_graphs is False
    assert s._buckets and all(not b.graphs for b in s._buckets.values())
    assert s.graph_notes == {}


def test_a_failed_capture_raises_before_running_and_names_the_cuda_error():
    ran: list[int] = []
    # Stream 0 is the legacy stream, which cannot be captured; without a GPU (or libcudart)
    # the first CUDA call fails instead: a GraphError either way, and `run` never runs.
    with pytest.raises(graphs.GraphError, match="CUDA error|not loaded"):
        graphs.OwnGraph.capture(0, lambda: ran.append(1))
    assert ran == []


def test_a_bucket_whose_capture_fails_runs_uncaptured_and_says_why(models, caplog):
    s = new_session(models["fp32"])
    s._maker.own_graphs = True  # as on CUDA; here (no stream to capture) every capture fails
    rng = np.random.default_rng(8)
    plain = plain_session(models["fp32"])
    for batch, seq in ((2, 7), (5, MAX_SEQ)):
        feeds = make_request(rng, batch, seq)
        got = s.run(**feeds)
        assert max_diff(got, plain_run(plain, feeds), feeds["input_mask"]) <= TOL["fp32"]
    assert s._buckets and all(not b.graphs for b in s._buckets.values())
    keys = {(b.batch, b.seq) for b in s._buckets.values()}
    assert {k[:2] for k in s.graph_notes} == keys
    assert all(note.startswith("capture failed: ") for note in s.graph_notes.values())
    assert "runs without a CUDA graph" in caplog.text
