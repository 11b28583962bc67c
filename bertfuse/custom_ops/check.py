"""`bertfuse kernels check`: every ai.bertfuse op on the GPU, through ONNX Runtime's CUDA EP,
against its float64 NumPy reference.

Each case is a one-node model (domain ai.bertfuse opset 1, ai.onnx 17, IR 8; IR 9 for the FP8
forms, whose float8 weights IR 8 cannot hold) run in two sessions: a plain session.run, and one
with CUDA graphs on and IO binding (plain run, capture, replay; then new inputs written into the
bound buffers and replayed), which fails if a kernel allocates or synchronises inside Compute or
reads stale inputs. fp16 gate: max |diff| <= 4e-2 and mean <= 2e-3 against the float64
reference, no NaN. FP8 forms are gated the same way against the reference computed on the
e4m3-quantized operands (what the kernel multiplies), and their drift from the unquantized
reference is reported beside it, not gated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import bert_attention, dense
from .library import DOMAIN, KernelLibraryError, register

MAX_ABS, MEAN_ABS = 4e-2, 2e-3
E4M3_MAX = 448.0


@dataclass
class Case:
    op: str
    label: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    reference: np.ndarray
    exact: np.ndarray | None = None  # FP8: the reference on unquantized operands (reported only)


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


def _normal(rng: np.random.Generator, shape, std: float = 1.0, mean: float = 0.0) -> np.ndarray:
    return (rng.standard_normal(shape) * std + mean).astype(np.float16)


def _dense_inputs(rng, lead: tuple[int, ...], k: int, n: int, skip: bool) -> dict[str, np.ndarray]:
    feeds = {"X": _normal(rng, (*lead, k)), "W": _normal(rng, (k, n), k ** -0.5),
             "bias": _normal(rng, (n,), 0.1)}
    if skip:
        feeds.update(skip=_normal(rng, (*lead, n)), gamma=_normal(rng, (n,), 0.1, 1.0),
                     beta=_normal(rng, (n,), 0.1))
    return feeds


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
]


def dense_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op, attrs, lead, k, n in _DENSE:
        feeds = _dense_inputs(rng, lead, k, n, op == "DenseBiasSkipLayerNorm")
        model = dense.make_model(op, (*lead, k), n, **attrs)
        ref = dense.reference(op, *feeds.values(), **attrs)
        label = f"X{list(feeds['X'].shape)} W[{k},{n}]" + "".join(f" {a}={v}" for a, v in attrs.items())
        cases.append(Case(op, label, model, feeds, ref))
    return cases


def _lengths_mask(lengths: list[int]) -> np.ndarray:
    return np.asarray(lengths, np.int32)


def attention_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    specs = [  # (B, S, H, heads, mask form, scale)
        (4, 64, 768, 12, None, None),
        (4, 64, 768, 12, "raw", None),
        (4, 64, 768, 12, "lengths", None),
        (2, 128, 768, 12, "raw", None),
        (3, 37, 768, 12, "lengths", 0.2),
        (2, 16, 256, 4, "raw", None),
    ]
    for b, s, h, heads, form, scale in specs:
        qkv = _normal(rng, (b, s, 3 * h))
        mask = None
        if form == "lengths":  # a full row, a short one, one key only, and none (uniform row)
            mask = _lengths_mask(([s, max(1, s // 2 + 1), 1, 0] * b)[:b])
        elif form == "raw":  # arbitrary holes, and a row that keeps nothing
            mask = (rng.random((b, s)) > 0.3).astype(np.int32)
            mask[-1, :] = 0
        model = bert_attention.make_model(b, s, h, heads, mask_shape=None if mask is None else mask.shape,
                                          scale=scale)
        feeds = {"qkv": qkv} if mask is None else {"qkv": qkv, "mask": mask}
        ref = bert_attention.reference(qkv, mask, num_heads=heads, scale=scale)
        label = f"qkv[{b},{s},{3 * h}] heads={heads} mask={form or 'none'}" + (f" scale={scale}" if scale else "")
        cases.append(Case("BertAttention", label, model, feeds, ref))
    return cases


def _e4m3(x: np.ndarray) -> np.ndarray:
    """Round to float8 e4m3fn (nearest even), saturating at +-448; returned as the fp8 array."""
    import ml_dtypes

    return np.clip(x.astype(np.float32), -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)


def _fp8_model(op: str, feeds: dict[str, np.ndarray], wt: np.ndarray, w_scale: np.float32,
               attrs: dict[str, Any], y_shape: tuple[int, ...]) -> onnx.ModelProto:
    skip = op == "DenseBiasSkipLayerNormFp8"
    names = ["X", "Wt", "bias"] + (["skip", "gamma", "beta"] if skip else []) + ["w_scale"]
    node = helper.make_node(op, names, ["Y"], domain=DOMAIN, **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, list(feeds[n].shape))
              for n in names if n in feeds]
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


def fp8_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for op, attrs, lead, k, n in _DENSE[:1] + _DENSE[2:4] + _DENSE[5:6]:
        fp8_op = op + "Fp8"
        feeds = _dense_inputs(rng, lead, k, n, op == "DenseBiasSkipLayerNorm")
        x, w = feeds["X"], feeds.pop("W")
        x_scale = np.float32(np.abs(x.astype(np.float32)).max() / E4M3_MAX)
        w_scale = np.float32(np.abs(w.astype(np.float32)).max() / E4M3_MAX)
        xq = _e4m3(x.astype(np.float32) / x_scale)
        wt = _e4m3(w.T.astype(np.float32) / w_scale)
        # What the kernel multiplies, dequantized exactly in float64.
        x_deq = xq.astype(np.float64) * float(x_scale)
        w_deq = wt.astype(np.float64).T * float(w_scale)
        rest = [feeds[s] for s in ("skip", "gamma", "beta") if s in feeds]
        quant = _reference64(op, x_deq, w_deq, feeds["bias"], rest, attrs)
        exact = dense.reference(op, x, w, feeds["bias"], *rest, **attrs)
        model = _fp8_model(fp8_op, feeds, wt, w_scale, {**attrs, "x_scale": float(x_scale)}, quant.shape)
        label = f"X{list(x.shape)} Wt[{n},{k}] e4m3" + "".join(f" {a}={v}" for a, v in attrs.items())
        cases.append(Case(fp8_op, label, model, feeds, quant, exact))
    return cases


def _reference64(op: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray, rest: list[np.ndarray],
                 attrs: dict[str, Any]) -> np.ndarray:
    """The fp16 op's float64 reference on float64 operands, rounded once to fp16."""
    y = dense.reference(op, x, w, bias.astype(np.float64), *[r.astype(np.float64) for r in rest], **attrs)
    return y.astype(np.float16)


