"""Which op library the runtime takes (kernels/library.resolve, kernels/packaged.py): the platform wheel's, where its
bf_library_info() says it runs on this GPU under this onnxruntime, else the cache's, else none;
and `bertfuse kernels info` saying which and why. No GPU and no nvcc: the "packaged library" in
these tests is a real shared library built here with the system's C compiler, exporting a
bf_library_info() with the targets and ORT API version under test. Also the manylinux check
the platform wheel's build applies (kernels/prebuild.py) and the nvcc target flags."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bertfuse.cli import main
from bertfuse.io.schemas import first_error
from bertfuse.kernels import library as lib
from bertfuse.kernels import packaged as pk
from bertfuse.kernels.archs import parse_archs, runs_on, usable
from bertfuse.kernels.build import PORTABLE_RPATH, gencode
from bertfuse.kernels.prebuild import ARCHS, manylinux_problems

WHEEL = ",".join(ARCHS)  # what the platform wheel's library reports


@pytest.mark.parametrize("sm,verdict", [
    (80, "SASS for sm_80"), (86, "SASS for sm_86"), (87, "SASS for sm_86"),
    (89, "SASS for sm_89"), (90, "SASS for sm_90a"),
    (100, "PTX for compute_90"), (120, "PTX for compute_90")])
def test_the_wheels_targets_run_on_every_gpu_from_ampere_on(sm, verdict):
    ok, why = runs_on(WHEEL, sm)
    assert ok and why.startswith(verdict) and f"sm{sm}" in why


@pytest.mark.parametrize("archs,sm", [(WHEEL, 75), (WHEEL, 70), ("90a", 100), ("90a-real", 89),
                                      ("80-real", 90), ("86-real", 80)])
def test_targets_that_do_not_run_say_so(archs, sm):
    ok, why = runs_on(archs, sm)
    assert not ok and f"sm{sm}" in why


def test_plain_and_arch_specific_targets():
    assert runs_on("90", 90) == (True, "SASS for sm_90 runs on sm90")
    assert runs_on("90", 100)[0]  # a bare target carries PTX too
    assert runs_on("90a", 90)[0] and not runs_on("90a", 103)[0]  # `a` PTX: that SM only
    assert [(t.sm, t.suffix, t.sass, t.ptx) for t in parse_archs("80-real;90a-virtual, 100f")] \
        == [(80, "", True, False), (90, "a", False, True), (100, "f", True, True)]
    for bad in ("sm_90", "90-both", "9"):
        ok, why = runs_on(bad, 90)
        assert not ok and "cannot be read" in why


def test_ort_api_is_checked_against_the_installed_onnxruntime():
    info = {"ort_api_version": 21, "cuda_archs": WHEEL}
    assert usable(info, 90, 21)[0] and usable(info, 90, 30)[0]
    ok, why = usable(info, 90, 20)
    assert not ok and "API 21" in why and "offers up to 20" in why and "1.21 or newer" in why
    ok, why = usable(info, 90, None)
    assert ok and "not checked" in why
    assert usable({"cuda_archs": WHEEL}, 90, 21) == (False, "its bf_library_info() has no ort_api_version")


def test_gencode_flags():
    assert gencode(["80-real", "90a-real", "90-virtual"]) == [
        "-gencode=arch=compute_80,code=[sm_80]", "-gencode=arch=compute_90a,code=[sm_90a]",
        "-gencode=arch=compute_90,code=[compute_90]"]
    assert gencode(["90"]) == ["-gencode=arch=compute_90,code=[compute_90,sm_90]"]  # as before


# ------------------------------------------------------------------------------ resolve


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in library with")
    return cc


def _library(folder: Path, archs: str, api: int, extra: list[str] = (), more: str = "") -> Path:
    """A real shared library exporting bf_library_info() as the op library does (`more`: C
    code added to it)."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "info.c"
    info = json.dumps({"library": "bertfuse_ops", "domain": lib.DOMAIN, "ort_api_version": api,
                       "cuda_archs": archs})
    src.write_text('const char* bf_library_info(void) { return "%s"; }\n'
                   % info.replace('"', '\\"') + more)
    out = folder / lib.LIB_NAME
    subprocess.run([_cc(), "-shared", "-fPIC", "-o", str(out), str(src), *extra], check=True)
    src.unlink()
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(lib.KERNELS_ENV, str(root))
    monkeypatch.delenv(pk.PACKAGED_ENV, raising=False)
    return root


def _cached(root: Path, api: int, sm: int) -> Path:
    path = lib.library_path(api, sm, root)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF")
    return path


