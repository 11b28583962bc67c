"""Side-by-side GPU benchmark: ORT raw / ORT's optimizer / bertfuse, one process, one table.

Every variant runs the same inputs (padding in the rows), with IO binding and inputs already
on the device (the runtime variant also pays its own host->device copy of the request),
after warm-up, timed per call with the host clock around a synchronous run (ORT synchronises
at the end of each run), many repeats, p50/p99. Parity is max |diff| against ORT's raw fp32
on the GPU, over valid (unpadded) positions. No TensorFlow is needed: the raw model is a
weight-stripped skeleton refilled with seeded weights, then fused here by bertfuse's passes.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx

from bertfuse.inputs import padded_request as request
from bertfuse.passes.manager import default_passes, run_passes
from bertfuse.runtime.weights import fill_weights, is_stripped

WORKLOADS = {  # name: (model config, batch, seq)
    "shenma-3l b20 s64": ("shenma-3l", 20, 64),
    "base b1 s128": ("base", 1, 128),
    "base b32 s128": ("base", 32, 128),
    "large b1 s128": ("large", 1, 128),
}


@dataclass
class Result:
    workload: str
    variant: str
    p50_us: float = float("nan")
    p99_us: float = float("nan")
    seq_per_s: float = float("nan")
    max_diff: float = float("nan")
    mean_diff: float = float("nan")
    gpu_us: float | None = None
    kernels: int | None = None
    note: str = ""
    breakdown: list = field(default_factory=list)


def time_calls(fn: Callable[[], object], iters: int, warmup: int = 30) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    ts = np.empty(iters)
    for i in range(iters):
        t0 = time.perf_counter()
        fn()
        ts[i] = time.perf_counter() - t0
    return float(np.percentile(ts, 50) * 1e6), float(np.percentile(ts, 99) * 1e6)


def time_interleaved(fns: dict[str, Callable[[], object]], iters: int, rounds: int = 10,
                     warmup: int = 30) -> dict[str, tuple[float, float]]:
    """p50/p99 per function, timed in alternating rounds so that drift on a shared host
    falls on every variant alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    per_round = max(1, iters // rounds)
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {k: (float(np.percentile(v, 50) * 1e6), float(np.percentile(v, 99) * 1e6))
            for k, v in times.items()}


def bound_session(path: str, feeds: dict[str, np.ndarray], graph: bool = False,
                  strict_gpu: bool = False, extra: dict | None = None):
    """A CUDA session with inputs on the device and outputs bound to device buffers."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if strict_gpu:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    opts = {"enable_cuda_graph": "1" if graph else "0", **(extra or {})}
    sess = ort.InferenceSession(path, so, providers=[("CUDAExecutionProvider", opts)])
    io = sess.io_binding()
    keep = []
    names = {i.name for i in sess.get_inputs()}
    for k, v in feeds.items():
        if k in names:
            ov = ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0)
            keep.append(ov)
            io.bind_ortvalue_input(k, ov)
    # One probe run with ORT-allocated outputs gives the shapes; then bind fixed buffers.
    for o in sess.get_outputs():
        io.bind_output(o.name, "cuda")
    sess.run_with_iobinding(io)
    shapes = [v.shape() for v in io.get_outputs()]
    io.clear_binding_outputs()
    outs = {}
    for o, shape in zip(sess.get_outputs(), shapes):
        outs[o.name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, "cuda", 0)
        io.bind_ortvalue_output(o.name, outs[o.name])
    ro = ort.RunOptions()
    return (lambda: sess.run_with_iobinding(io, ro)), outs, sess, keep


def compare(outs: dict[str, np.ndarray], ref: dict[str, np.ndarray],
            mask: np.ndarray) -> tuple[float, float]:
    worst, means = 0.0, []
    for name, r in ref.items():
        if name not in outs:
            continue
        o = np.asarray(outs[name], np.float64)
        d = np.abs(o - r)
        if d.ndim == 3:
            d = d[mask.astype(bool)]
        worst = max(worst, float(d.max()))
        means.append(float(d.mean()))
    return worst, float(np.mean(means)) if means else float("nan")


def kernel_profile(fn: Callable[[], object], reps: int = 20) -> tuple[float, int, list]:
    """GPU kernel time per call via CUPTI (torch.profiler sees ORT's kernels too)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    def dur(e) -> float:
        return getattr(e, "device_time_total", None) or e.cuda_time_total

    total = sum(dur(e) for e in events) / reps
    agg: collections.Counter = collections.Counter()
    for e in events:
        agg[e.name[:70]] += dur(e) / reps
    return total, len(events) // reps, [(k, round(v, 1)) for k, v in agg.most_common(15)]


def prepare_models(skeleton: str, workdir: str, seed: int = 0,
                   anchors: bool = True) -> dict[str, str]:
    """raw fp32 (refilled), raw fp16, ORT-optimized fp16, bertfuse fp32/fp16: paths by
    variant (anchors=False: the bertfuse models only)."""
    from onnxruntime.transformers import float16, optimizer

    raw = onnx.load(skeleton)
    if is_stripped(raw):
        fill_weights(raw, seed)
    if not anchors:
        return _bertfuse_models(raw, workdir, {})
    paths = {"raw32": os.path.join(workdir, "raw32.onnx")}
    onnx.save(raw, paths["raw32"])
    r16 = float16.convert_float_to_float16(onnx.load(paths["raw32"]), keep_io_types=True)
    paths["raw16"] = os.path.join(workdir, "raw16.onnx")
    onnx.save(r16, paths["raw16"])
    heads, hidden = _heads_hidden(raw)
    opt = optimizer.optimize_model(paths["raw32"], model_type="bert_tf", num_heads=heads,
                                   hidden_size=hidden, use_gpu=True)
    paths["ort_fused"] = json.dumps({k: v for k, v in opt.get_fused_operator_statistics().items()
                                     if v})
    opt.convert_float_to_float16(keep_io_types=True)
    paths["opt16"] = os.path.join(workdir, "opt16.onnx")
    opt.save_model_to_file(paths["opt16"])
    return _bertfuse_models(raw, workdir, paths)


def _bertfuse_models(raw: onnx.ModelProto, workdir: str, paths: dict[str, str]) -> dict[str, str]:
    fused32, _ = run_passes(raw, default_passes("fp32"))
    paths["bertfuse32"] = os.path.join(workdir, "bertfuse32.onnx")
    onnx.save(fused32, paths["bertfuse32"])
    fused, report = run_passes(raw, default_passes("fp16"))
    paths["bertfuse16"] = os.path.join(workdir, "bertfuse16.onnx")
    onnx.save(fused, paths["bertfuse16"])
    paths["bertfuse_ops"] = json.dumps(dict(report.census_after))
    return paths


def _heads_hidden(raw: onnx.ModelProto) -> tuple[int, int]:
    meta = {p.key: p.value for p in raw.metadata_props}
    if "bert_config" in meta:
        cfg = json.loads(meta["bert_config"])
        return cfg["num_attention_heads"], cfg["hidden_size"]
    return 0, 0


def memcpy_nodes(path: str) -> int:
    """Memcpy nodes ORT inserts when it places the model on the CUDA EP."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "placed.onnx")
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.optimized_model_filepath = out
        ort.InferenceSession(path, so, providers=["CUDAExecutionProvider"])
        model = onnx.load(out, load_external_data=False)
        return sum(1 for n in model.graph.node if n.op_type.startswith("Memcpy"))


def run_workload(name: str, skeleton: str, batch: int, seq: int, iters: int, work: str,
                 profiles: list | None = None) -> tuple[list[Result], dict[str, str]]:
    """Times every variant; the runtime rows' kernel profiles are queued on `profiles` as
    (result, call) to run after all timing (CUPTI left enabled slows later launches)."""
    from bertfuse.runtime.requests import model_facts

    paths = prepare_models(skeleton, tempfile.mkdtemp(dir=work))
    facts = model_facts(onnx.load(paths["raw32"], load_external_data=False))
    feeds = request(batch, seq, facts.vocab_size or 1000)
    mask = feeds["input_mask"]
    results: list[Result] = []

    fn, outs, sess, keep = bound_session(paths["raw32"], feeds)
    p50, p99 = time_calls(fn, iters)
    ref = {k: v.numpy().astype(np.float64) for k, v in outs.items()}
    results.append(Result(name, "ORT raw fp32", p50, p99, batch / p50 * 1e6, 0.0, 0.0))
    del fn, outs, sess, keep

    variants = [("ORT raw fp16", paths["raw16"], False, ""),
                ("ORT bert_tf fp16", paths["opt16"], False, paths["ort_fused"]),
                ("ORT bert_tf fp16 + CUDA graph", paths["opt16"], True, ""),
                ("bertfuse fp32 plain session", paths["bertfuse32"], False, ""),
                ("bertfuse fp16 plain session", paths["bertfuse16"], False, "")]
    for label, path, graph, note in variants:
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
    runtime_rows = [("bertfuse fp16 runtime, raw 2-D mask only", {"mask_variants": False}),
                    ("bertfuse fp16 runtime (arena + CUDA graph)", {}),
                    ("bertfuse fp16 runtime, [B] key lengths (cuDNN attention)",
                     {"right_padded": "keylen"}),
                    ("bertfuse fp16 runtime, [3B+2] mask (cutlass attention)",
                     {"right_padded": "keyseq"}),
                    ("bertfuse fp16 runtime, synchronous pageable copy",
                     {"own_stream": False, "pinned": False}),
                    ("bertfuse fp16 runtime, packed path", {"packed": True})]
    built = {}
    for label, kw in runtime_rows:
        try:
            built[label] = _runtime_session(paths["bertfuse16"], feeds, **kw)
        except Exception as exc:
            results.append(Result(name, label, note=f"failed: {str(exc).splitlines()[0][:200]}"))
    timed = time_interleaved({label: call for label, (sess, call) in built.items()}, iters)
    for label, (sess, call) in built.items():
        res = Result(name, label, *timed[label])
        res.seq_per_s = batch / res.p50_us * 1e6
        res.max_diff, res.mean_diff = compare(call(to_host=True), ref, mask)
        res.note = _host_split(sess, feeds, iters)
        results.append(res)
        if profiles is not None and "synchronous" not in label:
            profiles.append((res, call))
    return results, paths


def _runtime_session(path: str, feeds: dict[str, np.ndarray], packed: bool = False,
                     **kw) -> tuple[object, Callable]:
    """bertfuse's Session on one bucket of exactly the request's shape, warmed up, and its
    call (packed=True: every request goes to the packed form, in its token bucket)."""
    from bertfuse.runtime.packed_bench import packed_form
    from bertfuse.runtime.router import Session

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
    bucket = sess._bucket(batch, seq)
    mode = sess._session_for(feeds["input_mask"], bucket, batch, seq)
    def prepare() -> None:  # everything run() does before ORT: checks, variant, staging, copy
        sess._session_for(feeds["input_mask"], bucket, batch, seq)
        sess._fill(bucket, sess._check(dict(feeds)), batch, seq)

    prep, _ = time_calls(prepare, iters)
    replay, _ = time_calls(sess.replay_call(feeds["input_mask"]), iters)
    graph = "CUDA graph" if sess.cuda_graph else f"no graph: {sess.fallback_reason}"
    return f"{graph}; attention mask path: {mode}; prep {prep:.0f} us + ORT run {replay:.0f} us"


def soak(model_path: str, requests: int = 10_000, seed: int = 3) -> dict:
    """Device memory in use across many mixed-shape requests, after warm-up; and threads."""
    import threading

    from bertfuse.runtime.pool import SessionPool
    from bertfuse.runtime.router import Session

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
        import torch
    except ImportError:
        return "torch not installed"
    dev = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    got = s.run(dev["input_ids"], dev["input_mask"], dev["segment_ids"])
    return max(float(np.abs(got[k] - want[k]).max()) for k in want)


def format_table(results: list[Result]) -> str:
    lines = ["| workload | variant | p50 (us) | p99 (us) | seq/s | x bertfuse | max diff | "
             "mean diff | note |", "|---|---|---|---|---|---|---|---|---|"]
    by_workload: dict[str, float] = {r.workload: r.p50_us for r in results
                                     if r.variant == "bertfuse fp16 runtime (arena + CUDA graph)"}
    for r in results:
        base = by_workload.get(r.workload, float("nan"))
        lines.append(f"| {r.workload} | {r.variant} | {r.p50_us:.1f} | {r.p99_us:.1f} | "
                     f"{r.seq_per_s:,.0f} | {r.p50_us / base:.2f} | {r.max_diff:.2e} | "
                     f"{r.mean_diff:.2e} | {r.note} |")
    return "\n".join(lines)


def _no_cuda() -> str | None:
    """Why ONNX Runtime's CUDA EP cannot run here, or None: a one-node model in memory."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider; install " \
               f"onnxruntime-gpu"
    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from pip's nvidia-* wheels, as main() does
        ort.preload_dlls()
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    probe = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])],
                                                "probe", io[:1], io[1:]),
                              opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), opts,
                                    providers=["CUDAExecutionProvider"])
    except Exception as exc:
        return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    if "CUDAExecutionProvider" not in sess.get_providers():
        return "the CUDA execution provider did not start (no GPU, or no CUDA driver)"
    return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="bertfuse bench", description=__doc__)
    ap.add_argument("--skeletons", required=True,
                    help="directory with <config>_raw.skel.onnx (bertfuse strip-weights)")
    from bertfuse.runtime import packed_bench

    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS),
                    metavar="NAME", help=f"padded workloads, any of: {'; '.join(WORKLOADS)} "
                                         "(default all; the flag alone: none)")
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--soak", type=int, default=0, help="mixed-shape requests for the soak")
    ap.add_argument("--packed", nargs="*", default=None, choices=list(packed_bench.WORKLOADS),
                    metavar="NAME", help="padded-vs-packed workloads, any of: "
                                         f"{'; '.join(packed_bench.WORKLOADS)} "
                                         "(default all; the flag alone: none)")
    ap.add_argument("--streams", nargs="*", type=int, default=[1, 2, 4], metavar="N",
                    help="padded vs packed under load: threads, each with its own replica "
                         "(default 1 2 4; the flag alone: none)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where JSON results go")
    args = ap.parse_args(argv)
    configs = {WORKLOADS[n][0] for n in args.workloads} | \
        {packed_bench.WORKLOADS[n][0] for n in (list(packed_bench.WORKLOADS)
                                                 if args.packed is None else args.packed)}
    missing = [c for c in sorted(configs)
               if not os.path.isfile(os.path.join(args.skeletons, f"{c}_raw.skel.onnx"))]
    if missing:
        print(f"bertfuse bench: no skeleton for {', '.join(missing)} in {args.skeletons} "
              f"(expected <config>_raw.skel.onnx, made by bertfuse strip-weights)")
        return 2
    no_gpu = _no_cuda()
    if no_gpu:  # before any temp file: nothing is left behind
        print(f"bertfuse bench: error: needs a CUDA GPU ({no_gpu})", file=sys.stderr)
        return 2
    from bertfuse.safety import handle_signals, temp_dir

    # Every prepared model lives under one temp dir, removed on any exit (signals included).
    with handle_signals(), temp_dir(prefix="bertfuse-bench-") as work:
        return _bench(args, str(work))


