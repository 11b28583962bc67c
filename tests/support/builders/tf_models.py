"""Tiny TF BERTs in every source form bertfuse reads, for the session fixtures of conftest.py.

All models use EXAMPLE_CONFIGS['tiny'] (2 layers, hidden 128, 2 heads, vocab 1000, max 128
positions) with seeded random weights (LayerNorm gammas near 1, non-zero biases, so a mistake in
any term shows). Each builder returns a `TFModel`:

* ``path`` / ``kind``: what to hand to ``bertfuse convert`` and what detect_kind() says;
* ``inputs``: role (input_ids / input_mask / segment_ids) -> the source's own input name;
* ``outputs``: canonical output -> the source's own output name (what original_names records);
* ``reference(feeds)``: role-keyed int32 feeds -> canonical outputs computed by the ORIGINAL
  model (the SavedModel's signature, the .keras model, or Google's math run eagerly on the
  weights), independent of bertfuse's loaders, so a wrong input/output mapping is caught even
  though bertfuse's own parity gate compares against its frozen copy.

TensorFlow is imported on first use (conftest.py sets its environment before that).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from bertfuse.converter.config import EXAMPLE_CONFIGS, BertConfig

ROLES = ("input_ids", "input_mask", "segment_ids")
SEED = 0
SOURCE_FIXTURES = ("ckpt_erf", "ckpt_tanh", "ckpt_head", "frozen_pb", "savedmodel_dir",
                   "keras_file", "keras_functional_file", "hf_style_savedmodel")



@dataclass
class TFModel:
    name: str
    path: str
    kind: str
    config: BertConfig
    inputs: dict[str, str]
    outputs: dict[str, str]
    reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = field(repr=False)
    input_dtype: type = np.int32
    head: bool = False
    description: str = ""

    @property
    def hidden(self) -> int:
        return self.config.hidden_size

    @property
    def vocab(self) -> int:
        return self.config.vocab_size

    def feeds(self, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Random role-keyed int32 inputs with padding at the end, middle and start of rows."""
        from bertfuse.io.inputs import random_inputs

        feeds = random_inputs(batch, seq, self.vocab, self.config.type_vocab_size, seed=seed,
                              pad_anywhere=True)
        return {r: v for r, v in feeds.items() if r in self.inputs}


def tiny_config(hidden_act: str = "gelu") -> BertConfig:
    cfg = BertConfig(**{**EXAMPLE_CONFIGS["tiny"].__dict__})
    cfg.extra = {}
    cfg.hidden_act = hidden_act
    return cfg


def _tf():
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    return tf


def _randomize(variables, seed: int) -> None:
    """Seeded values for Keras weights: gammas near 1, small biases/betas, std 0.02 kernels."""
    rng = np.random.default_rng(seed)
    for v in variables:
        path = getattr(v, "path", None) or v.name
        shape = tuple(v.shape)
        if "gamma" in path:
            val = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "beta" in path or "bias" in path:
            val = 0.05 * rng.standard_normal(shape)
        else:
            val = 0.02 * rng.standard_normal(shape)
        v.assign(val.astype(np.float32))


# ------------------------------------------------------------------- Google math references


def google_reference(cfg: BertConfig, weights: dict[str, np.ndarray], head: bool = False):
    """Google's modeling.py math (bertfuse.converter.modeling) run eagerly on the weights."""
    tf = _tf()
    from bertfuse.converter.modeling import HeadSpec, build_bert_graph

    consts = {k: tf.constant(v) for k, v in weights.items() if v.dtype == np.float32}
    spec = HeadSpec(["ranker/dense"], True, cfg.head_activation) if head else None

    def run(feeds):
        out = build_bert_graph(tf, cfg, consts.__getitem__,
                               tf.constant(feeds["input_ids"], tf.int32),
                               tf.constant(feeds["input_mask"], tf.int32),
                               tf.constant(feeds["segment_ids"], tf.int32), spec)
        return {k: v.numpy() for k, v in out.items()}

    return run


def _checkpoint_weights(directory: Path) -> dict[str, np.ndarray]:
    tf = _tf()
    reader = tf.train.load_checkpoint(str(directory / "bert_model.ckpt"))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


# ------------------------------------------------------------------------------ builders


def build_checkpoint(out: Path, hidden_act: str, head: bool = False) -> TFModel:
    from bertfuse.converter.example import write_example

    cfg = tiny_config(hidden_act)
    write_example(cfg, str(out), seed=SEED, head=head)
    ref = google_reference(cfg, _checkpoint_weights(out), head)
    outputs = {"sequence_output": "sequence_output", "pooled_output": "pooled_output"}
    if head:
        outputs["logits"] = "logits"
    return TFModel(name="", path=str(out), kind="checkpoint", config=cfg,
                   inputs={r: r for r in ROLES}, outputs=outputs, reference=ref, head=head,
                   description=f"Google-layout TF1 checkpoint, hidden_act {hidden_act}"
                               + (", ranking head" if head else ""))


