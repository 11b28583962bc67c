"""bertfuse/io/ort.py: make_session, the one place an ONNX Runtime session is opened: its
options (log severity, optimisation, config entries), providers, the op library's refusal on
the CPU, and models as paths, bytes or ModelProtos (past 2 GB via io.model.scratch_file)."""

from __future__ import annotations

import subprocess
import sys

import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ort = pytest.importorskip("onnxruntime")

from bertfuse.io import model as modelio  # noqa: E402
from bertfuse.io.ort import make_session  # noqa: E402
from bertfuse.kernels.library import KernelLibraryError  # noqa: E402
from bertfuse.ops.bertfuse import dense  # noqa: E402
from support.paths import ROOT  # noqa: E402


def _matmul(n: int = 4) -> onnx.ModelProto:
    w = np.arange(3 * n, dtype=np.float32).reshape(3, n)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
                          initializer=[onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def recorded(monkeypatch) -> list:
    """InferenceSession replaced by a recorder of (model, options, providers)."""
    calls: list = []
    def record(model, opts, providers):
        calls.append((model, opts, providers))
        names = [p[0] if isinstance(p, tuple) else p for p in providers]
        return types.SimpleNamespace(get_providers=lambda: names)

    monkeypatch.setattr(ort, "InferenceSession", record)
    return calls


def test_opens_paths_bytes_and_protos_on_the_cpu(tmp_path):
    model = _matmul()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    x = np.ones((2, 3), np.float32)
    want = x @ onnx.numpy_helper.to_array(model.graph.initializer[0])
    for form in (path, str(path), model.SerializeToString(), model):
        sess = make_session(form)
        assert sess.get_providers() == ["CPUExecutionProvider"]
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want)


def test_options_and_providers(recorded, tmp_path):
    make_session(b"m")
    _, opts, providers = recorded[-1]
    assert opts.log_severity_level == 3 and providers == ["CPUExecutionProvider"]
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert opts.intra_op_num_threads == 0  # ORT's default pool unless asked
    make_session(b"m", intra_op_threads=1)
    assert recorded[-1][1].intra_op_num_threads == 1
    make_session(b"m", optimize=False, log_severity=4,
                 config={"session.disable_cpu_ep_fallback": "1"},
                 optimized_model_path=tmp_path / "placed.onnx")
    _, opts, _ = recorded[-1]
    assert opts.log_severity_level == 4
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert opts.get_session_config_entry("session.disable_cpu_ep_fallback") == "1"
    assert opts.optimized_model_filepath == str(tmp_path / "placed.onnx")
    make_session(b"m", device="cuda", cuda_options={"enable_cuda_graph": "1"})
    assert recorded[-1][2] == [("CUDAExecutionProvider", {"enable_cuda_graph": "1"})]
    make_session(b"m", device="cuda")
    assert recorded[-1][2] == [("CUDAExecutionProvider", {})]
    with pytest.raises(ValueError, match="device"):
        make_session(b"m", device="gpu")


def test_ai_bertfuse_model_on_the_cpu_is_refused_before_ort(recorded):
    """The op library's own line (kernels/library.py), as the runtime and verify give it."""
    model = dense.make_model("DenseBias", ("B", "S", 8), 4)
    for form in (model, model.SerializeToString()):
        with pytest.raises(KernelLibraryError, match="only on a CUDA GPU.*--ops contrib"):
            make_session(form)
        with pytest.raises(KernelLibraryError, match="only on a CUDA GPU"):
            make_session(form, register_kernels=True)
    assert recorded == []  # refused before any session
    make_session(model, register_kernels=False)  # left to ORT (here: the recorder)
    assert len(recorded) == 1


def test_missing_op_library_on_cuda_is_one_line(recorded, tmp_path):
    model = dense.make_model("DenseBias", ("B", "S", 8), 4)
    with pytest.raises(KernelLibraryError, match="does not exist"):
        make_session(model, device="cuda", kernels_library=tmp_path / "nope.so")
    assert recorded == []


def test_a_proto_past_the_in_memory_limit_opens_from_a_scratch_file(monkeypatch):
    """io.model.scratch_file: external data, the weights back in the proto at once, the
    directory gone after the block."""
    monkeypatch.setattr(modelio, "EXTERNAL_DATA_THRESHOLD", 0)
    model = _matmul(400)  # 4,800 bytes: past save's 1,024-byte external-data threshold
    want = onnx.numpy_helper.to_array(model.graph.initializer[0]).copy()
    with modelio.scratch_file(model) as path:
        assert (path.parent / "model.onnx.data").is_file()
        init = model.graph.initializer[0]
        assert init.data_location == TensorProto.DEFAULT  # the weights are back in memory
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), want)
        sess = make_session(path)
    assert not path.parent.exists()
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ want)


def test_import_loads_no_onnxruntime():
    code = ("import sys, bertfuse.io.ort, bertfuse.runtime.device; "
            "assert 'onnxruntime' not in sys.modules, 'loaded'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="this onnxruntime has CUDA")
def test_cuda_that_does_not_start_is_one_line_at_open_not_at_the_first_request(tiny_onnx):
    """ORT falls back to the CPU when its CUDA EP cannot start (here: a CPU-only build); a
    session asked for on CUDA says so when it is opened."""
    from bertfuse.errors import CudaUnavailableError
    from bertfuse.runtime import Session

    with pytest.raises(CudaUnavailableError, match="did not start its CUDA execution provider"):
        make_session(_matmul(), device="cuda")
    from bertfuse.errors import BertfuseError

    # A Session refuses it at open as well (here the earlier check that onnxruntime lists the
    # CUDA EP at all; on a host where it lists it and cannot start it, the error above).
    for precision in ("fp32", "fp16"):
        with pytest.raises(BertfuseError, match="CUDA|onnxruntime-gpu"):
            Session(tiny_onnx[precision], max_batch=2, max_seq=8, device="cuda")
