"""Two wheels from one source tree (docs/prebuilt-kernels.md); everything else is in pyproject.toml.

    pip wheel .                              bertfuse-X-py3-none-any.whl: pure Python
    BERTFUSE_BUILD_KERNELS=1 pip wheel .     bertfuse-X-py3-none-manylinux_2_28_x86_64.whl:
                                             also bertfuse/kernels/prebuilt/libbertfuse_ops.so

With the switch, the build environment gets the `kernels` extra's CUDA 13 toolchain (pip's
nvidia-* packages, declared here as setup_requires, which setuptools' PEP 517 backend turns
into build requirements) and the library is compiled into the wheel (bertfuse/kernels/
prebuild.py). The wheel is tagged py3-none: nothing in it links libpython, so one wheel serves
every supported Python.
"""

import os
import shutil
import sys
import tomllib
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
SWITCH = "BERTFUSE_BUILD_KERNELS"
PLATFORM = "manylinux_2_28_x86_64"


def with_kernels() -> bool:
    value = os.environ.get(SWITCH, "").strip().lower()
    if value not in ("", "0", "1", "no", "yes", "off", "on", "false", "true"):
        sys.exit(f"${SWITCH}={os.environ[SWITCH]}: expected 1 or 0")
    return value in ("1", "yes", "on", "true")


class BuildPy(build_py):
    """The package, plus the prebuilt op library with the switch on."""

    def run(self):
        super().run()
        stale = Path(self.build_lib) / "bertfuse" / "kernels" / "prebuilt"
        if stale.exists():  # an earlier build's in this tree's build/: never in a pure wheel
            shutil.rmtree(stale)
        if with_kernels():
            sys.path.insert(0, str(HERE))
            from bertfuse.errors import BertfuseError
            from bertfuse.kernels.prebuild import build_prebuilt

            dest = Path(self.build_lib) / "bertfuse" / "kernels" / "prebuilt"
            try:
                build_prebuilt(dest, Path(self.build_lib).parent / "bertfuse-kernels.log",
                               say=lambda msg: print(f"bertfuse: {msg}", flush=True))
            except BertfuseError as exc:
                sys.exit(f"bertfuse: {exc}")


class KernelsDistribution(Distribution):
    """With the switch, a binary distribution: the package goes to platlib (the wheel's root,
    Root-Is-Purelib: false) rather than under .data/purelib."""

    def has_ext_modules(self):
        return with_kernels()


class BdistWheel(bdist_wheel):
    def get_tag(self):
        if with_kernels():
            return "py3", "none", PLATFORM
        return super().get_tag()


def toolchain() -> list[str]:
    """The `kernels` extra (pip's CUDA 13 toolchain), and psutil: the build runs bertfuse's
    own build code (bertfuse.kernels.prebuild), whose temp files name their run by PID and
    start time (bertfuse.io.stale, through psutil)."""
    project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    needs = [d for d in project["dependencies"] if d.startswith("psutil")]
    return list(project["optional-dependencies"]["kernels"]) + needs


setup(distclass=KernelsDistribution, cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel},
      setup_requires=toolchain() if with_kernels() else [])
