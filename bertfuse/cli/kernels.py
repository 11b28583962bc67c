"""`bertfuse kernels build|check|info`: the ai.bertfuse op library (bertfuse/kernels).

Building the CLI parser imports nothing heavy: the actions import the library modules
when they run."""

from __future__ import annotations

import argparse
from typing import Any, Callable
from pathlib import Path

from bertfuse.cli.args import add_output_args
from bertfuse.cli.command import Command
from bertfuse.cli.outcome import error_object, print_json
from bertfuse.errors import install_hint
from bertfuse.cli.args import stage_lines
from bertfuse.kernels import check, library as lib
from bertfuse.kernels.build import build
from bertfuse.kernels.cases import MAX_ABS, MEAN_ABS
from bertfuse.kernels.library import library_info
from bertfuse.optional import optional


def _arch(text: str) -> int:
    """--arch 90, sm_90 or 9.0 -> 90."""
    t = text.strip().lower().removeprefix("sm_").removeprefix("sm")
    try:
        value = int(round(float(t) * 10)) if "." in t else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an SM like 90, sm_90 or 9.0, got {text!r}") from None
    if not 30 <= value <= 199:
        raise argparse.ArgumentTypeError(f"not a CUDA SM: {text!r}")
    return value


class Kernels(Command):
    name = "kernels"
    summary = "bertfuse's own CUDA op library (ai.bertfuse): build, check on the GPU, info"
    example = ("  bertfuse kernels build --ort-include /opt/onnxruntime/include\n"
               "  bertfuse kernels check --json\n"
               "  bertfuse kernels info")
    output_args = False  # each action has its own

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        ks = p.add_subparsers(dest="kernels_command", required=True, metavar="ACTION")

        b = ks.add_parser("build", help="build the library for the local GPU into the cache")
        g = b.add_argument_group("build")
        g.add_argument("--ort-include", metavar="DIR",
                       help="ONNX Runtime's C/C++ API headers (default: $ORT_INCLUDE_DIR, else "
                            "fetched from Debian's libonnxruntime-dev)")
        g.add_argument("--arch", type=_arch, help="CUDA SM to build for, e.g. 90 (default: the local GPU's)")
        g.add_argument("--force", action="store_true", help="rebuild even if the cache has it")
        g.add_argument("--builder", choices=("auto", "cmake", "nvcc"), default="auto",
                       help="auto: cmake where installed, else nvcc directly")
        add_output_args(b)

        c = ks.add_parser("check", help="run every op on the GPU (ONNX Runtime CUDA EP) against "
                                        "its NumPy reference (exit 1 on a mismatch)")
        g = c.add_argument_group("check")
        g.add_argument("--op", action="append", metavar="NAME", help="only this op (repeatable)")
        g.add_argument("--library", metavar="PATH", help="this .so instead of the cached one")
        g.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")
        g.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                       help="skip the CUDA-graph capture/replay run of each case")
        g.add_argument("--no-fp8", dest="fp8", action="store_false", help="skip the FP8 forms")
        add_output_args(c)

        i = ks.add_parser("info", help="the library the runtime takes (packaged, cache or none) "
                                       "and why; cache dir, ONNX Runtime API version, GPU SM")
        i.add_argument("--arch", type=_arch, help="report for this SM instead of the local GPU's")
        add_output_args(i)
        for q in (b, c, i):
            q.epilog = "example:\n" + Kernels.example
            q.formatter_class = argparse.RawDescriptionHelpFormatter

    def run(self, args: argparse.Namespace, console: Any) -> int:
        return {"build": _build, "check": _check, "info": _info}[args.kernels_command](args,
                                                                                     console)


def _say(args, console, progress: bool = True) -> Callable[[str], None]:
    """Lines on stdout; progress ones (a build's steps, check's cases) not with -q."""
    if args.json or (progress and args.quiet):  # -q: errors (check's FAIL verdict), paths
        return lambda msg: None
    return lambda msg: console.print(msg, markup=False, highlight=False, soft_wrap=True)


def _build(args, console) -> int:
    with stage_lines(args, "kernels build") as progress:  # nvcc: minutes per SM
        progress("build the op library")
        path = build(args.ort_include, args.arch, args.force, builder=args.builder,
                     say=_say(args, console))
    if args.json:
        print_json("kernels build", {"library": str(path), "info": library_info(path)})
    elif args.quiet:
        console.print(str(path), markup=False, highlight=False, soft_wrap=True)
    return 0


