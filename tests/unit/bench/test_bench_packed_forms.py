"""`bertfuse bench`'s padded-vs-packed part with `--forms both`: which bertfuse-kernels forms
it builds (padded and device-packed), what the rows say without the op library, and the
tables and target line read off the rows. Timing needs a GPU (docs/benchmarks.md)."""

from __future__ import annotations

import shutil
from collections import Counter

import onnx
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_graphsurgeon")

from bertfuse.bench import packed_forms  # noqa: E402
from bertfuse.bench.forms import KernelsSetup  # noqa: E402
from bertfuse.bench.packed import format_tables  # noqa: E402
from bertfuse.ops import BERTFUSE_DOMAIN  # noqa: E402

WORKLOAD = "uniform [8,64] b20 s64"


def test_without_the_library_the_rows_say_why():
    paths = {"bertfuse16": "/nonexistent/bertfuse16.onnx"}  # never read
    forms, note = packed_forms.kernels_forms(KernelsSetup(reason="no CUDA GPU found"), paths)
    assert forms == {} and note == "not run: no CUDA GPU found"
    assert packed_forms.kernels_forms(None, paths) == ({}, "")  # --forms contrib: no rows
    assert packed_forms.makers({}, {}) == {} and set(paths) == {"bertfuse16"}
    row = {"workload": WORKLOAD, "mix": "mixed", "fill": 0.6, "kernels": note}
    load = {"workload": WORKLOAD, "streams": 4, "kernels": note}
    text = packed_forms.format_tables({"rows": [row], "load": [load]})
    assert text.count("not run: no CUDA GPU found") == 2
    assert packed_forms.target_line({"load": [load]}) == \
        f"packed {WORKLOAD} under 4 streams: no number (not run: no CUDA GPU found)"
    assert packed_forms.format_tables({"rows": [{"workload": WORKLOAD}], "load": []}) == ""


def test_forms_are_the_padded_and_device_packed_kernels_models(tiny_onnx, tmp_path):
    fused = tmp_path / "bertfuse16.onnx"
    shutil.copy(tiny_onnx["fp16"], fused)
    paths = {"bertfuse16": str(fused)}
    forms, note = packed_forms.kernels_forms(KernelsSetup(library="/some/lib.so"), paths)
    assert note == "" and forms["kpadded"] == paths["kernels16"]
    padded = Counter(n.op_type for n in onnx.load(forms["kpadded"]).graph.node
                     if n.domain == BERTFUSE_DOMAIN)
    packed = Counter(n.op_type for n in forms["kpacked"].graph.node
                     if n.domain == BERTFUSE_DOMAIN)
    assert packed["PackedBertAttention"] == padded["BertAttention"] > 0
    assert packed["PackTokens"] == packed["UnpackTokens"] == 1 and not packed["BertAttention"]
    assert "token_bucket" in [i.name for i in forms["kpacked"].graph.input]
    assert set(packed_forms.makers(forms, {})) == set(packed_forms.KINDS)


def test_a_model_the_pass_cannot_convert_says_why(tiny_onnx, tmp_path):
    fused = tmp_path / "bertfuse16.onnx"
    shutil.copy(tiny_onnx["fp32"], fused)  # fp32: the bertfuse ops are fp16 only
    forms, note = packed_forms.kernels_forms(KernelsSetup(library="/some/lib.so"),
                                               {"bertfuse16": str(fused)})
    assert forms == {} and note.startswith("not run: ") and "converted nothing" in note


