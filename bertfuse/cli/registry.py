"""The registry: every command, in the order `bertfuse --help` lists them. Adding a
command is a Command subclass (command.py) in the module of its subject, and one entry here."""

from __future__ import annotations

from bertfuse.cli.command import Command
from bertfuse.cli.bench import Bench
from bertfuse.cli.convert import Convert, Optimize, StripWeights, Verify
from bertfuse.cli.inspect import Diff, Draw, Inspect, Summarize
from bertfuse.cli.kernels import Kernels
from bertfuse.cli.score import Score
from bertfuse.cli.serve import Serve
from bertfuse.cli.tools import Example, ExportTriton, Tokenize


def commands() -> list[Command]:
    """Every command, in the order `bertfuse --help` lists them."""
    return [Example(), Convert(), Optimize(), StripWeights(), Bench(), Inspect(), Summarize(),
            Diff(), Draw(), Verify(), Tokenize(), ExportTriton(), Kernels(), Score(), Serve()]
