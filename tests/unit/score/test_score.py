"""`bertfuse score` (bertfuse/score/) on a local Ray (3 logical CPUs: 2 scoring actors and the
reading), on the CPU, with a tiny fused BERT (builders/onnx_graphs.py through the default
passes). 10,000 rows scored by 2 actors equal a direct Session's outputs (ids and text), keys
carried; an actor killed mid-job (os._exit) and a driver killed mid-job (SIGKILL, then rerun)
still give every row exactly once; rejects carry their reasons; bad input is one line, exit 2.
Teardown checks that no Ray process started here is left."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertfuse import cli
from bertfuse.converter.example_vocab import example_vocab
from bertfuse.errors import BertfuseError
from bertfuse.runtime import Session
from bertfuse.text import WordPiece
from support.builders.onnx_graphs import bert

ray = pytest.importorskip("ray")  # the `ray` extra: in CI's default extras

from bertfuse.score import score  # noqa: E402
from support.processes import alive, descendants, wait_gone  # noqa: E402  (Ray's processes)
from support.paths import ROOT

VOCAB, POSITIONS, HIDDEN, ROWS = 300, 64, 32, 10_000
TOL = 1e-4  # fp32, same kernels; only the batch's padding differs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    from bertfuse.passes.manager import run_passes

    root = tmp_path_factory.mktemp("score_model")
    fused, report = run_passes(bert(np.random.default_rng(3), layers=2, hidden=HIDDEN, heads=2,
                                    inter=64, vocab=VOCAB, positions=POSITIONS))
    assert report.table.fully_fused
    onnx.save(fused, root / "tiny.onnx")
    (root / "vocab.txt").write_text("".join(t + "\n" for t in example_vocab(VOCAB)))
    # Google's layout: the config beside the vocab caps the tokenizer at POSITIONS
    (root / "bert_config.json").write_text(json.dumps(
        {"max_position_embeddings": POSITIONS, "vocab_size": VOCAB, "do_lower_case": True}))
    return {"model": str(root / "tiny.onnx"), "vocab": str(root / "vocab.txt")}


def test_text_rows_with_the_config_beside_the_vocab_are_counted_not_refused(tiny):
    """max_seq is the config's positions: spotting a long row needs one token more than the
    tokenizer beside that config allows (issue 25: every text job failed)."""
    from bertfuse.score.rows import InputSpec, RowPreparer

    long = " ".join(["water"] * POSITIONS)
    table = pa.table({"t": ["what is bert", long, " ".join(["water"] * (POSITIONS - 2))]})
    for truncate, rejected in ((False, [None, "too long", None]), (True, [None, None, None])):
        got = RowPreparer(InputSpec(max_seq=POSITIONS, text_column="t", vocab=tiny["vocab"],
                                    truncate=truncate))(table)
        assert [r and r[:8] for r in got.reasons] == rejected
        assert got.lengths.max() == POSITIONS  # the exact fit is kept whole


@pytest.fixture(scope="module")
def cluster():
    """A local Ray of our own; on teardown none of the processes it started may be left."""
    before = descendants(os.getpid())
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    started = descendants(os.getpid()) - before
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
    left = wait_gone(started)
    assert not left, f"Ray processes left after shutdown: {sorted(left)}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny) -> dict:
    """ROWS rows, row groups of 1000: ids (lengths 1..POSITIONS) and segments, text and a
    pair from the vocab's words, and two key columns in a shuffled order."""
    rng = np.random.default_rng(7)
    words = [w for w in example_vocab(VOCAB) if w.isalpha() and w.islower()]
    lengths = rng.integers(1, POSITIONS + 1, ROWS)
    ids = [rng.integers(0, VOCAB, n).astype(np.int32) for n in lengths]
    segs = [(np.arange(n) >= n // 2).astype(np.int32) for n in lengths]
    text = [" ".join(rng.choice(words, rng.integers(1, 20))) for _ in range(ROWS)]
    pair = [" ".join(rng.choice(words, rng.integers(1, 10))) for _ in range(ROWS)]
    doc_id = rng.permutation(ROWS).astype(np.int64) * 3 + 11
    table = pa.table({"doc_id": doc_id, "qid": [f"q{i % 97}" for i in range(ROWS)],
                      "ids": pa.array([a.tolist() for a in ids], pa.list_(pa.int32())),
                      "segs": pa.array([s.tolist() for s in segs], pa.list_(pa.int32())),
                      "text": text, "pair": pair})
    path = tmp_path_factory.mktemp("score_in") / "corpus.parquet"
    pq.write_table(table, path, row_group_size=1000)
    return {"path": str(path), "ids": ids, "segs": segs, "text": text, "pair": pair,
            "doc_id": doc_id}


def direct(session: Session, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    return np.concatenate([session.run(**f, outputs=["pooled_output"])["pooled_output"]
                           for f in feeds])


def id_batches(ids: list, segs: list, size: int = 32) -> list[dict[str, np.ndarray]]:
    out = []
    for i in range(0, len(ids), size):
        chunk, schunk = ids[i:i + size], segs[i:i + size]
        width = max(len(a) for a in chunk)
        batch = {k: np.zeros((len(chunk), width), np.int32) for k in ("input_ids", "input_mask",
                                                                       "segment_ids")}
        for r, (a, s) in enumerate(zip(chunk, schunk)):
            batch["input_ids"][r, :len(a)], batch["segment_ids"][r, :len(a)] = a, s
            batch["input_mask"][r, :len(a)] = 1
        out.append(batch)
    return out


def scored(out: Path, key: str = "doc_id") -> pa.Table:
    table = pq.read_table(out / "scores").sort_by(key)
    assert len(set(table.column(key).to_pylist())) == table.num_rows, "a row written twice"
    return table


def embeddings(table: pa.Table) -> np.ndarray:
    return np.array(table.column("pooled_output").to_pylist(), np.float32)


@pytest.fixture(scope="module")
def ids_run(cluster, tiny, corpus, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("score_out") / "ids"
    summary = score(tiny["model"], corpus["path"], out, ids_column="ids", segment_column="segs",
                    key_columns=["doc_id", "qid"], actors=2, part_rows=1000, progress=False)
    return {"out": out, "summary": summary}


def test_ids_equal_a_direct_session(ids_run, tiny, corpus):
    s = ids_run["summary"]
    assert (s.rows, s.scored, s.rejected, s.parts, s.actors) == (ROWS, ROWS, 0, 10, 2)
    table = scored(ids_run["out"])
    assert table.column_names == ["doc_id", "qid", "pooled_output"]
    assert table.schema.field("pooled_output").type == pa.list_(pa.float32())
    order = np.argsort(corpus["doc_id"])
    assert np.array_equal(table.column("doc_id").to_numpy(), corpus["doc_id"][order])
    assert table.column("qid").to_pylist() == [f"q{i % 97}" for i in order]
    with Session(tiny["model"], device="cpu", max_batch=32) as session:
        want = direct(session, id_batches(corpus["ids"], corpus["segs"]))[order]
    got = embeddings(table)
    assert got.shape == (ROWS, HIDDEN) and np.isfinite(got).all()
    assert np.abs(got - want).max() <= TOL
    manifest = json.loads((ids_run["out"] / "_bertfuse_score.json").read_text())
    assert manifest["complete"] and manifest["summary"]["scored"] == ROWS
    assert not list(ids_run["out"].rglob("*.tmp"))


def test_the_summary_says_where_the_time_went(ids_run):
    """Every stage timed, the actors' times carried back with their rows (never written)."""
    from bertfuse.score.stages import ACTOR

    st = ids_run["summary"].stages
    want = [f"actor_{s}" for s in ACTOR] + ["driver_wait", "driver_split",
                                            "driver_backpressure", "driver_cpu",
                                            "commit_gather", "commit_write"]
    assert list(st) == want
    rounding = 0.0005 / ROWS * 1e6 + 0.005  # seconds kept to 1 ms, us/row to 0.01
    assert all(v["s"] >= 0 and v["us_per_row"] == pytest.approx(v["s"] / ROWS * 1e6,
                                                                 abs=rounding)
               for v in st.values())
    assert st["actor_model"]["s"] > 0 and st["commit_write"]["s"] > 0
    assert st["actor_model"]["s"] < ids_run["summary"].seconds * 2  # 2 actors' seconds at most
    assert pq.read_schema(next((ids_run["out"] / "scores").glob("*.parquet"))).names == \
        ["doc_id", "qid", "pooled_output"]


def test_the_gpu_plan_is_one_ray_data_accepts(cluster, tiny, corpus, tmp_path):
    """The Ray Data plan exactly as the job builds it for GPUs (an actor per GPU, num_gpus=1),
    built on the CPU down to its physical operators and never run (no actor starts): Ray Data
    checks map_batches' arguments when the plan is built (GPUs need an integer batch_size),
    and the actor pool's remote arguments when it is planned, so a plan the GPU machines
    would refuse fails here. The last lines show Ray still checks at build time: if it ever
    checks only when running, this test says so instead of passing for nothing."""
    from ray.data._internal.logical.optimizers import get_execution_plan

    from bertfuse.score.job import CALLS_PER_ACTOR, _dataset
    from bertfuse.score.spec import build_job

    job = build_job(tiny["model"], corpus["path"], tmp_path / "out", ids_column="ids",
                    key_columns=["doc_id"], part_rows=1000)
    ds = _dataset(job, job.parts, "cuda", 2)
    op = ds._logical_plan.dag  # Ray Data's logical MapBatches for the Scorer actors
    assert op.ray_remote_args.get("num_gpus") == 1 and isinstance(op.batch_size, int)
    pool = get_execution_plan(ds._logical_plan)[0].dag  # the physical actor pool, not started
    assert type(pool).__name__ == "ActorPoolMapOperator"
    assert pool._ray_remote_args["num_gpus"] == 1
    assert pool._ray_remote_args["max_concurrency"] == CALLS_PER_ACTOR
    with pytest.raises(ValueError, match="batch_size"):
        ray.data.range(4).map_batches(lambda b: b, batch_size=None, num_gpus=1)


def test_float_outputs_are_written_exactly_and_cheaply(tmp_path):
    """An fp16 model's outputs (float16 values as float32) get a dictionary, full float32 ones
    none; neither gets statistics; both read back bit for bit, nulls (rejects) kept."""
    from bertfuse.score.output import _write

    rng = np.random.default_rng(11)
    for kind in ("float16", "float32"):
        values = np.tanh(rng.standard_normal((300, 48), dtype=np.float32))
        values = values.astype(kind).astype(np.float32)
        ok = rng.random(300) > 0.1
        from bertfuse.score.actor import _arrow

        col = _arrow(values[ok], 2, ok)
        table = pa.table({"id": np.arange(300), "emb": col})
        _write(tmp_path / f"{kind}.parquet", table, plain=["emb"])
        back = pq.read_table(tmp_path / f"{kind}.parquet")
        assert back.equals(table)
        meta = pq.ParquetFile(tmp_path / f"{kind}.parquet").metadata.row_group(0).column(1)
        assert meta.path_in_schema == "emb.list.element" and not meta.is_stats_set
        assert ("RLE_DICTIONARY" in meta.encodings) == (kind == "float16")


def test_text_pairs_equal_a_direct_session(cluster, tiny, corpus, tmp_path):
    s = score(tiny["model"], corpus["path"], tmp_path / "out", text_column="text",
              text_pair_column="pair", vocab=tiny["vocab"], actors=2, part_rows=2500,
              progress=False)
    assert (s.scored, s.rejected, s.parts) == (ROWS, 0, 4)
    table = pq.read_table(tmp_path / "out" / "scores").sort_by("row")
    assert table.column_names == ["row", "pooled_output"]  # no key columns: the row number
    assert table.column("row").to_pylist() == list(range(ROWS))
    tok = WordPiece(tiny["vocab"], model=tiny["model"])
    feeds = [tok(corpus["text"][i:i + 32], corpus["pair"][i:i + 32]).feeds()
             for i in range(0, ROWS, 32)]
    with Session(tiny["model"], device="cpu", max_batch=32) as session:
        want = direct(session, feeds)
    assert np.abs(embeddings(table) - want).max() <= TOL


def test_a_killed_actor_loses_and_repeats_nothing(cluster, tiny, corpus, ids_run, tmp_path,
                                                  monkeypatch):
    """An actor dies (os._exit) on its second batch: Ray restarts it and retries the batch;
    the output equals the undisturbed run's, every row once."""
    flag = tmp_path / "crashed"
    monkeypatch.setenv("BERTFUSE_TEST_SCORE_CRASH", f"{flag}:2")
    s = score(tiny["model"], corpus["path"], tmp_path / "out", ids_column="ids",
              segment_column="segs", key_columns="doc_id,qid", actors=2, part_rows=1000,
              progress=False)
    assert flag.exists(), "no actor was killed"
    pid = int(flag.read_text())
    assert not alive({pid})
    assert (s.scored, s.rejected) == (ROWS, 0)
    got, want = scored(tmp_path / "out"), scored(ids_run["out"])
    assert got.column("doc_id").equals(want.column("doc_id"))
    assert np.abs(embeddings(got) - embeddings(want)).max() <= TOL


def test_a_job_failing_past_its_retries_is_one_line_and_resumes(cluster, tiny, corpus, ids_run,
                                                                 tmp_path, monkeypatch, capsys):
    """No retries and an actor that dies: exit 1 and one line saying how to resume; the same
    command then completes the output, every row once."""
    out = tmp_path / "out"
    args = ["score", "--model", tiny["model"], "--input", corpus["path"], "--output", str(out),
            "--ids-column", "ids", "--segment-column", "segs", "--key-columns", "doc_id,qid",
            "--actors", "1", "--part-rows", "1000"]
    monkeypatch.setenv("BERTFUSE_TEST_SCORE_CRASH", f"{tmp_path / 'crashed'}:1")
    assert cli.main([*args, "--max-retries", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run the same command again to resume" in err, err
    assert not list(out.rglob("*.tmp"))
    monkeypatch.delenv("BERTFUSE_TEST_SCORE_CRASH")
    assert cli.main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["scored"], summary["rejected"]) == (ROWS, 0)
    got, want = scored(out), scored(ids_run["out"])
    assert got.column("doc_id").equals(want.column("doc_id"))
    assert np.abs(embeddings(got) - embeddings(want)).max() <= TOL


def test_sequence_outputs_are_cut_to_each_row(cluster, tiny, corpus, tmp_path):
    rows = 40
    path = tmp_path / "in.parquet"
    pq.write_table(pq.read_table(corpus["path"]).slice(0, rows), path)
    s = score(tiny["model"], path, tmp_path / "out", ids_column="ids", segment_column="segs",
              outputs="sequence_output,pooled_output", actors=1, progress=False)
    assert s.scored == rows
    table = pq.read_table(tmp_path / "out" / "scores").sort_by("row")
    assert table.schema.field("sequence_output").type == pa.list_(pa.list_(pa.float32()))
    with Session(tiny["model"], device="cpu", max_batch=32) as session:
        for i, seq in enumerate(table.column("sequence_output").to_pylist()):
            want = session.run(corpus["ids"][i][None], None, corpus["segs"][i][None],
                               outputs=["sequence_output"])["sequence_output"][0]
            got = np.array(seq, np.float32)
            assert got.shape == (len(corpus["ids"][i]), HIDDEN)
            assert np.abs(got - want).max() <= TOL


def paused_cli(cluster: str, flag: Path, *args: str) -> subprocess.Popen:
    """`bertfuse score ARGS --address CLUSTER` in a subprocess, returned once it has committed
    its first part and paused there (safety.pause_point writes its pid to `flag`)."""
    env = {**os.environ, "BERTFUSE_TEST_PAUSE": f"score-committed:{flag}",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "bertfuse", "score", *args, "--address",
                             cluster], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not flag.exists():
        proc.kill()
        err = proc.communicate()[1].decode()
        pytest.fail(f"the job never committed a part: {err[-2000:]}")
    return proc


def test_a_killed_job_rerun_writes_each_part_once(cluster, tiny, corpus, ids_run, tmp_path):
    """`bertfuse score` joins this Ray, is SIGKILLed after its first part is committed, and
    is run again: the committed part is not rewritten, a stale temp is removed, every row is
    written once."""
    out = tmp_path / "out"
    proc = paused_cli(cluster, tmp_path / "paused", "--model", tiny["model"], "--input",
                      corpus["path"], "--output", str(out), "--ids-column", "ids",
                      "--segment-column", "segs", "--key-columns", "doc_id,qid", "--actors",
                      "2", "--part-rows", "1000", "--batch-size", "8")  # calls of ~1 part
    proc.kill()  # SIGKILL: no cleanup of any kind
    proc.wait()
    done = sorted((out / "scores").glob("part-*.parquet"))
    assert 1 <= len(done) < 10
    first = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in done}
    stale = out / "scores" / ".part-00009.parquet.abcd.tmp"  # as a kill mid-write leaves it
    stale.write_bytes(b"half a file")
    s = score(tiny["model"], corpus["path"], out, ids_column="ids", segment_column="segs",
              key_columns=["doc_id", "qid"], actors=2, part_rows=1000, progress=False)
    assert s.parts_skipped == len(done) and s.rows_this_run == ROWS - 1000 * len(done)
    assert (s.scored, s.rejected) == (ROWS, 0)
    assert {p: (q.stat().st_ino, q.stat().st_mtime_ns) for p, q in
            ((n, out / "scores" / n) for n in first)} == first
    assert not stale.exists()
    got, want = scored(out), scored(ids_run["out"])
    assert got.column("doc_id").equals(want.column("doc_id"))
    assert np.abs(embeddings(got) - embeddings(want)).max() <= TOL
    again = score(tiny["model"], corpus["path"], out, ids_column="ids", segment_column="segs",
                  key_columns=["doc_id", "qid"], part_rows=1000, progress=False)
    assert (again.parts_skipped, again.rows_this_run, again.scored) == (10, 0, ROWS)


def test_sigterm_stops_the_job_one_line_no_temp(cluster, tiny, corpus, tmp_path):
    """SIGTERM while parts are being scored: `bertfuse: terminated`, 143, no temp left, the
    committed parts whole (ray.init's own SIGTERM handler, a bare exit, is not kept)."""
    out = tmp_path / "out"
    proc = paused_cli(cluster, tmp_path / "paused", "--model", tiny["model"], "--input",
                      corpus["path"], "--output", str(out), "--ids-column", "ids", "--actors",
                      "1", "--part-rows", "1000")
    try:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=180)[1].decode()  # unwinding: writers, Ray Data, Ray
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines()[-1] == "bertfuse: terminated"
    assert not list(out.rglob("*.tmp"))
    for part in (out / "scores").glob("part-*.parquet"):
        assert pq.ParquetFile(part).metadata.num_rows == 1000


def test_rejects_are_written_with_their_reasons(cluster, tiny, tmp_path):
    good = [1, 5, 7]
    rows = [  # (ids, segs, mask, reason or None)
        (good, [0, 0, 1], None, None),
        (None, [0], None, "null ids"),
        ([], [], None, "empty ids"),
        (list(range(1, POSITIONS + 2)), [0] * (POSITIONS + 1), None,
         f"too long: {POSITIONS + 1} tokens > max_seq {POSITIONS}"),
        ([1, VOCAB, 2], [0, 0, 0], None, f"ids value {VOCAB} not in [0, {VOCAB})"),
        ([1, -4], [0, 0], None, f"ids value -4 not in [0, {VOCAB})"),
        ([1, None], [0, 0], None, "null id in ids"),
        (good, [0, 2, 0], None, "segs value 2 not in [0, 2)"),
        (good, [0, 0], None, "segs has 2 values, ids 3"),
        (good, [0, 0, 0], [1, 1], "mask has 2 values, ids 3"),
        (good, [0, 0, 0], [0, 0, 0], "mask keeps no token"),
        (good, None, None, "null segs"),
        ([9] * POSITIONS, [1] * POSITIONS, [1, 0] * (POSITIONS // 2), None),
    ]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({
        "key": [f"k{i}" for i in range(len(rows))],
        "ids": pa.array([r[0] for r in rows], pa.list_(pa.int64())),
        "segs": pa.array([r[1] for r in rows], pa.list_(pa.int32())),
        "mask": pa.array([r[2] if r[2] is not None else [1] * len(r[0] or [])
                          for r in rows], pa.list_(pa.int8()))}), path)
    s = score(tiny["model"], path, tmp_path / "out", ids_column="ids", segment_column="segs",
              mask_column="mask", key_columns="key", actors=1, progress=False)
    want = {f"k{i}": r[3] for i, r in enumerate(rows) if r[3]}
    assert (s.scored, s.rejected) == (len(rows) - len(want), len(want))
    rejects = pq.read_table(tmp_path / "out" / "rejects")
    assert rejects.column_names == ["key", "reason"]
    assert dict(zip(rejects.column("key").to_pylist(), rejects.column("reason").to_pylist())) \
        == want
    assert sorted(pq.read_table(tmp_path / "out" / "scores").column("key").to_pylist()) == \
        sorted(f"k{i}" for i, r in enumerate(rows) if not r[3])

    texts = ["what is bert", None, "   ", " ".join(["water"] * POSITIONS), "who knows"]
    pq.write_table(pa.table({"t": texts}), tmp_path / "text.parquet")
    s = score(tiny["model"], tmp_path / "text.parquet", tmp_path / "text_out", text_column="t",
              vocab=tiny["vocab"], actors=1, progress=False)
    reasons = pq.read_table(tmp_path / "text_out" / "rejects").sort_by("row").to_pylist()
    assert reasons == [{"row": 1, "reason": "null t"}, {"row": 2, "reason": "empty t"},
                       {"row": 3, "reason": f"too long: more than max_seq {POSITIONS} tokens "
                                            "(--truncate cuts it to fit)"}]
    assert (s.scored, s.rejected) == (2, 3)
    cut = score(tiny["model"], tmp_path / "text.parquet", tmp_path / "cut", text_column="t",
                vocab=tiny["vocab"], truncate=True, actors=1, progress=False)
    assert (cut.scored, cut.rejected) == (3, 2)


def test_a_corrupt_page_is_bad_input_naming_the_file_not_a_cluster_failure(cluster, tiny,
                                                                            ids_run, tmp_path,
                                                                            capsys):
    """Bad data pages (the footer reads fine) fail inside a Ray task: the user gets pyarrow's
    reason and the file, exit 2, one line without colour codes, no advice to rerun; and a
    finished job leaves no lock file in OUT."""
    assert not (ids_run["out"] / "_bertfuse_score.lock").exists()
    path = tmp_path / "corrupt.parquet"
    pq.write_table(pa.table({"ids": pa.array([[i % 50 + 1] * 8 for i in range(2000)],
                                             pa.list_(pa.int32()))}),
                   path, compression="snappy", row_group_size=1000)
    col = pq.ParquetFile(path).metadata.row_group(1).column(0)
    end = (col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size
    data = bytearray(path.read_bytes())
    data[end - 20:end - 12] = bytes(b ^ 0x5A for b in data[end - 20:end - 12])
    path.write_bytes(bytes(data))
    code, err = run_cli(capsys, "--model", tiny["model"], "--input", str(path), "--output",
                        str(tmp_path / "o"), "--ids-column", "ids", "--actors", "1",
                        "--part-rows", "1000", "--max-retries", "0")
    assert code == 2, err
    line = err.strip()
    assert len(line.splitlines()) == 1 and "\x1b" not in line, err
    assert f"{path}: row groups 1..1 cannot be read (Corrupt snappy compressed data" in line
    assert "run the same command" not in line and " of 2 parts are complete in " in line, line
    assert not (tmp_path / "o" / "_bertfuse_score.lock").exists()


def test_a_task_error_is_the_users_exception_without_colour():
    """The text of Ray 2.60's RayTaskError(UserCodeException) from a map_batches UDF."""
    from bertfuse.ray_cluster import task_error

    text = ("\x1b[36mray::MapBatches(f)()\x1b[39m (pid=7965, ip=192.0.2.2)\n"
            '  File "/tmp/x.py", line 5, in f\n    raise OSError("Corrupt snappy data")\n'
            "OSError: Corrupt snappy data\n\nThe above exception was the direct cause of the "
            "following exception:\n\n\x1b[36mray::MapBatches(f)()\x1b[39m (pid=7965)\n"
            "ray.exceptions.UserCodeException: UDF failed to process a data block.\n")
    assert task_error(RuntimeError(text)) == "OSError: Corrupt snappy data"
    assert task_error(RuntimeError("\x1b[31mplain failure\x1b[0m")) == "plain failure"


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["score", *args])
    return code, capsys.readouterr().err


def test_bad_input_is_one_line_exit_2(tiny, corpus, ids_run, tmp_path, capsys):
    base = ["--model", tiny["model"], "--input", corpus["path"]]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    (tmp_path / "bad.parquet").write_text("not parquet")
    cases = [
        ([*base, "--output", str(tmp_path / "o"), "--ids-column", "nope"], "no column 'nope'"),
        ([*base, "--output", str(tmp_path / "o"), "--text-column", "text"], "vocab"),
        ([*base, "--output", str(tmp_path / "o"), "--ids-column", "text"], "lists of integers"),
        ([*base, "--output", str(tmp_path / "o"), "--ids-column", "ids", "--text-column", "t",
          "--vocab", tiny["vocab"]], "either"),
        ([*base, "--output", str(tmp_path / "o"), "--ids-column", "ids", "--outputs", "x"],
         "no output 'x'"),
        ([*base, "--output", str(foreign), "--ids-column", "ids"], "not empty"),
        ([*base, "--output", corpus["path"], "--ids-column", "ids"], "not a directory"),
        ([*base, "--output", str(Path(corpus["path"]).parent), "--ids-column", "ids"],
         "holds the input"),
        ([*base, "--output", str(ids_run["out"]), "--ids-column", "ids"], "different job"),
        (["--model", tiny["model"], "--input", str(tmp_path / "bad.parquet"), "--output",
          str(tmp_path / "o"), "--ids-column", "ids"], "not a readable Parquet file"),
        (["--model", tiny["vocab"], "--input", corpus["path"], "--output", str(tmp_path / "o"),
          "--ids-column", "ids"], "not a readable ONNX model"),
        ([*base, "--output", str(tmp_path / "o"), "--ids-column", "ids", "--actors", "0"],
         "at least 1"),
        ([*base, "--output", str(tmp_path / "o"), "--ids-column", "ids", "--max-seq", "65"],
         "longer than the model's 64 positions"),
    ]
    for args, words in cases:
        code, err = run_cli(capsys, *args)
        assert code == 2, (args, err)
        assert len(err.strip().splitlines()) == 1 and words in err, (args, err)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    busy = tmp_path / "busy"
    busy.mkdir()
    with open(busy / "_bertfuse_score.lock", "w") as held:  # another job writing there
        fcntl.flock(held, fcntl.LOCK_EX)
        code, err = run_cli(capsys, *base, "--output", str(busy), "--ids-column", "ids")
    assert code == 2 and "another bertfuse score is writing to it" in err, err
    assert not (tmp_path / "o").exists()
    for kwargs in ({"actors": 0}, {"key_columns": 5}, {"batch_size": True}, {"device": "tpu"},
                   {"outputs": ["pooled_output", "pooled_output"]}):
        with pytest.raises(BertfuseError):
            score(tiny["model"], corpus["path"], tmp_path / "o", ids_column="ids", **kwargs)


class ThreadRecordingSession(Session):
    """A real Session that notes the thread of each call: ORT's CUDA EP keeps CUDA graphs per
    thread, so a Session that captured them must be built, warmed, run and closed on one."""

    threads: list[tuple[str, int]] = []

    def __init__(self, *args, **kwargs) -> None:
        self.threads.append(("init", threading.get_ident()))
        super().__init__(*args, **kwargs)

    def warmup(self, *args, **kwargs):
        self.threads.append(("warmup", threading.get_ident()))
        return super().warmup(*args, **kwargs)

    def run(self, *args, **kwargs):
        self.threads.append(("run", threading.get_ident()))
        return super().run(*args, **kwargs)

    def close(self) -> None:
        self.threads.append(("close", threading.get_ident()))
        super().close()


def test_the_actor_session_keeps_one_thread_whatever_thread_calls(tiny, corpus, tmp_path,
                                                                  monkeypatch):
    """Ray Data builds the Scorer on the actor's thread and calls it from an executor's (or,
    with max_concurrency, from several): the Session is still built, run and closed on one
    thread of the actor's own, and each caller gets its own rows' outputs."""
    import bertfuse.score.actor  # where the Scorer finds Session
    from bertfuse.score.actor import Scorer
    from bertfuse.score.output import PART, ROW
    from bertfuse.score.spec import build_job

    monkeypatch.setattr(bertfuse.score.actor, "Session", ThreadRecordingSession)
    monkeypatch.setattr(ThreadRecordingSession, "threads", [])
    job = build_job(tiny["model"], corpus["path"], tmp_path / "out", ids_column="ids",
                    segment_column="segs", key_columns=["doc_id"], batch_size=16)
    scorer = Scorer(model=job.model, spec=job.spec, keys=job.key_columns, outputs=job.outputs,
                    ranks=job.output_ranks, max_batch=job.batch_size, device="cpu")
    built_by = threading.get_ident()
    rows = pq.read_table(corpus["path"], columns=["doc_id", "ids", "segs"]).slice(0, 200)
    tables = [rows.slice(i * 100, 100) for i in range(2)]
    tables = [t.append_column(PART, pa.array(np.zeros(100, np.int64)))
               .append_column(ROW, pa.array(np.arange(100) + 100 * i))
              for i, t in enumerate(tables)]
    got: dict[int, tuple[int, pa.Table]] = {}
    callers = [threading.Thread(target=lambda i=i: got.update(
        {i: (threading.get_ident(), scorer(tables[i]))})) for i in range(2)]
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    assert sorted(got) == [0, 1]
    calls = ThreadRecordingSession.threads
    assert [k for k, _ in calls if k != "run"] == ["init"]
    assert sum(k == "run" for k, _ in calls) >= 2
    owners = {t for _, t in calls}
    assert len(owners) == 1, calls
    assert owners.isdisjoint({built_by, *(t for t, _ in got.values())})
    scorer.close()  # the Session closes on its own thread too
    assert calls[-1] == ("close", owners.pop())
    with Session(tiny["model"], max_batch=16, max_seq=POSITIONS, device="cpu") as session:
        for i, (_, out) in got.items():
            lo = 100 * i
            want = direct(session, id_batches(corpus["ids"][lo:lo + 100],
                                              corpus["segs"][lo:lo + 100], size=16))
            assert out.column("doc_id").to_pylist() == corpus["doc_id"][lo:lo + 100].tolist()
            assert np.abs(embeddings(out) - want).max() <= TOL


def test_parts_cover_every_row_once(tmp_path):
    """Parts of whole row groups, and cuts of large ones, read back every input row once, in
    order, numbered across files; hidden files are not input."""
    from bertfuse.score.actor import read_parts
    from bertfuse.score.output import PART, ROW
    from bertfuse.score.spec import input_files, plan_parts

    rng = np.random.default_rng(5)
    (tmp_path / "in" / "sub").mkdir(parents=True)
    first = 0
    for name, groups in (("a.parquet", [300, 300, 2500, 100]), ("sub/b.parquet", [7, 1200])):
        with pq.ParquetWriter(tmp_path / "in" / name, pa.schema([("v", pa.int64())])) as w:
            for n in groups:
                w.write_table(pa.table({"v": np.arange(first, first + n)}))
                first += n
    pq.write_table(pa.table({"v": [-1]}), tmp_path / "in" / "_skipped.parquet")
    files = input_files(str(tmp_path / "in"))
    assert [Path(f).name for f in files] == ["a.parquet", "b.parquet"]
    for part_rows in (1, 250, 500, 1000, 10_000, int(rng.integers(2, 3000))):
        parts, total = plan_parts(files, part_rows)
        assert total == first == sum(p.rows for p in parts)
        got = [read_parts({"part": [p.index], "file": [p.file], "group_start": [p.groups[0]],
                           "group_stop": [p.groups[1]], "offset": [p.offset],
                           "rows": [p.rows], "first_row": [p.first_row]}, files, ["v"])
               for p in parts]
        table = pa.concat_tables(got)
        assert table.column("v").to_pylist() == list(range(total)), part_rows
        assert table.column(ROW).to_pylist() == list(range(total))
        assert all(t.num_rows == p.rows and set(t.column(PART).to_pylist()) == {p.index}
                   for t, p in zip(got, parts))
        assert all(p.rows < 2 * part_rows for p in parts)  # whole groups stop at part_rows


def test_import_bertfuse_imports_no_ray():
    code = "import sys, bertfuse, bertfuse.score, bertfuse.cli.parser; bertfuse.cli.parser.build_parser(); " \
           "assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
