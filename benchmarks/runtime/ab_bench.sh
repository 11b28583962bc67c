#!/usr/bin/env bash
# Two bertfuse checkouts, the same `bertfuse bench` call, alternated in one session on one GPU
# (A B A B ...), so that the host's drift from one minute to the next falls on both alike.
#
#   bash benchmarks/runtime/ab_bench.sh A_DIR B_DIR [ROUNDS]
#
# A_DIR, B_DIR: directories holding a `bertfuse/` package (a checkout, or `git archive REV
# bertfuse | tar -x -C DIR`). Each run imports bertfuse from its directory, everything else
# (onnxruntime-gpu, onnx, onnx-graphsurgeon, numpy, torch for the CUPTI profile) from the
# environment. Skeletons from $SKEL (default out/skeletons: see benchmarks/runtime/gpu_bench.py).
# The call: $BENCH_ARGS (default: shenma-3l b20 s64, contrib kernels, no packed or stream
# rows). Writes $OUT/{a,b}<round>/gpu_bench.json and bench.log, and last a table of each
# runtime row's p50 per run.
set -uo pipefail
A="${1:?A_DIR}"; B="${2:?B_DIR}"; ROUNDS="${3:-2}"
OUT="${OUT:-$PWD/out/ab}"
SKEL="${SKEL:-out/skeletons}"
PY="${PYTHON:-python3}"
if [ -n "${BENCH_ARGS:-}" ]; then read -r -a ARGS <<< "$BENCH_ARGS"; else
    ARGS=(--workloads "shenma-3l b20 s64" --packed --streams --forms contrib --ort-rows reference
          --iters 300); fi
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
    for side in a b; do
        dir=$A; [ "$side" = b ] && dir=$B
        mkdir -p "$OUT/$side$r"
        echo "== $side$r ($dir)"
        PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
            'import sys; from bertfuse.cli import main; sys.exit(main(["bench", *sys.argv[1:]]))' \
            --skeletons "$SKEL" "${ARGS[@]}" --out "$OUT/$side$r" > "$OUT/$side$r/bench.log" 2>&1
        echo "   exit $?"
    done
done
"$PY" - "$OUT" "$ROUNDS" <<'PY'
import json, os, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = [f"{s}{r}" for r in range(1, rounds + 1) for s in "ab"]
table = {}
for run in runs:
    try:
        data = json.load(open(os.path.join(out, run, "gpu_bench.json")))
    except (OSError, ValueError) as exc:
        print(f"{run}: no results ({exc})"); continue
    for row in data.get("results", []):
        key = (row.get("workload"), row.get("variant"))
        table.setdefault(key, {})[run] = row.get("p50_us")
print("| workload | variant | " + " | ".join(f"{r} p50 us" for r in runs) + " |")
print("|---|---|" + "---|" * len(runs))
for (w, v), vals in table.items():
    print(f"| {w} | {v} | " + " | ".join(f"{vals[r]:.1f}" if isinstance(vals.get(r), (int, float)) else "-" for r in runs) + " |")
PY
