"""GPU benchmark entry point (same as `bertfuse bench`). Run on the GPU host:

    export PYTHONPATH=/tmp/site:$PWD
    python3 benchmarks/gpu_bench.py --skeletons .carry --out $OUT --soak 10000

Skeletons are raw tf2onnx exports stripped of their weights here (where TensorFlow is):
    bertfuse convert CKPT --no-fuse --no-verify -o raw.onnx && bertfuse strip-weights raw.onnx -o .carry/<config>_raw.skel.onnx
"""

import sys

from bertfuse.runtime.bench import main

if __name__ == "__main__":
    sys.exit(main())
