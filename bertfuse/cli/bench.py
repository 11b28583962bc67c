"""`bertfuse bench`: its options and its run. The CLI parses the options with argparse like
every other subcommand; benchmarks/runtime/gpu_bench.py is the same command as a script."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import redirect_stdout

from bertfuse.bench.forms import FORMS
from bertfuse.bench.workloads import PACKED_WORKLOADS, PADDED_WORKLOADS
from bertfuse.cli.command import Command
from bertfuse.cli.renamed import add_renamed
from bertfuse.errors import BertfuseError
from bertfuse.pipeline.renamed import FORMS as FORMS_RENAMED
from bertfuse.bench import packed as packed_bench
from bertfuse.bench.forms import find_library, format_comparison
from bertfuse.bench.models import no_cuda, prepare_models
from bertfuse.bench.padded import Result, Rows, format_table, run_workload, soak
from bertfuse.bench.timing import kernel_profile
from bertfuse.bench.peers import best_peers
from bertfuse.cli.outcome import print_json
from bertfuse.io.safety import temp_dir
from bertfuse.optional import optional


class Bench(Command):
    name = "bench"
    summary = "GPU benchmark: ORT raw / ORT optimizer / bertfuse runtime, padded vs packed (needs onnxruntime-gpu)"
    example = ("  bertfuse strip-weights raw.onnx -o out/skeletons/shenma-3l_raw.skel.onnx\n"
               "  bertfuse bench --skeletons out/skeletons --workloads 'shenma-3l b20 s64' --packed "
               "--out results/")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--skeletons", required=True,
                       help="directory with <config>_raw.skel.onnx (bertfuse strip-weights)")
        g = p.add_argument_group("workloads")
        g.add_argument("--workloads", nargs="*", default=list(PADDED_WORKLOADS),
                       choices=list(PADDED_WORKLOADS), metavar="NAME",
                       help=f"padded workloads, any of: {'; '.join(PADDED_WORKLOADS)} "
                            "(default all; the flag alone: none)")
        g.add_argument("--packed", nargs="*", default=None, choices=list(PACKED_WORKLOADS),
                       metavar="NAME", help="padded-vs-packed workloads, any of: "
                                            f"{'; '.join(PACKED_WORKLOADS)} "
                                            "(default all; the flag alone: none)")
        g.add_argument("--streams", nargs="*", type=int, default=[1, 2, 4], metavar="N",
                       help="padded vs packed under load: threads, each with its own replica "
                            "(default 1 2 4; the flag alone: none)")
        g.add_argument("--iters", type=int, default=500, help="timed calls per variant")
        g.add_argument("--soak", type=int, default=0, help="mixed-shape requests for the soak")
        g.add_argument("--ort-rows", choices=("all", "reference"), default="all",
                       help="all (default): ORT raw fp32 and fp16 and ORT's transformer optimizer; "
                            "reference: ORT raw fp32 only, the parity reference (skips the "
                            "optimizer, most of a large model's setup time)")
        g.add_argument("--runtime-rows", choices=("all", "paired"), default="all",
                       help="all (default): every runtime variant of the contrib form (mask forms, "
                            "pageable copy, packed); paired: only those the bertfuse-kernels form "
                            "has too (the runtime as shipped, raw mask only)")
        g.add_argument("--peers", choices=("on", "off"), default="on",
                       help="on (default): also time the peers in the same run, ORT's "
                            "transformer optimizer on a PyTorch export of the same config, "
                            "torch SDPA and torch.compile (the fastest of its set-ups), all fp16 with CUDA "
                            "graphs (need torch and transformers, triton for torch.compile; "
                            "else those rows say why)")
        k = p.add_argument_group("forms")
        add_renamed(k, FORMS_RENAMED, FORMS, dest="forms", default="both",
                    help="contrib: the fused model on ONNX Runtime's contrib ops only; both "
                         "(default): also rewritten into bertfuse's own CUDA ops, timed beside "
                         "it (needs `bertfuse kernels build` first; else those rows say why)")
        p.add_argument("--out", default=os.environ.get("OUT", "."),
                       help="folder for gpu_bench.json, made if its parent exists (default "
                            "$OUT, else .)")

    def run(self, args: argparse.Namespace, console=None) -> int:
        """Checks --out, the skeletons and the GPU before any temp file, then runs every
        workload with the prepared models under one temp dir (removed on any exit: the CLI
        handles signals). --out comes first: the results are written after minutes of timing,
        and a run that cannot write them then is lost."""
        out_dir = os.path.abspath(args.out)
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            raise BertfuseError(f"bench: --out {args.out} is a file, not a directory")
        parent = out_dir if os.path.isdir(out_dir) else os.path.dirname(out_dir)
        if not os.path.isdir(parent):
            raise BertfuseError(f"bench: --out {args.out}: its parent folder does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise BertfuseError(f"bench: --out {args.out}: {parent} is not writable")
        configs = {PADDED_WORKLOADS[n][0] for n in args.workloads} | \
            {PACKED_WORKLOADS[n][0] for n in (list(PACKED_WORKLOADS) if args.packed is None
                                           else args.packed)}
        missing = [c for c in sorted(configs)
                   if not os.path.isfile(os.path.join(args.skeletons, f"{c}_raw.skel.onnx"))]
        if missing:
            raise BertfuseError(f"bench: no skeleton for {', '.join(missing)} in {args.skeletons} "
                                "(expected <config>_raw.skel.onnx, made by bertfuse strip-weights)")

        no_gpu = no_cuda()
        if no_gpu:  # before any temp file: nothing is left behind
            raise BertfuseError(f"bench needs a CUDA GPU ({no_gpu})")

        os.makedirs(out_dir, exist_ok=True)  # one new folder under a writable parent, at most
        out = sys.stdout
        # --json: the progress and tables on stderr; -q: nowhere, the file written alone
        with temp_dir(prefix="bertfuse-bench-") as work, open(os.devnull, "w") as null, \
                redirect_stdout(sys.stderr if args.json else null if args.quiet else out):
            payload = _bench(args, str(work))
        if args.json:
            print_json("bench", payload, indent=None)
        elif args.quiet:
            print(f"wrote {os.path.join(args.out, 'gpu_bench.json')}")
        return 0


def _bench(args: argparse.Namespace, work: str) -> dict:
    """Runs the workloads; returns what gpu_bench.json holds."""
    ort = optional("onnxruntime", why="ONNX Runtime (cpu or gpu extra)")

    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from pip's nvidia-* wheels (ORT >= 1.21)
        ort.preload_dlls()
    results: list[Result] = []
    extra: dict = {}
    kernels = None
    packed_names = list(packed_bench.WORKLOADS) if args.packed is None else args.packed
    if args.forms == "both" and (args.workloads or packed_names):
        kernels = find_library()
        extra["kernels"] = kernels.to_json()
        print(f"bertfuse kernels: {kernels.library or 'not run: ' + kernels.reason}", flush=True)
    rows = Rows(kernels, ort_models=args.ort_rows == "all",
                paired=args.runtime_rows == "paired", peers=args.peers == "on")
    prepared: dict[str, dict[str, str]] = {}
    profiles: list = []

    def payload() -> dict:
        return {"results": [r.__dict__ for r in results], "best_peer": best_peers(results),
                **extra,
                "onnxruntime": ort.__version__, "date": time.strftime("%Y-%m-%d")}

    def save() -> None:  # after every workload: a run cut short still leaves its results
        with open(os.path.join(args.out, "gpu_bench.json"), "w") as fh:
            json.dump(payload(), fh, indent=1, default=str)

    for name in args.workloads:
        config, batch, seq = PADDED_WORKLOADS[name]
        skeleton = os.path.join(args.skeletons, f"{config}_raw.skel.onnx")
        print(f"== {name}", flush=True)
        rs, paths = run_workload(name, skeleton, batch, seq, args.iters, work, profiles, rows,
                                 prepared.get(config))  # one preparation per model
        prepared[config] = paths
        for r in rs:
            print(f"   {r.variant:45s} p50 {r.p50_us:9.1f} us  p99 {r.p99_us:9.1f}  "
                  f"max diff {r.max_diff:.2e}  gpu {r.gpu_us}  {r.note}", flush=True)
        results += rs
        if args.soak and config == "shenma-3l":
            extra["soak"] = soak(paths["bertfuse16"], args.soak)
            print("   soak:", extra["soak"], flush=True)
        save()

    def paths_for(config: str) -> dict[str, str]:
        if config not in prepared:
            skeleton = os.path.join(args.skeletons, f"{config}_raw.skel.onnx")
            prepared[config] = prepare_models(skeleton, tempfile.mkdtemp(dir=work))
        return prepared[config]

    if packed_names:
        print("== padded vs packed", flush=True)
        extra["packed"] = packed_bench.run(paths_for, args.iters, packed_names,
                                           tuple(args.streams), kernels)
    save()
    for result, call in profiles:  # last: the profiler slows whatever runs after it
        result.gpu_us, result.kernels, result.breakdown, result.gpu_busy_us = \
            kernel_profile(call)
        print(f"   profile {result.workload} / {result.variant}: GPU {result.gpu_us:.1f} us "
              f"(busy {result.gpu_busy_us:.1f}), {result.kernels} kernels", flush=True)
    save()
    print(format_table(results))
    if "packed" in extra:
        print()
        print(packed_bench.format_tables(extra["packed"]))
    if kernels is not None:  # last: the two forms side by side
        print()
        print(format_comparison(results))
    return payload()
