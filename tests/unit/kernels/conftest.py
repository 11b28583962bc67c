"""The wheel, built once for the kernel tests that read it (package data, the compile)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.paths import ROOT


def clean_copy(src: Path) -> Path:
    """The checkout's tracked and new (not ignored) files copied into `src`, as a fresh clone
    would have them plus the work not yet committed."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    return src


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a clean copy of the checkout: a build/ or *.egg-info left by an
    earlier build or an editable install would still hold files the package data misses."""
    src, out = clean_copy(tmp_path_factory.mktemp("src")), tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k != "BERTFUSE_BUILD_KERNELS"}  # pure Python
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                           str(out), str(src)], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (built,) = out.glob("bertfuse-*.whl")
    return built


@pytest.fixture(scope="session")
def wheel_files(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())
