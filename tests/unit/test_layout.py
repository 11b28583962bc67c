"""The tree's rules (docs/architecture.md), read off the code: imports run one way (no
circle, lazy imports included), inner rooms never import the package face or the CLI, no
module grows past ~350 lines, and no re-export shim is left behind."""

from __future__ import annotations

import ast
from pathlib import Path

import bertfuse

PACKAGE = Path(bertfuse.__file__).parent
MAX_LINES = 360


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every bertfuse module this file imports, at the top or inside a function. `from P
    import x` is an import of P.x where that is a module, else of P."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "bertfuse")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "bertfuse":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_inner_rooms_import_neither_the_package_face_nor_the_cli():
    bad = []
    for name, deps in _graph().items():
        if name == "bertfuse" or name.startswith("bertfuse.cli") or name == "bertfuse.__main__":
            continue
        bad += [f"{name} -> {d}" for d in deps
                if d == "bertfuse" or d == "bertfuse.cli" or d.startswith("bertfuse.cli.")]
    assert bad == []


def test_no_module_is_too_long():
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_re_export_shim():
    """A name imported only to be imported from here again ("its old home"); a bare
    `import x  # noqa: F401` for its side effect is not one."""
    shims = [f"{p.relative_to(PACKAGE)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if "noqa: F401" in line and not line.lstrip().startswith("import ")]
    assert shims == []
