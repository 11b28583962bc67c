"""The `all-cpu` and `all-gpu` extras (pyproject.toml) and the Makefile's checks of EXTRAS.

all-cpu is the common case in one install (convert with tensorflow-cpu, run on onnxruntime,
serve and score on Ray, text); all-gpu the same with onnxruntime-gpu. The Makefile installs
all-cpu by default and spells both out (ALL) for its checks: cpu with gpu, or tf with tf-cpu,
is refused before anything is installed, with the all- extras too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest
from packaging.requirements import Requirement
from support import paths

EXTRAS = tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"]
MAKEFILE = (paths.ROOT / "Makefile").read_text()


def _expand(extra: str) -> set[str]:
    """The requirements an extra brings, its references to bertfuse's own extras followed."""
    out = set()
    for line in EXTRAS[extra]:
        req = Requirement(line)
        if req.name == "bertfuse":
            for sub in req.extras:
                out |= _expand(sub)
        else:
            out.add(str(req))
    return out


@pytest.mark.parametrize("extra, ort, parts", [
    ("all-cpu", "onnxruntime", ("tf-cpu", "cpu", "text", "ray")),
    ("all-gpu", "onnxruntime-gpu", ("tf-cpu", "gpu", "text", "ray"))])
def test_all_extras_are_the_common_case_in_one(extra, ort, parts):
    reqs = _expand(extra)
    assert reqs == set().union(*(_expand(p) for p in parts)), reqs
    names = {Requirement(r).name for r in reqs}
    assert {"tensorflow-cpu", "tf2onnx", ort, "ray", "tokenizers"} <= names, names
    assert not names & ({"tensorflow", "onnxruntime", "onnxruntime-gpu"} - {ort}), names
    # The Makefile spells it out the same way for its checks.
    spelled = re.search(rf"s/{extra}/([^/]+)/", MAKEFILE)
    assert spelled and tuple(spelled.group(1).split(",")) == parts, spelled


def test_the_makefile_default_installs_what_it_did():
    default = re.search(r"^EXTRAS \?= (\S+)$", MAKEFILE, re.M).group(1).split(",")
    assert "all-cpu" in default and "test" in default, default
    assert _expand("all-cpu") | _expand("test") == set().union(
        *(_expand(p) for p in ("tf-cpu", "cpu", "text", "ray", "test")))


def _make(tmp_path, extras: str, python: str) -> subprocess.CompletedProcess:
    """The Makefile's install step in a stand-in venv whose python is `python`: the checks
    run before pip does."""
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").write_text(f"#!/bin/sh\n{python}\n")
    (venv / "bin" / "python").chmod(0o755)
    return subprocess.run(["make", "-s", "-C", str(paths.ROOT), f"VENV={venv}",
                           f"EXTRAS={extras}", f"{venv}/.bertfuse-installed"],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("extras, said", [
    ("all-cpu,gpu", "pick cpu or gpu"), ("gpu,cpu", "pick cpu or gpu"),
    ("all-gpu,all-cpu", "pick cpu or gpu"), ("tf-cpu,gpu,cpu", "pick cpu or gpu"),
    ("all-gpu,tf", "pick tf or tf-cpu"), ("tf-cpu,tf,cpu", "pick tf or tf-cpu")])
def test_the_makefile_refuses_both_of_a_pair(tmp_path, extras, said):
    proc = _make(tmp_path, extras, "exit 1")
    assert proc.returncode != 0 and f"EXTRAS={extras}: {said}, not both" in proc.stderr, \
        proc.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("extras, other", [("all-cpu,test", "onnxruntime-gpu"),
                                           ("all-gpu", "onnxruntime")])
def test_the_makefile_refuses_the_other_onnxruntime_already_there(tmp_path, extras, other):
    proc = _make(tmp_path, extras, "exit 0")  # `pip show` says it is installed
    assert proc.returncode != 0 and f"already has {other};" in proc.stderr, proc.stderr
