"""TF BERT-family breadth: what bertfuse and ONNX Runtime's transformer optimizer fuse on
models made by other libraries, and how close bertfuse's written model is to the library.

Run with the main venv (TF_ENABLE_ONEDNN_OPTS as your environment has it; bertfuse turns
TensorFlow's oneDNN rewrites off for its own reference run):

    .venv/bin/python benchmarks/convert/breadth.py --out /tmp/breadth.json [hf_bert kh_bert ...]
    .venv/bin/python benchmarks/convert/breadth.py --bert-base /tmp/mg_bert_base --out /tmp/base.json

Fixtures: tests/fixtures/thirdparty/<name>/ (meta.json + reference.npz, the library's own
eager outputs on padded inputs). For each source (the SavedModel, and the .keras archive
where meta.json names one), in a temporary directory:

1. ``bertfuse convert SRC -o m.onnx --json`` (fp32) and ``--precision fp16``: exit code,
   fused op counts, leftover Softmax / LayerNormalization, nodes, bertfuse's own parity
   verdict, and the written model run with onnxruntime (CPU) on reference.npz's inputs
   against the library's eager outputs (fp32 max |diff|; fp16 max and mean |diff|). A
   text-in fixture (tftext_*: its reference.npz holds texts and the SavedModel's own
   outputs on them) is fed its texts through bertfuse.text on the vocab that convert wrote
   beside the model.
2. ``bertfuse convert SRC -o raw.onnx --no-fuse --no-verify`` (the raw tf2onnx graph), then
   ``onnxruntime.transformers.optimizer.optimize_model(raw, model_type=T, num_heads=heads,
   hidden_size=hidden)`` for T in bert_tf and bert, each at its default opt_level, counted
   with ``get_fused_operator_statistics()``. bert_tf's default is 0. bert's is 1, and for it
   onnxruntime 1.32's optimizer imports torch (only to read its version); without torch this
   script does what opt_level 1 does itself: an ORT CPU session at ORT_ENABLE_BASIC with
   ConstantSharing disabled saves the optimized graph, which then goes through
   ``optimize_model(..., opt_level=0)``.

``--bert-base DIR`` builds (with ``--mg-python``, a venv with tf-models-official) a Model
Garden ``BertEncoder`` at BERT-base size as a TF-Hub-style SavedModel in DIR unless DIR
already holds one, then times ``bertfuse convert DIR``: wall clock, GNU time's maximum
resident set size (``/usr/bin/time -v``: the largest single process), and the summed RSS of
the whole process tree sampled (psutil) every 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "thirdparty"
MS = "com.microsoft."
FUSED = ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu", "FastGelu", "Gelu")
LEFTOVER = ("Softmax", "LayerNormalization")
ORT_OPS = ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu", "FastGelu",
           "Gelu", "LayerNormalization")
NOISE = ("W0000", "I0000", "E0000", "WARNING")


def _bertfuse() -> list[str]:
    exe = Path(sys.executable).with_name("bertfuse")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "bertfuse.cli"]


def run_convert(src: str, out: str, extra: list[str], timed: bool = False) -> tuple[int, dict, str, dict]:
    """One ``bertfuse convert --json``: (exit code, report or {}, last stderr line, timing)."""
    cmd = _bertfuse() + ["convert", src, "-o", out, "--json", *extra]
    if timed:
        cmd = ["/usr/bin/time", "-v", *cmd]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        p = subprocess.Popen(cmd, stdout=so, stderr=se, text=True)
        tree_kb = 0
        try:
            while p.poll() is None:
                if timed:
                    tree_kb = max(tree_kb, _tree_rss_kb(p.pid))
                time.sleep(0.2)
        finally:  # interrupted: bertfuse cleans up after itself on SIGTERM
            if p.poll() is None:
                p.terminate()
                p.wait()
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    timing = {"wall_s": round(time.perf_counter() - start, 1)}
    if timed:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
        timing["peak_rss_gb"] = round(int(m.group(1)) / 1024 / 1024, 2) if m else None
        timing["peak_tree_rss_gb"] = round(tree_kb / 1024 / 1024, 2)
    err = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(NOISE)
           and not ln.startswith(("\t", "Command ", "\x1b"))]
    try:
        report = json.loads(stdout) if stdout.strip() else {}
    except json.JSONDecodeError:
        report = {}
    return p.returncode, report, (err[-1] if err else ""), timing


def _tree_rss_kb(root: int) -> int:
    """Summed RSS of ``root`` and all its descendants, in kB (psutil; one sample)."""
    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.Error:  # gone meanwhile
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total // 1024


def summarize_report(report: dict) -> dict:
    ops = report.get("passes", {}).get("ops_after", {})
    enc = report.get("passes", {}).get("encoder", {})
    parity = report.get("parity") or {}
    return {
        "fused": {k: ops.get(MS + k, 0) for k in FUSED},
        "leftover": {k: ops.get(k, 0) for k in LEFTOVER},
        "nodes": sum(ops.values()),
        "fully_fused": enc.get("fully_fused"),
        "unfused_reasons": sorted({r for ly in enc.get("layers", []) for r in ly.get("reasons", [])}
                                  | set(enc.get("embed_reasons") or [])),
        "parity_ok": parity.get("ok"),
        "parity_max": max((o["max_abs"] for o in parity.get("outputs", [])
                           if not o["name"].startswith("mask invariance")), default=None),
        "written": bool(report.get("written")),
    }


def vs_reference(onnx_path: str, ref_path: Path, original: dict) -> dict:
    """The written model on reference.npz's padded inputs vs the library's eager outputs."""
    import onnxruntime as ort

    ref = np.load(ref_path)
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    feed = {}
    if "text" in ref.files:  # text in: the texts through the vocab written beside the model
        from bertfuse.io.sidecars import find_vocab
        from bertfuse.text import WordPiece

        tok = WordPiece(find_vocab(onnx_path), model=onnx_path)
        feed = tok([str(t) for t in ref["text"]]).feeds()
    for i in sess.get_inputs():
        if i.name in feed:
            continue
        if i.name in original and f"in/{original[i.name]}" in ref:
            feed[i.name] = ref[f"in/{original[i.name]}"].astype(np.int32)
        else:  # a role the source lacks (no segment ids): zeros
            feed[i.name] = np.zeros_like(ref[f"in/{original['input_ids']}"], np.int32)
    ref_outs = [k for k in ref.files if k.startswith("out/")]
    diffs = {}
    for o, v in zip(sess.get_outputs(), sess.run(None, feed)):
        key = f"out/{original.get(o.name, o.name)}"
        if key not in ref and len(ref_outs) == 1 == len(sess.get_outputs()):
            key = ref_outs[0]  # a .keras source names its single output differently
        if key not in ref:
            diffs[o.name] = {"error": f"no reference {key}"}
            continue
        d = np.abs(v.astype(np.float64) - ref[key].astype(np.float64))
        diffs[o.name] = {"max": float(d.max()), "mean": float(d.mean())}
    return diffs


def _ort_basic(raw: str) -> str:
    """What optimize_model's opt_level=1 runs first (optimize_by_onnxruntime), without torch."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = raw.replace(".onnx", "_o1_cpu.onnx")
    ort.InferenceSession(raw, so, providers=["CPUExecutionProvider"], disabled_optimizers=["ConstantSharing"])
    return so.optimized_model_filepath


