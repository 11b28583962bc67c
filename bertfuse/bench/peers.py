"""The peers bertfuse is timed against in the same `bertfuse bench` run: what a PyTorch user
gets from ONNX Runtime and from torch itself, on the same BERT config with its own seeded
random weights (the skeleton's config, transformers' BertModel).

    config (skeleton metadata) ─► transformers BertModel, fp32, seeded
      ├► eager attention ─► torch.onnx.export ─► ORT transformer optimizer (model_type bert,
      │     fp16) ─► ORT CUDA EP + CUDA graph, IO binding      row "peer: ORT optimizer ..."
      └► SDPA attention, fp16 ─┬► torch.cuda.CUDAGraph        row "peer: torch SDPA ..."
                               └► torch.compile (inductor, max-autotune) ─► one CUDAGraph
                                                         row "peer: torch.compile ..."

Every peer's timed call starts from the request's host arrays, as bertfuse's rows do: the
torch peers stage them into page-locked buffers that their graph copies in
(host_request.py), the ORT peer copies them into its bound device inputs (OrtValue
.update_inplace) before the replay. The peers are checked against the same model's fp32 torch
forward on valid positions: a peer that computes something else is no peer. Where torch or
transformers is missing, the rows say so and the rest of the run goes on.
"""

from __future__ import annotations

import json
import os
from typing import Callable
import math

import numpy as np

from bertfuse.bench.compiled_peer import best_compiled_call, why_failed
from bertfuse.bench.host_request import HostRequest
from bertfuse.bench.models import bound_session
from bertfuse.optional import optional

ORT_PEER = "peer: ORT optimizer on a PyTorch export, fp16 + CUDA graph"
TORCH_PEER = "peer: torch SDPA fp16 + CUDA graph"
COMPILED_PEER = "peer: torch.compile fp16 + CUDA graph"  # compiled_peer.py: its best set-up
PEER_ROWS = (ORT_PEER, TORCH_PEER, COMPILED_PEER)
SEED = 0


def bert_config(raw_metadata: dict[str, str]) -> dict | None:
    """The model's bert_config (bertfuse writes it into the ONNX metadata), or None."""
    text = raw_metadata.get("bert_config")
    return json.loads(text) if text else None


def torch_bert(cfg: dict, attention: str):
    """transformers' BertModel of `cfg` (Google's bert_config keys), fp32, eval, seeded."""
    torch = optional("torch", why="the PyTorch peer, where installed")
    transformers = optional("transformers", why="the PyTorch peer, where installed")

    act = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu"}.get(cfg.get("hidden_act",
                                                                            "gelu"), "gelu")
    hf = transformers.BertConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        intermediate_size=cfg["intermediate_size"], hidden_act=act,
        max_position_embeddings=cfg.get("max_position_embeddings", 512),
        type_vocab_size=cfg.get("type_vocab_size", 2), hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    hf._attn_implementation = attention  # "eager" | "sdpa"
    torch.manual_seed(SEED)
    return transformers.BertModel(hf, add_pooling_layer=True).eval()


