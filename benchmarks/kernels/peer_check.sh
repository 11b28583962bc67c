#!/usr/bin/env bash
# On the GPU host, from the repo root: the torch.compile peer beside the other peers and
# bertfuse's rows in one `bertfuse bench` run, and the device-packed tables of
# `bertfuse bench --packed` with the op library.
#
#   bash benchmarks/kernels/peer_check.sh
#
# 1. `bertfuse kernels build` into $BERTFUSE_KERNELS_DIR (default /tmp/bertfuse-kernels; a
#    library already built there is reused).
# 2. `bertfuse bench` on shenma-3l b20 s64 with the peers (ORT's optimizer on a PyTorch export,
#    torch SDPA, torch.compile in the fastest of its set-ups; all fp16 + CUDA graph) and both forms of bertfuse,
#    timed in the same interleaved rounds; ORT's own fp16/optimizer rows left out
#    (--ort-rows reference) and of the contrib runtime rows only the kernels form's twins
#    (--runtime-rows paired), to save setup time.
# 3. `bertfuse bench --packed "$PACKED" --streams $STREAMS` (no padded workload): the contrib
#    form's padded/packed rows and the bertfuse-kernels padded and device-packed forms
#    (PACKED_PART=0 leaves it out).
# 4. If at least 150 s are left: the same bench as 2 on $BASE (default 'base b1 s128'; several
#    workloads separated by '|', e.g. BASE='base b1 s128|base b32 s128').
# 5. summary.txt: per workload every peer (p50, parity, note), the best peer, bertfuse's rows
#    against it; the device-packed rows: how many filled, how many failed and why.
#
# Skeletons (<config>_raw.skel.onnx) from $SKEL (default out/skeletons: `bertfuse example
# --config C`, `convert --no-fuse --no-verify`, `strip-weights`, made where TensorFlow is).
# Where one is missing there, the script builds a stand-in of that config with
# tests/support/builders (the graph tf2onnx writes, random weights, bert_config in its
# metadata for the peers) under $WORK, and says so.
#
# Needs: onnxruntime-gpu, onnx, onnx-graphsurgeon, numpy, ml_dtypes importable; torch (with
# triton) and transformers for the peers; nvcc for the build. No network, no TensorFlow.
# Everything stays under $BUDGET s (default 560): each step gets a timeout from what is left;
# bench writes its JSON after every workload.
# Writes under $OUT (default ./out/peer-check), 8 files: setup.log (env, skeletons, build),
# shenma/ packed/ base/ (bench.log, gpu_bench.json each; base/ only with the time),
# summary.txt.
set -uo pipefail

OUT="${OUT:-$PWD/out/peer-check}"
SKEL="${SKEL:-out/skeletons}"
WORK="${WORK:-/tmp/bertfuse-peer-check}"
ITERS="${ITERS:-300}"
BUDGET="${BUDGET:-560}"
PACKED="${PACKED:-uniform [8,64] b20 s64}"
STREAMS="${STREAMS:-4}"
PACKED_PART="${PACKED_PART:-1}"
BASE="${BASE:-base b1 s128}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
[ -f tests/support/builders/onnx_graphs.py ] || { echo "run from the repo root"; exit 2; }
mkdir -p "$OUT/shenma" "$OUT/packed" "$WORK/skel"
source benchmarks/kernels/budget.sh  # PYTHONPATH, PATH, left, cap

{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    "$PY" -c 'import onnxruntime as o, onnx, numpy
print("onnxruntime", o.__version__, o.get_available_providers(), "onnx", onnx.__version__,
      "numpy", numpy.__version__)
for name in ("torch", "triton", "transformers"):
    try:
        print(name, __import__(name).__version__)
    except ImportError as exc:
        print(name, "missing:", exc)'
    # Skeletons: $SKEL's, else a stand-in built here (bench needs <config>_raw.skel.onnx).
    "$PY" - "$SKEL" "$WORK/skel" <<'EOF'
import json, os, shutil, sys

import numpy as np
import onnx

sys.path.insert(0, "tests/support/builders")
from onnx_graphs import bert

skel, work = sys.argv[1:]
CONFIGS = {"shenma-3l": (21128, 3), "base": (30522, 12)}  # vocab, layers; hidden 768, 12 heads
for config, (vocab, layers) in CONFIGS.items():
    name = f"{config}_raw.skel.onnx"
    if os.path.isfile(os.path.join(skel, name)):
        shutil.copy(os.path.join(skel, name), os.path.join(work, name))
        print(f"skeleton {config}: {os.path.join(skel, name)}")
        continue
    model = bert(np.random.default_rng(0), layers=layers, hidden=768, heads=12, inter=3072,
                 vocab=vocab, positions=512, types=2)
    for o in model.graph.output:  # the shapes tf2onnx writes (the checker wants one)
        dims = ["B", "S", 768] if o.name == "sequence_output" else ["B", 768]
        o.CopyFrom(onnx.helper.make_tensor_value_info(o.name, onnx.TensorProto.FLOAT, dims))
    cfg = {"vocab_size": vocab, "hidden_size": 768, "num_hidden_layers": layers,
           "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
           "max_position_embeddings": 512, "type_vocab_size": 2}
    onnx.helper.set_model_props(model, {"bert_config": json.dumps(cfg)})
    onnx.save(model, os.path.join(work, name))
    print(f"skeleton {config}: none in {skel}; a stand-in from tests/support/builders")
EOF
    t0=$(date +%s)
    timeout -k 10 "$(cap 180 290)" "$PY" -m bertfuse.cli kernels build --json
    echo "kernels build: exit $? in $(( $(date +%s) - t0 )) s"
} > "$OUT/setup.log" 2>&1
grep -E '^(NVIDIA|H1|onnxruntime|torch|triton|transformers|skeleton|kernels build)' "$OUT/setup.log"

