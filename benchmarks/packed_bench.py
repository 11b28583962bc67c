"""Padded vs packed bertfuse on the GPU (issue 5), one process, one table.

    python3 benchmarks/packed_bench.py --skeletons .carry --out $OUT

For each workload: the fused model (fp32 and fp16) padded, run by the runtime (arena + CUDA
graph, exact bucket), against its packed form (`--packed`) run by PackedSession (host packs
the tokens per request). Parity is packed vs padded on kept positions (pooled: every row,
token 0 is kept). The all-full variant of each workload checks packing costs nothing there.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import onnx

from bertfuse.passes.cleanup import Cleanup
from bertfuse.passes.manager import run_passes
from bertfuse.passes.packing import PackingPass
from bertfuse.runtime.bench import prepare_models, time_calls
from bertfuse.runtime.packed import PackedSession
from bertfuse.runtime.session import Session, model_facts

WORKLOADS = {  # name: (config, batch, seq, lengths(rng))
    "uniform [8,64] b20 s64": ("shenma-3l", 20, 64, lambda r: r.integers(8, 65, 20)),
    "skewed b32 s128": ("base", 32, 128,
                        lambda r: np.concatenate([r.integers(8, 25, 28), np.full(4, 128)])),
}


def feeds_for(lengths: np.ndarray, batch: int, seq: int, vocab: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = rng.integers(1, vocab, size=(batch, seq)).astype(np.int32) * mask
    segs = np.zeros((batch, seq), np.int32)
    segs[:, seq // 2:] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segs}


def packed_path(fused: str) -> str:
    model, _ = run_passes(onnx.load(fused), [PackingPass(), Cleanup()])
    path = fused.replace(".onnx", "_packed.onnx")
    onnx.save(model, path)
    return path


def diff(a: dict, b: dict, mask: np.ndarray) -> tuple[float, float]:
    d_seq = np.abs(a["sequence_output"].astype(np.float64) - b["sequence_output"])[mask != 0]
    d_pool = np.abs(a["pooled_output"].astype(np.float64) - b["pooled_output"])
    return float(max(d_seq.max(), d_pool.max())), float(np.mean([d_seq.mean(), d_pool.mean()]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skeletons", required=True)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    rows = []
    for name, (config, batch, seq, lengths_fn) in WORKLOADS.items():
        paths = prepare_models(os.path.join(args.skeletons, f"{config}_raw.skel.onnx"),
                               tempfile.mkdtemp())
        vocab = model_facts(onnx.load(paths["bertfuse16"], load_external_data=False)).vocab_size
        rng = np.random.default_rng(7)
        for mix, lengths in (("mixed", lengths_fn(rng)), ("all full", np.full(batch, seq))):
            f = feeds_for(lengths, batch, seq, vocab)
            args3 = (f["input_ids"], f["input_mask"], f["segment_ids"])
            fill = float(np.mean(lengths) / seq)
            for prec, fused in (("fp32", paths["bertfuse32"]), ("fp16", paths["bertfuse16"])):
                row = {"workload": name, "mix": mix, "fill": round(fill, 2), "precision": prec}
                try:
                    padded = Session(fused, max_batch=batch, max_seq=seq, batch_buckets=(batch,),
                                     seq_buckets=(seq,), device="cuda", cuda_graph=True)
                    padded.warmup([(batch, seq)])
                    row["padded_p50_us"], _ = time_calls(
                        lambda: padded.run(*args3, to_host=False), args.iters)
                    want = padded.run(*args3)
                    packed = PackedSession(packed_path(fused))
                    row["packed_p50_us"], _ = time_calls(
                        lambda: packed.run(*args3, to_host=False), args.iters)
                    got = packed.run(*args3)
                    row["max_diff"], row["mean_diff"] = diff(got, want, f["input_mask"])
                    row["speedup"] = round(row["padded_p50_us"] / row["packed_p50_us"], 2)
                    row["seq_per_s_padded"] = round(batch / row["padded_p50_us"] * 1e6)
                    row["seq_per_s_packed"] = round(batch / row["packed_p50_us"] * 1e6)
                except Exception as exc:
                    row["error"] = str(exc).splitlines()[0][:200]
                rows.append(row)
                print(row, flush=True)
    with open(os.path.join(args.out, "packed_bench.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    print("| workload | mix | fill | precision | padded p50 (us) | packed p50 (us) | speedup "
          "| seq/s padded | seq/s packed | max diff | mean diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['workload']} | {r['mix']} | {r['fill']} | {r['precision']} | "
                  f"failed: {r['error']} |")
            continue
        print(f"| {r['workload']} | {r['mix']} | {r['fill']} | {r['precision']} | "
              f"{r['padded_p50_us']:.1f} | {r['packed_p50_us']:.1f} | {r['speedup']} | "
              f"{r['seq_per_s_padded']:,} | {r['seq_per_s_packed']:,} | {r['max_diff']:.2e} | "
              f"{r['mean_diff']:.2e} |")


if __name__ == "__main__":
    main()
