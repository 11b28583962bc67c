"""FP8's accuracy in a ranking or retrieval user's terms, and the gate `--precision fp8` holds
it to.

The FP8 model's outputs (NumPy references, fp8.py) against the fp32 reference's on the same
inputs, per output, by what the output's values mean (its shape and name, not an exporter's
spelling):

    [B, H] vectors (pooled, embeddings)   ─► cosine per row: min, mean       gated: min cosine
    [B, S, H] per-token vectors           ─► cosine per row of the mean over   gated: min cosine
                                             its valid tokens (mean pooling's
                                             sentence embedding): min, mean;
                                             per valid token: min, mean        stated
    logits: a name with "logits",         ─► argmax agreement per row          gated: agreement
      [B, C] or [B, S, C]                    (per valid token for [B, S, C])
    [B] or [B, 1] scores                  ─► top-k agreement of the batch      stated
                                             ranked by score
    vectors, per-token vectors (pooled)   ─► top-k agreement of each row's     stated
                                             nearest rows, the batch as the
                                             candidate set

Cosine is taken between L2-normalised rows, so it is what a retrieval index compares; a
zero-norm row on both sides counts as 1.0, on one side as 0.0. Top-k agreement is
|top-k(fp32) ∩ top-k(FP8)| / k, averaged over the queries; k = min(10, candidates - 1),
stated, never gated (a batch of 4 random inputs is no candidate set). NaN or Inf in an
FP8 output always fails. The defaults are min cosine >= 0.999 and argmax agreement >= 99.5%
(`convert --fp8-min-cosine`, `--fp8-min-argmax`); `--force` writes a model that misses them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bertfuse.checks import check_fraction
from bertfuse.errors import BertfuseError
from bertfuse.passes.fp8_weights import PLACES

MIN_COSINE = 0.999
MIN_ARGMAX = 0.995
TOP_K = 10


@dataclass
class UserTerms:
    """One output's FP8 accuracy in user terms (None: not a measure of this output)."""

    name: str
    kind: str  # vectors | token vectors | logits | token logits | scores
    count: int  # rows (or valid tokens) measured
    cosine_min: float | None = None
    cosine_mean: float | None = None
    argmax_agreement: float | None = None
    topk_agreement: float | None = None
    k: int = 0
    token_cosine_min: float | None = None  # per-token vectors: per valid token (stated)
    token_cosine_mean: float | None = None
    nonfinite: int = 0  # NaN/Inf values in the FP8 output: always a failure

    def to_json(self) -> dict:
        def num(x: float | None) -> float | None:  # strict JSON: no NaN
            return None if x is None or not math.isfinite(x) else round(x, 7)

        return {"name": self.name, "kind": self.kind, "count": self.count,
                "cosine_min": num(self.cosine_min), "cosine_mean": num(self.cosine_mean),
                "argmax_agreement": num(self.argmax_agreement),
                "topk_agreement": num(self.topk_agreement), "k": self.k,
                "token_cosine_min": num(self.token_cosine_min),
                "token_cosine_mean": num(self.token_cosine_mean),
                "nonfinite": self.nonfinite}

    def summary(self) -> str:
        parts = []
        if self.cosine_min is not None:
            what = "mean-pooled cosine" if self.token_cosine_min is not None else "cosine"
            parts.append(f"{what} min {self.cosine_min:.6f} mean {self.cosine_mean:.6f}")
        if self.token_cosine_min is not None:
            parts.append(f"per token min {self.token_cosine_min:.6f} mean "
                         f"{self.token_cosine_mean:.6f}")
        if self.argmax_agreement is not None:
            parts.append(f"argmax agreement {self.argmax_agreement:.2%}")
        if self.topk_agreement is not None:
            parts.append(f"top-{self.k} agreement {self.topk_agreement:.2%}")
        return f"{self.name}: {', '.join(parts) or 'nothing to measure'} ({self.count} " \
               f"{'tokens' if self.kind.startswith('token') else 'rows'})"


@dataclass(frozen=True)
class Fp8Gate:
    """The limits `--precision fp8` holds its model to (fractions in (0, 1])."""

    min_cosine: float = MIN_COSINE
    min_argmax: float = MIN_ARGMAX

    def failure(self, terms: list[UserTerms]) -> str:
        """The first limit a measured output misses, as one phrase ('' when all pass); a
        non-finite measure fails."""
        for t in terms:
            if t.nonfinite:
                return f"{t.name} has {t.nonfinite} NaN/Inf values"
            if t.cosine_min is not None and not t.cosine_min >= self.min_cosine:
                pooled = "mean-pooled " if t.token_cosine_min is not None else ""
                return (f"{t.name} min {pooled}cosine {t.cosine_min:.6f} < "
                        f"{self.min_cosine:.7g} (--fp8-min-cosine)")
            if t.argmax_agreement is not None and not t.argmax_agreement >= self.min_argmax:
                return (f"{t.name} argmax agreement {t.argmax_agreement:.2%} < "
                        f"{self.min_argmax:.2%} (--fp8-min-argmax)")
        return ""

    def margin(self, terms: list[UserTerms]) -> float:
        """How far the worst gated measure is above its limit (negative: below; -inf: NaN)."""
        gaps = [t.cosine_min - self.min_cosine for t in terms if t.cosine_min is not None]
        gaps += [t.argmax_agreement - self.min_argmax for t in terms
                 if t.argmax_agreement is not None]
        gaps = [g if math.isfinite(g) else -math.inf for g in gaps]
        if any(t.nonfinite for t in terms):
            gaps.append(-math.inf)
        return min(gaps, default=0.0)

    def to_json(self) -> dict:
        return {"min_cosine": self.min_cosine, "min_argmax": self.min_argmax}


