"""`bertfuse score --gpus N` for N in a list: how offline scoring scales over the GPUs of one
host. One Parquet corpus of --rows-per-gpu x the largest N rows (ids of lengths uniform in
[--min-len, --seq], score_bench.py's make_input), sized so that each N takes about the same
time per GPU (a minute at the default on shenma-3l fp16); each N scores all of it, in a fresh
`bertfuse score --json` process (its own local Ray; on the CPU, `--device cpu --actors N`
stands in for N GPUs). Per N: rows/s end to end and steady (the summary's), the scaling of
steady rows/s (end to end where a run had one block) against N=1 (target >= 0.9 x N), and
the host's CPU per 1,000 rows (psutil's busy time of the whole host over the run: the
driver, Ray, the actors).

    python benchmarks/score/multi_gpu.py --model model.onnx --gpus-list 1,2,4,8
    python benchmarks/score/multi_gpu.py --model tiny.onnx --device cpu --smoke   # a check

N past the GPUs CUDA sees is left out. Writes $OUT/score_multi_gpu.json (--out, default $OUT
or .) and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from score_bench import ROOT, make_input  # noqa: E402

from bertfuse.bench.scaling import (add_arguments, gpu_counts, report_head,  # noqa: E402
                                    versus_one, write_report)


def _host_busy() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def one_n(args, n: int, corpus: Path, work: Path) -> dict:
    place = ["--device", "cpu", "--actors", str(n)] if args.device == "cpu" \
        else ["--gpus", str(n)]
    out = work / f"out_{n}"
    cmd = [sys.executable, "-m", "bertfuse", "score", "--model", args.model, "--input",
           str(corpus), "--output", str(out), "--ids-column", "ids", "--key-columns", "id",
           "--batch-size", str(args.batch_size), "--json", *place]
    busy, start = _host_busy(), time.monotonic()
    ran = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall, busy = time.monotonic() - start, _host_busy() - busy
    if ran.returncode:
        raise RuntimeError(f"N={n}: exit {ran.returncode}: {ran.stderr[-1500:]}")
    s = json.loads(ran.stdout)
    shutil.rmtree(out, ignore_errors=True)
    return {"n": n, "device": s["device"], "actors": s["actors"], "gpus": s.get("gpus"),
            "rows": s["rows_this_run"], "seconds": s["seconds"], "rows_per_s": s["rows_per_s"],
            "steady_rows_per_s": s["steady_rows_per_s"], "first_result_s": s["first_result_s"],
            "wall_s": round(wall, 2),
            "host_cpu_ms_per_1k_rows": round(busy * 1e6 / max(1, s["rows_this_run"]), 2)}


def table(results: list[dict]) -> str:
    def rate(r: dict) -> float:  # steady where the run had more than one block of rows
        return r["steady_rows_per_s"] or r["rows_per_s"]

    base = rate(results[0]) if results and results[0]["n"] == 1 else None
    lines = ["| N | actors | rows | rows/s (end to end) | rows/s (steady) | x N=1 | of 0.9 x N "
             "| host CPU ms / 1k rows |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        x = rate(r) / base if base else None
        xs, eff = versus_one(x, r["n"])
        lines.append(f"| {r['n']} | {r['actors']} | {r['rows']:,} | {r['rows_per_s']:,.0f} | "
                     f"{r['steady_rows_per_s'] or '-'} | {xs} | {eff} | "
                     f"{r['host_cpu_ms_per_1k_rows']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--rows-per-gpu", type=int, default=2_000_000,
                    help="corpus rows per GPU of the largest N (default: about a minute "
                         "per GPU for shenma-3l fp16 on an H100)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=30522, help="ids drawn below this")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="each N's bound")
    ap.add_argument("--smoke", action="store_true",
                    help="a check, not a measurement: 2,000 rows of s16")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows_per_gpu, args.seq, args.min_len = 2000, 16, 4
        args.vocab = min(args.vocab, 1000)  # within any BERT vocabulary, the tiny ones too
    ns, seen = gpu_counts(ap, args)
    work = Path(tempfile.mkdtemp(prefix="score_multi_gpu_"))
    try:
        corpus = work / "corpus.parquet"
        rows = args.rows_per_gpu * max(ns)
        make_input(corpus, rows, args.seq, args.min_len, args.vocab, 8192)
        report = report_head(argv, args.model,
                             f"{os.uname().machine}, {os.cpu_count()} CPUs, {seen} GPUs",
                             corpus={"rows": rows, "seq": args.seq, "min_len": args.min_len})
        for n in ns:
            report["results"].append(one_n(args, n, corpus, work))
            print(json.dumps(report["results"][-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_report(report, args.out, "score_multi_gpu.json", table(report["results"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
