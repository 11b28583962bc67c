"""The op library's infrastructure where CI can check it (no GPU, no nvcc): the cache layout and
its choice of library, the errors (missing library, no GPU, CPU device) as one clear line, the
`bertfuse kernels` CLI, the runtime/verify/modelio refusal of ai.bertfuse models on the CPU,
and fetch_ort_headers.sh's argument handling (nothing is downloaded).

The build itself is exercised only where nvcc, cmake and ORT's headers exist
(ORT_INCLUDE_DIR set): it builds for sm_90 and registers the library with ONNX Runtime."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bertfuse.cli import main
from bertfuse.ops.bertfuse import dense
from bertfuse.kernels import library as lib
from bertfuse.kernels import model_ops
from bertfuse.kernels.build import find_ort_include, header_api_version
from bertfuse.errors import BertfuseError
from bertfuse.cli.kernels import _arch

SCRIPT = Path(lib.__file__).with_name("fetch_ort_headers.sh")


def _has_gpu() -> bool:
    return (lib._sm_from_cudart() or lib._sm_from_nvidia_smi()) is not None


needs_no_gpu = pytest.mark.skipif(_has_gpu(), reason="a CUDA GPU is present")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "kernels"
    monkeypatch.setenv(lib.KERNELS_ENV, str(root))
    return root


def _fake_built(root: Path, api: int, sm: int) -> Path:
    """A file where a built library would be: locate() picks among paths, it loads nothing."""
    path = lib.library_path(api, sm, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


def _cli(capsys, argv: list[str]) -> tuple[int, str, list[str]]:
    rc = main(argv)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err + cap.out
    return rc, cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


def _dense_model() -> onnx.ModelProto:
    return dense.make_model("DenseBias", ("B", "S", 8), 4)


# ------------------------------------------------------------------------------ cache


def test_cache_root_env_order(tmp_path, monkeypatch):
    monkeypatch.delenv(lib.KERNELS_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert lib.cache_root() == tmp_path / "xdg" / "bertfuse" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert lib.cache_root() == tmp_path / "home" / ".cache" / "bertfuse" / "kernels"
    monkeypatch.setenv(lib.KERNELS_ENV, str(tmp_path / "mine"))
    assert lib.cache_root() == tmp_path / "mine"


def test_cache_key_and_path(cache):
    assert lib.cache_key(21, 90) == "ort-api21-sm90"
    assert lib.library_path(21, 90) == cache / "ort-api21-sm90" / "libbertfuse_ops.so"


def test_locate_picks_highest_api_the_runtime_offers(cache):
    _fake_built(cache, 18, 90)
    want = _fake_built(cache, 21, 90)
    _fake_built(cache, 23, 90)  # newer than the onnxruntime below: not loadable there
    _fake_built(cache, 21, 80)  # another GPU
    (cache / "ort-api30-sm90").mkdir()  # a directory without the library
    (cache / "junk").mkdir()
    assert lib.locate(sm=90, ort_api=22) == want
    assert lib.locate(sm=80, ort_api=22) == cache / "ort-api21-sm80" / lib.LIB_NAME
    assert [(a, s) for a, s, _ in lib.built_libraries()] == [(23, 90), (21, 90), (21, 80), (18, 90)]


def test_missing_library_is_one_line_saying_how_to_build(cache):
    _fake_built(cache, 21, 80)
    with pytest.raises(lib.KernelLibraryError) as e:
        lib.locate(sm=90, ort_api=31)
    msg = str(e.value)
    assert "\n" not in msg
    assert "sm90" in msg and "API <= 31" in msg and str(cache) in msg
    assert "bertfuse kernels build" in msg
    assert isinstance(e.value, BertfuseError) and e.value.exit_code == 2


def test_register_missing_file_says_how_to_build(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    with pytest.raises(lib.KernelLibraryError, match="does not exist.*bertfuse kernels build"):
        lib.register(ort.SessionOptions(), tmp_path / "nope.so")


def test_register_unloadable_file_is_a_clear_error(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    bad = tmp_path / lib.LIB_NAME
    bad.write_bytes(b"not a shared object")
    with pytest.raises(lib.KernelLibraryError, match="cannot load the bertfuse op library.*--force"):
        lib.register(ort.SessionOptions(), bad)


@pytest.mark.parametrize("text,sm", [("9.0", 90), ("8.6", 86), ("12.0", 120), (" 10.0\n", 100)])
def test_parse_compute_cap(text, sm):
    assert lib.parse_compute_cap(text) == sm


@pytest.mark.parametrize("text", ["", "9", "N/A", "9.0.1"])
def test_parse_compute_cap_refuses(text):
    with pytest.raises(ValueError):
        lib.parse_compute_cap(text)


@pytest.mark.parametrize("text,sm", [("90", 90), ("sm_90", 90), ("sm90", 90), ("9.0", 90), ("8.9", 89)])
def test_arch_option(text, sm):
    assert _arch(text) == sm


def test_installed_ort_api_matches_the_version():
    ort = pytest.importorskip("onnxruntime")
    assert lib.installed_ort_api() == int(ort.__version__.split(".")[1])


# ------------------------------------------------------------------------------ models


def test_uses_library_on_every_model_form(tmp_path):
    plain = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    ours = _dense_model()
    path = tmp_path / "m.onnx"
    onnx.save(ours, str(path))
    assert model_ops.uses_library(ours) and model_ops.uses_library(ours.SerializeToString()) and model_ops.uses_library(str(path))
    assert not model_ops.uses_library(plain) and not model_ops.uses_library(plain.SerializeToString())
    # Inside an If's branch.
    cond = helper.make_node("If", ["c"], ["y"], then_branch=ours.graph, else_branch=plain.graph)
    nested = helper.make_model(helper.make_graph([cond], "n", [], []))
    assert model_ops.uses_library(nested)


def test_prepare_refuses_cpu_and_skips_other_models():
    ort = pytest.importorskip("onnxruntime")
    with pytest.raises(lib.KernelLibraryError, match="only on a CUDA GPU.*--ops contrib"):
        model_ops.prepare(ort.SessionOptions(), _dense_model(), "cpu")
    plain = onnx.ModelProto()
    assert model_ops.prepare(ort.SessionOptions(), plain, "cpu") is False


def test_runtime_session_refuses_ai_bertfuse_model_on_cpu(tmp_path):
    """bertfuse's Session on the CPU: a model with ai.bertfuse ops is a clear BertfuseError."""
    pytest.importorskip("onnxruntime")
    from bertfuse.runtime import Session
    from support.builders.onnx_graphs import bert

    model = bert(np.random.default_rng(0))
    w = onnx.numpy_helper.from_array(np.zeros((16, 4), np.float32), "extra_w")
    b = onnx.numpy_helper.from_array(np.zeros(4, np.float32), "extra_b")
    model.graph.initializer.extend([w, b])
    model.graph.node.append(helper.make_node("DenseBias", ["sequence_output", "extra_w", "extra_b"],
                                             ["extra"], domain=lib.DOMAIN))
    model.graph.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))
    model.opset_import.append(helper.make_opsetid(lib.DOMAIN, 1))
    with pytest.raises(lib.KernelLibraryError, match="ai.bertfuse.*only on a CUDA GPU"):
        Session(model, device="cpu", max_batch=2, max_seq=8)


