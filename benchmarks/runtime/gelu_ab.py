"""The exact GELU against `--gelu-approximation`, on bertfuse's ops, in one process (GPU host).

For each workload, the config refilled from its skeleton and fused twice with bertfuse's passes
(fp16): as the model computes it (erf GELU: DenseBiasGelu approximate = 0, cuBLASLt's GEMM with
the bias, then the erf GELU kernel) and with `--gelu-approximation` (FastGelu, then
DenseBiasGelu approximate = 1: cuBLASLt's bias + GELU epilogue, no GELU kernel). Both are
lowered to bertfuse's ops as `convert --ops bertfuse` does and opened as runtime Sessions
(CUDA graph, one warm bucket). Timed in alternating rounds: ORT's replay of the bucket and the
whole `Session.run(..., to_host=False)`; then CUPTI's GPU time and kernel count per request,
and each form's error against the fp32 fused model (exact GELU) on the same request: max and
mean |diff| per output, and the cosine of the pooled output. The fp16 limits (max 4e-2, mean
2e-3) are what convert's parity gate holds either form to; the table says whether each form
is within them here.

    python3 benchmarks/runtime/gelu_ab.py --skeletons out/skeletons [--iters 2000]

Writes $OUT/gelu_ab.json; the table is printed last. Exit 1 where a form is outside the fp16
limits or the approximated model still runs a GELU kernel.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
from gpu_setup import (accuracy, bucket_session, parse_args, print_table, record, save,
                       start_ort, workloads)

FORMS = ("fp16, exact GELU", "fp16, --gelu-approximation")
LIMITS = (4e-2, 2e-3)  # the fp16 parity limits (pipeline/parity.py)
COLUMNS = [  # the table printed last: (header, key in a form's row, format)
    ("run p50 (us)", "run_p50_us", ".1f"),
    ("replay p50 (us)", "replay_p50_us", ".1f"),
    ("GPU (us)", "gpu_us", ".1f"),
    ("GPU busy (us)", "gpu_busy_us", ".1f"),
    ("kernels", "kernels", ""),
    ("max diff vs fp32", "max_diff", ".3g"),
    ("mean diff", "mean_diff", ".3g"),
    ("pooled cosine", "pooled_cosine", ".6f"),
    ("fp16 limits", "fp16_limits", ""),
]


def models(skeleton: str) -> dict[str, str]:
    import onnx

    from bertfuse.bench.forms import kernels_model
    from bertfuse.bench.models import prepare_models
    from bertfuse.passes.manager import run_passes
    from bertfuse.passes.plans import fusion_plan

    work = tempfile.mkdtemp(prefix="gelu-ab-")
    paths = prepare_models(skeleton, work, ort_models=False)  # raw32 refilled, fused fp32/fp16
    approx, report = run_passes(onnx.load(paths["raw32"]), fusion_plan("fp16", True))
    fast = sum(1 for d in report.diagnostics if d.component == "fast_gelu" and d.fused)
    os.makedirs(os.path.join(work, "approx"))
    paths["approx16"] = os.path.join(work, "approx", "bertfuse16.onnx")
    onnx.save(approx, paths["approx16"])
    out = {"bertfuse32": paths["bertfuse32"], "fast_gelu_rewrites": str(fast)}
    for form, fused in zip(FORMS, (paths["bertfuse16"], paths["approx16"])):
        path, note = kernels_model(fused, os.path.dirname(fused))
        if path is None:
            raise SystemExit(f"gelu_ab: {note}")
        out[form] = path
    return out


def main() -> int:
    args = parse_args(__doc__)
    ort = start_ort()
    from bertfuse.bench.timing import kernel_profile, time_interleaved

    rows, bad = [], []
    for config, batch, seq, paths, f in workloads(args.skeletons, models):
        req = (f["input_ids"], f["input_mask"], f["segment_ids"])
        opened, outs = {}, {}
        for form in ("bertfuse32",) + FORMS:
            opened[form] = bucket_session(paths[form], batch, seq)
            outs[form] = opened[form].run(*req)  # warms the bucket
        ref = outs.pop("bertfuse32")
        opened.pop("bertfuse32").close()
        calls = {}
        for form, s in opened.items():
            calls[f"{form}: replay"] = s.replay_call(f["input_mask"])
            calls[f"{form}: run"] = (lambda s=s: s.run(*req, to_host=False))
        t = time_interleaved(calls, args.iters, rounds=20)
        row = {"workload": f"{config} b{batch} s{seq}",
               "fast_gelu_rewrites": int(paths["fast_gelu_rewrites"])}
        for form, s in opened.items():
            gpu, count, top, busy = kernel_profile(calls[f"{form}: replay"])
            row[form] = {"replay_p50_us": t[f"{form}: replay"][0],
                         "run_p50_us": t[f"{form}: run"][0], "run_p99_us": t[f"{form}: run"][1],
                         "gpu_us": gpu, "gpu_busy_us": busy, "kernels": count, "top": top[:8],
                         **accuracy(outs[form], ref), "kernels_line": s.kernels.line()}
            v = row[form]
            v["within_fp16_limits"] = bool(v["max_diff"] <= LIMITS[0]
                                           and v["mean_diff"] <= LIMITS[1])
            v["fp16_limits"] = "within" if v["within_fp16_limits"] else "OUTSIDE"
            if not v["within_fp16_limits"]:
                bad.append(f"{row['workload']} {form}: outside the fp16 limits")
        a, b = outs[FORMS[0]], outs[FORMS[1]]
        row["forms_max_diff"] = max(float(np.abs(a[k].astype(np.float64) - b[k]).max())
                                    for k in a)
        if row[FORMS[1]]["kernels"] >= row[FORMS[0]]["kernels"]:
            bad.append(f"{row['workload']}: the approximated model runs as many kernels")
        record(rows, row, opened)
    save("gelu_ab.json", {"onnxruntime": ort.__version__, "rows": rows, "problems": bad})
    print_table(rows, FORMS, COLUMNS)
    for r in rows:
        print(f"{r['workload']}: {r['fast_gelu_rewrites']} GELUs rewritten; the two forms "
              f"differ by max {r['forms_max_diff']:.3g}")
    print("\n".join(bad) if bad else "both forms within the fp16 limits in every workload")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
