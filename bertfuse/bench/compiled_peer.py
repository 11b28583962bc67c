"""The torch.compile peer of `bertfuse bench`: what a careful PyTorch user gets from the same
seeded model (peers.py), compiled by inductor and replayed as one CUDA graph.

    torch_bert(cfg, "sdpa") fp16 ─► torch.compile(mode="max-autotune-no-cudagraphs")
      ─► three calls on a side stream (the first compiles: inductor times its GEMM and
         attention choices on the device)
      ─► its kernels captured in one torch.cuda.CUDAGraph ─► graph.replay()   row COMPILED_PEER

Captured by hand rather than with mode="max-autotune" (inductor's own CUDA graphs): that ran
slower at shenma-3l b20 s64 on an H100 (394 us against 261). The row is checked like the
other peers, against the same model's fp32 torch forward on valid positions; its note gives
the compile time. Where triton is missing or the compile fails, the row says why.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from bertfuse.optional import optional

MODE = "max-autotune-no-cudagraphs"
# Each workload compiles a new model: past dynamo's recompile limit (8 by default) it would
# run the forward eagerly and say so only in a log line; the bench runs up to 7 workloads.
RECOMPILE_LIMIT = 64


def missing_compiler() -> str:
    """Why torch.compile cannot run here ('' when it can): inductor's GPU kernels are triton's."""
    try:
        torch = optional("torch", why="torch.compile, the compiled peer, where a host has PyTorch")
        optional("torch._inductor", why="inductor, torch.compile's GPU backend")
    except ImportError as exc:  # MissingDependency is one too
        return f"torch.compile needs torch with inductor ({exc.name or exc} not installed)"
    try:
        optional("triton", why="inductor's GPU kernels, where a host has triton")
    except ImportError:
        return "torch.compile on CUDA needs triton (not installed)"
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    return ""


def compile_note(seconds: float, graphs: int | None) -> str:
    """The row's note: how it was compiled, in how long, into how many graphs (0: dynamo's
    code from an earlier workload of this process served, its guards passed)."""
    made = "" if graphs is None else f", {graphs} dynamo graph{'s' if graphs != 1 else ''}"
    return (f"transformers BertModel, attn_implementation sdpa, torch.compile mode={MODE} "
            f"(compiled in {seconds:.1f} s{made}), its kernels in one CUDA graph")


def compiled_graph_call(make: Callable[[], tuple]) -> tuple[Callable, Callable, str]:
    """(call, outputs, note) as peers.torch_graph_call, of the compiled model; make() gives
    (the fp16 SDPA encoder on the GPU, its device inputs), called once triton is known here."""
    why = missing_compiler()
    if why:
        raise RuntimeError(why)
    torch = optional("torch", why="torch.compile, the compiled peer, where a host has PyTorch")

    enc, inputs = make()
    graphs = _graph_count()
    start = time.perf_counter()
    compiled = torch.compile(enc, mode=MODE, dynamic=False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with _recompile_limit(), torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):  # the first compiles; then cuBLAS handles, triton's launchers
            compiled(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    made = None if graphs is None else _graph_count() - graphs
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = compiled(*inputs)

    def call(keep=(enc, compiled, inputs)) -> None:  # the graph reads their memory
        graph.replay()
        torch.cuda.synchronize()

    def outputs() -> dict[str, np.ndarray]:
        return {"sequence_output": out[0].float().cpu().numpy(),
                "pooled_output": out[1].float().cpu().numpy()}

    return call, outputs, compile_note(seconds, made)


def _recompile_limit():
    """dynamo's recompile limit raised to RECOMPILE_LIMIT while the model compiles (its name
    changed in torch 2.7: recompile_limit, formerly cache_size_limit)."""
    cfg = optional("torch._dynamo", "config", why="dynamo's settings, torch.compile's front end")
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    return cfg.patch(**{name: max(getattr(cfg, name), RECOMPILE_LIMIT)})


def _graph_count() -> int | None:
    """The graphs dynamo has compiled in this process (None where torch keeps no count)."""
    try:
        counters = optional("torch._dynamo.utils", "counters", why="dynamo's graph count")
    except ImportError:
        return None
    return int(counters["stats"]["unique_graphs"])
