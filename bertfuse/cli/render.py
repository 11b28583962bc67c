"""Rich rendering of run reports (stage table, per-layer fusion table, parity)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bertfuse.cli.outcome import command_name, print_json
from bertfuse.inspect.encoder_table import print_encoder_table

if TYPE_CHECKING:
    from bertfuse.pipeline.report import RunReport

def emit(args, console: Console, data: dict, line: str, indent: int | None = None) -> int:
    """A command's result: `data` as one JSON report on stdout with --json (cli/outcome.py),
    else `line` as plain text (no Rich markup or highlighting: paths print as they are).
    Returns exit 0."""
    if args.json:
        print_json(command_name(args), data, indent=indent)
    else:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0


def make_console(stderr: bool = False, file: TextIO | None = None) -> Console:
    """A rich Console that wraps at the terminal's width, and not at all (no 80-column
    tables) when the output is a file or a pipe, as in CI logs; COLUMNS still wins."""
    stream = file or (sys.stderr if stderr else sys.stdout)
    tty = hasattr(stream, "isatty") and stream.isatty()
    width = None if tty or os.environ.get("COLUMNS") else 10_000
    return Console(stderr=stderr, file=file, width=width)


def print_report(report: RunReport, console: Console) -> None:
    if report.original_names:
        names = ", ".join(f"{k} <- {v}" for k, v in report.original_names.items() if k != v)
        if names:
            console.print(f"[dim]original names:[/dim] {escape(names)}")
    if report.outputs:
        rows = ", ".join(f"{o['name']} ({o['role'] or 'no role: its source name'})"
                         for o in report.outputs)
        console.print(f"[dim]outputs:[/dim] {escape(rows)}")
    for note in report.notes:
        console.print(f"[dim]note:[/dim] {escape(note)}")
    stages = Table(title="bertfuse", show_lines=False)
    stages.add_column("stage")
    stages.add_column("time (s)", justify="right")
    stages.add_column("nodes", justify="right")
    stages.add_column("detail")
    for st in report.stages:
        stages.add_row(st.name, f"{st.seconds:.2f}", "" if st.nodes is None else str(st.nodes),
                       st.detail)
    console.print(stages)
    if report.passes is not None:
        _print_passes(report, console)
        if report.passes.table is not None:
            print_encoder_table(report.passes.table, console)
    if report.parity is not None:
        p = report.parity
        tol = f"max {p.tolerance.atol:g}" + (f" + {p.tolerance.rtol:g}·|TF|" if p.tolerance.rtol
                                             else "") + \
            (f", mean {p.tolerance.mean:g}" if p.tolerance.mean is not None else "")
        against = "saved outputs" if p.reference.startswith("saved") else \
            "the given model" if p.source_kind == "onnx" else "TensorFlow"
        given = f"{p.batch} x {p.seq}, your inputs" if p.inputs else \
            f"batch {p.batch}, seq {p.seq}, padded, seed {p.seed}"
        par = Table(title=f"parity vs {against} ({p.precision}, {given})")
        par.add_column("output")
        par.add_column("max |diff|", justify="right")
        par.add_column("mean |diff|", justify="right")
        par.add_column("")
        notes = any(o.note for o in p.outputs)
        if notes:
            par.add_column("note")
        for o in p.outputs:
            par.add_row(escape(o.name), f"{o.max_abs:.3g}", f"{o.mean_abs:.3g}",
                        "[green]ok[/green]" if o.ok else "[red]FAIL[/red]",
                        *([escape(o.note)] if notes else []))
        console.print(par)
        # A line of its own: a caption would wrap at the table's width.
        inputs = f"inputs: {escape(p.inputs)}; " if p.inputs else ""
        console.print(f"[dim]{inputs}reference: {escape(p.reference or 'TensorFlow')}; "
                      f"tolerance {tol}[/dim]", highlight=False)
        if p.kernels:  # verify: which kernels ran, and why (runtime/kernel_choice.py KernelChoice)
            k = p.kernels
            console.print(f"device: {p.device}; kernels={k['asked']}: {k['used']} "
                          f"({escape(k['reason'])})", highlight=False, soft_wrap=True)
    if report.fp8 and report.fp8["outputs"]:
        _print_fp8(report.fp8, console)
    if report.written:
        console.print(f"wrote [bold]{escape(str(report.output))}[/bold]")  # a path: literal
    if report.text:  # a text-in source (pipeline/text_parity.py describe)
        t = report.text
        row = f" ({t['seq']} a row)" if t["seq"] else ""
        vocab = (f"vocab written to [bold]{escape(t['vocab'])}[/bold] (serve, score and verify "
                 f"--text-file find it there)" if t["vocab"] else "no vocab written")
        console.print(f"text in: the tokenizer ({escape(t['tokenizer'])}, lower_case "
                      f"{t['lower_case']}) is cut off; the model takes its packed ids{row}; "
                      f"{vocab}", highlight=False, soft_wrap=True)


def _print_fp8(fp8: dict, console: Console) -> None:
    """FP8 against fp32 in user terms, and the gate (pipeline/fp8_gate.py); a per-token
    output's cosine is its mean-pooled rows'."""
    gate = fp8["gate"]
    table = Table(title=f"FP8 ({', '.join(fp8['gemms'])} GEMMs in e4m3) vs fp32 in user terms "
                        f"({escape(fp8['inputs'])} inputs; gate: min "
                        f"cosine {gate['min_cosine']:g}, argmax agreement "
                        f"{gate['min_argmax']:.1%})")
    for col in ("output", "kind", "rows", "cosine min", "cosine mean", "per token min",
                "argmax agree", "top-k agree"):
        table.add_column(col, justify="left" if col in ("output", "kind") else "right")

    def num(x, pct: bool = False) -> str:
        return "-" if x is None else f"{x:.2%}" if pct else f"{x:.6f}"

    for t in fp8["outputs"]:
        topk = "-" if t["topk_agreement"] is None else f"{t['topk_agreement']:.0%} (k {t['k']})"
        table.add_row(escape(t["name"]), t["kind"], str(t["count"]), num(t["cosine_min"]),
                      num(t["cosine_mean"]), num(t["token_cosine_min"]),
                      num(t["argmax_agreement"], True), topk)
    console.print(table)
    verdict = "[green]within the FP8 gate[/green]" if fp8["ok"] else \
        f"[red]below the FP8 gate[/red]: {escape(fp8['failure'])}"
    console.print(verdict, highlight=False, soft_wrap=True)


def print_quiet(report: RunReport, console: Console) -> None:
    """-q: the paths written, nothing else (errors go on stderr, from the CLI)."""
    if report.written:
        console.print(f"wrote {report.output}", markup=False, highlight=False, soft_wrap=True)
    if report.text and report.text["vocab"]:
        console.print(f"wrote {report.text['vocab']}", markup=False, highlight=False,
                      soft_wrap=True)


def _print_passes(report: RunReport, console: Console) -> None:
    passes = Table(title="passes")
    passes.add_column("pass")
    passes.add_column("rewrites", justify="right")
    passes.add_column("nodes", justify="right")
    passes.add_column("op changes")
    for r in report.passes.records:
        added = [f"+{d} {op.split('.')[-1]}" for op, d in r.delta.items() if d > 0]
        removed = -sum(d for d in r.delta.values() if d < 0)
        summary = ", ".join(added + ([f"-{removed} other"] if removed else []))
        passes.add_row(r.name, str(r.rewrites), f"{r.nodes_before} -> {r.nodes_after}", summary)
    console.print(passes)
