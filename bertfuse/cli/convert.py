"""`bertfuse convert`, `optimize`, `verify` and `strip-weights`: the commands that write or
check a model. The first three print the run report (a table, or JSON with --json) and
then, if the parity check failed, the one-line verdict on stderr. Their options are the
option table's (pipeline/options.py), grouped as options.GROUPS says."""

from __future__ import annotations

import argparse
import os
from typing import Callable

from bertfuse.cli.args import (add_kernels_arg, add_options, add_write_target, int_at_least,
                               options_from_args, stage_lines)
from bertfuse.cli.command import Command
from bertfuse.cli.render import emit
from bertfuse.errors import BertfuseError, FusionIncomplete, ParityError
from bertfuse.cli.outcome import print_json
from bertfuse.cli.render import print_quiet, print_report
from bertfuse.io.model import load_model, save_model
from bertfuse.io.safety import check_output, check_replaceable
from bertfuse.pipeline import stages
from bertfuse.pipeline.gate import parity_failure
from bertfuse.pipeline.options import GROUPS, check_verify_size
from bertfuse.runtime.weights import fill_weights, is_stripped, strip_weights


def _add_source_options(p: argparse.ArgumentParser) -> None:
    add_options(p, "TF source", GROUPS["TF source"])


class Convert(Command):
    name = "convert"
    summary = "TF BERT -> fused ONNX, verified against TF"
    example = ("  bertfuse convert out/tiny -o tiny.onnx\n"
               "  bertfuse convert saved_model/ -o model_fp16.onnx --precision fp16 \\\n"
               "      --inputs input_ids=ids,input_mask=mask,segment_ids=types --json\n"
               "  bertfuse convert hf_bert/model -o bert.onnx --load-inputs reference.npz "
               "--load-outputs reference.npz")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("source", help="checkpoint dir/prefix, SavedModel dir, .pb, or .keras")
        p.add_argument("-o", "--output", required=True, help="output .onnx")
        for title in ("TF source", "conversion", "fusion", "verification", "parity gate",
                      "parity data", "writing"):
            add_options(p, title, GROUPS[title])

    def run(self, args: argparse.Namespace, console) -> int:
        opts = options_from_args(args)
        _check_verify_size(opts)  # the output path is checked by stages.convert, first thing
        return _run_with_report(args, console, lambda up: stages.convert(
            args.source, args.output, opts, up))


class Optimize(Command):
    name = "optimize"
    summary = "run the fusion passes on a raw tf2onnx model, verified against it"
    example = ("  python -m tf2onnx.convert --saved-model sm/ --opset 17 --output raw.onnx\n"
               "  bertfuse optimize raw.onnx -o fused.onnx \\\n"
               "      --inputs input_ids=input_word_ids,segment_ids=input_type_ids")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="raw ONNX exported by tf2onnx")
        add_write_target(p, "output .onnx")
        add_options(p, "fusion", GROUPS["fusion"])
        # parity: the fused model against MODEL itself, both in ONNX Runtime on the CPU
        add_options(p, "verification (against MODEL, in ONNX Runtime)", GROUPS["verification"])
        add_options(p, "parity gate", GROUPS["parity gate"])
        add_options(p, "writing", GROUPS["writing"])
        p.add_argument_group("interface").add_argument(
            "--inputs", metavar="ROLE=NAME,...",
            help="rename the inputs to input_ids, input_mask, segment_ids (int32), as "
                 "bertfuse's Session takes them; inputs not named are recognised by name, "
                 "e.g. input_ids=input_word_ids,segment_ids=input_type_ids")

    def run(self, args: argparse.Namespace, console) -> int:
        target = _target(args)
        opts = options_from_args(args)
        _check_verify_size(opts)
        return _run_with_report(args, console, lambda up: stages.optimize(
            args.model, target, up, opts, args.in_place))


