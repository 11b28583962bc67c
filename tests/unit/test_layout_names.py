"""Module names say what they hold: "kernels" names the native op library (kernels/), the
`bertfuse kernels` command (cli/kernels.py) and the kernels a Session chooses at load
(runtime/), not the op form a pass writes or the forms the bench times."""

from __future__ import annotations

from pathlib import Path

import bertfuse

PACKAGE = Path(bertfuse.__file__).parent
KERNELS_HOMES = ("kernels/", "runtime/", "cli/kernels.py")


def test_only_the_library_the_command_and_the_runtime_say_kernels():
    named = [p.relative_to(PACKAGE).as_posix() for p in sorted(PACKAGE.rglob("*.py"))
             if "kernels" in p.name]
    assert [n for n in named if not n.startswith(KERNELS_HOMES)] == []


def test_passes_and_bench_modules_by_what_they_hold():
    assert (PACKAGE / "passes" / "bertfuse_encoder.py").is_file()  # the encoder in ai.bertfuse ops
    assert (PACKAGE / "passes" / "device_packing.py").is_file()  # PackTokens ... UnpackTokens
    assert (PACKAGE / "bench" / "forms.py").is_file()  # --forms, the rows of both forms
    assert (PACKAGE / "bench" / "packed_forms.py").is_file()