def measure(want: dict[str, np.ndarray], got: dict[str, np.ndarray],
            mask: np.ndarray | None) -> list[UserTerms]:
    """Each output of `want` (fp32) against `got` (FP8), in user terms. `mask` [B, S]: the
    valid tokens of per-token outputs; an output with "logits" in its name holds class
    scores."""
    out = []
    for name, ref in want.items():
        if name not in got:
            continue
        a, b = np.asarray(ref, np.float64), np.asarray(got[name], np.float64)
        if a.shape != b.shape or a.ndim == 0:
            continue
        terms = _one(name, a, b, mask, "logits" in name.lower())
        terms.nonfinite = int(np.size(b) - np.count_nonzero(np.isfinite(b)))
        out.append(terms)
    return out


def _one(name: str, a: np.ndarray, b: np.ndarray, mask: np.ndarray | None,
         is_logits: bool) -> UserTerms:
    if a.ndim == 1 or (a.ndim == 2 and a.shape[1] == 1):
        scores_a, scores_b = a.reshape(len(a)), b.reshape(len(b))
        k = _k(len(scores_a))
        return UserTerms(name, "scores", len(scores_a), k=k,
                         topk_agreement=_topk(scores_a[None], scores_b[None], k))
    token = a.ndim == 3
    keep = None
    if token:  # [B, S, H]: the valid tokens' vectors
        keep = np.ones(a.shape[:2], bool) if mask is None or mask.shape != a.shape[:2] \
            else np.asarray(mask) != 0
        rows_a, rows_b = a[keep], b[keep]
    else:
        rows_a, rows_b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    kind = ("token " if token else "") + ("logits" if is_logits else "vectors")
    terms = UserTerms(name, kind, len(rows_a))
    if len(rows_a) == 0:
        return terms
    if is_logits:
        agree = (rows_a.argmax(-1) == rows_b.argmax(-1)) & np.isfinite(rows_b).all(-1)
        terms.argmax_agreement = float(np.mean(agree))
    elif token:
        cos = _row_cosine(rows_a, rows_b)
        terms.token_cosine_min, terms.token_cosine_mean = float(cos.min()), float(cos.mean())
        cos = _row_cosine(_mean_pooled(a, keep), _mean_pooled(b, keep))
        terms.cosine_min, terms.cosine_mean = float(cos.min()), float(cos.mean())
    else:
        cos = _row_cosine(rows_a, rows_b)
        terms.cosine_min, terms.cosine_mean = float(cos.min()), float(cos.mean())
    if not is_logits and len(a) > 1:  # the batch as candidates: each row's nearest rows
        ra, rb = (_mean_pooled(a, keep), _mean_pooled(b, keep)) if token else (rows_a, rows_b)
        terms.k = _k(len(ra))
        terms.topk_agreement = _topk(_similarity(ra), _similarity(rb), terms.k)
    return terms


def _mean_pooled(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """[B, H]: each row's mean over its valid tokens (zeros for a row with none)."""
    weight = keep.astype(np.float64)[..., None]
    count = np.maximum(weight.sum(axis=1), 1.0)
    return (x * weight).sum(axis=1) / count


def _row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    both_zero = (na == 0) & (nb == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.einsum("ij,ij->i", a, b) / (na * nb)
    cos = np.where(both_zero, 1.0, np.where((na == 0) | (nb == 0), 0.0, cos))
    return np.clip(cos, -1.0, 1.0)


def _similarity(rows: np.ndarray) -> np.ndarray:
    """Cosine of each row to every other row; a row is never its own candidate."""
    norm = np.linalg.norm(rows, axis=-1, keepdims=True)
    unit = np.divide(rows, norm, out=np.zeros_like(rows), where=norm > 0)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    return sim


def _k(candidates: int) -> int:
    return max(1, min(TOP_K, candidates - 1))


def _topk(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """Mean over the rows (queries) of |top-k of a ∩ top-k of b| / k (ties: stable order)."""
    if a.shape[-1] < 1:
        return float("nan")
    ta = np.argsort(-a, axis=-1, kind="stable")[:, :k]
    tb = np.argsort(-b, axis=-1, kind="stable")[:, :k]
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(ta, tb)]))


def check_fp8_gemms(name: str, value: object) -> str:
    """--fp8-gemms: all, auto, or a comma list of PLACES (each once), as given."""
    places = value.split(",") if isinstance(value, str) else None
    if value in ("all", "auto") or (places and all(p in PLACES for p in places)
                                     and len(set(places)) == len(places)):
        return value
    raise BertfuseError(f"{name} must be all, auto or some of {','.join(PLACES)} "
                        f"(comma-separated), not {value!r}")


def check_fp8_options(fp8: bool, gemms: str, min_cosine: float, min_argmax: float) -> None:
    """The FP8 options as the CLI passes them (the API's are checked one by one first)."""
    check_fraction("--fp8-min-cosine", min_cosine)
    check_fraction("--fp8-min-argmax", min_argmax)
    check_fp8_gemms("--fp8-gemms", gemms)
    if gemms != "all" and not fp8:
        raise BertfuseError("--fp8-gemms needs FP8 weights (--precision fp8)")
