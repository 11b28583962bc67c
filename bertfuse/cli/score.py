"""`bertfuse score`: its options (grouped) and the command. Importing this module imports
no Ray: the job does, when it runs."""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any
import math

from bertfuse.cli.args import add_kernels_arg, gpus, int_at_least, stage_lines
from bertfuse.cli.command import Command
from bertfuse.cli.outcome import print_json
from bertfuse.score import score


def _seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


class Score(Command):
    name = "score"
    summary = "score a Parquet corpus offline on Ray Data (embeddings, relevance), one Session per actor"
    example = ("  bertfuse score --model model.onnx --input docs.parquet --output scored/ \\\n"
               "      --text-column text --vocab vocab.txt --key-columns doc_id --json\n"
               "  bertfuse score --model model.onnx --input ids/ --output scored/ --ids-column ids "
               "--address auto")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        g = p.add_argument_group("job")
        g.add_argument("--model", required=True, help="converted .onnx")
        g.add_argument("--input", required=True, help="a Parquet file, or a directory of them")
        g.add_argument("--output", required=True, metavar="OUT",
                       help="output directory (OUT/scores, OUT/rejects); a rerun resumes it")
        g = p.add_argument_group("text input")
        g.add_argument("--text-column", metavar="C", help="a string column, tokenized with --vocab")
        g.add_argument("--text-pair-column", metavar="C2", help="second segment (segment id 1)")
        g.add_argument("--vocab", help="the checkpoint's vocab.txt")
        c = g.add_mutually_exclusive_group()
        c.add_argument("--lower-case", dest="lower_case", action="store_true", default=None,
                       help="lower-case (default: the config, the checkpoint's name, the vocab)")
        c.add_argument("--no-lower-case", dest="lower_case", action="store_false")
        g.add_argument("--truncate", action="store_true",
                       help="cut text longer than --max-seq tokens (default: reject the row)")
        g = p.add_argument_group("ids input")
        g.add_argument("--ids-column", metavar="C", help="a list<int> column of token ids")
        g.add_argument("--mask-column", metavar="C", help="list<int> of 0/1 (default: all ones)")
        g.add_argument("--segment-column", metavar="C", help="list<int> (default: all zeros)")
        g = p.add_argument_group("output columns")
        g.add_argument("--key-columns", metavar="K,...",
                       help="input columns written beside the outputs (default: `row`, the "
                            "input row number)")
        g.add_argument("--outputs", metavar="NAME,...",
                       help="model outputs to write (default pooled_output)")
        g = p.add_argument_group("execution")
        g.add_argument("--actors", type=int_at_least(1),
                       help="scoring actors (default: one per GPU, else half the CPUs)")
        g.add_argument("--gpus", type=gpus, metavar="N|all",
                       help="whole GPUs of this host, an actor on each: the first N that CUDA "
                            "sees (all: every one); the local Ray only (no --address), not "
                            "with --actors")
        g.add_argument("--batch-size", type=int_at_least(1), default=32,
                       help="rows per Session run (default 32, the largest batch bucket)")
        g.add_argument("--max-seq", type=int_at_least(1),
                       help="longest row in tokens (default: the model's positions)")
        g.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                       help="auto: a GPU per actor where the cluster has GPUs")
        add_kernels_arg(g)
        g.add_argument("--address", help="join this Ray cluster ('auto'); default a local Ray")
        g.add_argument("--max-retries", type=int_at_least(0), default=3,
                       help="restarts of a dead actor, and retries of its batches (default 3)")
        g.add_argument("--stall-s", type=_seconds, metavar="S",
                       help="longest wait between two blocks of scored rows before the Ray Data "
                            "run is cancelled and the parts left run again, as after a lost "
                            "node (default: 10x the longest such wait so far, at least 120; a "
                            "run's first rows: 600, then 3x the longest start-up)")
        g.add_argument("--part-rows", type=int_at_least(1), default=8192,
                       help="rows per output file (whole row groups), the unit of restart")

    def run(self, args: argparse.Namespace, console: Any) -> int:
        # plan, ray cluster, score: a line each on a pipe (a terminal has Ray Data's bars).
        # Ray prints the cluster's error messages (an actor killed after a stall: "(raylet)
        # Task ... submit failed"; a worker died) on the driver's stdout whatever log_to_driver
        # says: they go nowhere (Ray's logs keep them, and a failure's one line names those),
        # so that stdout holds only this command's output (a --json report began with one).
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), \
                stage_lines(args, spinner=False) as progress:
            s = score(args.model, args.input, args.output, text_column=args.text_column,
                      text_pair_column=args.text_pair_column, vocab=args.vocab,
                      lower_case=args.lower_case, truncate=args.truncate,
                      ids_column=args.ids_column, mask_column=args.mask_column,
                      segment_column=args.segment_column, key_columns=args.key_columns,
                      outputs=args.outputs, max_seq=args.max_seq, batch_size=args.batch_size,
                      actors=args.actors, device=args.device, address=args.address,
                      max_retries=args.max_retries, part_rows=args.part_rows,
                      kernels=args.kernels, stall_s=args.stall_s, gpus=args.gpus,
                      status=progress,
                      progress=not (args.quiet or args.json))  # -q, --json: no bars
        if args.json:
            print_json("score", s.to_json())
            return 0
        if args.quiet:  # the folder written, nothing else
            console.print(f"wrote {s.output}/scores", markup=False, highlight=False,
                          soft_wrap=True)
            return 0
        skipped = f", {s.parts_skipped} of {s.parts} parts done before" if s.parts_skipped else ""
        console.print(f"scored {s.scored} rows, rejected {s.rejected} (see {s.output}/rejects) of "
                      f"{s.rows}; {s.rows_this_run} rows this run in {s.seconds:.1f} s "
                      f"({s.rows_per_s:.4g} rows/s, {s.actors} {s.device.upper()} actor"
                      f"{'s' if s.actors != 1 else ''}{skipped}) -> "
                      f"{s.output}/scores", markup=False, highlight=False, soft_wrap=True)
        k = s.kernels or {}
        if "used" in k:  # the first actor's KernelChoice (runtime/kernel_choice.py), as its line()
            console.print(f"kernels={k['asked']}: {k['used']} ({k['reason']})", markup=False,
                          highlight=False, soft_wrap=True)
        return 0
