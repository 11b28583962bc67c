"""The Polygraphy fixtures (tests/fixtures/polygraphy): Polygraphy's own files are committed;
the tiny model they were written for is rebuilt from build_polygraphy.py (seeded, so the same
weights), as .onnx files are not committed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx

from support.paths import FIXTURES

POLY = FIXTURES / "polygraphy"


def tiny_model(directory: Path) -> Path:
    spec = importlib.util.spec_from_file_location("build_polygraphy",
                                                  POLY / "build_polygraphy.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    path = directory / "tiny.onnx"
    onnx.save(builder.tiny_model(), path)
    return path
