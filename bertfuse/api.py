"""The public Python API: `bertfuse.convert` and `bertfuse.optimize` (docs/python-api.md).

The CLI's guarantees hold here too: arguments are checked before any slow work (a
BertfuseError naming the bad one), nothing is written unless the gate passed, and an
output is never one of the inputs. Both return the model and the run report; the model is
written to `output` only when one is given. Every keyword below is an option of
pipeline/options.py's table: its default, choices, check and help come from there.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, NamedTuple, Sequence

import onnx

from bertfuse.checks import check_path
from bertfuse.errors import BertfuseError
from bertfuse.pipeline.options import GROUPS, OPTIMIZE_OPTIONS, OPTIONS, ConvertOptions
from bertfuse.pipeline.renamed import api_value
from bertfuse.pipeline.report import RunReport
from bertfuse.pipeline.stages import convert_model, optimize_model
from bertfuse.io.quiet import let_through, native_logs_silenced

Progress = Callable[[str], None]
_D = ConvertOptions()  # the table's defaults, as the keywords' defaults
_CONVERT_OPTIONS = tuple(name for names in GROUPS.values() for name in names)


class Result(NamedTuple):
    """What convert/optimize return: `model, report = bertfuse.convert(...)`."""

    model: onnx.ModelProto
    report: RunReport


def convert(source: str | os.PathLike, output: str | os.PathLike | None = None, *,
            inputs: Mapping[str, str] | None = _D.inputs,
            outputs: Sequence[str] | None = _D.outputs, format: str = _D.kind,
            signature: str = _D.signature, config: str | os.PathLike | None = _D.config,
            trust_model: bool = _D.trust_model, opset: int = _D.opset,
            precision: str = _D.precision,
            atol: float | None = _D.atol, rtol: float | None = _D.rtol,
            seed: int | None = _D.seed, batch: int = _D.batch, seq: int = _D.seq,
            verify: bool = _D.verify, force: bool = _D.force, strict: bool = _D.strict,
            fp8_min_cosine: float = _D.fp8_min_cosine, fp8_min_argmax: float = _D.fp8_min_argmax,
            fuse: bool = _D.fuse, packed: bool = _D.packed, ops: str = _D.ops,
            fp8: bool = _D.fp8, fp8_gemms: str = _D.fp8_gemms,
            gelu_approximation: bool = _D.gelu_approximation,
            load_inputs: str | os.PathLike | None = _D.load_inputs,
            text_file: str | os.PathLike | None = _D.text_file,
            vocab: str | os.PathLike | None = _D.vocab,
            save_inputs: str | os.PathLike | None = _D.save_inputs,
            save_outputs: str | os.PathLike | None = _D.save_outputs,
            load_outputs: str | os.PathLike | None = _D.load_outputs,
            external_data: bool = _D.external_data,
            progress: Progress | None = None, native_logs: bool = False,
            kernels: str | None = None) -> Result:
    """TF BERT -> fused ONNX, verified against TensorFlow (`bertfuse convert`).

    source: checkpoint directory or prefix, SavedModel directory, frozen .pb/.pbtxt, .keras.
    output: where to write the model; None returns it without writing.
    progress: called with each stage's name.
    native_logs: let TensorFlow's and ONNX Runtime's own C++ log lines reach stderr (the
    CLI's --debug); by default they are silenced during the call, as the CLI does.
    kernels: ops's old name (deprecated: a DeprecationWarning; accepted until the next release).
{options}
    Raises BertfuseError for bad input, ParityError (with `.report`) when the model drifts
    from TensorFlow, FusionIncomplete (strict), MissingDependency without
    TensorFlow/tf2onnx (its message has the pip line).
    """
    src = check_path("source", source)
    out = check_path("output", output, optional=True)
    ops = api_value("convert", "ops", ops, kernels, _D.ops)
    opts = ConvertOptions.from_keywords(_CONVERT_OPTIONS, locals())
    with _quiet(native_logs) as passthrough:
        return Result(*convert_model(src, out, opts, passthrough(_progress(progress))))


def optimize(model: str | os.PathLike | onnx.ModelProto,
             output: str | os.PathLike | None = None, *,
             inputs: Mapping[str, str] | None = _D.inputs, precision: str = _D.precision,
             strict: bool = _D.strict, packed: bool = _D.packed, ops: str = _D.ops,
             fp8: bool = _D.fp8, fp8_gemms: str = _D.fp8_gemms,
             gelu_approximation: bool = _D.gelu_approximation,
             batch: int = _D.batch, seq: int = _D.seq, seed: int | None = _D.seed,
             atol: float | None = _D.atol, rtol: float | None = _D.rtol,
             verify: bool = _D.verify, force: bool = _D.force,
             fp8_min_cosine: float = _D.fp8_min_cosine,
             fp8_min_argmax: float = _D.fp8_min_argmax,
             external_data: bool = _D.external_data,
             progress: Progress | None = None, native_logs: bool = False,
             kernels: str | None = None) -> Result:
    """The fusion passes on an ONNX model you exported with tf2onnx (`bertfuse optimize`).

    model: a path or an onnx.ModelProto (left unchanged). output: None returns the model
    without writing it. inputs: rename the model's inputs to input_ids / input_mask /
    segment_ids (int32), as bertfuse.Session takes them: {{role: the export's input name}};
    inputs left out are recognised by name ({{}} recognises all). None keeps the export's
    names. The fused model is compared with the model as given, both in ONNX Runtime on
    the CPU, on random padded inputs (verify=False skips it): past the limits, ParityError
    (with `.report`), unless force. With ops="bertfuse" the result is also checked equal
    to the contrib form with NumPy references; fp8 is measured against the model as given.
    native_logs, kernels: as for convert.
{options}
    """
    if not isinstance(model, onnx.ModelProto):
        model = check_path("model", model)
    ops = api_value("optimize", "ops", ops, kernels, _D.ops)
    opts = ConvertOptions.from_keywords(OPTIMIZE_OPTIONS, locals())
    out = check_path("output", output, optional=True)
    with _quiet(native_logs) as passthrough:
        return Result(*optimize_model(model, out, passthrough(_progress(progress)), opts))


@contextmanager
def _quiet(native_logs: bool) -> Iterator[Callable]:
    """TF's and ORT's C++ log lines off during the call (io/quiet.py) unless native_logs;
    yields the wrapper that lets a caller's progress callback print."""
    if not isinstance(native_logs, bool):
        raise BertfuseError(f"native_logs must be True or False, not {native_logs!r}")
    with native_logs_silenced(not native_logs):
        yield let_through


def _progress(value) -> Progress | None:
    if value is not None and not callable(value):
        raise BertfuseError(f"progress must be a callable taking a stage name, not {value!r}")
    return value


def _document(names: Sequence[str]) -> str:
    """The keywords' lines of a docstring, from the option table."""
    lines = []
    for name in names:
        o = OPTIONS[name]
        choices = f", one of {', '.join(map(repr, o.choices))}" if o.choices else ""
        lines.append(f"    {o.keyword} (default {o.default!r}{choices}): {o.help}")
    return "\n".join(lines) + "\n"


convert.__doc__ = convert.__doc__.format(options=_document(_CONVERT_OPTIONS))
optimize.__doc__ = optimize.__doc__.format(options=_document(OPTIMIZE_OPTIONS[1:]))
