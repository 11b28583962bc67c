"""The pipeline's options, each defined once: name, type, default, choices, check and help.

    OPTIONS (this table) --> ConvertOptions      the stages' arguments (stages.py)
                         --> cli/convert.py      argparse groups of convert / optimize / verify
                         --> api.py              bertfuse.convert/optimize keywords and docs
                         --> the JSON report     "options" (report.py)

Checks refuse bad values before any slow work (the TF load, the passes), each as one
BertfuseError naming the option. tests/unit/pipeline/test_options.py fails if a default or a
choice list below is written anywhere else in bertfuse/.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

from bertfuse.converter import KINDS
from bertfuse.checks import (check_choice, check_flag, check_fraction, check_int, check_names,
                             check_path, check_text, check_tolerance)
from bertfuse.errors import BertfuseError
from bertfuse.pipeline.renamed import OPTIONS as RENAMED
from bertfuse.converter.reference import prefer_onednn_off
from bertfuse.converter.roles import parse_override
from bertfuse.pipeline.fp8_gate import check_fp8_gemms, check_fp8_options
from bertfuse.pipeline.parity import tolerance_for

PRECISIONS = ("fp32", "fp16")  # what the encoder computes in (parity's tolerance tables)
# --precision's choices: fp8 is fp16 with FP8 weights on bertfuse's ops (ConvertOptions)
PRECISION_CHOICES = (*PRECISIONS, "fp8")
OPS = ("contrib", "bertfuse")  # the op form written: com.microsoft, or ai.bertfuse (lowering.py)
MAX_VERIFY_TOKENS = 1 << 16  # random verification inputs past this only exhaust memory


def check_roles(name: str, value: Any) -> dict[str, str] | None:
    """The API's {role: name}, checked by the same rule as --inputs (unknown roles refused);
    {} means "every input by name"."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BertfuseError(f"{name} must be a dict of role -> input name, e.g. "
                            f"{{'input_ids': 'ids', 'input_mask': 'mask'}}, not {value!r}")
    return parse_override(dict(value))


