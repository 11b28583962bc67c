"""Rich rendering of run reports (stage table, per-layer fusion table, parity)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from bertfuse.pipeline import RunReport


def print_report(report: RunReport, console: Console) -> None:
    if report.original_names:
        names = ", ".join(f"{k} <- {v}" for k, v in report.original_names.items() if k != v)
        if names:
            console.print(f"[dim]original names:[/dim] {names}")
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
    if report.parity is not None:
        par = Table(title=f"parity vs TensorFlow ({report.parity.precision}, batch "
                          f"{report.parity.batch}, seq {report.parity.seq}, padded)")
        par.add_column("output")
        par.add_column("max |diff|", justify="right")
        par.add_column("mean |diff|", justify="right")
        par.add_column("")
        for o in report.parity.outputs:
            par.add_row(o.name, f"{o.max_abs:.3g}", f"{o.mean_abs:.3g}",
                        "[green]ok[/green]" if o.ok else "[red]FAIL[/red]")
        console.print(par)
    if report.written:
        console.print(f"wrote [bold]{report.output}[/bold]")


def _print_passes(report: RunReport, console: Console) -> None:
    passes = Table(title="passes")
    passes.add_column("pass")
    passes.add_column("rewrites", justify="right")
    passes.add_column("nodes", justify="right")
    passes.add_column("op changes")
    for r in report.passes.records:
        delta = ", ".join(f"{op} {d:+d}" for op, d in r.delta.items())
        passes.add_row(r.name, str(r.rewrites), f"{r.nodes_before} -> {r.nodes_after}",
                       delta[:120])
    console.print(passes)
