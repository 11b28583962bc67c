#!/usr/bin/env bash
# On the GPU host, from the repo root: the platform wheel alone runs bertfuse's own kernels.
#
#   bash benchmarks/kernels/wheel_check.sh WHEEL [STEP...]
#
# WHEEL: bertfuse-*-py3-none-manylinux_2_28_x86_64.whl (BERTFUSE_BUILD_KERNELS=1 pip wheel .;
# docs/prebuilt-kernels.md). STEPs, in order (default all; each reuses the earlier ones' files
# under $WORK, so a warm host can run them in several calls of under 10 minutes each):
#   install  a fresh virtualenv ($WORK/venv, --system-site-packages for what the host has:
#            torch and its CUDA 13 nvidia-* libraries, numpy, onnx), `pip install --no-index
#            --no-deps` of WHEEL; no nvcc on PATH, no $CUDA_HOME, no ORT headers (a fresh empty
#            $HOME and cache), an empty kernel cache, nothing from this checkout on sys.path
#   model    a shenma-3l-sized BERT (3 layers, hidden 768) built with tests/support/builders
#            (random weights, the graph tf2onnx writes), as bench's skeleton, and
#            `bertfuse optimize --precision fp16` of it
#   session  the first Session on the fp16 model, kernels='auto': which kernels it chose and
#            which libbertfuse_ops.so the process mapped (must be the wheel's), the cache empty
#   check    `bertfuse kernels info --json` and `bertfuse kernels check --json` (every case)
#   bench    `bertfuse bench` shenma-3l b20 s64, short, with the own-kernel rows (packaged)
#   local    today's library: `bertfuse kernels build --force` from this checkout with the
#            host's nvcc and --ort-include into $WORK/local-cache, then the same bench with
#            BERTFUSE_PACKAGED_KERNELS=0 taking it; then the own-kernel rows side by side
#            (packaged / local, the issue's bar: within 3%)
#
# Environment: OUT (default ./out/wheel-check), WORK (default /tmp/bertfuse-wheel-check),
# ORT_SITE (default none: the venv sees the host's site-packages, where onnxruntime-gpu is
# installed the ordinary way; else a folder where onnxruntime-gpu and bertfuse's other dependencies the
# host lacks are importable from, put on PYTHONPATH; empty: none; several folders joined with ':'.
# Where PYTHON is itself a virtualenv's, --system-site-packages sees the base interpreter's
# packages, not that venv's: name its site-packages here too, as the H100 run in
# docs/prebuilt-kernels.md did for the image's /opt/torch/.venv), ORT_INCLUDE (ORT headers,
# for `local` only), PYTHON (default python3), ITERS (default 300), NVCC_DIR (the host's nvcc,
# for `local` only; default /usr/local/cuda/bin).
# Writes under $OUT: env.txt, install.log, model.log, session.json, info.json, check.json,
# check.txt, bench-packaged/ and bench-local/ (bench.log, gpu_bench.json; kept under $WORK too,
# where `local` compares them), local-build.json, compare.txt, and one verdict line per step
# in verdicts.txt. Exit 0 when every step run passed.
set -uo pipefail

WHEEL="${1:?usage: wheel_check.sh WHEEL [install|model|session|check|bench|local ...]}"
shift
STEPS="${*:-install model session check bench local}"
REPO="$PWD"
OUT="${OUT:-$PWD/out/wheel-check}"
WORK="${WORK:-/tmp/bertfuse-wheel-check}"
ORT_SITE="${ORT_SITE-}"
PY="${PYTHON:-python3}"
ITERS="${ITERS:-300}"
NVCC_DIR="${NVCC_DIR:-/usr/local/cuda/bin}"
ORT_INCLUDE="${ORT_INCLUDE:-${ORT_INCLUDE_DIR:-}}"
VENV="$WORK/venv"
mkdir -p "$OUT" "$WORK"
WHEEL="$(cd "$(dirname "$WHEEL")" && pwd)/$(basename "$WHEEL")"
[ -f "$WHEEL" ] || { echo "no wheel $WHEEL"; exit 2; }
[ -f "$REPO/tests/support/builders/onnx_graphs.py" ] || { echo "run from the repo root"; exit 2; }
fails=0
verdict() {  # verdict STEP RC TEXT
    local line="$1: $([ "$2" -eq 0 ] && echo PASS || echo "FAIL (exit $2)") $3"
    echo "$line" | tee -a "$OUT/verdicts.txt"
    [ "$2" -eq 0 ] || fails=$((fails + 1))
}
want() { [[ " $STEPS " == *" $1 "* ]]; }

# What the wheel's bertfuse sees: the venv (and the ORT site), no toolkit, no headers (an empty
# $HOME and cache), no kernel cache, nothing of this checkout (it runs in $WORK).
clean_env() {
    env -u CUDA_HOME -u CUDA_PATH -u ORT_INCLUDE_DIR -u ORT_INCLUDE -u CUBLAS_ROOT \
        -u BERTFUSE_CUTLASS_DIR -u BERTFUSE_PACKAGED_KERNELS -u PYTHONHOME \
        HOME="$WORK/home" XDG_CACHE_HOME="$WORK/home/.cache" PATH="$VENV/bin:/usr/bin:/bin" \
        PYTHONPATH="$ORT_SITE" BERTFUSE_KERNELS_DIR="${KDIR:-$WORK/empty-cache}" "$@"
}
bf() { (cd "$WORK" && clean_env "$VENV/bin/python" -m bertfuse "$@"); }

