"""CI compiles bertfuse's op library on its CPU, from the built wheel's files, for the GPUs
it ships for (sm_80, sm_90): a source missing from the package data, a header that is not
found or a compile error fails here, long before a user's GPU host. No GPU is needed to
compile; the GPU check of every op is `bertfuse kernels check` on the H200."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest


def _toolchain() -> str | None:
    """Why the library cannot be compiled here (no nvcc with cuBLAS's headers), else None."""
    from bertfuse.errors import BertfuseError
    from bertfuse.kernels.build import _cublas_root, find_nvcc

    try:
        nvcc = find_nvcc()
    except BertfuseError as exc:
        return str(exc)
    toolkit = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    roots = [toolkit] + ([str(_cublas_root())] if _cublas_root() else [])
    if not any(os.path.isfile(os.path.join(r, "include", "cublasLt.h")) for r in roots):
        return f"{nvcc} has no cuBLASLt headers beside it (pip install 'bertfuse[kernels]')"
    return None


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """The wheel's files unpacked as an installed package is laid out (site-packages)."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


# (arch, with bertfuse's sm_90a CUTLASS GEMMs): the opt-in build is compiled too, from pip's
# nvidia-cutlass headers, so its files' package data and template instantiations are checked.
@pytest.mark.parametrize("arch,cutlass", [(80, False), (90, False), (90, True)],
                         ids=["sm80", "sm90", "sm90a-cutlass"])
def test_the_op_library_compiles_from_the_wheel(installed, tmp_path, arch, cutlass):
    why = _toolchain()
    if why is not None:
        pytest.skip(f"no CUDA toolchain to compile with: {why}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(installed), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "BERTFUSE_KERNELS_DIR": str(tmp_path / "cache")}
    env.pop("BERTFUSE_CUTLASS_DIR", None)
    if cutlass:
        pytest.importorskip("cutlass_library", reason="pip's nvidia-cutlass (the test extra) not installed")
        env["BERTFUSE_CUTLASS_DIR"] = "pip"
    code = ("import sys; from bertfuse.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "kernels", "build", "--arch", str(arch),
                           "--builder", "nvcc", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["library"].startswith(str(tmp_path / "cache"))
    # Built from the unpacked wheel's sources, not this checkout's.
    log = (tmp_path / "cache").glob("*/build.log")
    assert str(installed) in next(log).read_text()
    assert out["info"]["cuda_archs"] == (f"{arch}a" if cutlass else str(arch))
    assert out["info"]["domain"] == "ai.bertfuse"
    built = next((tmp_path / "cache").glob("*/build.log")).read_text()
    assert ("sm90" + os.sep + "coop_128x256.cu" in built) == cutlass, "sm90 sources compiled iff asked"