def ort_optimizer(raw: str, model_type: str, heads: int, hidden: int) -> dict:
    import logging

    from onnxruntime.transformers import optimizer

    logging.disable(logging.WARNING)
    level = optimizer.MODEL_TYPES[model_type][2]
    try:
        path = _ort_basic(raw) if level == 1 else raw
        if level > 1:
            raise ValueError(f"default opt_level {level} not handled")
        m = optimizer.optimize_model(path, model_type=model_type, num_heads=heads, hidden_size=hidden,
                                     opt_level=0)
    except Exception as e:  # noqa: BLE001 - the rival's failure is a result, not our bug
        return {"opt_level": level, "error": f"{type(e).__name__}: {e}"[:200]}
    stats = m.get_fused_operator_statistics()
    return {"opt_level": level, "fused": {k: int(stats.get(k, 0)) for k in ORT_OPS},
            "nodes": len(m.model.graph.node)}


def _conversion(src: str, tmp: str, tag: str, extra: list[str], ref: Path) -> dict:
    out = os.path.join(tmp, f"{tag}.onnx")
    rc, report, err, timing = run_convert(src, out, extra)
    row = {"rc": rc, **timing}
    if err and rc:
        row["error"] = err
    if report:
        row.update(summarize_report(report))
        if report.get("written") and os.path.exists(out):
            row["vs_library"] = vs_reference(out, ref, report.get("original_names") or {})
    return row


