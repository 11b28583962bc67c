"""`bertfuse kernels check`: every ai.bertfuse op on the GPU, through ONNX Runtime's CUDA EP,
against its float64 NumPy reference.

Each case is a one-node model (domain ai.bertfuse opset 1, ai.onnx 17, IR 8; IR 9 for the FP8
forms, whose float8 weights IR 8 cannot hold) run in two sessions: a plain session.run, and one
with CUDA graphs on and IO binding (plain run, capture, replay; then new inputs written into the
bound buffers and replayed), which fails if a kernel allocates or synchronises inside Compute or
reads stale inputs. fp16 gate: max |diff| <= 4e-2 and mean <= 2e-3 against the float64
reference, no NaN; integer outputs (the packing ops') must be exact. FP8 forms are gated the
same way against the reference computed on the e4m3-quantized operands (what the kernel
multiplies), and their drift from the unquantized reference is reported beside it, not gated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from bertfuse.io.ort import make_session
from bertfuse.kernels.cases import Case, Feeds, diff, normal16
from bertfuse.kernels.check_e4m3 import attention_e4m3_cases
from bertfuse.kernels.check_packed import packed_cases
from bertfuse.kernels.library import DOMAIN, KernelLibraryError
from bertfuse.ops.bertfuse import bert_attention, dense, pooler
from bertfuse.ops.bertfuse import embed_layernorm as bert_embed
from bertfuse.ops.bertfuse.dense_fp8 import E4M3_MAX, e4m3
from bertfuse.optional import optional


@dataclass
class CaseResult:
    op: str
    label: str
    ok: bool
    max_abs: float | None = None
    mean_abs: float | None = None
    graph_max_abs: float | None = None
    fp8_vs_exact_max: float | None = None
    fp8_vs_exact_mean: float | None = None
    error: str = ""

    def to_json(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------ cases


def _dense_inputs(rng, lead: tuple[int, ...], k: int, n: int, skip: bool) -> Feeds:
    feeds = {"X": normal16(rng, (*lead, k)), "W": normal16(rng, (k, n), k ** -0.5),
             "bias": normal16(rng, (n,), 0.1)}
    if skip:
        feeds.update(skip=normal16(rng, (*lead, n)), gamma=normal16(rng, (n,), 0.1, 1.0),
                     beta=normal16(rng, (n,), 0.1))
    return feeds


def _attrs_label(attrs: dict[str, Any]) -> str:
    return "".join(f" {a}={v}" for a, v in attrs.items())


# (op, attrs, leading dims, K, N): the four BERT-base GEMMs, plus an [M, K] input and an M that
# is no multiple of 8.
_DENSE = [
    ("DenseBias", {}, (4, 64), 768, 2304),
    ("DenseBias", {}, (300, ), 768, 768),
    ("DenseBiasGelu", {"approximate": 0}, (4, 64), 768, 3072),
    ("DenseBiasGelu", {"approximate": 1}, (4, 64), 768, 3072),
    ("DenseBiasGelu", {"approximate": 0}, (3, 37), 768, 3072),
    ("DenseBiasSkipLayerNorm", {"epsilon": 1e-12}, (4, 64), 3072, 768),
    ("DenseBiasSkipLayerNorm", {"epsilon": 1e-12}, (3, 37), 768, 768),
    ("DenseBiasSkipLayerNorm", {"epsilon": 1e-12, "y32": True}, (4, 64), 3072, 768),
    ("DenseBiasSkipLayerNorm", {"epsilon": 1e-12, "y32": True}, (3, 37), 768, 768),
    # BERT-base at batch 1 (M = 128): where the split-K form (partials reduced in the LayerNorm) runs.
    ("DenseBiasSkipLayerNorm", {"epsilon": 1e-12}, (1, 128), 3072, 768),
    ("DenseBiasSkipLayerNorm", {"epsilon": 1e-12}, (1, 128), 768, 768),
    # BERT-base at batch 32 (M = 4096) and an odd M past it: more rows than one wave of one-row
    # CTAs holds, where the LayerNorm takes two rows per warp (the last pair one row short).
    ("DenseBiasSkipLayerNorm", {"epsilon": 1e-12, "y32": True}, (32, 128), 768, 768),
    ("DenseBiasSkipLayerNorm", {"epsilon": 1e-12}, (31, 131), 768, 768),
]


def dense_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op, attrs, lead, k, n in _DENSE:
        feeds = _dense_inputs(rng, lead, k, n, op == "DenseBiasSkipLayerNorm")
        model = dense.make_model(op, (*lead, k), n, **attrs)
        label = f"X{list(feeds['X'].shape)} W[{k},{n}]{_attrs_label(attrs)}"
        cases.append(Case(op, label, model, feeds, lambda f, op=op, attrs=attrs: _dense_ref(op, f, attrs)))
    return cases


def _dense_ref(op: str, feeds: Feeds, attrs: dict[str, Any]) -> list[np.ndarray]:
    """Y, and Y32 (the unrounded value in fp32) where the case asks for it."""
    attrs = dict(attrs)
    if not attrs.pop("y32", False):
        return [dense.reference(op, *feeds.values(), **attrs)]
    y = dense.dense_bias_skip_layernorm64(*feeds.values(), **attrs)
    return [y.astype(np.float16), y.astype(np.float32)]


def attention_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    specs = [  # (B, S, H, heads, mask form, scale)
        (4, 64, 768, 12, None, None),
        (4, 64, 768, 12, "raw", None),
        (4, 64, 768, 12, "lengths", None),
        (2, 128, 768, 12, "raw", None),
        (3, 37, 768, 12, "lengths", 0.2),
        (2, 16, 256, 4, "raw", None),
        # Few CTAs: the keys-split kernel, 4 query tiles per CTA (b4 s128), and 2 with one real
        # key in the second half (S 17).
        (4, 128, 768, 12, "raw", None),
        (2, 17, 768, 12, "lengths", None),
        # Grids past one wave of CTAs: two passes per warp where that takes fewer waves.
        (32, 128, 768, 12, "raw", None),
        (24, 100, 768, 12, "lengths", None),
        # The tiled kernel: head sizes 32, 128, and 64 past the first kernel's 128 keys.
        (2, 1, 384, 12, "lengths", None),     # MiniLM: head size 32, one token
        (2, 129, 384, 12, "raw", None),
        (2, 300, 384, 12, "lengths", 0.2),
        (2, 64, 1024, 8, None, None),         # head size 128
        (2, 384, 256, 2, "lengths", None),
        (2, 512, 768, 12, "raw", None),
        (2, 1000, 512, 4, "raw", None),       # head size 128, a last key block of 40
        # The general path: other head sizes (26) and lengths past the tiled kernel's 1024.
        (2, 17, 312, 12, "raw", None),        # TinyBERT: head size 26
        (2, 1025, 128, 2, "raw", None),
    ]
    for b, s, h, heads, form, scale in specs:
        feeds = {"qkv": normal16(rng, (b, s, 3 * h))}
        if form == "lengths":  # a full row, a short one, one key only, and none (attends as if unmasked)
            feeds["mask"] = np.asarray(([s, s // 2 + 1, 1, 0] * b)[:b], np.int32)
        elif form == "raw":  # arbitrary holes, and a row that keeps nothing
            feeds["mask"] = (rng.random((b, s)) > 0.3).astype(np.int32)
            feeds["mask"][-1, :] = 0
        model = bert_attention.make_model(b, s, h, heads, scale=scale,
                                          mask_shape=feeds["mask"].shape if "mask" in feeds else None)
        label = f"qkv[{b},{s},{3 * h}] heads={heads} mask={form or 'none'}" + (f" scale={scale}" if scale else "")
        cases.append(Case("BertAttention", label, model, feeds, lambda f, heads=heads, scale=scale: [
            bert_attention.reference(f["qkv"], f.get("mask"), num_heads=heads, scale=scale)]))
    return cases


def _fp8_model(op: str, feeds: Feeds, wt: np.ndarray, w_scale: np.float32, attrs: dict[str, Any],
               y_shape: tuple[int, ...]) -> onnx.ModelProto:
    names = ["X", "Wt", *[n for n in feeds if n != "X"], "w_scale"]  # X Wt bias [skip gamma beta] w_scale
    node = helper.make_node(op, names, ["Y"], domain=DOMAIN, **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, list(v.shape)) for n, v in feeds.items()]
    inits = [helper.make_tensor("Wt", TensorProto.FLOAT8E4M3FN, list(wt.shape), wt.view(np.uint8).tobytes(),
                                raw=True),
             helper.make_tensor("w_scale", TensorProto.FLOAT, [1], [float(w_scale)])]
    graph = helper.make_graph([node], f"{op}_single", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, list(y_shape))],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                              producer_name="bertfuse.kernels.check")
    model.ir_version = 9  # float8 tensors need IR 9
    return model


def _fp8_reference(op: str, attrs: dict[str, Any], x_scale: np.float32, wt: np.ndarray,
                   w_scale: np.float32) -> Callable[[Feeds], list[np.ndarray]]:
    """The fp16 op's float64 reference on what the kernel multiplies: X quantized with x_scale
    (an fp32 divide, then e4m3) and the e4m3 weight, both dequantized exactly."""
    w_deq = wt.astype(np.float64).T * float(w_scale)

    def ref(f: Feeds) -> list[np.ndarray]:
        x_deq = e4m3(f["X"].astype(np.float32) / x_scale).astype(np.float64) * float(x_scale)
        rest = [v.astype(np.float64) for k, v in f.items() if k != "X"]  # bias[, skip, gamma, beta]
        return [dense.reference(op, x_deq, w_deq, *rest, **attrs).astype(np.float16)]
    return ref


def fp8_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op, attrs, lead, k, n in _DENSE[:1] + _DENSE[2:4] + _DENSE[5:6]:
        feeds = _dense_inputs(rng, lead, k, n, op == "DenseBiasSkipLayerNorm")
        w = feeds.pop("W")
        x_scale = np.float32(np.abs(feeds["X"].astype(np.float32)).max() / E4M3_MAX)
        w_scale = np.float32(np.abs(w.astype(np.float32)).max() / E4M3_MAX)
        wt = e4m3(w.T.astype(np.float32) / w_scale)
        model = _fp8_model(op + "Fp8", feeds, wt, w_scale, {**attrs, "x_scale": float(x_scale)}, (*lead, n))
        label = f"X{list(feeds['X'].shape)} Wt[{n},{k}] e4m3{_attrs_label(attrs)}"
        exact = lambda f, op=op, w=w, attrs=attrs: dense.reference(  # noqa: E731
            op, f["X"], w, *[v for k, v in f.items() if k != "X"], **attrs)
        cases.append(Case(op + "Fp8", label, model, feeds, _fp8_reference(op, attrs, x_scale, wt, w_scale),
                          exact=exact))
    return cases


def pooler_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    # (B, S, K, N, Y32): the ranker's shape, one row, a batch past two of the kernel's 16-row
    # tiles at K 1024, TinyBERT's K 312 (no multiple of the 32-k step) with N no multiple of the
    # 8-column block, and the largest K the kernel holds.
    for b, s, k, n, y32 in [(20, 64, 768, 768, True), (1, 128, 768, 768, False),
                            (33, 7, 1024, 1024, True), (3, 1, 312, 300, True),
                            (2, 5, 2048, 16, False)]:
        feeds = {"X": normal16(rng, (b, s, k)), "Wt": normal16(rng, (n, k), k ** -0.5),
                 "bias": normal16(rng, (n,), 0.1)}

        def ref(f: Feeds, y32: bool = y32) -> list[np.ndarray]:
            y = pooler.reference64(f["X"], f["Wt"], f["bias"])
            return [y.astype(np.float16)] + ([y.astype(np.float32)] if y32 else [])

        cases.append(Case("BertPooler", f"X[{b},{s},{k}] Wt[{n},{k}]" + (" y32" if y32 else ""),
                          pooler.make_model(b, s, k, n, y32=y32), feeds, ref))
    return cases


def embed_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    # (B, S, H, V, P, T, position_ids rows): the ranker's and base's shapes with segments,
    # TinyBERT's H 312 (no multiple of a warp's 256 columns) without segments (DistilBERT) and
    # broadcast position ids, batched position ids at H 1024, and the largest H the kernel holds.
    for b, s, h, v, p, t, rows in [(20, 64, 768, 1000, 512, 2, None),
                                   (1, 128, 768, 3000, 512, 2, None),
                                   (3, 7, 312, 50, 16, None, 1), (4, 9, 1024, 64, 32, 3, 4),
                                   (2, 5, 2048, 16, 8, 2, None)]:
        feeds = {"input_ids": rng.integers(0, v, (b, s)).astype(np.int32)}
        if t:
            feeds["segment_ids"] = rng.integers(0, t, (b, s)).astype(np.int32)
        feeds["word_embedding"] = normal16(rng, (v, h), 0.5)
        feeds["position_embedding"] = normal16(rng, (p, h), 0.2)
        if t:
            feeds["segment_embedding"] = normal16(rng, (t, h), 0.2)
        feeds["gamma"] = normal16(rng, (h,), 0.1, 1.0)
        feeds["beta"] = normal16(rng, (h,), 0.1)
        if rows:
            feeds["position_ids"] = rng.integers(0, p, (rows, s)).astype(np.int32)

        def ref(f: Feeds) -> list[np.ndarray]:
            y = bert_embed.reference64(f["input_ids"], f.get("segment_ids"), f["word_embedding"],
                                       f["position_embedding"], f.get("segment_embedding"),
                                       f["gamma"], f["beta"], f.get("position_ids"))
            return [y.astype(np.float16)]

        label = f"ids[{b},{s}] word[{v},{h}]" + (f" segments {t}" if t else "") + \
            (f" position_ids[{rows},{s}]" if rows else "")
        cases.append(Case("BertEmbedLayerNorm", label,
                          bert_embed.make_model(b, s, h, v, p, t, rows), feeds, ref))
    return cases


def all_cases(seed: int = 0, ops: list[str] | None = None, fp8: bool = True) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases = dense_cases(rng) + attention_cases(rng) + \
        (fp8_cases(rng) + attention_e4m3_cases(rng) if fp8 else []) + \
        packed_cases(rng) + pooler_cases(rng) + embed_cases(rng)
    if ops:
        unknown = set(ops) - {c.op for c in cases}
        if unknown:
            raise KernelLibraryError(f"no check for op(s) {', '.join(sorted(unknown))}; known: "
                                     f"{', '.join(sorted({c.op for c in cases}))}")
        cases = [c for c in cases if c.op in ops]
    return cases


# ------------------------------------------------------------------------------ running


def _session(lib: Path, model: onnx.ModelProto, cuda_graph: bool):
    return make_session(model, device="cuda", register_kernels=True, kernels_library=lib,
                        cuda_options={"enable_cuda_graph": "1"} if cuda_graph else {})


def _run_graph(ort: Any, sess: Any, case: Case, want: list[np.ndarray], device: str = "cuda"
               ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """IO binding on device buffers: a plain run, the capture run and a replay must agree; then
    the replay's new inputs are written into the bound buffers and replayed, so a captured
    kernel must read its inputs, not stale copies. Returns (first run, new-input replay)."""
    binding = sess.io_binding()
    values = {}
    for name, arr in case.feeds.items():
        values[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), device, 0)
        binding.bind_ortvalue_input(name, values[name])
    metas = sess.get_outputs()
    outs = [ort.OrtValue.ortvalue_from_shape_and_type(  # e4m3 outputs: ORT hands their bytes as uint8
        list(w.shape), TensorProto.FLOAT8E4M3FN if m.type == "tensor(float8e4m3fn)" else w.dtype, device, 0)
        for m, w in zip(metas, want)]
    for meta, out in zip(metas, outs):
        binding.bind_ortvalue_output(meta.name, out)
    runs = []
    for _ in range(3):  # ORT: regular run(s) first, then capture, then replay
        sess.run_with_iobinding(binding)
        runs.append([o.numpy().copy() for o in outs])
    if not all(np.array_equal(a, b, equal_nan=True) for r in runs[1:] for a, b in zip(runs[0], r)):
        raise RuntimeError("CUDA graph capture/replay output differs from the plain run")
    for name, arr in case.replay_feeds().items():
        values[name].update_inplace(np.ascontiguousarray(arr))
    sess.run_with_iobinding(binding)
    return runs[0], [o.numpy().copy() for o in outs]


def run_case(ort: Any, lib: Path, case: Case, cuda_graph: bool = True) -> CaseResult:
    res = CaseResult(case.op, case.label, ok=False)
    try:
        want = case.reference(case.feeds)
        got = _session(lib, case.model, False).run(None, case.feeds)
        if [g.shape for g in got] != [w.shape for w in want]:
            res.error = f"output shapes {[list(g.shape) for g in got]}, expected {[list(w.shape) for w in want]}"
            return res
        res.max_abs, res.mean_abs, ok = case.judge(got, case.feeds, want)
        if case.exact is not None:
            res.fp8_vs_exact_max, res.fp8_vs_exact_mean = diff(got[0], case.exact(case.feeds))
        if cuda_graph:
            first, replay = _run_graph(ort, _session(lib, case.model, True), case, want)
            g1, _, ok1 = case.judge(first, case.feeds, want)
            g2, _, ok2 = case.judge(replay, case.replay_feeds())
            res.graph_max_abs = max(g1, g2) if np.isfinite(g1) and np.isfinite(g2) else float("nan")
            ok = ok and ok1 and ok2
        res.ok = ok
    except KernelLibraryError:
        raise
    except Exception as exc:  # an ORT error status from the kernel: that case fails, the rest run
        res.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return res


def run_checks(lib: Path, cases: list[Case], cuda_graph: bool = True,
               say: Callable[[CaseResult], None] = lambda r: None) -> list[CaseResult]:
    ort = optional("onnxruntime", why="the op library runs in ONNX Runtime")

    results = []
    for case in cases:
        results.append(run_case(ort, lib, case, cuda_graph))
        say(results[-1])
    return results
