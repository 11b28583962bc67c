"""benchmarks/charts.py: the docs' SVG charts from a gpu_bench.json."""

from __future__ import annotations

import importlib.util
import json
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("charts", ROOT / "benchmarks" / "charts.py")
charts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(charts)

RESULTS = [{"workload": "w1", "variant": "ORT bert_tf fp16", "p50_us": 1000.0},
           {"workload": "w1", "variant": "bertfuse fp16 runtime", "p50_us": 250.0},
           {"workload": "w1", "variant": "bertfuse kernels", "p50_us": None, "note": "not run"},
           {"workload": "w2", "variant": "bertfuse fp16 runtime", "p50_us": float("nan")}]


def test_bars_scale_to_the_panel_and_untimed_rows_are_listed(tmp_path):
    run = tmp_path / "gpu_bench.json"
    run.write_text(json.dumps({"results": RESULTS, "date": "2026-12-01"}))
    assert charts.main([str(run), "-o", str(tmp_path / "c.svg")]) == 0
    svg = ET.parse(tmp_path / "c.svg").getroot()  # well-formed XML
    bars = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.get("height") == "18"]
    widths = sorted(float(b.get("width")) for b in bars)
    assert widths == [charts.BAR_W / 4, charts.BAR_W]  # 250 of 1000: a quarter of the longest
    text = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert "not timed in this run: w1 / bertfuse kernels; w2 / bertfuse fp16 runtime" in text


def test_variants_pick_and_order_rows_and_a_bad_file_is_one_line(tmp_path, capsys):
    panels, _ = charts.rows_by_workload(RESULTS, "p50_us", ["bertfuse fp16 runtime",
                                                             "ORT bert_tf fp16"])
    assert panels == {"w1": [("bertfuse fp16 runtime", 250.0), ("ORT bert_tf fp16", 1000.0)]}
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert charts.main([str(bad), "-o", str(tmp_path / "x.svg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a gpu_bench.json" in err[0]
    assert not (tmp_path / "x.svg").exists()


def _breadth_row(cls: str, bertfuse: dict | None, bert_tf: dict) -> dict:
    return {"library": "transformers", "class": cls, "format": "SavedModel",
            "fp32": {"rc": 0, "fused": bertfuse} if bertfuse else {"rc": 1, "error": "x"},
            "ort": {"bert_tf": {"opt_level": 0, "fused": bert_tf, "nodes": 200},
                    "bert": {"opt_level": 1, "error": "ValueError: no"}}}


BREADTH = [_breadth_row("TFBertModel",
                        {"Attention": 2, "SkipLayerNormalization": 4, "EmbedLayerNormalization": 1,
                         "BiasGelu": 2, "FastGelu": 0, "Gelu": 0},
                        {"Attention": 0, "SkipLayerNormalization": 0, "EmbedLayerNormalization": 0,
                         "BiasGelu": 0, "FastGelu": 1, "Gelu": 0, "LayerNormalization": 4}),
           _breadth_row("TFMobileBertModel", None, {"Attention": 0})]


def test_fusion_counts_sum_the_gelu_forms_and_list_what_failed():
    panels, missing = charts.fusion_counts(BREADTH)
    bert = panels["transformers TFBertModel (SavedModel)"]
    assert bert["bertfuse"] == {"Attention": 2, "SkipLayerNorm": 4, "GELU": 2, "EmbedLayerNorm": 1}
    assert bert["ORT bert_tf"] == {"Attention": 0, "SkipLayerNorm": 0, "GELU": 1,
                                   "EmbedLayerNorm": 0}  # LayerNormalization is not a fusion here
    assert panels["transformers TFMobileBertModel (SavedModel)"] == {
        "ORT bert_tf": {"Attention": 0, "SkipLayerNorm": 0, "GELU": 0, "EmbedLayerNorm": 0}}
    assert missing == ["transformers TFBertModel (SavedModel) / ORT bert",
                       "transformers TFMobileBertModel (SavedModel) / bertfuse",
                       "transformers TFMobileBertModel (SavedModel) / ORT bert"]


def test_the_fusion_chart_draws_every_count_on_one_scale(tmp_path, capsys):
    run = tmp_path / "breadth.json"
    run.write_text(json.dumps({"environment": {"date": "2026-12-02"}, "rows": BREADTH}))
    assert charts.main([str(run), "--fusion", "-o", str(tmp_path / "f.svg")]) == 0
    svg = ET.parse(tmp_path / "f.svg").getroot()
    ns = "{http://www.w3.org/2000/svg}"
    bars = {r.find(f"{ns}title").text: float(r.get("width")) for r in svg.iter(f"{ns}rect")
            if r.find(f"{ns}title") is not None}
    assert len(bars) == 2 * 4 + 4  # TFBertModel: bertfuse and bert_tf; MobileBERT: bert_tf
    top = charts.BAR_W  # 4 SkipLayerNorm, the largest count, is the full width
    assert bars["transformers TFBertModel (SavedModel): bertfuse, SkipLayerNorm"] == top
    assert bars["transformers TFBertModel (SavedModel): bertfuse, Attention"] == top / 2
    assert bars["transformers TFBertModel (SavedModel): ORT bert_tf, Attention"] == 0
    text = " ".join(t.text or "" for t in svg.iter(f"{ns}text"))
    assert "2026-12-02" in text and "failed in this run: " in text
    (tmp_path / "gpu.json").write_text(json.dumps({"results": []}))  # not a breadth run
    assert charts.main([str(tmp_path / "gpu.json"), "--fusion", "-o", str(tmp_path / "g.svg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a breadth.py JSON" in err[0]
    assert not (tmp_path / "g.svg").exists()
