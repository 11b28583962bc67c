"""ONNX models from someone else: every command refuses, in one line naming the tensor or node
and the path or limit (exit 2), a model whose external data leads outside its folder, whose
graph is not a graph (cycle, dangling input, a name written twice), or whose node count or
declared sizes are past bertfuse's limits; before anything is copied, rewritten or allocated,
and `serve`/`score` before Ray starts.

The models are made here with onnx's helper (a table lookup with the three canonical inputs,
its table as external data), so no TensorFlow is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bertfuse.cli import main
from bertfuse.io.onnx_in import LIMITS
from support import peak_rss

TABLE = np.arange(64, dtype=np.float32).reshape(16, 4)
ROLES = ("input_ids", "input_mask", "segment_ids")


def _model(nodes, inits=(), ins=None, outs=None) -> onnx.ModelProto:
    ins = ins or [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", "seq"])
                  for n in ROLES]
    outs = outs or [helper.make_tensor_value_info("pooled_output", TensorProto.FLOAT,
                                                  ["batch", 4])]
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs, initializer=list(inits)),
                             opset_imports=[helper.make_opsetid("", 17)])


def _lookup(folder: Path, location: str, length: int = TABLE.nbytes,
            dims: tuple = TABLE.shape) -> Path:
    """FOLDER/model.onnx: input_ids -> the word table (external, at `location`) -> mean."""
    folder.mkdir(parents=True, exist_ok=True)
    table = TensorProto(name="word_embeddings", data_type=TensorProto.FLOAT, dims=list(dims),
                        data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        table.external_data.add(key=key, value=value)
    nodes = [helper.make_node("Gather", ["word_embeddings", "input_ids"], ["seq"], name="lookup"),
             helper.make_node("ReduceMean", ["seq"], ["pooled_output"], axes=[1], keepdims=0,
                              name="pool")]
    path = folder / "model.onnx"
    onnx.save(_model(nodes, [table]), path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stranger")
    (root / "secret.bin").write_bytes(TABLE.tobytes())
    m = {"root": root}
    m["symlink"] = _lookup(root / "symlink", "w.bin")
    os.symlink("../secret.bin", root / "symlink" / "w.bin")  # w.bin -> ../secret.bin
    m["absolute"] = _lookup(root / "absolute", str(root / "secret.bin"))
    m["dotdot"] = _lookup(root / "dotdot", "../secret.bin")
    m["missing"] = _lookup(root / "missing", "w.bin")
    m["past_end"] = _lookup(root / "past_end", "w.bin", length=TABLE.nbytes + 4096)
    (root / "past_end" / "w.bin").write_bytes(TABLE.tobytes())
    m["short"] = _lookup(root / "short", "w.bin", dims=(4096, 4))  # 64 KB declared, 256 held
    (root / "short" / "w.bin").write_bytes(TABLE.tobytes())
    m["inside"] = _lookup(root / "inside", "w.bin")  # a link that stays in the folder: fine
    (root / "inside" / "data").mkdir()
    (root / "inside" / "data" / "w.bin").write_bytes(TABLE.tobytes())
    os.symlink("data/w.bin", root / "inside" / "w.bin")

    def save(name: str, model: onnx.ModelProto) -> None:
        onnx.save(model, root / f"{name}.onnx")
        m[name] = root / f"{name}.onnx"

    table = numpy_helper.from_array(TABLE, "word_embeddings")
    gather = helper.make_node("Gather", ["word_embeddings", "input_ids"], ["a"], name="lookup")
    pool = helper.make_node("ReduceMean", ["c"], ["pooled_output"], axes=[1], keepdims=0,
                            name="pool")
    # a -> first (Add a, b) -> c -> second (Relu) -> b: a cycle
    save("cycle", _model([gather, helper.make_node("Add", ["a", "b"], ["c"], name="first"),
                          helper.make_node("Relu", ["c"], ["b"], name="second"), pool], [table]))
    save("dangling", _model([gather, helper.make_node("Add", ["a", "ghost"], ["c"], name="add"),
                             pool], [table]))
    save("twice", _model([gather, helper.make_node("Relu", ["a"], ["c"], name="one"),
                          helper.make_node("Neg", ["a"], ["c"], name="other"), pool], [table]))
    # 2^40 elements declared, 16 bytes held
    huge = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**20, 2**20],
                       raw_data=bytes(16))
    save("absurd", _model([gather, helper.make_node("Add", ["a", "w"], ["c"], name="add"), pool],
                          [table, huge]))
    absurd_input = _model([gather, helper.make_node("Relu", ["a"], ["c"], name="r"), pool], [table])
    absurd_input.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2**40
    save("absurd_input", absurd_input)
    n = 100_000  # a 3 MB file
    chain = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"n{i}") for i in range(n)]
    save("chain", helper.make_model(helper.make_graph(
        chain, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, ["B", 4])]),
        opset_imports=[helper.make_opsetid("", 17)]))
    return m


def _refused(capsys, argv: list) -> str:
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    return lines[0]


def _argv(command: str, model: Path, out: Path) -> list:
    return {"inspect": ["inspect", model],
            "optimize": ["optimize", model, "-o", out / "o.onnx"],
            "verify": ["verify", model, "--against", model.parent],
            "export-triton": ["export-triton", model, "-o", out / "repo"],
            "strip-weights": ["strip-weights", model, "-o", out / "s.onnx"],
            "diff": ["diff", model, model]}[command]


# ----------------------------------------------------------------------- external data


@pytest.mark.parametrize("command", ["export-triton", "optimize", "verify", "inspect", "diff",
                                     "strip-weights"])
def test_symlinked_external_data_is_refused(models, tmp_path, capsys, command):
    """w.bin -> ../secret.bin: the real path leaves the folder; nothing is read or copied."""
    line = _refused(capsys, _argv(command, models["symlink"], tmp_path))
    assert "'word_embeddings'" in line and "'w.bin'" in line and "outside the model's folder" \
        in line and str(models["root"] / "secret.bin") in line, line
    assert list(tmp_path.iterdir()) == []  # no repository, no output


@pytest.mark.parametrize("case, needle", [
    ("absolute", "absolute path"), ("dotdot", "'..'"), ("missing", "missing"),
    ("past_end", "which has 256"), ("short", "(65536 bytes), but its external data holds 256")])
@pytest.mark.parametrize("command", ["export-triton", "optimize"])
def test_bad_external_data_names_the_tensor(models, tmp_path, capsys, command, case, needle):
    line = _refused(capsys, _argv(command, models[case], tmp_path))
    assert "'word_embeddings'" in line and needle in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_link_inside_the_folder_is_followed(models, tmp_path, capsys):
    """w.bin -> data/w.bin stays inside: exported under the name the model gives it."""
    import onnxruntime as ort

    assert main(["export-triton", str(models["inside"]), "-o", str(tmp_path / "repo")]) == 0
    capsys.readouterr()
    version = tmp_path / "repo" / "model" / "1"
    assert (version / "w.bin").read_bytes() == TABLE.tobytes()
    ids = np.array([[1, 2, 3]], np.int32)
    feeds = {"input_ids": ids, "input_mask": ids * 0 + 1, "segment_ids": ids * 0}
    got = ort.InferenceSession(str(version / "model.onnx"),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.allclose(got, TABLE[[1, 2, 3]].mean(axis=0))


def _run(argv: list, tmp: Path, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """bertfuse in a child with a private TMPDIR and Ray temp dir; (result, wall seconds)."""
    env = {**os.environ, "TMPDIR": str(tmp / "tmp"), "RAY_TMPDIR": str(tmp / "ray")}
    (tmp / "tmp").mkdir(exist_ok=True)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bertfuse", *map(str, argv)], env=env,
                          cwd=tmp, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, \
        (proc.returncode, proc.stderr[-3000:])
    return lines[0]


@pytest.mark.parametrize("command", ["serve", "score"])
def test_serve_and_score_refuse_before_ray(models, tmp_path, command):
    """The model is checked with the config: Ray never starts (no session in RAY_TMPDIR)."""
    model = models["symlink"]
    if command == "serve":
        import socket

        with socket.socket() as s:  # a free port, in case it got as far as binding one
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = ["serve", model, "--device", "cpu", "--host", "127.0.0.1", "--port", port]
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"input_ids": [[1, 2, 3]]}), tmp_path / "in.parquet")
        argv = ["score", "--model", model, "--input", tmp_path / "in.parquet", "--output",
                tmp_path / "scored", "--ids-column", "input_ids", "--device", "cpu"]
    proc, wall = _run(argv, tmp_path, timeout=90)
    line = _one_line(proc)
    assert "'word_embeddings'" in line and "outside the model's folder" in line, line
    assert not (tmp_path / "ray").exists() and not (tmp_path / "scored").exists()
    assert wall < 30, wall


# ------------------------------------------------------------------------------ graph


@pytest.mark.parametrize("command", ["export-triton", "optimize", "inspect"])
def test_a_cycle_is_refused(models, tmp_path, capsys, command):
    line = _refused(capsys, _argv(command, models["cycle"], tmp_path))
    assert "cycle through node 'first' (Add)" in line or \
        "cycle through node 'second' (Relu)" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case, needle", [
    ("dangling", "node 'add' (Add) reads 'ghost'"),
    ("twice", "node 'other' (Neg) writes 'c', which node 'one' (Relu) writes too")])
@pytest.mark.parametrize("command", ["export-triton", "optimize"])
def test_a_broken_graph_is_refused(models, tmp_path, capsys, command, case, needle):
    line = _refused(capsys, _argv(command, models[case], tmp_path))
    assert needle in line, line
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ limits


def test_a_100k_node_chain_is_refused_at_once(models, tmp_path):
    """A 3 MB file of 100,000 Relu: optimize took minutes; refused from the node count."""
    proc, wall = _run(["optimize", models["chain"], "-o", tmp_path / "o.onnx"], tmp_path,
                      timeout=120)
    line = _one_line(proc)
    assert f"100000 nodes or more, past bertfuse's limit of {LIMITS['nodes']}" in line, line
    assert wall < 30, wall
    assert not (tmp_path / "o.onnx").exists()


_ABSURD = {
    "absurd": f"initializer 'w' declares 1099511627776 elements, past bertfuse's limit of "
              f"{LIMITS['tensor elements']}",
    "absurd_input": f"input 'input_ids' declares dim 1099511627776, outside [0, "
                    f"{LIMITS['dim']}]"}


@pytest.mark.parametrize("command, case", [("export-triton", "absurd"), ("optimize", "absurd"),
                                           ("inspect", "absurd_input")])
def test_an_absurd_declared_size_is_refused_in_bounded_memory(models, tmp_path, command, case):
    """2^40 elements declared in a file of a few hundred bytes: refused from the proto."""
    argv = [str(a) for a in _argv(command, models[case], tmp_path)]
    env = {**os.environ, "TMPDIR": str(tmp_path), peak_rss.ENV: str(tmp_path / ".peak")}
    proc = subprocess.run([sys.executable, *peak_rss.wrapped(["-m", "bertfuse", *argv])],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    line = _one_line(proc)
    assert _ABSURD[case] in line, line
    rss_kb = peak_rss.peak_kb(tmp_path / ".peak")  # the child's own (support/peak_rss.py)
    assert rss_kb is not None and rss_kb < 1_000_000, rss_kb  # the import: a few hundred MB
    assert not (tmp_path / "repo").exists() and not (tmp_path / "o.onnx").exists()
