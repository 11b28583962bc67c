"""bertfuse command line: one entry point, subcommands, grouped options, --json for CI."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from typing import Callable

from bertfuse.cli_parser import build_parser  # noqa: F401  (tests and tools import it here)
from bertfuse.errors import BertfuseError, ParityError, UsageError, library_error_message, \
    missing_dependency_message


def _status_printer(args: argparse.Namespace, console) -> tuple[Callable[[str], None] | None, object]:
    """A spinner on stderr naming the running stage (not with --json or when not a TTY)."""
    if args.json or not console.is_terminal:
        return None, None
    status = console.status("starting")
    status.start()
    return (lambda msg: status.update(f"[bold]{msg}[/bold] ...")), status


def _cmd_example(args, console) -> int:
    from bertfuse.converter.example import write_example

    out = write_example(args.config, args.output, seed=args.seed, head=args.head,
                        hidden_act=args.hidden_act)
    if args.json:
        print(json.dumps({"output": str(out), "config": args.config}))
    else:
        console.print(f"wrote {args.config} example to {out}", markup=False, highlight=False,
                      soft_wrap=True)
    return 0


def _options(args):
    from bertfuse.pipeline import ConvertOptions

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
        from bertfuse.pipeline import parity_failure

        raise ParityError(f"parity check failed, {parity_failure(report.parity)}")
    return 0


def _show(args, console, report) -> None:
    from bertfuse.report import print_report

    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print_report(report, console)


def _cmd_convert(args, console) -> int:
    from bertfuse import pipeline

    _check_verify_size(args)  # the output path is checked by pipeline.convert, first thing
    return _run_with_report(args, console, lambda up: pipeline.convert(
        args.source, args.output, _options(args), up))


def _target(args) -> str:
    """-o, or with --in-place the model itself (a symlink's target, never the link)."""
    if not args.in_place:
        _check_output_path(args.output, [args.model])
        return args.output
    from bertfuse.safety import check_replaceable

    target = os.path.realpath(args.model)
    if not os.path.exists(target):
        raise BertfuseError(f"{args.model}: no such file")
    check_replaceable(target)
    return target


def _check_verify_size(args) -> None:
    """Random verification inputs past this many tokens only exhaust memory."""
    from bertfuse.pipeline import check_verify_size

    check_verify_size(getattr(args, "batch", 1), getattr(args, "seq", 1))


def _cmd_optimize(args, console) -> int:
    from bertfuse import pipeline

    target = _target(args)
    return _run_with_report(args, console, lambda up: pipeline.optimize(
        args.model, target, up, args.strict, args.precision, args.packed, args.in_place,
        args.inputs, args.kernels, args.fp8))


def _cmd_verify(args, console) -> int:
    from bertfuse import pipeline

    _check_verify_size(args)
    return _run_with_report(args, console, lambda up: pipeline.verify(
        args.model, args.against, _options(args), up))


def _cmd_strip(args, console) -> int:
    from bertfuse.modelio import load_model, save_model
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
    if args.json:
        print(json.dumps({"output": target, verb: count}))
    else:
        console.print(f"{verb} {count} initializers -> {target}", markup=False, highlight=False,
                      soft_wrap=True)
    return 0


def _cmd_inspect(args, console) -> int:
    from bertfuse.inspect.summary import print_summary, summarize, summary_markdown

    summary = summarize(args.model)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    elif args.markdown:
        print(summary_markdown(summary, args.model), end="")
    else:
        print_summary(summary, console, args.model)
    return 0


def _cmd_summarize(args, console) -> int:
    from bertfuse.inspect.summary import dumps, summarize

    from bertfuse.safety import write_text

    if args.output:
        _check_output_path(args.output, [args.model], model=False)
    text = dumps(summarize(args.model))
    if not args.output:
        sys.stdout.write(text)
        return 0
    write_text(args.output, text)
    if args.json:
        print(json.dumps({"output": args.output}))
    else:
        console.print(f"wrote summary to {args.output}", markup=False, highlight=False,
                      soft_wrap=True)
    return 0


def _cmd_diff(args, console) -> int:
    from bertfuse.inspect.diff import add_numeric, diff_markdown, diff_summaries, diff_text, \
        numeric_diff, parse_fail_on
    from bertfuse.inspect.summary import load_summary

    if args.numeric:
        _check_verify_size(args)
    fail_on = parse_fail_on(args.fail_on)
    a, b = load_summary(args.a), load_summary(args.b)
    result = diff_summaries(a, b, args.a, args.b, fail_on)
    if args.numeric:
        for path in (args.a, args.b):
            if _is_summary(path):
                raise BertfuseError(f"{path}: --numeric needs two models, not a summary")
        add_numeric(result, numeric_diff(args.a, args.b, args.batch, args.seq, args.seed),
                    args.atol, args.batch, args.seq)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    elif args.markdown:
        print(diff_markdown(result), end="")
    else:
        sys.stdout.write(diff_text(result))
    return result.exit_code


def _is_summary(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(64).lstrip().startswith(b"{")


def _cmd_draw(args, console) -> int:
    from bertfuse.inspect.draw import render, to_dot
    from bertfuse.inspect.summary import load_light

    _check_output_path(args.output, [args.model, args.before], model=False)
    model = load_light(args.model)
    before = load_light(args.before) if args.before else None
    dot = to_dot(model, args.layer, before, name=os.path.basename(args.model),
                 before_name=os.path.basename(args.before) if args.before else "raw")
    out = render(dot, args.output)
    if args.json:
        print(json.dumps({"output": str(out), "layer": args.layer}))
    else:
        console.print(f"drew layer {args.layer} to {out}", markup=False, highlight=False,
                      soft_wrap=True)
    return 0


def _check_output_path(path: str, inputs: list[str | None] = (), source_dirs: list[str] = (),
                       model: bool = True) -> None:
    """Refuses an output that is an input, lies in a source directory, or is not a regular
    file (bertfuse/safety.py)."""
    from bertfuse.safety import check_output

    check_output(path, inputs, source_dirs, model)


def _cmd_bench(args, console) -> int:
    from bertfuse.bench.command import run

    return run(args)


def _cmd_kernels(args, console) -> int:
    from bertfuse.kernels_command import run

    return run(args, console)


def _cmd_tokenize(args, console) -> int:
    from bertfuse.text import WordPiece

    tok = WordPiece(args.vocab, lower_case=args.lower_case, max_length=args.max_length,
                    model=args.model)
    if args.pair is not None and len(args.pair) != len(args.text):
        raise BertfuseError(f"{len(args.text)} texts but {len(args.pair)} --pair")
    batch = tok(args.text, args.pair)
    if args.json:
        print(json.dumps({**{k: v.tolist() for k, v in batch.feeds().items()},
                          "lower_case": tok.lower_case, "max_length": tok.max_length}))
        return 0
    for i, text in enumerate(args.text):
        pieces = tok.tokens(text, args.pair[i] if args.pair else None)
        console.print(" ".join(pieces), markup=False, highlight=False, soft_wrap=True)
        console.print(" ".join(map(str, batch.input_ids[i][batch.input_mask[i] > 0])),
                      markup=False, highlight=False, soft_wrap=True)
    return 0


def _cmd_export_triton(args, console) -> int:
    from bertfuse.triton import export_triton

    out = export_triton(args.model, args.output, args.name, args.max_batch, args.instances,
                        args.kind, args.dynamic_batching_delay_us, args.force,
                        args.cuda_graphs, args.intra_op_threads)
    if args.json:
        print(json.dumps(out.to_json(), indent=2))
    else:
        console.print(f"wrote {out.name} ({out.precision}) to {out.config} and {out.model}",
                      markup=False, highlight=False, soft_wrap=True)
    return 0


def _cmd_serve(args, console) -> int:
    from bertfuse.serve.command import run

    return run(args, console)


COMMANDS = {"bench": _cmd_bench, "kernels": _cmd_kernels,
            "example": _cmd_example, "convert": _cmd_convert, "optimize": _cmd_optimize,
            "verify": _cmd_verify, "strip-weights": _cmd_strip, "inspect": _cmd_inspect,
            "summarize": _cmd_summarize, "diff": _cmd_diff, "draw": _cmd_draw,
            "tokenize": _cmd_tokenize, "export-triton": _cmd_export_triton,
            "serve": _cmd_serve}


def _cmd_score(args, console) -> int:
    from bertfuse.score.command import run

    return run(args, console)


COMMANDS["score"] = _cmd_score


# Arguments that name files or directories a command reads (example's --config is a name).
_READ_ARGS = ("source", "model", "a", "b", "before", "against", "config")


def _refuse_special_inputs(args) -> None:
    """An input that is a fifo, socket or device would block (a fifo) or never end
    (/dev/zero): bad input, refused before anything opens it."""
    if args.command == "example":
        return
    for name in _READ_ARGS:
        path = getattr(args, name, None)
        if not isinstance(path, str) or not path:
            continue
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            continue  # missing or unreadable: the command says so in its own words
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise BertfuseError(f"{path}: is not a regular file (a device, pipe or socket); "
                                f"bertfuse reads models and configs from files")


def _one_line(text: str) -> str:
    """A message as one line, safe for rich (user paths/names may hold [markup])."""
    from rich.markup import escape

    return escape("; ".join(ln.strip() for ln in str(text).splitlines() if ln.strip()))


def main(argv: list[str] | None = None) -> int:
    from bertfuse.converter.reference import prefer_onednn_off
    from bertfuse.report import make_console

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    prefer_onednn_off()  # the parity reference: see bertfuse/converter/reference.py
    err = make_console(stderr=True)
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        err.print(_one_line(exc), highlight=False, soft_wrap=True)
        return exc.exit_code
    console = make_console(stderr=args.json)
    from bertfuse.quiet import native_stderr_silenced
    from bertfuse.safety import Terminated, handle_signals

    try:  # TF/ORT's C++ logs go to fd 2 whatever the environment says: off unless --debug
        # SIGTERM/SIGHUP unwind like Ctrl-C: every temp goes
        # (score: Ray Data's progress is on stderr)
        with native_stderr_silenced(not args.debug and args.command != "score"), \
                handle_signals():
            _refuse_special_inputs(args)
            return COMMANDS[args.command](args, console)
    except BertfuseError as exc:
        if args.debug:
            raise
        err.print(f"[red]bertfuse: error:[/red] {_one_line(exc)}", highlight=False,
                  soft_wrap=True)
        return exc.exit_code
    except OSError as exc:  # unreadable/unwritable user paths: bad input, not a bug
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        err.print(f"[red]bertfuse: error:[/red] {_one_line(where + (exc.strerror or str(exc)))}",
                  highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("bertfuse: interrupted")
        return 130
    except Terminated as exc:
        err.print("bertfuse: terminated")
        return 128 + exc.signo
    except Exception as exc:  # a bug of ours: one line, the traceback with --debug
        if args.debug:
            raise
        bad = missing_dependency_message(exc) or library_error_message(exc)
        if bad:
            err.print(f"[red]bertfuse: error:[/red] {_one_line(bad)}", highlight=False,
                      soft_wrap=True)
            return 2
        err.print(f"[red]bertfuse: internal error:[/red] {type(exc).__name__}: "
                  f"{_one_line(str(exc).splitlines()[0]) if str(exc).strip() else ''} (rerun with --debug)",
                  highlight=False, soft_wrap=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
