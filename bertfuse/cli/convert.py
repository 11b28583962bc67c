"""`bertfuse convert`, `optimize`, `verify` and `strip-weights`: the commands that write or
check a model. The first three print the run report (a table, or JSON with --json) and
then, if the parity check failed, the one-line verdict on stderr; cli.py runs them."""

from __future__ import annotations

import argparse
import json
import os
from typing import Callable

from bertfuse.errors import BertfuseError, ParityError
from bertfuse.cli.render import emit


def cmd_convert(args: argparse.Namespace, console) -> int:
    from bertfuse.pipeline import stages as pipeline

    _check_verify_size(args)  # the output path is checked by pipeline.convert, first thing
    return _run_with_report(args, console, lambda up: pipeline.convert(
        args.source, args.output, _options(args), up))


def cmd_optimize(args: argparse.Namespace, console) -> int:
    from bertfuse.pipeline import stages as pipeline

    target = _target(args)
    return _run_with_report(args, console, lambda up: pipeline.optimize(
        args.model, target, up, args.strict, args.precision, args.packed, args.in_place,
        args.inputs, args.kernels, args.fp8))


def cmd_verify(args: argparse.Namespace, console) -> int:
    from bertfuse.pipeline import stages as pipeline

    _check_verify_size(args)
    return _run_with_report(args, console, lambda up: pipeline.verify(
        args.model, args.against, _options(args), up))


def cmd_strip(args: argparse.Namespace, console) -> int:
    from bertfuse.io.model import load_model, save_model
    from bertfuse.runtime.weights import fill_weights, is_stripped, strip_weights

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
    return emit(args.json, console, {"output": target, verb: count},
                f"{verb} {count} initializers -> {target}")


def _status_printer(args: argparse.Namespace, console) -> tuple[Callable[[str], None] | None, object]:
    """A spinner on stderr naming the running stage (not with --json or when not a TTY)."""
    if args.json or not console.is_terminal:
        return None, None
    status = console.status("starting")
    status.start()
    return (lambda msg: status.update(f"[bold]{msg}[/bold] ...")), status


def _options(args):
    from bertfuse.pipeline.options import ConvertOptions

    return ConvertOptions(
        opset=getattr(args, "opset", 17), signature=args.signature, kind=args.kind,
        inputs=args.inputs, outputs=args.outputs.split(",") if args.outputs is not None else None,
        config=args.config, verify=not getattr(args, "no_verify", False),
        force=getattr(args, "force", False), seed=args.seed, batch=args.batch, seq=args.seq,
        atol=args.atol, rtol=args.rtol,
        strict=getattr(args, "strict", False), fuse=not getattr(args, "no_fuse", False),
        precision=getattr(args, "precision", "fp32"), packed=getattr(args, "packed", False),
        kernels=getattr(args, "kernels", "ort"), fp8=getattr(args, "fp8", False))


def _run_with_report(args, console, fn: Callable) -> int:
    update, spinner = _status_printer(args, console)
    failed: ParityError | None = None
    try:
        report = fn(update)
    except ParityError as exc:
        failed, report = exc, exc.report
    finally:
        if spinner is not None:
            spinner.stop()
    if report is not None:
        _show(args, console, report)
    if failed is not None:
        raise failed  # after the report: what drifted on stdout, the one-line error on stderr
    if report.parity is not None and not report.parity.ok:
        # verify, or convert --force: the report is out, the verdict goes on stderr too
        from bertfuse.pipeline.gate import parity_failure

        raise ParityError(f"parity check failed, {parity_failure(report.parity)}")
    return 0


def _show(args, console, report) -> None:
    from bertfuse.cli.render import print_report

    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print_report(report, console)


def _target(args) -> str:
    """-o, or with --in-place the model itself (a symlink's target, never the link)."""
    from bertfuse.io.safety import check_output, check_replaceable

    if not args.in_place:
        check_output(args.output, [args.model])
        return args.output
    target = os.path.realpath(args.model)
    if not os.path.exists(target):
        raise BertfuseError(f"{args.model}: no such file")
    check_replaceable(target)
    return target


def _check_verify_size(args) -> None:
    """Random verification inputs past this many tokens only exhaust memory."""
    from bertfuse.pipeline.options import check_verify_size

    check_verify_size(getattr(args, "batch", 1), getattr(args, "seq", 1))
