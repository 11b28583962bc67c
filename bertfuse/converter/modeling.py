"""Google's BERT (modeling.py) math, rebuilt as a TF1-style graph from a bert_config.json;
ALBERT's and ELECTRA's TF1 checkpoints run the same math under their own variable names
(ckpt_layout.py: ALBERT's shared blocks and both families' embedding projection).

Weights are graph placeholders named after the checkpoint variables, never constants: the
graph stays a few hundred KB whatever the model size, so tf2onnx converts structure only and
the real weights are written into the ONNX initializers afterwards (see export.py).
The math follows modeling.py op for op: gather for words, one-hot MatMul for token types,
a position slice, layer norm via moments + batch_normalization (tf.contrib's layer_norm),
the additive (1 - mask) * -10000 attention mask, 2-D [B*S, H] hidden states, and GELU
per hidden_act (erf, or the tanh approximation modeling.py later switched to).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from bertfuse.converter.ckpt_layout import Layout, embedding_size
from bertfuse.converter.config import GELU_ERF, GELU_TANH, BertConfig

WeightGetter = Callable[[str], "object"]  # variable name -> tf tensor
BERT_LAYOUT = Layout("bert", "bert", pooler=True)


def _layer_norm(tf, x, prefix: str, w: WeightGetter):
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return tf.nn.batch_normalization(x, mean, variance, offset=w(f"{prefix}/beta"),
                                     scale=w(f"{prefix}/gamma"), variance_epsilon=1e-12)


def _dense(tf, x, prefix: str, w: WeightGetter):
    return tf.nn.bias_add(tf.matmul(x, w(f"{prefix}/kernel")), w(f"{prefix}/bias"))


def _activation(tf, x, act: str):
    if act in GELU_ERF:
        cdf = 0.5 * (1.0 + tf.math.erf(x / tf.sqrt(2.0)))
        return x * cdf
    if act in GELU_TANH:
        cdf = 0.5 * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))
        return x * cdf
    if act == "relu":
        return tf.nn.relu(x)
    if act == "tanh":
        return tf.tanh(x)
    raise ValueError(act)


def build_bert_graph(tf, cfg: BertConfig, w: WeightGetter, input_ids, input_mask,
                     segment_ids, head: "HeadSpec | None" = None, layout=None) -> dict:
    """Builds the encoder (+ pooler, + head) in the current default graph; returns outputs.
    `layout` (ckpt_layout.Layout) names the variables of BERT, ALBERT or ELECTRA; default
    Google's BERT with its pooler."""
    layout = layout or BERT_LAYOUT
    shape = tf.shape(input_ids)
    batch, seq = shape[0], shape[1]
    hidden, width = cfg.hidden_size, embedding_size(cfg)
    emb = layout.embeddings

    with tf.name_scope(emb):
        flat_ids = tf.reshape(input_ids, [-1])
        words = tf.gather(w(f"{emb}/word_embeddings"), flat_ids)
        x = tf.reshape(words, [batch, seq, width])
        one_hot = tf.one_hot(tf.reshape(segment_ids, [-1]), depth=cfg.type_vocab_size)
        types = tf.matmul(one_hot, w(f"{emb}/token_type_embeddings"))
        x = x + tf.reshape(types, [batch, seq, width])
        positions = tf.slice(w(f"{emb}/position_embeddings"), [0, 0], [seq, -1])
        x = x + tf.expand_dims(positions, 0)
        x = _layer_norm(tf, x, f"{emb}/LayerNorm", w)

    with tf.name_scope(f"{layout.scope}/encoder"):
        # create_attention_mask_from_input_mask: [B,1,S] mask broadcast over queries.
        to_mask = tf.cast(tf.reshape(input_mask, [batch, 1, seq]), tf.float32)
        mask = tf.ones([batch, seq, 1], tf.float32) * to_mask
        adder = (1.0 - tf.expand_dims(mask, 1)) * -10000.0
        heads, hsize = cfg.num_attention_heads, cfg.head_size

        def split_heads(t):
            return tf.transpose(tf.reshape(t, [batch, seq, heads, hsize]), [0, 2, 1, 3])

        prev = tf.reshape(x, [-1, width])
        projection = layout.projection(cfg)
        if projection:  # ALBERT's embedding_hidden_mapping_in, ELECTRA's embeddings_project
            prev = _dense(tf, prev, projection, w)
        for i, p in enumerate(layout.blocks(cfg)):
            with tf.name_scope(f"layer_{i}"):
                q = split_heads(_dense(tf, prev, p["query"], w))
                k = split_heads(_dense(tf, prev, p["key"], w))
                v = split_heads(_dense(tf, prev, p["value"], w))
                scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(hsize))
                probs = tf.nn.softmax(scores + adder)
                ctx = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])
                ctx = tf.reshape(ctx, [-1, hidden])
                attn = _dense(tf, ctx, p["attn_out"], w)
                attn = _layer_norm(tf, attn + prev, p["attn_ln"], w)
                inter = _activation(tf, _dense(tf, attn, p["inter"], w), cfg.hidden_act)
                out = _dense(tf, inter, p["out"], w)
                prev = _layer_norm(tf, out + attn, p["out_ln"], w)
        sequence_output = tf.reshape(prev, [batch, seq, hidden])

    outputs = {"sequence_output": tf.identity(sequence_output, name="sequence_output")}
    if not layout.pooler:
        return outputs
    pooler = f"{layout.scope}/pooler/dense"
    with tf.name_scope(f"{layout.scope}/pooler"):
        first = tf.squeeze(sequence_output[:, 0:1, :], axis=1)
        pooled = tf.tanh(_dense(tf, first, pooler, w))
    outputs["pooled_output"] = tf.identity(pooled, name="pooled_output")

    if head is not None:
        h = pooled
        with tf.name_scope("head"):
            for j, prefix in enumerate(head.mlp):
                h = _dense(tf, h, prefix, w)
                h = _activation(tf, h, head.activation)
            if head.has_output:
                h = tf.nn.bias_add(tf.matmul(h, w("output_weights"), transpose_b=True),
                                   w("output_bias"))
        outputs["logits"] = tf.identity(h, name="logits")
    return outputs


