"""A missing optional package is one line naming it, with the pip line, and exit 2 (never
"internal error", exit 3): here Ray, for `serve` and `score` on a host without the ray extra."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

from bertfuse.errors import install_hint, missing_dependency_message, pip_target
from support.builders.onnx_graphs import bert

# Hide Ray from the child: `import ray` then fails as it does where Ray is not installed.
NO_RAY = "import sys; sys.modules['ray'] = None\nfrom bertfuse.cli import main\nsys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    model = bert(np.random.default_rng(0), layers=1, hidden=16)
    for out, dims in zip(model.graph.output, (["B", "S", 16], ["B", 16])):
        out.type.CopyFrom(onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, dims))
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("input") / "ids.parquet"
    pq.write_table(pa.table({"ids": [[2, 5, 7, 3]]}), str(path))
    return str(path)


@pytest.mark.parametrize("command", ["serve", "score"])
def test_serve_and_score_without_ray_name_the_extra(command, model, parquet, tmp_path):
    argv = [model, "--port", "18765"] if command == "serve" else \
        ["--model", model, "--input", parquet, "--output", str(tmp_path / "out"), "--ids-column", "ids"]
    proc = subprocess.run([sys.executable, "-c", NO_RAY, command, *argv], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and install_hint("ray") in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_only_optional_packages_get_a_pip_line():
    assert install_hint("tf") in missing_dependency_message(
        ModuleNotFoundError("No module named 'tf2onnx'", name="tf2onnx"))
    assert missing_dependency_message(ModuleNotFoundError("x", name="numpyy")) is None
    assert missing_dependency_message(ValueError("ray")) is None


@pytest.mark.parametrize("record, target", [
    (None, "'bertfuse[tf]'"),  # from a package index: pip records no URL
    ({"url": "file:///src/bertfuse", "dir_info": {"editable": True}}, "-e '/src/bertfuse[tf]'"),
    ({"url": "file:///src/bert%20fuse", "dir_info": {}}, "'/src/bert fuse[tf]'"),
    ({"url": "file:///w/bertfuse-0.1.0-py3-none-any.whl", "archive_info": {}},
     "'/w/bertfuse-0.1.0-py3-none-any.whl[tf]'"),
    ({"url": "https://example.org/bertfuse.git", "vcs_info": {"vcs": "git", "commit_id": "a"}},
     "'bertfuse[tf] @ git+https://example.org/bertfuse.git'")])
def test_the_pip_line_names_the_form_bertfuse_was_installed_in(record, target):
    """bertfuse is on no package index: 'bertfuse[tf]' fails for a user who installed it from
    a clone or a wheel, so the line names what pip recorded (PEP 610's direct_url.json)."""
    assert pip_target(record, "tf") == target


def test_the_pip_line_of_this_checkout_names_it():
    """The suite runs from a clone installed as the README says (`make venv`: pip install -e
    '.[...]'), so the line must name this folder, from the test's folder and from elsewhere."""
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    here = install_hint("tf")
    elsewhere = subprocess.run([sys.executable, "-c", "from bertfuse.errors import install_hint; "
                                "print(install_hint('tf'))"], capture_output=True, text=True,
                               cwd="/", timeout=120).stdout.strip()
    assert here == elsewhere and f"'{root}[tf]'" in here, (here, elsewhere)


HIDE = ("import sys\nfor name in sys.argv[1].split(','):\n    sys.modules[name] = None\n"
        "from bertfuse.cli import main\nsys.exit(main(sys.argv[2:]))")


@pytest.mark.parametrize("command", ["serve", "score", "convert"])
def test_several_missing_packages_are_one_line_with_one_pip_line(command, model, parquet,
                                                                 tmp_path):
    """serve --vocab needs Ray and tokenizers, score on a text column the same, convert on
    --text-file TensorFlow and tokenizers: one line names every missing one and the one extra
    that holds them all, not one error per package."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nwhat\n")
    (tmp_path / "q.txt").write_text("what\n")
    (tmp_path / "sm").mkdir()
    (tmp_path / "sm" / "saved_model.pb").write_bytes(b"")
    hidden, argv = {
        "serve": ("ray,tokenizers", [model, "--port", "18765", "--vocab", str(vocab)]),
        "score": ("ray,tokenizers", ["--model", model, "--input", parquet, "--output",
                                     str(tmp_path / "out"), "--text-column", "ids",
                                     "--vocab", str(vocab)]),
        "convert": ("tensorflow,tokenizers", ["sm", "-o", "m.onnx", "--text-file", "q.txt",
                                              "--vocab", str(vocab)])}[command]
    proc = subprocess.run([sys.executable, "-c", HIDE, hidden, command, *argv],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"{hidden.replace(',', ', ')} are not installed" in lines[0], lines
    assert install_hint("all-cpu") in lines[0] and "all-gpu]' on CUDA" in lines[0], lines
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.onnx").exists()


def test_one_missing_package_still_names_its_own_extra(model, tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nwhat\n")
    proc = subprocess.run([sys.executable, "-c", HIDE, "tokenizers", "serve", model, "--port",
                           "18765", "--vocab", str(tmp_path / "vocab.txt")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].endswith(install_hint("text")) and "all-cpu" not in lines[0], lines