def test_session_maker_verify_and_check_refuse_on_cpu():
    ort = pytest.importorskip("onnxruntime")
    from bertfuse.io.model import check_model
    from bertfuse.runtime.device import SessionMaker
    from bertfuse.pipeline.parity import ort_session

    model = _dense_model()
    with pytest.raises(lib.KernelLibraryError, match="only on a CUDA GPU"):
        SessionMaker(ort, "cpu", False, None, None).open(model.SerializeToString())
    with pytest.raises(lib.KernelLibraryError, match="only on a CUDA GPU"):
        ort_session(model)
    with pytest.raises(lib.KernelLibraryError, match="only on a CUDA GPU"):
        check_model(model)
    check_model(model, load=False)  # onnx's checker alone takes it


# ------------------------------------------------------------------------------ CLI


@needs_no_gpu
@pytest.mark.parametrize("argv", [["kernels", "info", "--json"], ["kernels", "info"],
                                  ["kernels", "check"], ["kernels", "check", "--json"],
                                  ["kernels", "build", "--json"]])
def test_cli_without_gpu_is_exit_2_one_line(capsys, cache, argv):
    rc, out, err = _cli(capsys, argv)
    assert rc == 2 and len(err) == 1 and "no CUDA GPU found" in err[0]
    if "--json" not in argv:
        assert out == ""
        return
    report = json.loads(out)  # --json: the report of the refusal, the same line
    assert report["ok"] is False and report["command"] == " ".join(argv[:2])
    assert report["error"] == {"kind": "kernels", "message": err[0].split("error: ", 1)[1],
                               "exit_code": 2}


