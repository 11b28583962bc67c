"""The native library's reshape against the library before it, on one GPU, in one run
(split_guard.sh drives it; run from the repo root with onnxruntime-gpu importable).

    python benchmarks/kernels/split_guard.py build  --src DIR/bertfuse/kernels --root ROOT --ort-include INC
    python benchmarks/kernels/split_guard.py models --work DIR [--skeletons DIR]
    python benchmarks/kernels/split_guard.py compare --before ROOT_A --after ROOT_B --models DIR/models.json --out DIR

build: the op library from another copy of bertfuse/kernels (its own csrc/), with this checkout's
builder (kernels/build.py, the same flags for both copies), into the cache folder ROOT (as
$BERTFUSE_KERNELS_DIR lays it out). models: the bench's workloads as the bench makes them
(bench.models.prepare_models, bench.forms' rewrites: the ai.bertfuse fp16 model, its FP8 and
--gelu-approximation forms; the packed path runs the fp16 one), from --skeletons or from
tests/support/builders' BERT of the workload's size (seeded weights). compare: one worker
process per library (two libraries with the same op names never share a process: each takes its
own through $BERTFUSE_KERNELS_DIR with the packaged library off, and says which file it mapped),
in two settings of the library's switches, each worker running every case:

  pinned   BERTFUSE_GEMM_TIMING=0, BERTFUSE_SPLIT_LN=4, BERTFUSE_GEMM=cublas: no timed choice
           anywhere, so the outputs must be bit-identical (np.array_equal); the split-K form runs
           where it applies
  shipped  the defaults (every choice timed, as the bench runs): p50 per case, timed in
           alternating rounds (before, after, before, after, ...); the outputs are compared too,
           and where they differ the tuners' choices are compared: the same choices with
           different bits fail, different choices (timing noise between two processes) are named

Prints the table last; exit 1 when an output differs (pinned, or shipped with the same choices),
a p50 ratio after/before passes RATIO_MAX, or a worker fails.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = ("shenma-3l b20 s64", "base b1 s128")
SIZES = {  # BERT sizes of tests/support/builders.bert where no skeleton is given
    "shenma-3l": dict(layers=3, hidden=768, heads=12, inter=3072, vocab=21128),
    "base": dict(layers=12, hidden=768, heads=12, inter=3072, vocab=30522),
}
FORMS = {  # case form: (model key, Session options)
    "fp16": ("kernels16", {}),
    "fp8": ("kernels_fp8", {}),
    "gelu-approx": ("kernels16_gelu", {}),
    "packed": ("kernels16", {"packed": True}),  # + its device-packed form (models' packed_model)
}
SETTINGS = {
    "pinned": {"BERTFUSE_GEMM_TIMING": "0", "BERTFUSE_SPLIT_LN": "4", "BERTFUSE_GEMM": "cublas"},
    "shipped": {},
}
SWITCHES = ("BERTFUSE_PDL", "BERTFUSE_LN_CAP", "BERTFUSE_GEMM_WORKSPACE_MB", "BERTFUSE_GEMM_TIMING",
            "BERTFUSE_GEMM_SHARE", "BERTFUSE_GEMM", "BERTFUSE_GEMM_CONFIG", "BERTFUSE_FP8_GEMM_OUT",
            "BERTFUSE_SPLIT_LN")
RATIO_MAX = 1.03


# ------------------------------------------------------------------------------ build


def build(src: str, root: str, ort_include: str, builder: str, arch: int | None = None) -> Path:
    """The library of the kernels copy `src` (a folder with CMakeLists.txt and csrc/), built by
    this checkout's kernels/build.py into the cache folder `root`."""
    from bertfuse.kernels import build as kb

    src_dir = Path(src).resolve()
    if not (src_dir / "csrc").is_dir() and (src_dir / "bertfuse" / "kernels" / "csrc").is_dir():
        src_dir = src_dir / "bertfuse" / "kernels"  # the folder `git archive ... | tar -x` filled
    if not (src_dir / "csrc").is_dir() or not (src_dir / "CMakeLists.txt").is_file():
        raise SystemExit(f"split_guard: {src} holds no bertfuse/kernels copy (csrc/, CMakeLists.txt)")
    kb.SOURCE_DIR = src_dir  # what _nvcc_build and _cmake_build compile
    return kb.build(ort_include=ort_include, arch=arch, force=True, root=Path(root), builder=builder, say=print)


# ------------------------------------------------------------------------------ models


