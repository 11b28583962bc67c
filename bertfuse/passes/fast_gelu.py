"""FastGelu in place of an exact GELU, where the user asked for the approximation.

    x ─► BiasGelu(bias) ─► y              x ─► Gelu ─► y
    ==>  x ─► FastGelu(bias) ─► y         ==>  x ─► FastGelu ─► y

Only with `--gelu-approximation` (fusion_plan). The tanh form differs from erf by at most
4.7e-4 per element (near x = -2.7), below fp16's own step at |y| >= 0.5; it is what Google
BERT's modeling.py and the FP8 form compute anyway, and on bertfuse's kernels it is the form
cuBLASLt fuses into the FFN-up GEMM's epilogue (no separate GELU kernel). The parity gate
holds the result to the fp16 limits like any other fp16 model.

Candidates: every com.microsoft BiasGelu and Gelu the GELU fusion left; each ends fused or
missed (a bias that is not 1-D).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from bertfuse.ops.contract import MS_DOMAIN
from bertfuse.ops.contrib.gelu import FAST_GELU
from bertfuse.passes.base import CandidatePass, detach, replace_tensor
from bertfuse.passes.match import expect

EXACT_GELU_OPS = ("BiasGelu", "Gelu")


class FastGeluApproximation(CandidatePass):
    name = "fast_gelu"

    def candidates(self, graph: gs.Graph) -> list[gs.Node]:
        return [n for n in graph.nodes if n.op in EXACT_GELU_OPS and n.domain == MS_DOMAIN]

    def match(self, graph: gs.Graph, node: gs.Node) -> tuple[gs.Tensor, gs.Tensor | None]:
        """(x, bias or None)."""
        bias = node.inputs[1] if node.op == "BiasGelu" and len(node.inputs) > 1 else None
        if bias is not None:
            shape = bias.shape
            expect(shape is None or len(shape) == 1,
                   f"the bias of {node.name} has shape {shape}, not 1-D (FastGelu's bias)")
        return node.inputs[0], bias

    def rewrite(self, graph: gs.Graph, node: gs.Node, found: tuple) -> None:
        x, bias = found
        y = node.outputs[0]
        out = gs.Variable(f"{y.name}_fast", dtype=y.dtype, shape=y.shape)
        graph.nodes.append(FAST_GELU.node(f"{node.name}_Fast", [x] if bias is None else [x, bias],
                                          [out]))
        replace_tensor(graph, y, out)
        detach([node])
