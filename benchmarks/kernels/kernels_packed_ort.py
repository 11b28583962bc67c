"""The device-packed encoder end to end inside ONNX Runtime's CUDA EP (GPU host): a BERT of
random weights (tests/support/builders) fused to fp16, rewritten to bertfuse ops (the padded model), then
to the device-packed form (passes/device_packing.py: PackTokens, PackedBertAttention,
UnpackTokens); both run through libbertfuse_ops.so.

    python3 benchmarks/kernels/kernels_packed_ort.py --lib build/libbertfuse_ops.so

Checks: packed vs padded on the same requests (sequence_output at kept positions and pooled rows
whose token 0 is kept: fp16 max <= 4e-2, mean <= 2e-3; zeros at padded positions), for the uniform
[8,64] mix, a smaller request in the bucket, holes and left padding, all-full rows, and the token
bucket the runtime would pick (filler rows). Then CUDA graphs: one (B, S, T) capture, new requests
written in place, each replay against a plain run. Then per-request time of CUDA-graph replays
(ORT's run with IO binding, synchronised), padded vs device-packed. Needs onnxruntime-gpu, onnx,
onnx-graphsurgeon. Writes $OUT/kernels_packed_ort.json (or --out), prints one line per check and
the timing last. Exit 0 when all pass, 1 when one fails, 2 on bad arguments or a missing GPU/package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from kernels_attention import GATE_MAX, GATE_MEAN, Unavailable, check_paths  # puts bertfuse on sys.path
from kernels_attention_ort import session

from bertfuse.io.safety import handle_signals, write_text

ROOT = Path(__file__).resolve().parents[2]


def build_models(args, rng):
    """(padded bertfuse-kernels model, device-packed model)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.builders.onnx_graphs import bert

    from bertfuse.passes.bertfuse_encoder import BertfuseKernels
    from bertfuse.passes.cleanup import Cleanup
    from bertfuse.passes.manager import run_passes
    from bertfuse.passes.plans import fusion_plan
    from bertfuse.passes.device_packing import PackingKernelsPass

    raw = bert(rng, layers=args.layers, hidden=args.hidden, heads=args.hidden // 64, inter=4 * args.hidden,
               vocab=200, positions=args.seq)
    contrib, report = run_passes(raw, fusion_plan("fp16"))
    if not report.table.fully_fused:
        raise RuntimeError("the random BERT did not fuse fully")
    padded, _ = run_passes(contrib, [BertfuseKernels(), Cleanup()])
    packed, pack_report = run_passes(padded, [PackingKernelsPass(), Cleanup()])
    misses = [d.reason for d in pack_report.diagnostics if not d.fused]
    if misses:
        raise RuntimeError(f"packing_kernels missed: {misses[0]}")
    return padded, packed


