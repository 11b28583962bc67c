"""Offline scoring throughput: `bertfuse score` on Ray Data (1 actor, and 2 where there are two
GPUs) against a single-process Session loop over the same Parquet file, same rows, same
batches, same output (Parquet, pooled_output beside an id column).

    python3 benchmarks/score/score_bench.py --skeleton out/skeletons/shenma-3l_raw.skel.onnx --out $OUT
    python3 benchmarks/score/score_bench.py --model tiny.onnx --device cpu --rows 20000 --out /tmp/sb

Rows: ids of lengths uniform in [--min-len, --seq] (shenma-3l: seq 64). The loop reads the
file in record batches of batch x 64 rows, prepares them as the actors do (bertfuse.score.rows),
runs a warmed Session and writes Parquet. Ray: a local Ray started here, `score(...)` with N
actors (a GPU each). Reported per run: end to end (Session build / Ray start-up included) and
steady (the loop without its Session build; Ray: the rows after the first scored block over
the time after it, the summary's steady_rows_per_s). Each Ray output is checked against the
loop's: every id once, max |diff|. Logs and score_bench.json under --out; the table last,
then us/row per stage (the loop's prepare/model/convert/write; each Ray run's summary
`stages`: what limits it). benchmarks/score/score_driver_bench.py times the driver alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # and for Ray's workers, which inherit the environment:
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                         os.environ.get("PYTHONPATH")]))

from bertfuse.score.spec import build_job  # noqa: E402


def log(out: Path, text: str) -> None:
    print(text, flush=True)
    with open(out / "score_bench.log", "a") as f:
        f.write(text + "\n")


def model_path(args, work: Path) -> str:
    if args.model:
        return args.model
    from bertfuse.bench.models import prepare_models

    paths = prepare_models(args.skeleton, str(work), anchors=False)
    return paths["bertfuse16" if args.precision == "fp16" else "bertfuse32"]


def make_input(path: Path, rows: int, seq: int, min_len: int, vocab: int, group: int) -> None:
    """ids rows in one file, row groups of `group` rows, written a group at a time."""
    rng = np.random.default_rng(0)
    schema = pa.schema([("id", pa.int64()), ("ids", pa.list_(pa.int32()))])
    with pq.ParquetWriter(path, schema) as w:
        for start in range(0, rows, group):
            n = min(group, rows - start)
            lengths = rng.integers(min_len, seq + 1, n)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            values = rng.integers(min(1000, vocab // 2), vocab, int(offsets[-1])).astype(np.int32)
            values[offsets[:-1]] = 101  # [CLS]
            ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
            w.write_table(pa.table({"id": np.arange(start, start + n, dtype=np.int64),
                                    "ids": ids}, schema=schema), row_group_size=group)


def session_loop(job, device: str, path: Path, dest: Path) -> dict:
    """The single-process baseline: read, prepare, run, write, one batch of rows at a time."""
    from bertfuse.runtime import Session
    from bertfuse.score.actor import score_table
    from bertfuse.score.job import ROWS_PER_TASK
    from bertfuse.score.output import write_options
    from bertfuse.score.rows import RowPreparer
    from bertfuse.score.stages import Stages

    t0 = time.perf_counter()
    session = Session(job.model, max_batch=job.batch_size, max_seq=job.spec.max_seq,
                      device=device)
    if device == "cuda":
        session.warmup()
    preparer = RowPreparer(job.spec)
    t1 = time.perf_counter()
    rows, writing, times = 0, 0.0, Stages()
    writer = None
    for rb in pq.ParquetFile(path).iter_batches(batch_size=job.batch_size * ROWS_PER_TASK,
                                                columns=["id", "ids"]):
        table = pa.Table.from_batches([rb])
        cols = score_table(session, preparer, table, job.outputs, job.output_ranks,
                           job.batch_size, times)
        res = pa.table({"id": table.column("id"), **{n: cols[n] for n in job.outputs}})
        tw = time.perf_counter()
        if writer is None:
            writer = pq.ParquetWriter(dest, res.schema,  # encoded as the job's parts are
                                      **write_options(res, job.outputs))
        writer.write_table(res)
        writing += time.perf_counter() - tw
        rows += table.num_rows
    writer.close()
    t2 = time.perf_counter()
    session.close()
    times.add("write", writing)
    return {"rows": rows, "build_s": round(t1 - t0, 3), "seconds": round(t2 - t0, 3),
            "write_s": round(writing, 3), "rows_per_s": round(rows / (t2 - t0), 1),
            "steady_rows_per_s": round(rows / (t2 - t1), 1),
            "no_write_rows_per_s": round(rows / (t2 - t1 - writing), 1),
            "stages": times.result(rows)}


def ray_run(job_kwargs: dict, actors: int, dest: Path) -> dict:
    from bertfuse.score import score

    s = score(output=dest, actors=actors, progress=False, **job_kwargs)
    return {"actors": s.actors, "device": s.device, "rows": s.scored, "rejected": s.rejected,
            "seconds": s.seconds, "rows_per_s": s.rows_per_s, "parts": s.parts,
            "first_result_s": s.first_result_s, "steady_rows_per_s": s.steady_rows_per_s,
            "stages": s.stages}


def embeddings(path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    t = pq.read_table(path).sort_by("id")
    col = t.column(name).combine_chunks()
    return t.column("id").to_numpy(), col.flatten().to_numpy().reshape(len(t), -1)


def check(loop: tuple[np.ndarray, np.ndarray], ray_out: Path, name: str) -> dict:
    ids_a, a = loop
    ids_b, b = embeddings(ray_out / "scores", name)
    same = ids_a.shape == ids_b.shape and bool((ids_a == ids_b).all())
    return {"ids_equal": same, "unique": len(np.unique(ids_b)) == len(ids_b),
            "max_abs_diff": float(np.abs(a - b).max()) if same else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--skeleton", help="raw model skeleton (bertfuse strip-weights), refilled")
    src.add_argument("--model", help="a fused .onnx as it is")
    ap.add_argument("--precision", choices=("fp16", "fp32"), default="fp16",
                    help="with --skeleton (default fp16)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="logs and JSON (default $OUT)")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--part-rows", type=int, default=16384)
    ap.add_argument("--rows-per-task", type=int, help="Ray batch = batch x this (default "
                                                      "bertfuse.score.job.ROWS_PER_TASK)")
    ap.add_argument("--calls-per-actor", type=int, help="calls at once per actor (default "
                                                        "bertfuse.score.job.CALLS_PER_ACTOR)")
    ap.add_argument("--writers", type=int, help="driver threads writing parts (default "
                                                "bertfuse.score.job.WRITERS)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--actors", help="actor counts to run, e.g. 1,2 (default: 1, and 2 with "
                                     "two GPUs)")
    args = ap.parse_args()
    if not args.out:
        ap.error("--out (or $OUT) is required")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="score_bench-"))
    import ray

    import bertfuse.score.job as score_job

    if args.rows_per_task:
        score_job.ROWS_PER_TASK = args.rows_per_task
    if args.calls_per_actor:
        score_job.CALLS_PER_ACTOR = args.calls_per_actor
    if args.writers:
        score_job.WRITERS = args.writers
    try:
        model = model_path(args, work)
        data = work / "input.parquet"
        t0 = time.perf_counter()
        from bertfuse.runtime.request_checks import model_facts, servable_model

        vocab = model_facts(servable_model(model)).vocab_size or 30522
        make_input(data, args.rows, args.seq, args.min_len, vocab, args.part_rows)
        log(out, f"input: {args.rows} rows, lengths {args.min_len}..{args.seq}, "
                 f"{data.stat().st_size / 1e6:.0f} MB, written in {time.perf_counter() - t0:.1f} s")
        kwargs = {"model": model, "input": data, "ids_column": "ids", "key_columns": ["id"],
                  "max_seq": args.seq, "batch_size": args.batch_size, "device": args.device,
                  "part_rows": args.part_rows}
        counts = [int(c) for c in args.actors.split(",")] if args.actors else None
        cpus = os.cpu_count() or 2
        ray.init(address="local", include_dashboard=False, log_to_driver=False,
                 num_cpus=max(cpus, max(counts or [1]) + 1))
        gpus = int(ray.cluster_resources().get("GPU", 0))
        device = args.device if args.device != "auto" else ("cuda" if gpus else "cpu")
        counts = counts or ([1, 2] if gpus >= 2 else [1])
        log(out, f"ray {ray.__version__}: {gpus} GPUs, {cpus} CPUs; device {device}; "
                 f"model {model}")
        job = build_job(output=work / "unused", **kwargs)
        result = {"rows": args.rows, "seq": args.seq, "min_len": args.min_len,
                  "batch_size": args.batch_size, "part_rows": args.part_rows,
                  "rows_per_task": score_job.ROWS_PER_TASK,
                  "calls_per_actor": score_job.CALLS_PER_ACTOR, "writers": score_job.WRITERS,
                  "device": device, "gpus": gpus,
                  "model": model}
        loop_out = work / "loop.parquet"
        result["loop"] = session_loop(job, device, data, loop_out)
        log(out, f"session loop: {json.dumps(result['loop'])}")
        result["ray"] = []
        want = embeddings(loop_out, job.outputs[0])
        for n in counts:
            dest = work / f"ray_{n}"
            run = ray_run(kwargs, n, dest)
            run["check"] = check(want, dest, job.outputs[0])
            result["ray"].append(run)
            log(out, f"ray, {n} actor(s): {json.dumps(run)}")
            shutil.rmtree(dest)
        ray.shutdown()
        (out / "score_bench.json").write_text(json.dumps(result, indent=1) + "\n")
        log(out, table(result))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def table(r: dict) -> str:
    loop = r["loop"]
    lines = [f"\nscoring {r['rows']} rows (seq {r['min_len']}..{r['seq']}, batch "
             f"{r['batch_size']} x {r['rows_per_task']} a call, {r['calls_per_actor']} calls "
             f"at once per actor, {r['writers']} writers) on {r['device']}",
             "| run | rows/s end to end | rows/s steady | vs loop (steady) | check |",
             "|---|---|---|---|---|",
             f"| Session loop, 1 process | {loop['rows_per_s']:.0f} | "
             f"{loop['steady_rows_per_s']:.0f} | 1.00 | - |",
             f"| (loop without writing Parquet) | - | {loop['no_write_rows_per_s']:.0f} | "
             f"{loop['no_write_rows_per_s'] / loop['steady_rows_per_s']:.2f} | - |"]
    for run in r["ray"]:
        steady = run["steady_rows_per_s"]
        ratio = f"{steady / loop['steady_rows_per_s']:.2f}" if steady else "-"
        c = run["check"]
        ok = "ok" if c["ids_equal"] and c["unique"] else "ROWS DIFFER"
        lines.append(f"| Ray Data, {run['actors']} actor(s) | {run['rows_per_s']:.0f} | "
                     f"{steady or 0:.0f} | {ratio} | {ok}, max diff {c['max_abs_diff']} |")
    return "\n".join(lines + stage_table(r))


def stage_table(r: dict) -> list[str]:
    """us/row per stage: the loop's, and each Ray run's (actor stages in actor-seconds, commit
    stages in writer-thread seconds, driver stages in the driver's wall time); and how busy
    each actor's session was while rows streamed (model seconds per actor over the steady
    window, rows / steady rows/s): near 100%, the model is the limit; well below, what feeds
    or drains the actors is."""
    names = ["prepare", "model", "convert", "write", "driver_wait", "driver_split",
             "driver_backpressure", "driver_cpu", "commit_gather", "commit_write"]
    lines = ["\nus/row per stage (actor_*: summed over actors; commit_*: summed over the driver's"
             " writer threads)",
             "| run | " + " | ".join(names) + " | session busy |",
             "|---|" + "---|" * (len(names) + 1)]
    loop = r["loop"]
    runs = [("Session loop", loop["stages"], loop["rows"] / loop["steady_rows_per_s"], 1)] + \
        [(f"Ray Data, {x['actors']} actor(s)", {k.removeprefix("actor_"): v
                                                for k, v in (x["stages"] or {}).items()},
          r["rows"] / x["steady_rows_per_s"] if x["steady_rows_per_s"] else None, x["actors"])
         for x in r["ray"]]
    for name, st, window, actors in runs:
        busy = f"{st['model']['s'] / actors / window:.0%}" if window and "model" in st else "-"
        lines.append(f"| {name} | " + " | ".join(f"{st[n]['us_per_row']:.2f}" if n in st
                                                 else "-" for n in names) + f" | {busy} |")
    return lines

if __name__ == "__main__":
    main()