def _skeleton(config: str, skeletons: str | None, work: Path) -> str:
    if skeletons:
        path = Path(skeletons) / f"{config}_raw.skel.onnx"
        if not path.is_file():
            raise SystemExit(f"split_guard: no skeleton {path}")
        return str(path)
    import onnx

    sys.path.insert(0, str(REPO / "tests" / "support" / "builders"))
    from onnx_graphs import bert

    size = SIZES[config]
    model = bert(np.random.default_rng(0), positions=512, types=2, **size)
    for o in model.graph.output:  # the shapes tf2onnx writes
        dims = ["B", "S", size["hidden"]] if o.name == "sequence_output" else ["B", size["hidden"]]
        o.CopyFrom(onnx.helper.make_tensor_value_info(o.name, onnx.TensorProto.FLOAT, dims))
    path = work / f"{config}_raw.onnx"
    onnx.save(model, str(path))
    return str(path)


def models(work: str, skeletons: str | None, workloads: list[str]) -> Path:
    """Every case's model, as the bench makes them; writes and returns work/models.json."""
    from bertfuse.bench.forms import fp8_model, gelu_approximation_model, kernels_model
    from bertfuse.bench.models import prepare_models
    from bertfuse.bench.workloads import PADDED_WORKLOADS
    from bertfuse.passes.manager import run_passes
    from bertfuse.passes.plans import packing_plan
    import onnx

    out = Path(work)
    out.mkdir(parents=True, exist_ok=True)
    by_config: dict[str, dict[str, str]] = {}
    cases = []
    for name in workloads:
        config, batch, seq = PADDED_WORKLOADS[name]
        if config not in by_config:
            folder = out / config
            folder.mkdir(exist_ok=True)
            paths = prepare_models(_skeleton(config, skeletons, folder), str(folder), anchors=False)
            made = {}
            made["kernels16"], note = kernels_model(paths["bertfuse16"], str(folder))
            print(f"{config}: kernels16: {note}", flush=True)
            if made["kernels16"]:
                made["kernels_fp8"], note = fp8_model(paths["bertfuse16"], made["kernels16"], str(folder))
                print(f"{config}: kernels_fp8: {note}", flush=True)
                made["kernels16_gelu"], note = gelu_approximation_model(paths["bertfuse16"], str(folder))
                print(f"{config}: kernels16_gelu: {note}", flush=True)
                packed, _ = run_passes(onnx.load(made["kernels16"]), packing_plan(on_kernels=True))
                made["kernels16_packed"] = str(folder / "kernels16_packed.onnx")
                onnx.save(packed, made["kernels16_packed"])
            by_config[config] = {k: v for k, v in made.items() if v}
        for form, (key, _) in FORMS.items():
            if key in by_config[config]:
                cases.append({"case": f"{name} {form}", "workload": name, "form": form,
                              "model": by_config[config][key], "batch": batch, "seq": seq,
                              "packed_model": by_config[config].get("kernels16_packed")})
            else:
                print(f"{name} {form}: no model ({key} not made)", flush=True)
    listing = out / "models.json"
    listing.write_text(json.dumps(cases, indent=1) + "\n")
    return listing


# ------------------------------------------------------------------------------ workers


def _mapped_libraries() -> list[str]:
    import psutil

    return sorted({m.path for m in psutil.Process().memory_maps() if m.path.endswith("libbertfuse_ops.so")})


