"""The run report of convert / optimize / verify: each stage timed and counted, then the
passes' and the parity check's own reports (printed by cli/render.py, JSON for --json)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Callable, Iterator

from bertfuse.io.safety import pause_point
from bertfuse.io.stale import scratch_beside
from bertfuse._version import __version__

if TYPE_CHECKING:  # types only: this module loads neither onnx nor the passes
    from bertfuse.passes.manager import PipelineReport
    from bertfuse.pipeline.parity import ParityReport


# The JSON run report's layout (docs/json-reports.md): bumped when a field changes meaning
# or goes away; new fields may appear without a bump.
SCHEMA_VERSION = 1


def tool_versions() -> dict[str, str | None]:
    """The versions that made a report: installed packages (read from their metadata, so
    nothing is imported for it) and TensorFlow only where this process loaded it."""
    def installed(*dists: str) -> str | None:
        for dist in dists:
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return None

    tf = sys.modules.get("tensorflow")
    return {"bertfuse": __version__, "tf2onnx": installed("tf2onnx"), "onnx": installed("onnx"),
            "onnxruntime": installed("onnxruntime", "onnxruntime-gpu"),
            "tensorflow": getattr(tf, "__version__", None) if tf is not None else None}


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
    outputs: list[dict] = field(default_factory=list)  # convert: TFSource.output_table()
    notes: list[str] = field(default_factory=list)  # what loading the source changed
    output: str | None = None
    written: bool = False
    command: str = ""  # convert | optimize | verify
    options: dict = field(default_factory=dict)  # the options the run used (options.OPTIONS)
    text: dict | None = None  # a text-in source: its tokenizer cut off (text_parity.describe)
    fp8: dict | None = None  # FP8's accuracy in user terms and its gate (lowering.py, fp8_gate.py)

    @contextmanager
    def stage(self, name: str, status: Callable[[str], None] | None = None) -> Iterator[Stage]:
        if status:
            status(name)
        pause_point(name)  # a no-op outside tests (bertfuse/io/safety.py)
        st = Stage(name)
        start = time.perf_counter()
        try:
            with scratch_beside(self.output):  # scratch copies beside the output only
                yield st
        finally:
            st.seconds = round(time.perf_counter() - start, 3)
            self.stages.append(st)

    def to_json(self) -> dict:
        """The documented JSON report (docs/json-reports.md); bump SCHEMA_VERSION in
        this module when a field changes meaning or goes away."""
        return {
            "schema_version": SCHEMA_VERSION,
            "command": self.command,
            "tools": tool_versions(),
            "output": self.output,
            "written": self.written,
            "stages": [s.__dict__ for s in self.stages],
            "original_names": self.original_names,
            "outputs": self.outputs,
            "notes": self.notes,
            "options": self.options,
            "passes": self.passes.to_json() if self.passes else None,
            "parity": self.parity.to_json() if self.parity else None,
            **({"text": self.text} if self.text else {}),
            **({"fp8": self.fp8} if self.fp8 else {}),
        }
