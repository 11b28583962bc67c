#!/usr/bin/env bash
# On the GPU host, from the repo root: the native library as this checkout has it against the
# library before its reshape, on the same card in one run.
#
#   bash benchmarks/kernels/split_guard.sh BEFORE_DIR ORT_INCLUDE [SKELETONS_DIR]
#
# BEFORE_DIR: a folder holding the earlier bertfuse/kernels (its own CMakeLists.txt and csrc/),
# e.g. made with `git archive 946bb63 bertfuse/kernels | tar -x -C BEFORE_DIR` (the folder
# itself or its bertfuse/kernels). ORT_INCLUDE: ONNX Runtime's C/C++ API headers (as `bertfuse
# kernels build --ort-include`). SKELETONS_DIR (optional): bench's skeletons
# (<config>_raw.skel.onnx); without it the workloads' BERTs are built with
# tests/support/builders (seeded random weights, the sizes of shenma-3l and BERT-base).
#
# Steps (env STEPS, default "build check compare"; each reuses the earlier ones' files under $WORK,
# so that a host can run them in separate calls), each a verdict line:
#   build    both libraries with this checkout's builder (the same flags), at once, into
#            $WORK/lib-before and $WORK/lib-after (cache folders, as $BERTFUSE_KERNELS_DIR)
#   models   (beside the builds) the bench's models of each workload: the ai.bertfuse fp16 model,
#            its FP8 and --gelu-approximation forms; the packed path runs the fp16 one
#   check    `bertfuse kernels check --library LIB --json` on each library: every case passes
#   compare  split_guard.py compare: per library one worker process (the two libraries have the
#            same op names: never in one process), outputs saved and compared bit for bit
#            (np.array_equal) with the switches pinned (nothing timed) and as shipped; p50 per
#            case in alternating rounds; the table last
#
# Environment: PYTHON (default python3; onnxruntime-gpu importable, e.g. PYTHONPATH), OUT
# (default ./out/split-guard; at most 7 files: verdicts.txt (the host, then one line a step),
# build.log, check-before.json, check-after.json, check.err, compare.log, compare.json), WORK
# (default /tmp/bertfuse-split-guard: the libraries, models and saved outputs), BUILDER
# (auto|cmake|nvcc, default auto), ARCH (the SM to build for; default the GPU's), ROUNDS (6), ITERS (100 per round), WORKLOADS (default
# "shenma-3l b20 s64|base b1 s128"). The builds follow $BERTFUSE_CUTLASS_DIR as `bertfuse kernels
# build` does (both alike).
# Exit 0 when every step passed: every check case, every output bit-identical, every p50 within
# 3% of before.
set -uo pipefail

[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: split_guard.sh BEFORE_DIR ORT_INCLUDE [SKELETONS_DIR]"; exit 2; }
BEFORE="$1"
ORT_INC="$2"
SKELETONS="${3:-}"
REPO="$PWD"
PY="${PYTHON:-python3}"
OUT="${OUT:-$PWD/out/split-guard}"
WORK="${WORK:-/tmp/bertfuse-split-guard}"
BUILDER="${BUILDER:-auto}"
ROUNDS="${ROUNDS:-6}"
ITERS="${ITERS:-100}"
WORKLOADS="${WORKLOADS:-shenma-3l b20 s64|base b1 s128}"
STEPS="${STEPS:-build check compare}"
want() { [[ " $STEPS " == *" $1 "* ]]; }
GUARD="$REPO/benchmarks/kernels/split_guard.py"
[ -f "$GUARD" ] && [ -d "$REPO/bertfuse/kernels/csrc" ] || { echo "split_guard: run from the repo root"; exit 2; }
[ -d "$BEFORE" ] || { echo "split_guard: no folder $BEFORE"; exit 2; }
[ -f "$ORT_INC/onnxruntime_cxx_api.h" ] || [ -f "$ORT_INC/onnxruntime/onnxruntime_cxx_api.h" ] || {
    echo "split_guard: $ORT_INC holds no onnxruntime_cxx_api.h"; exit 2; }
[ -z "$SKELETONS" ] || [ -d "$SKELETONS" ] || { echo "split_guard: no folder $SKELETONS"; exit 2; }
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fails=0
verdict() {  # verdict STEP RC TEXT
    local line="$1: $([ "$2" -eq 0 ] && echo PASS || echo "FAIL (exit $2)") $3"
    echo "$line" | tee -a "$OUT/verdicts.txt"
    [ "$2" -eq 0 ] || fails=$((fails + 1))
}
{
    echo "# split_guard.sh, steps: $STEPS"
    date -u
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    echo "before: $BEFORE; after: $REPO ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null))"
    echo "ORT headers: $ORT_INC; builder: $BUILDER; BERTFUSE_CUTLASS_DIR=${BERTFUSE_CUTLASS_DIR:-}"
    "$PY" -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())'
} > "$WORK/env.txt" 2>&1
cat "$WORK/env.txt" | tee -a "$OUT/verdicts.txt"
t0=$SECONDS