class HeadSpec:
    """A ranking/classifier head after the pooler: an MLP and/or Google's output layer."""

    def __init__(self, mlp: list[str], has_output: bool, activation: str = "relu") -> None:
        self.mlp = mlp
        self.has_output = has_output
        self.activation = activation


def expected_shapes(cfg: BertConfig, layout=None) -> dict[str, tuple[int, ...]]:
    """Variable name -> shape, as the layout's modeling.py creates them (BERT by default)."""
    layout = layout or BERT_LAYOUT
    h, i, e = cfg.hidden_size, cfg.intermediate_size, embedding_size(cfg)
    emb = layout.embeddings
    shapes: dict[str, tuple[int, ...]] = {
        f"{emb}/word_embeddings": (cfg.vocab_size, e),
        f"{emb}/token_type_embeddings": (cfg.type_vocab_size, e),
        f"{emb}/position_embeddings": (cfg.max_position_embeddings, e),
        f"{emb}/LayerNorm/gamma": (e,),
        f"{emb}/LayerNorm/beta": (e,),
    }
    if layout.pooler:
        shapes[f"{layout.scope}/pooler/dense/kernel"] = (h, h)
        shapes[f"{layout.scope}/pooler/dense/bias"] = (h,)
    projection = layout.projection(cfg)
    if projection:
        shapes[f"{projection}/kernel"] = (e, h)
        shapes[f"{projection}/bias"] = (h,)
    for p in layout.blocks(cfg):
        for role in ("query", "key", "value", "attn_out"):
            shapes[f"{p[role]}/kernel"] = (h, h)
            shapes[f"{p[role]}/bias"] = (h,)
        shapes[f"{p['inter']}/kernel"] = (h, i)
        shapes[f"{p['inter']}/bias"] = (i,)
        shapes[f"{p['out']}/kernel"] = (i, h)
        shapes[f"{p['out']}/bias"] = (h,)
        for ln in ("attn_ln", "out_ln"):
            shapes[f"{p[ln]}/gamma"] = (h,)
            shapes[f"{p[ln]}/beta"] = (h,)
    return shapes


def random_weights(cfg: BertConfig, seed: int, head: bool = False) -> dict[str, np.ndarray]:
    """Seeded random weights in Google's layout (std initializer_range; LN gamma near 1)."""
    rng = np.random.default_rng(seed)
    std = cfg.initializer_range
    out: dict[str, np.ndarray] = {}
    for name, shp in expected_shapes(cfg).items():
        if name.endswith("/gamma"):
            val = 1.0 + 0.1 * rng.standard_normal(shp)
        elif name.endswith("/beta") or name.endswith("/bias"):
            val = 0.05 * rng.standard_normal(shp)
        else:
            val = std * rng.standard_normal(shp)
        out[name] = val.astype(np.float32)
    if head:
        h = cfg.hidden_size
        out["ranker/dense/kernel"] = (std * rng.standard_normal((h, 256))).astype(np.float32)
        out["ranker/dense/bias"] = (0.05 * rng.standard_normal(256)).astype(np.float32)
        out["output_weights"] = (std * rng.standard_normal((1, 256))).astype(np.float32)
        out["output_bias"] = np.zeros(1, np.float32)
    # Extras a real pre-training/fine-tuning checkpoint carries; the loader must ignore them.
    out["global_step"] = np.array(1000, np.int64)
    out["cls/predictions/output_bias"] = np.zeros(cfg.vocab_size, np.float32)
    return out
