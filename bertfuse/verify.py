"""Parity: the ONNX model against the TF model on the same fresh random inputs with padding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from bertfuse import modelio
from bertfuse.converter.export import random_inputs

TOLERANCES = {"fp32": {"max": 1e-4, "mean": 1e-4}, "fp16": {"max": 4e-2, "mean": 2e-3}}


@dataclass
class OutputParity:
    name: str
    max_abs: float
    mean_abs: float
    ok: bool


@dataclass
class ParityReport:
    precision: str
    batch: int
    seq: int
    outputs: list[OutputParity]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_json(self) -> dict:
        return {"precision": self.precision, "batch": self.batch, "seq": self.seq,
                "ok": self.ok, "tolerance": TOLERANCES[self.precision],
                "outputs": [o.__dict__ for o in self.outputs]}


def ort_session(model: onnx.ModelProto | str, providers: list[str] | None = None,
                optimize: bool = True):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # run errors come back as exceptions; don't also log them
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    providers = providers or ["CPUExecutionProvider"]
    if not isinstance(model, str) and modelio.model_bytes(model) > modelio.EXTERNAL_DATA_THRESHOLD:
        # Past protobuf's 2 GB limit a model cannot be serialised in memory: go via a file.
        import tempfile

        from onnx.external_data_helper import load_external_data_for_model

        with tempfile.TemporaryDirectory(prefix="bertfuse-verify-") as tmp:
            path = f"{tmp}/model.onnx"
            modelio._save(model, Path(path))
            try:
                return ort.InferenceSession(path, opts, providers=providers)
            finally:
                load_external_data_for_model(model, tmp)
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=providers)


def run_onnx(session, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    outs = session.run(None, {n: feeds[n] for n in names})
    return {o.name: v for o, v in zip(session.get_outputs(), outs)}


def compare(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
            precision: str = "fp32") -> list[OutputParity]:
    tol = TOLERANCES[precision]
    result = []
    for name, ref in reference.items():
        if name not in candidate:
            result.append(OutputParity(name, float("inf"), float("inf"), False))
            continue
        if ref.shape != candidate[name].shape:  # e.g. another hidden size: not this source
            from bertfuse.errors import BertfuseError

            raise BertfuseError(f"output {name}: TensorFlow gives shape {list(ref.shape)}, the "
                                f"ONNX model {list(candidate[name].shape)}; is the model "
                                f"converted from this source?")
        diff = np.abs(ref.astype(np.float64) - candidate[name].astype(np.float64))
        mx, mean = float(diff.max()), float(diff.mean())
        ok = bool(np.isfinite(mx)) and mx <= tol["max"] and mean <= tol["mean"]
        result.append(OutputParity(name, mx, mean, ok))
    return result


def verify_against_tf(model: onnx.ModelProto | str, source, precision: str = "fp32",
                      batch: int = 4, seq: int = 32, seed: int | None = None,
                      pad_anywhere: bool = True) -> ParityReport:
    """Runs TF and ORT (CPU) on the same inputs; padding at the end, middle and start of rows."""
    seq = min(seq, source.max_positions or seq)
    if source.fixed_seq:
        seq = source.fixed_seq
    feeds = random_inputs(batch, seq, source.vocab_size or 100, source.type_vocab_size,
                          seed=seed, pad_anywhere=pad_anywhere)
    reference = source.run(feeds)
    session = ort_session(model)
    candidate = run_onnx(session, feeds)  # inputs the model ignores are fed too
    results = compare(reference, candidate, precision)
    if "input_mask" in source.inputs and "sequence_output" in candidate:
        results.append(mask_invariance(session, feeds, candidate, precision, seed))
    return ParityReport(precision, batch, seq, results)


def mask_invariance(session, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
                    precision: str, seed: int | None) -> OutputParity:
    """Padded tokens must not change the outputs at kept positions. Parity against TF cannot
    see a wrong --inputs mapping (both sides get the same wrong wiring); this can: with mask
    and segment ids swapped, changing padded ids changes everything."""
    rng = np.random.default_rng(None if seed is None else seed + 1)
    mask = feeds["input_mask"].astype(bool)
    changed = dict(feeds)
    ids = feeds["input_ids"].copy()
    ids[~mask] = rng.integers(1, max(int(ids.max()) + 1, 2), size=int((~mask).sum()))
    changed["input_ids"] = ids
    names = [i.name for i in session.get_inputs()]
    again = run_onnx(session, {k: v for k, v in changed.items() if k in names})
    diff = np.abs(outputs["sequence_output"].astype(np.float64) -
                  again["sequence_output"].astype(np.float64))[mask]
    mx = float(diff.max()) if diff.size else 0.0
    mean = float(diff.mean()) if diff.size else 0.0
    return OutputParity("mask invariance (padded ids changed)", mx, mean,
                        mx <= TOLERANCES[precision]["max"])
