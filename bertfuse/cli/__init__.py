"""bertfuse command line: one entry point, subcommands, grouped options, --json for CI.

    argv -> parser.py (built from registry.py: one Command class per subcommand, in
            convert.py, inspect.py, tools.py, kernels.py, bench.py, serve.py, score.py)
         -> Command.run(args, console) -> exit code
         -> errors: one line on stderr (render.py draws tables and JSON on stdout)

This module turns a command's outcome into an exit code and at most one line on stderr:
BertfuseError and bad paths exit 2, a failed parity check 1, a bug 3 (the traceback with
--debug), Ctrl-C 130, SIGTERM 128 + 15."""

from __future__ import annotations

import os
import stat
import sys

from rich.markup import escape

from bertfuse.errors import BertfuseError, UsageError, library_error_message, \
    missing_dependency_message
from bertfuse.cli import outcome
from bertfuse.cli.logs import native_logs_wanted, third_party_logs
from bertfuse.cli.parser import build_parser
from bertfuse.cli.render import make_console
from bertfuse.converter.reference import prefer_onednn_off
from bertfuse.io.quiet import native_stderr_silenced
from bertfuse.io.safety import Terminated, handle_signals
from bertfuse.ray_cluster import logs_dir
from bertfuse.cli.renamed import print_renamed


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


def _plain_line(text: object) -> str:
    """A message as one line (the JSON report's `error.message`)."""
    return "; ".join(ln.strip() for ln in str(text).splitlines() if ln.strip())


def _one_line(text: object) -> str:
    """A message as one line, safe for rich (user paths/names may hold [markup])."""
    return escape(_plain_line(text))


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    prefer_onednn_off()  # the parity reference: see bertfuse/converter/reference.py
    outcome.reset()
    err = make_console(stderr=True)
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        err.print(_one_line(exc), highlight=False, soft_wrap=True)
        if "--json" in argv:  # a refused option: the report says so too
            outcome.print_failure(outcome.command_name(None, argv), "usage", _plain_line(exc),
                                  exc.exit_code)
        return exc.exit_code
    console = make_console(stderr=args.json)
    command = outcome.command_name(args)

    print_renamed(args, err)  # an old flag's spelling: one line on stderr, then the run

    def fail(kind: str, message: str, code: int, data: dict | None = None,
             label: str = "[red]bertfuse: error:[/red] ") -> int:
        """The one line on stderr; with --json the report (or its envelope) on stdout."""
        if args.command in ("serve", "score") and code != 0 and \
                kind not in ("interrupted", "terminated") and \
                "ray" in sys.modules:  # where Ray's own lines went (never the terminal)

            message += f" (Ray's logs: {logs_dir()})" if logs_dir() else ""
        err.print(label + escape(message), highlight=False, soft_wrap=True)
        if args.json:
            outcome.print_failure(command, kind, message, code, data)
        return code

    try:  # TF/ORT's C++ logs go to fd 2 whatever the environment says: off unless --debug
        # SIGTERM/SIGHUP unwind like Ctrl-C: every temp goes
        # (score: Ray Data's progress bars are on stderr, unless -q or --json)
        shows_bars = args.command == "score" and not (args.quiet or args.json)
        with third_party_logs(args), \
                native_stderr_silenced(not native_logs_wanted(args) and not shows_bars), \
                handle_signals():
            _refuse_special_inputs(args)
            return args._command.run(args, console)
    except BertfuseError as exc:
        if args.debug:
            raise
        return fail(outcome.error_kind(exc), _plain_line(exc), exc.exit_code,
                    outcome.exception_data(exc))
    except OSError as exc:  # unreadable/unwritable user paths: bad input, not a bug
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        return fail("bad_input", _plain_line(where + (exc.strerror or str(exc))), 2)
    except KeyboardInterrupt:
        return fail("interrupted", "interrupted", 130, label="bertfuse: ")
    except Terminated as exc:
        return fail("terminated", "terminated", 128 + exc.signo, label="bertfuse: ")
    except Exception as exc:  # a bug of ours: one line, the traceback with --debug
        if args.debug:
            raise
        bad = missing_dependency_message(exc) or library_error_message(exc)
        if bad:
            kind = "missing_dependency" if isinstance(exc, ModuleNotFoundError) else "bad_input"
            return fail(kind, _plain_line(bad), 2)
        first = _plain_line(str(exc).splitlines()[0]) if str(exc).strip() else ""
        return fail("internal", f"{type(exc).__name__}: {first} (rerun with --debug)", 3,
                    label="[red]bertfuse: internal error:[/red] ")
