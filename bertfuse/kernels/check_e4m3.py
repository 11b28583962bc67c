"""`bertfuse kernels check` cases for the ops' e4m3 outputs `Yq`, the FP8 hand-offs' bytes
(passes/fp8_handoff.py): an op writing Yq beside Y must write the bytes of Y's own quantise,
e4m3_satfinite(float32(Y) * float32(1 / yq_scale)) (ops/bertfuse/dense_fp8.py e4m3_output), bit
for bit; an op writing Yq alone, Y left off, must be within one e4m3 step of the float64
reference plus the fp16 gate.
"""

from __future__ import annotations

import numpy as np

from bertfuse.kernels.cases import MAX_ABS, Case, Feeds, gate, normal16
from bertfuse.ops.bertfuse import bert_attention
from bertfuse.ops.bertfuse.dense_fp8 import E4M3_MAX, e4m3_dtype, e4m3_output


def yq_beside(got: list[np.ndarray], exact: np.ndarray, yq_scale: float) -> tuple[float, float, bool]:
    """[Y, Yq] of an op writing both: Y within the fp16 gate of the float64 reference, Yq the
    bytes of Y's own quantise, e4m3(float32(Y) * float32(1 / yq_scale)), bit for bit."""
    mx, mean, ok = gate(got[:1], [exact.astype(np.float16)])
    return mx, mean, ok and np.array_equal(got[1], e4m3_output(got[0], yq_scale).view(np.uint8))


def attention_e4m3_cases(rng: np.random.Generator) -> list[Case]:
    """BertAttention's e4m3 output Yq (yq_scale = max |V| / 448, as calibration sets it). Beside
    the context, Yq must be the context's own bytes quantised, e4m3(float32(context) * float32(1 /
    yq_scale)), bit for bit. With the context left off (the FP8 model's form): the tensor-core
    kernel writes Yq alone, the tiled and general paths work in scratch; Yq * yq_scale must be
    within one e4m3 step of the float64 reference (the kernel's fp16-level error may flip a
    rounding) plus the fp16 gate."""
    cases = []
    for b, s, h, heads, form, context in [(4, 64, 768, 12, "raw", True), (4, 64, 768, 12, "raw", False),
                                           (32, 128, 768, 12, "lengths", False),
                                           (2, 129, 384, 12, "raw", False),  # tiled: head size 32
                                           (2, 17, 312, 12, "raw", False)]:  # general: head size 26
        feeds = {"qkv": normal16(rng, (b, s, 3 * h))}
        if form == "lengths":
            feeds["mask"] = np.asarray(([s, s // 2 + 1, 1, 0] * b)[:b], np.int32)
        else:
            feeds["mask"] = (rng.random((b, s)) > 0.3).astype(np.int32)
        yq_scale = float(np.abs(feeds["qkv"][..., 2 * h:].astype(np.float32)).max() / E4M3_MAX)
        model = bert_attention.make_model(b, s, h, heads, mask_shape=feeds["mask"].shape,
                                          context=context, yq_scale=yq_scale)

        def ref(f: Feeds, heads: int = heads, context: bool = context,
                yq_scale: float = yq_scale) -> list[np.ndarray]:
            c = bert_attention.reference(f["qkv"], f["mask"], num_heads=heads)
            return ([c] if context else []) + [e4m3_output(c, yq_scale).view(np.uint8)]

        def check(got: list[np.ndarray], f: Feeds, heads: int = heads, context: bool = context,
                  yq_scale: float = yq_scale) -> tuple[float, float, bool]:
            exact = bert_attention.reference(f["qkv"].astype(np.float64), f["mask"], num_heads=heads)
            if context:
                return yq_beside(got, exact, yq_scale)
            yq = got[0].view(e4m3_dtype()).astype(np.float64) * yq_scale
            d = np.abs(yq - exact)
            units = np.abs(exact) / yq_scale  # e4m3's step: 2^(e - 3) for normals, 2^-9 below 2^-6
            step = np.exp2(np.floor(np.log2(np.maximum(units, 2.0 ** -6))) - 3) * yq_scale
            ok = bool(np.all(np.isfinite(yq)) and np.all(d <= step + MAX_ABS))
            return float(d.max()), float(d.mean()), ok

        label = f"qkv[{b},{s},{3 * h}] heads={heads} mask={form} e4m3 Yq" + ("" if context else " alone")
        cases.append(Case("BertAttention", label, model, feeds, ref, check=check))
    return cases
