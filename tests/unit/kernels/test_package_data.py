"""What `bertfuse kernels build` compiles on a user's GPU host comes from the installed
package: the wheel must hold every file the build reads (CMakeLists.txt, the header fetcher,
every csrc source and every header a source includes), and the op contracts' README. An
editable install hides a missing one, so this builds the wheel itself. The JSON Schemas of
the --json reports are package data too."""

from __future__ import annotations

import re
from pathlib import Path

from support.paths import ROOT

KERNELS = ROOT / "bertfuse" / "kernels"


def _build_inputs() -> set[Path]:
    """The sources the CMake and nvcc builds glob, the headers they include (transitively),
    and the build's own files."""
    csrc = KERNELS / "csrc"
    todo = [p for p in csrc.iterdir() if p.suffix in (".cc", ".cu")]
    assert todo, "no sources under csrc/"
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
            header = path.parent / name
            assert header.exists(), f"{path.name} includes {name}, which is not in csrc/"
            todo.append(header)
    return seen | {KERNELS / "CMakeLists.txt", KERNELS / "fetch_ort_headers.sh"}


def test_the_wheel_holds_every_file_the_kernel_build_reads(wheel_files):
    wanted = {p.relative_to(ROOT).as_posix() for p in _build_inputs()}
    assert any(w.endswith(".cuh") for w in wanted)  # the kind of file a glob once missed
    assert sorted(wanted - wheel_files) == []


def test_the_wheel_holds_the_op_contracts_and_every_package(wheel_files):
    assert "bertfuse/ops/README.md" in wheel_files
    packages = {p.parent.relative_to(ROOT).as_posix() + "/__init__.py"
                for p in (ROOT / "bertfuse").rglob("__init__.py")}
    assert sorted(packages - wheel_files) == []


def test_the_wheel_holds_the_json_schemas(wheel_files):
    """The --json reports' schemas (docs/json-reports.md) are read from the installed
    package: every one is in the wheel."""
    folder = ROOT / "bertfuse" / "schemas"
    schemas = {p.relative_to(ROOT).as_posix() for p in folder.glob("*.json")}
    assert "bertfuse/schemas/report.json" in schemas
    assert sorted(schemas - wheel_files) == []
