"""The CI contract of --json: on every exit (0, 1, 2, 3, a signal) a command's stdout holds one
JSON report with `schema_version`, `command` and `ok`; on a failure also `error` (its `kind`,
the one `message` line stderr shows, the `exit_code`). The report's own fields are there
when the command got that far (a --strict refusal or a failed parity check carries the run
report). Each command's report is described by a JSON Schema (draft 2020-12) shipped in
bertfuse/schemas/ (docs/json-reports.md).

    command ok        -> its data + ok: true                  (report(), print_json())
    exit 1 by design  -> its data + ok: false + error         (diff --fail-on, kernels check)
    an exception      -> cli/__init__.py: failure() on stdout, the line on stderr
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bertfuse.pipeline.report import SCHEMA_VERSION

# Exception class name -> error kind, the most specific first (looked up along the MRO).
_KINDS = {"UsageError": "usage", "ParityError": "parity", "FusionIncomplete": "strict",
          "MissingDependency": "missing_dependency", "CudaUnavailableError": "no_cuda",
          "KernelLibraryError": "kernels", "BertfuseError": "bad_input"}


def command_name(args: argparse.Namespace | None, argv: list[str] | None = None) -> str:
    """`convert`, `kernels check`...: from the parsed args, else the first words of argv."""
    if args is not None:
        sub = getattr(args, "kernels_command", None)
        return f"{args.command} {sub}" if sub else args.command
    words = [w for w in (argv or [])[:2] if not w.startswith("-")]
    if words[:1] == ["kernels"] and len(words) == 2:
        return " ".join(words)
    return words[0] if words else ""


def error_kind(exc: BaseException) -> str:
    for cls in type(exc).__mro__:
        if cls.__name__ in _KINDS:
            return _KINDS[cls.__name__]
    return "bad_input" if isinstance(exc, OSError) else "internal"


def report(command: str, data: dict | None = None, error: dict | None = None) -> dict:
    """The envelope around a command's data: schema_version, command, ok first.
    schema_version: one number for every command's report, the run report's (raised when a
    field changes meaning or goes away; new fields may appear without it)."""
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "command": command,
                           "ok": error is None}
    out.update({k: v for k, v in (data or {}).items() if k not in ("schema_version", "ok")})
    out["command"] = command
    if error is not None:
        out["error"] = error
    return out


def error_object(kind: str, message: str, exit_code: int) -> dict:
    return {"kind": kind, "message": message, "exit_code": exit_code}


_printed: list[bool] = []  # a report is on stdout already: an error after it prints no second


def print_json(command: str, data: dict | None = None, error: dict | None = None,
               indent: int | None = 2) -> None:
    """The report as one JSON document on stdout (flushed: a signal may end the process)."""
    print(json.dumps(report(command, data, error), indent=indent, default=str), flush=True)
    _printed.append(True)


def print_failure(command: str, kind: str, message: str, exit_code: int,
                  data: dict | None = None) -> None:
    """An exit past the command's own report: the report it got to (data), or the envelope."""
    if _printed:
        return
    try:
        print_json(command, data, error_object(kind, message, exit_code))
    except OSError:  # stdout itself failed (a closed pipe): the stderr line is all there is
        pass


def exception_data(exc: BaseException) -> dict | None:
    """The report an exception carries (ParityError and FusionIncomplete: the run so far)."""
    rep = getattr(exc, "report", None)
    if rep is None:
        return None
    return rep.to_json() if hasattr(rep, "to_json") else rep if isinstance(rep, dict) else None


def reset() -> None:
    """A new command in this process (tests run several through cli.main)."""
    _printed.clear()