{
    date -u
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    ls -l "$WHEEL"; sha256sum "$WHEEL"
    echo "steps: $STEPS; ORT_SITE=$ORT_SITE; ORT_INCLUDE=${ORT_INCLUDE:-}"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if want install; then
    rm -rf "$VENV" "$WORK/home" "$WORK/empty-cache"
    mkdir -p "$WORK/home" "$WORK/empty-cache"
    {
        "$PY" -m venv --system-site-packages "$VENV" &&
        clean_env "$VENV/bin/python" -m pip install --no-index --no-deps "$WHEEL" &&
        (cd "$WORK" && clean_env "$VENV/bin/python" - <<'EOF'
import importlib, os, shutil, sys
import bertfuse
from bertfuse.kernels.library import LIB_NAME, PACKAGED_DIR
print("bertfuse", bertfuse.__file__)
assert bertfuse.__file__.startswith(sys.prefix), "bertfuse is not the venv's"
assert (PACKAGED_DIR / LIB_NAME).is_file(), "the wheel has no prebuilt library"
assert shutil.which("nvcc") is None, f"nvcc on PATH: {shutil.which('nvcc')}"
print("no nvcc on PATH; CUDA_HOME", os.environ.get("CUDA_HOME"), "ORT_INCLUDE_DIR",
      os.environ.get("ORT_INCLUDE_DIR"))
missing = []
for name in ("numpy", "onnx", "onnx_graphsurgeon", "rich", "jsonschema", "psutil", "ml_dtypes",
             "torch", "onnxruntime"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"), m.__file__)
    except ImportError as exc:
        missing.append(f"{name} ({exc})")
import onnxruntime as ort
print("providers", ort.get_available_providers())
sys.exit(f"missing: {', '.join(missing)} (put them in ORT_SITE)" if missing else 0)
EOF
)
    } > "$OUT/install.log" 2>&1
    rc=$?
    verdict install $rc "$(tail -1 "$OUT/install.log")"
fi

if want model; then
    mkdir -p "$WORK/skel"
    {
        (cd "$WORK" && clean_env "$VENV/bin/python" - "$REPO/tests/support/builders" "$WORK" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])  # the builders alone: bertfuse stays the wheel's
import numpy as np, onnx
from onnx_graphs import bert
work = sys.argv[2]
model = bert(np.random.default_rng(0), layers=3, hidden=768, heads=12, inter=3072,
             vocab=21128, positions=512, types=2)
for o in model.graph.output:  # the shapes tf2onnx writes (the checker wants one)
    dims = ["B", "S", 768] if o.name == "sequence_output" else ["B", 768]
    o.CopyFrom(onnx.helper.make_tensor_value_info(o.name, onnx.TensorProto.FLOAT, dims))
onnx.save(model, f"{work}/skel/shenma-3l_raw.skel.onnx")
print("raw model", f"{work}/skel/shenma-3l_raw.skel.onnx")
EOF
) && bf optimize "$WORK/skel/shenma-3l_raw.skel.onnx" -o "$WORK/fused16.onnx" --precision fp16 \
            --no-verify
    } > "$OUT/model.log" 2>&1
    rc=$?
    verdict model $rc "$(tail -1 "$OUT/model.log")"
fi

if want session; then
    (cd "$WORK" && clean_env "$VENV/bin/python" - "$WORK/fused16.onnx" "$WORK/empty-cache" \
        > "$OUT/session.json" 2> "$OUT/session.err" <<'EOF'
import json, os, sys
import numpy as np
import bertfuse
from bertfuse.kernels.library import LIB_NAME, PACKAGED_DIR, resolve
sess = bertfuse.Session(sys.argv[1], device="cuda")
choice = sess.kernels
ids = np.random.default_rng(0).integers(0, 21128, (4, 64)).astype(np.int32)
out = sess.run(ids, np.ones_like(ids), np.zeros_like(ids))
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if LIB_NAME in line})
found = resolve()
report = {"kernels": choice.to_json(), "resolve": {"source": found.source,
          "path": str(found.path), "reason": found.reason},
          "mapped": mapped, "packaged": str(PACKAGED_DIR / LIB_NAME),
          "cache_after": sorted(os.listdir(sys.argv[2])),
          "outputs": {k: list(np.shape(v)) for k, v in out.items()}}
print(json.dumps(report, indent=2))
ok = (choice.used == "bertfuse" and mapped == [str(PACKAGED_DIR / LIB_NAME)]
      and found.source == "packaged" and report["cache_after"] == [])
