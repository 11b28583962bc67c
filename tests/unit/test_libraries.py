"""A maintained library where one does the job (the developer guide's rule): no module of the
package, the benchmarks or the tests reads /proc by hand, psutil reads processes, sockets and
memory, except the places listed here with what psutil cannot give; each says why in its own
code too."""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import ROOT

# (file, the function holding the path; "<module>" for module level): what psutil lacks
HAND_READ_PROC = {
    ("bertfuse/ray_cluster.py", "process_start"):
        "a start time that does not follow the wall clock: psutil's create_time() adds a boot "
        "time read afresh from it, and the value is compared by another process later",
    ("bertfuse/io/stale.py", "_space"): "the PID namespace (/proc/self/ns/pid)",
    ("benchmarks/runtime/host_state.py", "machine"): "the CPU's model name",
    ("benchmarks/serve/faults.py", "_cpu_name"): "the CPU's model name",
    ("tests/hostile/test_haproxy_drain.py", "_queued"): "a listening socket's accept queue",
    ("tests/support/peak_rss.py", "<module>"): "a process's peak memory (VmHWM)",
}
FOLDERS = ("bertfuse", "benchmarks", "tests")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (prose may name /proc)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _proc_reads(path: Path) -> set[str]:
    """The functions of `path` (innermost) whose code holds a string naming /proc."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstrings(tree)
    found = set()

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            where = node.name
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in prose and "/proc" in node.value:
            found.add(where)
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(tree, "<module>")
    return found


def _functions(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    source = path.read_text()
    out = {"<module>": source}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = ast.get_source_segment(source, node)
    return out


def test_no_module_reads_proc_by_hand_but_those_psutil_cannot_replace():
    me = Path(__file__).resolve()
    found = set()
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() != me and "fixtures" not in path.parts:
                found |= {(path.relative_to(ROOT).as_posix(), f) for f in _proc_reads(path)}
    assert found - set(HAND_READ_PROC) == set(), "read with psutil instead, or list it here " \
        "with what psutil lacks"
    assert set(HAND_READ_PROC) - found == set(), "no longer read by hand: take it off the list"
    for (file, function), _ in HAND_READ_PROC.items():  # each says why where it reads
        assert "psutil" in _functions(ROOT / file)[function], (file, function)