def measure_source(name: str, meta: dict, rel: str, fmt: str) -> dict:
    fixture = FIXTURES / name
    src = str(fixture / rel)
    ref = fixture / "reference.npz"
    row = {"fixture": name, "library": meta["library"], "version": meta["version"],
           "class": meta["class"].rsplit(".", 1)[-1], "format": fmt,
           "built_with": {k: v for k, v in meta.items() if k.endswith("version")}}
    # the flags a fixture needs (ELECTRA's checkpoint: --config with its hparams)
    opts = meta.get("convert_options", {})
    need = ["--config", str(fixture / opts["config"])] if "config" in opts else []
    with tempfile.TemporaryDirectory(prefix="breadth-") as tmp:
        row["fp32"] = _conversion(src, tmp, "fp32", need, ref)
        row["fp16"] = _conversion(src, tmp, "fp16", [*need, "--precision", "fp16"], ref)
        raw = os.path.join(tmp, "raw.onnx")
        rc, _, err, _ = run_convert(src, raw, [*need, "--no-fuse", "--no-verify"])
        row["raw_rc"] = rc
        if rc == 0:
            import onnx

            row["raw_nodes"] = len(onnx.load(raw, load_external_data=False).graph.node)
            row["ort"] = {t: ort_optimizer(raw, t, meta["heads"], meta["hidden"]) for t in ("bert_tf", "bert")}
        else:
            row["raw_error"] = err
    return row


def sources(names: list[str]) -> list[tuple[str, dict, str, str]]:
    names = names or sorted(d.name for d in FIXTURES.iterdir() if (d / "meta.json").is_file())
    out = []
    for name in names:
        meta = json.loads((FIXTURES / name / "meta.json").read_text())
        fmt = {"checkpoint": "TF1 checkpoint", "frozen": "frozen GraphDef"}.get(
            meta.get("format"), "SavedModel")
        out.append((name, meta, meta["path"], fmt))
        if meta.get("keras_path"):
            out.append((name, meta, meta["keras_path"], ".keras"))
    return out


# ---------------------------------------------------------------- BERT-base (Model Garden)

BASE = dict(vocab_size=30522, hidden_size=768, num_layers=12, num_attention_heads=12,
            inner_dim=3072, max_sequence_length=512, type_vocab_size=2)


def build_base(out_dir: str) -> None:
    """Runs under a venv with tf-models-official: BertEncoder at BERT-base size, saved the way
    TF Hub's BERT SavedModels are (int32 [None, None] inputs, serving_default)."""
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    import tensorflow as tf
    import tf_keras
    from official.nlp.modeling import networks

    tf_keras.utils.set_random_seed(7)
    model = networks.BertEncoder(**BASE, output_dropout=0.0, attention_dropout=0.0, dict_outputs=True)
    names = ("input_word_ids", "input_mask", "input_type_ids")

    class Exported(tf.Module):
        def __init__(self, m):
            super().__init__()
            self.model = m

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name=n) for n in names])
        def serve(self, input_word_ids, input_mask, input_type_ids):
            out = self.model(dict(input_word_ids=input_word_ids, input_mask=input_mask,
                                  input_type_ids=input_type_ids), training=False)
            return {"sequence_output": out["sequence_output"], "pooled_output": out["pooled_output"]}

    ones = tf.ones([1, 8], tf.int32)
    model(dict(input_word_ids=ones, input_mask=ones, input_type_ids=ones * 0), training=False)
    module = Exported(model)
    tf.saved_model.save(module, out_dir, signatures={"serving_default": module.serve})
    print(json.dumps({"built": out_dir, "params": int(model.count_params()), "tf": tf.__version__}))


def measure_base(out_dir: str, mg_python: str) -> dict:
    if not (Path(out_dir) / "saved_model.pb").exists():
        subprocess.run([mg_python, __file__, "--build-base", out_dir], check=True)
    row: dict = {"source": out_dir, **{k: v for k, v in BASE.items()}}
    with tempfile.TemporaryDirectory(prefix="breadth-base-") as tmp:
        out = os.path.join(tmp, "base.onnx")
        load_before = os.getloadavg()[0]
        rc, report, err, timing = run_convert(out_dir, out, [], timed=True)
        row.update(rc=rc, **timing, load_avg_1min=[round(load_before, 2), round(os.getloadavg()[0], 2)])
        if err and rc:
            row["error"] = err
        if report:
            row.update(summarize_report(report))
            row["onnx_mb"] = round(os.path.getsize(out) / 1e6, 1) if os.path.exists(out) else None
            row["stages"] = {s["name"]: s.get("seconds") for s in report.get("stages", [])}
    return row


