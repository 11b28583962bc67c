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