def build_finetune_checkpoint(base: TFModel, out: Path) -> TFModel:
    """`base`'s checkpoint re-saved with Adam slots (adam_m/adam_v) and global_step."""
    tf = _tf()
    weights = _checkpoint_weights(Path(base.path))
    rng = np.random.default_rng(SEED + 7)
    tensors = dict(weights)
    for name, value in weights.items():
        if value.dtype == np.float32:
            tensors[f"{name}/adam_m"] = (1e-3 * rng.standard_normal(value.shape)).astype(np.float32)
            tensors[f"{name}/adam_v"] = (1e-6 * rng.random(value.shape)).astype(np.float32)
    tensors["global_step"] = np.array(12345, np.int64)
    out.mkdir(parents=True)
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=str(out / "model.ckpt-12345"), tensor_names=names,
                      shape_and_slices=[""] * len(names), tensors=[tensors[n] for n in names])
    (out / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-12345"\n')
    shutil.copy(Path(base.path) / "bert_config.json", out / "bert_config.json")
    return TFModel(name="ckpt_finetune", path=str(out), kind="checkpoint", config=base.config,
                   inputs=dict(base.inputs), outputs=dict(base.outputs), reference=base.reference,
                   head=True, description="fine-tuning checkpoint: ranking head, adam_m/adam_v "
                                          "slots, global_step")


def build_frozen(out: Path) -> TFModel:
    """GraphDef of Google's math with the weights as Const nodes (what freeze_graph wrote)."""
    tf = _tf()
    from bertfuse.converter.modeling import build_bert_graph, random_weights

    cfg = tiny_config("gelu")
    weights = {k: v for k, v in random_weights(cfg, SEED).items()
               if k.startswith("bert/") and v.dtype == np.float32}
    graph = tf.Graph()
    with graph.as_default():
        consts = {k: tf.constant(v, name=k) for k, v in weights.items()}
        ids = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_ids")
        mask = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_mask")
        segs = tf.compat.v1.placeholder(tf.int32, [None, None], name="segment_ids")
        build_bert_graph(tf, cfg, consts.__getitem__, ids, mask, segs)
    out.write_bytes(graph.as_graph_def().SerializeToString())
    return TFModel(name="", path=str(out), kind="frozen", config=cfg, inputs={r: r for r in ROLES},
                   outputs={"sequence_output": "sequence_output",
                            "pooled_output": "pooled_output"},
                   reference=google_reference(cfg, weights),
                   description="frozen GraphDef, Google math, weights as Const")


def _signature_reference(path: str, inputs: dict[str, str], outputs: dict[str, str], dtype):
    """Calls the SavedModel's serving signature itself (loaded once, lazily)."""
    cache: dict = {}

    def run(feeds):
        tf = _tf()
        if "fn" not in cache:
            cache["model"] = tf.saved_model.load(path)
            cache["fn"] = cache["model"].signatures["serving_default"]
        res = cache["fn"](**{inputs[r]: tf.constant(feeds[r].astype(dtype)) for r in inputs})
        return {canon: res[name].numpy() for canon, name in outputs.items()}

    return run


def build_savedmodel(out: Path) -> TFModel:
    """TF2 SavedModel: tf.Variables + a serving tf.function running Google's math.

    Inputs are declared (input_word_ids, input_mask, input_type_ids): not their sorted order.
    """
    tf = _tf()
    from bertfuse.converter.modeling import build_bert_graph, random_weights

    cfg = tiny_config("gelu")
    weights = {k: v for k, v in random_weights(cfg, SEED + 1).items()
               if k.startswith("bert/") and v.dtype == np.float32}
    names = sorted(weights)
    spec = [tf.TensorSpec([None, None], tf.int32, name=n)
            for n in ("input_word_ids", "input_mask", "input_type_ids")]

    class Encoder(tf.Module):
        def __init__(self):
            super().__init__(name="bert_encoder")
            self.variables_list = [tf.Variable(weights[n], name=n.replace("/", "__"))
                                   for n in names]
            self._index = {n: i for i, n in enumerate(names)}

        def _get(self, name):
            return self.variables_list[self._index[name]]

        @tf.function(input_signature=spec)
        def serve(self, input_word_ids, input_mask, input_type_ids):
            out = build_bert_graph(tf, cfg, self._get, input_word_ids, input_mask,
                                   input_type_ids)
            return {"sequence_output": out["sequence_output"],
                    "pooled_output": out["pooled_output"]}

    module = Encoder()
    tf.saved_model.save(module, str(out), signatures={"serving_default": module.serve})
    inputs = {"input_ids": "input_word_ids", "input_mask": "input_mask",
              "segment_ids": "input_type_ids"}
    outputs = {"sequence_output": "sequence_output", "pooled_output": "pooled_output"}
    return TFModel(name="", path=str(out), kind="savedmodel", config=cfg, inputs=inputs,
                   outputs=outputs, reference=_signature_reference(str(out), inputs, outputs,
                                                                   np.int32),
                   description="TF2 SavedModel (tf.Module, tf.Variables), Google math, "
                               "input_word_ids/input_mask/input_type_ids")


def _keras_reference(path: Path, inputs: dict[str, str], outputs: dict[str, str], dtype=None):
    """Calls the saved .keras model itself (loaded once, lazily) with its own input keys."""
    cache: dict = {}

    def run(feeds):
        import keras

        if "m" not in cache:
            cache["m"] = keras.saving.load_model(str(path), compile=False)
        res = cache["m"]({inputs[r]: feeds[r] if dtype is None else feeds[r].astype(dtype)
                          for r in inputs}, training=False)
        return {c: np.asarray(res[n]) for c, n in outputs.items()}

    return run


def keras_hub_backbone():
    """(config, keras-hub BertBackbone of tiny_config's sizes), seeded; weights as built."""
    _tf()
    import keras
    import keras_hub

    cfg = tiny_config("gelu_new")  # keras-hub's BERT uses the tanh GELU
    keras.utils.set_random_seed(SEED)
    model = keras_hub.models.BertBackbone(
        vocabulary_size=cfg.vocab_size, num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads, hidden_dim=cfg.hidden_size,
        intermediate_dim=cfg.intermediate_size, max_sequence_length=cfg.max_position_embeddings,
        num_segments=cfg.type_vocab_size, dropout=0.1)
    return cfg, model


def build_keras_hub(out: Path) -> TFModel:
    """keras-hub's BertBackbone from its constructor, tiny sizes, seeded random weights."""
    import keras_hub

    cfg, model = keras_hub_backbone()
    _randomize(model.weights, SEED + 2)
    model.save(str(out))
    inputs = {"input_ids": "token_ids", "input_mask": "padding_mask",
              "segment_ids": "segment_ids"}
    outputs = {"sequence_output": "sequence_output", "pooled_output": "pooled_output"}
    return TFModel(name="", path=str(out), kind="keras", config=cfg, inputs=inputs,
                   outputs=outputs, reference=_keras_reference(out, inputs, outputs),
                   description=f"keras-hub {keras_hub.__version__} BertBackbone saved as .keras")


def _keras_test_layers():
    """Registered (hence .keras-serialisable) helper layers for build_keras_functional."""
    import keras
    from keras import ops

    if "cls" in _keras_test_layers.__dict__:
        return _keras_test_layers.cls

    @keras.saving.register_keras_serializable(package="bertfuse_tests")
    class PositionEmbedding(keras.layers.Layer):
        def __init__(self, max_positions, hidden, **kw):
            super().__init__(**kw)
            self.max_positions, self.hidden = max_positions, hidden

        def build(self, input_shape):
            self.position_embeddings = self.add_weight(
                name="position_embeddings", shape=(self.max_positions, self.hidden))

        def call(self, x):
            return x + self.position_embeddings[None, : ops.shape(x)[1], :]

        def get_config(self):
            return {**super().get_config(), "max_positions": self.max_positions,
                    "hidden": self.hidden}

    @keras.saving.register_keras_serializable(package="bertfuse_tests")
    class KeyMask(keras.layers.Layer):
        """[B, S] padding mask -> [B, 1, S] bool for MultiHeadAttention."""

        def call(self, mask):
            return ops.cast(ops.expand_dims(mask, 1), "bool")

    @keras.saving.register_keras_serializable(package="bertfuse_tests")
    class FirstToken(keras.layers.Layer):
        def call(self, x):
            return x[:, 0, :]

    _keras_test_layers.cls = (PositionEmbedding, KeyMask, FirstToken)
    return _keras_test_layers.cls


def build_keras_functional(out: Path) -> TFModel:
    """A functional Keras 3 BERT (Embedding, LayerNormalization, MultiHeadAttention, Dense with
    Keras' exact 'gelu', which TF lowers to Erfc), int64 inputs, called with a dict whose keys
    (token_ids/padding_mask/token_type_ids) are not its Input layers' names."""
    _tf()
    import keras

    PositionEmbedding, KeyMask, FirstToken = _keras_test_layers()
    cfg = tiny_config("gelu")
    H = cfg.hidden_size
    keras.utils.set_random_seed(SEED)
    ids = keras.Input(shape=(None,), dtype="int64", name="in_a")
    mask = keras.Input(shape=(None,), dtype="int64", name="in_b")
    segs = keras.Input(shape=(None,), dtype="int64", name="in_c")
    x = keras.layers.Embedding(cfg.vocab_size, H, name="word_embeddings")(ids)
    x = x + keras.layers.Embedding(cfg.type_vocab_size, H, name="type_embeddings")(segs)
    x = PositionEmbedding(cfg.max_position_embeddings, H, name="positions")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-12, name="embeddings_ln")(x)
    key_mask = KeyMask(name="key_mask")(mask)
    for i in range(cfg.num_hidden_layers):
        attn = keras.layers.MultiHeadAttention(cfg.num_attention_heads, cfg.head_size,
                                               name=f"attention_{i}")(x, x,
                                                                       attention_mask=key_mask)
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"attention_ln_{i}")(x + attn)
        h = keras.layers.Dense(cfg.intermediate_size, activation="gelu", name=f"inter_{i}")(x)
        h = keras.layers.Dense(H, name=f"output_{i}")(h)
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"output_ln_{i}")(x + h)
    pooled = keras.layers.Dense(H, activation="tanh", name="pooler")(FirstToken()(x))
    model = keras.Model(inputs={"token_ids": ids, "padding_mask": mask, "token_type_ids": segs},
                        outputs={"sequence_output": x, "pooled_output": pooled})
    _randomize(model.weights, SEED + 4)
    model.save(str(out))
    inputs = {"input_ids": "token_ids", "input_mask": "padding_mask",
              "segment_ids": "token_type_ids"}
    outputs = {"sequence_output": "sequence_output", "pooled_output": "pooled_output"}
    return TFModel(name="", path=str(out), kind="keras", config=cfg, inputs=inputs,
                   outputs=outputs, reference=_keras_reference(out, inputs, outputs, np.int64),
                   input_dtype=np.int64,
                   description="functional Keras 3 BERT (MultiHeadAttention, exact gelu), int64 "
                               "inputs, dict keys differing from Input names, saved as .keras")


