"""Checkpoint layouts and configs (converter/ckpt_layout.py): `--config` is honoured for a
checkpoint directory, with no config beside it and over one that is; an unknown layout and an
ELECTRA checkpoint without its hparams are refused in one line; ELECTRA's --hparams give its
BertConfig the way its training code derives it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from support import paths

from bertfuse.cli import main
from bertfuse.converter.ckpt_layout import Layout, electra_hparams, read_config

tf = pytest.importorskip("tensorflow")
ELECTRA = paths.FIXTURES / "thirdparty" / "gr_electra"


def _copy_checkpoint(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        if ".ckpt" in f.name or f.name == "checkpoint":
            shutil.copy(f, dst / f.name)
    return dst


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_config_for_a_checkpoint_dir_without_one_beside(ckpt_erf, tmp_path, capsys):
    bare = _copy_checkpoint(Path(ckpt_erf.path), tmp_path / "bare")
    out = tmp_path / "m.onnx"
    assert main(["convert", str(bare), "-o", str(out)]) == 2
    assert "no bert_config.json or albert_config.json beside" in _one_line_error(capsys)
    cfg = tmp_path / "elsewhere.json"
    shutil.copy(Path(ckpt_erf.path) / "bert_config.json", cfg)
    assert main(["convert", str(bare), "--config", str(cfg), "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parity"]["ok"] and report["passes"]["encoder"]["fully_fused"]
    # --config wins over the file beside the checkpoint: a wrong one there is not read
    wrong = json.loads(cfg.read_text()) | {"num_hidden_layers": 3}
    (bare / "bert_config.json").write_text(json.dumps(wrong))
    assert main(["convert", str(bare), "-o", str(out), "--force"]) == 2
    assert "does not match checkpoint" in _one_line_error(capsys)
    assert main(["convert", str(bare), "--config", str(cfg), "-o", str(out), "--force"]) == 0
    assert len([n for n in onnx.load(out).graph.node if n.op_type == "Attention"]) == 2


def test_unknown_layout_is_refused_in_one_line(tmp_path, capsys):
    ckpt = tmp_path / "other"
    ckpt.mkdir()
    names = ["model/dense/bias", "model/dense/kernel"]
    tf.raw_ops.SaveV2(prefix=str(ckpt / "model.ckpt"), tensor_names=names,
                      shape_and_slices=["", ""],
                      tensors=[np.zeros(4, np.float32), np.zeros((4, 4), np.float32)])
    (ckpt / "bert_config.json").write_text(json.dumps({"vocab_size": 10}))
    assert main(["convert", str(ckpt), "-o", str(tmp_path / "m.onnx")]) == 2
    err = _one_line_error(capsys)
    assert "layout not recognised" in err and "model/dense/bias" in err, err


def test_electra_without_its_hparams_is_refused_in_one_line(tmp_path, capsys):
    bare = _copy_checkpoint(ELECTRA / "model", tmp_path / "electra")
    assert main(["convert", str(bare), "-o", str(tmp_path / "m.onnx")]) == 2
    err = _one_line_error(capsys)
    assert "ELECTRA" in err and "--config" in err, err


def test_electra_hparams_as_electra_derives_them(tmp_path):
    """training_utils.get_bert_config: sizes by model_size, heads hidden/64, FFN 4x hidden,
    then the overrides; configure_pretraining: embedding 128 for small, else hidden."""
    layout = Layout("electra", "electra", pooler=False)
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"model_size": "base"}))
    cfg = read_config(str(base), layout)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.intermediate_size, cfg.vocab_size) == (768, 12, 12, 3072, 30522)
    assert layout.projection(cfg) is None
    small = electra_hparams("x", {"vocab_size": 100})
    assert small["embedding_size"] == 128 and small["num_attention_heads"] == 4
    tiny = json.loads((ELECTRA / "hparams.json").read_text())
    cfg = read_config(str(ELECTRA / "hparams.json"), layout)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.extra["embedding_size"]) == \
        (32, 4, tiny["embedding_size"])
    assert layout.projection(cfg) == "electra/embeddings_project"


def test_albert_gelu_is_the_tanh_form(tmp_path):
    """ALBERT's modeling.py `gelu` is the tanh approximation; its config says "gelu"."""
    path = tmp_path / "albert_config.json"
    path.write_text(json.dumps({"vocab_size": 100, "hidden_size": 32, "num_attention_heads": 4,
                                "intermediate_size": 64, "embedding_size": 16}))
    cfg = read_config(str(path), Layout("albert", "bert", pooler=True))
    assert cfg.hidden_act == "gelu_tanh" and cfg.num_hidden_layers == 12
    path.write_text(json.dumps({"vocab_size": 100, "net_structure_type": 1}))
    with pytest.raises(Exception, match="net_structure_type"):
        read_config(str(path), Layout("albert", "bert", pooler=True))
