"""Text-in SavedModels: a tensorflow-text BertTokenizer and BERT packing in front of the
encoder, through `bertfuse convert` with default flags. The fixtures are built with
tensorflow-text's own code: tftext_bert (one tf.Module: tokenizer, packing, a keras-hub
BertBackbone and a head; build_tftext.py) and tftext_hub_keras_layer (TF Hub's form: the
preprocessing and the hub_bert_encoder fixture, each in hub.KerasLayer; build_tftext_hub.py).

* Without tensorflow-text the SavedModel cannot be loaded (its ops are not registered):
  exit 2, one line naming tensorflow-text and the pip line.
* With it: the tokenizer is cut off, the encoder is fully fused and, with its head,
  reproduces the SavedModel's own outputs on the fixture's texts (fp32 max |diff| <= 1e-4,
  fp16 max <= 4e-2, mean <= 2e-3) when fed by bertfuse.text on the vocab written beside the
  model, whose ids equal the SavedModel's own; verify --text-file finds that vocab.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import pytest
from support import paths

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tensorflow")

FIXTURES = paths.FIXTURES / "thirdparty"
FIXTURE = FIXTURES / "tftext_bert"
NAMES = ["tftext_bert", "tftext_hub_keras_layer"]
GELU_OPS = ("FastGelu", "BiasGelu", "Gelu")
# bertfuse's CLI in a Python where `import tensorflow_text` fails (None in sys.modules is
# Python's own way to make a module unimportable), whether or not it is installed.
NO_TF_TEXT = ("import runpy, sys; sys.modules['tensorflow_text'] = None; "
              "sys.argv = ['bertfuse', *sys.argv[1:]]; "
              "runpy.run_module('bertfuse', run_name='__main__', alter_sys=True)")


def test_without_tensorflow_text_one_line_with_the_pip_line(tmp_path):
    out = tmp_path / "m.onnx"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(paths.ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run([sys.executable, "-c", NO_TF_TEXT, "convert", str(FIXTURE / "model"),
                          "-o", str(out)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert "tensorflow-text is not installed" in lines[0], lines[0]
    assert "pip install --no-deps 'tensorflow-text==" in lines[0], lines[0]
    assert "CaseFoldUTF8" in lines[0]  # what the SavedModel needs it for
    assert not out.exists() and not out.with_suffix(".vocab.txt").exists()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    pytest.importorskip("tensorflow_text", reason="tensorflow-text is not installed: "
                        "pip install --no-deps 'tensorflow-text==2.21.*' (the Makefile does)")
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    out_dir = tmp_path_factory.mktemp("textin")
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            out = out_dir / f"{name}.onnx"
            cache[name] = out, convert(str(FIXTURES / name / "model"), str(out),
                                       ConvertOptions())
        return cache[name]

    return get


def _outputs(name: str) -> list[str]:
    return sorted(json.loads((FIXTURES / name / "meta.json").read_text())["outputs"])


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_cut_off_and_encoder_fused(name, converted):
    out, report = converted(name)
    assert report.written and report.parity.ok, report.parity.to_json()
    rows = {o.name: o for o in report.parity.outputs}
    on_text = [n for n in rows if n.startswith("on text: ")]
    assert len(on_text) == 1 + len(_outputs(name)), rows  # the ids, then each output
    assert all(rows[n].ok for n in on_text), rows
    assert rows["mask invariance (padded segment ids changed)"].ok
    model = onnx.load(out)
    assert [i.name for i in model.graph.input] == ["input_ids", "input_mask", "segment_ids"]
    assert all(i.type.tensor_type.shape.dim[1].dim_value == 16 for i in model.graph.input)
    assert sorted(o.name for o in model.graph.output) == _outputs(name)
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Attention"] == 2 and ops["SkipLayerNormalization"] == 4, ops
    assert sum(ops[g] for g in GELU_OPS) == 2 and ops["EmbedLayerNormalization"] == 1, ops
    assert ops["Softmax"] == 0 and ops["LayerNormalization"] == 0, ops
    # Nothing of the tokenizer is left: no strings, no lookup table.
    assert not any(i.data_type == onnx.TensorProto.STRING for i in model.graph.initializer)
    assert report.text["lower_case"] is True and report.text["seq"] == 16
    assert report.text["vocab"] == str(out.with_suffix(".vocab.txt"))
    from support.lowering import lowered

    lowered(str(out), 2)  # --ops bertfuse lowers both layers of the cut model


@pytest.mark.parametrize("name", NAMES)
def test_vocab_beside_tokenizes_as_the_savedmodel_and_outputs_match(name, converted):
    """bertfuse.text finds the casing and the packed length in the model, the vocab beside
    it; its ids are the SavedModel's own, and the model's outputs on them its outputs."""
    from bertfuse.io.model import load_model
    from bertfuse.io.sidecars import find_vocab
    from bertfuse.passes.cleanup import Cleanup
    from bertfuse.passes.fp16 import Fp16Pass
    from bertfuse.passes.manager import run_passes
    from bertfuse.passes.shared_weights import SharedWeights
    from bertfuse.text import WordPiece

    out, _ = converted(name)
    vocab = find_vocab(out)
    assert vocab == str(out.with_suffix(".vocab.txt"))
    assets = FIXTURES / name / "model" / "assets" / "vocab.txt"
    assert open(vocab, "rb").read() == assets.read_bytes()
    ref = np.load(FIXTURES / name / "reference.npz")
    texts = [str(t) for t in ref["text"]]
    tok = WordPiece(vocab, model=out)
    assert tok.lower_case and tok.lower_case_reason == "do_lower_case in the config"
    feeds = tok(texts).feeds()
    for role, packed in (("input_ids", "input_word_ids"), ("input_mask", "input_mask"),
                         ("segment_ids", "input_type_ids")):
        assert np.array_equal(feeds[role], ref[f"ids/{packed}"]), (role, feeds[role])
    for model, limit, mean in ((load_model(str(out)), 1e-4, None),
                               (run_passes(load_model(str(out)),
                                           [Fp16Pass(), Cleanup(), SharedWeights()])[0],
                                4e-2, 2e-3)):
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        for key in _outputs(name):
            diff = np.abs(got[key].astype(np.float64) - ref[f"out/{key}"])
            assert diff.max() <= limit, (key, diff.max())
            assert mean is None or diff.mean() <= mean, (key, diff.mean())


def test_verify_text_file_finds_the_vocab_beside(converted, tmp_path):
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import verify

    out, _ = converted("tftext_bert")
    queries = tmp_path / "q.txt"
    queries.write_text("What is BERT?\nCafé, the tiny red house.\n", encoding="utf-8")
    report = verify(str(out), str(FIXTURE / "model"), ConvertOptions(text_file=str(queries)),
                    device="cpu")
    assert report.parity.ok, report.parity.to_json()
    assert str(out.with_suffix(".vocab.txt")) in report.parity.inputs
    assert (report.parity.batch, report.parity.seq) == (2, 16)


def test_serve_takes_text_with_the_vocab_beside(converted):
    """serve's checked config (before Ray starts): text requests on, through that vocab."""
    pytest.importorskip("ray")
    from bertfuse.serve.config import check_config

    out, _ = converted("tftext_bert")
    cfg = check_config(str(out))
    assert cfg.vocab == str(out.with_suffix(".vocab.txt").resolve())