def _info(args, console) -> int:
    sm = args.arch if args.arch is not None else lib.detect_sm()
    ort_api = lib.installed_ort_api()
    built = [{"ort_api": a, "sm": s, "path": str(p)} for a, s, p in lib.built_libraries()]
    found = lib.resolve(sm=sm)  # what the runtime takes: packaged, else cache, else none
    current = str(found.path) if found.path else None
    ops = None
    if current is not None and ort_api is not None:
        try:
            ops = lib.op_names(current)
        except lib.KernelLibraryError:
            pass  # not loadable here (no CUDA runtime): the rest still answers
    packaged = lib.PACKAGED_DIR / lib.LIB_NAME
    report = {"cache_dir": str(lib.cache_root()), "sm": sm, "onnxruntime_api": ort_api,
              "library": current, "built": current is not None, "ops": ops, "all_built": built,
              "source": found.source, "reason": found.reason,
              "packaged": {"path": str(packaged) if packaged.is_file() else None,
                           "info": found.info or None, "why": found.packaged}}
    if args.json:
        print_json("kernels info", report)
        return 0
    say = _say(args, console, progress=False)  # the answer itself, also with -q
    say(f"cache dir      {report['cache_dir']}")
    say(f"GPU SM         {sm}")
    say(f"onnxruntime    API {ort_api if ort_api is not None else '(not installed)'}")
    say(f"library        {current or 'not built: bertfuse kernels build'}")
    say(f"source         {found.source}: {found.reason}")
    if ops:
        say(f"ops            {', '.join(ops)}")
    for b in built:
        say(f"  cached       ort-api{b['ort_api']}-sm{b['sm']}  {b['path']}")
    return 0


def _check(args, console) -> int:
    sm = lib.detect_sm()  # no GPU: one line, exit 2, before anything else
    try:
        ort = optional("onnxruntime", why="ONNX Runtime (cpu or gpu extra)")
    except ImportError:
        raise lib.KernelLibraryError(f"kernels check needs onnxruntime-gpu ({install_hint('gpu')})"
                                     ) from None
    if hasattr(ort, "preload_dlls"):  # as the runtime does (bertfuse.runtime.device)
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise lib.KernelLibraryError(f"kernels check needs onnxruntime-gpu's CUDA EP; this onnxruntime has "
                                     f"{ort.get_available_providers()}")
    path = Path(args.library) if args.library else lib.locate(sm=sm)
    info = lib.library_info(path)

    cases = check.all_cases(args.seed, args.op, args.fp8)
    say = _say(args, console)
    say(f"library {path} ({info.get('cuda_archs')}, ORT API {info.get('ort_api_version')}); GPU sm{sm}; "
        f"onnxruntime {ort.__version__}; gate max <= {MAX_ABS}, mean <= {MEAN_ABS}")

    def line(r) -> None:
        if r.error:
            say(f"FAIL {r.op:26s} {r.label}: {r.error}")
            return
        graph = f" graph {r.graph_max_abs:.2e}" if r.graph_max_abs is not None else ""
        fp8 = (f" (vs unquantized: max {r.fp8_vs_exact_max:.2e} mean {r.fp8_vs_exact_mean:.2e})"
               if r.fp8_vs_exact_max is not None else "")
        say(f"{'ok  ' if r.ok else 'FAIL'} {r.op:26s} {r.label}: max {r.max_abs:.2e} mean {r.mean_abs:.2e}"
            f"{graph}{fp8}")

    results = check.run_checks(path, cases, args.cuda_graph, line)
    ok = all(r.ok for r in results)
    # Ops the library has but no check case covers: listed, not failed (a new op needs a case).
    names = lib.op_names(path)
    unchecked = [] if args.op else sorted(set(names or ()) - {c.op for c in cases})
    if unchecked:
        say(f"no check case for: {', '.join(unchecked)}")
    verdict = f"{sum(r.ok for r in results)}/{len(results)} cases pass"
    if args.json:
        print_json("kernels check", {
            "library": str(path), "info": info, "sm": sm, "onnxruntime": ort.__version__,
            "tolerance": {"max_abs": MAX_ABS, "mean_abs": MEAN_ABS},
            "cuda_graph": args.cuda_graph, "library_ops": names, "unchecked_ops": unchecked,
            "cases": [r.to_json() for r in results]},
            None if ok else error_object("check", verdict, 1))
    elif not ok and args.quiet:
        console.print(verdict, markup=False, highlight=False, soft_wrap=True)
    else:
        say(verdict)
    return 0 if ok else 1