def _hf_model(cfg: BertConfig):
    """A BERT written the way transformers' TFBertModel writes it (modeling_tf_bert.py)."""
    tf = _tf()
    import keras

    H, heads = cfg.hidden_size, cfg.num_attention_heads
    hs = H // heads

    def gelu(x):  # transformers.activations_tf._gelu
        return 0.5 * x * (1.0 + tf.math.erf(x / tf.cast(tf.sqrt(2.0), x.dtype)))

    class Embeddings(keras.layers.Layer):
        def build(self, input_shape=None):
            self.weight = self.add_weight(name="weight", shape=[cfg.vocab_size, H])
            self.token_type_embeddings = self.add_weight(
                name="token_type_embeddings", shape=[cfg.type_vocab_size, H])
            self.position_embeddings = self.add_weight(
                name="position_embeddings", shape=[cfg.max_position_embeddings, H])
            self.LayerNorm = keras.layers.LayerNormalization(epsilon=1e-12, name="LayerNorm")
            self.LayerNorm.build([None, None, H])

        def call(self, input_ids, token_type_ids):
            # check_embeddings_within_bounds
            tf.debugging.assert_less(input_ids, tf.cast(cfg.vocab_size, input_ids.dtype),
                                     message="input_ids out of range")
            inputs_embeds = tf.gather(params=self.weight, indices=input_ids)
            seq_len = tf.shape(input_ids)[1]
            position_ids = tf.expand_dims(tf.range(start=0, limit=seq_len), axis=0)
            position_embeds = tf.gather(params=self.position_embeddings, indices=position_ids)
            token_type_embeds = tf.gather(params=self.token_type_embeddings,
                                          indices=token_type_ids)
            return self.LayerNorm(inputs_embeds + position_embeds + token_type_embeds)

    class Layer(keras.layers.Layer):
        def build(self, input_shape=None):
            self.query = keras.layers.Dense(H, name="query")
            self.key = keras.layers.Dense(H, name="key")
            self.value = keras.layers.Dense(H, name="value")
            self.attn_dense = keras.layers.Dense(H, name="attention_output_dense")
            self.attn_ln = keras.layers.LayerNormalization(epsilon=1e-12,
                                                           name="attention_LayerNorm")
            self.intermediate = keras.layers.Dense(cfg.intermediate_size, name="intermediate")
            self.out_dense = keras.layers.Dense(H, name="output_dense")
            self.out_ln = keras.layers.LayerNormalization(epsilon=1e-12, name="output_LayerNorm")
            for d in (self.query, self.key, self.value, self.attn_dense):
                d.build([None, None, H])
            self.intermediate.build([None, None, H])
            self.out_dense.build([None, None, cfg.intermediate_size])
            self.attn_ln.build([None, None, H])
            self.out_ln.build([None, None, H])

        def transpose_for_scores(self, t, batch_size):
            t = tf.reshape(tensor=t, shape=(batch_size, -1, heads, hs))
            return tf.transpose(t, perm=[0, 2, 1, 3])

        def call(self, hidden_states, attention_mask):
            batch_size = tf.shape(hidden_states)[0]
            q = self.transpose_for_scores(self.query(hidden_states), batch_size)
            k = self.transpose_for_scores(self.key(hidden_states), batch_size)
            v = self.transpose_for_scores(self.value(hidden_states), batch_size)
            scores = tf.matmul(q, k, transpose_b=True)
            scores = tf.divide(scores, tf.cast(math.sqrt(hs), dtype=scores.dtype))
            scores = tf.add(scores, attention_mask)
            probs = tf.nn.softmax(logits=scores + 1e-9, axis=-1)  # stable_softmax
            ctx = tf.transpose(tf.matmul(probs, v), perm=[0, 2, 1, 3])
            ctx = tf.reshape(tensor=ctx, shape=(batch_size, -1, H))
            attn = self.attn_ln(self.attn_dense(ctx) + hidden_states)
            inter = gelu(self.intermediate(attn))
            return self.out_ln(self.out_dense(inter) + attn)

    class MainLayer(keras.layers.Layer):
        def build(self, input_shape=None):
            self.embeddings = Embeddings(name="embeddings")
            self.embeddings.build(None)
            self.layers_ = [Layer(name=f"layer_._{i}") for i in range(cfg.num_hidden_layers)]
            for lyr in self.layers_:
                lyr.build(None)
            self.pooler = keras.layers.Dense(H, activation="tanh", name="pooler")
            self.pooler.build([None, H])

        def call(self, input_ids, attention_mask, token_type_ids):
            shape = tf.shape(input_ids)
            x = self.embeddings(input_ids, token_type_ids)
            mask = tf.reshape(attention_mask, (shape[0], 1, 1, shape[1]))
            mask = tf.cast(mask, dtype=x.dtype)
            mask = tf.multiply(tf.subtract(tf.constant(1.0, x.dtype), mask),
                               tf.constant(tf.float32.min, x.dtype))
            for lyr in self.layers_:
                x = lyr(x, mask)
            pooled = self.pooler(x[:, 0])
            return {"last_hidden_state": x, "pooler_output": pooled}

    bert = MainLayer(name="bert")
    bert.build(None)
    return bert


