"""The harness of the hostile-input tests (test_hostile.py, test_hostile_runtime.py): the
library of inputs, a private workspace per case, snapshots, and the outcome checks."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from support.hostile_cases import DROP, LIBRARY

# onnxruntime (native code) may leave its 51-byte session id file `.ses` in TMPDIR; not ours.
ORT_TMP_FILES = {".ses"}

# ------------------------------------------------------------------------------ library

def _tamper(src: Path, dst: Path, name: str, value: float) -> None:
    model = onnx.load(str(src))
    for t in model.graph.initializer:
        if t.name == name:
            arr = numpy_helper.to_array(t).copy()
            arr[...] = value
            t.CopyFrom(numpy_helper.from_array(arr, name))
            break
    else:
        raise AssertionError(f"no initializer {name}")
    onnx.save(model, str(dst))


def _tamper_graph(src: Path, dst: Path, how: str, arg) -> None:
    """A structurally damaged copy: 'external' (the word table's bytes said to live at `arg`),
    'dims' (its dims no longer match its bytes), 'cycle' (a node reads a later node's output),
    'dup_output' (two nodes write one name)."""
    model = onnx.load(str(src))
    g = model.graph
    table = next(t for t in g.initializer if t.name == "embeddings_word")
    if how == "external":
        table.ClearField("raw_data")
        table.data_location = TensorProto.EXTERNAL
        table.external_data.add(key="location", value=arg)
    elif how == "dims":
        table.dims[:] = arg
    elif how == "cycle":
        g.node[1].input[0] = g.node[5].output[0]
    elif how == "dup_output":
        g.node[2].output[0] = g.node[4].output[0]
    onnx.save(model, str(dst))


def _toy_model(path: Path) -> None:
    """A valid ONNX model that is no BERT: Gather + Relu, output 'y'."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "input_ids"], ["g"]),
         helper.make_node("Relu", ["g"], ["y"])], "toy",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(np.random.default_rng(2).random((50, 8), np.float32), "emb")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))




def derive_models(fused: Path, lib: dict[str, Path]) -> None:
    """The inputs made from the fused model: summary, skeleton, NaN/Inf weights, a toy."""
    from bertfuse.inspect.summary import dumps, summarize
    from bertfuse.io.model import load_model, save_model
    from bertfuse.runtime.weights import strip_weights

    lib["summary"].write_text(dumps(summarize(str(fused))))
    model = load_model(str(fused))
    strip_weights(model)
    save_model(model, lib["skel"])
    _tamper(fused, lib["nan"], "embeddings_word", np.nan)
    _tamper(fused, lib["inf"], "w/bert/pooler/dense/bias", np.inf)
    _toy_model(lib["toy"])


# ---------------------------------------------------------------------------- workspace


def digest(root: Path) -> dict[str, str]:
    """Relative path -> content hash and mode (files), link target, or kind: every entry."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            full = Path(dirpath) / name
            st = os.lstat(full)
            rel = str(full.relative_to(root))
            if stat.S_ISREG(st.st_mode):
                out[rel] = f"{oct(st.st_mode)} {hashlib.sha256(full.read_bytes()).hexdigest()}"
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = "-> " + os.readlink(full)
            else:
                out[rel] = oct(stat.S_IFMT(st.st_mode))
    return out


class Workspace:
    """A case's private directory; library inputs are copied in on first mention."""

    def __init__(self, root: Path, lib: dict[str, Path]) -> None:
        self.root, self.lib = root, lib

    def fmt(self, token: str) -> str:
        return re.sub(r"\{([^{}]+)\}", lambda m: str(self.path(m.group(1))), token)

    def path(self, name: str) -> Path:
        if name == "w":
            return self.root
        if name == "out":
            return self.root / "out.onnx"
        if name in LIBRARY:
            dst = self.root / LIBRARY[name]
            if not os.path.lexists(dst):
                src = self.lib[name]
                (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
            return dst
        return self.root / name

    def resolve(self, name: str) -> Path:
        return Path(self.fmt(name)) if "{" in name else self.root / name

    def setup(self, steps: tuple[tuple, ...]) -> None:
        for op, name, *args in steps:
            path = self.resolve(name)
            if op == "file":
                data = args[0].encode() if isinstance(args[0], str) else args[0]
                path.write_bytes(data)
            elif op == "mkdir":
                path.mkdir()
            elif op == "fifo":
                os.mkfifo(path)
            elif op == "rm":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            elif op == "link":
                path.symlink_to(self.fmt(args[0]))
            elif op == "hard":
                os.link(self.fmt(args[0]), path)
            elif op == "trunc":
                path.write_bytes(Path(self.fmt(args[0])).read_bytes()[:args[1]])
            elif op == "copy":
                src = Path(self.fmt(args[0]))
                (shutil.copytree if src.is_dir() else shutil.copy)(src, path)
            elif op == "cfg":
                self._config(path, args[0])
            elif op == "meta":
                src, key, value = args
                model = onnx.load(self.fmt(src))
                props = [p for p in model.metadata_props if p.key != key]
                del model.metadata_props[:]
                model.metadata_props.extend(props)
                if value is not None:
                    model.metadata_props.add(key=key, value=value)
                onnx.save(model, str(path))
            elif op == "tamper":
                _tamper_graph(Path(self.fmt(args[0])), path, args[1], args[2])
            else:
                raise AssertionError(f"unknown set-up step {op}")

    def _config(self, path: Path, edit) -> None:
        if not isinstance(edit, dict):
            path.write_bytes(edit.encode() if isinstance(edit, str) else edit)
            return
        cfg = json.loads((self.lib["ckpt"] / "bert_config.json").read_text())
        for key, value in edit.items():
            if value is DROP:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        path.write_text(json.dumps(cfg))


# A finished stage's progress line on a pipe (runtime/progress.py's StageLines): ours, not
# noise; the outcome is judged on the other lines.
PROGRESS = re.compile(r"^bertfuse [\w -]+: (.+ \d+\.\ds \(\d+\.\ds in all\)|  \S+: .*)$")


def error_lines(err: str) -> list[str]:
    """stderr's lines less the progress lines."""
    return [ln for ln in err.splitlines() if ln.strip() and not PROGRESS.match(ln)]


def assert_clean_outcome(rc: int, out: str, err: str, code: int, needle: str | None) -> None:
    lines = error_lines(err)
    assert "Traceback" not in err + out, err
    assert rc == code, f"exit {rc}, expected {code}; stderr:\n{err}"
    if code == 0:
        assert lines == [], err
    elif code == 1:  # parity/policy: the report says why; convert adds one stderr line
        assert len(lines) <= 1, err
        if needle:
            assert needle in err + out, (needle, err, out[-2000:])
    else:
        assert len(lines) == 1, f"expected one stderr line, got:\n{err}"
        if needle:
            assert needle in lines[0], (needle, lines[0])


def assert_nothing_left(before: dict[str, str], after: dict[str, str], creates: set[str],
                        tmpdir: Path) -> None:
    changed = {k for k in before if after.get(k) != before[k]}
    assert not changed, f"changed or removed: {sorted(changed)}"
    added = {k for k in set(after) - set(before)
             if not any(k == c or k.startswith(c + os.sep) or c.startswith(k + os.sep)
                        for c in creates)}
    assert not added, f"left behind: {sorted(added)}"
    for c in creates:
        assert c in after, f"{c} was not written"
    left = {p.name for p in tmpdir.iterdir()} - ORT_TMP_FILES
    assert not left, f"left in TMPDIR: {sorted(left)}"
