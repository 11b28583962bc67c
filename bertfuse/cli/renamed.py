"""Renamed flags on the command line (pipeline/renamed.py lists them): the new flag also takes
an old value, the old flag is hidden from --help, and either prints one deprecation line on
stderr before the command runs (never on stdout: --json stays one JSON document)."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from rich.markup import escape

from bertfuse.pipeline.renamed import Renamed

NOTES = "_renamed"  # the namespace attribute holding the parse's deprecation lines


class _Choices(tuple):
    """The new choices as --help and argparse's 'invalid choice' list them, which also
    contain the old values (the action turns them into the new ones)."""

    old: tuple = ()

    def __contains__(self, value: object) -> bool:
        return tuple.__contains__(self, value) or value in self.old


class RenamedAction(argparse.Action):
    """Stores the new value of a renamed option; an old flag or value notes its line."""

    def __init__(self, option_strings: Sequence[str], dest: str, renamed: Renamed,
                 **kwargs: Any) -> None:
        self.renamed = renamed
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        setattr(namespace, self.dest, self.renamed.new_value(value))
        if option_string != self.renamed.flag or value in self.renamed.old_values:
            line = self.renamed.line(option_string, value)
            notes = getattr(namespace, NOTES, [])
            setattr(namespace, NOTES, [*notes, line] if line not in notes else notes)


def add_renamed(g: argparse._ActionsContainer, renamed: Renamed, choices: Sequence[str],
                **kwargs: Any) -> None:
    """The new flag (help, default and choices as given; an old value also taken) and the
    old one, hidden (its old choices: the new ones with the old values in their place)."""
    new = _Choices(choices)
    new.old = tuple(renamed.old_values)
    g.add_argument(renamed.flag, action=RenamedAction, renamed=renamed, choices=new, **kwargs)
    back = {n: o for o, n in renamed.old_values.items()}
    old = _Choices(back.get(c, c) for c in choices)
    old.old = tuple(choices)
    g.add_argument(renamed.old_flag, action=RenamedAction, renamed=renamed, choices=old,
                   dest=kwargs["dest"], default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def print_renamed(args: argparse.Namespace, err) -> None:
    """Each deprecation line of the parse, once, on stderr (`err`: the stderr console)."""
    for line in getattr(args, NOTES, []):
        err.print(f"bertfuse: deprecated: {escape(line)}", highlight=False, soft_wrap=True)