def _choices(path: str) -> dict:
    """What the library's tuners chose so far (the check entry points' JSON)."""
    import ctypes

    lib = ctypes.CDLL(path)  # the handle ORT already opened
    out = {}
    for name in ("bf_cublas_timings", "bf_split_ln_choices", "bf_gemm_choices"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            out[name] = json.loads(fn().decode())
    return out


def _worker(conn, root: str, setting: dict, cases: list[dict], out_dir: str) -> None:
    """One library, one process: opens every case's Session, saves its outputs, then times a case
    whenever the coordinator asks."""
    try:
        for key in SWITCHES:
            os.environ.pop(key, None)
        os.environ.update(setting)
        os.environ["BERTFUSE_KERNELS_DIR"] = root
        os.environ["BERTFUSE_PACKAGED_KERNELS"] = "0"
        from bertfuse.bench.padded import runtime_session
        from bertfuse.io.inputs import padded_request
        from bertfuse.kernels import library

        path = str(library.locate().resolve())
        calls, unsteady = {}, []
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        import onnx

        from bertfuse.runtime.request_checks import model_facts

        for case in cases:
            facts = model_facts(onnx.load(case["model"], load_external_data=False))
            feeds = padded_request(case["batch"], case["seq"], facts.vocab_size or 1000)
            kw = dict(FORMS[case["form"]][1])
            if kw.pop("packed", False):  # every request to the device-packed form
                kw.update(packed_model=case["packed_model"], pack_below_fill=1.01)
            sess, call = runtime_session(case["model"], feeds, **kw)
            outs = {k: np.array(v, copy=True) for k, v in call(to_host=True).items()}
            np.savez(Path(out_dir) / (case["case"].replace(" ", "_") + ".npz"), **outs)
            again = call(to_host=True)  # the same library twice: a control for the comparison
            if any(not np.array_equal(outs[k], np.asarray(again[k])) for k in outs):
                unsteady.append(case["case"])
            calls[case["case"]] = (sess, call)
        conn.send({"ready": True, "library": path, "mapped": _mapped_libraries(),
                   "choices": _choices(path), "unsteady": unsteady})
        while True:
            msg = conn.recv()
            if msg is None:
                break
            _, call = calls[msg["case"]]
            for _ in range(msg["warmup"]):
                call()
            ts = []
            for _ in range(msg["iters"]):
                t0 = time.perf_counter()
                call()
                ts.append(time.perf_counter() - t0)
            conn.send({"us": [t * 1e6 for t in ts]})
    except Exception as exc:  # noqa: BLE001 (the coordinator reports it)
        import traceback

        conn.send({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})


def _start(ctx, root: str, setting: dict, cases: list[dict], out_dir: str):
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(child, root, setting, cases, out_dir), daemon=True)
    proc.start()
    return proc, parent


def _recv(worker) -> dict:
    proc, conn = worker
    try:
        return conn.recv()
    except (EOFError, OSError):
        proc.join(5)
        return {"error": f"the worker died (exit code {proc.exitcode})", "trace": ""}


def _stop(workers) -> None:
    for proc, conn in workers.values():
        try:
            conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        proc.join(60)
        if proc.is_alive():
            proc.kill()


def _same_outputs(a: Path, b: Path) -> tuple[bool, str]:
    if not a.is_file() or not b.is_file():
        return False, "missing outputs"
    with np.load(a) as x, np.load(b) as y:
        if sorted(x.files) != sorted(y.files):
            return False, f"outputs {sorted(x.files)} vs {sorted(y.files)}"
        for k in x.files:
            if x[k].shape != y[k].shape or x[k].dtype != y[k].dtype or not np.array_equal(x[k], y[k]):
                d = np.abs(x[k].astype(np.float64) - y[k].astype(np.float64)) if x[k].shape == y[k].shape else None
                return False, f"{k} differs" + (f" (max |diff| {np.nanmax(d):.3g})" if d is not None else "")
    return True, ""


def _chosen(choices: dict) -> dict:
    """The choices alone (no times): what makes the bits."""
    return {"cublas": sorted((c["fp8"], c["epilogue"], c["residual"], c["M"], c["N"], c["K"], c["chosen"])
                             for c in choices.get("bf_cublas_timings", [])),
            "split": sorted((c["M"], c["N"], c["K"], c["y32"], c["splits"])
                            for c in choices.get("bf_split_ln_choices", [])),
            "sm90": sorted((c["M"], c["N"], c["K"], c["gelu"], c["residual"], c["choice"])
                           for c in choices.get("bf_gemm_choices", []))}


