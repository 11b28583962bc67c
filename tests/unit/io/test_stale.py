"""The sweep of a killed run's temporaries (bertfuse/io/stale.py), on real processes: what it
removes is exactly what a gone process of this host left under bertfuse's names, in the output's
folder and in the system temp folder alike. (The CLI's kill -9 cases are in
tests/hostile/test_stranger_temps.py.)"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from bertfuse.io import stale
from bertfuse.io.safety import temp_dir, temp_file
from bertfuse.ray_cluster import process_start


def _gone_process() -> tuple[int, str]:
    """The pid and start time of a process that has ended."""
    proc = subprocess.Popen(["sleep", "30"])
    start = process_start(proc.pid)  # as the tag has it
    proc.kill()
    proc.wait()
    return proc.pid, start


def test_a_gone_process_temps_go_links_and_others_stay(tmp_path):
    space = stale.tag().split("-")[1]
    pid, start = _gone_process()
    dead = f"bertfuse-{space}-{pid}-{start}-"
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / f".m.onnx.{dead}abcdefgh.tmp").write_bytes(b"x" * 1000)
    (folder / f".{dead}check-abcdefgh").mkdir()
    (folder / f".{dead}check-abcdefgh" / "model.onnx").write_bytes(b"x")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (folder / f".m.onnx.{dead}linklink.tmp").symlink_to(victim)  # a link: never followed
    (folder / "m.onnx").write_text("the user's model")
    with temp_file(folder / "m.onnx") as tmp:  # a writer there sweeps first
        assert stale.tag() in tmp.name and tmp.name.endswith(".tmp")
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            [f".m.onnx.{dead}linklink.tmp", "m.onnx", tmp.name])
    assert victim.read_text() == "keep"


def test_the_system_temp_folder_is_swept_by_a_run_that_writes_there(tmp_path, monkeypatch):
    """verify (no output) keeps its scratch copy in TMPDIR: a killed one's goes there too."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    space = stale.tag().split("-")[1]
    pid, start = _gone_process()
    left = tmp_path / f"bertfuse-{space}-{pid}-{start}-verify-abcdefgh"
    left.mkdir()
    look_alike = tmp_path / "bertfuse-verify-abcdefgh"  # no process in its name
    look_alike.mkdir()
    with temp_dir(prefix="bertfuse-verify-") as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(stale.tag() + "verify-")
        assert not left.exists() and look_alike.exists()


def test_scratch_goes_beside_the_output_in_its_block_only(tmp_path):
    from bertfuse.io.safety import scratch_dir

    with stale.scratch_beside(tmp_path / "model.onnx"):
        with scratch_dir("bertfuse-check-") as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith("." + stale.tag() + "check-")
    with scratch_dir("bertfuse-check-") as tmp:
        assert tmp.parent == Path(tempfile.gettempdir())
    assert os.listdir(tmp_path) == []
