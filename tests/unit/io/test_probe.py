"""probe.py: the probe inputs every numeric match evaluates on."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from bertfuse.io.inputs import PROBE_BATCH, PROBE_SEQ, probe_feeds, probe_mask
from support.builders.onnx_graphs import G


def test_probe_feeds_follow_the_graph_inputs():
    g = G("inputs")
    g.input("input_ids", np.int64, ["B", "S"])
    g.input("fixed_seq", np.int32, ["B", 128])
    g.input("hidden", np.float32, ["B", "S", 16])
    graph = gs.import_onnx(g.model())
    feeds = probe_feeds(graph, fill=3)
    assert feeds["input_ids"].shape == (PROBE_BATCH, PROBE_SEQ)
    assert feeds["input_ids"].dtype == np.int64 and (feeds["input_ids"] == 3).all()
    assert feeds["fixed_seq"].shape == (PROBE_BATCH, 128)  # a static dim is kept
    assert feeds["hidden"].shape == (PROBE_BATCH, PROBE_SEQ, 16)
    assert probe_feeds(graph, batch=2, seq=5)["input_ids"].shape == (2, 5)


@pytest.mark.parametrize("seed", [0, 7, 11, 123])
@pytest.mark.parametrize("batch,seq", [(3, 7), (4, 6), (5, 9)])
def test_probe_mask_pads_end_middle_and_start(seed, batch, seq):
    m = probe_mask(batch, seq, seed=seed)
    assert m.shape == (batch, seq) and set(np.unique(m)) <= {0, 1}
    assert (m[0, -2:] == 0).all()                      # end
    assert (m[1, 2:4] == 0).all()                      # middle
    assert m[2, 0] == 0                                # start, key 0 itself
    assert (m.sum(axis=1) >= 1).all()                  # every row attends somewhere
