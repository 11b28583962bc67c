"""Parity on the user's own data, as Polygraphy's `run` takes it: inputs from a file or from
text through a vocab, saved reference outputs to compare against, and the run's own inputs
and outputs saved for later. Polygraphy's own JSON files are read too (its `run
--save-inputs` and `--save-outputs`, io/polygraphy.py), and inputs saved as .json are written
in the form its `run --load-inputs` reads.

    --load-inputs FILE.npz|.json ─┐                               ┌─► --save-inputs FILE
    --text-file FILE --vocab V  ──┴─► feeds by role (int32) ─► parity ─► --save-outputs FILE
    --load-outputs FILE ─────────────► the reference, instead of TensorFlow's run

A file's arrays are named by role (input_ids, input_mask, segment_ids), by the source's own
input names (attention_mask, token_type_ids, input_word_ids, ...), or as the tests' own
fixtures (`in/NAME`, `out/NAME`: tests/fixtures/thirdparty/*/reference.npz). Outputs are
named as the ONNX model's (sequence_output, ...) or as the source's own. Saved outputs hold
the reference's outputs under their names and the model's under `onnx/NAME`. Every file is
read before the slow work; a bad one is one BertfuseError line (exit 2).
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from bertfuse.errors import BertfuseError
from bertfuse.io.limits import (MAX_JSON_ARRAYS_BYTES, MAX_TEXT_FILE_BYTES, MAX_TEXT_ROWS,
                                json_text, text_lines as bounded_lines)
from bertfuse.io import polygraphy
from bertfuse.io.npz import read_npz
from bertfuse.converter.roles import HUB_EXTRAS, ROLE_CUES, ROLE_NAMES
from bertfuse.io.safety import check_output, mode_of, replace_file, temp_file, write_text
from bertfuse.io.write_errors import naming_the_path
from bertfuse.text import WordPiece, read_vocab

SUFFIXES = (".npz", ".json")
IN, OUT, MODEL = "in/", "out/", "onnx/"  # fixture keys; the model's outputs when saved
_INT32 = np.iinfo(np.int32)


def _suffix(flag: str, path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in SUFFIXES:
        raise BertfuseError(f"{flag} {path}: expected a .npz or .json file, not "
                            f"{ext or 'a name without a suffix'!r}")
    return ext


def read_arrays(flag: str, path: str) -> dict[str, np.ndarray]:
    """name -> array from an .npz (numpy.savez), a .json object of name -> nested lists (or
    a list holding one such object), or Polygraphy's JSON (io/polygraphy.py)."""
    ext = _suffix(flag, path)
    if not os.path.exists(path):
        raise BertfuseError(f"{flag} {path}: no such file")
    if not os.path.isfile(path):
        raise BertfuseError(f"{flag} {path}: not a regular file")
    try:
        if ext == ".npz":  # sizes declared in the zip and .npy headers checked first
            arrays = read_npz(path, f"{flag} {path}")
        else:
            data = json.loads(json_text(path, MAX_JSON_ARRAYS_BYTES, "a .json of arrays (save "
                                        "larger ones as .npz)", f"{flag} {path}"))
            if polygraphy.is_polygraphy(data):  # its run's --save-inputs / --save-outputs
                return _nonempty(flag, path, polygraphy.read(data, f"{flag} {path}"))
            if isinstance(data, list) and len(data) == 1:
                data = data[0]
            if not isinstance(data, dict):
                raise BertfuseError(f"{flag} {path}: expected a JSON object of name -> "
                                    f"nested lists, e.g. {{\"input_ids\": [[101, 2054, 102]]}}")
            arrays = {k: _json_array(flag, path, k, v) for k, v in data.items()}
    except BertfuseError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:  # zip, JSON, pickle
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise BertfuseError(f"{flag} {path}: not a readable {ext} file ({first})") from None
    return _nonempty(flag, path, arrays)