class Verify(Command):
    name = "verify"
    summary = "compare an ONNX model with its TF source"
    example = ("  bertfuse verify tiny.onnx --against out/tiny --batch 2 --seq 64\n"
               "  bertfuse verify tiny.onnx --against out/tiny --text-file queries.tsv "
               "--vocab out/tiny/vocab.txt \\\n      --save-inputs in.npz --save-outputs tf.npz\n"
               "  bertfuse verify tiny.onnx --load-inputs in.npz --load-outputs tf.npz   "
               "# no TensorFlow\n"
               "  bertfuse verify fp16.onnx --against out/tiny --device cuda --kernels bertfuse  "
               "# bertfuse's ops vs TF")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="ONNX model")
        p.add_argument("--against", help="the TF source (or --load-outputs: saved outputs)")
        add_options(p, "TF source", GROUPS["TF source"])
        add_options(p, "verification", GROUPS["verification"])
        add_options(p, "parity data", GROUPS["parity data"])
        g = p.add_argument_group("where the model runs")
        g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="auto (default): cuda where onnxruntime has the CUDA EP, else cpu")
        # dest: ConvertOptions.kernels is convert's (ort|bertfuse, written into the model)
        add_kernels_arg(g, dest="session_kernels")

    def run(self, args: argparse.Namespace, console) -> int:
        opts = options_from_args(args)
        _check_verify_size(opts)
        return _run_with_report(args, console, lambda up: stages.verify(
            args.model, args.against, opts, up, device=args.device,
            kernels=args.session_kernels))


class StripWeights(Command):
    name = "strip-weights"
    summary = "drop large initializers' bytes (keep shape/dtype)"
    example = ("  bertfuse strip-weights model.onnx -o skeleton.onnx\n"
               "  bertfuse strip-weights skeleton.onnx -o filled.onnx --fill 0")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="ONNX model")
        add_write_target(p, "output skeleton .onnx")
        p.add_argument("--fill", type=int_at_least(0), metavar="SEED",
                       help="instead: refill a stripped model with seeded random weights")

    def run(self, args: argparse.Namespace, console) -> int:
        target = _target(args)
        model = load_model(args.model)
        if args.fill is not None:
            if not is_stripped(model):
                raise BertfuseError(f"{args.model}: not a stripped model (no bertfuse_stripped "
                                    f"metadata)")
            count, verb = fill_weights(model, args.fill), "refilled"
        else:
            count, verb = strip_weights(model), "stripped"
        save_model(model, target)
        return emit(args, console, {"output": target, verb: count},
                    f"{verb} {count} initializers -> {target}")


def _run_with_report(args, console, fn: Callable) -> int:
    """fn(status) -> the report; status: the stage progress on stderr (a line per stage
    when stderr is not a terminal, a spinner when it is; -q: none). A refusal that carries
    the run so far (parity, --strict) leaves its report to the CLI: with --json, the report
    with ok false and the error (cli/outcome.py); else the tables, then the line."""
    progress = stage_lines(args)
    ok = False
    try:
        report = fn(progress)
        ok = True
    except (ParityError, FusionIncomplete) as exc:
        ok = isinstance(exc, ParityError)  # the stages ran; the verdict follows
        if exc.report is not None and not args.json:
            _show(args, console, exc.report)
        raise
    finally:
        progress.close(ok)
    if report.parity is not None and not report.parity.ok:
        # verify, or convert --force: the verdict goes on stderr, with the report

        if not args.json:
            _show(args, console, report)
        raise ParityError(f"parity check failed, {parity_failure(report.parity)}", report)
    _show(args, console, report)
    return 0


def _show(args, console, report) -> None:
    if args.json:
        print_json(args.command, report.to_json())
    elif args.quiet:
        print_quiet(report, console)
    else:
        print_report(report, console)


def _target(args) -> str:
    """-o, or with --in-place the model itself (a symlink's target, never the link)."""
    if not args.in_place:
        check_output(args.output, [args.model])
        return args.output
    target = os.path.realpath(args.model)
    if not os.path.exists(target):
        raise BertfuseError(f"{args.model}: no such file")
    check_replaceable(target)
    return target


def _check_verify_size(opts) -> None:
    """Random verification inputs past this many tokens only exhaust memory."""
    check_verify_size(opts.batch, opts.seq)
