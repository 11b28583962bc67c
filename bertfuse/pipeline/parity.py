"""Parity: the ONNX model against the TF model on the same fresh random inputs with padding."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx

from bertfuse.io.inputs import random_inputs
from bertfuse.errors import BertfuseError, ParityError
from bertfuse.ops.contract import TOLERANCES
from bertfuse.pipeline.mask import mask_rows, perturbed_feeds
from bertfuse.converter.roles import assign_roles
from bertfuse.converter.source import ROLES
from bertfuse.io.model import EXTERNAL_DATA_THRESHOLD, model_bytes, scratch_file
from bertfuse.io.ort import make_session
from bertfuse.kernels.model_ops import uses_library
from bertfuse.runtime.request_checks import model_facts

if TYPE_CHECKING:
    from bertfuse.pipeline.data import ParityData

CHOICES = 2  # a multiple-choice model's random inputs: [batch, 2 choices, seq]


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
    inputs: str = ""  # the user's inputs (data.py), "" for the random padded ones
    device: str = "cpu"  # where ONNX Runtime ran the model under test
    kernels: dict | None = None  # verify: its KernelChoice (runtime/kernel_choice.py), as JSON
    # the compared inputs by role (not in the JSON): what --fp8 calibrates and measures on
    feeds: dict | None = field(default=None, repr=False, compare=False)

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
                "inputs": self.inputs or "random", "device": self.device,
                "kernels": self.kernels, "outputs": [o.to_json() for o in self.outputs]}


class OrtRunError(ParityError):
    """The model loads in ONNX Runtime but fails to run on the verification inputs: at
    convert's gate a failed conversion (exit 1); verify says the pairing is wrong instead."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail  # ONNX Runtime's own first line, without its source location


def ort_session(model: onnx.ModelProto | str, device: str = "cpu", optimize: bool = True):
    # CUDA: TF32 off, so that an fp32 model is held to fp32's limits against TensorFlow
    cuda = {"use_tf32": "0"} if device == "cuda" else None
    # log 4: run errors come back as exceptions; don't also log them
    if isinstance(model, str) or model_bytes(model) <= EXTERNAL_DATA_THRESHOLD:
        return make_session(model, device=device, optimize=optimize, log_severity=4,
                            cuda_options=cuda)
    # Past protobuf's 2 GB limit a model cannot be serialised in memory: go via a file.
    with scratch_file(model, prefix="bertfuse-verify-") as path:
        return make_session(path, device=device, optimize=optimize, log_severity=4,
                            cuda_options=cuda,
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
                      rtol: float | None = None, data: ParityData | None = None,
                      model_path: str | None = None, device: str = "cpu") -> ParityReport:
    """Runs TF and ORT (on `device`) on the same inputs; padding at the end, middle and start
    of rows.
    Also on the same inputs with padded ids, then padded segment ids, changed (mask checks).
    `data` (data.py): the user's inputs instead of random ones, their saved outputs instead
    of TF's as the reference of the plain comparison, and what to save."""
    tol = tolerance_for(precision, atol, rtol)
    if data is not None and data.has_inputs:
        feeds = data.feeds(source.original_names, source.max_positions, model_path)
        check_rank(feeds, source.input_rank, "the source")
        check_feeds(feeds, source.vocab_size, source.type_vocab_size, source.max_positions,
                    source.fixed_seq)
        batch, seq = feeds["input_ids"].shape[0], feeds["input_ids"].shape[-1]
        seed, inputs = None, data.describe_inputs(batch, seq)
    else:
        seq = min(seq, source.max_positions or seq)
        if source.fixed_seq:
            seq = source.fixed_seq
        rows = batch * (CHOICES if source.input_rank == 3 else 1)
        feeds = random_inputs(rows, seq, source.vocab_size or 100, source.type_vocab_size,
                              seed=seed, pad_anywhere=pad_anywhere)
        if source.input_rank == 3:  # multiple choice: [batch, choices, seq]
            feeds = {k: v.reshape(batch, CHOICES, seq) for k, v in feeds.items()}
        inputs = ""
    sets = {"base": feeds}
    if "input_mask" in source.inputs and source.outputs:
        sets.update(perturbed_feeds(feeds, source, seed))
    names = list(sets)
    references = dict(zip(names, source.run_many([sets[n] for n in names])))
    session = ort_session(model, device)
    # Inputs the model ignores (a canonical segment_ids the source lacks) are fed too.
    try:
        candidates = {n: run_onnx(session, sets[n]) for n in names}
    except Exception as exc:  # loads but cannot run (a wrong Reshape): a failed conversion
        if not type(exc).__module__.startswith("onnxruntime"):
            raise
        msg = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : |\S*onnxruntime_src\S* \S+\(.*?\) ",
                     "", str(exc).splitlines()[0] if str(exc) else "")
        raise OrtRunError(f"the ONNX model fails in ONNX Runtime on the verification inputs: "
                          f"{msg[:400]}", msg[:200]) from None
    expected, backend = references["base"], source.backend
    if data is not None and data.load_outputs:  # TF still runs for the mask checks
        known = {shown: canon for canon, shown in source.original_names.items()}
        known.update({t: c for c, t in source.outputs.items()})
        expected = data.expected(known, list(candidates["base"]))
        backend = f"saved outputs ({data.load_outputs})"
    results = compare(expected, candidates["base"], tol)
    if len(names) > 1:
        results += [OutputParity(*row) for row in
                    mask_rows(feeds["input_mask"], references, candidates, tol)]
    if data is not None:
        data.save(feeds, expected, candidates["base"])
    report = ParityReport(precision, batch, seq, results, tol, seed, backend, source.kind,
                          inputs, device)
    report.feeds = feeds
    return report


