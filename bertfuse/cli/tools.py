"""`bertfuse example`, `tokenize` and `export-triton`: the small commands around a model
(an example checkpoint to start from, text to ids, a Triton repository)."""

from __future__ import annotations

import argparse

from bertfuse.cli.args import int_at_least
from bertfuse.cli.command import Command
from bertfuse.cli.render import emit
from bertfuse.errors import BertfuseError
from bertfuse.cli.args import stage_lines
from bertfuse.cli.outcome import print_json
from bertfuse.converter.config import EXAMPLE_CONFIGS
from bertfuse.converter.example import write_example
from bertfuse.export.triton import export_triton
from bertfuse.text import WordPiece


class Example(Command):
    name = "example"
    summary = "write a Google-layout BERT checkpoint with random weights"
    example = "  bertfuse example --config tiny -o out/tiny"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", default="tiny", help=" | ".join(EXAMPLE_CONFIGS))
        p.add_argument("-o", "--output", required=True, help="output directory")
        p.add_argument("--head", action="store_true",
                       help="add a ranking head (MLP + output layer)")
        p.add_argument("--hidden-act", help="override hidden_act (gelu = erf, gelu_new = tanh)")
        p.add_argument("--seed", type=int_at_least(0), default=0)

    def run(self, args: argparse.Namespace, console) -> int:
        # One stage (base: about 75 s on 2 cores): a bad option or -o fails inside it, and
        # then the one-line error is all that stderr shows.
        with stage_lines(args) as progress:
            progress(f"write the {args.config} example (TensorFlow, random weights, vocab.txt)")
            out = write_example(args.config, args.output, seed=args.seed, head=args.head,
                                hidden_act=args.hidden_act)
        return emit(args, console, {"output": str(out), "config": args.config},
                    f"wrote {args.config} example to {out}")


class Tokenize(Command):
    name = "tokenize"
    summary = "text -> input_ids/input_mask/segment_ids with a checkpoint's vocab.txt (WordPiece)"
    example = ("  bertfuse tokenize --vocab out/tiny/vocab.txt 'what is bert?' "
               "--pair 'a language model' --json")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("text", nargs="+", help="one or more texts (a batch)")
        p.add_argument("--vocab", required=True, help="the checkpoint's vocab.txt")
        p.add_argument("--pair", action="append", metavar="TEXT",
                       help="second segment for each text (segment id 1); once per text")
        p.add_argument("--model",
                       help="converted .onnx: its vocab size, positions and bert_config")
        g = p.add_mutually_exclusive_group()
        g.add_argument("--lower-case", dest="lower_case", action="store_true", default=None,
                       help="lower-case (default: the config's do_lower_case, the checkpoint's "
                            "name, then the vocab)")
        g.add_argument("--no-lower-case", dest="lower_case", action="store_false")
        p.add_argument("--max-length", type=int_at_least(3),
                       help="truncate to this many tokens (default: the model's positions)")

    def run(self, args: argparse.Namespace, console) -> int:
        for i, text in enumerate([*args.text, *(args.pair or [])]):
            try:  # Python decodes argv with surrogateescape: bytes that are not UTF-8
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                what = f"text {i + 1}" if i < len(args.text) else \
                    f"--pair {i - len(args.text) + 1}"
                raise BertfuseError(f"{what} is not UTF-8 (byte {exc.start}); pass UTF-8 "
                                    "text") from None
        tok = WordPiece(args.vocab, lower_case=args.lower_case, max_length=args.max_length,
                        model=args.model)
        if args.pair is not None and len(args.pair) != len(args.text):
            raise BertfuseError(f"{len(args.text)} texts but {len(args.pair)} --pair")
        batch = tok(args.text, args.pair)
        if args.json:
            print_json("tokenize", {**{k: v.tolist() for k, v in batch.feeds().items()},
                                    "lower_case": tok.lower_case, "max_length": tok.max_length},
                       indent=None)
            return 0
        for i, text in enumerate(args.text):
            pieces = tok.tokens(text, args.pair[i] if args.pair else None)
            console.print(" ".join(pieces), markup=False, highlight=False, soft_wrap=True)
            console.print(" ".join(map(str, batch.input_ids[i][batch.input_mask[i] > 0])),
                          markup=False, highlight=False, soft_wrap=True)
        return 0


class ExportTriton(Command):
    name = "export-triton"
    summary = "a Triton model repository (onnxruntime backend) for a model"
    example = ("  bertfuse export-triton tiny_fp16.onnx -o model_repository/ --name bert "
               "--max-batch 32 --instances 2")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="ONNX model")
        p.add_argument("-o", "--output", required=True, metavar="REPO",
                       help="model repository directory (REPO/NAME/config.pbtxt, "
                            "REPO/NAME/1/model.onnx)")
        p.add_argument("--name", help="model name in the repository (default: the file's name)")
        p.add_argument("--force", action="store_true", help="replace an existing REPO/NAME")
        g = p.add_argument_group("serving")
        g.add_argument("--max-batch", type=int_at_least(1), default=32,
                       help="max_batch_size (default 32)")
        g.add_argument("--instances", type=int_at_least(1), default=1,
                       help="model instances per device (default 1)")
        g.add_argument("--kind", choices=("gpu", "cpu"), default="gpu",
                       help="instance kind (default gpu)")
        g.add_argument("--dynamic-batching-delay-us", type=int_at_least(0), default=100,
                       metavar="T", help="max_queue_delay_microseconds (default 100)")
        g.add_argument("--intra-op-threads", type=int_at_least(1), metavar="N",
                       help="ONNX Runtime threads per instance (CPU: instances x N <= cores)")
        g.add_argument("--cuda-graphs", action="store_true", help=argparse.SUPPRESS)
        g = p.add_argument_group("bertfuse's own ops (a model converted with --ops bertfuse)")
        g.add_argument("--op-library", metavar="PATH",
                       help="the op library to put in the repository (default: the one "
                            "`bertfuse kernels build` built for this GPU)")
        g.add_argument("--triton-repo-path", metavar="DIR",
                       help="where Triton sees REPO, absolute (e.g. /models in a container): "
                            "the op library's path in config.pbtxt (default: REPO's own)")

    def run(self, args: argparse.Namespace, console) -> int:
        out = export_triton(args.model, args.output, args.name, args.max_batch, args.instances,
                            args.kind, args.dynamic_batching_delay_us, args.force,
                            args.cuda_graphs, args.intra_op_threads, args.op_library,
                            args.triton_repo_path)
        return emit(args, console, out.to_json(),
                    f"wrote {out.name} ({out.precision}) to {out.config} and {out.model}"
                    + (f", with the op library {out.op_library}" if out.op_library else ""),
                    indent=2)