def test_cli_info_for_a_given_arch(capsys, cache):
    _fake_built(cache, 18, 90)
    rc, out, err = _cli(capsys, ["kernels", "info", "--arch", "sm_90", "--json"])
    assert rc == 0 and err == []
    report = json.loads(out)
    assert report["cache_dir"] == str(cache) and report["sm"] == 90
    assert report["built"] is True and report["library"].endswith("ort-api18-sm90/libbertfuse_ops.so")
    rc, out, _ = _cli(capsys, ["kernels", "info", "--arch", "80", "--json"])
    assert rc == 0 and json.loads(out)["built"] is False


@pytest.mark.parametrize("argv,needle", [
    (["kernels"], "required"),
    (["kernels", "info", "--arch", "banana"], "--arch"),
    (["kernels", "frobnicate"], "invalid choice"),
])
def test_cli_usage_errors(capsys, argv, needle):
    rc, _, err = _cli(capsys, argv)
    assert rc == 2 and len(err) == 1 and needle in err[0]


def test_cli_build_bad_headers_dir_is_one_line(capsys, cache, tmp_path):
    rc, _, err = _cli(capsys, ["kernels", "build", "--arch", "90", "--ort-include", str(tmp_path)])
    assert rc == 2 and len(err) == 1 and "onnxruntime_cxx_api.h" in err[0]
    assert not cache.exists()  # nothing half-built in the cache


def test_find_ort_include_accepts_a_release_layout(tmp_path, monkeypatch):
    monkeypatch.delenv("ORT_INCLUDE_DIR", raising=False)
    inc = tmp_path / "include" / "onnxruntime"  # ORT release: include/onnxruntime/*.h
    inc.mkdir(parents=True)
    (inc / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 23\n")
    (inc / "onnxruntime_cxx_api.h").write_text("")
    assert find_ort_include(tmp_path / "include") == inc
    assert header_api_version(inc) == 23
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(inc))
    assert find_ort_include() == inc
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(tmp_path))
    with pytest.raises(lib.KernelLibraryError, match=r"\$ORT_INCLUDE_DIR"):
        find_ort_include()


