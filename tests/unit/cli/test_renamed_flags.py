"""The op form written at convert/optimize is `--ops contrib|bertfuse` (API `ops=`), bench's set
of forms `--forms contrib|both`; the old spellings (`--kernels ort|bertfuse`, `--kernels
ort|both`, the value `ort`, the API's `kernels=`) still work for one release: the same model and
report, with one deprecation line on stderr (a DeprecationWarning in Python), never on --json's
stdout. The load-time `--kernels auto|ort|bertfuse` (verify, serve, score) keeps its name."""

from __future__ import annotations

import json
import warnings

import onnx
import pytest

import bertfuse
from bertfuse.cli import main
from bertfuse.errors import BertfuseError

DEPRECATED = "bertfuse: deprecated: "


def _run(capsys, argv: list[str]) -> tuple[int, str, list[str]]:
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err.strip().splitlines()


def _comparable(report: dict) -> dict:
    """A report without what differs between two runs of the same thing: times, the output
    path, tool versions."""
    drop = {"seconds", "elapsed_s", "output", "tools", "duration_s", "time_s"}

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in drop}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(report)


@pytest.mark.parametrize("new, old, report_value", [
    (["--ops", "bertfuse"], ["--kernels", "bertfuse"], "bertfuse"),
    (["--ops", "contrib"], ["--kernels", "ort"], "ort"),
    (["--ops", "contrib"], ["--ops", "ort"], "ort"),
])
def test_optimize_old_spelling_same_model_and_report_one_line(tiny_onnx, tmp_path, capsys, new,
                                                               old, report_value):
    runs = {}
    for name, flags in (("new", new), ("old", old)):
        out = tmp_path / f"{name}.onnx"
        code, stdout, err = _run(capsys, ["optimize", tiny_onnx["raw"], "-o", str(out),
                                          "--precision", "fp16", *flags, "--json"])
        assert code == 0, (stdout, err)
        runs[name] = (out.read_bytes(), json.loads(stdout), err)  # stdout: the JSON alone
    (new_model, new_report, new_err), (old_model, old_report, old_err) = runs["new"], runs["old"]
    assert new_model == old_model
    assert _comparable(new_report) == _comparable(old_report)
    # the report keeps the option's name and values from before the rename
    assert new_report["options"]["kernels"] == report_value and "ops" not in new_report["options"]
    assert new_err == []
    assert old_err == [f"{DEPRECATED}{' '.join(old)} is now {' '.join(new)}; the old spelling "
                       f"is accepted until the next release"]


def test_convert_old_spelling_is_the_same_options_and_one_line(ckpt_erf, tmp_path, capsys):
    """Refused before any TF work: the deprecation line, then the error in the new words; the
    --json report on stdout is the one the new spelling gives."""
    outs = {}
    for flags in (["--ops", "bertfuse"], ["--kernels", "bertfuse"]):
        code, stdout, err = _run(capsys, ["convert", ckpt_erf.path, "-o",
                                          str(tmp_path / "m.onnx"), *flags, "--json"])
        assert code == 2
        outs[flags[0]] = (json.loads(stdout), err)
    (new, new_err), (old, old_err) = outs["--ops"], outs["--kernels"]
    assert new == old and new["error"]["message"].startswith("--ops bertfuse needs --precision")
    assert len(new_err) == 1 and old_err[1:] == new_err
    assert old_err[0].startswith(f"{DEPRECATED}--kernels bertfuse is now --ops bertfuse")
    assert not list(tmp_path.iterdir())


def test_convert_and_optimize_parse_old_and_new_alike():
    from bertfuse.cli.args import options_from_args
    from bertfuse.cli.parser import build_parser

    parser = build_parser()
    for command, source in (("convert", "src"), ("optimize", "raw.onnx")):
        def opts(*flags):
            return options_from_args(parser.parse_args([command, source, "-o", "o.onnx", *flags]))
        assert opts().ops == opts("--ops", "contrib").ops == opts("--kernels", "ort").ops == \
            opts("--ops", "ort").ops == "contrib"
        assert opts("--ops", "bertfuse") == opts("--kernels", "bertfuse")
    # the old flag is hidden; the new one shows its two values
    text = parser._subparsers._group_actions[0].choices["convert"].format_help()
    assert "--ops {contrib,bertfuse}" in text and "--kernels" not in text
    # verify's --kernels is the load-time choice, unchanged and not deprecated
    args = parser.parse_args(["verify", "m.onnx", "--kernels", "auto"])
    assert args.session_kernels == "auto" and not getattr(args, "_renamed", None)


@pytest.mark.parametrize("new, old", [(["--forms", "contrib"], ["--kernels", "ort"]),
                                      (["--forms", "both"], ["--kernels", "both"]),
                                      (["--forms", "contrib"], ["--forms", "ort"])])
def test_bench_forms_old_spelling_one_line_and_pure_json(tmp_path, capsys, new, old):
    """No skeleton: refused before the GPU is asked for, with the same report either way."""
    seen = {}
    for name, flags in (("new", new), ("old", old)):
        code, stdout, err = _run(capsys, ["bench", "--skeletons", str(tmp_path), *flags,
                                          "--workloads", "base b1 s128", "--packed", "--json",
                                          "--out", str(tmp_path)])
        assert code == 2
        seen[name] = (json.loads(stdout), err)
    (new_report, new_err), (old_report, old_err) = seen["new"], seen["old"]
    assert new_report == old_report and "no skeleton for base" in new_report["error"]["message"]
    assert old_err[1:] == new_err and len(new_err) == 1
    assert old_err[0] == (f"{DEPRECATED}{' '.join(old)} is now {' '.join(new)}; the old "
                          f"spelling is accepted until the next release")
    from bertfuse.cli.parser import build_parser

    args = build_parser().parse_args(["bench", "--skeletons", ".", *old])
    assert args.forms == new[1]


def test_api_old_keyword_warns_once_and_gives_the_same_model(tiny_onnx):
    new, report = bertfuse.optimize(tiny_onnx["raw"], precision="fp16", ops="bertfuse")
    with pytest.warns(DeprecationWarning) as caught:
        old, old_report = bertfuse.optimize(tiny_onnx["raw"], precision="fp16", kernels="bertfuse")
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        "optimize(kernels='bertfuse') is deprecated, use optimize(ops='bertfuse') (the old "
        "keyword is accepted until the next release)"]
    assert caught[0].filename == __file__  # it points at the caller
    assert new.SerializeToString() == old.SerializeToString()
    assert report.to_json()["options"] == old_report.to_json()["options"]
    assert report.to_json()["options"]["kernels"] == "bertfuse"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new keyword warns nothing
        bertfuse.optimize(tiny_onnx["raw"], ops="contrib", verify=False)


def test_api_old_value_and_both_keywords(tiny_onnx):
    with pytest.warns(DeprecationWarning, match=r"optimize\(ops='ort'\) is deprecated, use "
                                                r"optimize\(ops='contrib'\)"):
        model, report = bertfuse.optimize(tiny_onnx["raw"], ops="ort", verify=False)
    assert report.to_json()["options"]["kernels"] == "ort"
    assert not [n for n in model.graph.node if n.domain == "ai.bertfuse"]
    with pytest.warns(DeprecationWarning), pytest.raises(BertfuseError, match="not both"):
        bertfuse.optimize(tiny_onnx["raw"], precision="fp16", ops="bertfuse", kernels="bertfuse")
    with pytest.warns(DeprecationWarning, match=r"convert\(kernels='ort'\)"), \
            pytest.raises(BertfuseError, match="batch"):
        bertfuse.convert(tiny_onnx["raw"], kernels="ort", batch=0)  # refused before any work


def test_no_page_shows_an_old_spelling():
    """The user pages show convert/optimize/bench with the new flags only (the old ones are
    still parsed, so tests/unit/test_docs.py alone would let them linger)."""
    from support.markdown import PAGES, command_lines, read

    old = []
    for page in PAGES:
        for line in command_lines(read(page)):
            words = line.split()
            command = words[words.index("bertfuse") + 1]
            if command in ("convert", "optimize", "bench") and "--kernels" in words:
                old.append(f"{page.name}: {line[:120]}")
    assert old == []
