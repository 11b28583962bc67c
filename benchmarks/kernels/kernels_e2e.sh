#!/usr/bin/env bash
# On the GPU host, from the repo root: bertfuse's own CUDA ops end to end, beside the
# ORT-contrib form, in one `bertfuse bench` run per model.
#
#   bash benchmarks/kernels/kernels_e2e.sh
#
# 1. benchmarks/kernels/kernels_device.sh: `bertfuse kernels build --force` (ORT headers from
#    $ORT_INCLUDE or $ORT_INCLUDE_DIR, else found or fetched by the build) into $BERTFUSE_KERNELS_DIR (default
#    /tmp/bertfuse-kernels), then `bertfuse kernels check --json`.
# 2. `bertfuse bench` on shenma-3l b20 s64, then (one process, one preparation of the model)
#    base b1 s128 and base b32 s128: the ORT-contrib runtime rows and the bertfuse-kernels
#    rows (runtime as shipped, raw mask only, FP8 weights where the FP8 option exists) timed
#    in the same rounds, CUPTI profile per runtime row, parity vs ORT raw fp32. To save
#    setup time, ORT's own fp16 and optimizer rows are left out unless ORT_ROWS=all, and of
#    the contrib runtime rows only the twins of the kernels rows run unless RUNTIME_ROWS=all.
#    Skeletons (<config>_raw.skel.onnx) from $SKEL (default out/skeletons: `bertfuse example
#    --config C`, `convert --no-fuse --no-verify`, `strip-weights`). Where the library
#    is missing, the kernels rows say why and the rest still runs.
#    Then (packed/) the padded-vs-packed workload $PACKED (default "uniform [8,64] b20 s64")
#    under $STREAMS streams (default 4): beside the contrib form's padded and packed sessions,
#    the bertfuse-kernels padded form and its device-packed form (--packed --ops bertfuse).
# 3. Last: the two forms side by side, against the targets, with the top kernels of each, and
#    the device-packed vs padded tables with the packed target's line.
#
# Needs: onnxruntime-gpu, onnx, onnx-graphsurgeon, numpy, ml_dtypes and torch (CUPTI profile)
# importable (installed as usual), nvcc (+ cmake) for the build. No network,
# no TensorFlow. Everything stays under a time budget ($BUDGET s, default 580): each step gets
# a timeout from what is left, and bench writes its JSON after every workload.
# Writes under $OUT (default ./out/kernels-e2e): kernels/ (env, build, check logs and JSON),
# shenma/, base/ and packed/ (bench.log, gpu_bench.json), summary.txt.
set -uo pipefail

OUT="${OUT:-$PWD/out/kernels-e2e}"
SKEL="${SKEL:-out/skeletons}"
INC="${ORT_INCLUDE:-${ORT_INCLUDE_DIR:-}}"
ITERS="${ITERS:-300}"
ORT_ROWS="${ORT_ROWS:-reference}"  # all: also ORT raw fp16 and its transformer optimizer
RUNTIME_ROWS="${RUNTIME_ROWS:-paired}"  # all: also the contrib form's other mask forms, packed
BUDGET="${BUDGET:-580}"  # the device allows 600 s a command
PACKED="${PACKED:-uniform [8,64] b20 s64}"
STREAMS="${STREAMS:-4}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT/kernels" "$OUT/shenma" "$OUT/base" "$OUT/packed"
source benchmarks/kernels/budget.sh  # PYTHONPATH, PATH, left, cap

for f in "$SKEL/shenma-3l_raw.skel.onnx" "$SKEL/base_raw.skel.onnx"; do
    [ -f "$f" ] || { echo "missing skeleton $f (set SKEL; see the header)"; exit 2; }
done

"$PY" -c 'import onnxruntime as o, onnx, onnx_graphsurgeon as g, torch
print("onnxruntime", o.__version__, "onnx", onnx.__version__, "onnx-graphsurgeon", g.__version__,
      "torch", torch.__version__)' || { echo "missing a Python package (onnxruntime-gpu, onnx, onnx-graphsurgeon, torch)"; exit 2; }

# 1. build + check (a failed build leaves the library out; bench's kernels rows then say why)
t=$(cap 210 260)
OUT="$OUT/kernels" timeout -k 10 "$t" bash benchmarks/kernels/kernels_device.sh "$INC" \
    > "$OUT/kernels/kernels.log" 2>&1