def test_find_ort_include_makes_a_relative_path_absolute(tmp_path, monkeypatch):
    # cmake configures in its own build dir: a relative --ort-include must not reach it as given
    inc = tmp_path / "hdrs"
    inc.mkdir()
    (inc / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 21\n")
    (inc / "onnxruntime_cxx_api.h").write_text("")
    monkeypatch.chdir(tmp_path)
    found = find_ort_include("hdrs")
    assert found.is_absolute() and found == inc.resolve()


# ------------------------------------------------------------------------------ header script


def _script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_script_help():
    r = _script("--help")
    assert r.returncode == 0 and "--cache-dir" in r.stdout and "libonnxruntime-dev" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--frob"], "unknown argument"),
    (["--suite"], "needs a value"),
    (["--suite", "../etc"], "not a Debian suite"),
    (["--version", "1.21;rm"], "not a version"),
])
def test_script_refuses_bad_arguments(args, needle):
    r = _script(*args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1 and needle in lines[0]


def test_script_uses_its_cache_and_never_overwrites_dest(tmp_path):
    inc = tmp_path / "cache" / "trixie-1.21.0" / "include"
    inc.mkdir(parents=True)
    (inc / "onnxruntime_cxx_api.h").write_text("// cached\n")
    r = _script("--cache-dir", str(tmp_path / "cache"), "--dest", str(tmp_path / "dest"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(inc)
    assert (tmp_path / "dest" / "onnxruntime_cxx_api.h").read_text() == "// cached\n"
    r = _script("--cache-dir", str(tmp_path / "cache"), "--dest", str(tmp_path / "dest"))
    assert r.returncode == 2 and "not empty" in r.stderr


# ------------------------------------------------------------------------------ real build


_CAN_BUILD = bool(os.environ.get("ORT_INCLUDE_DIR")) and shutil.which("cmake") is not None and \
    (shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc"))


@pytest.mark.skipif(not _CAN_BUILD, reason="needs nvcc, cmake and ORT_INCLUDE_DIR")
@pytest.mark.parametrize("builder", ["cmake", "nvcc"])
def test_build_for_sm90_and_register(capsys, cache, builder):
    ort = pytest.importorskip("onnxruntime")
    rc, out, err = _cli(capsys, ["kernels", "build", "--arch", "90", "--builder", builder, "--json"])
    assert rc == 0, err
    built = json.loads(out)
    assert built["info"]["domain"] == lib.DOMAIN and built["info"]["cuda_archs"] == "90"
    path = Path(built["library"])
    assert path.parent.name == f"ort-api{built['info']['ort_api_version']}-sm90"
    assert not list(path.parent.glob(".*tmp"))
    lib.register(ort.SessionOptions(), path)  # RegisterCustomOps runs in ORT (CPU build is enough)
    ops = lib.op_names(path)
    assert {"DenseBias", "DenseBiasGelu", "DenseBiasSkipLayerNorm", "BertAttention"} <= set(ops)
    rc, out, _ = _cli(capsys, ["kernels", "info", "--arch", "90", "--json"])
    assert rc == 0 and json.loads(out)["ops"] == ops


def test_check_binding_run_rolls_inputs_in_place():
    """kernels check's IO-binding run (here on the CPU EP, with ONNX's MatMul + Add, which are
    row-wise like every ai.bertfuse op): new inputs written into the bound buffers give the
    rolled output."""
    ort = pytest.importorskip("onnxruntime")
    from bertfuse.kernels.cases import Case
    from bertfuse.kernels.check import _run_graph

    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3, 5])],
                          initializer=[onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((4, 3, 8)).astype(np.float32)
    case = Case("MatMul", "x", model, {"x": x}, lambda f: [f["x"] @ w])
    ref = case.reference(case.feeds)
    first, rolled = _run_graph(ort, sess, case, ref, device="cpu")
    np.testing.assert_allclose(first[0], ref[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rolled[0], np.roll(ref[0], 1, axis=0), rtol=1e-5, atol=1e-5)
    assert not np.allclose(rolled[0], ref[0])


def test_check_cases_are_valid_models_with_consistent_references():
    from bertfuse.kernels.check import all_cases

    cases = all_cases(seed=3)
    assert {c.op for c in cases} >= {"DenseBias", "DenseBiasGelu", "DenseBiasSkipLayerNorm", "BertAttention",
                                     "DenseBiasFp8", "PackTokens", "PackedBertAttention", "UnpackTokens"}
    for c in cases:
        onnx.checker.check_model(c.model)
        want, again = c.reference(c.feeds), c.reference(c.replay_feeds())
        assert [w.shape for w in want] == [a.shape for a in again] == \
            [tuple(d.dim_value for d in o.type.tensor_type.shape.dim) for o in c.model.graph.output], c.label
        assert all(np.all(np.isfinite(w.astype(np.float64))) for w in want)
        assert any(not np.array_equal(w, a) for w, a in zip(want, again)), f"{c.label}: replay inputs change nothing"


def test_packed_references_agree_with_bert_attention():
    """The check's own packed references: pack, attend per sequence, unpack == BertAttention's
    reference with key lengths, at kept positions (zeros elsewhere)."""
    from bertfuse.ops.bertfuse import bert_attention
    from bertfuse.kernels.check_packed import (packed_attention_reference, pack_reference,
                                                  unpack_reference)

    rng = np.random.default_rng(5)
    lengths, s, h, heads = np.array([7, 0, 3, 8], np.int32), 8, 32, 2
    qkv = rng.standard_normal((4, s, 3 * h)).astype(np.float16)
    mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
    index, slot, cu = pack_reference(mask, 24)
    assert cu.tolist() == [0, 7, 7, 10, 18] and index[:3].tolist() == [0, 1, 2] and index[18:].tolist() == [0] * 6
    packed_qkv = qkv.reshape(-1, 3 * h)[index]
    ctx = unpack_reference(packed_attention_reference(packed_qkv, cu, heads, None), slot)
    want = bert_attention.reference(qkv, lengths, num_heads=heads)
    keep = mask.astype(bool)
    np.testing.assert_allclose(ctx[keep].astype(np.float64), want[keep].astype(np.float64), atol=2e-3)
    assert not ctx[~keep].any()
    cut_index, cut_slot, cut_cu = pack_reference(mask, 9)  # 18 kept, T = 9: cut in packed order
    assert cut_cu.tolist() == [0, 7, 7, 9, 9] and (cut_slot >= 0).sum() == 9 and cut_slot[2, 2] == -1


def test_check_gate():
    from bertfuse.kernels.cases import gate

    f = np.zeros((40, 25), np.float16)

    def one_off(v: float) -> np.ndarray:
        g = f.copy()
        g[3, 4] = v
        return g
    assert gate([one_off(0.03)], [f]) == (pytest.approx(0.03, rel=1e-3), pytest.approx(0.03 / 1000, rel=1e-3), True)
    assert not gate([one_off(0.05)], [f])[2]
    assert not gate([f + np.float16(0.01)], [f])[2]  # max within, mean 1e-2 > 2e-3
    assert not gate([one_off(np.nan)], [f])[2]
    i = np.arange(4, dtype=np.int32)
    assert gate([i], [i.copy()])[2] and not gate([i + 1], [i])[2]
    assert not gate([f], [f.reshape(25, 40)])[2]


def test_file_scan_finds_the_domain_across_chunk_edges(tmp_path):
    p = tmp_path / "blob"
    needle = lib.DOMAIN.encode()
    for cut in range(1, len(needle)):
        p.write_bytes(b"x" * (64 - cut) + needle + b"y" * 10)
        assert model_ops.file_mentions(p, needle, chunk=64)
    p.write_bytes(b"x" * 200)
    assert not model_ops.file_mentions(p, needle, chunk=64)


def test_the_sm90_gemms_are_built_only_when_asked(monkeypatch, tmp_path):
    """$BERTFUSE_CUTLASS_DIR opts in: unset, no CUTLASS; a dir without CUTLASS's headers or `pip`
    without the package is one clear error; a real root is taken, for sm 90 only."""
    from bertfuse.kernels.build import find_cutlass, sm90_gemms
    from bertfuse.kernels.library import KernelLibraryError

    monkeypatch.delenv("BERTFUSE_CUTLASS_DIR", raising=False)
    assert find_cutlass() is None
    monkeypatch.setenv("BERTFUSE_CUTLASS_DIR", str(tmp_path))
    with pytest.raises(KernelLibraryError, match="no include/cutlass/cutlass.h"):
        find_cutlass()
    (tmp_path / "include" / "cutlass").mkdir(parents=True)
    (tmp_path / "include" / "cutlass" / "cutlass.h").write_text("#pragma once\n")
    assert find_cutlass() == tmp_path.resolve()
    assert sm90_gemms(90, tmp_path) and not sm90_gemms(80, tmp_path) and not sm90_gemms(90, None)
    monkeypatch.setenv("BERTFUSE_CUTLASS_DIR", "pip")
    try:
        import cutlass_library  # noqa: F401
    except ImportError:
        with pytest.raises(KernelLibraryError, match="nvidia-cutlass"):
            find_cutlass()
    else:
        assert (find_cutlass() / "include" / "cutlass" / "cutlass.h").is_file()


def test_the_wheel_builds_chain_imports_without_onnx_or_numpy():
    """setup.py imports kernels/prebuild.py (and through it build.py and library.py) in pip's
    build environment, which holds setuptools and wheel only: none of them may import onnx,
    numpy or onnxruntime at its top."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('onnx', 'numpy', 'onnxruntime'):\n"
        "            raise ImportError('the build environment has no ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import bertfuse.kernels.prebuild\n")
    proc = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True,
                          timeout=120, cwd=Path(lib.__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
