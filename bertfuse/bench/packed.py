"""Padded vs packed bertfuse on the GPU, part of `bertfuse bench`.

For each workload and length mix, the same request runs through:
- padded: the fused model in the runtime (arena + CUDA graph, exact [batch, seq] bucket);
- packed: its `--packed` form in PackedSession (token buckets, a CUDA graph each);
- packed, no CUDA graph (what the graphs give);
- routed: Session(fused, packed_model=...), which picks per request by fill.
Parity is packed vs padded over kept positions and the pooled rows whose token 0 is kept.
fp32 runs with TF32 off (`use_tf32=0`), so that fp32 parity means fp32.
A fill sweep shows where packing starts to pay, which sets the routing default.
Under load (`streams`), 1, 2, 4 threads keep as many requests in flight through a
SessionPool of as many replicas, with requests drawn from the mix: throughput and latency,
padded vs packed, the same requests.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable
import argparse
import tempfile

import numpy as np
import onnx

from bertfuse.bench import packed_forms
from bertfuse.bench.models import packed_form, prepare_models
from bertfuse.bench.timing import time_interleaved
from bertfuse.pipeline.options import PRECISIONS
from bertfuse.bench.workloads import PACKED_WORKLOADS as WORKLOADS
from bertfuse.bench.workloads import Lengths
from bertfuse.io.inputs import lengths_request as request
from bertfuse.ops.packing_layout import choose_shape
from bertfuse.optional import optional
from bertfuse.runtime.packed import PackedSession
from bertfuse.runtime.pool import SessionPool
from bertfuse.runtime.request_checks import model_facts
from bertfuse.runtime.session import Session

def _mixes(lengths: Lengths, rng: np.random.Generator, batch: int,
           seq: int) -> dict[str, np.ndarray]:
    mixed = lengths(rng, batch, seq)
    ones = mixed.copy()
    ones[::3] = 1
    return {"mixed": mixed, "all full": np.full(batch, seq), "with length-1 rows": ones}


def uniform_case(argv: list[str] | None, description: str, iters: int) -> tuple:
    """For the GPU scripts in benchmarks/: parses --skeleton/--iters, builds the fp16 fused
    model from the skeleton, and draws one request of the uniform [8, 64] b20 s64 mix.
    Returns (args, fused model, (ids, mask, segs))."""
    ort = optional("onnxruntime", why="ONNX Runtime's fusions, the bench's rival")

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--skeleton", required=True)
    ap.add_argument("--iters", type=int, default=iters)
    args = ap.parse_args(argv)
    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from pip's nvidia-* wheels (ORT >= 1.21)
        ort.preload_dlls()
    paths = prepare_models(args.skeleton, tempfile.mkdtemp(), anchors=False)
    _, b, s, lengths = WORKLOADS["uniform [8,64] b20 s64"]
    return args, onnx.load(paths["bertfuse16"]), request(
        lengths(np.random.default_rng(7), b, s), s, 1000)


def diff(got: dict, want: dict, mask: np.ndarray) -> tuple[float, float]:
    keep = mask != 0
    d_seq = np.abs(got["sequence_output"].astype(np.float64) - want["sequence_output"])[keep]
    rows = keep[:, 0]
    d_pool = np.abs(got["pooled_output"].astype(np.float64) - want["pooled_output"])[rows]
    return float(max(d_seq.max(), d_pool.max())), float(np.concatenate(
        [d_seq.reshape(-1), d_pool.reshape(-1)]).mean())


def run(paths_for: Callable[[str], dict[str, str]], iters: int,
        workloads: list[str] | None = None, streams: tuple[int, ...] = (1, 2, 4),
        kernels: Any = None) -> dict:
    """Rows of the padded-vs-packed table and the fill sweep; paths_for(config) gives the
    prepared model paths (bench.prepare_models). kernels: the run's KernelsSetup with
    `--forms both` (the fp16 rows then time the bertfuse-kernels forms too, or say why
    not: packed_forms.py), None for `--forms contrib`."""
    rows, sweep, load = [], [], []
    for name in workloads or list(WORKLOADS):
        config, batch, seq, lengths_fn = WORKLOADS[name]
        paths = paths_for(config)
        for precision in PRECISIONS:
            fused = onnx.load(paths["bertfuse32" if precision == "fp32" else "bertfuse16"])
            packed_model = packed_form(fused)
            vocab = model_facts(fused).vocab_size or 1000
            opts = {"use_tf32": "0"} if precision == "fp32" else {}
            kw = dict(max_batch=batch, max_seq=seq, batch_buckets=(batch,), seq_buckets=(seq,),
                      device="cuda", provider_options=opts, kernels="ort")  # forms as given
            forms, knote = packed_forms.kernels_forms(kernels, paths) \
                if precision == "fp16" else ({}, "")
            kmakers, ksessions, knote = packed_forms.open_sessions(forms, kw, knote)
            padded = Session(fused, **kw)
            packed = PackedSession(packed_model, **kw)
            nograph = PackedSession(packed_model, **{**kw, "cuda_graph": False})
            routed = Session(fused, packed_model=packed_model, **kw)
            for mix, lengths in _mixes(lengths_fn, np.random.default_rng(7), batch, seq).items():
                ids, mask, segs = request(lengths, seq, vocab)
                row = {"workload": name, "mix": mix, "fill": round(float(mask.mean()), 2),
                       "precision": precision, **({"kernels": knote} if knote else {})}
                try:
                    want = padded.run(ids, mask, segs)
                    got = packed.run(ids, mask, segs)
                    row["max_diff"], row["mean_diff"] = diff(got, want, mask)
                    row["packed_shape"] = dataclasses.astuple(choose_shape(
                        packed.shapes_for(batch, seq), batch, int(np.count_nonzero(mask))))
                    if ksessions:
                        row["kpacked_max_diff"], row["kpacked_mean_diff"] = diff(
                            ksessions["kpacked"].run(ids, mask, segs), want, mask)
                    sessions = {"padded": padded, "packed": packed, "packed_nograph": nograph,
                                "routed": routed, **ksessions}
                    timed = time_interleaved(
                        {k: (lambda s=s: s.run(ids, mask, segs, to_host=False))
                         for k, s in sessions.items()}, iters)
                    for key, (p50, p99) in timed.items():
                        row[f"{key}_p50_us"], row[f"{key}_p99_us"] = p50, p99
                    row["speedup"] = round(row["padded_p50_us"] / row["packed_p50_us"], 2)
                    row["routed_speedup"] = round(row["padded_p50_us"] / row["routed_p50_us"], 2)
                    row["graph"] = packed.cuda_graph or packed.fallback_reason
                    if ksessions:
                        packed_forms.add_ratios(row, "_p50_us", higher_better=False)
                except Exception as exc:
                    row["error"] = str(exc).splitlines()[0][:200]
                rows.append(row)
                print("  ", row, flush=True)
            if precision == "fp16":
                sweep += _fill_sweep(name, padded, packed, batch, seq, vocab, iters)
            del padded, packed, nograph, routed, ksessions
            if precision == "fp16" and streams:
                draws = [request(lengths_fn(np.random.default_rng(100 + i), batch, seq), seq,
                                 vocab, seed=i) for i in range(32)]
                makers = {
                    "padded": lambda: Session(fused, **kw),
                    "packed": lambda: PackedSession(packed_model, **kw),
                    "packed16": lambda: PackedSession(packed_model, token_steps=16, **kw),
                    "routed": lambda: Session(fused, packed_model=packed_model, **kw),
                    **kmakers}
                for n in streams:
                    head = {"workload": name, "precision": precision, "streams": n,
                            **({"kernels": knote} if knote else {})}
                    try:
                        load.append({**head, **under_load(makers, draws, n, (batch, seq))})
                        if kmakers:
                            packed_forms.add_ratios(load[-1], "_seq_per_s", higher_better=True)
                    except Exception as exc:
                        load.append({**head, "error": str(exc).splitlines()[0][:200]})
                    print("   load", load[-1], flush=True)
    return {"rows": rows, "sweep": sweep, "load": load}


def under_load(makers: dict[str, Callable[[], Any]], draws: list[tuple], streams: int,
               bucket: tuple[int, int], requests: int = 1200, rounds: int = 4) -> dict:
    """Throughput (seq/s) and latency (p50/p99 us) of each kind of session with `streams`
    threads, each on its own replica, running the same draws; kinds alternate by round.
    Also the largest difference between a replica's outputs under load and one session's
    outputs for the same request (replicas must not disturb each other)."""
    pools = {}
    for kind, make in makers.items():
        warm = {"packed": True} if kind == "routed" else {}
        pools[kind] = SessionPool(make, streams,
                                  prepare=lambda session, warm=warm: session.warmup([bucket],
                                                                                    **warm))
    per_thread = max(10, requests // (rounds * streams))
    stats: dict[str, dict] = {k: {"lat": [], "seqs": 0, "wall": 0.0} for k in pools}
    for r in range(rounds + 1):  # round 0 warms the threads up and is not counted
        for kind, pool in pools.items():
            lat, seqs, wall = _drive(pool, draws, streams, per_thread, start=r)
            if r:
                stats[kind]["lat"] += lat
                stats[kind]["seqs"] += seqs
                stats[kind]["wall"] += wall
    out: dict[str, Any] = {}
    for kind, st in stats.items():
        out[f"{kind}_seq_per_s"] = round(st["seqs"] / st["wall"])
        out[f"{kind}_p50_us"] = round(float(np.percentile(st["lat"], 50)) * 1e6, 1)
        out[f"{kind}_p99_us"] = round(float(np.percentile(st["lat"], 99)) * 1e6, 1)
    for kind in pools:
        if kind != "padded":
            out[f"{kind}_speedup"] = round(out[f"{kind}_seq_per_s"] / out["padded_seq_per_s"], 2)
    out["replica_max_diff"] = _replica_diff(pools, makers, draws, streams)
    return out


def _drive(pool, draws: list[tuple], threads: int, per_thread: int,
           start: int = 0) -> tuple[list[float], int, float]:
    """`threads` threads, each running `per_thread` of the draws back to back through the
    pool; returns per-request latencies (s), sequences served and wall time (s)."""
    barrier = threading.Barrier(threads + 1)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    seqs = [0] * threads

    def work(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            ids, mask, segs = draws[(start * 13 + t * 7 + i) % len(draws)]
            t0 = time.perf_counter()
            pool.call(lambda session: session.run(ids, mask, segs, to_host=False))
            latencies[t].append(time.perf_counter() - t0)
            seqs[t] += ids.shape[0]

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    return [x for lat in latencies for x in lat], sum(seqs), time.perf_counter() - t0


def _replica_diff(pools: dict, makers: dict, draws: list[tuple], streams: int) -> float:
    """Every kind's pool, driven by `streams` threads at once with host outputs, against a
    fresh single session of the same kind on the same request: the max |diff| seen."""
    worst = 0.0
    for kind, pool in pools.items():
        single = makers[kind]()
        want = [single.run(*d) for d in draws[:8]]
        got: list = [None] * len(want)

        def work(t: int) -> None:
            for i in range(t, len(want), streams):
                got[i] = pool.run(*draws[i])

        workers = [threading.Thread(target=work, args=(t,)) for t in range(streams)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for g, w_, d in zip(got, want, draws):
            worst = max(worst, diff(g, w_, d[1])[0])
        del single
    for pool in pools.values():
        pool.close()
    return worst


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
    kinds = ("padded", "packed", "packed16", "routed")
    lines += ["", "| workload | streams | " + " | ".join(
        f"{k} seq/s (p50/p99 us)" for k in kinds) + " | packed/padded | packed16/padded | "
        "routed/padded | replica max diff |", "|---|---|" + "---|" * (len(kinds) + 4)]
    for r in result.get("load", []):
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['streams']} | failed: {r['error']} |")
            continue
        cells = [f"{r[k + '_seq_per_s']:,} ({r[k + '_p50_us']:.0f}/{r[k + '_p99_us']:.0f})"
                 for k in kinds]
        lines.append(f"| {r['workload']} | {r['streams']} | " + " | ".join(cells) + " | "
                     f"{r['packed_speedup']} | {r['packed16_speedup']} | "
                     f"{r['routed_speedup']} | {r['replica_max_diff']:.2e} |")
    kernels = packed_forms.format_tables(result)
    return "\n".join(lines + (["", kernels] if kernels else []))
