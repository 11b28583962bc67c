"""Where the op library's build finds pip's CUDA toolchain: one site-packages/nvidia/cu13 tree,
or several (a venv made with --system-site-packages: nvcc in the venv, cuBLAS and the runtime
beside the system's torch), whose include/ and lib/ the nvcc tree then borrows."""

from __future__ import annotations

import importlib
import sys

from bertfuse.kernels import build


def _tree(site, parts: list[str]):
    root = site / "nvidia" / "cu13"
    for rel in parts:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        path.chmod(0o755)
    return root


def test_split_pip_trees_are_found_and_the_nvcc_tree_borrows_from_the_others(tmp_path,
                                                                                monkeypatch):
    venv = _tree(tmp_path / "venv", ["bin/nvcc", "include/crt/host_config.h"])
    system = _tree(tmp_path / "system", ["include/cublasLt.h", "include/cuda_runtime.h",
                                          "lib/libcublasLt.so.13"])
    monkeypatch.setattr(sys, "path", [str(tmp_path / "venv"), str(tmp_path / "system")])
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    importlib.invalidate_caches()
    assert build.pip_cuda_trees() == [venv, system]
    assert build.pip_cuda_root() == venv  # the tree with nvcc
    assert build._pip_siblings(venv) == [system]
    assert build._pip_siblings(tmp_path / "elsewhere") == []  # a system toolkit borrows nothing
    monkeypatch.setattr(sys, "path", [str(tmp_path / "system")])
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    importlib.invalidate_caches()
    assert build.pip_cuda_root() is None  # no nvcc in any tree
