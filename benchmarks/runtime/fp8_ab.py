"""FP8 weights with and without the e4m3 hand-offs, against fp16, in one process (GPU host).

For each workload, five forms of the config refilled from its skeleton, all on bertfuse's ops:
fp16; FP8 weights with each op quantising its own input (passes/fp8_weights.py alone); the
`--fp8` plan (the hand-offs of passes/fp8_handoff.py) with FFN up's e4m3 output written by the
GELU pass (`bf_check_set_fp8_out(0)` while that session captures its graph); the `--fp8` plan as
shipped, where FFN up's FP8 GEMM writes its e4m3 output itself; and the same with the attention's
fp16 context written again (the plan leaves it off: only its e4m3 copy is read). Activation scales are
calibrated as `convert --fp8` does (its default parity inputs); every FP8 form has fast
accumulation and the tanh GELU, as the plan writes them. Each is timed in alternating rounds
(ORT's replay of the warm bucket), profiled with CUPTI (GPU time, kernel count) and measured
against the fp32 fused model on the same request (max and mean |diff| per output, and the cosine
of the pooled output). The first two FP8 forms must agree bit for bit: the hand-offs move the
quantisation, not its math. The shipped form differs from them only where the GEMM rounds its
fp32 result to e4m3 once instead of through fp16; that difference is printed. The last two must
agree bit for bit: leaving the context off changes no byte the model reads.

    python3 benchmarks/runtime/fp8_ab.py --skeletons out/skeletons [--iters 2000]

Writes $OUT/fp8_ab.json; the table is printed last. Exit 1 when either pair differs.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np
from gpu_setup import (accuracy, bucket_session, lowered, parse_args, print_table, record, save,
                       start_ort, workloads)

FORMS = ("fp16", "FP8, quantise in each op", "FP8, hand-offs, GELU pass writes e4m3",
         "FP8, hand-offs (as shipped)", "FP8, as shipped but the attention writes its context")
GELU_PASS = FORMS[2]  # captured with the GEMM's own e4m3 output off
COLUMNS = [  # the table printed last: (header, key in a form's row, format)
    ("replay p50 (us)", "replay_p50_us", ".1f"),
    ("GPU (us)", "gpu_us", ".1f"),
    ("kernels", "kernels", ""),
    ("max diff vs fp32", "max_diff", ".3g"),
    ("mean diff", "mean_diff", ".3g"),
    ("pooled cosine", "pooled_cosine", ".6f"),
]


def models(skeleton: str) -> dict[str, str]:
    import onnx

    from bertfuse.passes.cleanup import Cleanup
    from bertfuse.passes.fp8_weights import Fp8Weights
    from bertfuse.passes.manager import run_passes
    from bertfuse.pipeline.fp8 import FP8_IR_VERSION, calibrate, dense_inputs, to_fp8
    from bertfuse.pipeline.lowering import model_feeds
    from bertfuse.pipeline.options import ConvertOptions

    paths, k16, work = lowered(skeleton, "fp8-ab-")
    contrib, kmodel = onnx.load(paths["bertfuse16"]), onnx.load(k16)
    opts = ConvertOptions()
    amax = calibrate(contrib, dense_inputs(kmodel), model_feeds(contrib, opts.batch, opts.seq, opts.seed))
    per_op, _ = run_passes(kmodel, [Fp8Weights(amax), Cleanup()])
    per_op.ir_version = max(per_op.ir_version, FP8_IR_VERSION)
    shipped = to_fp8(kmodel, amax)  # the --fp8 plan
    kept = onnx.ModelProto()
    kept.CopyFrom(shipped)
    for n in kept.graph.node:  # the context the plan leaves off, written again (read by nothing)
        if n.op_type == "BertAttention" and not n.output[0]:
            n.output[0] = f"{n.name}_context_unread"
    out = {"bertfuse32": paths["bertfuse32"], FORMS[0]: k16}
    for form, m in ((FORMS[1], per_op), (FORMS[3], shipped), (FORMS[4], kept)):
        out[form] = os.path.join(work, f"{form.replace(', ', '_').replace(' ', '-')}.onnx")
        onnx.save(m, out[form])
    out[GELU_PASS] = out[FORMS[3]]  # the same file: only the capture setting differs
    return out


def main() -> int:
    args = parse_args(__doc__)
    ort = start_ort()
    from bertfuse.bench.timing import kernel_profile, time_interleaved
    from bertfuse.kernels.library import locate

    rows, lib = [], None
    for config, batch, seq, paths, f in workloads(args.skeletons, models):
        req = (f["input_ids"], f["input_mask"], f["segment_ids"])
        opened, outs = {}, {}
        for form in ("bertfuse32",) + FORMS:
            opened[form] = bucket_session(paths[form], batch, seq)
            if lib is None and form != "bertfuse32":  # the library ORT loaded: the same handle
                lib = ctypes.CDLL(str(locate()))
            if lib is not None:
                lib.bf_check_set_fp8_out(0 if form == GELU_PASS else 1)
            outs[form] = opened[form].run(*req)  # warms the bucket: captured under that setting
            if lib is not None:
                lib.bf_check_set_fp8_out(1)
        ref = outs.pop("bertfuse32")
        opened.pop("bertfuse32").close()
        calls = {form: s.replay_call(f["input_mask"]) for form, s in opened.items()}
        t = time_interleaved(calls, args.iters, rounds=20)
        row = {"workload": f"{config} b{batch} s{seq}"}
        for form, s in opened.items():
            gpu, count, top, busy = kernel_profile(calls[form])
            row[form] = {"replay_p50_us": t[form][0], "replay_p99_us": t[form][1], "gpu_us": gpu,
                         "gpu_busy_us": busy, "kernels": count, "top": top[:8],
                         **accuracy(outs[form], ref), "kernels_line": s.kernels.line()}
        a, b, c = outs[FORMS[1]], outs[FORMS[2]], outs[FORMS[3]]
        row["fp8_forms_max_diff"] = max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)
        row["gemm_e4m3_max_diff"] = max(float(np.abs(c[k].astype(np.float64) - b[k]).max()) for k in b)
        row["gemm_e4m3_mean_diff"] = max(float(np.abs(c[k].astype(np.float64) - b[k]).mean()) for k in b)
        row["context_kept_max_diff"] = max(float(np.abs(outs[FORMS[4]][k].astype(np.float64) - c[k]).max())
                                           for k in c)
        record(rows, row, opened)
    save("fp8_ab.json", {"onnxruntime": ort.__version__, "rows": rows})
    print_table(rows, FORMS, COLUMNS)
    bad = [r["workload"] for r in rows if r["fp8_forms_max_diff"] != 0]
    print(f"\nquantise in each op against the hand-offs: they differ in {', '.join(bad)}" if bad else
          "\nquantise in each op against the hand-offs: bit for bit equal in every workload")
    kept = [r["workload"] for r in rows if r["context_kept_max_diff"] != 0]
    print(f"the context left off against written: they differ in {', '.join(kept)}" if kept else
          "the context left off against written: bit for bit equal in every workload")
    bad += kept
    for r in rows:
        print(f"{r['workload']}: the GEMM's own e4m3 output against the GELU pass's: max "
              f"{r['gemm_e4m3_max_diff']:.3g}, mean {r['gemm_e4m3_mean_diff']:.3g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
