"""Mask checks: what parity against TF cannot see.

TF and ONNX get the same wiring, so a wrong --inputs mapping (mask and segment ids swapped)
passes plain parity. Two perturbations of the padded positions (input_mask == 0) catch it,
each compared at the kept positions of sequence_output (or, for a model with only per-row
outputs such as a classifier's logits, on the first output of the rows whose first token,
[CLS], is kept):

* padded ids changed: the ONNX model must move exactly as TF moves. Usually neither moves;
  a model whose own outputs legitimately read padded ids (MobileBERT's trigram embedding
  looks at the next token, RoBERTa's positions count non-pad ids) moves in both.
* padded segment ids changed: nothing may move, in TF or in ONNX. No BERT lets a masked
  token's segment reach another token, but with the mask and segment ids swapped the
  "segment ids" are the real mask, so TF's own outputs move.
"""

from __future__ import annotations

import math

import numpy as np

IDS = "mask invariance (padded ids changed)"
SEGMENTS = "mask invariance (padded segment ids changed)"


def perturbed_feeds(feeds: dict[str, np.ndarray], source, seed: int | None
                    ) -> dict[str, dict[str, np.ndarray]]:
    """'ids' (and 'segments' when the source has a segment input with two or more types):
    the feeds with the padded positions' ids (segment ids) changed."""
    rng = np.random.default_rng(None if seed is None else [seed, 1])
    padded = ~feeds["input_mask"].astype(bool)
    ids = feeds["input_ids"].copy()
    vocab = source.vocab_size or int(ids.max()) + 1
    ids[padded] = rng.integers(1, max(vocab, 2), size=int(padded.sum()))
    out = {"ids": {**feeds, "input_ids": ids}}
    types = source.type_vocab_size or 1
    if "segment_ids" in source.inputs and types >= 2:
        segs = feeds["segment_ids"].copy()
        segs[padded] = (segs[padded] + 1) % types  # every padded segment id changes
        out["segments"] = {**feeds, "segment_ids": segs}
    return out


def _moves(before: np.ndarray, after: np.ndarray, kept: np.ndarray) -> np.ndarray:
    return (np.asarray(after, np.float64) - np.asarray(before, np.float64))[kept]


def _nonfinite(*arrays: np.ndarray) -> int:
    return sum(int(a.size - np.count_nonzero(np.isfinite(a))) for a in arrays)


def mask_rows(mask: np.ndarray, references: dict, candidates: dict, tol) -> list[tuple]:
    """(name, max, mean, ok, nonfinite, note) per check, for verify.OutputParity; `tol` is a
    verify.Tolerance, the references/candidates keyed 'base', 'ids', 'segments'."""
    # Watched: sequence_output at the kept tokens; a model with only per-row outputs (a
    # classifier's logits, a pooled output) is watched on the whole of its first output.
    out = "sequence_output" if "sequence_output" in references["base"] else \
        next(iter(references["base"]))
    t0 = references["base"][out]
    o0 = candidates["base"].get(out)
    if o0 is None:
        return []  # the missing output already failed plain parity
    if out == "sequence_output":
        kept = mask.astype(bool)
    else:  # a row's output is read off its first token ([CLS]): rows where that is kept
        kept = np.zeros(np.shape(t0), bool)
        kept[mask[:, 0].astype(bool)] = True
    bound = tol.atol + tol.rtol * np.abs(np.asarray(t0, np.float64))[kept]
    rows = []
    for key, name in (("ids", IDS), ("segments", SEGMENTS)):
        if key not in references:
            continue
        t1 = references[key][out]
        o1 = candidates[key].get(out)
        bad = _nonfinite(t0, o0, t1, o1) if o1 is not None else 1
        if bad:
            rows.append((name, math.nan, math.nan, False, bad, f"{bad} NaN/Inf value(s)"))
            continue
        dt, do = _moves(t0, t1, kept), _moves(o0, o1, kept)
        tf_moved = float(np.abs(dt).max()) if dt.size else 0.0
        onnx_moved = float(np.abs(do).max()) if do.size else 0.0
        if key == "ids":
            # ONNX must follow TF; where TF itself moves, each side may carry one tolerance.
            gap = np.abs(do - dt)
            legit = bool(np.any(np.abs(dt) > bound))
            ok = bool(np.all(gap <= bound * (2 if legit else 1)))
            note = f"TF's own outputs move by {tf_moved:.3g}" if legit else ""
        else:
            gap = np.maximum(np.abs(dt), np.abs(do))
            ok = bool(np.all(gap <= bound))
            note = ("TF's own outputs move: input_mask does not act as the attention mask"
                    if np.any(np.abs(dt) > bound) else
                    f"the ONNX model moves by {onnx_moved:.3g}, TF does not" if not ok else "")
        mx = float(gap.max()) if gap.size else 0.0
        mean = float(gap.mean()) if gap.size else 0.0
        rows.append((name, mx, mean, ok, 0, note))
    return rows


def tf_moved_on_segments(row) -> bool:
    """The segment check failed on TF's own outputs (a wiring problem, not a conversion one)."""
    return row.name == SEGMENTS and row.note.startswith("TF's own")