# ---------------------------------------------------------------- table


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _worst(diffs: dict | None, key: str) -> float | None:
    vals = [d[key] for d in (diffs or {}).values() if key in d]
    return max(vals) if vals else None


def _counts(c: dict) -> str:
    """Attention / SkipLN / EmbedLN / GELU, the GELU kind named: BiasGelu and Gelu are erf
    GELU, FastGelu is tanh GELU."""
    kinds = [f"{c[k]} {name}" for k, name in (("BiasGelu", "erf"), ("Gelu", "erf"), ("FastGelu", "tanh"))
             if c.get(k)]
    return (f"{c.get('Attention', 0)} / {c.get('SkipLayerNormalization', 0)} / "
            f"{c.get('EmbedLayerNormalization', 0)} / {' + '.join(kinds) or 0}")


def markdown(rows: list[dict]) -> str:
    head = ("| family | model | format | raw nodes | bertfuse Attn / SkipLN / EmbedLN / GELU | nodes | "
            "leftover Softmax / LN | fp32 max diff vs library | fp16 max / mean vs library | "
            "ORT bert_tf (opt 0): fused, nodes | ORT bert (opt 1): fused, nodes |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        f32, f16 = r["fp32"], r["fp16"]
        if "fused" in f32:
            fused = _counts(f32["fused"]) + ("" if f32.get("fully_fused") else " (layers left unfused)")
            nodes = str(f32["nodes"])
            left = f"{f32['leftover']['Softmax']} / {f32['leftover']['LayerNormalization']}"
        else:
            fused, nodes, left = f"exit {f32['rc']}: {f32.get('error', '')[:80]}", "-", "-"
        d32 = _fmt(_worst(f32.get("vs_library"), "max"))
        if f32.get("rc"):
            d32 += f" (exit {f32['rc']})"
        d16 = f"{_fmt(_worst(f16.get('vs_library'), 'max'))} / {_fmt(_worst(f16.get('vs_library'), 'mean'))}"
        if f16.get("rc"):
            d16 += f" (exit {f16['rc']})"
        ort = []
        for t in ("bert_tf", "bert"):
            o = (r.get("ort") or {}).get(t, {})
            ort.append(f"{_counts(o['fused'])}, {o['nodes']}" if "fused" in o else o.get("error", "-"))
        lines.append(f"| {r['library']} | {r['class']} | {r['format']} | {r.get('raw_nodes', '-')} | "
                     f"{fused} | {nodes} | {left} | "
                     f"{d32} | {d16} | {ort[0]} | {ort[1]} |")
    return "\n".join(lines)


def environment() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def v(pkg: str) -> str | None:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s*(.+)", cpu)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": model.group(1) if model else
            platform.processor(), "cores": os.cpu_count(),
            "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "(unset)"),
            "tensorflow": v("tensorflow") or v("tensorflow-cpu"),
            **{p: v(p) for p in ("tf2onnx", "onnxruntime", "onnx", "keras", "bertfuse")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fixtures", nargs="*", help="fixture directory names (default: all)")
    ap.add_argument("--out", required=False, help="JSON results file")
    ap.add_argument("--bert-base", metavar="DIR", help="build (if absent) and time a BERT-base Model Garden SavedModel")
    ap.add_argument("--mg-python", default="/work/venvs/mg/bin/python", help="python with tf-models-official")
    ap.add_argument("--merge", action="store_true",
                    help="rerun only the named fixtures and replace their rows in the existing --out file")
    ap.add_argument("--build-base", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_base:
        build_base(args.build_base)
        return
    result: dict = {"environment": environment()}
    if args.bert_base:
        result["bert_base"] = measure_base(args.bert_base, args.mg_python)
        print(json.dumps(result["bert_base"], indent=1))
    else:
        rows = []
        if args.merge:  # e.g. after a transient failure: keep the other rows and their environment
            result = json.loads(Path(args.out).read_text())
            result.setdefault("reruns", []).append({"fixtures": args.fixtures, **environment()})
            rows = [r for r in result.pop("rows") if r["fixture"] not in args.fixtures]
        for name, meta, rel, fmt in sources(args.fixtures):
            rows.append(measure_source(name, meta, rel, fmt))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if args.out:  # keep what ran so far
                Path(args.out).write_text(json.dumps({**result, "rows": rows}, indent=1))
        rows.sort(key=lambda r: (r["fixture"], r["format"] != "SavedModel"))
        result["rows"] = rows
        print(markdown(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