# -- the table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One option. `flag` is the CLI's (a bool that defaults to True is offered as its
    negation, --no-NAME); `api` is the Python keyword (None: CLI only, e.g. --format is the
    API's `format` and the stages' `kind`)."""

    name: str  # ConvertOptions field
    default: Any
    help: str
    check: Callable[[str, Any], Any]
    flag: str = ""
    api: str | None = ""  # "" : same as name
    choices: tuple | None = None
    metavar: str | None = None
    cli_type: str = "text"  # how the CLI reads it: text | int | tolerance | list | flag
    cli_help: str = ""  # the CLI's help where it differs (a negated flag)
    low: int | None = None  # an int option's lowest value (the check and argparse's type)

    @property
    def keyword(self) -> str:
        return self.api or self.name

    @property
    def cli_flag(self) -> str:
        if self.flag:
            return self.flag
        base = self.name.replace("_", "-")
        return f"--no-{base}" if self.default is True else f"--{base}"

    @property
    def flag_help(self) -> str:
        return self.cli_help or self.help

    def validate(self, value: Any) -> Any:
        return self.check(self.keyword, value)


def _choice(choices: tuple) -> Callable[[str, Any], str]:
    return lambda name, value: check_choice(name, value, choices)


def _int(name: str, value: Any) -> int:
    return check_int(name, value, _LOWS[name])


def _precision(name: str, value: Any) -> str:
    if not isinstance(value, str) or value not in PRECISION_CHOICES:
        raise BertfuseError(f"{name} must be {', '.join(PRECISION_CHOICES)}, not {value!r}")
    return value


def _seed(name: str, value: Any) -> int | None:
    return None if value is None else _int(name, value)


def _path(name: str, value: Any) -> str | None:
    return check_path(name, value, optional=True)


OPTIONS: dict[str, Option] = {o.name: o for o in (
    # TF source
    Option("kind", "auto", "source format (default: detect from the path)", _choice(KINDS),
           flag="--format", api="format", choices=KINDS),
    Option("signature", "serving_default", "SavedModel signature", check_text),
    Option("config", None, "checkpoint config: bert_config.json, albert_config.json or "
           "ELECTRA's --hparams JSON (default: the config beside it)",
           lambda n, v: check_path(n, v, optional=True)),
    Option("inputs", None, "role mapping, e.g. input_ids=ids,input_mask=mask,segment_ids=types",
           check_roles, metavar="ROLE=NAME,..."),
    Option("outputs", None, "comma-separated output names (frozen: node names)", check_names,
           cli_type="list"),
    Option("trust_model", False, "run the model's TensorFlow graph even where it reaches "
                                 "outside the model (files, Python code, the network; "
                                 "refused by default, named in the report's notes)",
           check_flag, cli_type="flag"),
    # conversion
    Option("opset", 17, "ONNX opset, 17 or 18 (default 17)", _int, cli_type="int", low=1),
    Option("fuse", True, "run the fusion passes (False: the raw tf2onnx graph with the "
                         "canonical I/O)", check_flag, cli_type="flag",
           cli_help="write the raw tf2onnx graph (canonical I/O, no fusion passes)"),
    # fusion
    Option("precision", "fp32", "fp16: half-precision weights and activations, fp32 I/O; fp8: "
           "fp16 with FP8 (e4m3) weights for the encoder's GEMMs on bertfuse's own ops (implies "
           "--ops bertfuse), attention and LayerNorm in fp16, held to the FP8 gate "
           "(--fp8-min-cosine, --fp8-min-argmax)", _precision, choices=PRECISION_CHOICES),
    Option("packed", False, "packed form: encoder on real tokens only (PackedAttention; CUDA "
                            "only)", check_flag, cli_type="flag"),
    Option("strict", False, "fail (exit 1, nothing written) if any layer is left unfused",
           check_flag, cli_type="flag"),
    Option("ops", "contrib", "contrib: ONNX Runtime's contrib ops (default); bertfuse: "
                             "bertfuse's own CUDA ops (ai.bertfuse, fp16 only, needs the "
                             "bertfuse op library)", _choice(OPS), choices=OPS),
    Option("fp8", False, "with --ops bertfuse: FP8 (e4m3) weights for the encoder GEMMs, "
                         "scales calibrated on the parity inputs; accuracy vs fp32 is reported, "
                         "not held to the fp16 limits", check_flag, cli_type="flag"),
    Option("fp8_gemms", "all", "with FP8: which GEMMs of each layer take e4m3 weights and "
                               "inputs: all (default); auto: as many as keep the FP8 gate, "
                               "measured place by place; or some of qkv,out,up,down",
           check_fp8_gemms, metavar="all|auto|PLACES"),
    Option("gelu_approximation", False, "with --precision fp16: compute exact (erf) GELUs in "
                                        "their tanh form (FastGelu, at most 4.7e-4 apart per "
                                        "value), which bertfuse's kernels fuse into the FFN-up "
                                        "GEMM; held to the fp16 limits", check_flag,
           cli_type="flag"),
    # verification
    Option("batch", 4, "verification batch (default 4)", _int, cli_type="int", low=1),
    Option("seq", 32, "verification sequence length (default 32)", _int, cli_type="int",
           low=2),
    Option("seed", 0, "seed for the random inputs (default 0: the same inputs every run)",
           _seed, cli_type="int", low=0),
    Option("atol", None, "max |diff| per element (default: 1e-4 fp32, 4e-2 fp16, with mean "
                         "limits 1e-4 / 2e-3)", check_tolerance, cli_type="tolerance"),
    Option("rtol", None, "also allow rtol * |reference| per element (default 0)", check_tolerance,
           cli_type="tolerance"),
    # parity gate
    Option("verify", True, "compare with the reference on the random padded inputs, the "
                           "parity gate (convert: TensorFlow; optimize: the model as given, in "
                           "ONNX Runtime)", check_flag, cli_type="flag",
           cli_help="skip the parity comparison (convert: with TensorFlow; optimize: with the "
                    "model as given)"),
    Option("force", False, "write even if parity (or the FP8 gate) fails", check_flag,
           cli_type="flag"),
    Option("fp8_min_cosine", 0.999, "FP8 gate: the least cosine, per row, between fp32's "
                                    "and FP8's L2-normalised vectors (pooled; a per-token "
                                    "output mean-pooled over its valid tokens) (default 0.999)",
           check_fraction, cli_type="tolerance", metavar="C"),
    Option("fp8_min_argmax", 0.995, "FP8 gate: the least share of rows (tokens) whose logits' "
                                    "argmax FP8 keeps (default 0.995)", check_fraction,
           cli_type="tolerance", metavar="F"),
    # parity data (pipeline/data.py): the user's own inputs and saved outputs
    Option("load_inputs", None, "compare on these inputs instead of random ones: .npz or "
                                ".json (also Polygraphy's run --save-inputs), arrays named "
                                "input_ids/input_mask/segment_ids or as the source's inputs", _path, metavar="FILE"),
    Option("text_file", None, "compare on this text, one query a line (a pair: "
                              "QUERY<TAB>PASSAGE), tokenized with --vocab", _path,
           metavar="FILE"),
    Option("vocab", None, "the checkpoint's vocab.txt, for --text-file", _path,
           metavar="VOCAB"),
    Option("save_inputs", None, "write the compared inputs by role (.npz, or .json in "
                                "Polygraphy's format: polygraphy run --load-inputs reads it)", _path,
           metavar="FILE"),
    Option("save_outputs", None, "write the reference's outputs (NAME) and the model's "
                                 "(onnx/NAME), .npz or .json", _path, metavar="FILE"),
    Option("load_outputs", None, "compare with these saved outputs (.npz or .json by output "
                                 "name, or Polygraphy's run --save-outputs) instead of "
                                 "TensorFlow's, on --load-inputs/--text-file",
           _path, metavar="FILE"),
    # writing
    Option("external_data", False, "weights in MODEL.onnx.data beside the model (automatic "
                                   "past 2 GB)", check_flag, cli_type="flag"),
)}
_LOWS = {o.keyword: o.low for o in OPTIONS.values() if o.low is not None}  # by API keyword

# Which options each CLI group shows, in order (cli/convert.py builds the groups from these).
GROUPS = {
    "TF source": ("kind", "signature", "config", "inputs", "outputs", "trust_model"),
    "conversion": ("opset", "fuse"),
    "fusion": ("precision", "packed", "strict", "ops", "fp8", "fp8_gemms",
               "gelu_approximation"),
    "verification": ("batch", "seq", "seed", "atol", "rtol"),
    "parity gate": ("verify", "force", "fp8_min_cosine", "fp8_min_argmax"),
    "parity data": ("load_inputs", "text_file", "vocab", "save_inputs", "save_outputs",
                    "load_outputs"),
    "writing": ("external_data",),
}
PARITY_DATA = GROUPS["parity data"]
# The options `optimize` takes (its inputs rename the model's inputs to the roles; its parity
# compares with the model as given, in ONNX Runtime).
OPTIMIZE_OPTIONS = ("inputs", *GROUPS["fusion"], *GROUPS["verification"],
                    *GROUPS["parity gate"], *GROUPS["writing"])


def _default(name: str) -> Any:
    return field(default=OPTIONS[name].default)


@dataclass
class ConvertOptions:
    """The stages' arguments, one field per OPTIONS entry, defaults from the table."""

    kind: str = _default("kind")
    signature: str = _default("signature")
    config: str | None = _default("config")
    inputs: str | dict[str, str] | None = _default("inputs")  # ROLE=NAME,... or {role: name}
    outputs: list[str] | None = _default("outputs")
    trust_model: bool = _default("trust_model")
    opset: int = _default("opset")
    fuse: bool = _default("fuse")
    precision: str = _default("precision")
    packed: bool = _default("packed")
    strict: bool = _default("strict")
    ops: str = _default("ops")
    fp8: bool = _default("fp8")
    fp8_gemms: str = _default("fp8_gemms")
    gelu_approximation: bool = _default("gelu_approximation")
    batch: int = _default("batch")
    seq: int = _default("seq")
    seed: int | None = _default("seed")  # None: a fresh random draw
    atol: float | None = _default("atol")  # None: the fp32/fp16 table in parity.py
    rtol: float | None = _default("rtol")  # None: 0
    verify: bool = _default("verify")
    force: bool = _default("force")
    fp8_min_cosine: float = _default("fp8_min_cosine")
    fp8_min_argmax: float = _default("fp8_min_argmax")
    load_inputs: str | None = _default("load_inputs")
    text_file: str | None = _default("text_file")
    vocab: str | None = _default("vocab")
    save_inputs: str | None = _default("save_inputs")
    save_outputs: str | None = _default("save_outputs")
    load_outputs: str | None = _default("load_outputs")
    external_data: bool = _default("external_data")

    def __post_init__(self) -> None:
        """--precision fp8 is the fp16 encoder on bertfuse's ops with FP8 weights: it sets the
        fields the stages read (precision fp16, ops bertfuse, fp8), as `--precision fp16
        --ops bertfuse --fp8` would; the report's options show those."""
        if self.precision == "fp8":
            self.precision, self.ops, self.fp8 = "fp16", "bertfuse", True

    @classmethod
    def from_keywords(cls, names: Sequence[str], values: Mapping[str, Any]) -> ConvertOptions:
        """The API's keywords (by Option.keyword) checked one by one, in table order."""
        return cls(**{n: OPTIONS[n].validate(values[OPTIONS[n].keyword]) for n in names})

    def to_json(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """The report's "options" (names: these only, in this order); a renamed option keeps
        its old key and values there (pipeline/renamed.py)."""
        out = {}
        for name in names or [f.name for f in fields(self)]:
            old, value = RENAMED.get(name), getattr(self, name)
            out[old.report_key if old else name] = old.report_value(value) if old else value
        return out


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise BertfuseError(f"precision {precision!r} is not supported (choose "
                            f"{' or '.join(PRECISIONS)})")


def check_verify_size(batch: int, seq: int) -> None:
    tokens = batch * seq
    if tokens > MAX_VERIFY_TOKENS:
        raise BertfuseError(f"--batch {batch} x --seq {seq} is {tokens} tokens; the "
                            f"comparison takes at most {MAX_VERIFY_TOKENS}")


def check_ops(ops: str, precision: str, packed: bool = False, fp8: bool = False) -> None:
    """Bad combinations, before any slow work (one line, exit 2). `--packed --ops bertfuse`
    is the device-packed form (passes/device_packing.py)."""
    if fp8 and ops != "bertfuse":
        raise BertfuseError("--fp8 needs --ops bertfuse (FP8 weights exist only as bertfuse "
                            "ops)")
    if ops not in OPS:
        raise BertfuseError(f"ops {ops!r} is not supported (choose {' or '.join(OPS)})")
    if ops == "bertfuse" and precision != "fp16":
        raise BertfuseError(f"--ops bertfuse needs --precision fp16 (the bertfuse ops "
                            f"are fp16 only; got {precision})")


def check_inputs_text(inputs: str | dict[str, str] | None) -> None:
    """An empty --inputs is a mistake (the API's {} means "every input by name")."""
    if isinstance(inputs, str) and not inputs.strip():
        raise BertfuseError("--inputs: expected ROLE=NAME,... (roles: input_ids, input_mask, "
                            "segment_ids)")


def check_gelu_approximation(gelu_approximation: bool, precision: str) -> None:
    """The tanh form is up to 4.7e-4 from erf per value: past the fp32 limit (1e-4)."""
    if gelu_approximation and precision != "fp16":
        raise BertfuseError(f"--gelu-approximation needs --precision fp16 (the tanh GELU is up "
                            f"to 4.7e-4 from the exact one, past the {precision} limits)")


def check_fusion(opts: ConvertOptions) -> None:
    """The checks every stage plan runs first: options that cannot work together."""
    check_precision(opts.precision)
    check_ops(opts.ops, opts.precision, opts.packed, opts.fp8)
    check_gelu_approximation(opts.gelu_approximation, opts.precision)
    check_inputs_text(opts.inputs)
    check_fp8_options(opts.fp8, opts.fp8_gemms, opts.fp8_min_cosine, opts.fp8_min_argmax)


def check_seed(seed: int | None) -> int | None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise BertfuseError(f"--seed must be an integer >= 0, got {seed!r}")
    return seed


def check_parity_options(opts: ConvertOptions) -> None:
    """The seed, the inputs' size and the tolerances, before any slow work."""
    check_seed(opts.seed)
    check_verify_size(opts.batch, opts.seq)
    tolerance_for(opts.precision, opts.atol, opts.rtol)


def check_gate(opts: ConvertOptions) -> None:
    """Before the slow TF load: a NaN or negative tolerance or seed is bad input, and TF is
    asked to start with oneDNN's rewrites off (see converter/reference.py)."""
    check_fusion(opts)
    check_parity_options(opts)
    if not opts.fuse:  # these act on the fused graph: without it they would silently do nothing
        asked = [flag for flag, on in (("--strict", opts.strict), ("--packed", opts.packed),
                                       ("--precision fp16", opts.precision != "fp32"),
                                       ("--ops bertfuse", opts.ops != "contrib")) if on]
        if asked:
            raise BertfuseError(f"{asked[0]} needs the fusion passes; it cannot be combined "
                                f"with --no-fuse")
    if opts.verify:
        prefer_onednn_off()
