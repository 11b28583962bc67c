"""The pipeline's arguments: ConvertOptions, and the checks that refuse bad ones before any
slow work (the TF load, the passes), each as one BertfuseError naming the bad argument."""

from __future__ import annotations

from dataclasses import dataclass

from bertfuse.errors import BertfuseError
from bertfuse.pipeline.parity import DEFAULT_SEED, check_seed, tolerance_for


@dataclass
class ConvertOptions:
    opset: int = 17
    signature: str = "serving_default"
    kind: str = "auto"
    inputs: str | dict[str, str] | None = None  # ROLE=NAME,... or {role: name}
    outputs: list[str] | None = None
    config: str | None = None
    verify: bool = True
    force: bool = False
    precision: str = "fp32"
    seed: int | None = DEFAULT_SEED  # None: a fresh random draw
    atol: float | None = None  # None: the fp32/fp16 table in verify.py
    rtol: float | None = None  # None: 0
    batch: int = 4
    seq: int = 32
    strict: bool = False
    fuse: bool = True
    packed: bool = False
    kernels: str = "ort"  # ort | bertfuse (kernels_form.py)
    fp8: bool = False  # FP8 weights for the bertfuse dense ops (kernels_fp8.py)


PRECISIONS = ("fp32", "fp16")
MAX_VERIFY_TOKENS = 1 << 16  # random verification inputs past this only exhaust memory


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise BertfuseError(f"precision {precision!r} is not supported (choose "
                            f"{' or '.join(PRECISIONS)})")


def check_verify_size(batch: int, seq: int) -> None:
    tokens = batch * seq
    if tokens > MAX_VERIFY_TOKENS:
        raise BertfuseError(f"--batch {batch} x --seq {seq} is {tokens} tokens; the "
                            f"comparison takes at most {MAX_VERIFY_TOKENS}")


def check_inputs_text(inputs: str | dict[str, str] | None) -> None:
    """An empty --inputs is a mistake (the API's {} means "every input by name")."""
    if isinstance(inputs, str) and not inputs.strip():
        raise BertfuseError("--inputs: expected ROLE=NAME,... (roles: input_ids, input_mask, "
                            "segment_ids)")


def check_gate(opts: ConvertOptions) -> None:
    """Before the slow TF load: a NaN or negative tolerance or seed is bad input, and TF is
    asked to start with oneDNN's rewrites off (see converter/reference.py)."""
    from bertfuse.converter.reference import prefer_onednn_off

    check_precision(opts.precision)
    check_kernels(opts.kernels, opts.precision, opts.packed, opts.fp8)
    check_inputs_text(opts.inputs)
    check_seed(opts.seed)
    check_verify_size(opts.batch, opts.seq)
    tolerance_for(opts.precision, opts.atol, opts.rtol)
    if not opts.fuse:  # these act on the fused graph: without it they would silently do nothing
        asked = [flag for flag, on in (("--strict", opts.strict), ("--packed", opts.packed),
                                       ("--precision fp16", opts.precision != "fp32"),
                                       ("--kernels bertfuse", opts.kernels != "ort")) if on]
        if asked:
            raise BertfuseError(f"{asked[0]} needs the fusion passes; it cannot be combined "
                                f"with --no-fuse")
    if opts.verify:
        prefer_onednn_off()


def check_kernels(kernels: str, precision: str, packed: bool, fp8: bool = False) -> None:
    from bertfuse.pipeline.lowering import check_kernels as check

    check(kernels, precision, packed, fp8)
