"""Side-by-side GPU benchmark: ORT raw / ORT's optimizer / bertfuse, one process, one table.

Every variant runs the same inputs (padding in the rows), with IO binding and inputs already
on the device (the runtime variant also pays its own host->device copy of the request),
after warm-up, timed per call with the host clock around a synchronous run (ORT synchronises
at the end of each run), many repeats, p50/p99. Parity is max |diff| against ORT's raw fp32
on the GPU, over valid (unpadded) positions. No TensorFlow is needed: the raw model is a
weight-stripped skeleton refilled with seeded weights, then fused here by bertfuse's passes.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable
import threading

import numpy as np
import onnx

from bertfuse.bench.forms import FIRST_ROW, KernelsSetup, plan_rows
from bertfuse.bench.models import bound_session, memcpy_nodes, packed_form, prepare_models
from bertfuse.bench.peers import best_peer, setup_peers
from bertfuse.bench.timing import compare, time_calls, time_interleaved
from bertfuse.io.inputs import padded_request as request
from bertfuse.runtime.request_checks import model_facts
from bertfuse.optional import optional
from bertfuse.runtime.pool import SessionPool
from bertfuse.runtime.session import Session

@dataclass
class Result:
    workload: str
    variant: str
    p50_us: float = float("nan")
    p99_us: float = float("nan")
    seq_per_s: float = float("nan")
    max_diff: float = float("nan")
    mean_diff: float = float("nan")
    gpu_us: float | None = None  # the kernels' summed durations per call (CUPTI)
    gpu_busy_us: float | None = None  # the union of their intervals (PDL overlap once)
    kernels: int | None = None
    note: str = ""
    breakdown: list = field(default_factory=list)


@dataclass(frozen=True)
class Rows:
    """Which rows a workload runs beyond ORT raw fp32 (the parity reference) and bertfuse's
    plain sessions."""

    kernels: KernelsSetup | None = None  # also the bertfuse-kernels form (kernels.py)
    ort_models: bool = True  # ORT raw fp16 and ORT's transformer optimizer
    paired: bool = False  # of the contrib runtime rows only those the kernels form has too
    peers: bool = True  # ORT's optimizer on a PyTorch export, torch SDPA (peers.py)


def run_workload(name: str, skeleton: str, batch: int, seq: int, iters: int, work: str,
                 profiles: list | None = None, rows: Rows = Rows(),
                 paths: dict[str, str] | None = None) -> tuple[list[Result], dict[str, str]]:
    """Times every variant; the runtime rows' kernel profiles are queued on `profiles` as
    (result, call) to run after all timing (CUPTI left enabled slows later launches).
    paths: the models prepare_models made from this skeleton already (another workload)."""
    if paths is None or "raw32" not in paths:
        paths = prepare_models(skeleton, tempfile.mkdtemp(dir=work), ort_models=rows.ort_models)
    facts = model_facts(onnx.load(paths["raw32"], load_external_data=False))
    feeds = request(batch, seq, facts.vocab_size or 1000)
    mask = feeds["input_mask"]
    results: list[Result] = []

    fn, outs, sess, keep = bound_session(paths["raw32"], feeds)
    p50, p99 = time_calls(fn, iters)
    ref = {k: v.numpy().astype(np.float64) for k, v in outs.items()}
    results.append(Result(name, "ORT raw fp32", p50, p99, batch / p50 * 1e6, 0.0, 0.0))
    del fn, outs, sess, keep

    # The bertfuse-kernels models first (plan_rows): a plain session of one is a row too.
    runtime, kernels_notes, skipped = plan_rows(rows.kernels, paths, rows.paired)
    variants = [("ORT raw fp16", "raw16", False, ""),
                ("ORT bert_tf fp16", "opt16", False, paths.get("ort_fused", "")),
                ("ORT bert_tf fp16 + CUDA graph", "opt16", True, ""),
                ("bertfuse fp32 plain session", "bertfuse32", False, ""),
                ("bertfuse fp16 plain session", "bertfuse16", False, ""),
                ("bertfuse fp16 plain session, bertfuse kernels", "kernels16", False, "")]
    for label, key, graph, note in variants:
        if key not in paths:  # not made: ORT's own (ort_models=False), kernels (rows say why)
            continue
        path = paths[key]
        try:
            fn, outs, sess, keep = bound_session(path, feeds, graph=graph)
            p50, p99 = time_calls(fn, iters)
            mx, mean = compare({k: v.numpy() for k, v in outs.items()}, ref, mask)
            if label.startswith("bertfuse"):
                note = f"memcpy nodes: {memcpy_nodes(path)}"
            results.append(Result(name, label, p50, p99, batch / p50 * 1e6, mx, mean, note=note))
            del fn, outs, sess, keep
        except Exception as exc:
            results.append(Result(name, label, note=f"failed: {str(exc).splitlines()[0][:160]}"))

    # The runtime rows are built first, then timed in alternating rounds (a shared host
    # drifts by ~10% between minutes; interleaving puts the drift on every row alike).
    # The bertfuse-kernels form joins them, so both forms share the rounds.
    model_of = {label: key for label, key, _ in runtime}
    built = {}
    for label, key, kw in runtime:
        try:
            built[label] = runtime_session(paths[key], feeds, **kw)
        except Exception as exc:
            results.append(Result(name, label, note=f"failed: {str(exc).splitlines()[0][:200]}"))
    peers, peer_ref, peer_failed = (setup_peers(_metadata(paths["raw32"]), feeds, work)
                                    if rows.peers else ({}, {}, {}))
    results += [Result(name, label, note=why) for label, why in peer_failed.items()]
    calls = {label: call for label, (sess, call) in built.items()}
    calls.update({label: peer[0] for label, peer in peers.items()})  # the same rounds
    timed = time_interleaved(calls, iters)
    for label, (sess, call) in built.items():
        res = Result(name, label, *timed[label])
        res.seq_per_s = batch / res.p50_us * 1e6
        res.max_diff, res.mean_diff = compare(call(to_host=True), ref, mask)
        res.note = _host_split(sess, feeds, iters)
        key = model_of[label]
        if FIRST_ROW.get(key) == label:  # what the rewrite made, once per model
            res.note = f"{kernels_notes[key]}; {res.note}"
        results.append(res)
        if profiles is not None and "synchronous" not in label:
            profiles.append((res, call))
    for label, (call, outputs, note) in peers.items():
        res = Result(name, label, *timed[label], note=f"{note}; parity vs its own fp32 torch "
                     "forward (other random weights); each request from its host arrays")
        res.seq_per_s = batch / res.p50_us * 1e6
        res.max_diff, res.mean_diff = compare(outputs(), peer_ref, mask)
        results.append(res)
        if profiles is not None:
            profiles.append((res, call))
    return results + [Result(name, label, note=note) for label, note in skipped], paths


def _metadata(path: str) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}


def runtime_session(path: str, feeds: dict[str, np.ndarray], packed: bool = False,
                     **kw) -> tuple[object, Callable]:
    """bertfuse's Session on one bucket of exactly the request's shape, warmed up, and its
    call (packed=True: every request goes to the packed form, in its token bucket)."""
    batch, seq = feeds["input_ids"].shape
    if packed:
        kw.update(packed_model=packed_form(onnx.load(path)), pack_below_fill=1.01)
    sess = Session(path, max_batch=batch, max_seq=seq, batch_buckets=(batch,),
                   seq_buckets=(seq,), device="cuda", cuda_graph=True, **kw)
    sess.warmup([(batch, seq)], packed=True)
    args = (feeds["input_ids"], feeds["input_mask"], feeds["segment_ids"])

    def call(to_host: bool = False) -> object:
        return sess.run(*args, to_host=to_host)

    return sess, call


def _host_split(sess, feeds: dict[str, np.ndarray], iters: int) -> str:
    """Where the host time goes: our request preparation vs ORT's replay call."""
    if sess.packed is not None:
        return "every request packed (token-bucket CUDA graph)"
    batch, seq = feeds["input_ids"].shape
    bucket = sess.bucket(batch, seq)
    mode = sess.session_for(feeds["input_mask"], bucket, batch, seq)
    checked = sess.check(dict(feeds))

    def prepare() -> None:  # the rest of what run() does before ORT: variant, staging, copy
        sess.session_for(feeds["input_mask"], bucket, batch, seq)
        bucket.fill(checked, batch, seq, sess.validate)

    check, _ = time_calls(lambda: sess.check(dict(feeds)), iters)
    prep, _ = time_calls(prepare, iters)
    replay, _ = time_calls(sess.replay_call(feeds["input_mask"]), iters)
    graph = "CUDA graph" if sess.cuda_graph else f"no graph: {sess.fallback_reason}"
    chosen = f"; {sess.kernels.line()}" if sess.kernels.asked == "auto" else ""
    lane = "native fast lane" if sess.fast_lane else "checked path"
    return (f"{graph}; attention mask path: {mode}; request via the {lane} (the checked path: "
            f"check {check:.0f} us + prep {prep:.0f} us) + ORT run {replay:.0f} us{chosen}")


