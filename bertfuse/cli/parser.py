"""bertfuse's argument parser, built from the command registry (registry.py): subcommands,
grouped options, and each command's worked example at the end of its --help."""

from __future__ import annotations

import argparse

from bertfuse._version import __version__
from bertfuse.cli.args import Parser, add_output_args
from bertfuse.cli.command import Command
from bertfuse.cli.registry import commands

DESCRIPTION = "bertfuse command line: one entry point, subcommands, grouped options, --json for CI."


def build_parser(registry: list[Command] | None = None) -> argparse.ArgumentParser:
    parser = Parser(prog="bertfuse", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"bertfuse {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in registry if registry is not None else commands():
        p = sub.add_parser(cmd.name, help=cmd.summary, description=cmd.summary)
        cmd.add_arguments(p)
        if cmd.output_args:
            add_output_args(p)
        p.set_defaults(_command=cmd)
        p.epilog = "example:\n" + cmd.example
        p.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser
