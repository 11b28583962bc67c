"""`bertfuse verify --device --kernels` on the CPU (pipeline/stages.verify, runtime/kernel_choice.py's
choose()): the report says which kernels ran and why, in text and JSON; `--kernels bertfuse`
without CUDA, `--device cuda` without the CUDA EP and a bad value are each one line, exit 2,
before TensorFlow loads. The CUDA path (bertfuse's ops against TF) needs a GPU: not here."""

from __future__ import annotations

import json

import onnxruntime as ort
import pytest

from bertfuse import cli
from bertfuse.errors import BertfuseError
from bertfuse.pipeline import stages
from bertfuse.pipeline.options import ConvertOptions

CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
cpu_only = pytest.mark.skipif(CUDA, reason="checks the CPU-only refusals")


@pytest.fixture(scope="module")
def converted(ckpt_erf, convert_cached):
    done = convert_cached(ckpt_erf)
    assert done.exit_code == 0, done.report
    return ckpt_erf.path, done.onnx_path


def _verify(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["verify", *args])
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.mark.parametrize("kernels,reason", [("auto", "bertfuse's ops run on CUDA only"),
                                            ("ort", "asked")])
def test_the_report_names_the_kernels_that_ran(converted, capsys, kernels, reason):
    src, model = converted
    code, out, err = _verify(capsys, model, "--against", src, "--json", "--device", "cpu",
                             "--kernels", kernels)
    assert code == 0, err
    report = json.loads(out)
    parity = report["parity"]
    assert parity["ok"] and parity["device"] == "cpu"
    assert (parity["kernels"]["asked"], parity["kernels"]["used"]) == (kernels, "ort")
    assert reason in parity["kernels"]["reason"]
    assert (report["options"]["kernels"], report["options"]["device"]) == (kernels, "cpu")


def test_the_text_report_has_the_choice_line(converted, capsys):
    src, model = converted
    code, out, err = _verify(capsys, model, "--against", src)  # defaults: auto, auto
    assert code == 0, err
    device = "cuda" if CUDA else "cpu"
    line = next(ln for ln in out.splitlines() if ln.startswith("device: "))
    assert line.startswith(f"device: {device}; kernels=auto: "), line


@cpu_only
def test_bertfuse_kernels_on_the_cpu_is_one_line_exit_2(converted, capsys):
    src, model = converted
    for args, words in ((["--kernels", "bertfuse"], "bertfuse's ops run on CUDA only"),
                        (["--kernels", "bertfuse", "--device", "auto"], "CUDA only"),
                        (["--device", "cuda"], "no CUDA execution provider")):
        code, out, err = _verify(capsys, model, "--against", src, *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and words in lines[0], (args, err)
        assert out == ""  # refused before any stage ran: no report


def test_bad_values_are_refused_before_any_work(converted, capsys, tmp_path):
    src, model = converted
    for args in (["--kernels", "fast"], ["--device", "tpu"]):
        code, _, err = _verify(capsys, model, "--against", src, *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "invalid choice" in lines[0], err
    for kwargs in ({"kernels": "fast"}, {"device": "gpu"}, {"kernels": None}):
        with pytest.raises(BertfuseError):  # the API's checks, before the model is read
            stages.verify(str(tmp_path / "missing.onnx"), src, ConvertOptions(), **kwargs)


def test_a_lowered_model_cannot_be_checked_on_contrib_ops(converted, tmp_path, capsys):
    """kernels='ort' on a model already written with bertfuse's ops: choose()'s one line."""
    import onnx

    from bertfuse.ops.contract import BERTFUSE_DOMAIN

    src, model = converted
    proto = onnx.load(model)
    node = next(n for n in proto.graph.node if n.domain == "com.microsoft")
    node.domain = BERTFUSE_DOMAIN  # enough for choose() to see bertfuse's ops
    lowered = tmp_path / "lowered.onnx"
    onnx.save(proto, lowered)
    code, _, err = _verify(capsys, str(lowered), "--against", src, "--kernels", "ort",
                           "--device", "cpu")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "cannot be run on ONNX Runtime's contrib" \
        in lines[0], err