def compare(before: str, after: str, listing: str, out: str, rounds: int, iters: int,
            warmup: int) -> int:
    cases = json.loads(Path(listing).read_text())
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    failures: list[str] = []
    rows = {c["case"]: {"case": c["case"]} for c in cases}
    report: dict = {"cases": [c["case"] for c in cases], "settings": {}}
    for setting, env in SETTINGS.items():
        roots = {"before": before, "after": after}
        workers, ready = {}, {}
        # Pinned: both at once (nothing is timed). Shipped: one after the other, so that neither
        # worker's tuning runs beside the other's.
        if setting == "pinned":
            for side, root in roots.items():
                workers[side] = _start(ctx, root, env, cases, str(out_dir / setting / side))
        for side, root in roots.items():
            if side not in workers:
                workers[side] = _start(ctx, root, env, cases, str(out_dir / setting / side))
            msg = _recv(workers[side])
            if "error" in msg:
                print(msg.get("trace", ""), file=sys.stderr)
                failures.append(f"{setting} {side}: {msg['error']}")
                _stop(workers)
                workers = {}
                break
            ready[side] = msg
            print(f"{setting} {side}: {msg['library']} (mapped: {', '.join(msg['mapped'])})", flush=True)
            if msg["mapped"] != [msg["library"]] or \
                    not Path(msg["library"]).resolve().is_relative_to(Path(root).resolve()):
                failures.append(f"{setting} {side}: mapped {msg['mapped']}, not {root}'s library")
        if len(ready) < 2:
            continue
        report["settings"][setting] = {side: {"library": m["library"], "choices": m["choices"]}
                                       for side, m in ready.items()}
        same_choices = _chosen(ready["before"]["choices"]) == _chosen(ready["after"]["choices"])
        for c in cases:
            name = c["case"].replace(" ", "_") + ".npz"
            same, why = _same_outputs(out_dir / setting / "before" / name, out_dir / setting / "after" / name)
            row = rows[c["case"]]
            shaky = [side for side, m in ready.items() if c["case"] in m.get("unsteady", [])]
            if shaky:  # a run differs from the next one in the same process: say so beside the verdict
                row["note"] = f"{setting}: the {' and '.join(shaky)} library's two runs differ from each other"
            if same:
                row[setting] = "yes"
            elif setting == "pinned" or same_choices:
                row[setting] = "NO"
                failures.append(f"{setting} {c['case']}: {why}")
            else:
                row[setting] = "n/a"  # the tuners chose differently: noise between two processes
                row["note"] = f"{why}; the tuners' choices differ between the processes"
        if setting == "shipped":
            samples = {(c["case"], side): [] for c in cases for side in roots}
            for r in range(rounds):
                for c in cases:
                    order = ("before", "after") if r % 2 == 0 else ("after", "before")
                    for side in order:
                        workers[side][1].send({"case": c["case"], "iters": iters,
                                               "warmup": warmup if r == 0 else 5})
                        msg = _recv(workers[side])
                        if "error" in msg:
                            failures.append(f"timing {side} {c['case']}: {msg['error']}")
                            break
                        samples[(c["case"], side)] += msg["us"]
            for c in cases:
                b, a = samples[(c["case"], "before")], samples[(c["case"], "after")]
                if not b or not a:
                    continue
                row = rows[c["case"]]
                row["p50_before_us"] = float(np.percentile(b, 50))
                row["p50_after_us"] = float(np.percentile(a, 50))
                row["ratio"] = row["p50_after_us"] / row["p50_before_us"]
                if row["ratio"] > RATIO_MAX:
                    failures.append(f"{c['case']}: p50 after/before {row['ratio']:.3f} > {RATIO_MAX}")
            if not same_choices:
                report["choices_differ"] = {side: _chosen(m["choices"]) for side, m in ready.items()}
        _stop(workers)
    report["rows"] = list(rows.values())
    report["failures"] = failures
    (out_dir / "compare.json").write_text(json.dumps(report, indent=1) + "\n")
    print()
    head = f"{'model':<34} {'bit-identical pinned':>20} {'shipped':>8} {'p50 before':>11} {'p50 after':>10} {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for row in rows.values():
        p_b = f"{row['p50_before_us']:.1f}" if "p50_before_us" in row else "-"
        p_a = f"{row['p50_after_us']:.1f}" if "p50_after_us" in row else "-"
        ratio = f"{row['ratio']:.3f}" if "ratio" in row else "-"
        print(f"{row['case']:<34} {row.get('pinned', '-'):>20} {row.get('shipped', '-'):>8} {p_b:>11} {p_a:>10} {ratio:>6}"
              + (f"  ({row['note']})" if row.get("note") else ""))
    print()
    for f in failures:
        print(f"FAIL {f}")
    print(f"split guard: {'PASS' if not failures else 'FAIL'} ({len(cases)} cases; p50 in us, "
          f"ratio = after / before, bar {RATIO_MAX})")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="split_guard.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--src", required=True)
    b.add_argument("--root", required=True)
    b.add_argument("--ort-include", required=True)
    b.add_argument("--builder", default="auto", choices=("auto", "cmake", "nvcc"))
    b.add_argument("--arch", type=int, help="the SM to build for (default: the local GPU's)")
    m = sub.add_parser("models")
    m.add_argument("--work", required=True)
    m.add_argument("--skeletons")
    m.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    c = sub.add_parser("compare")
    c.add_argument("--before", required=True)
    c.add_argument("--after", required=True)
    c.add_argument("--models", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--rounds", type=int, default=6)
    c.add_argument("--iters", type=int, default=100)
    c.add_argument("--warmup", type=int, default=30)
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(build(args.src, args.root, args.ort_include, args.builder, args.arch))
        return 0
    if args.cmd == "models":
        print(models(args.work, args.skeletons, args.workloads))
        return 0
    return compare(args.before, args.after, args.models, args.out, args.rounds, args.iters, args.warmup)


if __name__ == "__main__":
    sys.exit(main())
