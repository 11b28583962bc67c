"""benchmarks/charts.py: the docs' SVG charts from a gpu_bench.json and a breadth.py JSON, drawn
by matplotlib: the SVG read back with xml.etree holds the panels, texts and bars of the input,
and a second run writes the same bytes."""

from __future__ import annotations

import importlib.util
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")  # the `test` extra

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("charts", ROOT / "benchmarks" / "charts.py")
charts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(charts)

NS = {"svg": "http://www.w3.org/2000/svg", "dc": "http://purl.org/dc/elements/1.1/"}
RESULTS = [{"workload": "w1", "variant": "ORT bert_tf fp16", "p50_us": 1000.0},
           {"workload": "w1", "variant": "bertfuse fp16 runtime", "p50_us": 250.0},
           {"workload": "w1", "variant": "bertfuse kernels", "p50_us": None, "note": "not run"},
           {"workload": "w2", "variant": "bertfuse fp16 runtime", "p50_us": float("nan")},
           {"workload": "w3", "variant": "peer: $5 torch", "p50_us": 12345.6}]


def _read(path: Path) -> tuple[ET.Element, list[str], dict[str, ET.Element]]:
    """The SVG's root, its texts in order, and {id: element} of its bars (bar-...)."""
    root = ET.parse(path).getroot()  # well-formed XML
    texts = [t.text or "" for t in root.iter(f"{{{NS['svg']}}}text")]
    bars = {g.get("id"): g.find("svg:path", NS) for g in root.iter(f"{{{NS['svg']}}}g")
            if (g.get("id") or "").startswith("bar-")}
    return root, texts, bars


def _width(path: ET.Element) -> float:
    """A bar's length: the span of its path's x coordinates."""
    xs = [float(x) for x in re.findall(r"[ML] ([-\d.]+) ", path.get("d"))]
    return max(xs) - min(xs)


def _fill(path: ET.Element) -> str:
    return re.search(r"fill: (#[0-9a-f]{6})", path.get("style"))[1]


def _is_matplotlibs(root: ET.Element) -> None:
    """matplotlib's SVG: its name in the metadata, no date (the same bytes every run)."""
    creator = root.find("svg:metadata//dc:creator//dc:title", NS)
    assert creator is not None and creator.text.startswith("Matplotlib"), ET.tostring(root)[:300]
    assert root.find("svg:metadata//dc:date", NS) is None


def test_bars_scale_to_the_panel_and_untimed_rows_are_listed(tmp_path):
    run = tmp_path / "gpu_bench.json"
    run.write_text(json.dumps({"results": RESULTS, "date": "2026-12-01"}))
    assert charts.main([str(run), "-o", str(tmp_path / "c.svg")]) == 0
    root, texts, bars = _read(tmp_path / "c.svg")
    _is_matplotlibs(root)
    axes = [g for g in root.iter(f"{{{NS['svg']}}}g")
            if re.fullmatch(r"axes_\d+", g.get("id", ""))]
    assert len(axes) == 2  # w1 and w3; w2 has no timed row
    for want in ("gpu_bench.json (2026-12-01) — p50 (us, lower is better)", "w1", "w3", "ORT bert_tf fp16", "bertfuse fp16 runtime", "1,000.0", "250.0",
                 "peer: $5 torch", "12,345.6", "p50 (us, lower is better)"):
        assert want in texts, (want, texts)
    assert "not timed in this run: w1 / bertfuse kernels; w2 / bertfuse fp16 runtime" in texts
    assert sorted(bars) == ["bar-0-0", "bar-0-1", "bar-1-0"]
    assert _width(bars["bar-0-1"]) == pytest.approx(_width(bars["bar-0-0"]) / 4)  # 250 of 1000
    assert _width(bars["bar-1-0"]) == pytest.approx(_width(bars["bar-0-0"]))  # its own scale
    assert _fill(bars["bar-0-1"]) == charts.BERTFUSE_COLOUR != _fill(bars["bar-0-0"])
    assert charts.main([str(run), "-o", str(tmp_path / "again.svg")]) == 0
    assert (tmp_path / "again.svg").read_bytes() == (tmp_path / "c.svg").read_bytes()


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
           _breadth_row("TFMobileBertModel", None, {"Attention": 1})]


