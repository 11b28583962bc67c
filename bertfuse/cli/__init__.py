"""bertfuse command line: one entry point, subcommands, grouped options, --json for CI.

This module turns a command's outcome into an exit code and at most one line on stderr. The
parser is cli_parser.py; the commands are here when small, else in their own modules:
convert_command.py (convert, optimize, verify, strip-weights), inspect/command.py (inspect,
summarize, diff, draw), kernels_command.py, bench/, serve/ and score/command.py."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import stat
import sys
from typing import Any, Callable

from bertfuse.cli.parser import build_parser  # noqa: F401  (tests and tools import it here)
from bertfuse.errors import BertfuseError, UsageError, library_error_message, \
    missing_dependency_message

Command = Callable[[argparse.Namespace, Any], int]  # (args, console) -> exit code


def _elsewhere(target: str) -> Command:
    """The command `module:function`, imported when it runs: `import bertfuse.cli` loads
    none of TensorFlow, ONNX Runtime, Ray or tokenizers."""
    module, name = target.split(":")

    def run(args: argparse.Namespace, console: Any) -> int:
        return getattr(importlib.import_module(module), name)(args, console)
    return run


def _cmd_example(args, console) -> int:
    from bertfuse.converter.example import write_example
    from bertfuse.cli.render import emit

    out = write_example(args.config, args.output, seed=args.seed, head=args.head,
                        hidden_act=args.hidden_act)
    return emit(args.json, console, {"output": str(out), "config": args.config},
                f"wrote {args.config} example to {out}")


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
    from bertfuse.cli.render import emit
    from bertfuse.export.triton import export_triton

    out = export_triton(args.model, args.output, args.name, args.max_batch, args.instances,
                        args.kind, args.dynamic_batching_delay_us, args.force,
                        args.cuda_graphs, args.intra_op_threads)
    return emit(args.json, console, out.to_json(),
                f"wrote {out.name} ({out.precision}) to {out.config} and {out.model}", indent=2)


def _cmd_bench(args, console) -> int:
    from bertfuse.cli.bench import run

    return run(args)


COMMANDS: dict[str, Command] = {
    "bench": _cmd_bench, "kernels": _elsewhere("bertfuse.cli.kernels:run"),
    "example": _cmd_example, "convert": _elsewhere("bertfuse.cli.convert:cmd_convert"),
    "optimize": _elsewhere("bertfuse.cli.convert:cmd_optimize"),
    "verify": _elsewhere("bertfuse.cli.convert:cmd_verify"),
    "strip-weights": _elsewhere("bertfuse.cli.convert:cmd_strip"),
    "inspect": _elsewhere("bertfuse.cli.inspect:cmd_inspect"),
    "summarize": _elsewhere("bertfuse.cli.inspect:cmd_summarize"),
    "diff": _elsewhere("bertfuse.cli.inspect:cmd_diff"),
    "draw": _elsewhere("bertfuse.cli.inspect:cmd_draw"),
    "tokenize": _cmd_tokenize, "export-triton": _cmd_export_triton,
    "serve": _elsewhere("bertfuse.cli.serve:run"),
    "score": _elsewhere("bertfuse.cli.score:run"),
}


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
    from bertfuse.cli.render import make_console

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
    from bertfuse.io.quiet import native_stderr_silenced
    from bertfuse.io.safety import Terminated, handle_signals

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