def verify_against_saved(model: onnx.ModelProto, data: ParityData, precision: str,
                         atol: float | None = None, rtol: float | None = None,
                         model_path: str | None = None, device: str = "cpu") -> ParityReport:
    """The model against outputs saved earlier (--load-outputs), on the inputs they came
    from, with no TensorFlow: e.g. on a serving host, against outputs saved where TF is."""
    tol = tolerance_for(precision, atol, rtol)
    meta = {p.key: p.value for p in model.metadata_props}
    try:
        shown = json.loads(meta.get("original_names", "{}"))
    except ValueError:
        shown = {}
    shown = shown if isinstance(shown, dict) else {}
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    roles = {n: n for n in names} if all(n in ROLES for n in names) else assign_roles(names)
    feeds = data.feeds(shown, None, model_path)  # by role, or as the source named them
    ids = next((i for i in model.graph.input if i.name == roles.get("input_ids")), None)
    if ids is not None and ids.type.tensor_type.HasField("shape"):
        check_rank(feeds, len(ids.type.tensor_type.shape.dim), "the model")
    check_feeds(feeds, *_table_rows(model))
    session = ort_session(model, device)
    types = {i.name: i.type for i in session.get_inputs()}
    by_name = {name: feeds[role].astype(np.int64 if types.get(name) == "tensor(int64)"
                                        else np.int32) for role, name in roles.items()}
    outs = run_onnx(session, by_name)
    expected = data.expected({v: k for k, v in shown.items()}, list(outs))
    data.save(feeds, expected, outs)
    batch, seq = feeds["input_ids"].shape[0], feeds["input_ids"].shape[-1]
    return ParityReport(precision, batch, seq, compare(expected, outs, tol), tol, None,
                        f"saved outputs ({data.load_outputs})", "", data.describe_inputs(batch, seq),
                        device)


def _table_rows(model: onnx.ModelProto) -> tuple[int | None, int, int | None, None]:
    """(vocab, type vocab, positions) from the embedding tables, where the model has them."""
    facts = model_facts(model)
    return facts.vocab_size, facts.type_vocab_size or 0, facts.max_positions, None


def check_rank(feeds: dict[str, np.ndarray], rank: int, what: str) -> None:
    """[batch, seq] inputs for a [batch, choices, seq] model, or the other way: bad input."""
    got = feeds["input_ids"].ndim
    if got != rank:
        shapes = {2: "[batch, seq]", 3: "[batch, choices, seq]"}
        raise BertfuseError(f"the inputs are {shapes.get(got, f'rank {got}')}; {what} takes "
                            f"{shapes.get(rank, f'rank {rank}')}: give inputs of that shape")


def check_feeds(feeds: dict[str, np.ndarray], vocab: int | None, type_vocab: int,
                positions: int | None, fixed_seq: int | None) -> None:
    """The user's inputs against the model's tables: bad input (exit 2), not a drift."""
    seq = feeds["input_ids"].shape[-1]
    if fixed_seq and seq != fixed_seq:
        raise BertfuseError(f"the inputs have {seq} tokens a row; the source takes exactly "
                            f"{fixed_seq}")
    if positions and seq > positions:
        raise BertfuseError(f"the inputs have {seq} tokens a row; the model has {positions} "
                            f"positions")
    for role, top in (("input_ids", vocab), ("segment_ids", type_vocab)):
        a = feeds[role]
        if top and (a.min() < 0 or a.max() >= top):
            raise BertfuseError(f"{role} holds {int(a.max() if a.max() >= top else a.min())}, "
                                f"outside the model's table [0, {top})")