sys.exit(0 if ok else 1)
EOF
)
    rc=$?
    verdict session $rc "$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["kernels"]["used"], "-", d["kernels"]["reason"], "| mapped", d["mapped"], "| cache", d["cache_after"])' "$OUT/session.json" 2>/dev/null || tail -1 "$OUT/session.err")"
fi

if want check; then
    bf kernels info --json > "$OUT/info.json" 2> "$OUT/info.err"
    rc=$?
    verdict info $rc "$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["source"], "-", d["reason"])' "$OUT/info.json" 2>/dev/null || tail -1 "$OUT/info.err")"
    bf kernels check --json > "$OUT/check.json" 2> "$OUT/check.err"
    rc=$?
    "$PY" - "$OUT/check.json" > "$OUT/check.txt" 2>&1 <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("library", d.get("library"), d.get("info"))
for c in d.get("cases", []):
    print("ok  " if c.get("ok") else "FAIL", c.get("op"), c.get("label"), c.get("max_abs"), c.get("error") or "")
print(sum(c.get("ok", False) for c in d.get("cases", [])), "of", len(d.get("cases", [])), "cases pass")
EOF
    verdict check $rc "$(tail -1 "$OUT/check.txt") ($(head -1 "$OUT/check.txt" | cut -c1-160))"
fi

run_bench() {  # run_bench DIR [ENV=VALUE...]: shenma-3l b20 s64, own-kernel rows beside contrib
    # (under $WORK, which a later call on the same host reads; copied to $OUT)
    local name="$1" dir="$WORK/$1" rc
    shift
    rm -rf "$dir"
    mkdir -p "$dir"
    (cd "$WORK" && clean_env "$@" "$VENV/bin/python" -m bertfuse bench --skeletons "$WORK/skel" \
        --workloads "shenma-3l b20 s64" --packed --streams --peers off --ort-rows reference \
        --runtime-rows paired --forms both --iters "$ITERS" --out "$dir") > "$dir/bench.log" 2>&1
    rc=$?
    cp -r "$dir" "$OUT/$name"
    return $rc
}

if want bench; then
    run_bench bench-packaged
    rc=$?
    verdict bench $rc "$(grep -m1 '^bertfuse kernels:' "$WORK/bench-packaged/bench.log")"
fi

if want local; then
    # Today's library, built here the way kernels_device.sh does (the checkout's bertfuse, the
    # host's nvcc and Python environment), into a cache of its own.
    rm -rf "$WORK/local-cache"
    (cd "$REPO" && PATH="$PATH:$NVCC_DIR" PYTHONPATH="$REPO${ORT_SITE:+:$ORT_SITE}" \
        BERTFUSE_KERNELS_DIR="$WORK/local-cache" "$PY" -m bertfuse.cli kernels build --force \
        ${ORT_INCLUDE:+--ort-include "$ORT_INCLUDE"} --json) > "$OUT/local-build.json" \
        2> "$OUT/local-build.err"
    rc=$?
    verdict local-build $rc "$(tail -1 "$OUT/local-build.err" 2>/dev/null)"
    if [ "$rc" -eq 0 ]; then
        KDIR="$WORK/local-cache" run_bench bench-local BERTFUSE_PACKAGED_KERNELS=0
        rc=$?
        verdict bench-local $rc "$(grep -m1 '^bertfuse kernels:' "$WORK/bench-local/bench.log")"
        (cd "$WORK" && clean_env "$VENV/bin/python" - "$WORK" <<'EOF'
import json, os, sys
from bertfuse.bench.forms import AUTO_ROW, KERNELS_ROWS
out = sys.argv[1]
runs = {}
for side in ("packaged", "local"):
    d = json.load(open(os.path.join(out, f"bench-{side}", "gpu_bench.json")))
    runs[side] = ({(r["workload"], r["variant"]): r for r in d["results"]},
                  d.get("kernels", {}))
    print(f"{side}: {runs[side][1].get('library')} {runs[side][1].get('info')}")
own = [AUTO_ROW] + [label for label, _, _ in KERNELS_ROWS]
worst = 0.0
print(f"{'row':66s} {'field':8s} {'packaged':>10s} {'local':>10s} {'ratio':>7s}")
for key, p in runs["packaged"][0].items():
    l = runs["local"][0].get(key)
    if key[1] not in own or l is None:
        continue
    for field in ("p50_us", "gpu_us"):
        a, b = p.get(field), l.get(field)
        if not a or not b or a != a or b != b:
            continue
        ratio = a / b
        worst = max(worst, abs(ratio - 1))
        print(f"{key[1][:66]:66s} {field:8s} {a:10.1f} {b:10.1f} {ratio:7.3f}")
print(f"worst |packaged/local - 1| = {100 * worst:.1f}% ({'within' if worst <= 0.03 else 'OUTSIDE'} 3%)")
sys.exit(0 if worst <= 0.03 else 1)
EOF
) > "$OUT/compare.txt" 2>&1
        rc=$?
        verdict compare $rc "$(tail -1 "$OUT/compare.txt")"
    fi
fi

echo "files under $OUT"
cat "$OUT/verdicts.txt" 2>/dev/null
[ "$fails" -eq 0 ]