def _nonempty(flag: str, path: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if not arrays:
        raise BertfuseError(f"{flag} {path}: holds no arrays")
    return arrays


def _json_array(flag: str, path: str, name: str, value: Any) -> np.ndarray:
    try:
        array = np.array(value)
    except ValueError:
        array = None
    if array is None or array.dtype == object or array.dtype.kind not in "biuf":
        raise BertfuseError(f"{flag} {path}: {name!r} is not a rectangular array of numbers "
                            f"(rows of one length)")
    return array


def write_arrays(path: str, arrays: Mapping[str, np.ndarray], inputs: bool = False) -> None:
    """.npz or .json by the suffix, written atomically (a temporary file, then renamed).
    inputs: a .json in Polygraphy's input format, which its `run --load-inputs` reads."""
    if _suffix("save", path) == ".json":
        body = polygraphy.encode_inputs(arrays) if inputs else \
            {k: np.asarray(v).tolist() for k, v in arrays.items()}
        with naming_the_path(path):
            write_text(path, json.dumps(body, indent=1 if inputs else None))
        return
    target = Path(path)
    mode = mode_of(target)
    with naming_the_path(target), temp_file(target) as tmp:
        with open(tmp, "wb") as f:  # a file object: savez would add .npz to a name
            np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})
        os.chmod(tmp, mode)
        replace_file(tmp, target)


def text_feeds(path: str, vocab: str, max_length: int | None,
               model: str | None = None) -> dict[str, np.ndarray]:
    """One query a line (blank lines skipped), a pair as QUERY<TAB>PASSAGE, through the
    vocab's WordPiece; rows padded to the longest."""
    split = text_lines(path)
    tok = WordPiece(vocab, max_length=max_length, model=model)
    batch = tok([s[0] for s in split], [s[1] for s in split] if len(split[0]) == 2 else None)
    return batch.feeds()


def text_lines(path: str) -> list[list[str]]:
    """The text file's non-blank lines, each [query] or [query, passage]."""
    if not os.path.isfile(path):
        raise BertfuseError(f"--text-file {path}: no such file")
    lines = [ln for ln in bounded_lines(path, MAX_TEXT_FILE_BYTES, "a text file",
                                        MAX_TEXT_FILE_BYTES, MAX_TEXT_ROWS, f"--text-file {path}")
             if ln.strip()]
    if not lines:
        raise BertfuseError(f"--text-file {path}: no text (one query a line)")
    split = [ln.split("\t", 1) for ln in lines]
    pairs = [len(s) == 2 for s in split]
    if any(pairs) and not all(pairs):
        raise BertfuseError(f"--text-file {path}: line {pairs.index(not pairs[0]) + 1} "
                            f"{'lacks' if pairs[0] else 'has'} a tab; give every line a pair "
                            f"(QUERY<TAB>PASSAGE) or none")
    return split


def role_of(key: str, names: Mapping[str, str]) -> str | None:
    """The role a file's array name stands for: a role, the source's own name (`names`:
    role -> name), or a name the converter recognises (exactly, then by a cue)."""
    if key in ROLE_NAMES:
        return key
    for role, name in names.items():
        if key in (name, name.removesuffix(":0")):
            return role
    base = key.removesuffix(":0").rsplit("/", 1)[-1].lower()
    for table in (ROLE_NAMES, ROLE_CUES):
        hits = [r for r, words in table.items()
                if (base in words if table is ROLE_NAMES else any(w in base for w in words))]
        if len(hits) == 1:
            return hits[0]
    return None


