"""bertfuse's native op library: the CUDA kernels of the ai.bertfuse ops (contracts and
NumPy references in ops/bertfuse/).

    csrc/ + CMakeLists.txt -> build (nvcc/cmake into the per-user cache)
        -> library (find the build for this GPU and ONNX Runtime, register it on a session)
        -> check, check_packed, check_e4m3 (every op on the GPU against its NumPy reference;
           cases: what a case is and the gate it passes)

README.md: building, the cache, and the check.
"""
