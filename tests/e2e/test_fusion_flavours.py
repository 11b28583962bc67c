"""End-to-end fusion targets for every TF source flavour (the 8 fixtures of conftest.py).

Each flavour goes through `bertfuse convert` with default settings (fp32, and `--precision
fp16`), and the fused model must reach the same targets whatever the source looked like:

* fused ops: per layer 1 Attention, 2 SkipLayerNormalization, 1 BiasGelu (erf GELU) or FastGelu
  (tanh GELU); 1 EmbedLayerNormalization; at most 7L + 8 nodes in all (+3 for a ranking head's
  Gemm/Relu/Gemm); no Softmax, ReduceMean, Erf, Transpose or Shape left;
* the report's encoder table says fully fused, every layer fused;
* parity with the ORIGINAL model (fixture.reference: the SavedModel signature, the .keras model,
  or Google's math on the weights), not bertfuse's frozen copy, on inputs padded at the end, in
  the middle and at the start of rows, batch 1 and batch 20: fp32 max |diff| <= 1e-4; fp16
  max <= 4e-2 and mean <= 2e-3, int32 inputs and fp32 outputs;
* a guard that those parity checks catch a Q/K swap in a packed Attention weight;
* `bertfuse optimize` on the user's own `python -m tf2onnx.convert` export fuses fully too;
* `--strict` exits 1 and writes nothing when a layer is left unfused;
* bertfuse fuses strictly more than ONNX Runtime's own transformer optimizer (bert_tf).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from bertfuse import cli
from bertfuse.pipeline.parity import ort_session, run_onnx
from support.builders.tf_models import SOURCE_FIXTURES, TFModel

L = 2  # EXAMPLE_CONFIGS['tiny'].num_hidden_layers
MS = "com.microsoft"
FP32_MAX = 1e-4
FP16_MAX, FP16_MEAN = 4e-2, 2e-3
# A Q/K swap must move the outputs by at least 10x the fp32 tolerance. (Not 1e-2: with the
# fixtures' std-0.02 weights attention is nearly uniform, so swapping Q and K in one layer moves
# sequence_output by only 4e-3 to 7e-3 max, 4e-4 mean: 40-70x the fp32 tolerance, but inside the
# fp16 tolerances, which alone would not catch it.)
SWAP_MIN = 10 * FP32_MAX
GONE = ("Softmax", "ReduceMean", "Erf", "Transpose", "Shape")
HEAD_EXTRA = 3  # ranking head: Gemm, Relu, Gemm


# ------------------------------------------------------------------------------ helpers


def _gelu_op(model: TFModel) -> str:
    """tanh GELU (gelu_new) -> FastGelu; exact erf GELU -> BiasGelu."""
    return "FastGelu" if model.config.hidden_act in ("gelu_new", "gelu_fast") else "BiasGelu"


def _ops(model: onnx.ModelProto) -> Counter:
    """Op histogram, contrib ops keyed 'com.microsoft.Op' (as the report's ops_after)."""
    return Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                   for n in model.graph.node)


def _why(report: dict) -> str:
    """The report's fusion diagnostics, for assertion messages."""
    passes = (report or {}).get("passes") or {}
    enc = passes.get("encoder") or {}
    layers = [{k: lay.get(k) for k in ("layer", "attention", "skip_layernorm", "gelu",
                                       "leftovers", "reasons")}
              for lay in enc.get("layers", []) if not lay.get("fused")]
    missed = [d for d in passes.get("diagnostics", []) if not d.get("fused")]
    return (f"\n  encoder: fully_fused={enc.get('fully_fused')} embed_layernorm="
            f"{enc.get('embed_layernorm')} embed_reasons={enc.get('embed_reasons')}"
            f"\n  unfused layers: {json.dumps(layers)}"
            f"\n  missed diagnostics: {json.dumps(missed)}"
            f"\n  ops_after: {json.dumps(passes.get('ops_after'))}")


