"""BertAttention end to end inside ONNX Runtime's CUDA EP (GPU host): one-node models through
libbertfuse_ops.so, against the float64 reference, plus the op's error statuses and a CUDA-graph
replay with new inputs bound in place.

    python3 benchmarks/kernels/kernels_attention_ort.py --lib build/libbertfuse_ops.so

Needs onnxruntime-gpu and onnx. Gate: max |diff| <= 4e-2, mean <= 2e-3, no NaN. Prints one line
per check and writes $OUT/kernels_attention_ort.json (or --out). Exit 0 when all pass, 1 when
one fails, 2 on bad arguments or a missing GPU/package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from kernels_attention import (  # importing it puts bertfuse on sys.path
    GATE_MAX, GATE_MEAN, Unavailable, check_paths, make_case, reference)

from bertfuse.io.safety import handle_signals, write_text


def session(ort, lib: Path, model, graph: bool):
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    opts = {"enable_cuda_graph": "1"} if graph else {}
    return ort.InferenceSession(model.SerializeToString(), so, providers=[("CUDAExecutionProvider", opts)])


def gate(out: np.ndarray, ref: np.ndarray) -> dict:
    d = np.abs(out.astype(np.float64) - ref)
    mx, mean = float(np.max(d)), float(np.mean(d))
    return {"max_abs": mx, "mean_abs": mean, "ok": bool(mx <= GATE_MAX and mean <= GATE_MEAN)}


def plain_cases(ort, lib: Path, make_model, rng) -> list[dict]:
    rows = []
    for b, s, heads, kind in [(20, 64, 12, "raw"), (20, 64, 12, "keylen"), (20, 64, 12, "none"),
                              (2, 100, 12, "raw"), (1, 1, 12, "raw"), (32, 128, 12, "raw")]:
        qkv, mask = make_case(rng, b, s, heads, kind, b > 1)
        model = make_model("B", "S", heads * 64, heads, mask_shape=None if mask is None else
                           (("B", "S") if mask.ndim == 2 else ("B",)))
        feeds = {"qkv": qkv} if mask is None else {"qkv": qkv, "mask": mask}
        out = session(ort, lib, model, False).run(None, feeds)[0]
        rows.append({"case": f"b{b} s{s} h{heads} {kind}", **gate(out, reference(qkv, mask, heads, 1 / 8))})
    return rows


def error_cases(ort, lib: Path, make_model, rng) -> list[dict]:
    """Unsupported shapes and bad masks must fail the run with the op's own message."""
    rows = []
    cases = [("head size 32", 2, 64, 24, 32, None, "unsupported shape"),
             ("S 129", 2, 129, 12, 64, None, "unsupported shape"),
             ("mask [B, S+1]", 2, 64, 12, 64, (2, 65), "mask")]
    for label, b, s, heads, d, mask_shape, expect in cases:
        qkv = rng.standard_normal((b, s, 3 * heads * d)).astype(np.float16)
        feeds = {"qkv": qkv}
        if mask_shape is not None:
            feeds["mask"] = np.ones(mask_shape, np.int32)
        model = make_model("B", "S", heads * d, heads, mask_shape=None if mask_shape is None else ("B", "M"))
        try:
            session(ort, lib, model, False).run(None, feeds)
            rows.append({"case": label, "ok": False, "error": "ran without an error"})
        except Exception as exc:  # ORT raises its own exception types for a failed status
            msg = str(exc)
            rows.append({"case": label, "ok": "bertfuse BertAttention" in msg and expect in msg,
                         "error": msg.splitlines()[-1][:300]})
    return rows


def graph_case(ort, lib: Path, make_model, rng) -> list[dict]:
    """enable_cuda_graph=1 with IO binding: the first run captures, later runs replay the graph;
    new inputs written in place must give new, correct outputs."""
    b, s, heads = 20, 64, 12
    model = make_model(b, s, heads * 64, heads, mask_shape=(b, s))
    sess = session(ort, lib, model, True)
    qkv, mask = make_case(rng, b, s, heads, "raw", True)
    x = ort.OrtValue.ortvalue_from_numpy(qkv, "cuda", 0)
    m = ort.OrtValue.ortvalue_from_numpy(mask, "cuda", 0)
    y = ort.OrtValue.ortvalue_from_shape_and_type((b, s, heads * 64), np.float16, "cuda", 0)
    io = sess.io_binding()
    io.bind_ortvalue_input("qkv", x)
    io.bind_ortvalue_input("mask", m)
    io.bind_ortvalue_output("context", y)
    rows = []
    for step in range(3):
        if step:
            qkv, mask = make_case(rng, b, s, heads, "raw", step == 2)
            x.update_inplace(qkv)
            m.update_inplace(mask)
        sess.run_with_iobinding(io)
        rows.append({"case": f"cuda graph run {step}", **gate(y.numpy(), reference(qkv, mask, heads, 1 / 8))})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, required=True, help="libbertfuse_ops.so")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    check_paths(args.lib, args.out)
    try:
        import onnxruntime as ort

        from bertfuse.ops.bertfuse.bert_attention import make_model
    except ImportError as exc:
        raise Unavailable(f"onnxruntime-gpu and onnx are needed: {exc}") from None
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Unavailable(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider")
    rng = np.random.default_rng(args.seed)
    rows = plain_cases(ort, args.lib, make_model, rng) + error_cases(ort, args.lib, make_model, rng) \
        + graph_case(ort, args.lib, make_model, rng)
    write_text(args.out / "kernels_attention_ort.json",
               json.dumps({"onnxruntime": ort.__version__, "library": str(args.lib), "checks": rows}, indent=1))
    for r in rows:
        detail = f"max {r['max_abs']:.2e} mean {r['mean_abs']:.2e}" if "max_abs" in r else r.get("error", "")
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']}: {detail}")
    bad = sum(not r["ok"] for r in rows)
    print(f"{bad} failing checks" if bad else "all checks pass")
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        with handle_signals():
            sys.exit(main())
    except Unavailable as exc:
        print(f"kernels_attention_ort: {exc}", file=sys.stderr)
        sys.exit(2)
