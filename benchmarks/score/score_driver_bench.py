"""The `bertfuse score` driver alone: how many rows a second it can gather and write, with no
model in the way. CPU only (no GPU, no model): run it on the machine whose scoring runs you
want to explain.

    python3 benchmarks/score/score_driver_bench.py --out $OUT                 # 300,000 rows, 768 wide
    python3 benchmarks/score/score_driver_bench.py --rows 100000 --ray 1,2 --out $OUT

Blocks of --block rows shaped as a scoring actor returns them (part and row numbers, an id
key, one [rows, --width] float32 output as list<float>, the reject column, the actor's stage
times), their values fp16-rounded tanh like an fp16 model's pooled_output (--values fp32:
full float32). Then:

  encode   one part's scores file encoded in memory and written to disk, one thread, for the
           Parquet options compared (bertfuse's own first), with its bytes per row
  disk     raw write rate of the output's file system (--work), page cache and fsync'd
  driver   bertfuse.score.job.gather (the job's own loop and commit: split, gather, check,
           encode, write, rename; the job's writer threads) over the blocks: the driver's
           rows/s cap, and us/row per stage
  ray N    (--ray) the same blocks made by N Ray Data actors (map_batches, an integer
           batch_size as on GPUs, 1 CPU each) and consumed by `gather` through
           iter_batches: Ray Data's own cost on the way; no model, so this is the pipeline's
           cap whatever the GPUs do

Logs and score_driver_bench.json under --out.
"""

from __future__ import annotations

import argparse
import json
import logging
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

from bertfuse.score import job as score_job  # noqa: E402
from bertfuse.score import output as score_output  # noqa: E402
from bertfuse.score.actor import _arrow  # noqa: E402
from bertfuse.score.output import PART, REJECT, ROW, OutputDir  # noqa: E402
from bertfuse.score.rows import InputSpec  # noqa: E402
from bertfuse.score.spec import ScoreJob, plan_parts  # noqa: E402
from bertfuse.score.stages import Stages, actor_columns  # noqa: E402

OUTPUT = "pooled_output"


def log(out: Path, text: str) -> None:
    print(text, flush=True)
    with open(out / "score_driver_bench.log", "a") as f:
        f.write(text + "\n")


def values(rows: int, width: int, kind: str, seed: int) -> np.ndarray:
    v = np.tanh(np.random.default_rng(seed).standard_normal((rows, width), dtype=np.float32))
    return v.astype(np.float16).astype(np.float32) if kind == "fp16" else v


def make_job(work: Path, rows: int, part_rows: int) -> ScoreJob:
    """A job over a real input file of `rows` ids (row groups of part_rows: its parts are the
    ones `bertfuse score` plans), whose one output is OUTPUT; no model is read."""
    src = work / "input.parquet"
    pq.write_table(pa.table({"id": np.arange(rows, dtype=np.int64)}), src,
                   row_group_size=part_rows)
    parts, total = plan_parts([str(src)], part_rows)
    stamp = {"path": str(src), "rows": total}
    return ScoreJob(str(work / "no-model.onnx"), str(src), str(work / "out"), [str(src)],
                    InputSpec(64, ids_column="ids"), ["id"], [OUTPUT], {OUTPUT: 2}, parts,
                    total, fingerprint={"model": {}, "inputs": [stamp]})