def soak(model_path: str, requests: int = 10_000, seed: int = 3) -> dict:
    """Device memory in use across many mixed-shape requests, after warm-up; and threads."""
    s = Session(model_path, max_batch=32, max_seq=128, batch_buckets=(1, 4, 8, 16, 32),
                seq_buckets=(32, 64, 128), device="cuda", cuda_graph=True)
    s.warmup()
    rng = np.random.default_rng(seed)
    vocab = s.facts.vocab_size or 1000
    before = s.device_memory_used()
    samples = []
    t0 = time.perf_counter()
    for i in range(requests):
        b, q = int(rng.integers(1, 33)), int(rng.integers(1, 129))
        f = request(b, q, vocab, seed=i)
        s.run(f["input_ids"], f["input_mask"], f["segment_ids"], to_host=False)
        if i % 1000 == 0:
            samples.append(s.device_memory_used())
    wall = time.perf_counter() - t0
    after = s.device_memory_used()
    # Several threads at once (through a pool of replicas) must give the same answers as one.
    f = request(8, 64, vocab, seed=99)
    want = s.run(f["input_ids"], f["input_mask"], f["segment_ids"])
    errors: list[float] = []
    pool = SessionPool(lambda: Session(model_path, max_batch=8, max_seq=64, batch_buckets=(8,),
                                       seq_buckets=(64,), device="cuda"), replicas=2)

    def worker() -> None:
        for _ in range(100):
            got = pool.run(f["input_ids"], f["input_mask"], f["segment_ids"])
            errors.append(max(float(np.abs(got[k] - want[k]).max()) for k in want))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pool.close()
    return {"requests": requests, "wall_s": round(wall, 2), "mem_before": before,
            "mem_after": after, "mem_samples": samples, "threads": 4,
            "thread_max_diff": max(errors) if errors else None,
            "dlpack_max_diff": _dlpack_check(s, f, want)}


