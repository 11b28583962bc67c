"""The limits on files that come from users (other than ONNX models and TensorFlow graphs),
in one table, and the helpers that apply them before anything large is read or allocated.

    check_size   a file's size from stat, before it is opened (a sparse 2 GB file costs
                 nothing to refuse); not a regular file (a fifo, a device) is refused too
    read_text    at most `limit` bytes of a regular file, NUL bytes refused, UTF-8 decoded
    json_text    read_text, then the JSON's nesting counted before json.loads recurses
    read_json    json_text, then parsed; every failure one BertfuseError line
    text_lines   a text file line by line (vocab.txt): each line bounded, NUL and bad UTF-8
                 refused, the count of lines bounded, never the whole file at once

Every refusal is one line naming the file (or the flag and the file), the limit and, where
there is one, what to do. Each value is well above what any real file of its kind needs
(the reason is beside it); a file past one is a mistake or an attack, never a model.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Iterator
import json

import numpy as np

from bertfuse.errors import BertfuseError

MiB = 1 << 20
GiB = 1 << 30

# --load-inputs / --load-outputs .npz: the sum of its members' uncompressed sizes, as the zip
# directory declares them and as each .npy header's shape and dtype declare. Parity inputs
# are [batch, seq] int32 (1024 x 512 rows: 2 MiB); saved outputs [batch, seq, hidden] fp32
# (64 x 512 x 1024: 128 MiB); BERT's MLM logits over a 30k vocab (8 x 512 rows: 477 MiB).
MAX_ARRAYS_BYTES = 1 * GiB
# ... and its members: inputs and outputs by name (a fixture holds in/ and out/ of each).
MAX_NPZ_MEMBERS = 1024
# A .json of arrays parses into Python objects at up to ~13x its size (63 MiB of floats:
# 825 MB peak, 10 s); 32 MiB holds 8M floats ([8, 128, 768] outputs take 6 MiB). Larger
# arrays belong in an .npz.
MAX_JSON_ARRAYS_BYTES = 32 * MiB
# Nesting of any JSON file: an array file nests 5 deep ([{"input_ids": [[[...]]]}]), a
# tokenizer.json about 6, a config 2; json.loads recurses once a level (Python's limit: 1000).
MAX_JSON_DEPTH = 64
# bert_config.json / albert_config.json / ELECTRA's hparams / tokenizer_config.json: a few
# hundred bytes to a few KB.
MAX_CONFIG_BYTES = 1 * MiB
# A bertfuse summary (summarize's JSON, for diff): 5 KB for 3 layers, ~0.6 KB a layer more.
MAX_SUMMARY_BYTES = 64 * MiB
# vocab.txt: BERT's 30,522 tokens take 226 KB, multilingual BERT's 119,547 about 1 MB. The
# largest these limits let through (1M tokens of 60 bytes) tokenizes at an 814 MB peak, 5 s.
MAX_VOCAB_BYTES = 64 * MiB
# tokenizer.json: bert-base-uncased's is 466 KB; a 250k-token vocab's under 20 MB. One of
# 32 MiB parses in 3 s at a 391 MB peak (2.1M tokens, then refused by MAX_VOCAB_TOKENS).
MAX_TOKENIZER_JSON_BYTES = 32 * MiB
# Tokens in a vocab, and a config's vocab_size: 8x multilingual BERT's 119,547, 4x the
# 250,002 of the largest multilingual vocabularies.
MAX_VOCAB_TOKENS = 1 << 20
# One vocab line: WordPiece makes any word past 100 characters [UNK], so no longer token is
# ever used (100 characters of 4-byte UTF-8 are 400 bytes).
MAX_VOCAB_LINE = 1024
# --text-file: one query (or pair) a line; every row is padded to the longest, so the rows
# are bounded as well as the bytes.
MAX_TEXT_FILE_BYTES = 64 * MiB
MAX_TEXT_ROWS = 65_536
# A BERT config's sizes, checked before anything is built from them. The largest released
# BERT-family encoders: 48 layers (Megatron-BERT 3.9B), hidden 4096 with 64 heads and an FFN
# of 16,384 (ALBERT-xxlarge), positions 8,192 (long-context encoders), 2 token types (BERT).
CONFIG_BOUNDS = {
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "hidden_size": 65_536,
    "intermediate_size": 262_144,
    "vocab_size": MAX_VOCAB_TOKENS,
    "max_position_embeddings": 1 << 17,
    "type_vocab_size": 1024,
    "embedding_size": 65_536,  # ALBERT and ELECTRA: 128 to 1024
    "num_hidden_groups": 1024,  # ALBERT: 1; at most one group a layer
    "inner_group_num": 64,  # ALBERT: 1
}
# Chunks the JSON depth scan works in: its arrays cost ~40 bytes a byte of the chunk.
_DEPTH_CHUNK = 1 * MiB
_LINES_BLOCK = 1 * MiB  # text_lines reads whole lines a block at a time
NL = b"\n"


def size_text(n: int) -> str:
    """3221225600 -> '3.0 GiB' (binary units, as the limits are written)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def check_size(path: str | os.PathLike, limit: int, what: str, label: str | None = None) -> int:
    """The size of a regular file at `path`, from stat; refused (BertfuseError) past `limit`
    or when it is not a regular file. A missing file or a directory raises the OSError
    (FileNotFoundError, IsADirectoryError) for the caller to word."""
    label = label or str(path)
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "Is a directory", str(path))
    if not stat.S_ISREG(st.st_mode):
        raise BertfuseError(f"{label}: not a regular file (a {what} is read from one)")
    if st.st_size > limit:
        raise BertfuseError(f"{label}: {size_text(st.st_size)}, over the {size_text(limit)} "
                            f"limit for {what}; is it the right file?")
    return st.st_size


