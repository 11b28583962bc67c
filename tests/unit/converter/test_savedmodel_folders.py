"""A SavedModel inside a folder by version: transformers' `save_pretrained(DIR,
saved_model=True)` (DIR/saved_model/1/) and TF Serving's base folder (DIR/1/, DIR/2/ ...)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import paths

from bertfuse.converter import detect_kind
from bertfuse.errors import BertfuseError
from bertfuse.io.model import check_source_form, versioned_savedmodel

HF_BERT = paths.FIXTURES / "thirdparty" / "hf_bert"


def _fake_version(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"")
    return folder


def test_save_pretrained_folder_is_a_savedmodel(tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(HF_BERT / "model", hf / "saved_model" / "1")
    (hf / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (hf / "tf_model.h5").write_bytes(b"\x89HDF")
    check_source_form(str(hf))  # accepted, not refused as a weights-only folder
    assert detect_kind(str(hf)) == "savedmodel"
    assert versioned_savedmodel(hf) == hf / "saved_model" / "1"


def test_tf_serving_base_folder_takes_the_highest_version(tmp_path):
    base = tmp_path / "ranker"
    for v in ("1", "7", "10"):
        _fake_version(base / v)
    (base / "notes").mkdir()
    _fake_version(base / "latest")  # not a version number
    assert versioned_savedmodel(base) == base / "10"
    assert detect_kind(str(base)) == "savedmodel"


def test_a_version_linked_outside_the_folder_is_not_taken(tmp_path):
    outside = _fake_version(tmp_path / "elsewhere" / "model")
    base = tmp_path / "models"
    base.mkdir()
    (base / "3").symlink_to(outside)
    assert versioned_savedmodel(base) is None
    with pytest.raises(BertfuseError, match="neither a SavedModel nor a checkpoint"):
        detect_kind(str(base))


def test_save_pretrained_folder_loads(tmp_path):
    pytest.importorskip("tensorflow")
    from bertfuse.converter import load_source

    hf = tmp_path / "hf"
    shutil.copytree(HF_BERT / "model", hf / "saved_model" / "1")
    src = load_source(str(hf), "auto", "serving_default")
    assert Path(src.path) == hf / "saved_model" / "1"
    assert sorted(src.outputs) == ["pooled_output", "sequence_output"]
    src.close()
