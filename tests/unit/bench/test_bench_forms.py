"""`bertfuse bench` with bertfuse's own CUDA ops beside the ORT-contrib form: which runtime
rows run, the bertfuse-kernels model it builds, and what its rows say where the op library or
the rewrite is missing. The timing itself needs a GPU (docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import shutil
from collections import Counter

import onnx
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_graphsurgeon")

from bertfuse import cli  # noqa: E402
from bertfuse.bench.forms import AUTO_ROW, CONTRIB_DEFAULT, CONTRIB_RAW_ONLY, FIRST_ROW, KERNELS_ROWS, KernelsSetup, \
    find_library, format_comparison, gelu_approximation_model, plan_rows, runtime_rows  # noqa: E402
from bertfuse.bench.peers import ORT_PEER, TORCH_PEER  # noqa: E402
from bertfuse.bench.models import prepare_models  # noqa: E402
from bertfuse.bench.padded import Result  # noqa: E402
from bertfuse.ops import BERTFUSE_DOMAIN  # noqa: E402
from bertfuse.kernels.library import LIB_NAME, cache_key  # noqa: E402


def test_runtime_rows_add_the_kernels_form_to_the_contrib_rows():
    contrib, both = runtime_rows(False), runtime_rows(True)
    assert {key for _, key, _ in contrib} == {"bertfuse16"}
    assert both[:len(contrib)] == contrib  # the contrib rows are unchanged
    # They hold their form; the auto row opens the same contrib file as the runtime's default.
    assert all(kw["kernels"] == "ort" for _, _, kw in contrib)
    assert both[len(contrib)] == (AUTO_ROW, "bertfuse16", {"kernels": "auto"})
    extra = both[len(contrib) + 1:]
    assert [key for _, key, _ in extra] == ["kernels16", "kernels16", "kernels_fp8",
                                            "kernels16_gelu"]
    assert extra[0][2] == {}  # the runtime as shipped: mask variants as it picks them
    assert extra[1][2] == {"mask_variants": False}
    assert extra[2][2] == extra[3][2] == {}
    labels = [label for label, _, _ in both]
    assert len(set(labels)) == len(labels) and CONTRIB_DEFAULT in labels
    assert FIRST_ROW == {"kernels16": extra[0][0], "kernels_fp8": extra[2][0],
                         "kernels16_gelu": extra[3][0]}
    # paired: of the contrib form only the rows the kernels form has a twin of.
    paired = runtime_rows(True, paired=True)
    assert paired == [row for row in contrib if row[0] in (CONTRIB_RAW_ONLY, CONTRIB_DEFAULT)] \
        + [both[len(contrib)]] + extra
    twins = {label: kw for label, _, kw in paired}  # each kernels row's contrib twin
    assert (twins[CONTRIB_DEFAULT], twins[CONTRIB_RAW_ONLY]) == \
        ({"kernels": "ort", **extra[0][2]}, {"kernels": "ort", **extra[1][2]})
    assert runtime_rows(False, paired=True) == paired[:2]


def test_missing_library_is_one_line_naming_the_cache_and_the_build(tmp_path):
    setup = find_library(sm=90, root=str(tmp_path))
    assert setup.library is None and setup.info == {}
    assert "\n" not in setup.reason
    assert str(tmp_path) in setup.reason and "bertfuse kernels build" in setup.reason
    # A library for another GPU is not taken for this one.
    other = tmp_path / cache_key(21, 80)
    other.mkdir()
    (other / LIB_NAME).write_bytes(b"\x7fELF")
    assert find_library(sm=90, root=str(tmp_path)).library is None
    # One for this GPU that cannot be loaded says so, and how to fix it.
    mine = tmp_path / cache_key(21, 90)
    shutil.copytree(other, mine)
    broken = find_library(sm=90, root=str(tmp_path))
    assert broken.library is None and "\n" not in broken.reason
    assert "cannot load" in broken.reason and "--force" in broken.reason


def test_without_the_library_the_kernels_rows_say_why_and_the_rest_runs():
    paths = {"bertfuse16": "/nonexistent/bertfuse16.onnx"}  # never read: no library
    rows, notes, skipped = plan_rows(KernelsSetup(reason="no CUDA GPU found"), paths)
    # The auto row stays (it opens the contrib file and says why it kept it).
    assert rows == runtime_rows(False) + [(AUTO_ROW, "bertfuse16", {"kernels": "auto"})]
    assert set(paths) == {"bertfuse16"}
    assert skipped == [(label, "not run: no CUDA GPU found") for label, _, _ in KERNELS_ROWS]
    assert plan_rows(None, paths) == (runtime_rows(False), {}, [])


def test_kernels_model_rewrites_the_fused_fp16_model(tiny_onnx, tmp_path):
    fused = tmp_path / "bertfuse16.onnx"
    shutil.copy(tiny_onnx["fp16"], fused)
    paths = {"bertfuse16": str(fused)}
    rows, notes, skipped = plan_rows(KernelsSetup(library="/some/libbertfuse_ops.so"), paths)
    assert paths["kernels16"] == str(tmp_path / "kernels16.onnx")
    model = onnx.load(paths["kernels16"])
    ops = Counter(n.op_type for n in model.graph.node if n.domain == BERTFUSE_DOMAIN)
    contrib = Counter(n.op_type for n in onnx.load(str(fused)).graph.node)
    assert ops["BertAttention"] == ops["DenseBias"] == contrib["Attention"] > 0
    assert ops["DenseBiasSkipLayerNorm"] == contrib["SkipLayerNormalization"]
    note = notes["kernels16"]
    assert note.startswith("ai.bertfuse: ") and f"BertAttention {ops['BertAttention']}" in note
    assert [i.name for i in model.graph.input] == \
        [i.name for i in onnx.load(str(fused)).graph.input]  # same request, same bindings
    # Another workload of the same model reuses both rewrites (and never reads the model).
    fused.unlink()
    assert plan_rows(KernelsSetup(library="/some/libbertfuse_ops.so"), paths) == \
        (rows, notes, skipped)
    if importlib.util.find_spec("bertfuse.pipeline.fp8") is None:  # no FP8 option: said so
        assert rows == [r for r in runtime_rows(True) if r[1] != "kernels_fp8"]
        assert "kernels_fp8" not in paths
        assert skipped == [(KERNELS_ROWS[2][0], "not run: this bertfuse has no FP8 option")]
        return
    assert rows == runtime_rows(True) and not skipped
    fp8 = onnx.load(paths["kernels_fp8"])
    fp8_ops = Counter(n.op_type for n in fp8.graph.node if n.domain == BERTFUSE_DOMAIN)
    # attention, the pooler and the embedding stay fp16
    assert fp8_ops["BertAttention"] == ops["BertAttention"] and fp8_ops["BertPooler"] == ops["BertPooler"] == 1
    assert fp8_ops["BertEmbedLayerNorm"] == ops["BertEmbedLayerNorm"] == 1
    for op in ("DenseBias", "DenseBiasGelu", "DenseBiasSkipLayerNorm"):
        assert fp8_ops[op + "Fp8"] == ops[op] and op not in fp8_ops
    scales = [a.f for n in fp8.graph.node for a in n.attribute if a.name == "x_scale"]
    assert len(scales) == sum(ops.values()) - ops["BertAttention"] - ops["BertPooler"] - \
        ops["BertEmbedLayerNorm"]
    assert all(0 < s < float("inf") for s in scales)
    assert "DenseBiasFp8" in notes["kernels_fp8"]
    # --gelu-approximation's model: the same ops, every DenseBiasGelu in the tanh form
    approx = onnx.load(paths["kernels16_gelu"])
    assert Counter(n.op_type for n in approx.graph.node if n.domain == BERTFUSE_DOMAIN) == ops
    gelus = [n for n in approx.graph.node if n.op_type == "DenseBiasGelu"]
    assert gelus and all(any(a.name == "approximate" and a.i == 1 for a in n.attribute)
                         for n in gelus)
    assert all(a.i == 0 for n in model.graph.node if n.op_type == "DenseBiasGelu"
               for a in n.attribute if a.name == "approximate")


def test_a_model_without_an_exact_gelu_has_no_approximation_row(tiny_onnx, tmp_path):
    from bertfuse.passes.fast_gelu import FastGeluApproximation
    from bertfuse.passes.manager import run_passes

    tanh, _ = run_passes(onnx.load(tiny_onnx["fp16"]), [FastGeluApproximation()])
    onnx.save(tanh, tmp_path / "bertfuse16.onnx")
    path, note = gelu_approximation_model(str(tmp_path / "bertfuse16.onnx"), str(tmp_path))
    assert path is None and "no exact GELU" in note
    assert not (tmp_path / "kernels16_gelu.onnx").exists()


def test_a_model_the_pass_cannot_convert_leaves_the_kernels_rows_not_run(tiny_onnx, tmp_path):
    fused = tmp_path / "bertfuse16.onnx"
    shutil.copy(tiny_onnx["fp32"], fused)  # fp32: the bertfuse ops are fp16 only
    paths = {"bertfuse16": str(fused)}
    rows, notes, skipped = plan_rows(KernelsSetup(library="/some/libbertfuse_ops.so"), paths)
    assert rows == runtime_rows(False) + [(AUTO_ROW, "bertfuse16", {"kernels": "auto"})]
    assert "kernels16" not in paths
    assert "kernels_fp8" not in paths and not (tmp_path / "kernels16.onnx").exists()
    note = notes["kernels16"]
    assert "converted nothing" in note and "fp16 only" in note
    assert [s[1] for s in skipped] == [f"not run: {note}"] * len(KERNELS_ROWS)


def test_comparison_table_puts_the_two_forms_side_by_side():
    kernels, raw_only, *_ = (label for label, _, _ in KERNELS_ROWS)
    results = [Result("shenma-3l b20 s64", "ORT raw fp32", 2000.0, 2100.0, 10000.0, 0.0, 0.0),
               Result("shenma-3l b20 s64", CONTRIB_DEFAULT, 300.0, 360.0, 66667.0, 1.3e-2,
                      6e-4, gpu_us=230.0, kernels=45),
               Result("shenma-3l b20 s64", kernels, 240.0, 280.0, 83333.0, 1.1e-2, 5e-4,
                      gpu_us=184.0, gpu_busy_us=170.5, kernels=16),
               Result("shenma-3l b20 s64", raw_only, 250.0, 290.0, 80000.0, 1.1e-2, 5e-4),
               Result("base b1 s128", CONTRIB_DEFAULT, 580.0, 700.0, 1724.0, 2e-2, 1e-3,
                      gpu_us=456.5, kernels=160),
               Result("base b1 s128", kernels, note="not run: no CUDA GPU found"),
               Result("shenma-3l b20 s64", ORT_PEER, 296.0, 320.0, 67567.0, 4e-3, 3e-4,
                      gpu_us=200.0, kernels=40),
               Result("shenma-3l b20 s64", TORCH_PEER, 320.0, 350.0, 62500.0, 4e-3, 3e-4)]
    lines = format_comparison(results).splitlines()
    assert len(lines) == 2 + 7  # ORT raw fp32 is not a row of this table
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]
    assert rows[1][:11] == ["shenma-3l b20 s64", kernels, "240.0", "280.0", "83,333", "184.0",
                            "170.5", "16", "0.80", "0.80", "0.81"]
    assert rows[2][5:11] == ["", "", "", "", "0.83", "0.84"]  # no profile: no GPU time, no ratio
    assert rows[4] == ["base b1 s128", kernels, "not run: no CUDA GPU found"]
    assert rows[5][1] == ORT_PEER and rows[5][10] == "1.00" and rows[6][10] == "1.08"
    assert rows[3][10] == ""  # base b1 s128: no peer ran


def test_bench_row_options(tmp_path, capsys):
    for bad in (["--forms", "cuda"], ["--ort-rows", "none"], ["--runtime-rows", "some"]):
        assert cli.main(["bench", "--skeletons", str(tmp_path), *bad]) == 2
        assert bad[0] in capsys.readouterr().err
    for opts in (["--forms", "contrib"], ["--forms", "both", "--ort-rows", "reference",
                                        "--runtime-rows", "paired"]):
        # accepted; then the missing skeleton is the one line
        assert cli.main(["bench", "--skeletons", str(tmp_path), *opts,
                         "--workloads", "base b1 s128", "--packed"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no skeleton for base" in err[0]


def test_reference_only_preparation_skips_ort_own_models(tiny_onnx, tmp_path):
    """--ort-rows reference: ORT raw fp32 (the parity reference) and bertfuse's models, no
    ORT fp16 or transformer-optimizer model."""
    paths = prepare_models(tiny_onnx["raw"], str(tmp_path), ort_models=False)
    assert {"raw32", "bertfuse32", "bertfuse16"} <= set(paths)
    assert not {"raw16", "opt16", "ort_fused"} & set(paths)
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["bertfuse16.onnx", "bertfuse32.onnx", "raw32.onnx"]
    raw = onnx.load(paths["raw32"])
    assert not any(n.domain for n in raw.graph.node)  # the raw export, unfused


def test_fp8_model_is_the_pipelines_fp8_form(tiny_onnx, tmp_path):
    """bench's FP8 row runs what `convert --ops bertfuse --fp8` writes: pipeline.fp8's
    form, calibrated on convert's default parity inputs."""
    from bertfuse.bench.forms import fp8_model
    from bertfuse.pipeline.fp8 import fp8_form
    from bertfuse.pipeline.lowering import model_feeds, to_bertfuse_kernels
    from bertfuse.pipeline.options import ConvertOptions

    contrib = onnx.load(tiny_onnx["fp16"])
    kmodel = to_bertfuse_kernels(contrib)
    onnx.save(kmodel, str(tmp_path / "kernels16.onnx"))
    path, note = fp8_model(tiny_onnx["fp16"], str(tmp_path / "kernels16.onnx"), str(tmp_path))
    assert path == str(tmp_path / "kernels_fp8.onnx"), note
    opts = ConvertOptions()
    want = fp8_form(contrib, kmodel, model_feeds(contrib, opts.batch, opts.seq, opts.seed))

    def scales(model: onnx.ModelProto) -> dict[str, float]:
        return {n.name: a.f for n in model.graph.node for a in n.attribute if a.name == "x_scale"}

    assert scales(onnx.load(path)) == scales(want) and scales(want)