def input_feeds(flag: str, path: str, arrays: Mapping[str, np.ndarray],
                names: Mapping[str, str], early: bool = False) -> dict[str, np.ndarray]:
    """The file's inputs as int32 [batch, seq] arrays by role; a mask defaults to ones and
    segment ids to zeros. early: before the source is loaded, names not yet known are left
    for later (they may be the source's own) and only checked as [batch, seq] ids."""
    feeds: dict[str, np.ndarray] = {}
    unknown = []
    for key, array in arrays.items():
        if key.startswith((OUT, MODEL)):
            continue  # outputs saved beside the inputs
        name = key.removeprefix(IN)
        role = role_of(name, names)
        if role is None:
            unknown.append(name)
            _ints(flag, path, name, array)
        elif role in feeds:
            raise BertfuseError(f"{flag} {path}: two arrays are {role} ({name!r} and another)")
        else:
            feeds[role] = _ints(flag, path, name, array)
    if early and (unknown or not feeds):
        shapes = {np.shape(a) for k, a in arrays.items() if not k.startswith((OUT, MODEL))}
        if len(shapes) > 1:
            raise BertfuseError(f"{flag} {path}: the inputs have different shapes "
                                f"({', '.join(str(list(s)) for s in sorted(shapes))})")
        return feeds
    if unknown:
        raise BertfuseError(f"{flag} {path}: {', '.join(map(repr, unknown))} is no model input "
                            f"(name arrays input_ids, input_mask, segment_ids or as the "
                            f"source's inputs)")
    if "input_ids" not in feeds:
        raise BertfuseError(f"{flag} {path}: no input_ids array (names: {', '.join(arrays)})")
    shape = feeds["input_ids"].shape
    for role, array in feeds.items():
        if array.shape != shape:
            raise BertfuseError(f"{flag} {path}: {role} has shape {list(array.shape)}, "
                                f"input_ids {list(shape)}")
    mask = feeds.setdefault("input_mask", np.ones(shape, np.int32))
    feeds.setdefault("segment_ids", np.zeros(shape, np.int32))
    if not np.isin(mask, (0, 1)).all():
        raise BertfuseError(f"{flag} {path}: input_mask holds values other than 0 and 1")
    kept = mask.reshape(-1, mask.shape[-1]).any(axis=1)  # [batch, choices, seq]: per choice
    if not kept.all():
        raise BertfuseError(f"{flag} {path}: row {int(np.argmin(kept))} of "
                            f"input_mask is all zeros")
    return feeds