def test_tables_and_target_from_rows():
    row = {"workload": WORKLOAD, "mix": "mixed", "fill": 0.6, "precision": "fp16",
           "padded_p50_us": 300.0, "kpadded_p50_us": 250.0, "kpacked_p50_us": 200.0,
           "kpacked_max_diff": 1e-2, "packed_p50_us": 280.0, "speedup": 1.07,
           "packed_nograph_p50_us": 450.0, "routed_p50_us": 290.0, "max_diff": 1e-2,
           "mean_diff": 4e-4}
    packed_forms.add_ratios(row, "_p50_us", higher_better=False)
    assert (row["kpacked_vs_kpadded"], row["kpacked_vs_padded"]) == (1.25, 1.5)
    load = {"workload": WORKLOAD, "precision": "fp16", "streams": 4, "padded_seq_per_s": 60000,
            "kpadded_seq_per_s": 80000, "kpacked_seq_per_s": 72000, "kpacked_p50_us": 900.2,
            "kpacked_p99_us": 1500.0}
    for kind in ("padded", "packed", "packed16", "routed"):  # the contrib form's load table
        load.setdefault(f"{kind}_seq_per_s", 60000)
        load.update({f"{kind}_p50_us": 380.0, f"{kind}_p99_us": 500.0, f"{kind}_speedup": 1.0})
    load["replica_max_diff"] = 0.0
    packed_forms.add_ratios(load, "_seq_per_s", higher_better=True)
    assert (load["kpacked_vs_kpadded"], load["kpacked_vs_padded"]) == (0.9, 1.2)
    text = format_tables({"rows": [row], "sweep": [], "load": [load]})  # the kernels tables last
    assert "| 300.0 | 250.0 | 200.0 | 1.25 | 1.5 | 1.00e-02 |" in text
    assert "| 4 | 60,000 | 80,000 | 72,000 (900/1500) | 0.9 | 1.2 |" in text
    line = packed_forms.target_line({"load": [load]})
    assert "0.9x kernels padded, 1.2x contrib padded" in line and line.endswith("MISSED)")
    load["kpacked_seq_per_s"] = 88000
    packed_forms.add_ratios(load, "_seq_per_s", higher_better=True)
    assert packed_forms.target_line({"load": [load]}).endswith("met)")


def test_a_session_that_cannot_open_is_a_failed_note_not_the_runs_end(tiny_onnx, tmp_path):
    """On a host without CUDA (this one) the kernels sessions cannot be made: the rows say
    so and no session is kept."""
    fused = tmp_path / "bertfuse16.onnx"
    shutil.copy(tiny_onnx["fp16"], fused)
    forms, _ = packed_forms.kernels_forms(KernelsSetup(library="/some/lib.so"),
                                            {"bertfuse16": str(fused)})
    made, sessions, note = packed_forms.open_sessions(forms, {"device": "cpu"}, "")
    assert made == {} and sessions == {} and note.startswith("failed: ")
    assert packed_forms.open_sessions({}, {}, "not run: x") == ({}, {}, "not run: x")


def test_the_kernels_forms_open_with_their_own_kernels_option(tiny_onnx, tmp_path):
    """The bench's session options hold the contrib rows on kernels='ort', which the runtime
    refuses for a model written with ai.bertfuse ops (before it needs a GPU): the kernels
    forms must not get them as they are, or every device-packed row fails on that refusal."""
    from bertfuse.runtime.kernel_choice import choose

    fused = tmp_path / "bertfuse16.onnx"
    shutil.copy(tiny_onnx["fp16"], fused)
    forms, _ = packed_forms.kernels_forms(KernelsSetup(library="/some/lib.so"),
                                            {"bertfuse16": str(fused)})
    kw = dict(max_batch=2, max_seq=16, batch_buckets=(2,), seq_buckets=(16,), device="cuda",
              provider_options={}, kernels="ort")  # as bench/packed.py run() makes them
    _, _, note = packed_forms.open_sessions(forms, kw, "")
    assert note.startswith("failed: ") and "kernels=" not in note, note  # no CUDA here
    opts = packed_forms.form_options(kw)
    assert kw["kernels"] == "ort" and {**opts, "kernels": "ort"} == kw
    _, choice = choose(onnx.load(forms["kpadded"]), opts["kernels"], opts["device"], 16)
    assert (choice.used, choice.reason) == ("bertfuse", "written with bertfuse's ops")
