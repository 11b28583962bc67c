"""`bertfuse inspect`, `summarize`, `diff` and `draw`: the graph checks and pictures of this
package as commands (cli.py runs them). Each reads models or summaries and writes at most
one new file, checked first by bertfuse/io/safety.py."""

from __future__ import annotations

import argparse
import json
import os
import sys

from bertfuse.errors import BertfuseError
from bertfuse.cli.render import emit


def cmd_inspect(args: argparse.Namespace, console) -> int:
    from bertfuse.inspect.summary import print_summary, summarize, summary_markdown

    summary = summarize(args.model)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    elif args.markdown:
        print(summary_markdown(summary, args.model), end="")
    else:
        print_summary(summary, console, args.model)
    return 0


def cmd_summarize(args: argparse.Namespace, console) -> int:
    from bertfuse.inspect.summary import dumps, summarize
    from bertfuse.io.safety import check_output, write_text

    if args.output:
        check_output(args.output, [args.model], model=False)
    text = dumps(summarize(args.model))
    if not args.output:
        sys.stdout.write(text)
        return 0
    write_text(args.output, text)
    return emit(args.json, console, {"output": args.output}, f"wrote summary to {args.output}")


def cmd_diff(args: argparse.Namespace, console) -> int:
    from bertfuse.inspect.diff import add_numeric, diff_markdown, diff_summaries, diff_text, \
        numeric_diff, parse_fail_on
    from bertfuse.inspect.summary import load_summary
    from bertfuse.pipeline.options import check_verify_size

    if args.numeric:
        check_verify_size(args.batch, args.seq)
    fail_on = parse_fail_on(args.fail_on)
    a, b = load_summary(args.a), load_summary(args.b)
    result = diff_summaries(a, b, args.a, args.b, fail_on)
    if args.numeric:
        for path in (args.a, args.b):
            if _is_summary(path):
                raise BertfuseError(f"{path}: --numeric needs two models, not a summary")
        add_numeric(result, numeric_diff(args.a, args.b, args.batch, args.seq, args.seed),
                    args.atol, args.batch, args.seq)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    elif args.markdown:
        print(diff_markdown(result), end="")
    else:
        sys.stdout.write(diff_text(result))
    return result.exit_code


def _is_summary(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(64).lstrip().startswith(b"{")


def cmd_draw(args: argparse.Namespace, console) -> int:
    from bertfuse.inspect.draw import render, to_dot
    from bertfuse.inspect.summary import load_light
    from bertfuse.io.safety import check_output

    check_output(args.output, [args.model, args.before], model=False)
    model = load_light(args.model)
    before = load_light(args.before) if args.before else None
    dot = to_dot(model, args.layer, before, name=os.path.basename(args.model),
                 before_name=os.path.basename(args.before) if args.before else "raw")
    out = render(dot, args.output)
    return emit(args.json, console, {"output": str(out), "layer": args.layer},
                f"drew layer {args.layer} to {out}")
