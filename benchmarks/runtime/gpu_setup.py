"""What the GPU-host runtime benchmarks (host_path.py, pdl_ab.py, ...) share: their workloads,
their arguments, ONNX Runtime with pip's CUDA libraries loaded, the fused fp16 model of a config
refilled from its weight-stripped skeleton (once per config), a Session on one bucket of the
request's shape, and a form's error against a reference (fp8_ab.py, gelu_ab.py)."""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any, Callable, Iterator

WORKLOADS = [("shenma-3l", 20, 64), ("base", 1, 128), ("base", 32, 128)]


def parse_args(doc: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
               ) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--skeletons", default="out/skeletons")
    ap.add_argument("--iters", type=int, default=3000)
    if extra is not None:  # a script's own options
        extra(ap)
    return ap.parse_args()


def start_ort() -> Any:
    import onnxruntime as ort

    ort.preload_dlls()
    return ort


def fused_model(models: dict[str, str], skeletons: str, config: str) -> str:
    """The bertfuse fp16 model of `config` (cached in `models`)."""
    from bertfuse.bench.models import prepare_models

    if config not in models:
        models[config] = prepare_models(os.path.join(skeletons, f"{config}_raw.skel.onnx"),
                                        tempfile.mkdtemp(prefix=f"bench-{config}-"),
                                        anchors=False)["bertfuse16"]
    return models[config]


def bucket_session(path: str, batch: int, seq: int) -> Any:
    """A runtime Session of `path` on the GPU with one bucket, the request's shape."""
    from bertfuse.runtime import Session

    return Session(path, max_batch=batch, max_seq=seq, batch_buckets=(batch,),
                   seq_buckets=(seq,), device="cuda")


def accuracy(got: dict, ref: dict) -> dict:
    """max and mean |diff| per output (and the worst of each), and the cosine of the pooled
    (2-D) outputs against ref's."""
    import numpy as np

    from bertfuse.pipeline.fp8 import cosine

    per = {k: (float(np.abs(got[k].astype(np.float64) - ref[k]).max()),
               float(np.abs(got[k].astype(np.float64) - ref[k]).mean())) for k in ref}
    pooled = [k for k in ref if ref[k].ndim == 2]
    return {"max_diff": max(v[0] for v in per.values()),
            "mean_diff": max(v[1] for v in per.values()),
            "pooled_cosine": min((cosine(got[k], ref[k]) for k in pooled), default=float("nan")),
            "per_output": per}


def workloads(skeletons: str, make: Callable[[str], dict]) -> Iterator[tuple]:
    """(config, batch, seq, models, request) per workload: make(skeleton path) once per config,
    and the workload's seeded random request."""
    from bertfuse.io.inputs import random_inputs

    built: dict[str, dict] = {}
    for config, batch, seq in WORKLOADS:
        if config not in built:
            built[config] = make(os.path.join(skeletons, f"{config}_raw.skel.onnx"))
        yield config, batch, seq, built[config], random_inputs(batch, seq, 1000, 2,
                                                               seed=batch + seq)


def record(rows: list, row: dict, opened: dict) -> None:
    """A workload's row kept and printed (one JSON line), its sessions closed."""
    import json

    rows.append(row)
    print(json.dumps(row), flush=True)
    for s in opened.values():
        s.close()


def save(name: str, payload: dict) -> None:
    """payload as JSON at $OUT/name (the current directory without $OUT)."""
    import json

    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as fh:
        json.dump(payload, fh, indent=1)


def print_table(rows: list, forms: tuple, columns: list[tuple[str, str, str]]) -> None:
    """A markdown table, a line per workload and form: columns are (header, the form's key,
    format spec)."""
    print("\n| workload | form | " + " | ".join(c[0] for c in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for r in rows:
        for form in forms:
            cells = [format(r[form][key], spec) for _, key, spec in columns]
            print(f"| {r['workload']} | {form} | " + " | ".join(cells) + " |")


def lowered(skeleton: str, prefix: str) -> tuple[dict[str, str], str, str]:
    """The config refilled from its skeleton and fused (bertfuse's fp32 and fp16 models) in a
    fresh temp dir, and its fp16 model lowered to bertfuse's ops: (paths, that model, the dir)."""
    from bertfuse.bench.forms import kernels_model
    from bertfuse.bench.models import prepare_models

    work = tempfile.mkdtemp(prefix=prefix)
    paths = prepare_models(skeleton, work, anchors=False)
    k16, note = kernels_model(paths["bertfuse16"], work)
    if k16 is None:
        raise SystemExit(f"{prefix.strip('-')}: {note}")
    return paths, k16, work