def read_text(path: str | os.PathLike, limit: int, what: str, label: str | None = None) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes (checked from stat, and
    again while reading: a file that grows is cut at the limit and refused); NUL refused."""
    label = label or str(path)
    return _utf8(_read_bytes(path, limit, what, label), what, label)


def json_text(path: str | os.PathLike, limit: int, what: str, label: str | None = None,
              depth: int = MAX_JSON_DEPTH) -> str:
    """read_text, its JSON nesting checked: ready for json.loads."""
    label = label or str(path)
    data = _read_bytes(path, limit, what, label)
    if data.count(b"[") + data.count(b"{") > depth and json_depth(data) > depth:
        raise BertfuseError(f"{label}: JSON nested too deeply for {what} (over {depth} "
                            f"levels; the limit is {depth})")
    return _utf8(data, what, label)


def _read_bytes(path: str | os.PathLike, limit: int, what: str, label: str) -> bytes:
    check_size(path, limit, what, label)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise BertfuseError(f"{label}: over the {size_text(limit)} limit for {what} (it grew "
                            f"while read)")
    nul = data.find(b"\0")
    if nul >= 0:
        raise BertfuseError(f"{label}: binary content (a NUL byte at offset {nul}), not "
                            f"{what}")
    return data


def _utf8(data: bytes, what: str, label: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BertfuseError(f"{label}: not UTF-8 text at byte {exc.start}, not {what}") \
            from None


def read_json(path: str | os.PathLike, limit: int, what: str, label: str | None = None,
              depth: int = MAX_JSON_DEPTH) -> Any:
    """A user's JSON file, bounded in size and depth; a parse error is one line."""
    label = label or str(path)
    text = json_text(path, limit, what, label, depth)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BertfuseError(f"{label}: not valid JSON ({exc})") from None


def json_depth(data: bytes) -> int:
    """The deepest bracket nesting outside JSON strings, in chunks of _DEPTH_CHUNK bytes (the
    string and backslash state carried across), so a large file costs little memory."""
    deepest = depth = 0
    inside, odd = False, False
    for start in range(0, len(data), _DEPTH_CHUNK):
        a = np.frombuffer(data, np.uint8, min(_DEPTH_CHUNK, len(data) - start), start)
        top, depth, inside, odd = _depth_chunk(a, depth, inside, odd)
        deepest = max(deepest, top)
    return deepest


