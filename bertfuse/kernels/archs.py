"""Whether a built op library can run here: its CUDA targets against the GPU's SM, its ONNX
Runtime C API version against the installed onnxruntime's. Pure logic on the fields of
`bf_library_info()` (no GPU, no ctypes), so that the runtime's choice of library is testable
anywhere.

Targets are written as CMake writes CMAKE_CUDA_ARCHITECTURES (what `cuda_archs` reports):
`80-real` is SASS for sm_80 only, `90-virtual` is PTX for compute_90 only, a bare `90` is both.
A suffix `a` (`90a`) is architecture-specific code, which runs on that exact SM only.

- SASS for sm_XY runs on a GPU of the same major version whose minor is >= Y (sm_80 code runs
  on an sm_86 GPU), `a` SASS on sm_XY alone.
- PTX for compute_XY is compiled by the driver, at first load, for any GPU of SM >= XY (so a
  GPU newer than every SASS target still runs the library); `a` PTX only on sm_XY.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_TARGET = re.compile(r"^(\d{2,3})([af]?)(?:-(real|virtual))?$")


@dataclass(frozen=True)
class Target:
    sm: int  # 90 for 9.0
    suffix: str  # '', 'a' (this SM only) or 'f' (this family)
    sass: bool
    ptx: bool

    def name(self) -> str:
        return f"{self.sm}{self.suffix}"


def parse_archs(text: str) -> list[Target]:
    """'80-real,90a-real,90-virtual' (or ';'-separated, or '90') -> targets; ValueError on a
    word that is not a target."""
    targets = []
    for word in filter(None, (w.strip() for w in re.split(r"[,;]", text or ""))):
        m = _TARGET.match(word)
        if not m:
            raise ValueError(f"not a CUDA target: {word!r}")
        kind = m.group(3)
        targets.append(Target(int(m.group(1)), m.group(2), kind != "virtual", kind != "real"))
    return targets


def _sass_runs(t: Target, sm: int) -> bool:
    if t.suffix == "a":
        return sm == t.sm
    return sm // 10 == t.sm // 10 and sm >= t.sm


def _ptx_runs(t: Target, sm: int) -> bool:
    return sm == t.sm if t.suffix == "a" else sm >= t.sm


def runs_on(archs: str, sm: int) -> tuple[bool, str]:
    """(whether code for `archs` runs on a GPU of `sm`, why in a few words)."""
    try:
        targets = parse_archs(archs)
    except ValueError as exc:
        return False, f"its CUDA targets {archs!r} cannot be read ({exc})"
    if not targets:
        return False, "it names no CUDA target"
    sass = [t for t in targets if t.sass and _sass_runs(t, sm)]
    if sass:
        best = max(sass, key=lambda t: (t.sm, t.suffix == "a"))
        return True, f"SASS for sm_{best.name()} runs on sm{sm}"
    ptx = [t for t in targets if t.ptx and _ptx_runs(t, sm)]
    if ptx:
        best = max(ptx, key=lambda t: t.sm)
        return True, (f"PTX for compute_{best.name()}, compiled by the driver for sm{sm} "
                      "at first load")
    return False, f"built for {archs}, none of which runs on sm{sm}"


def usable(info: dict[str, Any], sm: int, ort_api: int | None) -> tuple[bool, str]:
    """Whether a library whose bf_library_info() is `info` can run on a GPU of `sm` under an
    onnxruntime offering C API versions up to `ort_api` (None: not installed, not checked)."""
    api = info.get("ort_api_version")
    if not isinstance(api, int):
        return False, "its bf_library_info() has no ort_api_version"
    ok, why = runs_on(str(info.get("cuda_archs", "")), sm)
    if not ok:
        return False, why
    if ort_api is not None and api > ort_api:
        return False, (f"it is built for ONNX Runtime API {api} and the installed onnxruntime "
                       f"offers up to {ort_api} (onnxruntime 1.{api} or newer loads it)")
    return True, f"{why}; ONNX Runtime API {api}" + (
        f" <= {ort_api}" if ort_api is not None else " (onnxruntime not installed: not checked)")
