"""Text-in SavedModels: a tensorflow-text tokenizer in front of the encoder.

    saved_model.pb ─► its ops: tensorflow-text's? ── no ──► an ordinary SavedModel
                         │ yes: import tensorflow_text (registers them), or refuse (one line,
                         ▼       the pip line)
    load, freeze ─► cut at the packed ids (text_cut.py) ─► the encoder + head, from int32
                         │                                  input_word_ids / input_mask /
                         │                                  input_type_ids
                         └─► TextFront: the vocab asset the WordPiece lookup table is
                             initialised from (found through the table's initializer, never
                             outside the model's folder), lower-casing (CaseFoldUTF8), the
                             packed length, and the SavedModel's own tokenised path and
                             outputs for the parity check on text (pipeline/text_parity.py)
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bertfuse.errors import BertfuseError, MissingDependency
from bertfuse.io.limits import MAX_VOCAB_BYTES, read_text
from bertfuse.text import vocab_lines
from bertfuse.converter.text_assets import table_asset
from bertfuse.converter.text_cut import cut_at_dense_ids, rename_nodes
from bertfuse.optional import optional

# tensorflow-text's kernels (its newer ones are also registered as "TFText>Name"); any other
# op the SavedModel uses that only registers once tensorflow_text is imported counts too.
TEXT_OPS = frozenset({
    "CaseFoldUTF8", "NormalizeUTF8", "NormalizeUTF8WithOffsetsMap", "FindSourceOffsets",
    "RegexSplitWithOffsets", "WordpieceTokenizeWithOffsets", "UnicodeScriptTokenizeWithOffsets",
    "WhitespaceTokenizeWithOffsets", "WhitespaceTokenizeWithOffsetsV2",
    "SplitMergeTokenizeWithOffsets", "FastBertNormalize", "FastWordpieceTokenizeWithOffsets",
    "FastWordpieceDetokenize", "FastSentencepieceTokenize", "FastSentencepieceDetokenize",
    "ByteSplitWithOffsets", "SentencepieceOp", "SentencepieceTokenizeOp",
    "SentencepieceTokenizeWithOffsetsOp", "SentencepieceDetokenizeOp",
    "SentencepieceIdToStringOp", "SentencepieceVocabSizeOp", "SentenceFragments",
    "ConstrainedSequence", "MaxSpanningTree", "StateBasedSentenceBreaker", "NgramsStringJoin",
    "RougeL", "SplitMergeFromLogitsTokenizeWithOffsets", "TokenizerFromLogits",
})
# The tensorflow-text ops that make a vocab table's ids: the one the vocab asset feeds.
_WORDPIECE = "WordpieceTokenizeWithOffsets"
ROLE_NAMES = {"input_ids": "input_word_ids", "input_mask": "input_mask",
              "segment_ids": "input_type_ids"}  # TF Hub's names for the cut inputs


def is_text_op(op: str) -> bool:
    return op in TEXT_OPS or op.startswith("TFText>")


def text_ops(path: str) -> list[str]:
    """The tensorflow-text ops the SavedModel's graph and functions use (read off
    saved_model.pb, before TensorFlow loads it); when there are any, tensorflow_text is
    imported to register them, or a one-line refusal says how to install it."""
    saved_model_pb2 = optional("tensorflow.core.protobuf", "saved_model_pb2",
                               why="TensorFlow runs the source model (tf extra)")
    op_def_registry = optional("tensorflow.python.framework", "op_def_registry",
                               why="TensorFlow runs the source model (tf extra)")

    proto, pb = saved_model_pb2.SavedModel(), Path(path, "saved_model.pb")
    try:
        proto.ParseFromString(pb.read_bytes() if pb.is_file() else b"\xff")  # no fifo read
    except Exception:  # unreadable: TensorFlow's own load says why
        return []
    used, functions = set(), set()
    for meta in proto.meta_graphs:
        used.update(n.op for n in meta.graph_def.node)
        for fn in meta.graph_def.library.function:
            functions.add(fn.signature.name)
            used.update(n.op for n in fn.node_def)
    unknown = {op for op in used - functions if op_def_registry.get(op) is None}
    ops = sorted(op for op in used if is_text_op(op))
    if not ops and not unknown:
        return []
    try:
        require_tf_text(path, ops or sorted(unknown))
    except MissingDependency:
        if ops:
            raise
        return []  # none of tensorflow-text's: TensorFlow's own load names the op
    return sorted(set(ops) | {op for op in unknown if op_def_registry.get(op) is not None})


def require_tf_text(path: str, ops: list[str]) -> None:
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    pin = ".".join(tf.__version__.split(".")[:2])
    try:
        optional("tensorflow_text", why="registers the ops")
        return
    except ImportError:
        why = "is not installed"
    except Exception as exc:  # a build for another TensorFlow: its kernels do not load
        why = f"does not load with TensorFlow {tf.__version__} ({type(exc).__name__})"
    raise MissingDependency(
        f"{path}: the SavedModel tokenizes text with tensorflow-text ops ({', '.join(ops[:3])}"
        f"{', ...' if len(ops) > 3 else ''}) and tensorflow-text {why}; bertfuse needs it "
        f"only to load the model: pip install --no-deps 'tensorflow-text=={pin}.*'")


def _inputs_of(graph_def, node_name: str, slot: int) -> str:
    """The placeholder behind a node's input, through Identity chains."""
    nodes = {n.name: n for n in graph_def.node}
    name = nodes[node_name].input[slot].split(":")[0]
    for _ in range(64):
        node = nodes.get(name)
        if node is None or node.op != "Identity":
            break
        name = node.input[0].lstrip("^").split(":")[0]
    return name


