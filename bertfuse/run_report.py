"""The run report of convert / optimize / verify: each stage timed and counted, then the
passes' and the parity check's own reports (printed by report.py, JSON for --json)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from bertfuse.safety import pause_point

if TYPE_CHECKING:  # types only: this module loads neither onnx nor the passes
    from bertfuse.passes.manager import PipelineReport
    from bertfuse.verify import ParityReport


@dataclass
class Stage:
    name: str
    seconds: float = 0.0
    nodes: int | None = None
    detail: str = ""


@dataclass
class RunReport:
    stages: list[Stage] = field(default_factory=list)
    passes: PipelineReport | None = None
    parity: ParityReport | None = None
    original_names: dict[str, str] = field(default_factory=dict)
    output: str | None = None
    written: bool = False
    command: str = ""  # convert | optimize | verify

    @contextmanager
    def stage(self, name: str, status: Callable[[str], None] | None = None) -> Iterator[Stage]:
        if status:
            status(name)
        pause_point(name)  # a no-op outside tests (bertfuse/safety.py)
        st = Stage(name)
        start = time.perf_counter()
        try:
            yield st
        finally:
            st.seconds = round(time.perf_counter() - start, 3)
            self.stages.append(st)

    def to_json(self) -> dict:
        """The documented JSON report (README, "JSON reports"); bump SCHEMA_VERSION in
        report.py when a field changes meaning or goes away."""
        from bertfuse.report import SCHEMA_VERSION, tool_versions

        return {
            "schema_version": SCHEMA_VERSION,
            "command": self.command,
            "tools": tool_versions(),
            "output": self.output,
            "written": self.written,
            "stages": [s.__dict__ for s in self.stages],
            "original_names": self.original_names,
            "passes": self.passes.to_json() if self.passes else None,
            "parity": self.parity.to_json() if self.parity else None,
        }
