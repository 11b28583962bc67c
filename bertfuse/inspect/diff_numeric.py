"""`bertfuse diff --numeric`: both models on ONNX Runtime (CPU) with the same random padded
inputs, |diff| per common output, and the `numeric` findings from those rows (NaN/Inf on
either side, or max |diff| above --atol, fail closed). The structural diff is diff.py.
"""

from __future__ import annotations

import math
import json

import numpy as np

from bertfuse.errors import BertfuseError
from bertfuse.inspect.diff import DiffResult, Finding
from bertfuse.inspect.summary import load_light
from bertfuse.io.inputs import random_inputs
from bertfuse.io.ort import make_session


def _feeds(sess, batch: int, seq: int, seed: int, vocab: int, type_vocab: int,
           base: dict | None = None) -> dict:
    if base is None:
        base = random_inputs(batch, seq, vocab, type_vocab, seed=seed, pad_anywhere=True)
    feeds = {}
    for inp in sess.get_inputs():
        low = inp.name.lower()
        role = ("input_mask" if "mask" in low else
                "segment_ids" if "segment" in low or "type" in low else "input_ids")
        dtype = {"tensor(int32)": np.int32, "tensor(int64)": np.int64,
                 "tensor(float)": np.float32}.get(inp.type)
        if dtype is None:
            raise BertfuseError(f"--numeric: input {inp.name!r} has type {inp.type}; only "
                                f"int32/int64/float BERT inputs are supported")
        feeds[inp.name] = base[role].astype(dtype)
    return feeds


def _vocab(path: str) -> tuple[int, int]:
    meta = {p.key: p.value for p in load_light(path).metadata_props}
    try:
        cfg = json.loads(meta.get("bert_config", "{}"))
        return int(cfg.get("vocab_size", 100)), int(cfg.get("type_vocab_size", 2))
    except (ValueError, TypeError, AttributeError, RecursionError):  # edited metadata
        return 100, 2


def numeric_diff(path_a: str, path_b: str, batch: int, seq: int, seed: int,
                 base: dict | None = None, keep: list | None = None) -> list[dict]:
    """Both models on ORT CPU, the same random padded inputs (or `base`: the user's, by
    role); |diff| per common output. `keep` gets each model's outputs by name."""
    sessions = []
    for p in (path_a, path_b):
        try:  # no op library: an ai.bertfuse model fails here like any model ORT cannot load
            sessions.append(make_session(p, register_kernels=False))
        except Exception as exc:
            raise BertfuseError(f"{p}: ONNX Runtime cannot load the model: "
                                f"{str(exc).splitlines()[0][:200]}") from None
    vocab = min(_vocab(path_a), _vocab(path_b))
    names_a = [o.name for o in sessions[0].get_outputs()]
    names_b = {o.name for o in sessions[1].get_outputs()}
    common = [n for n in names_a if n in names_b]
    if not common:
        raise BertfuseError("--numeric: the two models share no output name")
    results = []
    for p, s in zip((path_a, path_b), sessions):
        feeds = _feeds(s, batch, seq, seed, *vocab, base=base)
        try:  # e.g. --seq past the model's position table: the user's input, not a bug
            results.append(s.run(common, feeds))
            if keep is not None:
                keep.append(dict(zip(common, results[-1])))
        except Exception as exc:
            raise BertfuseError(f"{p}: ONNX Runtime fails on the --numeric inputs (batch "
                                f"{batch}, seq {seq}): {str(exc).splitlines()[0][:200]}") from None
    rows = []
    for name, x, y in zip(common, *results):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            rows.append({"output": name, "shape_a": list(x.shape), "shape_b": list(y.shape),
                         "max_abs": None, "mean_abs": None})
            continue
        # NaN/Inf fail closed: counted per side, left out of max/mean (strict JSON has no NaN).
        bad_a, bad_b = ~np.isfinite(x), ~np.isfinite(y)
        d = np.abs(x - y)[~(bad_a | bad_b)]
        rows.append({"output": name, "shape_a": list(x.shape), "shape_b": list(y.shape),
                     "max_abs": float(d.max()) if d.size else 0.0,
                     "mean_abs": float(d.mean()) if d.size else 0.0,
                     "nonfinite_a": int(bad_a.sum()), "nonfinite_b": int(bad_b.sum())})
    return rows


def add_numeric(res: DiffResult, rows: list[dict], atol: float, batch: int, seq: int) -> None:
    if not (math.isfinite(atol) and atol >= 0):  # a NaN atol would pass every difference
        raise BertfuseError(f"--atol must be a finite number >= 0, got {atol!r}")
    res.numeric = rows
    for r in rows:
        bad = {side: r.get(f"nonfinite_{side}", 0) for side in ("a", "b")}
        if r["max_abs"] is None:
            res.findings.append(Finding("numeric", f"output {r['output']}: shape "
                                                   f"{r['shape_a']} -> {r['shape_b']}"))
        elif bad["a"] or bad["b"]:
            where = ", ".join(f"{n} in {side.upper()}" for side, n in bad.items() if n)
            res.findings.append(Finding("numeric", f"output {r['output']}: NaN/Inf values "
                                                   f"({where}; batch {batch}, seq {seq}, "
                                                   f"padded)"))
        elif not r["max_abs"] <= atol:
            res.findings.append(Finding("numeric", f"output {r['output']}: max |diff| "
                                                   f"{r['max_abs']:.3g} > atol {atol:g} "
                                                   f"(batch {batch}, seq {seq}, padded)"))
