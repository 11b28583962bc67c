"""docs/transformers.md, run as written: a transformers TF classifier exported with
`save_pretrained(DIR, saved_model=True)`, converted with `bertfuse convert`, and checked on text
through bertfuse's tokenizer against transformers' own tokenizer and model.

The page's code blocks are what runs: its export block (with `name` pointed at a tiny
random-weight TFBertForSequenceClassification saved here first), its `bertfuse convert` line
(with --json), and its check block. The environment is the page's tensorflow-cpu one, which
the Makefile installs (transformers<5 from the `test` extra, tf-keras with --no-deps): the
second test checks that the page's pip lines and the Makefile's/pyproject's say the same.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from support import paths

PAGE = paths.ROOT / "docs" / "transformers.md"
# Text that exercises lower-casing, punctuation, word pieces, [UNK] and padding (rows differ).
QUERIES = ["What is BERT?", "how fast is the small model", "The texts of a query, and passages!"]
WORDS = ("the a is of and to what how bert model fast text small query passage "
         "##s ? , ! .").split()

# A tiny classifier and its tokenizer, saved the ordinary way (tf_model.h5 + config.json +
# tokenizer files): the "your classifier" the page's export block starts from. Every bias,
# gamma and beta is moved by seeded noise so a dropped one shows in parity.
SOURCE = """
import sys
import numpy as np
import tensorflow as tf
from transformers import BertConfig, BertTokenizerFast, TFBertForSequenceClassification

out, words = sys.argv[1], sys.argv[2].split()
with open("vocab.txt", "w") as f:
    f.write("\\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\\n")
tok = BertTokenizerFast(vocab_file="vocab.txt", do_lower_case=True)
tf.keras.utils.set_random_seed(7)
cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                 num_labels=3, initializer_range=0.2)
model = TFBertForSequenceClassification(cfg)
model(model.dummy_inputs)
rng = np.random.default_rng(7)
for w in model.weights:
    if w.name.split("/")[-1].split(":")[0] in ("bias", "gamma", "beta"):
        w.assign(w.numpy() + rng.uniform(-0.5, 0.5, tuple(w.shape)).astype(np.float32))
model.save_pretrained(out)
tok.save_pretrained(out)
"""


def _blocks(lang: str) -> list[str]:
    """The page's fenced code blocks of one language ('' for the untagged shell blocks)."""
    blocks, tag, lines = [], None, []
    for line in PAGE.read_text().splitlines():
        if line.startswith("```"):
            if tag is None:
                tag, lines = line[3:].strip(), []
                continue
            if tag == lang:
                blocks.append("\n".join(lines) + "\n")
            tag = None
        elif tag is not None:
            lines.append(line)
    return blocks


def _block(lang: str, needle: str) -> str:
    found = [b for b in _blocks(lang) if needle in b]
    assert len(found) == 1, f"{PAGE.name}: {len(found)} ```{lang} blocks hold {needle!r}"
    return found[0]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}  # as the page
    env["PYTHONPATH"] = os.pathsep.join([str(paths.ROOT), env.get("PYTHONPATH", "")])
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0")
    return env


def _python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_pages_steps_convert_a_transformers_classifier_that_matches_it(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed: "
                        "pip install 'transformers>=4.50,<5' (the `test` extra has it)")
    pytest.importorskip("tensorflow")
    import onnx

    _python(SOURCE, tmp_path, "src", " ".join(WORDS))
    (tmp_path / "queries.txt").write_text("\n".join(QUERIES) + "\n")

    # 1. The page's export, from the folder above instead of a Hub name.
    export = _block("python", "saved_model=True")
    export, n = re.subn(r'^name = "[^"]*"', 'name = "src"', export, flags=re.M)
    assert n == 1, "the export block sets `name = \"...\"` once"
    _python(export, tmp_path)
    assert (tmp_path / "hf_cls" / "saved_model" / "1" / "saved_model.pb").is_file()

    # 2. The page's convert line, with --json.
    line = next(ln for ln in _block("", "bertfuse convert").splitlines()
                if ln.startswith("bertfuse convert"))
    argv = [sys.executable, "-m", "bertfuse", *shlex.split(line)[1:], "--json"]
    proc = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=600)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"], (proc.stderr[-2000:], report.get("error"))
    parity = report["parity"]
    assert parity["ok"] and all(row["ok"] for row in parity["outputs"]), parity
    assert "queries.txt" in parity["inputs"], parity["inputs"]  # compared on the text too
    assert [o["name"] for o in report["outputs"]] == ["logits"], report["outputs"]
    ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "hf_cls.onnx")).graph.node)
    assert ops["Attention"] == 2 and ops["EmbedLayerNormalization"] == 1 \
        and ops["SkipLayerNormalization"] == 4 and not ops["Softmax"], ops

    # 3. The page's check: the same text through transformers (its tokenizer and model) and
    #    through bertfuse's WordPiece and the fused model.
    check = _block("python", "Session(")
    proc = _python(check + '\nnp.save("got.npy", got)\nnp.save("want.npy", want)\n', tmp_path)
    got, want = np.load(tmp_path / "got.npy"), np.load(tmp_path / "want.npy")
    assert got.shape == want.shape == (len(QUERIES), 3)
    assert np.abs(want - want[0]).max() > 1e-3, want  # the rows differ: the text matters
    diff = float(np.abs(got - want).max())
    assert diff <= 1e-4, (got, want)
    assert f"max |bertfuse - transformers|: {diff}" in proc.stdout, proc.stdout


def _pip_lines(block: str) -> list[list[str]]:
    return [shlex.split(ln)[2:] for ln in block.splitlines() if ln.startswith("pip install ")]


def test_the_pages_pip_lines_agree_with_the_makefile_and_pyproject():
    project = tomllib.loads((paths.ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    (tested,) = [Requirement(r) for r in extras["test"] if Requirement(r).name == "transformers"]
    makefile = (paths.ROOT / "Makefile").read_text()

    full, cpu = _block("", "tf-keras\n"), _block("", "--no-deps")
    for block in (full, cpu):
        (wanted,) = [Requirement(a) for args in _pip_lines(block) for a in args
                     if a.startswith("transformers")]
        assert wanted.specifier == tested.specifier, (str(wanted), str(tested))
    # The full tensorflow: tf-keras with its dependencies, beside the `tf` extra.
    assert any("tf-keras" in args and "--no-deps" not in args for args in _pip_lines(full))
    assert any(re.fullmatch(r"\.\[tf(,.*)?\]", a) for args in _pip_lines(full) for a in args)
    # tensorflow-cpu: tf-keras alone (--no-deps) at TensorFlow's minor, as the Makefile does.
    (keras_line,) = [args for args in _pip_lines(cpu) if any("tf-keras" in a for a in args)]
    assert "--no-deps" in keras_line, keras_line
    (pin,) = [Requirement(a) for a in keras_line if a.startswith("tf-keras")]
    (tf_cpu,) = [Requirement(r) for r in extras["tf-cpu"] if r.startswith("tensorflow-cpu")]
    upper = next(s.version for s in tf_cpu.specifier if s.operator == "<")  # 2.22
    major, minor = map(int, upper.split(".")[:2])
    assert str(pin.specifier) == f"=={major}.{minor - 1}.*", (str(pin), str(tf_cpu))
    recipe = re.search(r"pip install -q --no-deps (.*?);; esac", makefile, re.S)
    assert recipe and '"tf-keras==$$tf.*"' in recipe.group(1), "the Makefile's --no-deps line"
    (first,) = [a for a in _pip_lines(cpu)[0]]
    assert first == ".[all-cpu]" and "all-cpu" in extras, first
