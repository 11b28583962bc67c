"""The results page and what stands behind it: docs/benchmarks.md holds one table of current
numbers per GPU, each number a link to the run file it was read from; the dated trials live in
docs/journal/ and no other page grows into a notebook; benchmarks/ holds only scripts that a doc
cites or another script or test imports, and docs/runs/ only files a doc links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.markdown import prose, read, section
from support.paths import ROOT

DOCS, RUNS, BENCH = ROOT / "docs", ROOT / "docs" / "runs", ROOT / "benchmarks"
RESULTS_PAGE = DOCS / "benchmarks.md"
GPUS = ("## H100", "## H200")  # the GPUs measured: one table of current numbers each
MAX_DATED_HEADINGS, MAX_LINES, RESULTS_MAX_LINES = 2, 400, 200
DATE = re.compile(r"20\d\d-\d\d-\d\d")
NUMBER = re.compile(r"^[\d,.\s/x%–-]*\d[\d,.\s/x%–-]*$")  # a cell that is a measurement
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _doc_pages() -> list[Path]:
    """The Markdown a reader is pointed to: docs/ (journal included), the README, and the
    package's READMEs."""
    return [*sorted(DOCS.rglob("*.md")), ROOT / "README.md", BENCH / "README.md",
            *sorted((ROOT / "bertfuse").rglob("README.md"))]


def _tables(text: str) -> list[list[list[str]]]:
    """The pipe tables of `text` (outside code), each a list of rows of cells, separator row
    left out."""
    out: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in prose(text).splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if all(re.fullmatch(r":?-+:?", c) for c in cells):
                continue
            if current is None:
                current = []
                out.append(current)
            current.append(cells)
        else:
            current = None
    return out


def test_every_run_file_is_linked_from_a_doc():
    cited = "\n".join(read(p) for p in _doc_pages())
    unlinked = [p.name for p in _files(RUNS) if f"runs/{p.name}" not in cited]
    assert not unlinked, f"docs/runs/ files no doc links (link them or delete them): {unlinked}"


def test_every_benchmark_script_is_cited_or_imported():
    """benchmarks/README.md lists the scripts; a script it alone names is a probe of a trial
    nobody reads any more. A citation: the file's name in a doc, a test, the Makefile, another
    script or the package's code (a comment naming what measured it); or a script importing it."""
    readers = [p for p in _doc_pages() if p != BENCH / "README.md"]
    readers += [*sorted((ROOT / "tests").rglob("*.py")), ROOT / "Makefile",
                *(p for p in (ROOT / "bertfuse").rglob("*") if p.is_file() and p.suffix in
                  {".py", ".cu", ".cuh", ".h", ".cpp", ".sh", ".txt"})]
    scripts = [p for p in _files(BENCH) if p.name != "README.md"]
    texts = {p: read(p) for p in readers + scripts if p.exists()}
    orphans = []
    for script in scripts:
        named = re.compile(r"(?<![\w.-])" + re.escape(script.name) + r"(?![\w-])")
        imported = re.compile(rf"^\s*(from|import)\s+{re.escape(script.stem)}\b", re.M)
        if not any(named.search(text) or (p.suffix == ".py" and imported.search(text))
                   for p, text in texts.items() if p != script):
            orphans.append(str(script.relative_to(ROOT)))
    assert not orphans, f"benchmarks/ files no doc cites and no test or script imports: {orphans}"


def test_the_results_page_has_one_table_per_gpu_each_number_linked_to_its_run_file():
    text = read(RESULTS_PAGE)
    assert len(text.splitlines()) <= RESULTS_MAX_LINES, len(text.splitlines())
    headings = [ln for ln in prose(text).splitlines() if ln.startswith("## ")]
    bad = []
    for gpu in GPUS:
        assert gpu in headings, f"docs/benchmarks.md has no {gpu!r} section"
        assert len(_tables(section(text, gpu)[1])) == 1, f"{gpu}: one table of current numbers"
    for heading in headings:
        body = section(text, heading)[1]
        tables = _tables(body)
        if not tables:
            continue
        # each table states its date and the command that made it
        if not DATE.search(prose(body)):
            bad.append(f"{heading}: no date")
        if not re.search(r"`(bertfuse |python3? |bash )[^`]*`", body):
            bad.append(f"{heading}: no command")
        numbers = 0
        for row in (r for table in tables for r in table[1:]):
            for cell in row:
                shown = LINK.sub(lambda m: m.group(1), cell)
                if not NUMBER.match(shown):
                    continue
                numbers += 1
                targets = LINK.findall(cell)
                rest = LINK.sub("", cell)
                if not targets or re.search(r"\d", rest):
                    bad.append(f"{heading}: {cell!r} is a number without its run file")
                for _, target in targets:
                    if not target.startswith("runs/") or not (DOCS / target).is_file():
                        bad.append(f"{heading}: {cell!r} links {target}, not a file in docs/runs/")
        if not numbers:
            bad.append(f"{heading}: a table without numbers")
    assert not bad, bad


def _pages_outside_the_journal() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if not {"journal", "runs"} & set(p.relative_to(DOCS).parts))


@pytest.mark.parametrize("page", _pages_outside_the_journal(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_outside_the_journal_is_a_notebook(page):
    """Dated trials go to docs/journal/; a user page keeps its measured facts short."""
    text = read(page)
    dated = [ln for ln in prose(text).splitlines() if re.match(r"^#+ ", ln) and DATE.search(ln)]
    assert len(dated) <= MAX_DATED_HEADINGS, (len(dated), dated[:5])
    assert len(text.splitlines()) <= MAX_LINES, len(text.splitlines())


def test_the_journal_is_newest_first():
    for page in sorted((DOCS / "journal").glob("*.md")):
        dates = [max(DATE.findall(ln)) for ln in prose(read(page)).splitlines()
                 if ln.startswith("## ") and DATE.search(ln)]
        assert dates == sorted(dates, reverse=True), (page.name, dates)
