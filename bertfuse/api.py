"""The public Python API: `bertfuse.convert` and `bertfuse.optimize` (README, "Python API").

The CLI's guarantees hold here too: arguments are checked before any slow work (a
BertfuseError naming the bad one), nothing is written unless the gate passed, and an
output is never one of the inputs. Both return the model and the run report; the model is
written to `output` only when one is given.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Mapping, NamedTuple, Sequence

import onnx

from bertfuse.errors import BertfuseError
from bertfuse.pipeline.lowering import KERNELS
from bertfuse.pipeline.stages import (PRECISIONS, ConvertOptions, RunReport, check_precision,
                               convert_model, optimize_model)

Progress = Callable[[str], None]


class Result(NamedTuple):
    """What convert/optimize return: `model, report = bertfuse.convert(...)`."""

    model: onnx.ModelProto
    report: RunReport


def convert(source: str | os.PathLike, output: str | os.PathLike | None = None, *,
            inputs: Mapping[str, str] | None = None, outputs: Sequence[str] | None = None,
            format: str = "auto", signature: str = "serving_default",
            config: str | os.PathLike | None = None, opset: int = 17,
            precision: str = "fp32", atol: float | None = None, rtol: float | None = None,
            seed: int | None = 0, batch: int = 4, seq: int = 32, verify: bool = True,
            force: bool = False, strict: bool = False, fuse: bool = True,
            packed: bool = False, kernels: str = "ort", fp8: bool = False,
            progress: Progress | None = None) -> Result:
    """TF BERT -> fused ONNX, verified against TensorFlow (`bertfuse convert`).

    source: checkpoint directory or prefix, SavedModel directory, frozen .pb/.pbtxt, .keras.
    output: where to write the model; None returns it without writing.
    inputs: {role: source input name} for names bertfuse does not recognise; roles are
        input_ids, input_mask, segment_ids.
    precision: "fp32" or "fp16". atol/rtol: parity limits (None: the defaults, README).
    seed: the verification inputs' seed (None: a fresh draw). batch, seq: their shape.
    verify=False skips the comparison; force=True returns (and writes) a model that
    drifted; strict=True refuses one with a layer left unfused (FusionIncomplete).
    kernels: "ort" (ONNX Runtime's contrib ops) or "bertfuse" (bertfuse's own CUDA ops,
        fp16 only; the contrib form is verified, the bertfuse form checked equal to it).
    fp8: with kernels="bertfuse", FP8 (e4m3) weights for the encoder GEMMs, scales calibrated
        on the verification inputs; accuracy vs fp32 is reported in the parity rows.
    progress: called with each stage's name.

    Raises BertfuseError for bad input, ParityError (with `.report`) when the model drifts
    from TensorFlow, MissingDependency without TensorFlow/tf2onnx (pip install
    'bertfuse[tf]').
    """
    from bertfuse.converter import KINDS

    src = _path("source", source)
    out = _path("output", output, optional=True)
    opts = ConvertOptions(
        opset=_int("opset", opset, 1), signature=_text("signature", signature),
        kind=_choice("format", format, KINDS), inputs=_roles(inputs),
        outputs=_names("outputs", outputs), config=_path("config", config, optional=True),
        verify=_flag("verify", verify), force=_flag("force", force),
        precision=_precision(precision), seed=_seed(seed), atol=_tolerance("atol", atol),
        rtol=_tolerance("rtol", rtol), batch=_int("batch", batch, 1), seq=_int("seq", seq, 2),
        strict=_flag("strict", strict), fuse=_flag("fuse", fuse),
        packed=_flag("packed", packed), kernels=_choice("kernels", kernels, KERNELS),
        fp8=_flag("fp8", fp8))
    return Result(*convert_model(src, out, opts, _progress(progress)))


def optimize(model: str | os.PathLike | onnx.ModelProto,
             output: str | os.PathLike | None = None, *,
             inputs: Mapping[str, str] | None = None, precision: str = "fp32",
             strict: bool = False, packed: bool = False, kernels: str = "ort",
             fp8: bool = False, progress: Progress | None = None) -> Result:
    """The fusion passes on an ONNX model you exported with tf2onnx (`bertfuse optimize`).

    model: a path or an onnx.ModelProto (left unchanged). output: None returns the model
    without writing it.
    inputs: rename the model's inputs to input_ids / input_mask / segment_ids (int32), as
        bertfuse.Session takes them: {role: the export's input name}; inputs left out are
        recognised by name ({} recognises all). None keeps the export's names.
    kernels: "ort" or "bertfuse" (fp16 only; the result is checked equal to the contrib
        form with NumPy references before it is returned); fp8: FP8 weights as in convert,
        measured against the model as given (fp32).
    """
    if not isinstance(model, onnx.ModelProto):
        model = _path("model", model)
    return Result(*optimize_model(
        model, _path("output", output, optional=True), _progress(progress),
        _flag("strict", strict), _precision(precision), _flag("packed", packed),
        inputs=_roles(inputs), kernels=_choice("kernels", kernels, KERNELS),
        fp8=_flag("fp8", fp8)))


# -- argument checks: each names the argument and what it takes ----------------------------


def _path(name: str, value, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, (str, os.PathLike)) and os.fspath(value):
        return str(os.fspath(value))
    raise BertfuseError(f"{name} must be a path (str or os.PathLike), not {value!r}")


def _text(name: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise BertfuseError(f"{name} must be a non-empty string, not {value!r}")
    return value


def _choice(name: str, value, choices: Sequence[str]) -> str:
    if value not in choices:
        raise BertfuseError(f"{name} {value!r} is not one of {', '.join(choices)}")
    return value


def _precision(value) -> str:
    if not isinstance(value, str):
        raise BertfuseError(f"precision must be {' or '.join(PRECISIONS)}, not {value!r}")
    check_precision(value)
    return value


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise BertfuseError(f"{name} must be True or False, not {value!r}")
    return value


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BertfuseError(f"{name} must be an integer >= {low}, not {value!r}")
    return value


def _seed(value) -> int | None:
    return None if value is None else _int("seed", value, 0)


def _tolerance(name: str, value) -> float | None:
    """A finite number >= 0: a NaN limit would let every NaN output pass."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        raise BertfuseError(f"{name} must be a finite number >= 0, not {value!r}")
    return float(value)


def _names(name: str, value) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
        raise BertfuseError(f"{name} must be a list of names, not {value!r}")
    return list(value)


def _roles(value) -> dict[str, str] | None:
    """{role: name}, checked by the same rule as --inputs (unknown roles refused)."""
    from bertfuse.converter.roles import parse_override

    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BertfuseError(f"inputs must be a dict of role -> input name, e.g. "
                            f"{{'input_ids': 'ids', 'input_mask': 'mask'}}, not {value!r}")
    return parse_override(dict(value))


def _progress(value) -> Progress | None:
    if value is not None and not callable(value):
        raise BertfuseError(f"progress must be a callable taking a stage name, not {value!r}")
    return value