class BlockMaker:
    """Blocks as Scorer returns them, values from a small pool (made once)."""

    def __init__(self, width: int, kind: str, block: int, part_rows: int) -> None:
        self.pool = [values(block, width, kind, seed) for seed in range(4)]
        self.part_rows, self.convert_s = part_rows, 0.0

    def __call__(self, rows: np.ndarray) -> pa.Table:
        n = len(rows)
        t0 = time.perf_counter()
        col = _arrow(self.pool[int(rows[0]) // n % len(self.pool)][:n], 2, np.ones(n, bool))
        self.convert_s += time.perf_counter() - t0
        return pa.table({PART: rows // self.part_rows, ROW: rows, "id": rows, OUTPUT: col,
                         REJECT: pa.nulls(n, pa.string()),
                         **actor_columns({"convert": 0.0}, n)})


class RayBlocks:
    """Ray Data's actor: the blocks for the row numbers it is given."""

    def __init__(self, width: int, kind: str, block: int, part_rows: int) -> None:
        self.make = BlockMaker(width, kind, block, part_rows)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        return self.make(batch["id"].astype(np.int64))


def encode_options(table: pa.Table, work: Path) -> list[dict]:
    """One part's scores file, encoded in memory and to disk, for each Parquet set-up."""
    plain = [OUTPUT]
    setups = {"bertfuse": score_output.write_options(table, plain),
              "snappy, dictionary+stats on floats (pyarrow default)": {},
              "snappy, dictionary off floats": {"use_dictionary": ["id"]},
              "snappy, dictionary+stats off floats": {"use_dictionary": ["id"],
                                                      "write_statistics": ["id"]},
              "none, dictionary+stats off floats": {"use_dictionary": ["id"],
                                                    "write_statistics": ["id"],
                                                    "compression": "none"},
              "lz4, dictionary+stats off floats": {"use_dictionary": ["id"],
                                                   "write_statistics": ["id"],
                                                   "compression": "lz4"},
              "zstd(1), dictionary+stats off floats": {
                  "use_dictionary": ["id"], "write_statistics": ["id"], "compression": "zstd",
                  "compression_level": 1},
              "byte_stream_split+snappy floats": {
                  "use_dictionary": ["id"], "write_statistics": ["id"],
                  "use_byte_stream_split": [f"{OUTPUT}.list.element"]},
              "byte_stream_split+zstd(1) floats": {
                  "use_dictionary": ["id"], "write_statistics": ["id"], "compression": "zstd",
                  "compression_level": 1, "use_byte_stream_split": [f"{OUTPUT}.list.element"]}}
    res = []
    for name, kw in setups.items():
        mem, disk = [], []
        for _ in range(3):
            sink = pa.BufferOutputStream()
            t0 = time.perf_counter()
            pq.write_table(table, sink, **kw)
            mem.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            pq.write_table(table, work / "encode.parquet", **kw)
            disk.append(time.perf_counter() - t0)
        size = (work / "encode.parquet").stat().st_size
        res.append({"setup": name, "memory_us_per_row": round(min(mem) / table.num_rows * 1e6, 2),
                    "disk_us_per_row": round(min(disk) / table.num_rows * 1e6, 2),
                    "bytes_per_row": round(size / table.num_rows)})
    return res


def disk_rate(work: Path, mb: int = 512) -> dict:
    """MB/s of plain writes to the output's file system: to the page cache, and fsync'd."""
    chunk = np.random.default_rng(0).bytes(8 << 20)
    path = work / "disk.bin"
    res = {}
    for name, sync in (("page_cache_mb_s", False), ("fsync_mb_s", True)):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(mb // 8):
                f.write(chunk)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        res[name] = round(mb / (time.perf_counter() - t0), 1)
        path.unlink()
    return res


def run_gather(job: ScoreJob, blocks, rows: int) -> dict:
    """job.gather over `blocks` into a fresh OUT: wall rows/s and the stages."""
    out = OutputDir(job)
    shutil.rmtree(job.output, ignore_errors=True)
    stages = Stages()
    with out.locked():
        out.start()
        t0 = time.perf_counter()
        timing = score_job._Timing(t0)
        score_job.gather(blocks, out, job, timing, stages)
        wall = time.perf_counter() - t0
    scored, _ = out.counts()
    assert scored == rows, f"{scored} rows written for {rows}"
    size = sum(p.stat().st_size for p in out.scores.glob("part-*.parquet"))
    return {"seconds": round(wall, 3), "rows_per_s": round(rows / wall, 1),
            "first_result_s": timing.result()[0], "steady_rows_per_s": timing.result()[1],
            "bytes_per_row": round(size / rows), "stages": stages.result(rows)}


def ray_blocks(args, n: int):
    import ray
    from ray.data import ActorPoolStrategy

    ds = ray.data.range(args.rows, override_num_blocks=max(1, args.rows // args.block))
    ds = ds.map_batches(RayBlocks, batch_size=args.block, batch_format="numpy",
                        compute=ActorPoolStrategy(
                            size=n, max_concurrent_calls_per_actor=score_job.CALLS_PER_ACTOR,
                            enable_true_multi_threading=True), num_cpus=1,
                        fn_constructor_kwargs={"width": args.width, "kind": args.values,
                                               "block": args.block,
                                               "part_rows": args.part_rows})
    return ds.iter_batches(batch_size=None, batch_format="pyarrow")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="logs and JSON (default $OUT)")
    ap.add_argument("--work", default=None, help="where OUT is written (default: a temp dir)")
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--width", type=int, default=768, help="output floats per row")
    ap.add_argument("--block", type=int, default=2048, help="rows per actor block "
                                                             "(batch 32 x ROWS_PER_TASK 64)")
    ap.add_argument("--part-rows", type=int, default=16384)
    ap.add_argument("--values", choices=("fp16", "fp32"), default="fp16")
    ap.add_argument("--ray", default="", help="actor counts to run through Ray Data, e.g. 1,2")
    args = ap.parse_args()
    if not args.out:
        ap.error("--out (or $OUT) is required")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="score_driver-", dir=args.work))
    try:
        job = make_job(work, args.rows, args.part_rows)
        make = BlockMaker(args.width, args.values, args.block, args.part_rows)
        result = {"rows": args.rows, "width": args.width, "block": args.block,
                  "part_rows": args.part_rows, "values": args.values,
                  "writers": score_job.WRITERS, "cpus": os.cpu_count()}
        part = pa.concat_tables(make(np.arange(s, min(s + args.block, args.part_rows)))
                                for s in range(0, args.part_rows, args.block))
        result["encode"] = encode_options(part.select(["id", OUTPUT]), work)
        for e in result["encode"]:
            log(out, f"encode {e['setup']}: {e['memory_us_per_row']} us/row in memory, "
                     f"{e['disk_us_per_row']} to disk, {e['bytes_per_row']} B/row")
        result["disk"] = disk_rate(work)
        log(out, f"disk {work}: {json.dumps(result['disk'])}")
        make.convert_s = 0.0
        blocks = (make(np.arange(s, min(s + args.block, args.rows)))
                  for s in range(0, args.rows, args.block))
        result["driver"] = run_gather(job, blocks, args.rows)
        result["driver"]["actor_convert_us_per_row"] = round(make.convert_s / args.rows * 1e6, 2)
        log(out, f"driver, no Ray: {json.dumps(result['driver'])}")
        result["ray"] = []
        if args.ray:
            import ray

            counts = [int(c) for c in args.ray.split(",")]
            from ray.data import DataContext

            ray.init(address="local", include_dashboard=False, log_to_driver=False,
                     num_cpus=max(os.cpu_count() or 2, max(counts) + 1),
                     logging_level=logging.WARNING)
            DataContext.get_current().enable_progress_bars = False
            logging.getLogger("ray.data").setLevel(logging.WARNING)
            try:
                for n in counts:
                    run = {"actors": n, **run_gather(job, ray_blocks(args, n), args.rows)}
                    result["ray"].append(run)
                    log(out, f"ray, {n} actor(s): {json.dumps(run)}")
            finally:
                ray.shutdown()
        (out / "score_driver_bench.json").write_text(json.dumps(result, indent=1) + "\n")
        log(out, table(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(r: dict) -> str:
    lines = [f"\ndriver of bertfuse score: {r['rows']} rows x {r['width']} floats "
             f"({r['values']}), blocks of {r['block']}, parts of {r['part_rows']}, "
             f"{r['writers']} writers, {r['cpus']} CPUs",
             "| run | rows/s | steady rows/s | B/row | " + " | ".join(STAGES) + " |",
             "|---|---|---|---|" + "---|" * len(STAGES)]
    for name, run in [("driver, no Ray", r["driver"])] + \
            [(f"Ray Data, {x['actors']} actor(s)", x) for x in r["ray"]]:
        st = run["stages"]
        cells = [f"{st[s]['us_per_row']:.2f}" if s in st else "-" for s in STAGES]
        steady = f"{run['steady_rows_per_s']:.0f}" if "actors" in run else "-"
        lines.append(f"| {name} | {run['rows_per_s']:.0f} | {steady} | {run['bytes_per_row']} | "
                     + " | ".join(cells) + " |")
    lines.append("(stages in us/row; commit_* are writer-thread seconds: divide by "
                 f"{r['writers']} for their share of the wall time at best. Without Ray, rows/s "
                 "(start to last file renamed) is the driver's cap; through Ray Data, steady "
                 "rows/s is the pipeline's without a model)")
    return "\n".join(lines)


STAGES = ("driver_wait", "driver_split", "driver_backpressure", "driver_cpu", "commit_gather",
          "commit_write")

if __name__ == "__main__":
    main()