# build (both at once) and models (beside them)
if want build; then
    "$PY" "$GUARD" build --src "$BEFORE" --root "$WORK/lib-before" --ort-include "$ORT_INC" \
        --builder "$BUILDER" ${ARCH:+--arch "$ARCH"} > "$WORK/build-before.log" 2>&1 &
    pb=$!
    "$PY" "$GUARD" build --src "$REPO/bertfuse/kernels" --root "$WORK/lib-after" --ort-include "$ORT_INC" \
        --builder "$BUILDER" ${ARCH:+--arch "$ARCH"} > "$WORK/build-after.log" 2>&1 &
    pa=$!
    IFS='|' read -r -a wl <<< "$WORKLOADS"
    "$PY" "$GUARD" models --work "$WORK/models" ${SKELETONS:+--skeletons "$SKELETONS"} \
        --workloads "${wl[@]}" > "$WORK/models.log" 2>&1 &
    pm=$!
    wait $pb; rb=$?
    wait $pa; ra=$?
    verdict build-before $rb "$(tail -1 "$WORK/build-before.log")"
    verdict build-after $ra "$(tail -1 "$WORK/build-after.log")"
    wait $pm; rm_=$?
    verdict models $rm_ "$(tail -1 "$WORK/models.log")"
    for f in build-before build-after models; do echo "==== $f"; cat "$WORK/$f.log"; done > "$OUT/build.log"
    echo "build + models: $((SECONDS - t0)) s"
    [ $rb -eq 0 ] && [ $ra -eq 0 ] && [ $rm_ -eq 0 ] || { echo "split guard: FAIL (see $OUT)"; exit 1; }
    tail -1 "$WORK/build-before.log" > "$WORK/lib-before.path"
    tail -1 "$WORK/build-after.log" > "$WORK/lib-after.path"
fi

# check (each library, every case)
if want check; then
    for side in before after; do
        lib="$(cat "$WORK/lib-$side.path" 2>/dev/null)"
        [ -f "$lib" ] || { verdict "check-$side" 2 "no library built (STEPS=build first)"; continue; }
        "$PY" -m bertfuse kernels check --library "$lib" --json > "$OUT/check-$side.json" 2>> "$OUT/check.err"
        rc=$?
        summary="$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); c=r.get("cases",[]); print(f"{sum(1 for x in c if x.get(\"ok\"))} of {len(c)} cases pass")' "$OUT/check-$side.json" 2>/dev/null)"
        verdict "check-$side" $rc "${summary:-see $OUT/check-$side.json}"
    done
    echo "checks: $((SECONDS - t0)) s"
fi

# compare (outputs bit for bit, p50 interleaved); the table is the last thing printed
if want compare; then
    "$PY" "$GUARD" compare --before "$WORK/lib-before" --after "$WORK/lib-after" \
        --models "$WORK/models/models.json" --out "$WORK/outputs" --rounds "$ROUNDS" --iters "$ITERS" \
        2>&1 | tee "$OUT/compare.log"
    rc=${PIPESTATUS[0]}
    cp -f "$WORK/outputs/compare.json" "$OUT/compare.json" 2>/dev/null
    verdict compare $rc "$(tail -1 "$OUT/compare.log")"
fi
echo "total: $((SECONDS - t0)) s"
echo
cat "$OUT/verdicts.txt"
[ -f "$OUT/compare.log" ] && sed -n '/^model /,/^split guard:/p' "$OUT/compare.log"
[ $fails -eq 0 ]