def _depth_chunk(a: np.ndarray, depth: int, inside: bool, odd: bool
                 ) -> tuple[int, int, bool, bool]:
    """(deepest, depth at the end, inside a string at the end, odd run of backslashes at the
    end) of one chunk. A quote preceded by an odd run of backslashes is escaped; every other
    quote opens or closes a string."""
    idx = np.arange(a.size)
    before_start = -2 if odd else -1  # the last byte before the chunk that is no backslash
    last_other = np.maximum.accumulate(np.where(a == 0x5C, before_start, idx))
    before = np.concatenate(([before_start], last_other[:-1]))
    quote = (a == 0x22) & ((idx - 1 - before) % 2 == 0)
    outside = (np.cumsum(quote) + inside) % 2 == 0
    step = (np.isin(a, (0x5B, 0x7B)).astype(np.int8) - np.isin(a, (0x5D, 0x7D))) * outside
    levels = np.cumsum(step, dtype=np.int64) + depth
    return (int(levels.max(initial=depth)), int(levels[-1]), not bool(outside[-1]),
            bool((a.size - 1 - last_other[-1]) % 2))


def text_lines(path: str | os.PathLike, limit: int, what: str, max_line: int,
               max_lines: int, label: str | None = None) -> Iterator[str]:
    """The lines of a UTF-8 text file (without their line ends), read a block of whole lines
    at a time: the file bounded by `limit` bytes (stat first), each line by `max_line` bytes,
    their count by `max_lines`; NUL bytes and bad UTF-8 refused with the line number. (Blocks,
    not readline: the checks run in C over a block; a 120k-token vocab takes 0.09 s, as long
    as reading it whole, where readline took 0.4 s.)"""
    label = label or str(path)
    check_size(path, limit, what, label)
    total = done = 0
    rest = b""
    with open(Path(path), "rb") as f:
        while True:
            block = f.read(_LINES_BLOCK)
            total += len(block)
            if total > limit:
                raise BertfuseError(f"{label}: over the {size_text(limit)} limit for {what} "
                                    f"(it grew while read)")
            data, rest = (rest + block, b"") if not block else _whole_lines(rest + block)
            if len(rest) > max_line + 1:
                number = done + data.count(NL) + 1
                raise BertfuseError(f"{label}: line {number} is longer than {max_line} bytes, "
                                    f"the limit for {what}")
            lines = _checked(data.replace(b"\r\n", b"\n"), done, what, max_line, label)
            done += len(lines)
            if done > max_lines:
                raise BertfuseError(f"{label}: over {max_lines:,} lines, the limit for {what}")
            yield from lines
            if not block:
                return


def _whole_lines(data: bytes) -> tuple[bytes, bytes]:
    cut = data.rfind(b"\n") + 1
    return data[:cut], data[cut:]


def _checked(data: bytes, done: int, what: str, max_line: int, label: str) -> list[str]:
    """Whole lines (the last may lack its line end) after `done` lines, checked, decoded."""
    if not data:
        return []
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    lines[-1] = lines[-1].rstrip(b"\r")
    if max(map(len, lines)) > max_line:
        number = next(i for i, ln in enumerate(lines) if len(ln) > max_line) + done + 1
        raise BertfuseError(f"{label}: line {number} is longer than {max_line} bytes, the "
                            f"limit for {what}")
    nul = data.find(b"\0")
    if nul >= 0:
        number = done + data.count(NL, 0, nul) + 1
        raise BertfuseError(f"{label}: binary content (a NUL byte on line {number}), not {what}")
    try:
        text = data.decode("utf-8").split("\n")[:len(lines)]
        text[-1] = text[-1].rstrip("\r")
        return text
    except UnicodeDecodeError as exc:
        number = done + data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start) - 1
        raise BertfuseError(f"{label}: not UTF-8 text (line {number}, byte {column}), not "
                            f"{what}") from None
