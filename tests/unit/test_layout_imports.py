"""Where bertfuse imports (docs/architecture.md): at the top of each module, except an optional
dependency, which is imported on first use through bertfuse/optional.py's `optional()` with
its reason at each call. An import inside a function is left only where importing a bertfuse
module loads an optional dependency (Ray, pyarrow) at import, or where ALLOWED says why."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import bertfuse
from bertfuse.errors import MissingDependency, install_hint, missing_dependency_message

PACKAGE = Path(bertfuse.__file__).parent
ROOT = PACKAGE.parent
HELPER = PACKAGE / "optional.py"

# Imports inside a function that stay there: (module file, bertfuse module or package) -> why.
ALLOWED = {
    ("bertfuse/runtime/kernel_choice.py", "bertfuse.passes"):
        "a Session on the CPU, or with kernels='ort', never lowers its model: the passes "
        "(onnx-graphsurgeon, every fusion) load when a CUDA session lowers one",
}


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _core() -> set[str]:
    """Import names of pyproject's dependencies and of what they bring (installed metadata)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    todo = [Requirement(d).name for d in deps]
    dists: set[str] = set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in dists:
            continue
        dists.add(name)
        for req in metadata.requires(name) or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return {top for top, owners in metadata.packages_distributions().items()
            if any(o.lower().replace("_", "-") in dists for o in owners)}


CORE = _core()


def _kind(module: str) -> str:
    top = module.split(".")[0]
    if top == "bertfuse":
        return "own"
    if top in sys.stdlib_module_names or top == "__future__":
        return "stdlib"
    return "core" if top in CORE else "optional"


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}


def _enclosing(node: ast.AST, parents: dict, kinds: tuple) -> ast.AST | None:
    p = parents.get(node)
    while p is not None and not isinstance(p, kinds):
        p = parents.get(p)
    return p


def _type_checking(node: ast.AST, parents: dict) -> bool:
    p = parents.get(node)
    while p is not None:
        if isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test):
            return True
        p = parents.get(p)
    return False


