"""CI builds the platform wheel (`BERTFUSE_BUILD_KERNELS=1 pip wheel .`) from a clean copy of
the checkout, on its CPU, with pip's CUDA 13 toolchain fetched into the isolated build
environment and nothing cached between runs, and checks what it holds: the pure wheel's files
plus the op library alone (no objects, logs or build files), tagged
py3-none-manylinux_2_28_x86_64, its library asking glibc for nothing newer than 2.28 and
needing only CUDA 13's runtime and cuBLASLt besides the system's; then, from the unpacked
wheel on this GPU-less host, `bertfuse kernels info` loads it (pip's CUDA runtime of the test
environment, no driver needed) and reads the targets and ORT API from its bf_library_info().

$BERTFUSE_KERNELS_ARCHS, where set, names the targets to build (CMake's notation); unset, the
wheel's own: SASS for sm_80, 86, 89 and 90a and PTX for compute_90, the wheel as shipped
(docs/prebuilt-kernels.md has the build times). $BERTFUSE_TEST_PLATFORM_WHEEL checks a wheel
already built (with the same $BERTFUSE_KERNELS_ARCHS) instead of building one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from bertfuse._version import __version__
from bertfuse.kernels.archs import parse_archs
from bertfuse.kernels.build import header_api_version, header_dir
from bertfuse.kernels.library import LIB_NAME
from bertfuse.kernels.prebuild import PLATFORM, manylinux_problems, wheel_archs

from .conftest import clean_copy

PREBUILT = f"bertfuse/kernels/prebuilt/{LIB_NAME}"
MAX_MB = 40  # what the GPU check carries to the device


@pytest.fixture(scope="module")
def platform_wheel(tmp_path_factory) -> tuple[Path, float]:
    """The platform wheel built here; $BERTFUSE_TEST_PLATFORM_WHEEL: that wheel instead (to
    check a wheel built elsewhere, e.g. the one carried to a GPU host)."""
    given = os.environ.get("BERTFUSE_TEST_PLATFORM_WHEEL")
    if given:
        return Path(given), 0.0
    src = clean_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("platform")
    env = {**os.environ, "BERTFUSE_BUILD_KERNELS": "1"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w",
                           str(out), str(src)], capture_output=True, text=True, timeout=3000,
                          env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (built,) = out.glob("bertfuse-*.whl")
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines()
             if ln.strip().startswith("bertfuse: ")]
    print("\n".join(lines), f"\npip wheel: {time.monotonic() - start:.0f} s", file=sys.stderr)
    return built, time.monotonic() - start


@pytest.fixture(scope="module")
def unpacked(platform_wheel, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(platform_wheel[0]) as zf:
        zf.extractall(site)
    (site / PREBUILT).chmod(0o755)
    return site


def test_the_platform_wheel_is_the_pure_one_plus_the_library(platform_wheel, wheel):
    built, _ = platform_wheel
    assert built.name == f"bertfuse-{__version__}-py3-none-{PLATFORM}.whl"
    assert wheel.name == f"bertfuse-{__version__}-py3-none-any.whl"  # the switch off
    assert built.stat().st_size < MAX_MB * 1e6
    with zipfile.ZipFile(built) as zf:
        names = set(zf.namelist())
        meta = zf.read(f"bertfuse-{__version__}.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: false" in meta and f"Tag: py3-none-{PLATFORM}" in meta
    with zipfile.ZipFile(wheel) as zf:
        pure = set(zf.namelist())
    assert not any("prebuilt/" in n for n in pure)

    def package(files: set[str]) -> set[str]:
        return {n for n in files if ".dist-info/" not in n}

    # Nothing of the build (objects, logs, CMake's or ninja's files) came along.
    assert sorted(package(names) - package(pure)) == [PREBUILT]
    assert sorted(package(pure) - package(names)) == []


def test_the_library_fits_manylinux_2_28_and_links_cuda_from_pip(unpacked):
    assert manylinux_problems(unpacked / PREBUILT) == []


def _info(site: Path, arch: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [
        os.environ.get("PYTHONPATH")])]), "BERTFUSE_KERNELS_DIR": str(site / "no-cache")}
    env.pop("BERTFUSE_PACKAGED_KERNELS", None)
    code = "import sys; from bertfuse.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "kernels", "info", "--arch", str(arch),
                           "--json"], cwd=site, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_unpacked_wheel_takes_its_library_on_a_cpu_host(unpacked):
    """dlopen needs no GPU: pip's libcudart and libcublasLt (the test extra's toolchain) are
    enough to read bf_library_info()."""
    sm = parse_archs(",".join(wheel_archs()))[-1].sm  # a GPU the wheel has code for
    report = _info(unpacked, sm)
    assert report["packaged"]["path"] == str(unpacked / PREBUILT), report["packaged"]["why"]
    info = report["packaged"]["info"]
    assert info is not None, report["packaged"]["why"]
    assert info["cuda_archs"] == ",".join(wheel_archs())
    include = header_dir(Path.home() / ".cache" / "bertfuse" / "ort-headers" / "trixie-1.21.0"
                         / "include")
    if include is not None:  # the headers the build fetched
        assert info["ort_api_version"] == header_api_version(include)
    assert info["domain"] == "ai.bertfuse" and info["version"] == __version__
    if report["onnxruntime_api"] is not None and report["onnxruntime_api"] >= info["ort_api_version"]:
        assert report["source"] == "packaged", report["reason"]
        assert report["library"] == str(unpacked / PREBUILT)
    # A GPU the wheel has no code for (sm_75): passed over, saying why.
    report = _info(unpacked, 75)
    assert report["source"] == "none" and "none of which runs on sm75" in report["reason"]