def _ints(flag: str, path: str, name: str, array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    if a.ndim not in (2, 3) or 0 in a.shape:
        raise BertfuseError(f"{flag} {path}: {name!r} has shape {list(a.shape)}; inputs are "
                            f"[batch, seq] ([batch, choices, seq] for multiple choice)")
    if a.dtype.kind == "f" and not np.array_equal(a, np.round(a)):
        raise BertfuseError(f"{flag} {path}: {name!r} holds non-integer values")
    if a.dtype.kind not in "biuf" or a.min() < _INT32.min or a.max() > _INT32.max:
        raise BertfuseError(f"{flag} {path}: {name!r} is not int32 ids")
    return a.astype(np.int32)


@dataclass
class ParityData:
    """The parity-data options of one run, files read at construction (before slow work)."""

    load_inputs: str | None = None
    text_file: str | None = None
    vocab: str | None = None
    save_inputs: str | None = None
    save_outputs: str | None = None
    load_outputs: str | None = None
    _inputs: dict = field(default_factory=dict, repr=False)
    _outputs: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_options(cls, opts) -> ParityData | None:
        data = cls(opts.load_inputs, opts.text_file, opts.vocab, opts.save_inputs,
                   opts.save_outputs, opts.load_outputs)
        return data if any((data.load_inputs, data.text_file, data.save_inputs,
                            data.save_outputs, data.load_outputs, data.vocab)) else None

    def __post_init__(self) -> None:
        if self.load_inputs and self.text_file:
            raise BertfuseError("--load-inputs and --text-file both give the inputs: pass one")
        if bool(self.text_file) != bool(self.vocab):
            raise BertfuseError("--text-file needs --vocab (the checkpoint's vocab.txt; verify "
                                "finds MODEL.vocab.txt beside the model itself), and --vocab "
                                "is read only with --text-file")
        if self.load_outputs and not self.has_inputs:
            raise BertfuseError("--load-outputs needs the inputs they were computed from: "
                                "--load-inputs FILE or --text-file FILE --vocab VOCAB")
        for flag, path in (("--save-inputs", self.save_inputs),
                           ("--save-outputs", self.save_outputs)):
            if path:
                _suffix(flag, path)
        if self.load_inputs:
            self._inputs = read_arrays("--load-inputs", self.load_inputs)
            input_feeds("--load-inputs", self.load_inputs, self._inputs, {}, early=True)
        if self.text_file:
            text_lines(self.text_file)
            read_vocab(self.vocab)  # bounded and checked before the slow work, too
        if self.load_outputs:
            self._outputs = read_arrays("--load-outputs", self.load_outputs)
            if not self.outputs_by_name():
                raise BertfuseError(f"--load-outputs {self.load_outputs}: holds no outputs "
                                    f"(only inputs: in/NAME)")

    @property
    def has_inputs(self) -> bool:
        return bool(self.load_inputs or self.text_file)

    def describe_inputs(self, batch: int, seq: int) -> str:
        """What the report says of the inputs."""
        where = self.load_inputs or f"{self.text_file} through {self.vocab}"
        return f"{where}: {batch} rows of {seq} tokens"

    def read_files(self) -> list[str]:
        return [p for p in (self.load_inputs, self.text_file, self.vocab, self.load_outputs) if p]

    def check_targets(self, inputs: list[str]) -> None:
        """The save paths: none of the run's inputs, in a directory that exists."""
        if self.save_inputs and self.save_inputs == self.save_outputs:
            raise BertfuseError(f"--save-inputs and --save-outputs are both {self.save_inputs}")
        dirs = [p for p in inputs if os.path.isdir(p)]
        for path in (self.save_inputs, self.save_outputs):
            if path:
                check_output(path, [*inputs, *self.read_files()], dirs, model=False)

    def feeds(self, names: Mapping[str, str], max_length: int | None,
              model: str | None = None) -> dict[str, np.ndarray]:
        """Inputs by role (`names`: role -> the source's own input name)."""
        if self.text_file:
            return text_feeds(self.text_file, self.vocab, max_length, model)
        return input_feeds("--load-inputs", self.load_inputs, self._inputs, names)

    def outputs_by_name(self) -> dict[str, np.ndarray]:
        """The saved outputs: `out/NAME` (a fixture), or every array that is no input."""
        outs = {k.removeprefix(OUT): v for k, v in self._outputs.items() if k.startswith(OUT)}
        if outs:
            return outs
        return {k: v for k, v in self._outputs.items()
                if not k.startswith((IN, MODEL)) and role_of(k, {}) is None}

    def expected(self, known: Mapping[str, str], outputs: list[str]) -> dict[str, np.ndarray]:
        """The saved outputs under the model's names (`known`: a source's own output name ->
        the model's); a name the model lacks is bad input, but for TF Hub's `default` and
        `encoder_outputs`, which conversion leaves out unless asked (saved from the
        signature, they are there)."""
        out = {}
        for name, array in self.outputs_by_name().items():
            canon = name if name in outputs else known.get(name, known.get(f"{name}:0"))
            if canon not in outputs and HUB_EXTRAS.fullmatch(name):
                continue
            if canon not in outputs:
                raise BertfuseError(f"--load-outputs {self.load_outputs}: {name!r} is no "
                                    f"output of the model (outputs: {', '.join(outputs)})")
            out[canon] = np.asarray(array)
        return out

    def save(self, feeds: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
             model_outputs: Mapping[str, np.ndarray]) -> None:
        if self.save_inputs:
            write_arrays(self.save_inputs, feeds, inputs=True)
        if self.save_outputs:
            write_arrays(self.save_outputs, {**reference, **{MODEL + k: v for k, v in
                                                              model_outputs.items()}})
