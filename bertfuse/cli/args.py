"""Argument types and the groups several commands share; the convert options' groups are
read from the option table (pipeline/options.py), so a flag's default, choices and help are
written once."""

from __future__ import annotations

import argparse
import math
from typing import Callable, Sequence
from dataclasses import fields

from bertfuse.errors import BertfuseError, UsageError
from bertfuse.gpu_plan import check_gpus
from bertfuse.cli.renamed import add_renamed
from bertfuse.pipeline.options import ConvertOptions, OPTIONS, RENAMED
from bertfuse.runtime.kernel_choice import KERNELS
from bertfuse.runtime.progress import NORMAL, QUIET, StageLines, VERBOSE


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (exit 2) instead of usage + message."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


def gpus(text: str) -> int | str:
    """--gpus: a whole number of GPUs >= 1, or 'all'."""
    try:
        return check_gpus(text)
    except BertfuseError:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs (1 or more) or "
                                         f"'all', got {text!r}") from None


def tolerance(text: str) -> float:
    """A finite, non-negative float: a NaN tolerance would let every NaN output pass."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def add_output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true",
                   help="print the report as JSON on stdout, on every exit (with ok, and "
                        "error when it failed; docs/json-reports.md)")
    g.add_argument("--debug", action="store_true", help="show tracebacks")
    g.add_argument("--log-level", choices=("error", "warning", "info", "debug"),
                   help="the libraries' own log lines (TensorFlow, tf2onnx, ONNX Runtime, Ray): "
                        "default warning, error with -q or --json; info and debug also let "
                        "TensorFlow's and ONNX Runtime's C++ lines through")
    v = g.add_mutually_exclusive_group()
    v.add_argument("-q", "--quiet", action="store_true",
                   help="only errors and the path written: no report tables, no progress "
                        "(--json implies no progress, unless -v)")
    v.add_argument("-v", "--verbose", action="store_true",
                   help="progress with each sub-step (each pass, each replica)")


def verbosity(args: argparse.Namespace) -> int:
    """runtime/progress.py's QUIET, NORMAL or VERBOSE from -q / -v / --json."""
    if getattr(args, "verbose", False):
        return VERBOSE
    return QUIET if getattr(args, "quiet", False) or getattr(args, "json", False) else NORMAL


def stage_lines(args: argparse.Namespace, command: str | None = None, spinner: bool = True):
    """The command's progress on stderr (runtime/progress.py's StageLines). spinner=False:
    nothing on a terminal, where something else draws there (score: Ray Data's bars)."""
    lines = StageLines(command or args.command, verbosity(args))
    if lines.tty and not spinner:
        lines.verbosity = QUIET
    return lines


def add_kernels_arg(g: argparse._ActionsContainer, dest: str = "kernels") -> None:
    """--kernels auto|ort|bertfuse: which kernels a Session on this machine runs
    (runtime/kernel_choice.py), for the commands that open one (serve, score, verify)."""
    g.add_argument("--kernels", dest=dest, choices=KERNELS, default="auto",
                   help="auto (default): on CUDA, bertfuse's own ops where the op library is "
                        "here (or builds) and a check on the device agrees, else ONNX "
                        "Runtime's contrib ops, with a line saying why; ort: the contrib ops; "
                        "bertfuse: bertfuse's ops or an error (CUDA only)")


def add_write_target(p: argparse.ArgumentParser, what: str) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-o", "--output", help=f"{what} (never one of the inputs)")
    g.add_argument("--in-place", action="store_true",
                   help="rewrite MODEL itself: a temp file beside it replaces it after success")


def add_options(p: argparse.ArgumentParser, title: str, names: Sequence[str]) -> None:
    """One argparse group of convert options, from the table: `dest` is the option's name,
    so `options_from_args` reads them back by name."""
    g = p.add_argument_group(title)
    for name in names:
        o = OPTIONS[name]
        kw: dict = {"dest": name, "help": o.flag_help}
        if name in RENAMED:  # the old flag and values too, with a deprecation line
            add_renamed(g, RENAMED[name], o.choices, default=o.default, **kw)
            continue
        if o.cli_type == "flag":
            kw.update(action="store_false" if o.default is True else "store_true")
        else:
            kw["default"] = o.default
            if o.choices:
                kw["choices"] = o.choices
            if o.metavar:
                kw["metavar"] = o.metavar
            if o.cli_type == "int":
                # --opset takes any int: the stages name tf2onnx's supported opsets instead
                kw["type"] = int if name == "opset" else int_at_least(o.low)
            elif o.cli_type == "tolerance":
                kw["type"] = tolerance
        g.add_argument(o.cli_flag, **kw)


def options_from_args(args: argparse.Namespace):
    """ConvertOptions from the parsed flags: the options a command does not offer keep the
    table's defaults."""
    values = {f.name: getattr(args, f.name) for f in fields(ConvertOptions)
              if hasattr(args, f.name)}
    if values.get("outputs") is not None and OPTIONS["outputs"].cli_type == "list":
        values["outputs"] = values["outputs"].split(",")
    return ConvertOptions(**values)
