"""bertfuse's argument parser: subcommands, grouped options, and a worked example at the end
of each subcommand's --help. cli.py runs the commands."""

from __future__ import annotations

import argparse
import math
from typing import Callable

from bertfuse.errors import UsageError

DESCRIPTION = "bertfuse command line: one entry point, subcommands, grouped options, --json for CI."


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (exit 2) instead of usage + message."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


def _tolerance(text: str) -> float:
    """A finite, non-negative float: a NaN tolerance would let every NaN output pass."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _add_source_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TF source")
    g.add_argument("--format", dest="kind", default="auto",
                   choices=("auto", "checkpoint", "savedmodel", "frozen", "keras"),
                   help="source format (default: detect from the path)")
    g.add_argument("--signature", default="serving_default", help="SavedModel signature")
    g.add_argument("--config", help="bert_config.json (checkpoint; default: beside it)")
    g.add_argument("--inputs", help="role mapping, e.g. input_ids=ids,input_mask=mask,"
                                    "segment_ids=types")
    g.add_argument("--outputs", help="comma-separated output names (frozen: node names)")


def _add_verify_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("verification")
    g.add_argument("--batch", type=_int_at_least(1), default=4, help="verification batch (default 4)")
    g.add_argument("--seq", type=_int_at_least(2), default=32, help="verification sequence length")
    g.add_argument("--seed", type=_int_at_least(0), default=0,
                   help="seed for the random inputs (default 0: the same inputs every run)")
    g.add_argument("--atol", type=_tolerance, help="max |diff| per element (default: 1e-4 fp32, "
                                                   "4e-2 fp16, with mean limits 1e-4 / 2e-3)")
    g.add_argument("--rtol", type=_tolerance, help="also allow rtol * |TF| per element "
                                                   "(default 0)")


def _add_fusion_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fusion")
    g.add_argument("--precision", choices=("fp32", "fp16"), default="fp32",
                   help="fp16: half-precision weights and activations, fp32 I/O")
    g.add_argument("--packed", action="store_true",
                   help="packed form: encoder on real tokens only (PackedAttention; CUDA only)")
    g.add_argument("--strict", action="store_true",
                   help="fail (exit 1, nothing written) if any layer is left unfused")
    g.add_argument("--kernels", choices=("ort", "bertfuse"), default="ort",
                   help="ort: ONNX Runtime's contrib ops (default); bertfuse: bertfuse's own "
                        "CUDA ops (ai.bertfuse, fp16 only, needs the bertfuse op library)")
    g.add_argument("--fp8", action="store_true",
                   help="with --kernels bertfuse: FP8 (e4m3) weights for the encoder GEMMs, "
                        "scales calibrated on the parity inputs; accuracy vs fp32 is reported, "
                        "not held to the fp16 limits")


def _add_write_target(p: argparse.ArgumentParser, what: str) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-o", "--output", help=f"{what} (never one of the inputs)")
    g.add_argument("--in-place", action="store_true",
                   help="rewrite MODEL itself: a temp file beside it replaces it after success")


def _add_output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    g.add_argument("--debug", action="store_true", help="show tracebacks")


def _add_serving_parsers(sub) -> None:
    """tokenize (text -> ids) and export-triton (a Triton model repository)."""
    p = sub.add_parser("tokenize", help="text -> input_ids/input_mask/segment_ids with a "
                                        "checkpoint's vocab.txt (WordPiece)")
    p.add_argument("text", nargs="+", help="one or more texts (a batch)")
    p.add_argument("--vocab", required=True, help="the checkpoint's vocab.txt")
    p.add_argument("--pair", action="append", metavar="TEXT",
                   help="second segment for each text (segment id 1); once per text")
    p.add_argument("--model", help="converted .onnx: its vocab size, positions and bert_config")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--lower-case", dest="lower_case", action="store_true", default=None,
                   help="lower-case (default: the config's do_lower_case, the checkpoint's "
                        "name, then the vocab)")
    g.add_argument("--no-lower-case", dest="lower_case", action="store_false")
    p.add_argument("--max-length", type=_int_at_least(3),
                   help="truncate to this many tokens (default: the model's positions)")
    _add_output_args(p)

    p = sub.add_parser("export-triton", help="a Triton model repository (onnxruntime backend) "
                                             "for a model")
    p.add_argument("model", help="ONNX model")
    p.add_argument("-o", "--output", required=True, metavar="REPO",
                   help="model repository directory (REPO/NAME/config.pbtxt, "
                        "REPO/NAME/1/model.onnx)")
    p.add_argument("--name", help="model name in the repository (default: the file's name)")
    p.add_argument("--force", action="store_true", help="replace an existing REPO/NAME")
    g = p.add_argument_group("serving")
    g.add_argument("--max-batch", type=_int_at_least(1), default=32,
                   help="max_batch_size (default 32)")
    g.add_argument("--instances", type=_int_at_least(1), default=1,
                   help="model instances per device (default 1)")
    g.add_argument("--kind", choices=("gpu", "cpu"), default="gpu",
                   help="instance kind (default gpu)")
    g.add_argument("--dynamic-batching-delay-us", type=_int_at_least(0), default=100,
                   metavar="T", help="max_queue_delay_microseconds (default 100)")
    g.add_argument("--intra-op-threads", type=_int_at_least(1), metavar="N",
                   help="ONNX Runtime threads per instance (CPU: instances x N <= cores)")
    g.add_argument("--cuda-graphs", action="store_true", help=argparse.SUPPRESS)
    _add_output_args(p)


def build_parser() -> argparse.ArgumentParser:
    from bertfuse._version import __version__

    parser = _Parser(prog="bertfuse", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"bertfuse {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("example", help="write a Google-layout BERT checkpoint with random weights")
    p.add_argument("--config", default="tiny", help="tiny | shenma-3l | base | large")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("--head", action="store_true", help="add a ranking head (MLP + output layer)")
    p.add_argument("--hidden-act", help="override hidden_act (gelu = erf, gelu_new = tanh)")
    p.add_argument("--seed", type=_int_at_least(0), default=0)
    _add_output_args(p)

    p = sub.add_parser("convert", help="TF BERT -> fused ONNX, verified against TF")
    p.add_argument("source", help="checkpoint dir/prefix, SavedModel dir, .pb, or .keras")
    p.add_argument("-o", "--output", required=True, help="output .onnx")
    _add_source_args(p)
    g = p.add_argument_group("conversion")
    g.add_argument("--opset", type=int, default=17, help="ONNX opset, 17 or 18 (default 17)")
    g.add_argument("--no-fuse", action="store_true",
                   help="write the raw tf2onnx graph (canonical I/O, no fusion passes)")
    _add_fusion_args(p)
    _add_verify_args(p)
    g = p.add_argument_group("parity gate")
    g.add_argument("--no-verify", action="store_true", help="skip the TF comparison")
    g.add_argument("--force", action="store_true", help="write even if parity fails")
    _add_output_args(p)

    p = sub.add_parser("optimize", help="run the fusion passes on a raw tf2onnx model")
    p.add_argument("model", help="raw ONNX exported by tf2onnx")
    _add_write_target(p, "output .onnx")
    _add_fusion_args(p)
    p.add_argument_group("interface").add_argument(
        "--inputs", metavar="ROLE=NAME,...",
        help="rename the inputs to input_ids, input_mask, segment_ids (int32), as bertfuse's "
             "Session takes them; inputs not named are recognised by name, e.g. "
             "input_ids=input_word_ids,segment_ids=input_type_ids")
    _add_output_args(p)

    p = sub.add_parser("strip-weights", help="drop large initializers' bytes (keep shape/dtype)")
    p.add_argument("model", help="ONNX model")
    _add_write_target(p, "output skeleton .onnx")
    p.add_argument("--fill", type=_int_at_least(0), metavar="SEED",
                   help="instead: refill a stripped model with seeded random weights")
    _add_output_args(p)

    p = sub.add_parser("bench", help="GPU benchmark: ORT raw / ORT optimizer / bertfuse "
                                     "runtime, padded vs packed (needs onnxruntime-gpu)")
    from bertfuse.cli.bench import add_arguments

    add_arguments(p)
    _add_output_args(p)

    p = sub.add_parser("inspect", help="I/O, opsets, op histogram, weight bytes, encoder "
                                       "table (weights are not read)")
    p.add_argument("model", help="ONNX model")
    p.add_argument("--markdown", action="store_true", help="print Markdown (for a PR comment)")
    _add_output_args(p)

    p = sub.add_parser("summarize", help="small, stable JSON summary of a model (a golden file)")
    p.add_argument("model", help="ONNX model")
    p.add_argument("-o", "--output", help="summary .json (default: stdout)")
    _add_output_args(p)

    p = sub.add_parser("diff", help="what changed between two models or summaries "
                                    "(exit 1 when --fail-on matches)")
    p.add_argument("a", help="model .onnx or summary .json (the baseline)")
    p.add_argument("b", help="model .onnx or summary .json (the candidate)")
    g = p.add_argument_group("policy")
    g.add_argument("--fail-on", metavar="CATS",
                   help="comma-separated: fusion-loss, io-change, opset-change, op-change, "
                        "init-change, numeric; all; none (default: fusion-loss,io-change,"
                        "numeric)")
    g = p.add_argument_group("numeric")
    g.add_argument("--numeric", action="store_true",
                   help="also run both models (ORT CPU) on the same random padded inputs")
    g.add_argument("--atol", type=_tolerance, default=1e-3, help="numeric: max |diff| allowed "
                                                                 "(NaN/Inf always fail)")
    g.add_argument("--batch", type=_int_at_least(1), default=4, help="numeric batch (default 4)")
    g.add_argument("--seq", type=_int_at_least(2), default=32, help="numeric sequence length")
    g.add_argument("--seed", type=_int_at_least(0), default=0,
                   help="numeric: seed for the inputs")
    p.add_argument("--markdown", action="store_true", help="print Markdown (for a PR comment)")
    _add_output_args(p)

    p = sub.add_parser("draw", help="one encoder layer as a picture (Graphviz dot)")
    p.add_argument("model", help="ONNX model")
    p.add_argument("--layer", type=_int_at_least(0), default=0, help="encoder layer (default 0)")
    p.add_argument("--before", metavar="RAW.onnx", help="draw this model's layer beside it")
    p.add_argument("-o", "--output", required=True, help="picture: .svg, .png, or .dot")
    _add_output_args(p)

    p = sub.add_parser("verify", help="compare an ONNX model with its TF source")
    p.add_argument("model", help="ONNX model")
    p.add_argument("--against", required=True, help="the TF source")
    _add_source_args(p)
    _add_verify_args(p)
    _add_output_args(p)
    _add_serving_parsers(sub)
    from bertfuse.cli.kernels import add_parser as add_kernels_parser

    add_kernels_parser(sub, _add_output_args)
    from bertfuse.cli.score import add_parser as add_score_parser

    add_score_parser(sub, _int_at_least, _add_output_args)
    p = sub.add_parser("serve", help="serve a model over HTTP on Ray Serve (batched, "
                                     "one replica per GPU)")
    from bertfuse.cli.serve import add_arguments as add_serve_arguments

    add_serve_arguments(p, _int_at_least)
    _add_output_args(p)
    for name, p in sub.choices.items():
        if name in EXAMPLES:
            p.epilog = "example:\n" + EXAMPLES[name]
            p.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


# One worked example per subcommand, shown at the end of its --help.
EXAMPLES = {
    "example": "  bertfuse example --config tiny -o out/tiny",
    "convert": "  bertfuse convert out/tiny -o tiny.onnx\n"
               "  bertfuse convert saved_model/ -o model_fp16.onnx --precision fp16 \\\n"
               "      --inputs input_ids=ids,input_mask=mask,segment_ids=types --json",
    "optimize": "  python -m tf2onnx.convert --saved-model sm/ --opset 17 --output raw.onnx\n"
                "  bertfuse optimize raw.onnx -o fused.onnx \\\n"
                "      --inputs input_ids=input_word_ids,segment_ids=input_type_ids",
    "verify": "  bertfuse verify tiny.onnx --against out/tiny --batch 2 --seq 64",
    "strip-weights": "  bertfuse strip-weights model.onnx -o skeleton.onnx\n"
                     "  bertfuse strip-weights skeleton.onnx -o filled.onnx --fill 0",
    "inspect": "  bertfuse inspect model.onnx --markdown >> \"$GITHUB_STEP_SUMMARY\"",
    "summarize": "  bertfuse summarize model.onnx -o model.summary.json",
    "diff": "  bertfuse diff model.summary.json model.onnx --fail-on fusion-loss,io-change\n"
            "  bertfuse diff old.onnx new.onnx --numeric --atol 1e-3",
    "draw": "  bertfuse draw model.onnx --layer 0 --before raw.onnx -o layer0.svg",
    "tokenize": "  bertfuse tokenize --vocab out/tiny/vocab.txt 'what is bert?' "
                "--pair 'a language model' --json",
    "export-triton": "  bertfuse export-triton tiny_fp16.onnx -o model_repository/ --name bert "
                     "--max-batch 32 --instances 2",
    "serve": "  bertfuse serve model.onnx --vocab out/tiny/vocab.txt --port 8000\n"
             "  curl -s localhost:8000/v1/infer -d '{\"text\": [\"what is bert?\"]}'",
    "bench": "  bertfuse strip-weights raw.onnx -o out/skeletons/shenma-3l_raw.skel.onnx\n"
             "  bertfuse bench --skeletons out/skeletons --workloads 'shenma-3l b20 s64' --packed "
             "--out results/",
}