def test_fusion_counts_sum_the_gelu_forms_and_list_what_failed():
    panels, missing = charts.fusion_counts(BREADTH)
    bert = panels["transformers TFBertModel (SavedModel)"]
    assert bert["bertfuse"] == {"Attention": 2, "SkipLayerNorm": 4, "GELU": 2, "EmbedLayerNorm": 1}
    assert bert["ORT bert_tf"] == {"Attention": 0, "SkipLayerNorm": 0, "GELU": 1,
                                   "EmbedLayerNorm": 0}  # LayerNormalization is not a fusion here
    assert panels["transformers TFMobileBertModel (SavedModel)"] == {
        "ORT bert_tf": {"Attention": 1, "SkipLayerNorm": 0, "GELU": 0, "EmbedLayerNorm": 0}}
    assert missing == ["transformers TFBertModel (SavedModel) / ORT bert",
                       "transformers TFMobileBertModel (SavedModel) / bertfuse",
                       "transformers TFMobileBertModel (SavedModel) / ORT bert"]


def test_the_fusion_chart_draws_every_count_on_one_scale(tmp_path, capsys):
    run = tmp_path / "breadth.json"
    run.write_text(json.dumps({"environment": {"date": "2026-12-02"}, "rows": BREADTH}))
    assert charts.main([str(run), "--fusion", "-o", str(tmp_path / "f.svg")]) == 0
    root, texts, bars = _read(tmp_path / "f.svg")
    _is_matplotlibs(root)
    # bar-PANEL-TOOL-OP: TFBertModel has bertfuse (0) and ORT bert_tf (1); MobileBERT bert_tf
    assert sorted(bars) == [f"bar-0-{t}-{op}" for t in (0, 1) for op in range(4)] + \
        [f"bar-1-1-{op}" for op in range(4)]
    unit = _width(bars["bar-0-0-3"])  # bertfuse's 1 EmbedLayerNorm
    assert unit > 0
    for bar, count in (("bar-0-0-0", 2), ("bar-0-0-1", 4), ("bar-0-0-2", 2), ("bar-0-1-0", 0),
                       ("bar-0-1-2", 1), ("bar-1-1-0", 1), ("bar-1-1-1", 0)):
        assert _width(bars[bar]) == pytest.approx(count * unit), bar  # one scale for all
    assert _fill(bars["bar-0-0-0"]) == charts.TOOL_COLOURS["bertfuse"]
    assert _fill(bars["bar-1-1-0"]) == charts.TOOL_COLOURS["ORT bert_tf"]
    legend = next(g for g in root.iter(f"{{{NS['svg']}}}g") if g.get("id") == "legend_1")
    assert [t.text for t in legend.iter(f"{{{NS['svg']}}}text")] == ["bertfuse", "ORT bert_tf"]
    for want in ("transformers TFBertModel (SavedModel)", "Attention", "SkipLayerNorm", "GELU",
                 "EmbedLayerNorm", "breadth.json (2026-12-02) — fused ops per model (higher is "
                 "better)"):
        assert want in texts, (want, texts)
    assert any(t.startswith("failed in this run: transformers TFBertModel (SavedModel) / ORT "
                            "bert") for t in texts), texts
    assert charts.main([str(run), "--fusion", "-o", str(tmp_path / "again.svg")]) == 0
    assert (tmp_path / "again.svg").read_bytes() == (tmp_path / "f.svg").read_bytes()
    (tmp_path / "gpu.json").write_text(json.dumps({"results": []}))  # not a breadth run
    assert charts.main([str(tmp_path / "gpu.json"), "--fusion", "-o", str(tmp_path / "g.svg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a breadth.py JSON" in err[0]
    assert not (tmp_path / "g.svg").exists()
