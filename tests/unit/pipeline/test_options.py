"""The option table (bertfuse/pipeline/options.py) is the one place an option is defined:
the CLI's flags, the Python API's keywords and ConvertOptions all read it, and no other file
writes an option's default or its choice list again."""

from __future__ import annotations

import argparse
import ast
import inspect
from dataclasses import fields
from pathlib import Path

import pytest

import bertfuse
from bertfuse.cli.parser import build_parser
from bertfuse.errors import BertfuseError
from bertfuse.pipeline.options import GROUPS, OPTIMIZE_OPTIONS, OPTIONS, ConvertOptions

PACKAGE = Path(bertfuse.__file__).parent
TABLE = PACKAGE / "pipeline" / "options.py"
# Where convert's options travel (the defaults scan); choice lists are looked for everywhere.
# Other rooms have options of their own that share a name (kernels check --seed, example
# --seed, bench's workloads' batch and seq).
ROUTE = ("api.py", "cli/args.py", "cli/convert.py", "cli/inspect.py", "pipeline", "converter",
         "passes/manager.py", "passes/plans.py", "inspect", "io/safety.py")
# The source formats are the converter's own list (detection names them); the table reads it.
OWNED_ELSEWHERE = {("converter/__init__.py", "kind")}
OWN_OPTIONS = ("converter/example.py",)  # `bertfuse example --seed`: the weights' seed


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[name]


def test_convert_options_has_one_field_per_option_with_its_default():
    assert [f.name for f in fields(ConvertOptions)] == list(OPTIONS)
    defaults = ConvertOptions()
    for name, option in OPTIONS.items():
        assert getattr(defaults, name) == option.default, name
    assert {n for names in GROUPS.values() for n in names} == set(OPTIONS)


@pytest.mark.parametrize("command, names", [
    ("convert", tuple(OPTIONS)),
    ("verify", GROUPS["TF source"] + GROUPS["verification"]),
    ("optimize", OPTIMIZE_OPTIONS),
])
def test_cli_flags_read_the_table(command, names):
    actions = {a.dest: a for a in _subparser(command)._actions
               if a.help != argparse.SUPPRESS}  # an old spelling (pipeline/renamed.py)
    for name in names:
        option, action = OPTIONS[name], actions[name]
        assert option.cli_flag in action.option_strings, (command, name)
        if option.cli_type == "flag":  # store_true / store_false: the default is the table's
            assert action.default is option.default, (command, name)
        else:
            assert action.default == option.default, (command, name)
            assert tuple(action.choices or ()) == tuple(option.choices or ()), (command, name)


@pytest.mark.parametrize("function, names, documented", [
    (bertfuse.convert, tuple(OPTIONS), tuple(OPTIONS)),
    # optimize's inputs rename the export's inputs: its docstring says so in its own words
    (bertfuse.optimize, OPTIMIZE_OPTIONS, OPTIMIZE_OPTIONS[1:])])
def test_api_keywords_read_the_table(function, names, documented):
    params = inspect.signature(function).parameters
    for name in names:
        option = OPTIONS[name]
        assert params[option.keyword].default == option.default, option.keyword
    for name in documented:
        option = OPTIONS[name]
        assert f"    {option.keyword} (default {option.default!r}" in function.__doc__


def test_cli_and_api_agree_on_every_default():
    """The same options parsed from an empty command line and from no keywords."""
    from bertfuse.cli.args import options_from_args

    args = _subparser("convert").parse_args(["src", "-o", "out.onnx"])
    assert options_from_args(args) == ConvertOptions()


@pytest.mark.parametrize("keyword, value, needle", [
    ("ops", "cudnn", "ops 'cudnn' is not one of contrib, bertfuse"),
    ("format", "torch", "format 'torch' is not one of"),
    ("batch", True, "batch must be an integer, not True"),
    ("force", 1, "force must be True or False"),
])
def test_each_option_is_checked_by_its_own_rule(keyword, value, needle):
    with pytest.raises(BertfuseError) as info:
        bertfuse.convert("missing-source", **{keyword: value})
    assert needle in str(info.value)


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _written_again(package: Path = PACKAGE) -> list[str]:
    """Where a file other than the table writes an option's choice list, or gives a
    parameter or flag of an option's name the option's default as a literal."""
    choice_sets = {frozenset(o.choices): name for name, o in OPTIONS.items() if o.choices}
    names = {o.keyword: o for o in OPTIONS.values()} | OPTIONS
    flags = {o.cli_flag: o for o in OPTIONS.values()}
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == TABLE:
            continue
        where = path.relative_to(package.parent)
        rel = path.relative_to(package).as_posix()
        on_route = any(rel == r or rel.startswith(r + "/") for r in ROUTE) and \
            rel not in OWN_OPTIONS
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                value = _literal(node)
                if value and all(isinstance(v, str) for v in value) and \
                        frozenset(value) in choice_sets and \
                        (rel, choice_sets[frozenset(value)]) not in OWNED_ELSEWHERE:
                    found.append(f"{where}:{node.lineno}: the choices of "
                                 f"{choice_sets[frozenset(value)]}")
            elif not on_route:
                continue
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.args + node.args.kwonlyargs
                defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + \
                    list(node.args.defaults) + list(node.args.kw_defaults)
                for arg, default in zip(args, defaults):
                    option = names.get(arg.arg)
                    if option is not None and default is not None and \
                            _is_default(_literal(default), option.default):
                        found.append(f"{where}:{node.lineno}: {arg.arg}={option.default!r}")
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flag = next((_literal(a) for a in node.args if isinstance(_literal(a), str)
                             and _literal(a) in flags), None)
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                if flag and default is not None and \
                        _is_default(_literal(default), flags[flag].default):
                    found.append(f"{where}:{node.lineno}: {flag} default")
    return found


def _is_default(value, default) -> bool:
    # None and booleans say nothing (every optional or flag has them); a string or a number
    # equal to the table's default is the default written again.
    if isinstance(default, bool) or default is None or isinstance(value, bool):
        return False
    return value == default and type(value) is type(default)


def test_no_default_or_choice_list_is_written_twice():
    assert _written_again() == []


def test_the_scan_finds_a_default_written_again(tmp_path):
    """The scan itself: each kind of copy, in a file that is not the table, is found."""
    (tmp_path / "pkg" / "pipeline").mkdir(parents=True)
    (tmp_path / "pkg" / "pipeline" / "copy.py").write_text(
        'OPS = ("contrib", "bertfuse")\n'
        'def convert(src, precision="fp32", *, seq=32, opset=17, strict=False):\n'
        '    p.add_argument("--signature", default="serving_default")\n')
    found = _written_again(tmp_path / "pkg")
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "--signature default", "opset=17", "precision='fp32'", "seq=32",
        "the choices of ops"], found