def encoder(model, classic: bool = False):
    """BertModel's forward with the classic additive mask computed here, so the same code
    traces for the ONNX export and captures into a CUDA graph (transformers' own mask helpers
    may read the mask's values on the host, which a capture forbids).

    classic: the layers written out as transformers 4's BertSelfAttention traced (view to
    [B, S, heads, d], permute, q @ k^T / sqrt(d) + mask, softmax), the same weights and math:
    the export form ORT's transformer optimizer fuses into Attention (its patterns predate
    transformers 5's attention interface, whose export it leaves unfused)."""
    torch = optional("torch", why="the PyTorch peer, where installed")

    heads, hidden = model.config.num_attention_heads, model.config.hidden_size
    size = hidden // heads

    def split(x):
        return x.view(x.size(0), x.size(1), heads, size).permute(0, 2, 1, 3)

    def layers(h, ext):
        for layer in model.encoder.layer:
            sa, out = layer.attention.self, layer.attention.output
            q, k, v = split(sa.query(h)), split(sa.key(h)), split(sa.value(h))
            probs = (torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(size) + ext).softmax(-1)
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
            h = out.LayerNorm(out.dense(ctx.view(ctx.size(0), ctx.size(1), hidden)) + h)
            inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(h))
            h = layer.output.LayerNorm(layer.output.dense(inner) + h)
        return h

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids, input_mask, segment_ids):
            h = self.m.embeddings(input_ids=input_ids, token_type_ids=segment_ids)
            ext = (1.0 - input_mask[:, None, None, :].to(h.dtype)) * -10000.0
            if classic:
                seq = layers(h, ext)
            else:
                seq = self.m.encoder(h, attention_mask=ext)
                seq = seq[0] if isinstance(seq, (tuple, list)) else seq.last_hidden_state
            return seq, self.m.pooler(seq)

    return Encoder()


