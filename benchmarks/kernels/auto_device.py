"""kernels='auto' on the GPU: for each model, the contrib-form file opened by Session with
kernels='ort' and with kernels='auto' (the runtime's default), what auto chose and why, both
against ORT's raw fp32 graph at several shapes (kept positions), and their p50.

    python3 benchmarks/kernels/auto_device.py --skeletons out/skeletons shenma-3l minilm tinybert base

Skeletons are `<config>_raw.skel.onnx` (bench's; weights refilled here). The library is found
in the cache or built on first use by the runtime itself (ORT_INCLUDE_DIR for the headers).
Gate: fp16 limits (max <= 4e-2, mean <= 2e-3) for every row, NaN fails. Writes
$OUT/auto_device.json; the table is printed last; exit 1 when a row fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time

import numpy as np
import onnx

SHAPES = {"shenma-3l": [(20, 64), (1, 17), (4, 128), (2, 384)],
          "minilm": [(32, 128), (2, 1), (4, 384), (2, 512)],
          "tinybert": [(20, 64), (3, 129)],
          "base": [(8, 384), (1, 128), (32, 128)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skeletons", default="out/skeletons")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    import onnxruntime as ort

    ort.preload_dlls()
    from bertfuse.bench.models import prepare_models
    from bertfuse.bench.timing import time_calls
    from bertfuse.io.inputs import random_inputs
    from bertfuse.io.ort import make_session
    from bertfuse.runtime import Session
    from bertfuse.runtime.request_checks import model_facts

    out_dir = os.environ.get("OUT", ".")
    rows, choices = [], {}
    for name in args.models:
        work = tempfile.mkdtemp(prefix=f"auto-{name}-")
        t0 = time.perf_counter()
        paths = prepare_models(os.path.join(args.skeletons, f"{name}_raw.skel.onnx"), work, ort_models=False)
        print(f"{name}: models in {time.perf_counter() - t0:.1f} s", flush=True)
        facts = model_facts(onnx.load(paths["raw32"], load_external_data=False))
        shapes = [(b, s) for b, s in SHAPES[name] if s <= (facts.max_positions or 512)]
        max_b, max_s = max(b for b, _ in shapes), max(s for _, s in shapes)
        ref_sess = make_session(paths["raw32"], device="cuda", cuda_options={"use_tf32": "0"})
        sessions = {}
        for kernels in ("ort", "auto"):
            t0 = time.perf_counter()
            sessions[kernels] = Session(paths["bertfuse16"], max_batch=max_b, max_seq=max_s,
                                        batch_buckets=sorted({b for b, _ in shapes}),
                                        seq_buckets=sorted({s for _, s in shapes}),
                                        device="cuda", kernels=kernels)
            choice = sessions[kernels].kernels
            choices[f"{name} {kernels}"] = {**choice.to_json(), "open_s": round(time.perf_counter() - t0, 2)}
            print(f"{name} kernels={kernels}: {choice.line()} (open {time.perf_counter() - t0:.1f} s)", flush=True)
        for b, s in shapes:
            feeds = random_inputs(b, s, facts.vocab_size or 1000, facts.type_vocab_size or 2, seed=b * 1000 + s,
                                  pad_anywhere=True)
            want = dict(zip([o.name for o in ref_sess.get_outputs()], ref_sess.run(None, feeds)))
            keep = feeds["input_mask"].astype(bool)
            for kernels, sess in sessions.items():
                got = sess.run(feeds["input_ids"], feeds["input_mask"], feeds["segment_ids"])
                mx = mean = 0.0
                for k, w in want.items():
                    a, g = w.astype(np.float64), got[k].astype(np.float64)
                    if a.ndim >= 2 and a.shape[:2] == keep.shape:
                        a, g = a[keep], g[keep]
                    d = np.abs(a - g)
                    mx, mean = max(mx, float(d.max())), max(mean, float(d.mean()))
                args_ = (feeds["input_ids"], feeds["input_mask"], feeds["segment_ids"])
                p50, _ = time_calls(lambda: sess.run(*args_, to_host=False), args.iters)
                ok = bool(mx <= 4e-2 and mean <= 2e-3)
                rows.append({"model": name, "shape": f"b{b} s{s}", "kernels": kernels,
                             "used": sess.kernels.used, "max": mx, "mean": mean, "p50_us": p50, "ok": ok})
                print(rows[-1], flush=True)
        for sess in sessions.values():
            sess.close()
        del ref_sess
    with open(os.path.join(out_dir, "auto_device.json"), "w") as f:
        json.dump({"device": ort.get_device(), "onnxruntime": ort.__version__, "choices": choices,
                   "rows": rows}, f, indent=1)
    print("\n| model | shape | kernels | used | max | mean | p50 us | ok |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['shape']} | {r['kernels']} | {r['used']} | {r['max']:.2e} | "
              f"{r['mean']:.2e} | {r['p50_us']:.1f} | {'ok' if r['ok'] else 'FAIL'} |")
    bad = [r for r in rows if not r["ok"]]
    print(f"\n{len(bad)} failing rows" if bad else "\nall rows within fp16 limits")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
