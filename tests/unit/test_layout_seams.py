"""The seams between modules, read off the code (docs/architecture.md): no module reaches into
another object's private names, and no public function name means two things.

(a) `X._name` in bertfuse/ where X is not `self`, `cls` or `super()`: another object's private
    state. Dunder names (`__dict__`, `__name__`) are the language's, not private. A module-level
    `_name` is private to its module: `from bertfuse.m import _name` in another module is the
    same reach (make it public or move it). Third-party private names bertfuse has to use are
    allowed one by one below, each with the reason.
(b) a public top-level function name defined in two modules of bertfuse/ (two `load_model`s
    with two wordings): one meaning, one home. The op modules of ops/ share a protocol
    (`reference`, `make_model`, ...) by design.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import bertfuse

PACKAGE = Path(bertfuse.__file__).parent

# Expressions allowed anywhere: a third party's private name, or argparse's namespace.
ALLOWED_PRIVATE = {
    "os._exit": "Python's documented exit without clean-up (a forked child, a dying actor)",
    "argparse._ActionsContainer": "argparse's common base of parsers and groups, for a type "
                                  "annotation",
    "args._command": "the parser's own per-command slot on argparse's Namespace "
                     "(cli/parser.py set_defaults)",
    "b2b._func_map": "tf2onnx's handler table, patched (no public hook)",
    "hf._attn_implementation": "transformers' attention switch on a model config",
    "serve.context._get_global_client": "Ray Serve's controller client (no public call)",
}

# The ops/ protocol: every op module defines these (ops/README.md).
OP_PROTOCOL = {"make_model", "reference", "reference64", "reference_outputs"}
# Public names defined twice today, each a rename left to the room that owns it; the list
# only shrinks (a name fixed must leave it: test_the_lists_hold_only_what_is_still_there).
NAMED_TWICE_TODAY = {
    "check_feeds", "check_text", "check_tolerance", "compare", "convert", "deploy", "describe",
    "diff", "emit", "format_tables", "main", "optimize", "read_json", "resolve", "role_of",
    "text_lines", "watched", "write_vocab",
}


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def private_reaches(files: list[Path] | None = None) -> list[tuple[str, int, str]]:
    """(file, line, expression) of every private name reached outside its object or module."""
    out = []
    for path in files or _files():
        rel = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) \
                        and base.func.id == "super":
                    continue
                out.append((rel, node.lineno, ast.unparse(node)))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] == "bertfuse":
                out += [(rel, node.lineno, f"from {node.module} import {a.name}")
                        for a in node.names if _private(a.name)]
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def defined_twice(files: list[Path] | None = None) -> dict[str, list[str]]:
    """Public top-level function names defined in more than one module (ops' protocol out)."""
    where = defaultdict(list)
    for path in files or _files():
        rel = str(path.relative_to(PACKAGE))
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and not node.name.startswith("_") \
                    and not (rel.startswith("ops/") and node.name in OP_PROTOCOL):
                where[node.name].append(rel)
    return {name: files for name, files in where.items() if len(files) > 1}


def test_no_module_reaches_into_another_objects_private_names():
    assert [r for r in private_reaches()
            if r[2] not in ALLOWED_PRIVATE] == []


def test_one_load_model_and_one_check_int():
    twice = defined_twice()
    assert {n: twice[n] for n in ("load_model", "check_int", "check_flag") if n in twice} == {}


def test_no_public_function_name_means_two_things():
    assert sorted(set(defined_twice()) - NAMED_TWICE_TODAY) == []


def test_the_lists_hold_only_what_is_still_there():
    reached = private_reaches()
    assert sorted(set(ALLOWED_PRIVATE) - {r[2] for r in reached}) == []
    assert sorted(NAMED_TWICE_TODAY - set(defined_twice())) == []


def test_the_checks_see_a_reach_and_a_second_definition(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from bertfuse.x import _hidden\n\ndef load(s):\n    return s._buckets, "
                 "self._ok, super()._ok, s.__dict__\n")
    b.write_text("def load():\n    pass\n\ndef _load():\n    pass\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        assert [r[2] for r in private_reaches([a, b])] == ["from bertfuse.x import _hidden",
                                                           "s._buckets"]
        assert defined_twice([a, b]) == {"load": ["a.py", "b.py"]}
    finally:
        PACKAGE = saved