rc_kernels=$?  # 124: timed out
head -6 "$OUT/kernels/env.txt" 2>/dev/null
grep -E '^(build:|check:|library |[0-9]+/[0-9]+ cases|bertfuse: error)|^FAIL|ERROR' "$OUT/kernels/kernels.log" | head -20
echo "kernels build+check: exit $rc_kernels after $(( $(date +%s) - start )) s (timeout $t s)"

# 2. bench, one process per model; --packed alone: no packed tables
bench() {  # bench DIR TIMEOUT BENCH-ARGS... (which workloads)
    local dir="$1" t="$2"
    shift 2
    if [ "$t" -lt 30 ]; then
        echo "bench $*: skipped, ${t} s left of the budget"
        return
    fi
    local t0=$(date +%s)
    timeout -k 15 "$t" "$PY" -m bertfuse.cli bench --skeletons "$SKEL" "$@" \
        --ort-rows "$ORT_ROWS" --runtime-rows "$RUNTIME_ROWS" --iters "$ITERS" \
        --forms both --out "$OUT/$dir" \
        > "$OUT/$dir/bench.log" 2>&1
    local rc=$?
    echo "bench $*: exit $rc in $(( $(date +%s) - t0 )) s (timeout $t s)"
    [ "$rc" -eq 0 ] || tail -5 "$OUT/$dir/bench.log"
}
bench shenma "$(cap 150 290)" --workloads "shenma-3l b20 s64" --packed
bench base "$(cap 400 130)" --workloads "base b1 s128" "base b32 s128" --packed
bench packed "$(cap 150 10)" --workloads --packed "$PACKED" --streams $STREAMS

# 3. the short table, last
"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, os, sys

from bertfuse.bench.forms import CONTRIB_DEFAULT, KERNELS_ROWS, format_comparison
from bertfuse.bench.padded import Result

out = sys.argv[1]
results, setup = [], {}
for part in ("shenma", "base"):
    try:
        d = json.load(open(os.path.join(out, part, "gpu_bench.json")))
    except (OSError, ValueError) as exc:
        print(f"{part}: no gpu_bench.json ({exc})")
        continue
    results += [Result(**r) for r in d["results"]]
    setup = d.get("kernels", setup)
print()
print(f"library: {setup.get('library') or setup.get('reason')}")
print(format_comparison(results))
try:  # padded vs device-packed on bertfuse kernels, and the packed target
    from bertfuse.bench.packed_forms import format_tables, target_line

    packed = json.load(open(os.path.join(out, "packed", "gpu_bench.json"))).get("packed", {})
    print()
    print(format_tables(packed) or "packed: no bertfuse-kernels rows")
    print(target_line(packed))
except (OSError, ValueError) as exc:
    print(f"packed: no gpu_bench.json ({exc})")
KERNELS, RAW_ONLY, FP8 = (label for label, _, _ in KERNELS_ROWS)
# (workload, field, row, target, smaller is better)
TARGETS = [("shenma-3l b20 s64", "gpu_us", KERNELS, 195, True),
           ("shenma-3l b20 s64", "gpu_us", FP8, 170, True),
           ("shenma-3l b20 s64", "p50_us", KERNELS, 250, True),
           ("base b1 s128", "gpu_us", KERNELS, 400, True),
           ("base b1 s128", "gpu_us", FP8, 330, True),
           ("base b32 s128", "seq_per_s", KERNELS, 19000, False)]
rows = {(r.workload, r.variant): r for r in results}
print()
for workload, field, label, target, lower in TARGETS:
    r, base = rows.get((workload, label)), rows.get((workload, CONTRIB_DEFAULT))
    now = getattr(base, field, None) if base else None
    got = getattr(r, field, None) if r else None
    if got is None or got != got:  # missing or NaN
        print(f"{workload} {field} {label}: no number ({r.note if r else 'no row'})")
        continue
    met = got <= target if lower else got >= target
    print(f"{workload} {field}: contrib {now if now is None else round(now, 1)} -> "
          f"{label.split(', ', 1)[1]} {got:.1f} (target {'<=' if lower else '>='} {target}: "
          f"{'met' if met else 'MISSED'}); max diff {r.max_diff:.2e} mean {r.mean_diff:.2e}")
print()
for (workload, label), r in rows.items():  # where the GPU time goes
    if label in (CONTRIB_DEFAULT, KERNELS, FP8) and r.breakdown and \
            workload in ("shenma-3l b20 s64", "base b1 s128"):
        top = "; ".join(f"{name[:48]} {us}" for name, us in r.breakdown[:6])
        print(f"top kernels, {workload} / {label} ({r.gpu_us:.1f} us, {r.kernels}): {top}")
EOF
echo "total $(( $(date +%s) - start )) s; files under $OUT"
