"""FastGeluApproximation: exact GELUs (BiasGelu, Gelu) become FastGelu, only when asked
(passes/fast_gelu.py). ORT CPU before/after on the same random inputs: the outputs move by
the tanh form's own error (at most 4.7e-4 per value), no more, and not by nothing."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx_graphsurgeon as gs

from bertfuse.passes.fast_gelu import FastGeluApproximation
from bertfuse.passes.gelu import GeluFusion, gelu_tanh
from bertfuse.passes.manager import run_passes
from bertfuse.passes.plans import fusion_plan
from support.builders.onnx_graphs import MS, bert, census
from support.passes_common import fuse, fused_in, missed, node, run

from unit.passes.test_gelu import gelu_feeds, gelu_model

TANH_ERROR = 4.75e-4  # max |erf GELU - tanh GELU| over the reals (at x = -2.70)


def test_the_error_bound_is_the_forms_own():
    from bertfuse.passes.gelu import gelu_exact

    x = np.linspace(-8, 8, 160_001)
    d = np.abs(gelu_exact(x) - gelu_tanh(x))
    assert 4.6e-4 < d.max() <= TANH_ERROR


def test_bias_gelu_becomes_fast_gelu_with_its_bias(rng, seed):
    model = gelu_model(rng, "erf_x_half")
    exact, _ = fuse(model, GeluFusion())
    fast, report = fuse(exact, FastGeluApproximation())
    assert census(fast) == Counter({("", "MatMul"): 1, (MS, "FastGelu"): 1}), census(fast)
    assert list(node(fast, "FastGelu").input[1:]) == list(node(exact, "BiasGelu").input[1:])
    assert len(fused_in(report, "fast_gelu")) == 1
    feeds = gelu_feeds(rng)
    want, got = run(model, feeds)["y"], run(fast, feeds)["y"]
    d = np.abs(got.astype(np.float64) - want)
    assert 1e-6 < d.max() <= TANH_ERROR + 1e-5, (d.max(), seed)  # fp32 rounding on top
    x = feeds["h"].astype(np.float64) @ _weight(model)
    x += _bias(model)
    assert np.abs(got - gelu_tanh(x)).max() <= 1e-4  # it is the tanh form, not another


def test_gelu_without_bias_becomes_fast_gelu_without_one(rng, seed):
    model = gelu_model(rng, "erf_keras", bias=False)
    fast, _ = fuse(model, GeluFusion(), FastGeluApproximation())
    assert census(fast) == Counter({("", "MatMul"): 1, (MS, "FastGelu"): 1}), census(fast)
    assert len(node(fast, "FastGelu").input) == 1
    feeds = gelu_feeds(rng)
    x = feeds["h"].astype(np.float64) @ _weight(model)
    assert np.abs(run(fast, feeds)["y"] - gelu_tanh(x)).max() <= 1e-4


def test_a_tanh_gelu_is_left_as_it_is(rng):
    model = gelu_model(rng, "tanh_pow")
    tanh, _ = fuse(model, GeluFusion())
    again, report = fuse(tanh, FastGeluApproximation())
    assert census(again) == census(tanh) and not report.diagnostics


def test_a_bias_that_is_not_1d_is_missed_by_name(rng):
    exact, _ = fuse(gelu_model(rng, "erf_x_half"), GeluFusion())
    graph = gs.import_onnx(exact)
    (bg,) = [n for n in graph.nodes if n.op == "BiasGelu"]
    b = bg.inputs[1]
    bg.inputs[1] = gs.Constant(b.name, b.values.reshape(1, -1))
    _, report = run_passes(gs.export_onnx(graph), [FastGeluApproximation()])
    (reason,) = missed(report, "fast_gelu")
    assert bg.name in reason and "not 1-D" in reason


def test_the_plan_runs_it_only_when_asked(rng):
    names = [p.name for p in fusion_plan("fp16")]
    asked = [p.name for p in fusion_plan("fp16", gelu_approximation=True)]
    assert "fast_gelu" not in names
    at = names.index("gelu") + 1
    assert asked == names[:at] + ["fast_gelu"] + names[at:]
    model, report = run_passes(bert(rng, layers=2), fusion_plan("fp32", gelu_approximation=True))
    ops = census(model)
    assert ops[(MS, "FastGelu")] == 2 and not ops[(MS, "BiasGelu")] and not ops[(MS, "Gelu")]
    assert fused_in(report, "fast_gelu") == [0, 1] and report.table.fully_fused


def _weight(model) -> np.ndarray:
    from onnx import numpy_helper

    return next(numpy_helper.to_array(i) for i in model.graph.initializer if len(i.dims) == 2)


def _bias(model) -> np.ndarray:
    from onnx import numpy_helper

    return next(numpy_helper.to_array(i) for i in model.graph.initializer if len(i.dims) == 1)
