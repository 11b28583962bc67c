"""What the multi-GPU benchmarks share (benchmarks/serve/multi_gpu.py, benchmarks/score/
multi_gpu.py): their common options, the N values a host can run, the report's head, the
scaling cells of a table against N=1, and the report written as JSON beside its table."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from bertfuse.gpu_plan import read_smi, visible_gpus


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """--model, --gpus-list, --device and --out, as both benchmarks take them."""
    ap.add_argument("--model", required=True, help="a fused .onnx (bertfuse convert)")
    ap.add_argument("--gpus-list", default="1,2,4,8", help="N values (capped at the GPUs seen)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))


def gpu_counts(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[int], int]:
    """(the N values to run, the GPUs CUDA sees): on the GPU, N past the GPUs seen is left
    out (none left: the parser's error); on the CPU every N (N CPU replicas or actors)."""
    wanted = [int(x) for x in args.gpus_list.split(",") if x]
    seen = len(visible_gpus(read_smi(), os.environ.get("CUDA_VISIBLE_DEVICES")))
    ns = wanted if args.device == "cpu" else [n for n in wanted if n <= seen]
    if not ns:
        ap.error(f"no N of {wanted} fits the {seen} GPUs CUDA sees")
    return ns, seen


def report_head(argv: list[str] | None, model: str, machine: str, **more: object) -> dict:
    """The report's date, machine, model and command line, then `more` and empty results."""
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine,
            "model": os.path.basename(model),
            "command": " ".join([os.path.basename(sys.argv[0]), *(argv or sys.argv[1:])]),
            **more, "results": []}


def versus_one(x: float | None, n: int) -> tuple[str, str]:
    """A rate's cells against N=1: the ratio, and its share of the 0.9 x N target."""
    return (f"{x:.2f}", f"{x / (0.9 * n):.0%}") if x else ("-", "-")


def write_report(report: dict, out: str, name: str, table: str | None = None) -> str:
    """`report` as out/name (the folder made), its path printed, then `table` if given."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}" + (f"\n{table}" if table else ""))
    return path
