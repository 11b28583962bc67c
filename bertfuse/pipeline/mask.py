"""Mask checks: what parity against TF cannot see.

TF and ONNX get the same wiring, so a wrong --inputs mapping (mask and segment ids swapped)
passes plain parity. Two perturbations of the padded positions (input_mask == 0) catch it,
each compared at the kept positions of sequence_output (without one, of the per-token head
outputs: token classification's token_logits, a span head's start/end_logits; for a model
with only per-row outputs such as a classifier's logits, on the first output of the rows whose
first token, [CLS], is kept):

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

from bertfuse.converter.source import per_token

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


def _nonfinite(*arrays: np.ndarray) -> int:
    return sum(int(a.size - np.count_nonzero(np.isfinite(a))) for a in arrays)


def watched(names) -> tuple[list[str], bool]:
    """(outputs the checks watch, whether per token): sequence_output at the kept tokens;
    without one, every per-token head output (token_logits, start/end_logits) at the kept
    tokens, since a padded token's own logits legitimately move with its segment id; else a
    model with only per-row outputs (a classifier's logits, a pooled output) on its first
    output, at the rows whose first token ([CLS]) is kept."""
    names = list(names)
    if "sequence_output" in names:
        return ["sequence_output"], True
    tokens = [n for n in names if per_token(n)]
    return (tokens, True) if tokens else (names[:1], False)


def _kept(mask: np.ndarray, shape: tuple, token: bool) -> np.ndarray:
    if token:  # [B, S] picks the tokens of [B, S] and [B, S, ...] alike
        return mask.astype(bool)
    kept = np.zeros(shape, bool)  # a row's output is read off its first token ([CLS])
    kept[mask[..., 0].astype(bool)] = True  # [B, choices, S] masks: per choice
    return kept


def _flat(outputs: dict, names: list[str], keeps: list[np.ndarray]) -> np.ndarray | None:
    if any(outputs.get(n) is None for n in names):
        return None
    return np.concatenate([np.asarray(outputs[n], np.float64)[k].ravel()
                           for n, k in zip(names, keeps)])


def mask_rows(mask: np.ndarray, references: dict, candidates: dict, tol) -> list[tuple]:
    """(name, max, mean, ok, nonfinite, note) per check, for verify.OutputParity; `tol` is a
    verify.Tolerance, the references/candidates keyed 'base', 'ids', 'segments'."""
    outs, token = watched(references["base"])
    keeps = [_kept(mask, np.shape(references["base"][n]), token) for n in outs]
    t0 = _flat(references["base"], outs, keeps)
    o0 = _flat(candidates["base"], outs, keeps)
    if o0 is None:
        return []  # the missing output already failed plain parity
    bound = tol.atol + tol.rtol * np.abs(t0)
    rows = []
    for key, name in (("ids", IDS), ("segments", SEGMENTS)):
        if key not in references:
            continue
        t1 = _flat(references[key], outs, keeps)
        o1 = _flat(candidates[key], outs, keeps)
        # NaN/Inf anywhere in a watched output fails, padded positions included.
        bad = sum(_nonfinite(*(np.asarray(side[k][n], np.float64) for k in ("base", key)))
                  for side in (references, candidates) for n in outs) if o1 is not None else 1
        if bad:
            rows.append((name, math.nan, math.nan, False, bad, f"{bad} NaN/Inf value(s)"))
            continue
        dt, do = t1 - t0, o1 - o0
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