def _dlpack_check(s, feeds: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> object:
    """Device inputs (torch CUDA tensors, through DLPack) give the NumPy path's outputs."""
    try:
        torch = optional("torch", why="the PyTorch peer, where installed")
    except ImportError:
        return "torch not installed"
    dev = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    got = s.run(dev["input_ids"], dev["input_mask"], dev["segment_ids"])
    return max(float(np.abs(got[k] - want[k]).max()) for k in want)


def format_table(results: list[Result]) -> str:
    lines = ["| workload | variant | p50 (us) | p99 (us) | seq/s | x bertfuse | x best peer | "
             "GPU (us) | GPU busy (us) | wall - GPU (us) | max diff | mean diff | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by_workload: dict[str, float] = {r.workload: r.p50_us for r in results
                                     if r.variant == "bertfuse fp16 runtime (arena + CUDA graph)"}
    for r in results:
        base = by_workload.get(r.workload, float("nan"))
        peer = best_peer(results, r.workload)
        gpu = f"{r.gpu_us:.1f}" if r.gpu_us else ""
        busy = f"{r.gpu_busy_us:.1f}" if r.gpu_busy_us else ""
        host = f"{r.p50_us - r.gpu_us:.1f}" if r.gpu_us else ""
        lines.append(f"| {r.workload} | {r.variant} | {r.p50_us:.1f} | {r.p99_us:.1f} | "
                     f"{r.seq_per_s:,.0f} | {r.p50_us / base:.2f} | {r.p50_us / peer:.2f} | "
                     f"{gpu} | {busy} | {host} | {r.max_diff:.2e} | {r.mean_diff:.2e} | {r.note} |")
    return "\n".join(lines)
