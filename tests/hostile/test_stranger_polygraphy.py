"""Polygraphy JSON files from someone else (io/polygraphy.py): an .npy header inside one may
declare any shape and a payload may be a pickle. Each is refused in one line naming the
file and the array (exit 2), in a child whose peak RSS and time are measured (as
test_stranger_files.py does), and a pickle is never unpickled."""

from __future__ import annotations

import base64
import copy
import io
import json
import struct
from pathlib import Path

import numpy as np

from hostile.test_stranger_files import MAX_RSS_MB, MAX_SECONDS, run_cli
from support.polygraphy_files import POLY, tiny_model


def _npy(array: np.ndarray, allow_pickle: bool = False) -> str:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return base64.b64encode(buf.getvalue()).decode()


def _inputs_with(tmp: Path, name: str, payload: str) -> Path:
    feeds = json.loads((POLY / "inputs.json").read_text())
    feeds[0]["input_ids"]["array"] = payload
    path = tmp / name
    path.write_text(json.dumps(feeds))
    return path


def _verify(tmp: Path, inputs: Path, outputs: Path = POLY / "outputs.json"):
    return run_cli(["verify", tiny_model(tmp), "--load-inputs", inputs,
                    "--load-outputs", outputs], tmp)


def test_an_npy_header_declaring_a_terabyte_is_refused_before_numpy_reads_it(tmp_path):
    raw = base64.b64decode(json.loads((POLY / "inputs.json").read_text())[0]["input_ids"]["array"])
    header = raw[10:struct.unpack("<H", raw[8:10])[0] + 10].decode("latin-1")
    edited = header.replace("(2, 8)", f"({1 << 40},)").ljust(len(header) - 1) + "\n"
    bomb = raw[:10] + edited.encode("latin-1")[:len(header)] + raw[10 + len(header):]
    path = _inputs_with(tmp_path, "bomb.json", base64.b64encode(bomb).decode())
    run = _verify(tmp_path, path)
    assert run.code == 2
    line = run.line()
    assert f"--load-inputs {path}: 'input_ids'" in line and f"({1 << 40},)" not in line, line
    assert "declares shape [1099511627776] int32" in line, line
    assert run.rss_mb < MAX_RSS_MB and run.seconds < MAX_SECONDS


class _Opens:  # unpickling this creates the marker file: proof that a pickle was run
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickled_array_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    payload = _npy(np.array([_Opens(str(marker))], dtype=object), allow_pickle=True)
    run = _verify(tmp_path, _inputs_with(tmp_path, "pickle.json", payload))
    assert run.code == 2
    assert "'input_ids' holds Python objects (a pickle)" in run.line()
    assert not marker.exists()


def test_results_of_two_runners_are_refused_naming_them(tmp_path):
    results = json.loads((POLY / "outputs.json").read_text())
    other = copy.deepcopy(results["lst"][0])
    other[0] = "trt-runner-N0"
    results["lst"].append(other)
    path = tmp_path / "two.json"
    path.write_text(json.dumps(results))
    run = _verify(tmp_path, POLY / "inputs.json", path)
    assert run.code == 2
    line = run.line()
    assert f"--load-outputs {path}: 2 runners" in line and "trt-runner-N0" in line, line
