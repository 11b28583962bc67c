"""Wall time and peak RSS of `bertfuse convert` per example config.

Each conversion runs in a fresh process (`bertfuse example` first, untimed), measured with
GNU time's maximum resident set size, which covers TensorFlow, tf2onnx, the passes and
verification together. Usage:

    python benchmarks/convert/convert_memory.py --configs shenma-3l base large --out /tmp/bench
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _bertfuse() -> list[str]:
    exe = Path(sys.executable).with_name("bertfuse")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "bertfuse.cli"]


def measure(config: str, out: Path, extra: list[str]) -> dict:
    src = out / config
    if not (src / "bert_config.json").exists():
        subprocess.run(_bertfuse() + ["example", "--config", config, "-o", str(src)],
                       check=True, capture_output=True)
    onnx_path = out / f"{config}.onnx"
    cmd = ["/usr/bin/time", "-v"] + _bertfuse() + ["convert", str(src), "-o", str(onnx_path),
                                                   "--json"] + extra
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    report = json.loads(proc.stdout) if proc.returncode == 0 else {}
    stages = {s["name"]: s for s in report.get("stages", [])}
    parity = report.get("parity") or {}
    return {
        "config": config, "exit": proc.returncode, "wall_s": round(wall, 1),
        "peak_rss_gb": round(rss_kb / 1024 / 1024, 2),
        "onnx_mb": round(onnx_path.stat().st_size / 1e6, 1) if onnx_path.exists() else None,
        "nodes_raw": stages.get("tf2onnx export", {}).get("nodes"),
        "nodes_fused": stages.get("passes", {}).get("nodes"),
        "max_abs_diff": max((o["max_abs"] for o in parity.get("outputs", [])), default=None),
        "error": proc.stderr.strip().splitlines()[-1] if proc.returncode else "",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--configs", nargs="+", default=["shenma-3l", "base", "large"])
    ap.add_argument("--out", default="/tmp/bertfuse-bench")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints and models")
    args, extra = ap.parse_known_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"{subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores, "
          f"{time.strftime('%Y-%m-%d')}")
    print("| config | exit | wall (s) | peak RSS (GB) | ONNX (MB) | raw nodes | fused nodes "
          "| max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for config in args.configs:
        r = measure(config, out, extra)
        print(f"| {r['config']} | {r['exit']} | {r['wall_s']} | {r['peak_rss_gb']} | "
              f"{r['onnx_mb']} | {r['nodes_raw']} | {r['nodes_fused']} | "
              f"{r['max_abs_diff']:.2g} |" if r["max_abs_diff"] is not None else
              f"| {r['config']} | {r['exit']} | {r['wall_s']} | {r['peak_rss_gb']} | - | - | - | "
              f"{r['error']} |", flush=True)
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
