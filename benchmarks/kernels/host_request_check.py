"""On a GPU host, from the repo root: the torch peers' CUDA graphs read the request staged at
each call, not the one they were captured on (bertfuse/bench/host_request.py).

    python3 benchmarks/kernels/host_request_check.py

Captures the shenma-3l SDPA fp16 model (random seeded weights) with request A copied in, stages
request B, replays, and compares against the eager forward on B (must agree) and on A (must
not). Prints one line of numbers, then HOST_REQUEST_CHECK ok or FAILED (exit 1)."""

import sys

import numpy as np
import torch

from bertfuse.bench import peers
from bertfuse.bench.host_request import ROLES, HostRequest
from bertfuse.io.inputs import padded_request

CFG = {"vocab_size": 21128, "hidden_size": 768, "num_hidden_layers": 3, "num_attention_heads": 12,
       "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2,
       "hidden_act": "gelu"}


def eager(enc, feeds) -> np.ndarray:
    with torch.no_grad():
        args = (torch.from_numpy(np.ascontiguousarray(feeds[r], np.int32)).cuda() for r in ROLES)
        return enc(*args)[0].float().cpu().numpy()


def main() -> int:
    a, b = padded_request(20, 64, CFG["vocab_size"], seed=1), padded_request(20, 64, CFG["vocab_size"], seed=2)
    enc = peers.encoder(peers.torch_bert(CFG, "sdpa")).half().cuda()
    req = HostRequest(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            enc(*req.inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        req.copy_in()
        out = enc(*req.inputs)
    req.arrays = [np.ascontiguousarray(b[r], np.int32) for r in ROLES]
    req.stage()
    graph.replay()
    torch.cuda.synchronize()
    got = out[0].float().cpu().numpy()
    valid = b["input_mask"].astype(bool)
    on_b = float(np.abs(got - eager(enc, b))[valid].max())
    on_a = float(np.abs(got - eager(enc, a))[valid].max())
    print(f"graph on request B vs eager on B: max {on_b:.2e}; vs eager on A: max {on_a:.2e}")
    ok = on_b < 1e-2 and on_a > 1e-1
    print("HOST_REQUEST_CHECK", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