def all_cases(seed: int = 0, ops: list[str] | None = None, fp8: bool = True) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases = dense_cases(rng) + attention_cases(rng) + (fp8_cases(rng) if fp8 else [])
    if ops:
        unknown = set(ops) - {c.op for c in cases}
        if unknown:
            raise KernelLibraryError(f"no check for op(s) {', '.join(sorted(unknown))}; known: "
                                     f"{', '.join(sorted({c.op for c in cases}))}")
        cases = [c for c in cases if c.op in ops]
    return cases


# ------------------------------------------------------------------------------ running


def _session(ort: Any, lib: Path, model: onnx.ModelProto, cuda_graph: bool):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    register(so, lib)
    opts = {"enable_cuda_graph": "1"} if cuda_graph else {}
    return ort.InferenceSession(model.SerializeToString(), so, providers=[("CUDAExecutionProvider", opts)])


def _run_graph(ort: Any, sess: Any, feeds: dict[str, np.ndarray], like: np.ndarray,
               device: str = "cuda") -> tuple[np.ndarray, np.ndarray]:
    """IO binding on device buffers: a plain run, the capture run and a replay must agree; then
    new inputs written into the bound buffers (the batch rolled by one row) must give the rolled
    output on replay, so a captured kernel reads its inputs, not stale copies."""
    binding = sess.io_binding()
    values = {}
    for name, arr in feeds.items():
        values[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), device, 0)
        binding.bind_ortvalue_input(name, values[name])
    out = ort.OrtValue.ortvalue_from_shape_and_type(list(like.shape), like.dtype, device, 0)
    binding.bind_ortvalue_output(sess.get_outputs()[0].name, out)
    runs = []
    for _ in range(3):  # ORT: regular run(s) first, then capture, then replay
        sess.run_with_iobinding(binding)
        runs.append(out.numpy().copy())
    if not all(np.array_equal(runs[0], r, equal_nan=True) for r in runs[1:]):
        raise RuntimeError("CUDA graph capture/replay output differs from the plain run")
    for name, arr in feeds.items():
        values[name].update_inplace(np.ascontiguousarray(np.roll(arr, 1, axis=0)))
    sess.run_with_iobinding(binding)
    return runs[0], out.numpy().copy()


def _diff(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    if not np.all(np.isfinite(got.astype(np.float64))):
        return float("nan"), float("nan")
    return float(d.max()), float(d.mean())


def _passes(mx: float | None, mean: float | None) -> bool:
    return mx is not None and mean is not None and np.isfinite(mx) and mx <= MAX_ABS and mean <= MEAN_ABS


def run_case(ort: Any, lib: Path, case: Case, cuda_graph: bool = True) -> CaseResult:
    res = CaseResult(case.op, case.label, ok=False)
    try:
        got = _session(ort, lib, case.model, False).run(None, case.feeds)[0]
        if got.shape != case.reference.shape:
            res.error = f"output shape {list(got.shape)}, expected {list(case.reference.shape)}"
            return res
        res.max_abs, res.mean_abs = _diff(got, case.reference)
        if case.exact is not None:
            res.fp8_vs_exact_max, res.fp8_vs_exact_mean = _diff(got, case.exact)
        ok = _passes(res.max_abs, res.mean_abs)
        if cuda_graph:  # every op is row-wise along axis 0: rolled inputs give the rolled output
            first, rolled = _run_graph(ort, _session(ort, lib, case.model, True), case.feeds, case.reference)
            g1, g1_mean = _diff(first, case.reference)
            g2, g2_mean = _diff(rolled, np.roll(case.reference, 1, axis=0))
            res.graph_max_abs = max(g1, g2) if np.isfinite(g1) and np.isfinite(g2) else float("nan")
            ok = ok and _passes(g1, g1_mean) and _passes(g2, g2_mean)
        res.ok = ok
    except KernelLibraryError:
        raise
    except Exception as exc:  # an ORT error status from the kernel: that case fails, the rest run
        res.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return res


def run_checks(lib: Path, cases: list[Case], cuda_graph: bool = True,
               say: Callable[[CaseResult], None] = lambda r: None) -> list[CaseResult]:
    import onnxruntime as ort

    results = []
    for case in cases:
        results.append(run_case(ort, lib, case, cuda_graph))
        say(results[-1])
    return results
