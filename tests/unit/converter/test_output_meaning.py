"""Output roles by meaning (converter/output_meaning.py): what computes an output decides its
role, whatever the source calls it; an output with no role keeps its source name exactly."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bertfuse.converter.output_meaning import NO_ROLE, meaning, name_outputs  # noqa: E402


def _layer_norm(x, gamma, beta):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return tf.nn.batch_normalization(x, mean, var, beta, gamma, 1e-12)


def _graph():
    """A toy encoder's tail with every kind of output a model ends on."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return tf.constant(rng.standard_normal(shape).astype(np.float32))

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None, 8], name="x")
        g, b = w(8), w(8)
        first = _layer_norm(x, g, b)
        seq = _layer_norm(first + x, g, b)  # the last layer: computed after `first`
        cls = tf.squeeze(seq[:, 0:1, :], axis=1)
        pooled = tf.tanh(tf.nn.bias_add(tf.matmul(cls, w(8, 8)), w(8)))
        logits = tf.nn.bias_add(tf.matmul(pooled, w(8, 3)), w(3))
        token = tf.einsum("bsh,hc->bsc", seq, w(8, 5))
        score = tf.sigmoid(tf.matmul(pooled, w(8, 1)))
        embedding = tf.math.l2_normalize(tf.reduce_mean(seq, axis=1), axis=-1)
        per_token_l2 = tf.math.l2_normalize(tf.einsum("bsh,hc->bsc", seq, w(8, 4)), axis=-1)
        named = {"Encoder-1-Norm": first, "Transformer-2-FeedForward-Norm": seq,
                 "Pooler-Dense": pooled, "Scores": logits, "tags": token, "score": score,
                 "sentence_embedding": embedding, "ColBERT_Vectors": per_token_l2}
        outs = {k: tf.identity(v, name=k) for k, v in named.items()}
    return graph.as_graph_def(), {k: v.name for k, v in outs.items()}, \
        {v.name: v.shape.rank for v in outs.values()}


def test_each_output_read_by_what_computes_it():
    gd, tensors, ranks = _graph()
    got = {k: meaning(gd, t, ranks[t]) for k, t in tensors.items()}
    assert got == {"Encoder-1-Norm": "sequence_output",
                   "Transformer-2-FeedForward-Norm": "sequence_output",
                   "Pooler-Dense": "pooled_output", "Scores": "logits", "tags": "token_logits",
                   "score": NO_ROLE, "sentence_embedding": NO_ROLE, "ColBERT_Vectors": NO_ROLE}


def test_names_roles_and_kept_names():
    gd, tensors, ranks = _graph()
    shown = {t: k for k, t in tensors.items()}
    names, roles = name_outputs(gd, list(tensors.values()), shown, ranks)
    # The last layer norm is sequence_output; the earlier one keeps its name (case kept).
    assert names["sequence_output"] == tensors["Transformer-2-FeedForward-Norm"]
    assert names["Encoder-1-Norm"] == tensors["Encoder-1-Norm"]
    assert names["pooled_output"] == tensors["Pooler-Dense"]
    assert names["logits"] == tensors["Scores"]
    assert names["token_logits"] == tensors["tags"]
    for kept in ("score", "sentence_embedding", "ColBERT_Vectors"):
        assert names[kept] == tensors[kept] and roles[kept] is None
    assert roles["sequence_output"] == "sequence_output"


def test_a_sigmoid_named_logits_is_not_a_role_but_keeps_its_name():
    """The name `logits` is kept (it is the source's name), but the output has no role; the
    single-output rank rule does not rename a sigmoid either."""
    gd, tensors, ranks = _graph()
    t = tensors["score"]
    names, roles = name_outputs(gd, [t], {t: "logits"}, ranks)
    assert names == {"logits": t} and roles == {"logits": None}
    names, roles = name_outputs(gd, [t], {t: "output_0"}, ranks)
    assert names == {"output_0": t} and roles == {"output_0": None}
