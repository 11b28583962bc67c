"""inspect/encoder_table.py: per-layer fusion status from op types, and which pass reasons explain it."""

from __future__ import annotations

from bertfuse.inspect.encoder_table import encoder_table
from bertfuse.passes.base import Diagnostic

FUSED_LAYER = ["Attention", "SkipLayerNormalization", "BiasGelu", "SkipLayerNormalization"]
RAW_LAYER = ["Softmax", "MatMul", "ReduceMean", "ReduceMean", "Erf", "ReduceMean", "ReduceMean"]


def test_fully_fused_encoder():
    ops = ["EmbedLayerNormalization"] + FUSED_LAYER * 2 + ["Gather", "Gemm", "Tanh"]
    table = encoder_table(ops)
    assert table.fully_fused and table.embed_layernorm
    assert [l.layer for l in table.layers] == [0, 1]
    assert table.layers[1].leftovers == {}  # the pooler's Tanh is not a leftover
    assert table.unfused() == []


def test_classifier_probabilities_softmax_is_no_layer():
    """run_classifier.py's head ends in Softmax(logits): not an unfused attention layer, and
    the pooler's Tanh before it is still the pooler's."""
    ops = ["EmbedLayerNormalization"] + FUSED_LAYER * 2 + ["Gather", "Gemm", "Tanh", "Gemm",
                                                            "Softmax"]
    for tail in ([], ["Cast"]):  # fp16: the output's Cast back to float32 after it
        table = encoder_table(ops + tail)
        assert table.fully_fused and [l.layer for l in table.layers] == [0, 1]
        assert table.layers[1].leftovers == {}
    # An unfused last layer starts with its Softmax too, but is never a Softmax alone.
    raw = encoder_table(["EmbedLayerNormalization"] + FUSED_LAYER + RAW_LAYER)
    assert len(raw.layers) == 2 and not raw.fully_fused


def test_reasons_go_to_their_layer_and_layerless_ones_to_every_unfused_layer():
    ops = ["EmbedLayerNormalization"] + FUSED_LAYER + RAW_LAYER + RAW_LAYER
    diagnostics = [
        Diagnostic("attention", True, 0),
        Diagnostic("attention", False, 1, "probabilities are a model output"),
        Diagnostic("gelu", False, 2, "Erf is not part of x*Phi(x)"),
        Diagnostic("hidden_3d", False, None, "Reshape r is not back to [B,S,H]"),
        Diagnostic("dense_gemm", False, 1, "MatMul m reads a 3-D tensor"),  # not a layer's
        Diagnostic("cleanup", False, None, "Identity i kept"),  # not a layer's
        Diagnostic("embed_layernorm", False, None, "an embedding miss"),  # the embed row's
    ]
    table = encoder_table(ops, diagnostics)
    l0, l1, l2 = table.layers
    assert l0.fused and l0.reasons == []
    assert l1.reasons == ["probabilities are a model output",
                          "hidden_3d: Reshape r is not back to [B,S,H]"]
    assert l2.reasons == ["gelu: Erf is not part of x*Phi(x)",
                          "hidden_3d: Reshape r is not back to [B,S,H]"]
    assert l1.leftovers == {"Softmax": 1, "ReduceMean": 4, "Erf": 1}
    assert table.embed_layernorm and table.embed_reasons == ["an embedding miss"]
    lines = table.unfused()
    assert len(lines) == 2 and lines[0].startswith("layer 1: attention, skip-LN 0/2, GELU")
    assert not table.fully_fused


def test_unfused_embeddings():
    table = encoder_table(["Gather", "Add", "LayerNormalization"] + FUSED_LAYER,
                          [Diagnostic("embed_layernorm", False, None, "no position table")])
    assert not table.embed_layernorm and table.layers[0].fused
    assert table.unfused() == ["embeddings: EmbedLayerNormalization not fused "
                               "(no position table)"]
    assert table.to_json()["fully_fused"] is False
