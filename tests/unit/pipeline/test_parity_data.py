"""Parity on the user's own data (pipeline/data.py): --load-inputs from .npz and .json, by role
and by the source's own names (the fixtures' reference.npz), --text-file through a vocab (single
texts and tab-separated pairs), --save-inputs / --save-outputs, and verify --load-outputs with
and without TensorFlow; diff --numeric on loaded inputs; each bad file one line and exit 2."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from bertfuse.cli import main
from bertfuse.errors import BertfuseError
from bertfuse.pipeline.data import ParityData, input_feeds, read_arrays
from support.paths import FIXTURES


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """tiny example, converted on a text file of pairs, its inputs and outputs saved."""
    from bertfuse.converter.example import write_example

    d = tmp_path_factory.mktemp("parity_data")
    write_example("tiny", str(d / "tiny"), seed=0)
    (d / "pairs.tsv").write_text("what is bert?\tit is a language model\n\n"
                                 "hello world\ta second, longer segment here\n")
    (d / "single.txt").write_text("what is bert?\nhello\n")
    code, out, err = _cli("convert", d / "tiny", "-o", d / "tiny.onnx", "--json",
                          "--text-file", d / "pairs.tsv", "--vocab", d / "tiny" / "vocab.txt",
                          "--save-inputs", d / "in.npz", "--save-outputs", d / "out.json")
    assert code == 0, err
    parity = json.loads(out)["parity"]
    assert parity["batch"] == 2 and "pairs.tsv" in parity["inputs"]
    return d


def _parity(out: str) -> dict:
    return json.loads(out)["parity"]


def test_convert_saves_the_text_inputs_and_both_sides_outputs(work):
    inputs = np.load(work / "in.npz")
    assert sorted(inputs.files) == ["input_ids", "input_mask", "segment_ids"]
    assert inputs["segment_ids"].max() == 1  # the pairs' second segments
    assert inputs["input_ids"][0, 0] == 101  # [CLS]
    outputs = json.loads((work / "out.json").read_text())
    assert {"sequence_output", "pooled_output", "onnx/sequence_output"} <= set(outputs)
    seq = np.array(outputs["sequence_output"])
    assert seq.shape[:2] == inputs["input_ids"].shape


def test_verify_without_tensorflow_against_saved_outputs(work):
    code, out, err = _cli("verify", work / "tiny.onnx", "--load-inputs", work / "in.npz",
                          "--load-outputs", work / "out.json", "--json")
    assert code == 0, err
    p = _parity(out)
    assert p["reference"].startswith("saved outputs") and p["ok"]
    assert {o["name"] for o in p["outputs"]} == {"sequence_output", "pooled_output"}


def test_verify_fails_on_changed_saved_outputs(work, tmp_path):
    saved = json.loads((work / "out.json").read_text())
    saved["pooled_output"] = (np.array(saved["pooled_output"]) + 0.5).tolist()
    (tmp_path / "bad.json").write_text(json.dumps(saved))
    code, _, err = _cli("verify", work / "tiny.onnx", "--load-inputs", work / "in.npz",
                        "--load-outputs", tmp_path / "bad.json")
    assert code == 1 and "pooled_output" in err


def test_json_inputs_by_the_sources_own_names_against_tensorflow(work, tmp_path):
    inputs = np.load(work / "in.npz")
    (tmp_path / "in.json").write_text(json.dumps(
        {"input_ids": inputs["input_ids"].tolist(),
         "attention_mask": inputs["input_mask"].tolist(),
         "token_type_ids": inputs["segment_ids"].tolist()}))
    code, out, err = _cli("verify", work / "tiny.onnx", "--against", work / "tiny",
                          "--load-inputs", tmp_path / "in.json", "--load-outputs",
                          work / "out.json", "--save-inputs", tmp_path / "again.npz", "--json")
    assert code == 0, err
    p = _parity(out)
    assert p["ok"] and any(o["name"].startswith("mask invariance") for o in p["outputs"])
    again = np.load(tmp_path / "again.npz")
    np.testing.assert_array_equal(again["input_mask"], inputs["input_mask"])


def test_verify_on_single_texts(work):
    code, out, err = _cli("verify", work / "tiny.onnx", "--against", work / "tiny",
                          "--text-file", work / "single.txt", "--vocab",
                          work / "tiny" / "vocab.txt", "--json")
    assert code == 0, err
    p = _parity(out)
    assert p["ok"] and p["batch"] == 2 and p["seed"] is None


def test_diff_numeric_on_loaded_inputs_saves_both_models_outputs(work, tmp_path):
    code, out, err = _cli("diff", work / "tiny.onnx", work / "tiny.onnx", "--numeric",
                          "--load-inputs", work / "in.npz", "--save-outputs",
                          tmp_path / "d.npz", "--json")
    assert code == 0, err
    rows = json.loads(out)["numeric"]
    assert rows[0]["shape_a"][:2] == list(np.load(work / "in.npz")["input_ids"].shape)
    assert {"sequence_output", "onnx/sequence_output"} <= set(np.load(tmp_path / "d.npz").files)


def test_fixture_reference_npz_in_and_out_keys(tmp_path):
    """The tests' own reference.npz (in/NAME by the signature's names, out/NAME)."""
    path = FIXTURES / "thirdparty" / "hf_bert" / "reference.npz"
    data = ParityData(load_inputs=str(path), load_outputs=str(path))
    feeds = data.feeds({}, None)
    assert set(feeds) == {"input_ids", "input_mask", "segment_ids"}
    assert set(data.outputs_by_name()) == {"last_hidden_state", "pooler_output"}
    known = {"last_hidden_state": "sequence_output", "pooler_output": "pooled_output"}
    assert set(data.expected(known, ["sequence_output", "pooled_output"])) == \
        {"sequence_output", "pooled_output"}
    kh = FIXTURES / "thirdparty" / "kh_bert" / "reference.npz"  # token_ids, padding_mask
    assert set(input_feeds("--load-inputs", str(kh), read_arrays("--load-inputs", str(kh)),
                           {})) == {"input_ids", "input_mask", "segment_ids"}


def _bad_files(d: Path) -> dict[str, tuple[list[str], str]]:
    (d / "garbage.npz").write_bytes(b"not a zip")
    (d / "ragged.json").write_text('{"input_ids": [[1, 2], [3]]}')
    (d / "notjson.json").write_text("{input_ids")
    (d / "list.json").write_text("[1, 2]")
    (d / "strings.json").write_text('{"input_ids": [["a", "b"]]}')
    (d / "noids.json").write_text('{"input_mask": [[1, 1]]}')
    (d / "unknown.json").write_text('{"input_ids": [[1, 2]], "colour": [[1, 2]]}')
    (d / "shape.json").write_text('{"input_ids": [[1, 2]], "input_mask": [[1, 1, 1]]}')
    (d / "mask.json").write_text('{"input_ids": [[1, 2]], "input_mask": [[1, 2]]}')
    (d / "zeros.json").write_text('{"input_ids": [[1, 2]], "input_mask": [[0, 0]]}')
    (d / "rank.json").write_text('{"input_ids": [1, 2, 3]}')
    (d / "floats.json").write_text('{"input_ids": [[1.5, 2]]}')
    (d / "vocab.json").write_text('{"input_ids": [[1, 99999]]}')
    (d / "mixed.txt").write_text("a query\ta passage\nno passage\n")
    (d / "empty.txt").write_text("\n\n")
    (d / "queries.csv").write_text("x")
    np.savez(d / "onlyin.npz", **{"in/input_ids": np.ones((1, 2), np.int32)})
    return {
        "missing": (["--load-inputs", str(d / "nope.npz")], "no such file"),
        "suffix": (["--load-inputs", str(d / "queries.csv")], ".npz or .json"),
        "garbage": (["--load-inputs", str(d / "garbage.npz")], "not an .npz"),
        "ragged": (["--load-inputs", str(d / "ragged.json")], "rectangular"),
        "notjson": (["--load-inputs", str(d / "notjson.json")], "not a readable .json"),
        "list": (["--load-inputs", str(d / "list.json")], "JSON object"),
        "strings": (["--load-inputs", str(d / "strings.json")], "rectangular"),
        "noids": (["--load-inputs", str(d / "noids.json")], "no input_ids"),
        "unknown": (["--load-inputs", str(d / "unknown.json")], "'colour'"),
        "shape": (["--load-inputs", str(d / "shape.json")], "shape"),
        "mask": (["--load-inputs", str(d / "mask.json")], "0 and 1"),
        "zeros": (["--load-inputs", str(d / "zeros.json")], "all zeros"),
        "rank": (["--load-inputs", str(d / "rank.json")], "[batch, seq]"),
        "floats": (["--load-inputs", str(d / "floats.json")], "non-integer"),
        "vocab": (["--load-inputs", str(d / "vocab.json")], "outside the model's table"),
        "mixed": (["--text-file", str(d / "mixed.txt"), "--vocab", "VOCAB"], "line 2 lacks"),
        "empty": (["--text-file", str(d / "empty.txt"), "--vocab", "VOCAB"], "no text"),
        "no vocab": (["--text-file", str(d / "mixed.txt")], "needs --vocab"),
        "both": (["--load-inputs", str(d / "vocab.json"), "--text-file", str(d / "mixed.txt"),
                  "--vocab", "VOCAB"], "pass one"),
        "outputs alone": (["--load-outputs", str(d / "onlyin.npz")], "needs the inputs"),
        "no outputs": (["--load-inputs", str(d / "onlyin.npz"), "--load-outputs",
                        str(d / "onlyin.npz")], "holds no outputs"),
        "save suffix": (["--load-inputs", str(d / "onlyin.npz"), "--save-inputs",
                         str(d / "x.txt")], ".npz or .json"),
        "save over input": (["--load-inputs", str(d / "onlyin.npz"), "--save-inputs",
                             str(d / "onlyin.npz")], "is the input"),
    }


@pytest.mark.parametrize("case", [
    "missing", "suffix", "garbage", "ragged", "notjson", "list", "strings", "noids", "unknown",
    "shape", "mask", "zeros", "rank", "floats", "vocab", "mixed", "empty", "no vocab", "both",
    "outputs alone", "no outputs", "save suffix", "save over input"])
def test_each_bad_file_is_one_line_and_exit_2(work, tmp_path, case):
    args, words = _bad_files(tmp_path)[case]
    args = [str(work / "tiny" / "vocab.txt") if a == "VOCAB" else a for a in args]
    code, out, err = _cli("verify", work / "tiny.onnx", "--against", work / "tiny", *args)
    assert code == 2, (case, err)
    lines = err.strip().splitlines()
    if case in AFTER_LOAD:  # found once the model's tables are known: after its stage lines
        lines = [ln for ln in lines if not ln.startswith("bertfuse verify: ")]
    assert len(lines) == 1 and words in lines[0], (case, err)


AFTER_LOAD = ("vocab", "unknown")  # ids past the table; maybe the source's own name


def test_verify_needs_a_reference(work):
    code, _, err = _cli("verify", work / "tiny.onnx")
    assert code == 2 and "--against SOURCE" in err


def test_parity_data_is_refused_with_no_verify(work, tmp_path):
    code, _, err = _cli("convert", work / "tiny", "-o", tmp_path / "m.onnx", "--no-verify",
                        "--save-inputs", tmp_path / "in.npz")
    assert code == 2 and "--no-verify" in err


def test_api_keywords_reach_the_data(work, tmp_path):
    import bertfuse

    with pytest.raises(BertfuseError, match="no such file"):
        bertfuse.convert(work / "tiny", load_inputs=tmp_path / "none.npz")
    _, report = bertfuse.convert(work / "tiny", load_inputs=work / "in.npz",
                                 load_outputs=work / "out.json",
                                 save_outputs=tmp_path / "api.npz")
    assert report.parity.ok and report.parity.reference.startswith("saved outputs")
    assert "onnx/pooled_output" in np.load(tmp_path / "api.npz").files


def test_saved_tf_hub_extras_the_model_leaves_out_are_not_compared(tmp_path):
    """Outputs saved from a TF Hub encoder's signature include `default` (pooled_output
    again) and `encoder_outputs_N`, which conversion keeps only when asked: they are skipped;
    any other name the model lacks is still bad input."""
    from bertfuse.errors import BertfuseError
    from bertfuse.pipeline.data import ParityData

    ids = np.ones((2, 4), np.int32)
    seq, pooled = np.zeros((2, 4, 8), np.float32), np.ones((2, 8), np.float32)
    path = tmp_path / "ref.npz"
    np.savez(path, **{"in/input_word_ids": ids, "out/sequence_output": seq,
                      "out/pooled_output": pooled, "out/default": pooled,
                      "out/encoder_outputs_0": seq})
    data = ParityData(load_inputs=str(path), load_outputs=str(path))
    got = data.expected({}, ["sequence_output", "pooled_output"])
    assert sorted(got) == ["pooled_output", "sequence_output"]
    np.savez(path, **{"in/input_word_ids": ids, "out/sequence_output": seq,
                      "out/logits": pooled})
    with pytest.raises(BertfuseError, match="'logits' is no output of the model"):
        ParityData(load_inputs=str(path), load_outputs=str(path)).expected(
            {}, ["sequence_output", "pooled_output"])
