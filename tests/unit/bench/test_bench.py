"""The GPU benchmark's host side (bertfuse/bench/): requests, parity, tables, timing, and
the subcommand's refusals.
"""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse import cli  # noqa: E402
from bertfuse.bench import padded as bench  # noqa: E402
from bertfuse.bench.timing import compare, time_interleaved  # noqa: E402
from bertfuse.io.inputs import padded_request  # noqa: E402
from bertfuse.runtime.variants import mask_mode  # noqa: E402
from support.runtime_common import VOCAB, padded_mask  # noqa: E402


def test_bench_request_shapes_and_padding():
    for batch, seq in ((1, 2), (20, 64), (32, 128), (3, 7), (16, 1)):
        r = padded_request(batch, seq, VOCAB, seed=4)
        assert set(r) == {"input_ids", "input_mask", "segment_ids"}
        for v in r.values():
            assert v.shape == (batch, seq) and v.dtype == np.int32
        ids, mask, seg = r["input_ids"], r["input_mask"], r["segment_ids"]
        assert ids.min() >= 1 and ids.max() < VOCAB
        assert mask_mode(mask) in ("keylen", "nomask")  # right padding only
        lengths = mask.sum(1)
        assert (lengths >= seq // 2).all() and (lengths >= 1).all()
        assert (seg[:, : seq // 2] == 0).all() and (seg[:, seq // 2:] == 1).all()
        again = padded_request(batch, seq, VOCAB, seed=4)
        assert all(np.array_equal(r[k], again[k]) for k in r)
    a, b = padded_request(8, 64, VOCAB, seed=1), padded_request(8, 64, VOCAB, seed=2)
    assert not np.array_equal(a["input_ids"], b["input_ids"])
    padded = padded_request(32, 128, VOCAB, seed=1)["input_mask"]
    assert (padded == 0).any()  # the benchmark's rows really are padded


def test_bench_compare_only_counts_valid_positions():
    rng = np.random.default_rng(19)
    mask = padded_mask(rng, 4, 10, ("full", "right"))
    ref = {"sequence_output": rng.standard_normal((4, 10, 8)),
           "pooled_output": rng.standard_normal((4, 8))}
    outs = {k: v.astype(np.float32).astype(np.float64) for k, v in ref.items()}
    outs["sequence_output"][mask == 0] = 1e6  # garbage in the padding is not a difference
    outs["extra"] = np.zeros(3)  # an output with no reference is ignored
    worst, mean = compare(outs, ref, mask)
    assert worst < 1e-6 and mean < 1e-6
    r, c = np.argwhere(mask == 1)[-1]
    outs["sequence_output"][r, c, 3] += 0.5
    worst, _ = compare(outs, ref, mask)
    assert worst == pytest.approx(0.5, abs=1e-6)
    outs["sequence_output"][r, c, 3] -= 0.5
    outs["pooled_output"][3, 0] += 0.25  # 2-D outputs count everywhere
    worst, mean = compare(outs, ref, mask)
    assert worst == pytest.approx(0.25, abs=1e-6)
    assert mean == pytest.approx((0.25 / 32) / 2, rel=1e-3)
    del outs["sequence_output"]  # a missing output is skipped, not an error
    assert compare(outs, ref, mask)[0] == pytest.approx(0.25, abs=1e-6)


def test_bench_format_table():
    R = bench.Result
    results = [R("base b1 s128", "ORT raw fp32", 400.0, 500.0, 2500.0, 0.0, 0.0),
               R("base b1 s128", "bertfuse fp16 plain session", 150.0, 170.0, 6666.7, 1e-3,
                 1e-4, note="memcpy nodes: 0"),
               R("base b1 s128", "bertfuse fp16 runtime (arena + CUDA graph)", 100.0, 120.0,
                 10000.0, 2e-3, 2e-4, note="CUDA graph"),
               R("large b1 s128", "ORT bert_tf fp16", note="failed: out of memory"),
               R("large b1 s128", "bertfuse fp16 runtime (arena + CUDA graph)", 300.0, 330.0,
                 3333.3, 1e-3, 1e-4)]
    from bertfuse.bench.peers import ORT_PEER, TORCH_PEER

    results[2].gpu_us, results[2].gpu_busy_us = 80.0, 72.5
    results += [R("base b1 s128", ORT_PEER, 125.0, 140.0, 8000.0, 3e-3, 1e-4),
                R("base b1 s128", TORCH_PEER, 200.0, 220.0, 5000.0, 3e-3, 1e-4),
                R("large b1 s128", TORCH_PEER, note="failed: torch not installed")]
    lines = bench.format_table(results).splitlines()
    assert len(lines) == 2 + len(results)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:10] == ["workload", "variant", "p50 (us)", "p99 (us)", "seq/s", "x bertfuse",
                          "x best peer", "GPU (us)", "GPU busy (us)", "wall - GPU (us)"]
    assert lines[1].count("---") == len(header)
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]
    assert all(len(row) == len(header) for row in rows)
    assert [(row[0], row[1]) for row in rows] == [(r.workload, r.variant) for r in results]
    ratio = [row[5] for row in rows]
    assert ratio == ["4.00", "1.50", "1.00", "nan", "1.00", "1.25", "2.00", "nan"]
    # against the best peer that ran in the same workload (ORT's, 125 us); none for large
    assert [row[6] for row in rows] == ["3.20", "1.20", "0.80", "nan", "nan", "1.00", "1.60",
                                        "nan"]
    assert rows[2][7:10] == ["80.0", "72.5", "20.0"] and rows[0][7:10] == ["", "", ""]
    assert rows[0][2] == "400.0" and rows[0][4] == "2,500"
    assert rows[2][10] == "2.00e-03" and rows[2][12] == "CUDA graph"
    assert rows[3][12] == "failed: out of memory"


def test_busy_time_counts_overlapping_kernels_once():
    """PDL: a kernel starts inside its predecessor; the union counts the overlap once, gaps
    not at all, and a kernel wholly inside another adds nothing."""
    from bertfuse.bench.timing import busy_us

    assert busy_us([]) == 0.0
    assert busy_us([(0.0, 10.0), (8.0, 15.0)]) == pytest.approx(15.0)  # overlap 2 once
    assert busy_us([(20.0, 25.0), (0.0, 10.0), (2.0, 3.0)]) == pytest.approx(15.0)  # gap, inside
    assert busy_us([(0.0, 10.0), (10.0, 12.0)]) == pytest.approx(12.0)


def test_time_interleaved_alternates_and_counts():
    calls: list[str] = []
    fns = {name: (lambda n=name: calls.append(n)) for name in ("a", "b", "c")}
    timed = time_interleaved(fns, iters=40, rounds=4, warmup=2)
    assert set(timed) == {"a", "b", "c"}
    assert all(p50 >= 0 and p99 >= p50 for p50, p99 in timed.values())
    timed_calls = calls[6:]  # after 2 warm-up calls each
    assert len(timed_calls) == 3 * 40
    # Rounds alternate: a x10, b x10, c x10, then a again.
    assert timed_calls[:10] == ["a"] * 10 and timed_calls[10:20] == ["b"] * 10
    assert timed_calls[30:40] == ["a"] * 10


def test_bench_refuses_a_missing_skeleton_in_one_line(tmp_path, capsys):
    """`bertfuse bench` is an ordinary subcommand: argparse, one stderr line, exit 2."""
    assert cli.main(["bench", "--skeletons", str(tmp_path), "--packed"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "no skeleton for base, large, minilm, shenma-3l, tinybert" in err[0], cap.err
    assert not cap.out
    assert cli.main(["bench", "--skeletons", str(tmp_path), "--iters", "x"]) == 2
    assert "--iters" in capsys.readouterr().err


def test_bench_checks_its_out_folder_before_anything(tmp_path, capsys):
    """The results are written after minutes of timing: an --out that cannot take them is
    refused up front (one line, exit 2), before the skeletons or the GPU are looked at."""
    afile = tmp_path / "results.json"
    afile.write_text("{}")
    for out, why in ((afile, "is a file"), (tmp_path / "no" / "such", "does not exist")):
        assert cli.main(["bench", "--skeletons", str(tmp_path / "none"), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--out" in err[0] and why in err[0], err
    assert afile.read_text() == "{}" and not (tmp_path / "no").exists()
    # A new folder under a writable parent passes this check (the skeletons' check fails next)
    assert cli.main(["bench", "--skeletons", str(tmp_path / "none"),
                     "--out", str(tmp_path / "new")]) == 2
    assert "no skeleton" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_packed_bench_tables_from_rows():
    from bertfuse.bench.packed import format_tables

    row = {"workload": "uniform [8,64] b20 s64", "mix": "mixed", "fill": 0.6,
           "precision": "fp16", "padded_p50_us": 300.0, "packed_p50_us": 200.0, "speedup": 1.5,
           "packed_nograph_p50_us": 450.0, "routed_p50_us": 210.0, "max_diff": 1e-2,
           "mean_diff": 4e-4}
    failed = {"workload": "skewed b32 s128", "mix": "all full", "fill": 1.0,
              "precision": "fp32", "error": "CUDA out of memory"}
    sweep = [{"workload": "uniform [8,64] b20 s64", "fill": 0.5, "padded_p50_us": 300.0,
              "packed_p50_us": 250.0, "speedup": 1.2}]
    load = {"workload": "uniform [8,64] b20 s64", "precision": "fp16", "streams": 2,
            "replica_max_diff": 0.0}
    for kind, rate in (("padded", 100000), ("packed", 150000), ("packed16", 160000),
                       ("routed", 140000)):
        load.update({f"{kind}_seq_per_s": rate, f"{kind}_p50_us": 380.4, f"{kind}_p99_us": 500.0})
        if kind != "padded":
            load[f"{kind}_speedup"] = round(rate / 100000, 2)
    text = format_tables({"rows": [row, failed], "sweep": sweep, "load": [load]})
    assert "| 300.0 | 200.0 | 1.5 | 450.0 | 210.0 | 66,667 | 100,000 |" in text
    assert "failed: CUDA out of memory" in text and "| 0.5 | 300.0 | 250.0 | 1.2 |" in text
    assert "| 2 | 100,000 (380/500) | 150,000 (380/500) | 160,000 (380/500) | " \
           "140,000 (380/500) | 1.5 | 1.6 | 1.4 | 0.00e+00 |" in text


def test_peers_say_why_they_cannot_run_here():
    """Without torch+transformers (or without a bert_config, or a GPU for torch), the peer rows
    are notes naming what is missing, and the rest of the run goes on."""
    from bertfuse.bench import peers

    feeds = padded_request(2, 8, VOCAB)
    got, ref, failed = peers.setup_peers({}, feeds, ".")
    assert got == {} and ref == {} and set(failed) == set(peers.PEER_ROWS)
    why = peers.missing_peer_packages()
    note = next(iter(failed.values()))
    assert note == (why or "the skeleton carries no bert_config to build the peers from")
    assert peers.bert_config({"bert_config": '{"hidden_size": 8}'}) == {"hidden_size": 8}
    assert peers.bert_config({}) is None
    R = bench.Result
    assert np.isnan(peers.best_peer([R("w", "ORT raw fp32", 1.0)], "w"))
    assert peers.best_peer([R("w", peers.TORCH_PEER, 9.0), R("w", peers.ORT_PEER, 7.0),
                            R("v", peers.ORT_PEER, 1.0), R("w", peers.ORT_PEER)], "w") == 7.0
