"""Padded vs packed bertfuse on the GPU (issue 5), part of `bertfuse bench`.

For each workload and length mix, the same request runs through:
- padded: the fused model in the runtime (arena + CUDA graph, exact [batch, seq] bucket);
- packed: its `--packed` form in PackedSession (token buckets, a CUDA graph each);
- packed, no CUDA graph (what the graphs give);
- routed: Session(fused, packed_model=...), which picks per request by fill.
Parity is packed vs padded over kept positions and the pooled rows whose token 0 is kept.
fp32 runs with TF32 off (`use_tf32=0`), so that fp32 parity means fp32.
A fill sweep shows where packing starts to pay, which sets the routing default.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import onnx

from bertfuse.passes.cleanup import Cleanup
from bertfuse.passes.manager import run_passes
from bertfuse.passes.packing import PackingPass, choose_shape
from bertfuse.runtime.bench import time_interleaved

Lengths = Callable[[np.random.Generator, int, int], np.ndarray]

WORKLOADS: dict[str, tuple[str, int, int, Lengths]] = {
    # name: (model config, batch, seq, lengths(rng, batch, seq))
    "uniform [8,64] b20 s64": ("shenma-3l", 20, 64, lambda r, b, s: r.integers(8, 65, b)),
    "skewed b32 s128": ("base", 32, 128, lambda r, b, s: np.concatenate(
        [r.integers(8, 25, b - 4), np.full(4, s)])),
}


def _mixes(lengths: Lengths, rng: np.random.Generator, batch: int,
           seq: int) -> dict[str, np.ndarray]:
    mixed = lengths(rng, batch, seq)
    ones = mixed.copy()
    ones[::3] = 1
    return {"mixed": mixed, "all full": np.full(batch, seq), "with length-1 rows": ones}


def request(lengths: np.ndarray, seq: int, vocab: int, seed: int = 1) -> tuple:
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = rng.integers(1, vocab, size=mask.shape).astype(np.int32) * mask
    segs = np.zeros(mask.shape, np.int32)
    segs[:, seq // 2:] = 1
    return ids, mask, segs


def diff(got: dict, want: dict, mask: np.ndarray) -> tuple[float, float]:
    keep = mask != 0
    d_seq = np.abs(got["sequence_output"].astype(np.float64) - want["sequence_output"])[keep]
    rows = keep[:, 0]
    d_pool = np.abs(got["pooled_output"].astype(np.float64) - want["pooled_output"])[rows]
    return float(max(d_seq.max(), d_pool.max())), float(np.concatenate(
        [d_seq.reshape(-1), d_pool.reshape(-1)]).mean())


def packed_form(fused: onnx.ModelProto) -> onnx.ModelProto:
    model, _ = run_passes(fused, [PackingPass(), Cleanup()])
    return model


def run(paths_for: Callable[[str], dict[str, str]], iters: int,
        workloads: list[str] | None = None) -> dict:
    """Rows of the padded-vs-packed table and the fill sweep; paths_for(config) gives the
    prepared model paths (bench.prepare_models)."""
    from bertfuse.runtime.packed import PackedSession
    from bertfuse.runtime.session import Session, model_facts

    rows, sweep = [], []
    for name in workloads or list(WORKLOADS):
        config, batch, seq, lengths_fn = WORKLOADS[name]
        paths = paths_for(config)
        for precision in ("fp32", "fp16"):
            fused = onnx.load(paths["bertfuse32" if precision == "fp32" else "bertfuse16"])
            packed_model = packed_form(fused)
            vocab = model_facts(fused).vocab_size or 1000
            opts = {"use_tf32": "0"} if precision == "fp32" else {}
            kw = dict(max_batch=batch, max_seq=seq, batch_buckets=(batch,), seq_buckets=(seq,),
                      device="cuda", provider_options=opts)
            padded = Session(fused, **kw)
            packed = PackedSession(packed_model, **kw)
            nograph = PackedSession(packed_model, **{**kw, "cuda_graph": False})
            routed = Session(fused, packed_model=packed_model, **kw)
            for mix, lengths in _mixes(lengths_fn, np.random.default_rng(7), batch, seq).items():
                ids, mask, segs = request(lengths, seq, vocab)
                row = {"workload": name, "mix": mix, "fill": round(float(mask.mean()), 2),
                       "precision": precision}
                try:
                    want = padded.run(ids, mask, segs)
                    got = packed.run(ids, mask, segs)
                    row["max_diff"], row["mean_diff"] = diff(got, want, mask)
                    row["packed_shape"] = dataclasses.astuple(choose_shape(
                        packed.shapes_for(batch, seq), batch, int(np.count_nonzero(mask))))
                    sessions = {"padded": padded, "packed": packed, "packed_nograph": nograph,
                                "routed": routed}
                    timed = time_interleaved(
                        {k: (lambda s=s: s.run(ids, mask, segs, to_host=False))
                         for k, s in sessions.items()}, iters)
                    for key, (p50, p99) in timed.items():
                        row[f"{key}_p50_us"], row[f"{key}_p99_us"] = p50, p99
                    row["speedup"] = round(row["padded_p50_us"] / row["packed_p50_us"], 2)
                    row["routed_speedup"] = round(row["padded_p50_us"] / row["routed_p50_us"], 2)
                    row["graph"] = packed.cuda_graph or packed.fallback_reason
                except Exception as exc:
                    row["error"] = str(exc).splitlines()[0][:200]
                rows.append(row)
                print("  ", row, flush=True)
            if precision == "fp16":
                sweep += _fill_sweep(name, padded, packed, batch, seq, vocab, iters)
            del padded, packed, nograph, routed
    return {"rows": rows, "sweep": sweep}


def _fill_sweep(name: str, padded, packed, batch: int, seq: int, vocab: int,
                iters: int) -> list[dict]:
    out = []
    rng = np.random.default_rng(11)
    for fill in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        lengths = np.clip(np.round(rng.normal(fill * seq, 0.1 * seq, batch)), 1, seq).astype(int)
        ids, mask, segs = request(lengths, seq, vocab)
        timed = time_interleaved({"padded": lambda: padded.run(ids, mask, segs, to_host=False),
                                  "packed": lambda: packed.run(ids, mask, segs, to_host=False)},
                                 iters)
        t_pad, t_pack = timed["padded"][0], timed["packed"][0]
        out.append({"workload": name, "fill": round(float(mask.mean()), 2),
                    "padded_p50_us": round(t_pad, 1), "packed_p50_us": round(t_pack, 1),
                    "speedup": round(t_pad / t_pack, 2)})
        print("   sweep", out[-1], flush=True)
    return out


def format_tables(result: dict) -> str:
    lines = ["| workload | mix | fill | precision | padded p50 | packed p50 (graph) | speedup | "
             "packed, no graph | routed p50 | seq/s padded | seq/s packed | max diff | "
             "mean diff |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['mix']} | {r['fill']} | {r['precision']} | "
                         f"failed: {r['error']} |")
            continue
        batch = int(r["workload"].split(" b")[1].split()[0])
        lines.append(
            f"| {r['workload']} | {r['mix']} | {r['fill']} | {r['precision']} | "
            f"{r['padded_p50_us']:.1f} | {r['packed_p50_us']:.1f} | {r['speedup']} | "
            f"{r['packed_nograph_p50_us']:.1f} | {r['routed_p50_us']:.1f} | "
            f"{batch / r['padded_p50_us'] * 1e6:,.0f} | {batch / r['packed_p50_us'] * 1e6:,.0f} | "
            f"{r['max_diff']:.2e} | {r['mean_diff']:.2e} |")
    lines += ["", "| workload | fill | padded p50 | packed p50 | speedup |", "|---|---|---|---|---|"]
    for r in result["sweep"]:
        lines.append(f"| {r['workload']} | {r['fill']} | {r['padded_p50_us']} | "
                     f"{r['packed_p50_us']} | {r['speedup']} |")
    return "\n".join(lines)
