"""Every third-party fixture (tests/fixtures/thirdparty/: models built by transformers,
keras-hub, Model Garden, TF Hub, keras-bert, bert4keras, bert-for-tf2) converted in fp16, then
run on the GPU under `kernels="auto"` against the library's own fp32 outputs.

    python3 benchmarks/kernels/thirdparty_auto.py prepare out/tp16   # with TensorFlow (CPU host)
    python3 benchmarks/kernels/thirdparty_auto.py run out/tp16       # on the GPU host (no TF)

`prepare` runs `bertfuse convert FIXTURE -o out/tp16/NAME.onnx --precision fp16` with default
flags. `run` runs `bertfuse verify NAME.onnx --load-inputs reference.npz --load-outputs
reference.npz --device cuda --kernels auto --json` for each: the fixture's padded inputs and the
library's eager outputs, the kernels the runtime chose (bertfuse's ops in how many layers, or
why not) and the fp16 parity (max <= 4e-2, mean <= 2e-3, kept positions). It writes
out/tp16/thirdparty_auto.json and prints one table row per model; exit 1 when a row fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "thirdparty"
CLI = [sys.executable, "-m", "bertfuse"]
KERNELS = os.environ.get("KERNELS", "auto")  # KERNELS=bertfuse: bertfuse's ops wherever they run


def cases() -> list[tuple[str, Path]]:
    out = []
    for meta_path in sorted(FIXTURES.glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        out.append((meta_path.parent.name, meta_path.parent / meta["path"]))
    return out


def prepare(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, source in cases():
        target = out / f"{name}.onnx"
        if target.exists():
            continue
        proc = subprocess.run([*CLI, "convert", str(source), "-o", str(target), "--precision",
                               "fp16", "-q"], capture_output=True, text=True)
        print(f"{name}: {'ok' if proc.returncode == 0 else proc.stderr.strip()[-300:]}",
              flush=True)
        failed += proc.returncode != 0
    return int(failed > 0)


def run(out: Path) -> int:
    rows = []
    for name, _ in cases():
        model = out / f"{name}.onnx"
        if not model.exists():
            rows.append({"model": name, "ok": False, "error": "not converted"})
            continue
        ref = FIXTURES / name / "reference.npz"
        proc = subprocess.run([*CLI, "verify", str(model), "--load-inputs", str(ref),
                               "--load-outputs", str(ref), "--device", "cuda", "--kernels",
                               KERNELS, "--json"], capture_output=True, text=True)
        try:
            parity = json.loads(proc.stdout)["parity"]
        except (ValueError, KeyError, TypeError):
            rows.append({"model": name, "ok": False, "error": proc.stderr.strip()[-300:]})
            continue
        worst = max(parity["outputs"], key=lambda o: o["max_abs"])
        rows.append({"model": name, "ok": bool(parity["ok"]) and proc.returncode == 0,
                     "kernels": parity["kernels"], "max_abs": worst["max_abs"],
                     "mean_abs": max(o["mean_abs"] for o in parity["outputs"])})
    (out / f"thirdparty_{KERNELS}.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("| model | kernels used | layers on bertfuse's ops | max |diff| | mean |diff| | ok |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        k = r.get("kernels") or {}
        layers = k.get("layers") or [0, 0]
        why = "" if k.get("used") == "bertfuse" else f" ({k.get('reason', r.get('error', ''))})"
        print(f"| {r['model']} | {k.get('used', '-')}{why} | {layers[0]} of {layers[1]} | "
              f"{r.get('max_abs', float('nan')):.2e} | {r.get('mean_abs', float('nan')):.2e} | "
              f"{'ok' if r['ok'] else 'FAIL'} |")
    return int(not all(r["ok"] for r in rows))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("prepare", "run"):
        sys.exit(__doc__)
    sys.exit((prepare if sys.argv[1] == "prepare" else run)(Path(sys.argv[2])))