def test_a_tokenizer_without_a_vocab_file_is_one_line(tmp_path):
    """tensorflow-text's FastBertTokenizer keeps its vocab inside the graph, not as a vocab
    file asset: refused (exit 2) naming what to do, nothing written."""
    tf_text = pytest.importorskip("tensorflow_text", reason="tensorflow-text is not installed")
    import tensorflow as tf

    from bertfuse.errors import BertfuseError
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "##s"]
    table = np.random.default_rng(0).normal(size=(len(words), 32)).astype(np.float32)

    class Fast(tf.Module):
        def __init__(self):
            super().__init__()
            self.tok = tf_text.FastBertTokenizer(words, lower_case_nfd_strip_accents=True)
            self.table = tf.Variable(np.repeat(table, 160, axis=1))  # a weight, not a const

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text):
            ids, _ = tf_text.pad_model_inputs(self.tok.tokenize(text).merge_dims(-2, -1), 8)
            return {"sequence_output": tf.gather(self.table, ids)}

    module = Fast()
    tf.saved_model.save(module, str(tmp_path / "fast"),
                        signatures={"serving_default": module.serve})
    out = tmp_path / "fast.onnx"
    with pytest.raises(BertfuseError, match="keeps no WordPiece vocab table bertfuse can read"
                       ".*tokenize with its vocab.txt") as err:
        convert(str(tmp_path / "fast"), str(out), ConvertOptions())
    assert "\n" not in str(err.value) and "FastBertNormalize" in str(err.value)
    assert not out.exists()


def test_a_vocab_asset_outside_the_model_folder_is_refused(tmp_path):
    """The asset's name in saved_model.pb points out of the folder (to a file that is there):
    never read, one line."""
    pytest.importorskip("tensorflow_text", reason="tensorflow-text is not installed")
    import shutil

    from tensorflow.core.protobuf import saved_model_pb2

    from bertfuse.errors import BertfuseError
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    model = tmp_path / "m" / "model"
    shutil.copytree(FIXTURE / "model", model)
    shutil.copy(model / "assets" / "vocab.txt", tmp_path / "m" / "outside.txt")
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((model / "saved_model.pb").read_bytes())
    proto.meta_graphs[0].asset_file_def[0].filename = "../../outside.txt"
    (model / "saved_model.pb").write_bytes(proto.SerializeToString())
    out = tmp_path / "m.onnx"
    with pytest.raises(BertfuseError, match="points outside the model's folder"):
        convert(str(model), str(out), ConvertOptions())
    assert not out.exists() and not out.with_suffix(".vocab.txt").exists()


def test_score_takes_a_text_column_with_the_vocab_beside(converted, tmp_path):
    """score's checked job (before Ray starts): the text column through that vocab, cased as
    the SavedModel's tokenizer."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from bertfuse.score.spec import build_job

    out, _ = converted("tftext_bert")
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["What is BERT?", "the cat"]}),
                   tmp_path / "in" / "a.parquet")
    job = build_job(str(out), str(tmp_path / "in"), str(tmp_path / "out"), text_column="text")
    assert job.spec.vocab == str(out.with_suffix(".vocab.txt").resolve())
    assert job.spec.lower_case is True and job.spec.max_seq == 16
