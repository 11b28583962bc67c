"""GPU benchmark entry point: the same command as `bertfuse bench` (`bertfuse bench --help`).

On the GPU host, with bertfuse installed beside onnxruntime-gpu the ordinary way
(`pip install -e '.[gpu]'`, or `EXTRAS=gpu make venv`):

    python benchmarks/runtime/gpu_bench.py --skeletons out/skeletons/ --out results/ --soak 10000

Skeletons are raw tf2onnx exports stripped of their weights where TensorFlow is:
    bertfuse convert CKPT --no-fuse --no-verify -o raw.onnx
    bertfuse strip-weights raw.onnx -o out/skeletons/<config>_raw.skel.onnx
"""

import sys

from bertfuse.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