bench() {  # bench DIR TIMEOUT BENCH-ARGS...; the forms flag left at its default (both)
    local dir="$1" t="$2"
    shift 2
    if [ "$t" -lt 60 ]; then
        echo "bench $dir: skipped, ${t} s left of the budget"
        return
    fi
    mkdir -p "$OUT/$dir"
    local t0=$(date +%s)
    timeout -k 15 "$t" "$PY" -m bertfuse.cli bench --skeletons "$WORK/skel" "$@" \
        --iters "$ITERS" --out "$OUT/$dir" > "$OUT/$dir/bench.log" 2>&1
    local rc=$?
    echo "bench $dir: exit $rc in $(( $(date +%s) - t0 )) s (timeout $t s)"
    [ "$rc" -eq 0 ] || tail -5 "$OUT/$dir/bench.log"
}
PADDED=(--ort-rows reference --runtime-rows paired --packed)  # --packed alone: no packed part
bench shenma "$(cap 330 150)" --workloads "shenma-3l b20 s64" "${PADDED[@]}"
[ "$PACKED_PART" = 0 ] ||
    bench packed "$(cap 180 10)" --workloads --packed "$PACKED" --streams $STREAMS
IFS='|' read -r -a BASE_WORKLOADS <<< "$BASE"
[ "$(left)" -ge 150 ] && bench base "$(cap 400 10)" --workloads "${BASE_WORKLOADS[@]}" "${PADDED[@]}"

"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, os, sys

out = sys.argv[1]
for part in ("shenma", "base"):
    try:
        d = json.load(open(os.path.join(out, part, "gpu_bench.json")))
    except (OSError, ValueError) as exc:
        print(f"{part}: no gpu_bench.json ({exc})")
        continue
    best = d.get("best_peer", {})
    for r in d["results"]:
        w, v = r["workload"], r["variant"]
        if not (v.startswith("peer:") or v.startswith("bertfuse") and " runtime" in v):
            continue
        b = best.get(w, {}).get("p50_us")
        ratio = f"{r['p50_us'] / b:.2f}x best peer" if b and r["p50_us"] == r["p50_us"] else ""
        gpu = f", GPU {r['gpu_us']:.1f}" if r.get("gpu_us") else ""
        rate = f", {r['seq_per_s']:,.0f} seq/s" if r.get("seq_per_s") else ""
        print(f"{w} | {v} | p50 {r['p50_us']:.1f}{gpu}{rate} | {ratio} | max {r['max_diff']:.2e} "
              f"mean {r['mean_diff']:.2e} | {r['note'][:230]}")
    for w, b in best.items():
        print(f"{w}: best peer {b['variant']} p50 {b['p50_us']:.1f} us")
    print()
try:
    packed = json.load(open(os.path.join(out, "packed", "gpu_bench.json"))).get("packed", {})
except (OSError, ValueError) as exc:
    sys.exit(f"packed: no gpu_bench.json ({exc})")
for what, key in (("rows", "kpacked_p50_us"), ("load", "kpacked_seq_per_s")):
    rows = [r for r in packed.get(what, []) if r.get("precision") == "fp16"]  # no fp32 forms
    filled = [r for r in rows if key in r]
    print(f"packed {what}: {len(filled)} of {len(rows)} fp16 with the device-packed form")
    for r in rows:
        head = " ".join(str(r.get(k, "")) for k in ("workload", "mix", "precision", "streams"))
        if key in r:
            print(f"  {head}: kpadded {r.get(key.replace('kpacked', 'kpadded'))} kpacked "
                  f"{r[key]} padded {r.get(key.replace('kpacked', 'padded'))} "
                  f"(vs kpadded {r.get('kpacked_vs_kpadded')}, vs padded "
                  f"{r.get('kpacked_vs_padded')}) max diff {r.get('kpacked_max_diff', '')}")
        else:
            print(f"  {head}: {r.get('kernels') or r.get('error', 'no kernels note')}")
EOF
echo "total $(( $(date +%s) - start )) s; files under $OUT"
