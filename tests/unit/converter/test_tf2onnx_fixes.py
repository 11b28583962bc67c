"""The two tf2onnx 1.17 exports that differ from the TF math (converter/tf2onnx_fixes.py), on
tiny graphs in bert4keras's shapes: a bias-free Dense split into heads by a Reshape of its
own shape, and attention scores masked with where(mask, scores, broadcast_to(-inf)). Each
test first shows that plain tf2onnx gets the graph wrong, then that bertfuse's export runs in
ONNX Runtime and matches TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tf2onnx")

VOCAB, HIDDEN, HEADS = 512, 8, 2  # a word table past 16 KB: a weight kept out of tf2onnx
HEAD = HIDDEN // HEADS


def _weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
            rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32))


def _heads_graph():
    """ids -> words[ids] -> Dense without bias (tensordot: [B·S, H] @ W, Reshape back to
    [B, S, H]) -> Reshape(y, [shape(y)[0], shape(y)[1], heads, d]) -> per-head scale."""
    words, kernel = _weights()

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")])
    def f(ids):
        y = tf.tensordot(tf.gather(words, ids), kernel, [[2], [0]])
        s = tf.shape(y)
        heads = tf.reshape(y, [s[0], s[1], HEADS, HEAD])
        scaled = heads * tf.constant(np.arange(1, HEADS + 1, dtype=np.float32))[:, None]
        # (its own shape, as bert4keras's flatten: Shape(y) is read by the split only)
        back = tf.shape(scaled)
        return tf.reshape(scaled, [back[0], back[1], HIDDEN], name="sequence_output")

    return f


def _masked_scores_graph():
    """Scores masked as bert4keras does: where(mask, scores, broadcast_to(-inf, shape)),
    then softmax over the keys."""
    words, kernel = _weights()

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids"),
                                  tf.TensorSpec([None, None], tf.int32, name="input_mask")])
    def f(ids, mask):
        x = tf.gather(words, ids)
        scores = tf.einsum("bjd,bkd->bjk", x, tf.tensordot(x, kernel, [[2], [0]]))
        keep = tf.cast(mask, tf.bool)[:, None, :]
        shape = tf.raw_ops.BroadcastArgs(s0=tf.shape(keep), s1=tf.shape(scores))
        masked = tf.where(tf.broadcast_to(keep, shape), scores,
                          tf.broadcast_to(tf.constant(-np.inf, tf.float32), shape))
        probs = tf.nn.softmax(masked, axis=-1)
        return tf.identity(tf.einsum("bjk,bkd->bjd", probs, x), name="sequence_output")

    return f


def _feeds() -> dict[str, np.ndarray]:
    ids = np.random.default_rng(1).integers(1, VOCAB, (3, 7)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    return {"input_ids": ids, "input_mask": mask}


def _graph_def(f):
    return f.get_concrete_function().graph.as_graph_def()


def _run_plain_tf2onnx(f, names: list[str]) -> list[np.ndarray]:
    import tf2onnx

    from bertfuse.converter.handlers import custom_op_handlers

    model, _ = tf2onnx.convert.from_graph_def(
        _graph_def(f), input_names=[f"{n}:0" for n in names],
        output_names=["sequence_output:0"], opset=17, custom_op_handlers=custom_op_handlers())
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = _feeds()
    return sess.run(None, {f"{n}:0": feeds[n] for n in names})


def _bertfuse_vs_tf(f, tmp_path) -> tuple[np.ndarray, np.ndarray]:
    """bertfuse's export of the graph as a frozen .pb, run in ORT; and TF's own output."""
    from bertfuse.converter import load_source
    from bertfuse.converter.export import tf_to_onnx

    pb = tmp_path / "g.pb"
    pb.write_bytes(_graph_def(f).SerializeToString())
    src = load_source(str(pb), "frozen", "serving_default")
    model = tf_to_onnx(src, 17)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = _feeds()
    # (the canonical interface: inputs the graph lacks are taken and ignored)
    (got,) = sess.run(None, {i.name: feeds.get(i.name, np.zeros_like(feeds["input_ids"]))
                             for i in sess.get_inputs()})
    want = f(*[tf.constant(feeds[n]) for n in ("input_ids", "input_mask")
               if n in src.inputs]).numpy()
    return got, want


def test_dense_split_into_heads_runs_and_matches(tmp_path):
    f = _heads_graph()
    # tf2onnx alone: the merged Reshape copies [B·S, H]'s dims for B and S
    with pytest.raises(Exception, match="cannot be reshaped|Reshape"):
        _run_plain_tf2onnx(f, ["input_ids"])
    got, want = _bertfuse_vs_tf(f, tmp_path)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_where_with_minus_inf_branch_is_not_nan(tmp_path):
    f = _masked_scores_graph()
    # tf2onnx alone: mask·scores + (1 - mask)·(-inf) is NaN at every kept score
    (plain,) = _run_plain_tf2onnx(f, ["input_ids", "input_mask"])
    assert np.isnan(plain).all()
    got, want = _bertfuse_vs_tf(f, tmp_path)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_reshape_guard_restores_tf2onnx_on_every_exit():
    from tf2onnx.optimizer import back_to_back_optimizer as b2b

    from bertfuse.converter.tf2onnx_fixes import exact_reshape_merges

    original = b2b._func_map[("Reshape",)]
    with exact_reshape_merges():
        assert b2b._func_map[("Reshape",)] is not original
    assert b2b._func_map[("Reshape",)] is original
    with pytest.raises(RuntimeError), exact_reshape_merges():
        raise RuntimeError("export failed")
    assert b2b._func_map[("Reshape",)] is original


def test_a_model_that_fails_in_ort_is_not_written(tmp_path, monkeypatch):
    """The gate, on tf2onnx's own merge (the guard off): a parity failure (exit 1) naming the
    node ONNX Runtime stopped at, and no file, --force or not."""
    import contextlib

    from bertfuse.converter import tf2onnx_fixes
    from bertfuse.errors import ParityError
    from bertfuse.pipeline.options import ConvertOptions
    from bertfuse.pipeline.stages import convert

    monkeypatch.setattr(tf2onnx_fixes, "exact_reshape_merges", contextlib.nullcontext)
    pb = tmp_path / "g.pb"
    pb.write_bytes(_graph_def(_heads_graph()).SerializeToString())
    out = tmp_path / "m.onnx"
    for force in (False, True):
        with pytest.raises(ParityError, match=r"the ONNX model fails in ONNX Runtime on the "
                                              r"verification inputs: .*Reshape node\. "
                                              r"Name:'Reshape'") as err:
            convert(str(pb), str(out), ConvertOptions(fuse=False, force=force))
        assert err.value.exit_code == 1
        assert not out.exists()