def _modules_of(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return ["." * node.level + (node.module or "")]


def _import_sites():
    """(file, node, in a function) for every import statement outside TYPE_CHECKING."""
    for path in _files():
        tree = ast.parse(path.read_text(), str(path))
        parents = _parents(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not _type_checking(node, parents):
                fn = _enclosing(node, parents, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                yield path, node, fn is not None


def _optional_calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", None) == "optional"]


def _loads_optional() -> dict[str, set[str]]:
    """bertfuse module -> the optional packages importing it loads (its top-level imports and
    optional() calls, followed through bertfuse's modules and their packages' __init__s)."""
    names = {_name(p): p for p in _files()}
    direct, deps = {}, {}
    for name, path in names.items():
        tree = ast.parse(path.read_text(), str(path))
        parents = _parents(tree)
        opt, dep = set(), set()
        for node in ast.walk(tree):
            if _enclosing(node, parents, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) \
                    or _type_checking(node, parents):
                continue
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "optional":
                opt.add(node.args[0].value.split(".")[0])
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            mods = _modules_of(node)
            if isinstance(node, ast.ImportFrom):
                mods += [f"{node.module}.{a.name}" for a in node.names]
            for m in mods:
                if _kind(m) == "optional":
                    opt.add(m.split(".")[0])
                parts = m.split(".")
                dep.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        parts = name.split(".")
        dep.update(".".join(parts[:i]) for i in range(1, len(parts)))
        direct[name], deps[name] = opt, {d for d in dep if d in names} - {name}

    def closure(m: str, seen: set[str]) -> set[str]:
        out = set(direct[m])
        for d in deps[m] - seen:
            seen.add(d)
            out |= closure(d, seen)
        return out

    return {m: closure(m, {m}) for m in names}


def _allowed(rel: str, module: str) -> bool:
    return any(rel == f and (module == m or module.startswith(m + ".")) for f, m in ALLOWED)


def test_no_import_inside_a_function():
    loads = _loads_optional()
    bad = []
    for path, node, in_function in _import_sites():
        if not in_function or path == HELPER:
            continue
        for module in _modules_of(node):
            targets = [module] + ([f"{module}.{a.name}" for a in node.names]
                                  if isinstance(node, ast.ImportFrom) else [])
            if _kind(module) == "own" and any(loads.get(t) for t in targets):
                continue  # importing it loads Ray or pyarrow: on first use, as those are
            if _allowed(_rel(path), module):
                continue
            bad.append(f"{_rel(path)}:{node.lineno}: {ast.unparse(node)}")
    assert bad == [], "\n".join(bad)


def test_every_allowed_import_is_still_there():
    used = {(_rel(p), m) for p, n, f in _import_sites() if f for m in _modules_of(n)}
    stale = [key for key in ALLOWED
             if not any(f == key[0] and (m == key[1] or m.startswith(key[1] + "."))
                        for f, m in used)]
    assert stale == []


def test_optional_dependencies_only_through_the_helper():
    """No import statement of an optional package anywhere in bertfuse/ (TYPE_CHECKING aside):
    each goes through optional(), which names the extra that installs it."""
    bad = [f"{_rel(p)}:{n.lineno}: {ast.unparse(n)}" for p, n, _ in _import_sites()
           if p != HELPER and any(_kind(m) == "optional" for m in _modules_of(n))]
    assert bad == [], "\n".join(bad)


def test_every_optional_call_says_why():
    bad = []
    for path in _files():
        for call in _optional_calls(ast.parse(path.read_text(), str(path))):
            why = next((k.value for k in call.keywords if k.arg == "why"), None)
            literal = all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                          for a in call.args)
            if not (literal and isinstance(why, ast.Constant) and why.value.strip()) or \
                    _kind(call.args[0].value) != "optional":
                bad.append(f"{_rel(path)}:{call.lineno}: {ast.unparse(call)}")
    assert bad == [], "\n".join(bad)


def test_the_core_is_what_pyproject_says():
    assert {"numpy", "onnx", "onnx_graphsurgeon", "rich", "jsonschema", "psutil"} <= CORE
    assert not {"tensorflow", "onnxruntime", "ray", "pyarrow", "tokenizers"} & CORE, CORE


@pytest.mark.parametrize("module, extra", [("ray", "ray"), ("onnxruntime", "cpu"),
                                           ("tf2onnx", "tf"), ("tokenizers", "text")])
def test_a_missing_extra_is_the_one_line_with_its_pip_line(monkeypatch, module, extra):
    from bertfuse.optional import optional

    monkeypatch.setitem(sys.modules, module, None)  # `import module` fails as if not installed
    with pytest.raises(MissingDependency) as caught:
        optional(module, why="a test")
    line = str(caught.value)
    assert line == missing_dependency_message(ModuleNotFoundError(name=module))
    assert "\n" not in line and line.startswith(f"{module} is not installed: ")
    assert install_hint(extra) in line, line
    with pytest.raises(MissingDependency):  # the `from module import name` form as well
        optional(module, "anything", why="a test")


def test_a_missing_module_of_no_extra_is_its_own_error(monkeypatch):
    from bertfuse.optional import optional

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ModuleNotFoundError) as caught:
        optional("torch", why="a test")
    assert not isinstance(caught.value, MissingDependency) and caught.value.name == "torch"


def test_the_helper_gives_what_an_import_statement_gives():
    from bertfuse.optional import optional

    import json.decoder
    from os import path, sep

    assert optional("json.decoder", why="a test") is json.decoder
    assert optional("os", "path", why="a test") is path
    assert optional("os", "path", "sep", why="a test") == (path, sep)
    assert optional("json", "decoder", why="a test") is json.decoder  # a submodule by name
    with pytest.raises(ImportError, match="cannot import name 'nothing_here' from 'json'"):
        optional("json", "nothing_here", why="a test")
    with pytest.raises(ValueError, match="say why"):
        optional("json", why=" ")


def test_the_layout_page_names_the_helper():
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert re.search(r"optional\.py", page), "docs/architecture.md: the base row names optional.py"