class TextFront:
    """What a text-in SavedModel's tokenizer is: the vocab file (inside the model's folder),
    lower-casing, the packed length; and its own tokenised path on text."""

    def __init__(self, path: str, signature: str, concrete, ops: list[str]) -> None:
        self.path, self.signature, self.concrete, self.ops = path, signature, concrete, ops
        self.vocab_file: Path | None = None
        self.lower_case = False
        self.seq: int | None = None
        self.replaced: dict[str, str] = {}  # cut placeholder -> the full graph's tensor
        self._full = None
        self._text_inputs: list[str] = []
        self._resources: list[str] = []
        self._text_key = ""
        self.loaded = None  # the loaded SavedModel, kept alive for its tables

    def cut(self, graph_def, structured: dict[str, str], outputs: list[str]
            ) -> tuple[object, dict[str, str]]:
        """The frozen signature cut at the packed ids; {input name: tensor} of the cut graph
        (TF Hub's names, by what each input feeds in the encoder)."""
        types_pb2 = optional("tensorflow.core.framework", "types_pb2",
                             why="TensorFlow runs the source model (tf extra)")

        phs = {n.name: n for n in graph_def.node if n.op == "Placeholder"}
        texts = [k for k, t in structured.items()
                 if phs.get(t.split(":")[0]) is not None and
                 phs[t.split(":")[0]].attr["dtype"].type == types_pb2.DT_STRING]
        if len(texts) != 1 or len(structured) != 1:
            raise BertfuseError(f"{self.path}: a text-in signature takes one string tensor; "
                                f"this one takes {', '.join(structured)}")
        self._text_inputs = [structured[texts[0]].split(":")[0]]
        self._resources = [n for n, p in phs.items()
                           if p.attr["dtype"].type == types_pb2.DT_RESOURCE]
        self._full = graph_def
        self._text_key = texts[0]
        self.lower_case = any(n.op == "CaseFoldUTF8" or (
            n.op.endswith("FastBertNormalize") and n.attr["lower_case_nfd_strip_accents"].b)
            for n in graph_def.node)
        self.vocab_file = self._vocab_asset(graph_def)
        cut = cut_at_dense_ids(graph_def, self._text_inputs, outputs, self.path)
        self.replaced, self.seq = cut.replaced, cut.seq
        names = {tmp: ROLE_NAMES[role] for role, tmp in self._roles().items()}
        gd = rename_nodes(cut.graph_def, names)
        kept = {n.name for n in gd.node}
        self.replaced = {names[k] if names.get(k) in kept else k: v
                         for k, v in cut.replaced.items()}
        return gd, {n: f"{n}:0" for n in self.replaced}

    def _roles(self) -> dict[str, str]:
        """{role: cut input} from what the tokenizer packs into each, on sample texts: the
        ids hold vocab ids (> 1), the mask is a run of ones then zeros in every row, the
        segment ids are the other 0/1 tensor."""
        packed = self.packed(sample_texts(self.vocab_file, 8, seed=0))
        ids = [n for n, a in packed.items() if a.max() > 1]
        flags = [n for n in packed if n not in ids and packed[n].min() >= 0]
        masks = [n for n in flags if _is_mask(packed[n])]
        types = [n for n in flags if n not in masks]
        if len(ids) != 1 or len(masks) > 1 or len(types) > 1 or \
                len(ids) + len(flags) != len(packed):
            raise BertfuseError(f"{self.path}: cannot tell which packed tensor is the ids, the "
                                f"mask and the segment ids ({', '.join(self.replaced.values())})")
        return {"input_ids": ids[0], **({"input_mask": masks[0]} if masks else {}),
                **({"segment_ids": types[0]} if types else {})}

    def _vocab_asset(self, graph_def) -> Path:
        """The vocab.txt the WordPiece lookup table is initialised from: the table captured by
        the signature, its initializer function, the asset that function captures."""
        wordpiece = [n.name for n in graph_def.node if n.op == _WORDPIECE]
        if not wordpiece:
            raise BertfuseError(
                f"{self.path}: the tokenizer ({', '.join(self.ops[:3])}) keeps no WordPiece "
                f"vocab table bertfuse can read (it reads BertTokenizer's "
                f"{_WORDPIECE}); convert the encoder alone and tokenize with its vocab.txt")
        table = _inputs_of(graph_def, wordpiece[0], 1)
        names = [t.name.split(":")[0] for t in self.concrete.inputs]
        n_args = len(names) - len(self.concrete.captured_inputs)
        if table not in names or names.index(table) < n_args:
            raise BertfuseError(f"{self.path}: the WordPiece vocab table is not a resource "
                                f"the signature captures; cannot find its vocab file")
        # Captures are numbered as saved_model.pb's only for the signature itself.
        own = self.concrete is self.loaded.signatures.get(self.signature) if self.loaded \
            else True
        return table_asset(self.path, self.signature, names.index(table) - n_args
                           if own else None)

    def _handles(self) -> list:
        names = [t.name.split(":")[0] for t in self.concrete.inputs]
        n_args = len(names) - len(self.concrete.captured_inputs)
        return [self.concrete.captured_inputs[names.index(r) - n_args] for r in self._resources]

    def packed(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The SavedModel's own packed ids for `texts`, int32, by the cut inputs' names."""
        tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

        full = self._full

        def imports():
            tf.compat.v1.import_graph_def(full, name="")

        fn = tf.compat.v1.wrap_function(imports, [])
        feeds = [f"{n}:0" for n in self._text_inputs + self._resources]
        names = list(self.replaced)
        run = fn.prune(feeds=feeds, fetches=[self.replaced[n] for n in names])
        out = run(tf.constant(texts, tf.string), *self._handles())
        return {n: np.asarray(v).astype(np.int32) for n, v in zip(names, out)}

    def outputs(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The SavedModel's own outputs for `texts`, by its signature's output keys."""
        tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

        out = self.concrete(**{self._text_key: tf.constant(texts, tf.string)})
        return {str(k): np.asarray(v) for k, v in out.items()} if isinstance(out, dict) else {}

    def config(self) -> dict:
        """What the written model's bert_config metadata records for bertfuse.text."""
        return {"do_lower_case": self.lower_case}

    def close(self) -> None:
        self.concrete = self._full = self.loaded = None


def _is_mask(a: np.ndarray) -> bool:
    """Every row: ones, then zeros (at least one one: [CLS])."""
    ones = a.sum(axis=1)
    return bool(a.max() <= 1 and (ones > 0).all() and
                (a == (np.arange(a.shape[1]) < ones[:, None])).all())


def sample_texts(vocab: Path, n: int, seed: int) -> list[str]:
    """`n` seeded sentences of the vocab's whole words (mixed case, word pieces glued on,
    punctuation, a word it lacks) that the tokenizer checks run on."""
    words, pieces = [], []
    for line in vocab_lines(vocab):
        token = line.strip()
        if token.startswith("##") and token[2:].isalpha():
            pieces.append(token[2:])
        elif token.isalpha() and not token.startswith("["):
            words.append(token)
    words = words or ["text"]
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(n):
        row = []
        for _ in range(int(rng.integers(1, 12))):
            word = str(rng.choice(words))
            if pieces and rng.random() < 0.2:
                word += str(rng.choice(pieces))
            if rng.random() < 0.3:
                word = word.capitalize() if rng.random() < 0.7 else word.upper()
            row.append(word + (str(rng.choice(list(",.?!;:"))) if rng.random() < 0.2 else ""))
        if i % 4 == 3:
            row.append("xyzzy")  # most vocabs lack it: [UNK] or pieces
        texts.append(" ".join(row))
    return texts


def vocab_text(path: str | os.PathLike) -> bytes:
    """The vocab file's bytes (a regular file), as the SavedModel carries it."""
    p = Path(path)
    if not p.is_file():
        raise BertfuseError(f"{p}: the SavedModel's vocab asset is not a regular file")
    return read_text(p, MAX_VOCAB_BYTES, "a vocab.txt").encode("utf-8")