def requests(rng, b: int, s: int) -> list[tuple[str, np.ndarray]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from support.builders.onnx_graphs import mask_rows

    def right(lens):
        m = np.zeros((b, s), np.int32)
        m[:len(lens)] = np.arange(s)[None, :] < np.asarray(lens)[:, None]
        return m
    return [("uniform [8,64]", right(rng.integers(8, s + 1, b))),
            ("13-row request in the bucket", right(rng.integers(8, s + 1, min(13, b)))),
            ("holes and left padding", mask_rows(b, s, rng)),
            ("all full", np.ones((b, s), np.int32)),
            ("length-1 rows", right(np.where(np.arange(b) % 3 == 0, 1, rng.integers(8, s + 1, b))))]


def feeds_for(rng, mask: np.ndarray) -> dict[str, np.ndarray]:
    b, s = mask.shape
    return {"input_ids": rng.integers(0, 200, (b, s)).astype(np.int32),
            "segment_ids": rng.integers(0, 2, (b, s)).astype(np.int32), "input_mask": mask}


def bucket_tokens(mask: np.ndarray) -> int:
    from bertfuse.ops.packing_layout import choose_shape, packed_shapes

    b, s = mask.shape
    return choose_shape(packed_shapes(b, s), b, int(np.count_nonzero(mask))).tokens


def compare(padded: dict, packed: dict, mask: np.ndarray) -> dict:
    keep = mask != 0
    seq = np.abs(packed["sequence_output"][keep].astype(np.float64) - padded["sequence_output"][keep])
    first = keep[:, 0]
    pooled = np.abs(packed["pooled_output"][first].astype(np.float64) - padded["pooled_output"][first])
    mx = float(max(seq.max(), pooled.max(initial=0.0)))
    mean = float(seq.mean())
    zero_pad = bool(not packed["sequence_output"][~keep].any())
    return {"max_abs": mx, "mean_abs": mean, "padding_zero": zero_pad,
            "ok": bool(mx <= GATE_MAX and mean <= GATE_MEAN and zero_pad)}


def plain_checks(ort, lib: Path, padded_model, packed_model, rng, b: int, s: int) -> list[dict]:
    pad_sess, pack_sess = session(ort, lib, padded_model, False), session(ort, lib, packed_model, False)
    names = [o.name for o in pack_sess.get_outputs()]
    rows = []
    for label, mask in requests(rng, b, s):
        feeds = feeds_for(rng, mask)
        want = dict(zip(names, pad_sess.run(names, feeds)))
        for tokens in sorted({int(np.count_nonzero(mask)), bucket_tokens(mask)}):
            got = dict(zip(names, pack_sess.run(names, {**feeds, "token_bucket": np.zeros(tokens, np.int32)})))
            rows.append({"case": f"{label}, T {tokens}", **compare(want, got, mask)})
    return rows


class Bound:
    """One session with CUDA graphs and IO binding on device buffers of fixed shapes."""

    def __init__(self, ort, lib: Path, model, feeds: dict[str, np.ndarray]) -> None:
        self.sess = session(ort, lib, model, True)
        self.io = self.sess.io_binding()
        self.inputs = {n: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for n, v in feeds.items()
                       if n in {i.name for i in self.sess.get_inputs()}}
        for n, v in self.inputs.items():
            self.io.bind_ortvalue_input(n, v)
        self.names = [o.name for o in self.sess.get_outputs()]
        for n in self.names:
            self.io.bind_output(n, "cuda")
        uncaptured = ort.RunOptions()
        uncaptured.add_run_config_entry("gpu_graph_id", "-1")
        self.sess.run_with_iobinding(self.io, uncaptured)  # shapes, then fixed output buffers
        shapes = [v.shape() for v in self.io.get_outputs()]
        self.io.clear_binding_outputs()
        self.outputs = {n: ort.OrtValue.ortvalue_from_shape_and_type(d, np.float32, "cuda", 0)
                        for n, d in zip(self.names, shapes)}
        for n, v in self.outputs.items():
            self.io.bind_ortvalue_output(n, v)
        for _ in range(2):  # capture
            self.sess.run_with_iobinding(self.io)

    def run(self, feeds: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        for n, v in (feeds or {}).items():
            if n in self.inputs:
                self.inputs[n].update_inplace(v)
        self.sess.run_with_iobinding(self.io)
        return {n: v.numpy() for n, v in self.outputs.items()}

    def time_us(self, iters: int) -> float:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            self.sess.run_with_iobinding(self.io)
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1e6


def graph_checks(ort, lib: Path, packed_model, rng, b: int, s: int) -> list[dict]:
    """One capture at the bucket of the first request; later requests of that bucket written in
    place must match a plain run of the same request with the same T."""
    reqs = requests(rng, b, s)
    tokens = max(bucket_tokens(m) for _, m in reqs)
    bucket = {"token_bucket": np.zeros(tokens, np.int32)}
    plain = session(ort, lib, packed_model, False)
    names = [o.name for o in plain.get_outputs()]
    first = feeds_for(rng, reqs[0][1])
    bound = Bound(ort, lib, packed_model, {**first, **bucket})
    rows = []
    for label, mask in reqs:
        feeds = feeds_for(rng, mask)
        got = bound.run(feeds)
        want = dict(zip(names, plain.run(names, {**feeds, **bucket})))
        diff = max(float(np.abs(got[n].astype(np.float64) - want[n]).max()) for n in names)
        rows.append({"case": f"cuda graph T {tokens}, {label}", "max_abs": diff, "mean_abs": 0.0,
                     "ok": bool(diff <= GATE_MAX)})
    return rows


def timing(ort, lib: Path, padded_model, packed_model, rng, b: int, s: int, iters: int) -> list[dict]:
    rows = []
    for label, mask in requests(rng, b, s):
        feeds = feeds_for(rng, mask)
        pad = Bound(ort, lib, padded_model, feeds)
        pack = Bound(ort, lib, packed_model, {**feeds, "token_bucket": np.zeros(bucket_tokens(mask), np.int32)})
        pad_us, pack_us = pad.time_us(iters), pack.time_us(iters)
        rows.append({"case": label, "fill": round(float(np.count_nonzero(mask)) / mask.size, 2),
                     "T": bucket_tokens(mask), "padded_us": pad_us, "packed_us": pack_us,
                     "speedup": pad_us / pack_us})
        del pad, pack
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, required=True, help="libbertfuse_ops.so")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=768, help="a multiple of 64 (head size 64)")
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    if args.hidden < 64 or args.hidden % 64 or not 1 <= args.seq <= 128 or min(args.layers, args.batch,
                                                                                args.iters) < 1:
        raise Unavailable("--hidden must be a multiple of 64, --seq 1..128, --layers/--batch/--iters >= 1")
    check_paths(args.lib, args.out)
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise Unavailable(f"onnxruntime-gpu is needed: {exc}") from None
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Unavailable(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider")
    rng = np.random.default_rng(args.seed)
    padded, packed = build_models(args, rng)
    b, s = args.batch, args.seq
    checks = plain_checks(ort, args.lib, padded, packed, rng, b, s) + graph_checks(ort, args.lib, packed, rng, b, s)
    times = timing(ort, args.lib, padded, packed, rng, b, s, args.iters)
    write_text(args.out / "kernels_packed_ort.json", json.dumps(
        {"onnxruntime": ort.__version__, "library": str(args.lib), "config": vars(args) | {"lib": str(args.lib),
                                                                                         "out": str(args.out)},
         "checks": checks, "timings": times}, indent=1))
    for r in checks:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']}: max {r['max_abs']:.2e} mean {r['mean_abs']:.2e}"
              + ("" if r.get("padding_zero", True) else " (padding NOT zero)"))
    print(f"\nORT run with IO binding, CUDA graph replay, synchronised (us, median of {args.iters}); "
          f"{args.layers} layers, hidden {args.hidden}, b{b} s{s}")
    print("| request | fill | T | padded | device-packed | speedup |")
    print("|---|---|---|---|---|---|")
    for t in times:
        print(f"| {t['case']} | {t['fill']} | {t['T']} | {t['padded_us']:.1f} | {t['packed_us']:.1f} | "
              f"{t['speedup']:.2f} |")
    bad = sum(not r["ok"] for r in checks)
    print(f"\n{bad} failing checks" if bad else "\nall checks pass")
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        with handle_signals():
            sys.exit(main())
    except Unavailable as exc:
        print(f"kernels_packed_ort: {exc}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as exc:
        print(f"kernels_packed_ort: {exc}", file=sys.stderr)
        sys.exit(1)
