#!/usr/bin/env bash
# On the GPU host, from the repo root: build bertfuse's op library for the local GPU with
# `bertfuse kernels build` and run `bertfuse kernels check` (every ai.bertfuse op through ONNX
# Runtime's CUDA EP, plain and CUDA-graph runs, against its float64 NumPy reference).
#
#   bash benchmarks/kernels/kernels_device.sh [ORT_INCLUDE_DIR]
#
# Headers: the argument, else $ORT_INCLUDE_DIR, else `bertfuse kernels build` finds or fetches them.
#
# Needs: nvcc (PATH or /usr/local/cuda/bin), cmake (else nvcc builds directly), onnxruntime-gpu
# importable (installed as usual), numpy, onnx, ml_dtypes.
# The library is built into a fresh cache ($BERTFUSE_KERNELS_DIR, default /tmp/bertfuse-kernels)
# with --force. Writes under $OUT (default ./out/kernels-device): env.txt, build.json, build.log,
# check.json, check.txt, and *.err for each step's stderr. Prints one line per case and a verdict;
# exit 0 when the build and every case pass, 1 when a case fails, 2 when the build fails.
set -uo pipefail

INC="${1:-${ORT_INCLUDE_DIR:-}}"
OUT="${OUT:-$PWD/out/kernels-device}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
export BERTFUSE_KERNELS_DIR="${BERTFUSE_KERNELS_DIR:-/tmp/bertfuse-kernels}"
export PATH="$PATH:/usr/local/cuda/bin"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's bertfuse

{
    date -u
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    nvcc --version | tail -2
    cmake --version | head -1 || echo "cmake: none (nvcc builds directly)"
    "$PY" -c 'import onnxruntime as o, numpy, onnx; print("onnxruntime", o.__version__, o.get_available_providers(), "onnx", onnx.__version__, "numpy", numpy.__version__)'
    [ -z "$INC" ] || echo "headers: $INC ($(grep -m1 '#define ORT_API_VERSION' "$INC/onnxruntime_c_api.h" 2>/dev/null || echo 'onnxruntime_c_api.h missing'))"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

t0=$(date +%s)
"$PY" -m bertfuse.cli kernels build ${INC:+--ort-include "$INC"} --force --json > "$OUT/build.json" 2> "$OUT/build.err"
rc_build=$?
cp "$BERTFUSE_KERNELS_DIR"/ort-api*-sm*/build.log "$OUT/build.log" 2>/dev/null
echo "build: exit $rc_build in $(( $(date +%s) - t0 )) s"
if [ "$rc_build" -ne 0 ]; then
    cat "$OUT/build.err"
    tail -20 "$OUT/build.log" 2>/dev/null
    exit 2
fi
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("library", d["library"], d["info"])' "$OUT/build.json"

"$PY" -m bertfuse.cli kernels info --json > "$OUT/info.json" 2> "$OUT/info.err"

t0=$(date +%s)
"$PY" -m bertfuse.cli kernels check --json > "$OUT/check.json" 2> "$OUT/check.err"
rc_check=$?
echo "check: exit $rc_check in $(( $(date +%s) - t0 )) s"
[ -s "$OUT/check.err" ] && cat "$OUT/check.err"
"$PY" - "$OUT/check.json" > "$OUT/check.txt" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no check report: {exc}")
fmt = lambda v: "-" if v is None else f"{v:.2e}"
for c in d["cases"]:
    extra = f" fp8-vs-unquantized max {fmt(c['fp8_vs_exact_max'])} mean {fmt(c['fp8_vs_exact_mean'])}" \
        if c["fp8_vs_exact_max"] is not None else ""
    print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['op']:26s} {c['label']:48s} max {fmt(c['max_abs'])} "
          f"mean {fmt(c['mean_abs'])} graph-max {fmt(c['graph_max_abs'])}{extra}"
          + (f" ERROR {c['error']}" if c["error"] else ""))
print(f"{sum(c['ok'] for c in d['cases'])}/{len(d['cases'])} cases pass (gate max <= "
      f"{d['tolerance']['max_abs']}, mean <= {d['tolerance']['mean_abs']}); sm{d['sm']}, "
      f"onnxruntime {d['onnxruntime']}")
EOF
cat "$OUT/check.txt"
exit "$rc_check"
