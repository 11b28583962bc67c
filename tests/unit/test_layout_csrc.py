"""The native library's rules (bertfuse/kernels/README.md, "Source layout"), read off csrc/: no
file grows past 600 lines, the environment is read in one file, the check-only entry points
live in check_*.cu files of their own, one status type (no ORT status below the op boundary, no
thread-local error strings outside the check files), one choice cache for the timed choices,
the dense forward's variant an enum, and the attention kernels' P·V step in warp_mma.cuh."""

from __future__ import annotations

import re
from pathlib import Path

import bertfuse

CSRC = Path(bertfuse.__file__).parent / "kernels" / "csrc"
MAX_LINES = 600
SUFFIXES = (".cu", ".cc", ".h", ".cuh")


def _sources() -> dict[str, str]:
    """Every C++/CUDA file under csrc/ (sm90/ included): relative path -> text."""
    return {p.relative_to(CSRC).as_posix(): p.read_text()
            for p in sorted(CSRC.rglob("*")) if p.suffix in SUFFIXES}


def _code(text: str) -> str:
    """The text without its // comments, so that a rule is about code, not prose."""
    return re.sub(r"//[^\n]*", "", text)


def test_there_are_sources():
    assert len(_sources()) > 20, CSRC


def test_no_native_file_is_too_long():
    long = {name: text.count("\n") for name, text in _sources().items()
            if text.count("\n") > MAX_LINES}
    assert not long, f"csrc files over {MAX_LINES} lines (split them by job): {long}"


def test_the_environment_is_read_in_one_place():
    readers = sorted(name for name, text in _sources().items() if "getenv" in _code(text))
    assert readers == ["config.cc"], f"getenv outside config.cc: {readers}"


CHECK_DEF = re.compile(r"\bbf_check_\w+\s*\([^;{]*\)\s*\{")


def test_check_entry_points_are_defined_only_in_check_files():
    outside = sorted(name for name, text in _sources().items()
                     if CHECK_DEF.search(_code(text)) and not Path(name).name.startswith("check_"))
    assert not outside, f"bf_check_* defined outside the check_*.cu files: {outside}"
    checks = {name: text for name, text in _sources().items() if Path(name).name.startswith("check_")}
    assert checks, "no check_*.cu file"
    for name, text in checks.items():
        assert text.startswith("// CHECK-ONLY"), f"{name} does not say it is check-only"


def test_one_status_type_below_the_op_boundary():
    sources = _sources()
    ort_below = sorted(name for name, text in sources.items()
                       if name.endswith((".cu", ".cuh")) and "OrtStatus" in _code(text))
    assert not ort_below, f"ORT statuses inside the CUDA side: {ort_below}"
    strings = sorted(name for name, text in sources.items()
                     if re.search(r"thread_local[^;]*std::string\s+g_", _code(text))
                     and not Path(name).name.startswith("check_"))
    assert not strings, f"thread-local error strings outside the check files: {strings}"
    assert "class Status" in sources["status.h"]
    assert "ToOrt(" in _code(sources["dense_ops.cc"])
    assert re.search(r"^Status bf_dense_forward\(", _code(sources["dense.cu"]), re.M)


def test_timed_choices_share_one_choice_cache():
    dense = _code(_sources()["dense.cu"])
    caches = re.findall(r"ChoiceCache<(\w+),", dense)
    assert sorted(caches) == ["ChoiceKey", "SplitKey"], caches
    assert "std::mutex" not in dense, "dense.cu locks on its own: the ChoiceCache does"
    assert "template <class Key, class Record>\nclass ChoiceCache" in _sources()["gemm_tuner.h"]


def test_dense_variant_is_an_enum():
    header = _code(_sources()["dense.h"])
    assert "enum class DenseVariant" in header
    assert not re.search(r"\bint\s+variant\b", header)


def test_the_pv_step_lives_in_warp_mma():
    sources = _sources()
    users = sorted(name for name, text in sources.items() if "ldsm_x4_trans(" in _code(text))
    assert users == ["warp_mma.cuh"], f"the P·V loop repeated in {users}"
    for name in ("attention.cu", "packed_attention.cu", "attention_tiled.cu"):
        assert "pv_step<" in sources[name], name