def _cli(*argv: str) -> tuple[int, dict]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main([*argv, "--json"])
    text = buf.getvalue()
    return code, (json.loads(text) if text.strip() else {})


_SESSIONS: dict[str, object] = {}


def _session(path: str):
    if path not in _SESSIONS:
        _SESSIONS[path] = ort_session(path)
    return _SESSIONS[path]


# ------------------------------------------------------------------- padded verification inputs

# Row layouts of the mask: padding at the end, in the middle, at the start, none, single valid
# tokens at either edge or inside, two holes. Never an all-zero row.
_ROW_KINDS = ("end", "middle", "start", "full", "one_first", "one_last", "one_mid", "two_holes")


def _mask_row(kind: str, seq: int, rng: np.random.Generator) -> np.ndarray:
    row = np.ones(seq, np.int32)
    if kind == "end":
        row[rng.integers(1, seq - 1):] = 0
    elif kind == "middle":
        lo = int(rng.integers(1, seq // 2))
        row[lo:lo + int(rng.integers(1, seq - lo - 1))] = 0
    elif kind == "start":
        row[: rng.integers(1, seq - 1)] = 0
    elif kind in ("one_first", "one_last", "one_mid"):
        row[:] = 0
        row[{"one_first": 0, "one_last": seq - 1, "one_mid": seq // 2}[kind]] = 1
    elif kind == "two_holes":
        row[2:5] = 0
        row[seq - 6:seq - 2] = 0
    assert row.any()
    return row


def _feeds(model: TFModel, kinds: tuple[str, ...], seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch = len(kinds)
    mask = np.stack([_mask_row(k, seq, rng) for k in kinds])
    ids = rng.integers(1, model.vocab, size=(batch, seq)).astype(np.int32)
    ids[mask == 0] = 0
    segs = rng.integers(0, model.config.type_vocab_size, size=(batch, seq)).astype(np.int32)
    feeds = {"input_ids": ids, "input_mask": mask, "segment_ids": segs}
    return {r: v for r, v in feeds.items() if r in model.inputs}


# batch 1: one row per padding place; batch 20: every layout, cycled.
CASES = {
    "b1_end": (("end",), 29, 101),
    "b1_middle": (("middle",), 29, 102),
    "b1_start": (("start",), 29, 103),
    "b20": (tuple(_ROW_KINDS[i % len(_ROW_KINDS)] for i in range(20)), 48, 120),
}
BATCH_CASES = {1: ("b1_end", "b1_middle", "b1_start"), 20: ("b20",)}

_REFS: dict[tuple[str, str], tuple[dict, dict]] = {}


def _case(model: TFModel, case: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(feeds, the original model's outputs), computed once per flavour and case."""
    key = (model.name, case)
    if key not in _REFS:
        kinds, seq, seed = CASES[case]
        feeds = _feeds(model, kinds, seq, seed)
        _REFS[key] = (feeds, model.reference(feeds))
    return _REFS[key]


def _diffs(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> dict[str, tuple]:
    out = {}
    for name, ref in want.items():
        assert name in got, f"model lacks output {name}: {sorted(got)}"
        assert got[name].shape == ref.shape, (name, got[name].shape, ref.shape)
        d = np.abs(got[name].astype(np.float64) - ref.astype(np.float64))
        out[name] = (float(d.max()), float(d.mean()))
    return out


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(params=SOURCE_FIXTURES)
def flavour(request) -> TFModel:
    return request.getfixturevalue(request.param)


@pytest.fixture
def fused(flavour, convert_cached):
    res = convert_cached(flavour)
    assert res.exit_code == 0 and Path(res.onnx_path).is_file(), \
        f"{flavour.name}: convert exit {res.exit_code}{_why(res.report)}"
    return res


@pytest.fixture
def fused16(flavour, convert_cached):
    res = convert_cached(flavour, "--precision", "fp16")
    assert res.exit_code == 0 and Path(res.onnx_path).is_file(), \
        f"{flavour.name}: convert --precision fp16 exit {res.exit_code}{_why(res.report)}"
    return res


# ------------------------------------------------------------------------- fused structure


def test_fused_op_counts(fused):
    m = fused.source
    model = onnx.load(fused.onnx_path, load_external_data=False)
    ops = _ops(model)
    gelu = _gelu_op(m)
    other_gelu = "BiasGelu" if gelu == "FastGelu" else "FastGelu"
    want = {f"{MS}.Attention": L, f"{MS}.SkipLayerNormalization": 2 * L, f"{MS}.{gelu}": L,
            f"{MS}.EmbedLayerNormalization": 1, f"{MS}.{other_gelu}": 0}
    got = {op: ops[op] for op in want}
    assert got == want, f"{m.name}: fused op counts {got}, want {want}{_why(fused.report)}"
    limit = 7 * L + 8 + (HEAD_EXTRA if m.head else 0)
    total = sum(ops.values())
    assert total <= limit, (f"{m.name}: {total} nodes > {limit}: {dict(sorted(ops.items()))}"
                            f"{_why(fused.report)}")
    # The report's census is the model's.
    assert fused.report["passes"]["ops_after"] == dict(sorted(ops.items()))


def test_encoder_table_fully_fused(fused):
    m = fused.source
    enc = fused.report["passes"]["encoder"]
    assert enc is not None, f"{m.name}: no encoder table in the report"
    assert enc["embed_layernorm"] is True, f"{m.name}: embeddings unfused{_why(fused.report)}"
    assert len(enc["layers"]) == L, f"{m.name}: {len(enc['layers'])} layers{_why(fused.report)}"
    for lay in enc["layers"]:
        assert lay["fused"] and lay["attention"] and lay["skip_layernorm"] == 2 and lay["gelu"], \
            f"{m.name}: layer {lay['layer']} not fused: {lay}{_why(fused.report)}"
        assert not lay["leftovers"], f"{m.name}: layer {lay['layer']} leftovers {lay}"
    assert enc["fully_fused"] is True, f"{m.name}{_why(fused.report)}"


def test_replaced_ops_gone(fused):
    m = fused.source
    ops = _ops(onnx.load(fused.onnx_path, load_external_data=False))
    left = {op: ops[op] for op in GONE if ops[op]}
    assert not left, f"{m.name}: ops left that fusion should remove: {left}{_why(fused.report)}"


# ------------------------------------------------------------------------------ parity


@pytest.mark.parametrize("batch", [1, 20])
def test_fp32_parity_vs_original(fused, batch):
    m = fused.source
    session = _session(fused.onnx_path)
    for case in BATCH_CASES[batch]:
        feeds, want = _case(m, case)
        assert {"sequence_output", "pooled_output"} <= set(want)
        diffs = _diffs(run_onnx(session, feeds), want)
        bad = {n: d for n, d in diffs.items() if not d[0] <= FP32_MAX}
        assert not bad, (f"{m.name} fp32 {case}: max |diff| > {FP32_MAX}: "
                         + ", ".join(f"{n} {d[0]:.3g}" for n, d in bad.items()))


def test_fp16_interface(fused16):
    m = fused16.source
    model = onnx.load(fused16.onnx_path, load_external_data=False)
    ins = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    outs = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    assert ins == {r: TensorProto.INT32 for r in m.inputs}, ins
    assert outs == {o: TensorProto.FLOAT for o in m.outputs}, outs
    assert any(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer), \
        "fp16 model holds no fp16 weights"
    ops = _ops(model)
    assert ops[f"{MS}.Attention"] == L and ops[f"{MS}.SkipLayerNormalization"] == 2 * L, \
        f"{m.name} fp16: {dict(sorted(ops.items()))}{_why(fused16.report)}"


@pytest.mark.parametrize("batch", [1, 20])
def test_fp16_parity_vs_original(fused16, batch):
    m = fused16.source
    session = _session(fused16.onnx_path)
    for case in BATCH_CASES[batch]:
        feeds, want = _case(m, case)
        got = run_onnx(session, feeds)
        for name, v in got.items():
            assert v.dtype == np.float32, (name, v.dtype)
        diffs = _diffs(got, want)
        bad = {n: d for n, d in diffs.items() if not (d[0] <= FP16_MAX and d[1] <= FP16_MEAN)}
        assert not bad, (f"{m.name} fp16 {case}: past max {FP16_MAX} / mean {FP16_MEAN}: "
                         + ", ".join(f"{n} max {d[0]:.3g} mean {d[1]:.3g}"
                                     for n, d in bad.items()))


# ------------------------------------------------------------------- Q/K swap guard


def test_qk_swap_is_caught(fused):
    """Swapping the Q and K column blocks of one Attention's packed weight and bias must fail
    the fp32 parity check above by a wide margin (SWAP_MIN): the tests would catch a swap."""
    m = fused.source
    model = onnx.load(fused.onnx_path)
    attn = [n for n in model.graph.node if n.domain == MS and n.op_type == "Attention"]
    assert attn, f"{m.name}: no Attention node{_why(fused.report)}"
    node = attn[0]
    inits = {i.name: i for i in model.graph.initializer}
    assert node.input[1] in inits and node.input[2] in inits, \
        f"{m.name}: Attention weight/bias are not initializers: {list(node.input)}"
    w = numpy_helper.to_array(inits[node.input[1]]).copy()
    b = numpy_helper.to_array(inits[node.input[2]]).copy()
    hidden = w.shape[0]
    assert w.shape == (hidden, 3 * hidden) and b.shape == (3 * hidden,), (w.shape, b.shape)
    q, k = slice(0, hidden), slice(hidden, 2 * hidden)
    w[:, q], w[:, k] = w[:, k].copy(), w[:, q].copy()
    b[q], b[k] = b[k].copy(), b[q].copy()
    inits[node.input[1]].CopyFrom(numpy_helper.from_array(w, node.input[1]))
    inits[node.input[2]].CopyFrom(numpy_helper.from_array(b, node.input[2]))

    feeds, want = _case(m, "b20")
    intact = _diffs(run_onnx(_session(fused.onnx_path), feeds), want)
    assert max(d[0] for d in intact.values()) <= FP32_MAX, intact
    swapped = _diffs(run_onnx(ort_session(model), feeds), want)
    worst = max(d[0] for d in swapped.values())
    assert worst > SWAP_MIN, (f"{m.name}: Q/K swap in {node.name} moves the outputs by only "
                              f"{worst:.3g} (<= {SWAP_MIN}): parity would not catch it; "
                              f"{swapped}")
    assert swapped["sequence_output"][0] > SWAP_MIN, swapped
    # Batch 1 too: each padding place alone shows the swap past the fp32 tolerance.
    for case in BATCH_CASES[1]:
        feeds, want = _case(m, case)
        d = _diffs(run_onnx(ort_session(model), feeds), want)
        assert d["sequence_output"][0] > FP32_MAX, (m.name, case, d)


# ------------------------------------------------------- optimize on the user's own export

OWN_SOURCES = ("savedmodel_dir", "hf_style_savedmodel")
OPSETS = (17, 18)


@pytest.fixture(scope="session")
def own_exports(request, tmp_path_factory):
    """`python -m tf2onnx.convert --saved-model DIR --opset N --output raw.onnx`, as the user
    runs it, for both SavedModels and both opsets; the four exports run concurrently."""
    out_dir = tmp_path_factory.mktemp("own_export")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    jobs = {}
    for source in OWN_SOURCES:
        m: TFModel = request.getfixturevalue(source)
        for opset in OPSETS:
            out = out_dir / f"{m.name}_raw_opset{opset}.onnx"
            log_path = out.with_suffix(".log")
            with open(log_path, "w") as log:
                proc = subprocess.Popen([sys.executable, "-m", "tf2onnx.convert",
                                         "--saved-model", m.path, "--opset", str(opset),
                                         "--output", str(out)],
                                        stdout=log, stderr=subprocess.STDOUT, env=env)
            jobs[(source, opset)] = (out, log_path, proc)
    yield out_dir, jobs
    for _, _, proc in jobs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _own_export(own_exports, source: str, opset: int) -> tuple[Path, Path]:
    out_dir, jobs = own_exports
    out, log_path, proc = jobs[(source, opset)]
    rc = proc.wait(timeout=300)
    assert rc == 0 and out.is_file(), \
        f"tf2onnx failed ({rc}):\n{log_path.read_text()[-3000:]}"
    return out, out_dir


def _by_own_name(names: list[str], own: str) -> str:
    for n in names:
        if n == own or n.split(":")[0] == own:
            return n
    raise AssertionError(f"no graph name for {own!r} in {names}")


_NP = {TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("source", OWN_SOURCES)
def test_optimize_own_tf2onnx_export(source, opset, request, own_exports):
    m: TFModel = request.getfixturevalue(source)
    raw_path, own_export_dir = _own_export(own_exports, source, opset)
    raw = onnx.load(str(raw_path))
    raw_inputs = {i.name: i.type.tensor_type.elem_type for i in raw.graph.input}
    out = own_export_dir / f"{m.name}_fused_opset{opset}.onnx"
    code, report = _cli("optimize", str(raw_path), "-o", str(out))
    assert code == 0 and out.is_file(), f"{m.name} opset {opset}: exit {code}{_why(report)}"
    model = onnx.load(str(out))
    assert {o.domain: o.version for o in model.opset_import}[""] == opset

    ops = _ops(model)
    gelu = _gelu_op(m)
    want = {f"{MS}.Attention": L, f"{MS}.SkipLayerNormalization": 2 * L, f"{MS}.{gelu}": L,
            f"{MS}.EmbedLayerNormalization": 1}
    got = {op: ops[op] for op in want}
    assert got == want, f"{m.name} opset {opset}: {got}, want {want}{_why(report)}"
    left = {op: ops[op] for op in GONE if ops[op]}
    assert not left, f"{m.name} opset {opset}: ops left {left}{_why(report)}"
    enc = report["passes"]["encoder"]
    assert enc["fully_fused"] and len(enc["layers"]) == L \
        and all(lay["fused"] for lay in enc["layers"]), f"{m.name}{_why(report)}"
    total, limit = sum(ops.values()), 7 * L + 8
    assert total <= limit, f"{m.name} opset {opset}: {total} nodes > {limit}: {dict(ops)}"

    # The user's own interface, and parity with the original model under it.
    session = ort_session(str(out))
    in_names = [i.name for i in session.get_inputs()]
    out_names = [o.name for o in session.get_outputs()]
    assert sorted(in_names) == sorted(raw_inputs), (in_names, sorted(raw_inputs))
    for case in (*BATCH_CASES[1], *BATCH_CASES[20]):
        feeds, want = _case(m, case)
        onnx_feeds = {}
        for role, own in m.inputs.items():
            name = _by_own_name(in_names, own)
            onnx_feeds[name] = feeds[role].astype(_NP[raw_inputs[name]])
        res = dict(zip(out_names, session.run(None, onnx_feeds)))
        got = {canon: res[_by_own_name(out_names, own)] for canon, own in m.outputs.items()}
        diffs = _diffs(got, want)
        bad = {n: d for n, d in diffs.items() if not d[0] <= FP32_MAX}
        assert not bad, f"{m.name} opset {opset} {case}: {bad}"


# ------------------------------------------------------------------------------ --strict

_STRICT_REASON = "test-injected: layer 1 refused"


@pytest.fixture
def layer1_unfusable(monkeypatch):
    """AttentionFusion's structural and numeric matches fail for layer 1 only."""
    from bertfuse.passes import attention
    from bertfuse.passes.match import fail

    orig_match, orig_numeric = attention.AttentionFusion.match_structure, attention.match_numeric
    seen: dict[str, object] = {}

    def layer_of(graph, softmax) -> int:
        # The softmaxes in graph order, as the pass enumerates them when it starts.
        if seen.get("graph") is not graph:
            seen["graph"] = graph
            seen["softmaxes"] = [n for n in graph.nodes if n.op == "Softmax"]
        return seen["softmaxes"].index(softmax)

    def match(self, graph, softmax):
        if layer_of(graph, softmax) == 1:
            fail(_STRICT_REASON)
        return orig_match(self, graph, softmax)

    def match_numeric(graph, softmax):
        if layer_of(graph, softmax) == 1:
            fail(_STRICT_REASON + " (numeric)")
        return orig_numeric(graph, softmax)

    monkeypatch.setattr(attention.AttentionFusion, "match_structure", match)
    monkeypatch.setattr(attention, "match_numeric", match_numeric)


def _check_strict_failure(code: int, err: str, out: Path) -> None:
    assert code == 1, f"exit {code}, stderr: {err}"
    assert not out.exists(), "--strict wrote the model"
    assert not list(out.parent.iterdir()), f"left behind: {list(out.parent.iterdir())}"
    assert "--strict" in err and "layer 1" in err, err
    assert _STRICT_REASON in err and _STRICT_REASON + " (numeric)" in err, err
    assert "layer 0" not in err, err


def test_strict_convert_unfused_layer(ckpt_erf, layer1_unfusable, tmp_path, capsys):
    out_dir = tmp_path / "strict"
    out_dir.mkdir()
    out = out_dir / "model.onnx"
    code = cli.main(["convert", ckpt_erf.path, "-o", str(out), "--strict", "--seed", "0",
                     "--batch", "2"])
    _check_strict_failure(code, capsys.readouterr().err, out)


def test_strict_optimize_unfused_layer(ckpt_erf, convert_cached, layer1_unfusable, tmp_path,
                                       capsys):
    raw = convert_cached(ckpt_erf, "--no-fuse")
    assert raw.exit_code == 0, raw.report
    out_dir = tmp_path / "strict"
    out_dir.mkdir()
    out = out_dir / "model.onnx"
    code = cli.main(["optimize", raw.onnx_path, "-o", str(out), "--strict"])
    _check_strict_failure(code, capsys.readouterr().err, out)


def test_strict_passes_when_fully_fused(ckpt_erf, convert_cached, tmp_path):
    raw = convert_cached(ckpt_erf, "--no-fuse")
    out = tmp_path / "fused.onnx"
    code, report = _cli("optimize", raw.onnx_path, "-o", str(out), "--strict")
    assert code == 0 and out.is_file(), _why(report)


# ---------------------------------------------------------- vs ONNX Runtime's own optimizer


def test_fuses_more_than_ort_optimizer(ckpt_erf, convert_cached):
    from onnxruntime.transformers.optimizer import optimize_model

    raw = convert_cached(ckpt_erf, "--no-fuse")
    assert raw.exit_code == 0, raw.report
    ours = convert_cached(ckpt_erf)
    assert ours.exit_code == 0, ours.report
    with contextlib.redirect_stdout(io.StringIO()):
        ort_model = optimize_model(raw.onnx_path, model_type="bert_tf", num_heads=0,
                                   hidden_size=0)
    ort_ops = Counter(n.op_type for n in ort_model.model.graph.node if n.domain == MS)
    our_ops = Counter(n.op_type for n in onnx.load(ours.onnx_path).graph.node if n.domain == MS)
    compared = ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization")
    ort_counts = {op: ort_ops[op] for op in compared}
    our_counts = {op: our_ops[op] for op in compared}
    for op in compared:
        assert our_counts[op] > ort_counts[op], \
            f"{op}: bertfuse {our_counts[op]} vs ORT optimizer {ort_counts[op]} " \
            f"(ORT: {ort_counts}, all ORT contrib ops {dict(ort_ops)}; bertfuse: {our_counts})"
