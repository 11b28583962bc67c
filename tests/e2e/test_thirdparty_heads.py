"""Heads and bias-free dense layers of third-party models (tests/fixtures/thirdparty/), past
what test_thirdparty.py checks for every fixture (fused, exact against the library):

* a masked-LM head's decoder tied to the word embeddings (transformers' TFBertForMaskedLM)
  stores the table once: the embedding and the decoder's Gemm(transB=1) read one initializer;
* `--precision fp16 --ops bertfuse` lowers every encoder layer into bertfuse's ops (the
  lowering is a graph rewrite, checked on the CPU against the contrib form through the ops'
  NumPy references by convert itself), for the masked-LM head, multiple choice, dense
  layers whose biases are the library's zero init and attention built with use_bias=False.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from support import paths

pytest.importorskip("onnxruntime")
pytest.importorskip("tensorflow")

FIXTURES = paths.FIXTURES / "thirdparty"
BF = "ai.bertfuse"


def _convert(name: str, out, **opts):
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    return convert(str(FIXTURES / name / "model"), str(out), ConvertOptions(**opts))


def _tables(model: onnx.ModelProto, vocab: int, hidden: int) -> list[onnx.TensorProto]:
    return [i for i in model.graph.initializer if sorted(i.dims) == sorted([vocab, hidden])]


def test_mlm_decoder_reads_the_tied_table_once(tmp_path):
    meta = json.loads((FIXTURES / "hf_bert_mlm" / "meta.json").read_text())
    report = _convert("hf_bert_mlm", tmp_path / "mlm.onnx")
    assert report.written and report.parity.ok
    model = onnx.load(tmp_path / "mlm.onnx")
    (table,) = _tables(model, meta["vocab"], meta["hidden"])
    assert list(table.dims) == [meta["vocab"], meta["hidden"]]
    readers = {n.op_type: n for n in model.graph.node if table.name in n.input}
    assert set(readers) == {"EmbedLayerNormalization", "Gemm"}, readers
    gemm = readers["Gemm"]
    assert gemm.input[1] == table.name and \
        {a.name: a.i for a in gemm.attribute}.get("transB") == 1
    assert [o.name for o in model.graph.output] == ["token_logits"]


@pytest.mark.parametrize("name", ["hf_bert_mlm", "hf_bert_mc", "kh_bert_zero_bias",
                                  "mg_encoder_scaffold_no_bias"])
def test_bertfuse_kernels_lower_every_layer(name, tmp_path):
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    out = tmp_path / f"{name}.onnx"
    report = _convert(name, out, precision="fp16", ops="bertfuse")
    assert report.written and report.parity.ok, report.parity.to_json()
    rows = [o for o in report.parity.outputs if o.name.startswith("bertfuse ops vs contrib")]
    assert rows and all(r.ok for r in rows), rows
    misses = [d for d in report.passes.diagnostics
              if d.component.startswith("kernels_") and not d.fused]
    assert not misses, misses
    model = onnx.load(out)
    ops = Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node)
    layers = meta["layers"]
    assert ops[f"{BF}.BertAttention"] == layers, ops
    assert ops[f"{BF}.DenseBiasSkipLayerNorm"] == 2 * layers, ops
    assert ops[f"{BF}.DenseBiasGelu"] >= layers, ops  # the MLM transform's own one too
    assert not [k for k in ops if k.startswith("com.microsoft.")], ops
    if name == "hf_bert_mlm":
        assert len(_tables(model, meta["vocab"], meta["hidden"])) == 1
    assert np.all([i.data_type != onnx.TensorProto.FLOAT for i in model.graph.initializer
                   if np.prod(i.dims) >= meta["hidden"] ** 2])


def test_multiple_choice_takes_its_own_rank3_inputs_and_refuses_rank2(tmp_path):
    """--load-inputs / --load-outputs with the library's [batch, choices, seq] inputs and
    logits; [batch, seq] inputs for it are bad input (exit 2), not a failed run."""
    from bertfuse.errors import BertfuseError

    ref = str(FIXTURES / "hf_bert_mc" / "reference.npz")
    report = _convert("hf_bert_mc", tmp_path / "mc.onnx", load_inputs=ref, load_outputs=ref)
    assert report.written and report.parity.ok, report.parity.to_json()
    assert report.parity.batch == 3 and report.parity.seq == 16
    assert [o.name for o in report.parity.outputs][:1] == ["logits"]
    flat = str(FIXTURES / "hf_bert" / "reference.npz")
    with pytest.raises(BertfuseError, match=r"the source takes \[batch, choices, seq\]"):
        _convert("hf_bert_mc", tmp_path / "flat.onnx", load_inputs=flat)
    assert not (tmp_path / "flat.onnx").exists()
