"""The README is a front door and the docs hold the manual: the README stays short with its
Quick start on the first screen; every relative link and #anchor in README.md and docs/*.md
leads somewhere; every `bertfuse COMMAND --flag` they show is one the CLI takes (so a renamed
or removed flag cannot linger in the docs). tests/e2e/test_quickstart.py runs the Quick start."""

from __future__ import annotations

import argparse
import re

import pytest

from bertfuse.cli.parser import build_parser
from support.markdown import PAGES, README, RESULTS, anchors, blocks, command_lines, links, read, section
from support.paths import ROOT

MAX_LINES, QUICK_START_BY = 300, 40

# Flags of other tools that a bertfuse synopsis names in its description column.
FOREIGN = {"--hparams"}  # ELECTRA's training flag: `convert --config` takes its JSON


def test_the_readme_is_short_and_starts_with_the_quick_start():
    text = read(README)
    assert len(text.splitlines()) <= MAX_LINES, len(text.splitlines())
    line, quick = section(text, "## Quick start")
    shown = blocks(quick, line)
    assert line <= QUICK_START_BY and shown, line
    assert max(b.end for b in shown) <= QUICK_START_BY, [(b.start, b.end) for b in shown]
    commands = "\n".join(ln for b in shown for ln in b.lines)
    for step in ("pip install", "bertfuse convert", "bertfuse verify", "bertfuse serve", "curl",
                 "tritonclient"):
        assert step in commands, step
    # the contributors' two set-up commands keep their own heading
    _, setup = section(text, next(ln for ln in text.splitlines() if ln.startswith("## Contrib")))
    assert "make demo" in setup and "make test" in setup


@pytest.mark.parametrize("page", PAGES + RESULTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    bad = []
    for target in links(read(page)):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(read(dest)):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, bad


def _options(parser: argparse.ArgumentParser) -> tuple[set[str], dict[str, argparse.ArgumentParser]]:
    """A parser's long options, and its subcommands' parsers."""
    subs: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            subs.update(action.choices)
    return {s for s in parser._option_string_actions if s.startswith("--")}, subs


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_line_names_a_real_command_and_flags(page):
    top_flags, commands = _options(build_parser())
    shown = command_lines(read(page))
    bad = []
    for line in shown:
        words = line.split()
        name = words[words.index("bertfuse") + 1]
        if name not in commands:
            bad.append(f"{line}: no command {name!r}")
            continue
        flags, actions = _options(commands[name])
        rest = " ".join(words[words.index("bertfuse") + 2:])
        if actions:  # kernels build|check|info
            action = rest.split()[0] if rest else ""
            if action not in actions:
                bad.append(f"{line}: no action {action!r} of {name}")
                continue
            flags = _options(actions[action])[0]
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest):
            if flag not in flags | top_flags | FOREIGN:
                bad.append(f"{line}: {name} has no {flag}")
    assert not bad, bad
    if page == README:
        assert len(shown) >= 4  # the Quick start's commands were read