def build_hf_style(out: Path) -> TFModel:
    """Hugging Face TFBertModel-style SavedModel: 3-D hidden states, Keras LayerNormalization,
    (1 - mask) * float32.min, erf GELU, gathers for token types and tf.range positions; int64
    signature inputs input_ids/attention_mask/token_type_ids; HF output names."""
    tf = _tf()
    import keras

    cfg = tiny_config("gelu")
    keras.utils.set_random_seed(SEED)
    bert = _hf_model(cfg)
    _randomize(bert.weights, SEED + 3)
    spec = [tf.TensorSpec([None, None], tf.int64, name=n)
            for n in ("input_ids", "attention_mask", "token_type_ids")]

    @tf.function(input_signature=spec)
    def serving(input_ids, attention_mask, token_type_ids):
        return bert(input_ids, attention_mask, token_type_ids, training=False)

    archive = keras.export.ExportArchive()
    archive.track(bert)
    archive.add_endpoint("serving_default", serving)
    archive.write_out(str(out), verbose=False)
    inputs = {"input_ids": "input_ids", "input_mask": "attention_mask",
              "segment_ids": "token_type_ids"}
    outputs = {"sequence_output": "last_hidden_state", "pooled_output": "pooler_output"}
    return TFModel(name="", path=str(out), kind="savedmodel", config=cfg, inputs=inputs,
                   outputs=outputs, input_dtype=np.int64,
                   reference=_signature_reference(str(out), inputs, outputs, np.int64),
                   description="HF TFBertModel-style SavedModel (Keras layers, int64 inputs)")
