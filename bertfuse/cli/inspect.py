"""`bertfuse inspect`, `summarize`, `diff` and `draw`: the graph checks and pictures of this
package as commands. Each reads models or summaries and writes at most
one new file, checked first by bertfuse/io/safety.py."""

from __future__ import annotations

import argparse
import os
import sys

from bertfuse.cli.args import add_options, int_at_least, tolerance
from bertfuse.cli.command import Command
from bertfuse.cli.outcome import error_object, print_json
from bertfuse.cli.render import emit
from bertfuse.errors import BertfuseError
from bertfuse.cli.args import options_from_args
from bertfuse.inspect.diff import (diff_markdown, diff_summaries, diff_text, diff_verdict,
                                   parse_fail_on)
from bertfuse.inspect.diff_numeric import add_numeric, numeric_diff
from bertfuse.inspect.draw import render, to_dot
from bertfuse.inspect.summary import (dumps, load_light, load_summary, print_summary, summarize,
                                      summary_markdown)
from bertfuse.io.safety import check_output, write_text
from bertfuse.pipeline.data import ParityData
from bertfuse.pipeline.options import check_verify_size


class Inspect(Command):
    name = "inspect"
    summary = ("I/O, opsets, op histogram, weight bytes, encoder table (weights are not read)")
    example = ("  bertfuse inspect model.onnx --markdown >> \"$GITHUB_STEP_SUMMARY\"")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="ONNX model")
        p.add_argument("--markdown", action="store_true", help="print Markdown (for a PR comment)")

    def run(self, args: argparse.Namespace, console) -> int:
        summary = summarize(args.model)
        if args.json:
            print_json("inspect", summary)
        elif args.markdown:
            print(summary_markdown(summary, args.model), end="")
        else:
            print_summary(summary, console, args.model)
        return 0


class Summarize(Command):
    name = "summarize"
    summary = ("small, stable JSON summary of a model (a golden file)")
    example = ("  bertfuse summarize model.onnx -o model.summary.json")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="ONNX model")
        p.add_argument("-o", "--output", help="summary .json (default: stdout)")

    def run(self, args: argparse.Namespace, console) -> int:
        if args.output:
            check_output(args.output, [args.model], model=False)
        summary = summarize(args.model)
        if not args.output:
            if args.json:  # the report, the summary in it (without --json: the summary alone)
                print_json("summarize", {"output": None, "summary": summary})
            else:
                sys.stdout.write(dumps(summary))
            return 0
        text = dumps(summary)
        write_text(args.output, text)
        return emit(args, console, {"output": args.output}, f"wrote summary to {args.output}")


class Diff(Command):
    name = "diff"
    summary = ("what changed between two models or summaries (exit 1 when --fail-on matches)")
    example = ("  bertfuse diff model.summary.json model.onnx --fail-on fusion-loss,io-change\n"
               "  bertfuse diff old.onnx new.onnx --numeric --atol 1e-3")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("a", help="model .onnx or summary .json (the baseline)")
        p.add_argument("b", help="model .onnx or summary .json (the candidate)")
        g = p.add_argument_group("policy")
        g.add_argument("--fail-on", metavar="CATS",
                       help="comma-separated: fusion-loss, io-change, opset-change, op-change, "
                            "init-change, numeric; all; none (default: fusion-loss,io-change,"
                            "numeric)")
        g = p.add_argument_group("numeric")
        g.add_argument("--numeric", action="store_true",
                       help="also run both models (ORT CPU) on the same inputs (random padded, or "
                            "--load-inputs / --text-file)")
        g.add_argument("--atol", type=tolerance, default=1e-3,
                       help="numeric: max |diff| allowed (NaN/Inf always fail)")
        add_options(p, "numeric inputs", ("batch", "seq", "seed", "load_inputs", "text_file",
                                          "vocab", "save_inputs", "save_outputs"))
        p.add_argument("--markdown", action="store_true", help="print Markdown (for a PR comment)")

    def run(self, args: argparse.Namespace, console) -> int:
        if args.numeric:
            check_verify_size(args.batch, args.seq)
        fail_on = parse_fail_on(args.fail_on)
        a, b = load_summary(args.a), load_summary(args.b)
        result = diff_summaries(a, b, args.a, args.b, fail_on)
        if args.numeric:
            for path in (args.a, args.b):
                if _is_summary(path):
                    raise BertfuseError(f"{path}: --numeric needs two models, not a summary")
            base, kept, data = _numeric_data(args)
            if base is not None:
                args.batch, args.seq = base["input_ids"].shape
            add_numeric(result, numeric_diff(args.a, args.b, args.batch, args.seq, args.seed,
                                             base, kept), args.atol, args.batch, args.seq)
            if data is not None:
                data.save(base if base is not None else {}, *kept)
        if args.json:
            error = None
            if result.exit_code:  # the findings --fail-on names: exit 1, ok false
                error = error_object("fail_on", diff_verdict(result), result.exit_code)
            print_json("diff", result.to_json(), error)
        elif args.markdown:
            print(diff_markdown(result), end="")
        else:
            sys.stdout.write(diff_text(result))
        return result.exit_code


def _numeric_data(args):
    """diff --numeric on the user's inputs (pipeline/data.py): (feeds by role or None, a list
    for both models' outputs, the ParityData or None)."""
    data = ParityData.from_options(options_from_args(args))
    if data is None:
        return None, None, None
    if data.save_inputs and not data.has_inputs:
        raise BertfuseError("diff --save-inputs saves --load-inputs/--text-file inputs; "
                            "the random ones are made again from --seed")
    data.check_targets([args.a, args.b])
    base = data.feeds({}, None, args.a) if data.has_inputs else None
    return base, [], data


def _is_summary(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(64).lstrip().startswith(b"{")


class Draw(Command):
    name = "draw"
    summary = ("one encoder layer as a picture (Graphviz dot)")
    example = ("  bertfuse draw model.onnx --layer 0 --before raw.onnx -o layer0.svg")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="ONNX model")
        p.add_argument("--layer", type=int_at_least(0), default=0, help="encoder layer (default 0)")
        p.add_argument("--before", metavar="RAW.onnx", help="draw this model's layer beside it")
        p.add_argument("-o", "--output", required=True, help="picture: .svg, .png, or .dot")

    def run(self, args: argparse.Namespace, console) -> int:
        check_output(args.output, [args.model, args.before], model=False)
        model = load_light(args.model)
        before = load_light(args.before) if args.before else None
        dot = to_dot(model, args.layer, before, name=os.path.basename(args.model),
                     before_name=os.path.basename(args.before) if args.before else "raw")
        out = render(dot, args.output)
        return emit(args, console, {"output": str(out), "layer": args.layer},
                    f"drew layer {args.layer} to {out}")
