"""Session fixtures: one tiny BERT in every TF source form bertfuse reads (builders/tf_models.py).

Each source fixture returns a `TFModel` (see tf_models.py). Fixtures: ckpt_erf, ckpt_tanh,
ckpt_head (Google TF1 checkpoints), frozen_pb (GraphDef with the weights as Const),
savedmodel_dir (TF2 SavedModel, Google math, TF-Hub style input names), keras_file (keras-hub
BertBackbone saved as .keras), keras_functional_file (a functional Keras 3 BERT: int64 inputs,
exact gelu, dict keys differing from Input names), hf_style_savedmodel (a Hugging Face
TFBertModel-style SavedModel, int64 inputs), ckpt_finetune (ckpt_head plus adam slots and
global_step; not in SOURCE_FIXTURES).
`tf_model` takes a fixture name by indirect parametrisation; `convert_cached` converts once
per session. Test files import ROLES, SEED, SOURCE_FIXTURES, TFModel and tiny_config from here or from
support.builders.tf_models.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The parity reference needs oneDNN's rewrites off (bertfuse/converter/reference.py). Set
# before TensorFlow loads, the test process computes it in-process; otherwise every convert
# would start a reference worker. tests/unit/pipeline/test_gate.py runs real processes with it on.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from support.builders.tf_models import (ROLES, SEED, SOURCE_FIXTURES, TFModel,  # noqa: E402,F401
                                build_checkpoint, build_finetune_checkpoint, build_frozen,
                                build_hf_style, build_keras_functional, build_keras_hub,
                                build_savedmodel, tiny_config)


def pytest_configure(config):
    # keras_functional_file keys its dict inputs differently from its Input names on purpose;
    # Keras' TF backend converts tensors with np.array(x) (NumPy 2 copy-keyword notice).
    config.addinivalue_line("filterwarnings",
                            "ignore:When providing `inputs` as a dict:UserWarning")
    config.addinivalue_line("filterwarnings",
                            "ignore:__array__ implementation doesn't accept a copy keyword"
                            ":DeprecationWarning")


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def sources_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tf_sources")


def _named(model: TFModel, name: str) -> TFModel:
    model.name = name
    return model


@pytest.fixture(scope="session")
def ckpt_erf(sources_dir) -> TFModel:
    return _named(build_checkpoint(sources_dir / "ckpt_erf", "gelu"), "ckpt_erf")


@pytest.fixture(scope="session")
def ckpt_tanh(sources_dir) -> TFModel:
    return _named(build_checkpoint(sources_dir / "ckpt_tanh", "gelu_new"), "ckpt_tanh")


@pytest.fixture(scope="session")
def ckpt_head(sources_dir) -> TFModel:
    return _named(build_checkpoint(sources_dir / "ckpt_head", "gelu", head=True), "ckpt_head")


@pytest.fixture(scope="session")
def ckpt_finetune(sources_dir, ckpt_head) -> TFModel:
    return build_finetune_checkpoint(ckpt_head, sources_dir / "ckpt_finetune")


@pytest.fixture(scope="session")
def frozen_pb(sources_dir) -> TFModel:
    return _named(build_frozen(sources_dir / "frozen_bert.pb"), "frozen_pb")


@pytest.fixture(scope="session")
def savedmodel_dir(sources_dir) -> TFModel:
    return _named(build_savedmodel(sources_dir / "savedmodel"), "savedmodel_dir")


@pytest.fixture(scope="session")
def keras_file(sources_dir) -> TFModel:
    pytest.importorskip("keras_hub")
    return _named(build_keras_hub(sources_dir / "bert_backbone.keras"), "keras_file")


@pytest.fixture(scope="session")
def keras_functional_file(sources_dir) -> TFModel:
    return _named(build_keras_functional(sources_dir / "functional_bert.keras"),
                  "keras_functional_file")


@pytest.fixture(scope="session")
def hf_style_savedmodel(sources_dir) -> TFModel:
    return _named(build_hf_style(sources_dir / "hf_style_savedmodel"), "hf_style_savedmodel")


@pytest.fixture
def tf_model(request) -> TFModel:
    """Indirect-parametrise with a fixture name: `@pytest.mark.parametrize('tf_model',
    SOURCE_FIXTURES, indirect=True)`."""
    return request.getfixturevalue(request.param)


@dataclass
class Converted:
    source: TFModel
    onnx_path: str
    exit_code: int
    report: dict  # the `--json` report


@pytest.fixture(scope="session")
def convert_cached(tmp_path_factory) -> Callable[..., Converted]:
    """convert_cached(model, *extra_cli_args) -> Converted; `bertfuse convert --json` once per
    (model, args) per session, parity checked at batch 5, seed 0."""
    from bertfuse import cli

    out_dir = tmp_path_factory.mktemp("onnx")
    cache: dict[tuple, Converted] = {}

    def convert(model: TFModel, *extra: str) -> Converted:
        key = (model.name, model.path, extra)
        if key not in cache:
            import contextlib
            import io

            suffix = "_".join(e.strip("-") for e in extra)
            out = out_dir / f"{model.name}{'_' + suffix if suffix else ''}.onnx"
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                code = cli.main(["convert", model.path, "-o", str(out), "--json", "--batch", "5",
                                 "--seed", "0", *extra])
            text = buf.getvalue()
            report = json.loads(text) if text.strip() else {}
            cache[key] = Converted(model, str(out), code, report)
        return cache[key]

    return convert


# -- fresh random inputs for every test; a failing seed replays with BERTFUSE_TEST_SEED -------

@pytest.fixture
def seed() -> int:
    env = os.environ.get("BERTFUSE_TEST_SEED")
    return int(env) if env else random.randrange(2**31)


@pytest.fixture
def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def tiny_onnx(ckpt_erf, convert_cached) -> dict[str, str]:
    """The ckpt_erf model converted three ways: 'fp32' / 'fp16' fused, 'raw' (tf2onnx graph
    with the canonical interface), as paths."""
    out = {}
    for name, extra in (("fp32", ()), ("fp16", ("--precision", "fp16")),
                        ("raw", ("--no-fuse", "--no-verify"))):
        conv = convert_cached(ckpt_erf, *extra)
        assert conv.exit_code == 0, (name, conv.report)
        out[name] = conv.onnx_path
    return out
