"""Text in: BERT's WordPiece tokenization of a checkpoint's vocab.txt, as the int32 arrays
bertfuse's ONNX model takes (input_ids, input_mask, segment_ids).

Built on the Hugging Face `tokenizers` library (the `text` extra). It is imported when a
tokenizer is made, never by `import bertfuse`.

    tok = WordPiece("uncased_L-12_H-768_A-12/vocab.txt", model="model.onnx")
    batch = tok(["what is bert?"], pairs=["a language model."])
    out = session.run(**batch.feeds())
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Sequence

import numpy as np

from bertfuse.errors import BertfuseError, MissingDependency, install_hint
from bertfuse.io import limits
from bertfuse.optional import optional
from bertfuse.runtime.request_checks import model_facts, servable_model

# The tokens a BERT input is built from; [MASK] is only for pre-training, so not required.
REQUIRED = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
# Where Google's vocab.txt files keep them (bertfuse example writes them there too).
GOOGLE_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
DEFAULT_MAX_LENGTH = 512
# uncased_L-12_H-768_A-12, multi_cased_L-12_H-768_A-12, bert-base-uncased: a whole word
_CASE_NAME = re.compile(r"(^|[_\-.])(uncased|cased)([_\-.]|$)")
# BertNormalizer's clean-up on ASCII: \t \n \r become spaces, other control characters go.
_ASCII_CLEAN = {**{c: None for c in [*range(32), 127]}, **{c: " " for c in (9, 10, 13)}}
# BertPreTokenizer's punctuation on ASCII (str.isascii and not a letter, digit or space):
# spaced out in Python, so the tokenizer splits on whitespace alone, which is twice as fast.
_ASCII_PUNCT = re.compile(r"[!-/:-@\[-`{-~]")
_CACHED_WORDS = 100_000  # words whose pieces a tokenizer keeps (then it starts afresh)
_MAX_WORD = 100  # characters: a longer word is one [UNK] (Google's BERT)


def _spaced(match: re.Match) -> str:
    return f" {match.group()} "  # a function: re.sub expands it faster than r" \g<0> "


def vocab_file(path: str | os.PathLike) -> Path:
    """A directory (a checkpoint, a Hugging Face folder) stands for its vocab.txt, else its
    tokenizer.json."""
    p = Path(path)
    if p.is_dir():
        for name in ("vocab.txt", "tokenizer.json"):
            if (p / name).is_file():
                return p / name
        raise BertfuseError(f"{path}: holds neither vocab.txt nor tokenizer.json")
    return p


def _tokenizer_json(path: Path) -> tuple[dict[str, int], dict]:
    """A Hugging Face tokenizer.json's WordPiece vocab, and its normalizer's lower-casing as
    do_lower_case (BERT, DistilBERT, ELECTRA ship one; a BPE or Unigram model is refused)."""
    try:
        data = json.loads(limits.json_text(path, limits.MAX_TOKENIZER_JSON_BYTES,
                                           "a tokenizer.json"))
    except (OSError, ValueError) as exc:
        raise BertfuseError(f"{path}: not a readable tokenizer.json ({type(exc).__name__})") \
            from None
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordPiece" or \
            not isinstance(model.get("vocab"), dict):
        kind = model.get("type") if isinstance(model, dict) else None
        raise BertfuseError(f"{path}: a {kind or 'non-WordPiece'} tokenizer; bertfuse's text "
                            f"input is BERT's WordPiece (vocab.txt or a WordPiece tokenizer.json)")
    norm = data.get("normalizer") or {}
    lower = norm.get("lowercase") if isinstance(norm, dict) else None
    if len(model["vocab"]) > limits.MAX_VOCAB_TOKENS:
        raise BertfuseError(f"{path}: {len(model['vocab']):,} tokens, over the limit of "
                            f"{limits.MAX_VOCAB_TOKENS:,} for a vocab")
    return {str(t): int(i) for t, i in model["vocab"].items()}, \
        ({"do_lower_case": lower} if isinstance(lower, bool) else {})


def read_vocab(path: str | os.PathLike) -> dict[str, int]:
    """token -> id, one token a line, as Google's BERT reads it (a repeated token: last wins);
    or a WordPiece tokenizer.json's vocab. A file that is missing, not UTF-8 or lacks a
    special token is bad input (one line)."""
    path = vocab_file(path)
    if path.suffix == ".json":
        vocab = _tokenizer_json(path)[0]
        return _with_specials(path, vocab)
    try:
        vocab = {line.strip(): i for i, line in enumerate(vocab_lines(path))}
    except FileNotFoundError:
        raise BertfuseError(f"{path}: vocab file not found") from None
    except OSError as exc:  # a directory, unreadable, ...
        raise BertfuseError(f"{path}: cannot read the vocab file ({exc.strerror or exc})") \
            from None
    return _with_specials(path, vocab)


def vocab_lines(path: str | os.PathLike):
    """A vocab.txt's lines, one at a time within io/limits.py's bounds (size, line length,
    token count; NUL bytes and text that is not UTF-8 refused)."""
    return limits.text_lines(path, limits.MAX_VOCAB_BYTES, "a vocab.txt (one token a line)",
                             limits.MAX_VOCAB_LINE, limits.MAX_VOCAB_TOKENS)


def _with_specials(path: Path, vocab: dict[str, int]) -> dict[str, int]:
    missing = [t for t in REQUIRED if t not in vocab]
    if missing:
        raise BertfuseError(f"{path}: not a BERT vocab.txt: missing the special token"
                            f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return vocab


@dataclass
class Batch:
    """One tokenized batch: int32 [batch, seq] arrays, padded on the right."""

    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray

    def feeds(self) -> dict[str, np.ndarray]:
        """The model's inputs by name (Session.run(**feeds) or an ORT session's run)."""
        return {"input_ids": self.input_ids, "input_mask": self.input_mask,
                "segment_ids": self.segment_ids}


@dataclass
class ModelInfo:
    """What a converted model says about its tokenizer: embedding sizes and bert_config."""

    vocab_size: int | None
    max_positions: int | None
    config: dict
    fixed_seq: int | None = None  # the inputs' fixed length (a packer that pads to one)


def model_info(model: str | os.PathLike) -> ModelInfo:
    """Reads the embedding table sizes and the bert_config metadata (no weights loaded)."""
    proto = servable_model(os.fspath(model))
    facts = model_facts(proto)
    meta = {p.key: p.value for p in proto.metadata_props}
    try:
        config = json.loads(meta.get("bert_config", "{}"))
    except json.JSONDecodeError:
        config = {}
    fixed = next((d[1].dim_value for i in proto.graph.input if i.name == "input_ids"
                  for d in [i.type.tensor_type.shape.dim] if len(d) == 2 and d[1].dim_value), None)
    return ModelInfo(facts.vocab_size, facts.max_positions,
                     config if isinstance(config, dict) else {}, fixed)


def _beside_config(vocab_path: Path) -> dict:
    """do_lower_case / max_position_embeddings from the files a checkpoint keeps beside its
    vocab.txt (bert_config.json; Hugging Face's tokenizer_config.json)."""
    found: dict = {}
    for name in ("bert_config.json", "tokenizer_config.json"):
        try:
            data = limits.read_json(vocab_path.parent / name, limits.MAX_CONFIG_BYTES, "a config")
        except (OSError, BertfuseError):
            continue
        if isinstance(data, dict):
            found = {**data, **found}
    return found


def lower_case_for(vocab_path: str | os.PathLike, vocab: dict[str, int],
                   config: dict) -> tuple[bool, str]:
    """(lower-case?, why): a config's do_lower_case; else the checkpoint's name (Google's
    uncased_L-12_H-768_A-12, cased_..., multi_cased_...); else the vocab: a cased vocab
    holds upper-case word pieces, an uncased one none."""
    flag = config.get("do_lower_case")
    if isinstance(flag, bool):
        return flag, "do_lower_case in the config"
    for part in reversed(Path(os.path.abspath(vocab_path)).parent.parts):
        named = _CASE_NAME.search(part.lower())
        if named:
            return named.group(2) == "uncased", f"the checkpoint's name ({part})"
    cased = any(t != t.lower() for t in vocab if not (t.startswith("[") and t.endswith("]")))
    return (not cased), ("the vocab has upper-case pieces" if cased else
                         "the vocab has no upper-case pieces")


class WordPiece:
    """BERT's tokenizer for one vocab.txt: basic clean-up and punctuation split, lower-casing
    (and accent stripping) as the checkpoint was trained, greedy longest-match word pieces,
    [CLS] A [SEP] (B [SEP]), truncation to `max_length`, padding with [PAD].

    lower_case: None decides from the config, the checkpoint's name, then the vocab
    (`lower_case_reason` says which). max_length: None takes the model's position table, or
    bert_config.json's max_position_embeddings beside the vocab, or 512. model: a converted
    .onnx whose embedding table the ids must fit and whose bert_config is read."""

    def __init__(self, vocab: str | os.PathLike, *, lower_case: bool | None = None,
                 max_length: int | None = None, model: str | os.PathLike | None = None) -> None:
        self.vocab_path = vocab_file(vocab)
        self.vocab = read_vocab(self.vocab_path)
        info = model_info(model) if model is not None else None
        own = _tokenizer_json(self.vocab_path)[1] if self.vocab_path.suffix == ".json" else {}
        config = {**_beside_config(self.vocab_path), **(info.config if info else {}), **own}
        if info and info.vocab_size is not None:
            top = max(self.vocab.values())
            if top >= info.vocab_size:
                raise BertfuseError(f"{vocab}: {top + 1} tokens, but the model's embedding "
                                    f"table has {info.vocab_size} rows: not this model's vocab")
        if lower_case is None:
            self.lower_case, self.lower_case_reason = lower_case_for(vocab, self.vocab, config)
        else:
            self.lower_case, self.lower_case_reason = bool(lower_case), "given"
        positions = (info.fixed_seq or info.max_positions if info else None) or \
            config.get("max_position_embeddings")
        limit = positions if isinstance(positions, int) and positions > 0 else None
        if max_length is None:
            max_length = limit or DEFAULT_MAX_LENGTH
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
            raise BertfuseError(f"max_length must be an integer >= 3 ([CLS] A [SEP] B [SEP]), "
                                f"got {max_length!r}")
        if limit and max_length > limit:
            raise BertfuseError(f"max_length {max_length} is longer than the model's "
                                f"{limit} positions")
        self.max_length = max_length
        self.pad_to = info.fixed_seq if info else None  # a packer padded to a fixed length
        self._tok = self._build(normalize=True)
        self._ascii = self._build(normalize=False)  # for ASCII text, normalized in Python
        self._model = self._ascii.model
        self._cls, self._sep = self.vocab["[CLS]"], self.vocab["[SEP]"]
        self._pieces: dict[str, list[int]] = {}  # word -> its piece ids (ASCII, cleaned)

    def _build(self, normalize: bool):
        """normalize: BertNormalizer and BertPreTokenizer in the tokenizer, padded there. Else
        the ASCII fast path: text cleaned, lower-cased and its punctuation spaced out in
        Python (_clean_ascii), split on whitespace alone, rows padded by __call__."""
        try:
            tk = optional("tokenizers", why="WordPiece (text extra)")
        except (ModuleNotFoundError, MissingDependency):
            raise MissingDependency("tokenizers is not installed: text input needs it; "
                                    + install_hint("text")) from None
        v = self.vocab
        tok = tk.Tokenizer(tk.models.WordPiece(v, unk_token="[UNK]",
                                               max_input_chars_per_word=_MAX_WORD))
        if normalize:  # strip_accents=None follows lowercase, as Google's uncased models
            tok.normalizer = tk.normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=True, strip_accents=None,
                lowercase=self.lower_case)
            tok.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
            tok.enable_padding(pad_id=v["[PAD]"], pad_token="[PAD]", pad_type_id=0)
        else:
            tok.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
        tok.post_processor = tk.processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", v["[CLS]"]), ("[SEP]", v["[SEP]"])])
        tok.enable_truncation(self.max_length, strategy="longest_first")
        return tok

    def __call__(self, texts: str | Sequence[str], pairs: str | Sequence[str] | None = None,
                 *, pad_to: int | None = None) -> Batch:
        """Tokenizes a batch (a str is a batch of one); `pairs` gives each text a second
        segment (segment id 1). Rows are padded to the longest row, and at least to `pad_to`."""
        texts, pad_to = _as_batch(texts, "texts"), self.pad_to if pad_to is None else pad_to
        if pairs is not None:
            pairs = _as_batch(pairs, "pairs")
            if len(pairs) != len(texts):
                raise BertfuseError(f"{len(texts)} texts but {len(pairs)} pairs")
        if pad_to is not None and (isinstance(pad_to, bool) or not isinstance(pad_to, int)
                                   or not 1 <= pad_to <= self.max_length):
            raise BertfuseError(f"pad_to must be an integer in 1..{self.max_length}, "
                                f"got {pad_to!r}")
        if all(t.isascii() for t in texts) and (pairs is None or all(p.isascii() for p in pairs)):
            clean = self._clean_ascii
            items = [clean(t) for t in texts] if pairs is None else \
                [(clean(t), clean(p)) for t, p in zip(texts, pairs)]
            ids, mask, types = self._ascii_rows(items, pairs is not None, pad_to or 0)
        else:
            encs = _encode(self._tok, texts if pairs is None else list(zip(texts, pairs)))
            ids = np.array([e.ids for e in encs], dtype=np.int32)
            mask = np.array([e.attention_mask for e in encs], dtype=np.int32)
            types = np.array([e.type_ids for e in encs], dtype=np.int32)
        if pad_to is not None and pad_to > ids.shape[1]:  # padded to the longest row so far
            wide = ((0, 0), (0, pad_to - ids.shape[1]))
            ids = np.pad(ids, wide, constant_values=self.vocab["[PAD]"])
            mask, types = np.pad(mask, wide), np.pad(types, wide)
        return Batch(ids, mask, types)

    def _clean_ascii(self, text: str) -> str:
        """BertNormalizer and BertPreTokenizer's punctuation split on ASCII text, at a third of
        their cost in the tokenizer: control characters dropped, tab/newline/CR to a space,
        lower-cased (there are no accents or CJK characters to handle), each punctuation
        character spaced out to be a word of its own."""
        text = _ASCII_PUNCT.sub(_spaced, text.translate(_ASCII_CLEAN))
        return text.lower() if self.lower_case else text

    def _ascii_rows(self, items: list, pairs: bool, pad_to: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Cleaned ASCII texts (or pairs) -> int32 ids, mask, segment ids padded to the
        longest row: one flat copy per array instead of a Python list per row. Single texts
        are put together here from cached word pieces; pairs (longest-first truncation)
        by the tokenizer."""
        if pairs:
            encs = _encode(self._ascii, items)
            rows, segments = [e.ids for e in encs], [e.type_ids for e in encs]
        else:
            rows, segments = [self._single(t) for t in items], None
        lengths = np.fromiter(map(len, rows), np.intp, len(rows))
        total, width = int(lengths.sum()), max(int(lengths.max()), pad_to)
        mask = np.arange(width) < lengths[:, None]  # row-major: each row's first tokens
        ids = np.full((len(rows), width), self.vocab["[PAD]"], np.int32)
        ids[mask] = np.fromiter(chain.from_iterable(rows), np.int32, total)
        types = np.zeros(ids.shape, np.int32)
        if segments is not None:
            types[mask] = np.fromiter(chain.from_iterable(segments), np.int32, total)
        return ids, mask.astype(np.int32), types

    def _single(self, text: str) -> list[int]:
        """[CLS] pieces [SEP] of one cleaned ASCII text, truncated to max_length: what the
        tokenizer gives (its whitespace split, its WordPiece model per word, its template),
        with each word's pieces cached (queries repeat their words) and the words past the
        limit never looked at."""
        row, keep, pieces = [self._cls], self.max_length - 1, self._pieces
        for word in text.split():  # only spaces are left in cleaned ASCII text
            ids = pieces.get(word)
            if ids is None:
                ids = [t.id for t in self._model.tokenize(word)]
                if len(pieces) >= _CACHED_WORDS:
                    pieces.clear()
                if len(word) <= _MAX_WORD:  # longer ones are [UNK]: not worth keeping
                    pieces[word] = ids
            row += ids
            if len(row) >= keep:
                break
        del row[keep:]
        row.append(self._sep)
        return row

    def tokens(self, text: str, pair: str | None = None) -> list[str]:
        """The word pieces of one input, [CLS] and [SEP] included (no padding)."""
        enc = self._tok.encode(_as_batch(text, "text")[0],
                               None if pair is None else _as_batch(pair, "pair")[0])
        return enc.tokens


def _encode(tok, items: list) -> list:
    """encode_batch_fast (no character offsets) where the tokenizers version has it."""
    return getattr(tok, "encode_batch_fast", tok.encode_batch)(items)


def _as_batch(value, what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Sequence):
        raise BertfuseError(f"{what} must be a str or a list of str, not {type(value).__name__}")
    if not value:
        raise BertfuseError(f"{what}: an empty batch")
    bad = next((v for v in value if not isinstance(v, str)), None)
    if bad is not None:
        raise BertfuseError(f"{what} must hold str only, not {type(bad).__name__}")
    return list(value)
