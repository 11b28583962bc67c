"""Reading the README and docs/*.md as GitHub renders them: sections, fenced blocks, links,
heading anchors, and the `bertfuse ...` command lines they show (tests/unit/test_docs.py,
tests/e2e/test_quickstart.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from support.paths import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the user pages
RESULTS = sorted((ROOT / "docs" / "journal").glob("*.md"))  # the journal of measured trials, linked from them


@dataclass
class Block:
    lang: str  # the info string after ``` ("" for a plain block)
    lines: list[str]
    start: int  # 1-based line number of the opening fence
    end: int  # 1-based line number of the closing fence


def blocks(text: str, first_line: int = 1) -> list[Block]:
    """The fenced code blocks of `text`, in order."""
    out: list[Block] = []
    current: Block | None = None
    for n, line in enumerate(text.splitlines(), first_line):
        if line.startswith("```"):
            if current is None:
                current = Block(line[3:].strip(), [], n, n)
            else:
                current.end = n
                out.append(current)
                current = None
        elif current is not None:
            current.lines.append(line)
    return out


def prose(text: str) -> str:
    """`text` without its fenced blocks (links and headings in code are not links)."""
    keep, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
            keep.append("")
        else:
            keep.append("" if fence else line)
    return "\n".join(keep)


def section(text: str, heading: str) -> tuple[int, str]:
    """(1-based line of the heading, the section's text up to the next heading of its level
    or above)."""
    lines = text.splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    start = next(i for i, ln in enumerate(lines) if ln.strip() == heading)
    end = len(lines)
    fence = False
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("```"):
            fence = not fence
        m = re.match(r"^(#+) ", lines[i])
        if not fence and m and len(m.group(1)) <= level:
            end = i
            break
    return start + 1, "\n".join(lines[start:end])


def anchors(text: str) -> set[str]:
    """GitHub's heading ids: a link's text alone, lower case, punctuation dropped, spaces to
    '-', '-N' on repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(text).splitlines():
        m = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1).strip())  # a link: its text
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


# A report's row labels that read like a command line.
REPORT_ROWS = ("bertfuse ops vs contrib form",)

LINK = re.compile(r"\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """The targets of the Markdown links and images outside code."""
    return LINK.findall(re.sub(r"`[^`\n]*`", "", prose(text)))


def command_lines(text: str) -> list[str]:
    """Each `bertfuse ...` command the page shows: in code blocks (a command with its
    continuation lines: a trailing backslash, or the indented option lines of a synopsis),
    and in inline code spans."""
    out: list[str] = []
    for block in blocks(text):
        current: str | None = None
        for line in block.lines:
            line = re.sub(r"\s#\s.*$", "", line)  # a shell comment says what, not how
            body = re.sub(r"^\$ ", "", line)
            if re.match(r"^(\S+=\S+ )*bertfuse [a-z][a-z-]*(\s|$)", body):
                if current is not None:
                    out.append(current)
                current = body
            elif current is not None and (current.rstrip().endswith("\\") or
                                          re.match(r"^\s+\S", line)):
                current += " " + line
            else:
                if current is not None:
                    out.append(current)
                current = None
        if current is not None:
            out.append(current)
    for span in re.findall(r"`([^`\n]+)`", prose(text)):
        if re.match(r"^bertfuse [a-z][a-z-]*(\s|$)", span) and not span.startswith(REPORT_ROWS):
            out.append(span)
    return out


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")
