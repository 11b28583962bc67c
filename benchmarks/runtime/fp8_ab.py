"""FP8 weights with and without the e4m3 hand-offs, against fp16, in one process (GPU host).

For each workload, four models of the config refilled from its skeleton, all on bertfuse's ops:
fp16; FP8 weights with each op quantising its own input (passes/fp8_weights.py alone); FP8 with
the hand-offs (passes/fp8_handoff.py, the op before writing the e4m3 input), both with full
accumulation (fast_accum = 0); and the `--fp8` plan as shipped: hand-offs with Hopper's fast
FP8 accumulation (fast_accum = 1). Activation scales are calibrated
as `convert --fp8` does (its default parity inputs). Each is timed in alternating rounds (ORT's
replay of the warm bucket), profiled with CUPTI (GPU time, kernel count) and measured against
the raw fp32 model on the same request (max and mean |diff| per output, and the cosine of the
pooled output). The two FP8 forms without fast accumulation must agree bit for bit: the
hand-off moves the quantisation, not its math.

    python3 benchmarks/runtime/fp8_ab.py --skeletons out/skeletons [--iters 2000]

Writes $OUT/fp8_ab.json; the table is printed last. Exit 1 when the two FP8 forms differ.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np
from gpu_setup import WORKLOADS, parse_args, start_ort

FORMS = ("fp16", "FP8, quantise in each op", "FP8, hand-offs", "FP8, hand-offs, fast accumulation")


def models(skeleton: str) -> dict[str, str]:
    import onnx

    from bertfuse.bench.kernels import kernels_model
    from bertfuse.bench.models import prepare_models
    from bertfuse.passes.cleanup import Cleanup
    from bertfuse.passes.fp8_weights import Fp8Weights
    from bertfuse.passes.manager import run_passes
    from bertfuse.pipeline.fp8 import FP8_IR_VERSION, calibrate, dense_inputs, to_fp8
    from bertfuse.pipeline.lowering import model_feeds
    from bertfuse.pipeline.options import ConvertOptions

    work = tempfile.mkdtemp(prefix="fp8-ab-")
    paths = prepare_models(skeleton, work, anchors=False)
    k16, note = kernels_model(paths["bertfuse16"], work)
    if k16 is None:
        raise SystemExit(f"fp8_ab: {note}")
    contrib, kmodel = onnx.load(paths["bertfuse16"]), onnx.load(k16)
    opts = ConvertOptions()
    amax = calibrate(contrib, dense_inputs(kmodel), model_feeds(contrib, opts.batch, opts.seq, opts.seed))
    per_op, _ = run_passes(kmodel, [Fp8Weights(amax), Cleanup()])
    per_op.ir_version = max(per_op.ir_version, FP8_IR_VERSION)
    fast = to_fp8(kmodel, amax)  # the --fp8 plan as shipped
    per_op, chained = accumulation(per_op, 0), accumulation(fast, 0)
    fast = accumulation(fast, 1)
    out = {"bertfuse32": paths["bertfuse32"], FORMS[0]: k16}
    for form, m in zip(FORMS[1:], (per_op, chained, fast)):
        out[form] = os.path.join(work, f"{form.replace(', ', '_').replace(' ', '-')}.onnx")
        onnx.save(m, out[form])
    return out


def accumulation(model, fast: int):
    """A copy of the FP8 model with every FP8 op's fast_accum set to `fast`."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in out.graph.node:
        for a in n.attribute:
            if a.name == "fast_accum":
                a.i = fast
    return out


def main() -> int:
    args = parse_args(__doc__)
    ort = start_ort()
    from bertfuse.bench.timing import kernel_profile, time_interleaved
    from bertfuse.io.inputs import random_inputs
    from bertfuse.pipeline.fp8 import cosine
    from bertfuse.runtime import Session

    rows, built = [], {}
    for config, batch, seq in WORKLOADS:
        if config not in built:
            built[config] = models(os.path.join(args.skeletons, f"{config}_raw.skel.onnx"))
        paths = built[config]
        f = random_inputs(batch, seq, 1000, 2, seed=batch + seq)
        req = (f["input_ids"], f["input_mask"], f["segment_ids"])
        opened = {form: Session(paths[form], max_batch=batch, max_seq=seq, batch_buckets=(batch,),
                                seq_buckets=(seq,), device="cuda") for form in ("bertfuse32",) + FORMS}
        outs = {form: s.run(*req) for form, s in opened.items()}
        ref = outs.pop("bertfuse32")
        opened.pop("bertfuse32").close()
        calls = {form: s.replay_call(f["input_mask"]) for form, s in opened.items()}
        t = time_interleaved(calls, args.iters, rounds=20)
        row = {"workload": f"{config} b{batch} s{seq}"}
        for form, s in opened.items():
            gpu, count, top, busy = kernel_profile(calls[form])
            acc = {k: (float(np.abs(outs[form][k].astype(np.float64) - ref[k]).max()),
                       float(np.abs(outs[form][k].astype(np.float64) - ref[k]).mean())) for k in ref}
            pooled = [k for k in ref if ref[k].ndim == 2]
            row[form] = {"replay_p50_us": t[form][0], "replay_p99_us": t[form][1], "gpu_us": gpu,
                         "gpu_busy_us": busy, "kernels": count, "top": top[:8],
                         "max_diff": max(v[0] for v in acc.values()),
                         "mean_diff": max(v[1] for v in acc.values()),
                         "pooled_cosine": min((cosine(outs[form][k], ref[k]) for k in pooled),
                                              default=float("nan")),
                         "per_output": acc, "kernels_line": s.kernels.line()}
        a, b = outs[FORMS[1]], outs[FORMS[2]]
        row["fp8_forms_max_diff"] = max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)
        rows.append(row)
        print(json.dumps(row), flush=True)
        for s in opened.values():
            s.close()
    with open(os.path.join(os.environ.get("OUT", "."), "fp8_ab.json"), "w") as fh:
        json.dump({"onnxruntime": ort.__version__, "rows": rows}, fh, indent=1)
    print("\n| workload | form | replay p50 (us) | GPU (us) | kernels | max diff vs fp32 | "
          "mean diff | pooled cosine |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        for form in FORMS:
            v = r[form]
            print(f"| {r['workload']} | {form} | {v['replay_p50_us']:.1f} | {v['gpu_us']:.1f} | "
                  f"{v['kernels']} | {v['max_diff']:.3g} | {v['mean_diff']:.3g} | "
                  f"{v['pooled_cosine']:.6f} |")
    bad = [r["workload"] for r in rows if r["fp8_forms_max_diff"] != 0]
    print(f"\nthe FP8 forms differ in: {', '.join(bad)}" if bad else
          "\nthe two FP8 forms agree bit for bit in every workload")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
