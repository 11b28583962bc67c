"""Parity: the ONNX model against the TF model on the same fresh random inputs with padding."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from bertfuse.io.inputs import random_inputs
from bertfuse.errors import BertfuseError
from bertfuse.pipeline.mask import mask_rows, perturbed_feeds

TOLERANCES = {"fp32": {"max": 1e-4, "mean": 1e-4}, "fp16": {"max": 4e-2, "mean": 2e-3}}


@dataclass(frozen=True)
class Tolerance:
    """Element-wise |ONNX - TF| <= atol + rtol * |TF|, and mean |diff| <= mean (when set)."""

    atol: float
    rtol: float = 0.0
    mean: float | None = None

    def to_json(self) -> dict:
        return {"max": self.atol, "rtol": self.rtol, "mean": self.mean}


def check_tolerance(flag: str, value: float) -> float:
    """Tolerances must be finite and non-negative: a NaN one would pass everything."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise BertfuseError(f"{flag} must be a number, got {value!r}") from None
    if not math.isfinite(value) or value < 0:
        raise BertfuseError(f"{flag} must be a finite number >= 0, got {value:g}")
    return value


def tolerance_for(precision: str, atol: float | None = None, rtol: float | None = None
                  ) -> Tolerance:
    """The table's max and mean limits; an explicit --atol/--rtol replaces both."""
    table = TOLERANCES[precision]
    if atol is None and not rtol:
        return Tolerance(table["max"], 0.0, table["mean"])
    atol = table["max"] if atol is None else check_tolerance("--atol", atol)
    return Tolerance(atol, check_tolerance("--rtol", rtol or 0.0))


@dataclass
class OutputParity:
    name: str
    max_abs: float
    mean_abs: float
    ok: bool
    nonfinite: int = 0  # NaN/Inf values on either side: always a failure
    note: str = ""

    def to_json(self) -> dict:
        def num(x: float) -> float | None:  # strict JSON has no NaN/Infinity
            return x if math.isfinite(x) else None

        return {"name": self.name, "max_abs": num(self.max_abs), "mean_abs": num(self.mean_abs),
                "ok": self.ok, "nonfinite": self.nonfinite, "note": self.note}


@dataclass
class ParityReport:
    precision: str
    batch: int
    seq: int
    outputs: list[OutputParity]
    tolerance: Tolerance | None = None
    seed: int | None = None  # the inputs' seed (None: a fresh draw)
    reference: str = ""  # which TensorFlow computed the reference, and where
    source_kind: str = ""

    def __post_init__(self) -> None:
        if self.tolerance is None:
            self.tolerance = tolerance_for(self.precision)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_json(self) -> dict:
        return {"precision": self.precision, "batch": self.batch, "seq": self.seq,
                "seed": self.seed, "ok": self.ok, "tolerance": self.tolerance.to_json(),
                "reference": self.reference, "source_kind": self.source_kind,
                "outputs": [o.to_json() for o in self.outputs]}


def ort_session(model: onnx.ModelProto | str, device: str = "cpu", optimize: bool = True):
    from bertfuse.io.model import EXTERNAL_DATA_THRESHOLD, model_bytes, scratch_file
    from bertfuse.io.ort import make_session
    from bertfuse.kernels.library import uses_library

    # log 4: run errors come back as exceptions; don't also log them
    if isinstance(model, str) or model_bytes(model) <= EXTERNAL_DATA_THRESHOLD:
        return make_session(model, device=device, optimize=optimize, log_severity=4)
    # Past protobuf's 2 GB limit a model cannot be serialised in memory: go via a file.
    with scratch_file(model, prefix="bertfuse-verify-") as path:
        return make_session(path, device=device, optimize=optimize, log_severity=4,
                            register_kernels=uses_library(model))  # the proto, not a 2 GB scan


def run_onnx(session, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    outs = session.run(None, {n: feeds[n] for n in names})
    return {o.name: v for o, v in zip(session.get_outputs(), outs)}


def compare_output(name: str, ref: np.ndarray | None, cand: np.ndarray | None,
                   tol: Tolerance) -> OutputParity:
    """One output against TF; fails closed on a missing output, a shape change or NaN/Inf."""
    if cand is None or ref is None:
        return OutputParity(name, math.inf, math.inf, False,
                            note="missing from the " + ("ONNX model" if cand is None else "TF run"))
    r, c = np.asarray(ref, np.float64), np.asarray(cand, np.float64)
    if r.shape != c.shape:  # e.g. another hidden size: not this source (bad input)
        raise BertfuseError(f"output {name}: TensorFlow gives shape {list(r.shape)}, the "
                            f"ONNX model {list(c.shape)}; is the model converted from this "
                            f"source?")
    nonfinite = int(r.size - np.count_nonzero(np.isfinite(r) & np.isfinite(c)))
    if nonfinite:
        return OutputParity(name, math.nan, math.nan, False, nonfinite,
                            f"{nonfinite} NaN/Inf value(s)")
    diff = np.abs(r - c)
    mx = float(diff.max()) if diff.size else 0.0
    mean = float(diff.mean()) if diff.size else 0.0
    ok = bool(np.all(diff <= tol.atol + tol.rtol * np.abs(r))) and \
        (tol.mean is None or mean <= tol.mean)
    return OutputParity(name, mx, mean, ok)


def compare(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
            tolerance: Tolerance) -> list[OutputParity]:
    return [compare_output(name, ref, candidate.get(name), tolerance)
            for name, ref in reference.items()]


def verify_against_tf(model: onnx.ModelProto | str, source, precision: str, batch: int,
                      seq: int, seed: int | None, pad_anywhere: bool = True, atol: float | None = None,
                      rtol: float | None = None) -> ParityReport:
    """Runs TF and ORT (CPU) on the same inputs; padding at the end, middle and start of rows.
    Also on the same inputs with padded ids, then padded segment ids, changed (mask checks)."""
    tol = tolerance_for(precision, atol, rtol)
    seq = min(seq, source.max_positions or seq)
    if source.fixed_seq:
        seq = source.fixed_seq
    feeds = random_inputs(batch, seq, source.vocab_size or 100, source.type_vocab_size,
                          seed=seed, pad_anywhere=pad_anywhere)
    sets = {"base": feeds}
    if "input_mask" in source.inputs and source.outputs:
        sets.update(perturbed_feeds(feeds, source, seed))
    names = list(sets)
    references = dict(zip(names, source.run_many([sets[n] for n in names])))
    session = ort_session(model)
    # Inputs the model ignores (a canonical segment_ids the source lacks) are fed too.
    candidates = {n: run_onnx(session, sets[n]) for n in names}
    results = compare(references["base"], candidates["base"], tol)
    if len(names) > 1:
        results += [OutputParity(*row) for row in
                    mask_rows(feeds["input_mask"], references, candidates, tol)]
    return ParityReport(precision, batch, seq, results, tol, seed, source.backend, source.kind)
