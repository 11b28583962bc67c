"""A command: its name, a one-line summary, its arguments, its run and a worked example
(shown at the end of its --help), as Polygraphy's tools are. Command modules import nothing
heavy at import time: each run imports what it needs, so `bertfuse --help` loads none of
TensorFlow, ONNX Runtime, Ray or tokenizers."""

from __future__ import annotations

import argparse
from typing import Any, ClassVar


class Command:
    name: ClassVar[str]
    summary: ClassVar[str]  # the line in `bertfuse --help`
    example: ClassVar[str]  # shown after "example:" at the end of the command's --help
    output_args: ClassVar[bool] = True  # --json and --debug (kernels adds them per action)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        raise NotImplementedError

    def run(self, args: argparse.Namespace, console: Any) -> int:
        """The exit code; bad input raises BertfuseError (cli/__init__.py prints it)."""
        raise NotImplementedError
