"""Every script in examples/ runs, as a user would run it, on tiny models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

EXAMPLES = sorted(p.name for p in (ROOT / "examples").iterdir() if p.suffix in (".sh", ".py"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "BIN": str(Path(sys.executable).parent),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = ["bash", f"examples/{name}"] if name.endswith(".sh") else \
        [sys.executable, f"examples/{name}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