def _bench(args, work: str) -> int:
    import onnxruntime as ort

    ort.preload_dlls()
    results: list[Result] = []
    extra: dict = {}
    prepared: dict[str, dict[str, str]] = {}
    profiles: list = []

    def save() -> None:  # after every workload: a run cut short still leaves its results
        with open(os.path.join(args.out, "gpu_bench.json"), "w") as fh:
            json.dump({"results": [r.__dict__ for r in results], **extra,
                       "onnxruntime": ort.__version__, "date": time.strftime("%Y-%m-%d")}, fh,
                      indent=1, default=str)

    for name in args.workloads:
        config, batch, seq = WORKLOADS[name]
        skeleton = os.path.join(args.skeletons, f"{config}_raw.skel.onnx")
        print(f"== {name}", flush=True)
        rs, paths = run_workload(name, skeleton, batch, seq, args.iters, work, profiles)
        prepared[config] = paths
        for r in rs:
            print(f"   {r.variant:45s} p50 {r.p50_us:9.1f} us  p99 {r.p99_us:9.1f}  "
                  f"max diff {r.max_diff:.2e}  gpu {r.gpu_us}  {r.note}", flush=True)
        results += rs
        if args.soak and config == "shenma-3l":
            extra["soak"] = soak(paths["bertfuse16"], args.soak)
            print("   soak:", extra["soak"], flush=True)
        save()

    def paths_for(config: str) -> dict[str, str]:
        if config not in prepared:
            skeleton = os.path.join(args.skeletons, f"{config}_raw.skel.onnx")
            prepared[config] = prepare_models(skeleton, tempfile.mkdtemp(dir=work))
        return prepared[config]

    packed_names = list(packed_bench.WORKLOADS) if args.packed is None else args.packed
    if packed_names:
        print("== padded vs packed", flush=True)
        extra["packed"] = packed_bench.run(paths_for, args.iters, packed_names,
                                           tuple(args.streams))
    save()
    for result, call in profiles:  # last: the profiler slows whatever runs after it
        result.gpu_us, result.kernels, result.breakdown = kernel_profile(call)
        print(f"   profile {result.workload} / {result.variant}: GPU {result.gpu_us:.1f} us, "
              f"{result.kernels} kernels", flush=True)
    save()
    print(format_table(results))
    if "packed" in extra:
        print()
        print(packed_bench.format_tables(extra["packed"]))
    return 0

