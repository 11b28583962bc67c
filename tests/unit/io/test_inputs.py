"""bertfuse/io/inputs.py: every random or probe input, checked against what its callers rely on."""

from __future__ import annotations

import numpy as np

from bertfuse.io import inputs


def test_random_inputs_padding_kinds():
    for pad_anywhere in (False, True):
        feeds = inputs.random_inputs(7, 12, 50, 2, seed=3, pad_anywhere=pad_anywhere)
        ids, mask, segs = feeds["input_ids"], feeds["input_mask"], feeds["segment_ids"]
        assert all(v.shape == (7, 12) and v.dtype == np.int32 for v in feeds.values())
        assert mask[0].all() and mask.sum(1).min() >= 1  # row 0 full, no empty row
        assert (ids[mask == 0] == 0).all() and ids[mask == 1].min() >= 1 and ids.max() < 50
        assert segs.max() <= 1
        starts_padded = (mask[:, 0] == 0).any()
        assert starts_padded == pad_anywhere  # left padding only with pad_anywhere
    again = inputs.random_inputs(7, 12, 50, 2, seed=3, pad_anywhere=True)
    assert all(np.array_equal(again[k], feeds[k]) for k in feeds)


def test_probe_mask_and_feeds():
    m = inputs.probe_mask()
    assert m.shape == (inputs.PROBE_BATCH, inputs.PROBE_SEQ) and m.sum(1).min() >= 1
    assert m[0, -1] == 0 and m[1, 2] == 0 and m[2, 0] == 0  # end, middle, start

    import onnx_graphsurgeon as gs

    graph = gs.Graph(inputs=[gs.Variable("ids", np.int64, ["b", "s"]),
                             gs.Variable("x", np.float32, [4]), gs.Variable("y")])
    feeds = inputs.probe_feeds(graph, fill=2)
    assert feeds["ids"].shape == (3, 7) and feeds["ids"].dtype == np.int64
    assert feeds["x"].shape == (4,) and (feeds["ids"] == 2).all()
    assert feeds["y"].shape == (3, 7) and feeds["y"].dtype == np.int32


def test_runtime_and_bench_requests():
    probe = inputs.shape_probe(["input_ids", "input_mask"], 2, 3)
    assert probe["input_mask"].all() and not probe["input_ids"].any()
    ids, lengths = inputs.variant_probe(4, 16, 1000)
    assert lengths[1] == 16 and lengths.min() >= 1 and ids.max() < 1000
    assert np.array_equal(inputs.variant_probe(4, 16, 1000)[0], ids)  # seeded by the shape
    ids, mask, segs = inputs.lengths_request([3, 1, 5], 5, 100)
    assert mask.sum(1).tolist() == [3, 1, 5] and (ids[mask == 0] == 0).all()
    assert (segs[:, :2] == 0).all() and (segs[:, 2:] == 1).all()
    r = inputs.padded_request(6, 10, 100, seed=2)
    assert (r["input_mask"].sum(1) >= 5).all() and r["input_ids"].min() >= 1