def reference(enc, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The fp32 torch forward (CPU) of `enc` (encoder(...) of the config's seeded model), which
    both peers are checked against."""
    torch = optional("torch", why="the PyTorch peer, where installed")

    with torch.no_grad():
        seq, pooled = enc(*_torch_inputs(feeds, "cpu"))
    return {"sequence_output": seq.double().numpy(), "pooled_output": pooled.double().numpy()}


def _torch_inputs(feeds: dict[str, np.ndarray], device: str) -> tuple:
    torch = optional("torch", why="the PyTorch peer, where installed")

    # int32 as bertfuse's rows get them (torch's embedding takes int32 indices)
    return tuple(torch.from_numpy(feeds[k].astype(np.int32)).to(device)
                 for k in ("input_ids", "input_mask", "segment_ids"))


def export_ort_peer(enc, cfg: dict, feeds: dict[str, np.ndarray],
                    workdir: str) -> tuple[str, str]:
    """`enc` (the classic form) exported and through ORT's transformer optimizer, fp16:
    (path, fused-op note)."""
    torch = optional("torch", why="the PyTorch peer, where installed")
    optimizer = optional("onnxruntime.transformers", "optimizer",
                         why="ONNX Runtime's fusions, the bench's rival")

    raw = os.path.join(workdir, "peer_torch_export.onnx")
    axes = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(enc, _torch_inputs(feeds, "cpu"), raw, dynamo=False, opset_version=17,
                          input_names=["input_ids", "input_mask", "segment_ids"],
                          output_names=["sequence_output", "pooled_output"],
                          dynamic_axes={"input_ids": axes, "input_mask": axes,
                                        "segment_ids": axes, "sequence_output": axes,
                                        "pooled_output": {0: "batch"}})
    opt = optimizer.optimize_model(raw, model_type="bert", num_heads=cfg["num_attention_heads"],
                                   hidden_size=cfg["hidden_size"], use_gpu=True)
    fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    opt.convert_float_to_float16(keep_io_types=True)
    path = os.path.join(workdir, "peer_ort_opt16.onnx")
    opt.save_model_to_file(path)
    return path, "ORT fused: " + json.dumps(fused)


def torch_graph_call(cfg: dict, feeds: dict[str, np.ndarray]) -> tuple[Callable, Callable]:
    """(call, outputs): the request staged from its host arrays, then one replay of a CUDA
    graph (the host->device copy, the SDPA fp16 model), synchronised; outputs() reads the
    graph's output buffers to the host."""
    torch = optional("torch", why="the PyTorch peer, where installed")

    enc = encoder(torch_bert(cfg, "sdpa")).half().cuda()
    request = HostRequest(feeds)
    inputs = request.inputs
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):  # warm-up outside the capture: cuBLAS handles, SDPA's choice
            enc(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        request.copy_in()
        out = enc(*inputs)

    def call(keep=(enc, request)) -> None:  # the graph reads their memory: it must outlive them
        request.stage()
        graph.replay()
        torch.cuda.synchronize()

    def outputs() -> dict[str, np.ndarray]:
        return {"sequence_output": out[0].float().cpu().numpy(),
                "pooled_output": out[1].float().cpu().numpy()}

    return call, outputs


def compiled_peer_call(cfg: dict, feeds: dict[str, np.ndarray]) -> tuple[Callable, Callable, str]:
    """(call, outputs, note) of torch.compile's peer: the fp16 SDPA model of `cfg` compiled
    in the fastest of compiled_peer.SETUPS, its kernels in one CUDA graph that begins with
    the copy of `feeds` (host_request.py)."""
    return best_compiled_call(lambda: (encoder(torch_bert(cfg, "sdpa")).half().cuda(),
                                        HostRequest(feeds)))


def missing_peer_packages() -> str:
    """Why the peers cannot run here ('' when they can)."""
    try:
        torch = optional("torch", why="the PyTorch peer, where installed")
        optional("transformers", why="the PyTorch peer, where installed")
    except ImportError as exc:
        return f"peers need torch and transformers ({exc.name} not installed)"
    if not torch.cuda.is_available():
        return "peers need torch with CUDA (torch.cuda.is_available() is False)"
    return ""


Peer = tuple[Callable[[], object], Callable[[], dict], str]  # (timed call, outputs, note)


def setup_peers(metadata: dict[str, str], feeds: dict[str, np.ndarray],
                workdir: str) -> tuple[dict[str, Peer], dict[str, np.ndarray], dict[str, str]]:
    """The peers' timed calls by row label, their fp32 reference, and the rows that could not
    run with why."""
    why = missing_peer_packages()
    cfg = bert_config(metadata)
    if not why and cfg is None:
        why = "the skeleton carries no bert_config to build the peers from"
    if why:
        return {}, {}, {label: why for label in PEER_ROWS}

    peers: dict[str, Peer] = {}
    failed: dict[str, str] = {}
    # One fp32 model for the reference and the export (the classic form: the same math)
    classic = encoder(torch_bert(cfg, "eager"), classic=True)
    ref = reference(classic, feeds)
    try:
        path, note = export_ort_peer(classic, cfg, feeds, workdir)
        fn, outs, sess, keep = bound_session(path, feeds, graph=True, from_host=True)

        def ort_outputs(outs=outs, sess=sess, keep=keep) -> dict:  # keeps both alive
            return {k: v.numpy() for k, v in outs.items()}

        peers[ORT_PEER] = (fn, ort_outputs, note)
    except Exception as exc:  # noqa: BLE001 (a peer that cannot run is a row that says why)
        failed[ORT_PEER] = f"failed: {why_failed(exc)}"
    try:
        call, outputs = torch_graph_call(cfg, feeds)
        peers[TORCH_PEER] = (call, outputs, "transformers BertModel, attn_implementation sdpa")
    except Exception as exc:  # noqa: BLE001
        failed[TORCH_PEER] = f"failed: {why_failed(exc)}"
    try:
        peers[COMPILED_PEER] = compiled_peer_call(cfg, feeds)
    except Exception as exc:  # noqa: BLE001 (no triton, a failed compile or capture)
        failed[COMPILED_PEER] = f"failed: {why_failed(exc)}"
    return peers, ref, failed


def best_peer(results: list, workload: str) -> float:
    """The best (lowest) peer p50 of a workload, NaN where no peer ran."""
    return best_peers(results).get(workload, {}).get("p50_us", float("nan"))


def best_peers(results: list) -> dict[str, dict]:
    """{workload: {"variant": the fastest peer that ran, "p50_us": its p50}} (gpu_bench.json's
    "best_peer": what every "x best peer" ratio of the run divides by)."""
    best: dict[str, dict] = {}
    for r in results:
        if r.variant in PEER_ROWS and np.isfinite(r.p50_us) and \
                r.p50_us < best.get(r.workload, {}).get("p50_us", float("inf")):
            best[r.workload] = {"variant": r.variant, "p50_us": r.p50_us}
    return best