def test_the_packaged_library_comes_first_where_it_runs(tmp_path, cache):
    packaged = _library(tmp_path / "prebuilt", WHEEL, 21)
    cached = _cached(cache, 21, 90)
    found = lib.resolve(sm=90, ort_api=22, packaged=packaged)
    assert (found.source, found.path) == ("packaged", packaged)
    assert "SASS for sm_90a" in found.reason and found.info["cuda_archs"] == WHEEL
    # A GPU none of its targets runs on: the cache's, saying why the packaged one was not taken.
    found = lib.resolve(sm=75, ort_api=22, packaged=packaged)
    assert found.source == "none" and found.path is None
    _cached(cache, 21, 75)
    found = lib.resolve(sm=75, ort_api=22, packaged=packaged)
    assert found.source == "cache" and found.path == lib.library_path(21, 75, cache)
    assert "passed over" in found.reason and "none of which runs on sm75" in found.reason
    # An onnxruntime older than its API: the cache's library for API 20.
    older = _cached(cache, 20, 90)
    found = lib.resolve(sm=90, ort_api=20, packaged=packaged)
    assert (found.source, found.path) == ("cache", older)
    assert "offers up to 20" in found.packaged and cached != older


def test_the_packaged_library_can_be_skipped_or_absent_or_unloadable(tmp_path, cache, monkeypatch):
    cached = _cached(cache, 21, 90)
    packaged = _library(tmp_path / "prebuilt", WHEEL, 21)
    monkeypatch.setenv(pk.PACKAGED_ENV, "0")
    found = lib.resolve(sm=90, ort_api=21, packaged=packaged)
    assert found.path == cached and f"${pk.PACKAGED_ENV}=0" in found.reason
    monkeypatch.delenv(pk.PACKAGED_ENV)
    found = lib.resolve(sm=90, ort_api=21, packaged=tmp_path / "nowhere" / lib.LIB_NAME)
    assert found.path == cached and "no packaged library" in found.packaged
    broken = tmp_path / "broken" / lib.LIB_NAME
    broken.parent.mkdir()
    broken.write_bytes(b"not a shared object")
    found = lib.resolve(sm=90, ort_api=21, packaged=broken)
    assert found.path == cached and "not loadable here" in found.packaged
    assert "\n" not in found.reason


def test_locate_and_its_error_name_both_places(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(lib, "PACKAGED_DIR", tmp_path / "prebuilt")
    packaged = _library(tmp_path / "prebuilt", "80-real", 21)
    assert lib.locate(sm=86, ort_api=21) == packaged
    with pytest.raises(lib.KernelLibraryError) as e:
        lib.locate(sm=90, ort_api=21)
    msg = str(e.value)
    assert "\n" not in msg and "built for 80-real" in msg and str(cache) in msg
    assert "bertfuse kernels build" in msg


def _info(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 0 and "Traceback" not in cap.err
    return cap.out


def test_kernels_info_says_which_library_and_why(tmp_path, cache, monkeypatch, capsys):
    monkeypatch.setattr(lib, "PACKAGED_DIR", tmp_path / "prebuilt")
    packaged = _library(tmp_path / "prebuilt", WHEEL, 21)
    cached = _cached(cache, 18, 75)
    report = json.loads(_info(capsys, ["kernels", "info", "--arch", "89", "--json"]))
    assert first_error(report, "kernels-info.json") is None
    assert report["source"] == "packaged" and report["library"] == str(packaged)
    assert "SASS for sm_89" in report["reason"]
    assert report["packaged"]["path"] == str(packaged)
    assert report["packaged"]["info"]["cuda_archs"] == WHEEL
    report = json.loads(_info(capsys, ["kernels", "info", "--arch", "75", "--json"]))
    assert report["source"] == "cache" and report["library"] == str(cached)
    assert first_error(report, "kernels-info.json") is None
    assert "none of which runs on sm75" in report["packaged"]["why"]
    text = _info(capsys, ["kernels", "info", "--arch", "90"])
    assert "source         packaged: packaged library: SASS for sm_90a runs on sm90" in text


# ------------------------------------------------------------------------------ manylinux


def test_the_manylinux_check_reads_the_library(tmp_path):
    good = _library(tmp_path / "good", WHEEL, 21, [f"-Wl,-rpath,{PORTABLE_RPATH}"])
    assert manylinux_problems(good) == []
    # An absolute RUNPATH of the build host, and a library no manylinux wheel may need.
    bad = _library(tmp_path / "bad", WHEEL, 21, ["-Wl,-rpath,/opt/cuda/lib64",
                                                  "-Wl,--no-as-needed", "-lcrypt"])
    problems = manylinux_problems(bad)
    assert any("RUNPATH ['/opt/cuda/lib64']" in p for p in problems)
    assert any(p.startswith("needs libcrypt.so") for p in problems)


def test_the_manylinux_check_finds_a_glibc_symbol_newer_than_2_28(tmp_path):
    """arc4random came with glibc 2.36: a library calling it cannot go into a manylinux_2_28
    wheel (gcc 12's static libstdc++ calls it, which is why the platform build links the
    system's libstdc++)."""
    try:
        new = _library(tmp_path / "new", WHEEL, 21, [f"-Wl,-rpath,{PORTABLE_RPATH}"],
                       "#include <stdlib.h>\nunsigned int bf_r(void) { return arc4random(); }\n")
    except subprocess.CalledProcessError:
        pytest.skip("this glibc has no arc4random (older than 2.36)")
    assert manylinux_problems(new) == ["asks libc.so.6 for GLIBC_2.36"]
