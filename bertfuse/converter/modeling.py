"""Google's BERT (modeling.py) math, rebuilt as a TF1-style graph from a bert_config.json.

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

from bertfuse.converter.config import GELU_ERF, GELU_TANH, BertConfig

WeightGetter = Callable[[str], "object"]  # variable name -> tf tensor


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
                     segment_ids, head: "HeadSpec | None" = None) -> dict:
    """Builds the encoder (+ pooler, + head) in the current default graph; returns outputs."""
    shape = tf.shape(input_ids)
    batch, seq = shape[0], shape[1]
    hidden = cfg.hidden_size

    with tf.name_scope("bert/embeddings"):
        flat_ids = tf.reshape(input_ids, [-1])
        words = tf.gather(w("bert/embeddings/word_embeddings"), flat_ids)
        x = tf.reshape(words, [batch, seq, hidden])
        one_hot = tf.one_hot(tf.reshape(segment_ids, [-1]), depth=cfg.type_vocab_size)
        types = tf.matmul(one_hot, w("bert/embeddings/token_type_embeddings"))
        x = x + tf.reshape(types, [batch, seq, hidden])
        positions = tf.slice(w("bert/embeddings/position_embeddings"), [0, 0], [seq, -1])
        x = x + tf.expand_dims(positions, 0)
        x = _layer_norm(tf, x, "bert/embeddings/LayerNorm", w)

    with tf.name_scope("bert/encoder"):
        # create_attention_mask_from_input_mask: [B,1,S] mask broadcast over queries.
        to_mask = tf.cast(tf.reshape(input_mask, [batch, 1, seq]), tf.float32)
        mask = tf.ones([batch, seq, 1], tf.float32) * to_mask
        adder = (1.0 - tf.expand_dims(mask, 1)) * -10000.0
        heads, hsize = cfg.num_attention_heads, cfg.head_size

        def split_heads(t):
            return tf.transpose(tf.reshape(t, [batch, seq, heads, hsize]), [0, 2, 1, 3])

        prev = tf.reshape(x, [-1, hidden])
        for i in range(cfg.num_hidden_layers):
            p = f"bert/encoder/layer_{i}"
            with tf.name_scope(f"layer_{i}"):
                q = split_heads(_dense(tf, prev, f"{p}/attention/self/query", w))
                k = split_heads(_dense(tf, prev, f"{p}/attention/self/key", w))
                v = split_heads(_dense(tf, prev, f"{p}/attention/self/value", w))
                scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(hsize))
                probs = tf.nn.softmax(scores + adder)
                ctx = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])
                ctx = tf.reshape(ctx, [-1, hidden])
                attn = _dense(tf, ctx, f"{p}/attention/output/dense", w)
                attn = _layer_norm(tf, attn + prev, f"{p}/attention/output/LayerNorm", w)
                inter = _activation(tf, _dense(tf, attn, f"{p}/intermediate/dense", w),
                                    cfg.hidden_act)
                out = _dense(tf, inter, f"{p}/output/dense", w)
                prev = _layer_norm(tf, out + attn, f"{p}/output/LayerNorm", w)
        sequence_output = tf.reshape(prev, [batch, seq, hidden])

    outputs = {"sequence_output": tf.identity(sequence_output, name="sequence_output")}
    with tf.name_scope("bert/pooler"):
        first = tf.squeeze(sequence_output[:, 0:1, :], axis=1)
        pooled = tf.tanh(_dense(tf, first, "bert/pooler/dense", w))
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


def expected_shapes(cfg: BertConfig) -> dict[str, tuple[int, ...]]:
    """Variable name -> shape, as Google's modeling.py creates them."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "bert/embeddings/word_embeddings": (cfg.vocab_size, h),
        "bert/embeddings/token_type_embeddings": (cfg.type_vocab_size, h),
        "bert/embeddings/position_embeddings": (cfg.max_position_embeddings, h),
        "bert/embeddings/LayerNorm/gamma": (h,),
        "bert/embeddings/LayerNorm/beta": (h,),
        "bert/pooler/dense/kernel": (h, h),
        "bert/pooler/dense/bias": (h,),
    }
    for n in range(cfg.num_hidden_layers):
        p = f"bert/encoder/layer_{n}"
        for name in ("attention/self/query", "attention/self/key", "attention/self/value",
                     "attention/output/dense"):
            shapes[f"{p}/{name}/kernel"] = (h, h)
            shapes[f"{p}/{name}/bias"] = (h,)
        shapes[f"{p}/intermediate/dense/kernel"] = (h, i)
        shapes[f"{p}/intermediate/dense/bias"] = (i,)
        shapes[f"{p}/output/dense/kernel"] = (i, h)
        shapes[f"{p}/output/dense/bias"] = (h,)
        for ln in ("attention/output/LayerNorm", "output/LayerNorm"):
            shapes[f"{p}/{ln}/gamma"] = (h,)
            shapes[f"{p}/{ln}/beta"] = (h,)
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
