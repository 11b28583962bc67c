"""`bertfuse serve MODEL.onnx`: its options, and the foreground run that ends on Ctrl-C or
SIGTERM with Serve (and a Ray it started) shut down."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any, Callable

from bertfuse.cli.args import add_kernels_arg, gpus, int_at_least, stage_lines
from bertfuse.cli.command import Command
from bertfuse.errors import BertfuseError, require
from bertfuse.cli.outcome import report
from bertfuse.io.safety import Terminated
from bertfuse.serve.api import DRAIN_S, deploy
from bertfuse.serve.config import max_ongoing
from bertfuse.serve.ingress import describe


class Serve(Command):
    name = "serve"
    # serve/config.py: HAPROXY_GPUS_PER_REPLICA (0.25) behind HAProxy, the default ingress where
    # Ray starts here on Linux; a whole GPU each behind Serve's proxy or direct; one CPU replica
    summary = ("serve a model over HTTP on Ray Serve (batched; four replicas per GPU behind "
               "HAProxy, one per GPU behind Serve's proxy, one on a CPU)")
    example = ("  bertfuse serve model.onnx --vocab out/tiny/vocab.txt --port 8000\n"
               "  curl -s localhost:8000/v1/infer -H 'Content-Type: application/json' \\\n"
               "      -d '{\"text\": [\"what is bert?\"]}'")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="a bertfuse-converted .onnx")
        g = p.add_argument_group("replicas and batching")
        g.add_argument("--replicas", type=int_at_least(1),
                       help="replicas (default: as many as the cluster's GPUs hold at "
                            "--gpus-per-replica each, else 1 on the CPU)")
        g.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                       help="auto: cuda where the Ray cluster has GPUs")
        add_kernels_arg(g)
        g.add_argument("--max-batch", type=int_at_least(1), default=32,
                       help="rows per model call, and per request (default 32)")
        g.add_argument("--max-wait-ms", type=float, default=2.0, metavar="T",
                       help="longest a request waits for others to batch with (default 2; a "
                            "request alone in its replica does not wait)")
        g.add_argument("--batch-buckets", metavar="B,B,...",
                       help="rows a model call is padded to (default 1,2,4,...,--max-batch); "
                            "requests of N rows batch best with N,2N,3N")
        g.add_argument("--max-seq", type=int_at_least(1),
                       help="longest request in tokens (default: the model's positions)")
        g.add_argument("--cpus-per-replica", type=float, default=1.0, metavar="N",
                       help="Ray CPUs each replica reserves (default 1)")
        g.add_argument("--cpu-threads", type=int_at_least(1), metavar="N",
                       help="ONNX Runtime's intra-op threads in each replica (default: ORT's, "
                            "one per physical core; with several CPU replicas on one host, "
                            "replicas x N at most its cores)")
        g.add_argument("--gpus", type=gpus, metavar="N|all",
                       help="whole GPUs of this host: the first N that CUDA sees (all: every "
                            "one), 1/--gpus-per-replica replicas on each, one GPU per replica; "
                            "the local Ray only (no --address), not with --replicas")
        g.add_argument("--gpus-per-replica", type=float, metavar="F",
                       help="the share of a GPU each replica reserves (default 0.25, four "
                            "replicas per GPU, with the haproxy ingress; else 1)")
        g.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="skip warming every bucket before a replica takes traffic")
        g = p.add_argument_group("requests")
        g.add_argument("--outputs", help="comma-separated outputs to serve (default all)")
        g.add_argument("--vocab", help="the checkpoint's vocab.txt: requests may send text")
        c = g.add_mutually_exclusive_group()
        c.add_argument("--lower-case", dest="lower_case", action="store_true", default=None,
                       help="lower-case text (default: as the checkpoint says)")
        c.add_argument("--no-lower-case", dest="lower_case", action="store_false")
        g = p.add_argument_group("where")
        g.add_argument("--address", help="join a running Ray cluster ('auto' or HOST:PORT; "
                                         "default: start a local Ray, stopped on exit)")
        g.add_argument("--host", default="127.0.0.1",
                       help="HTTP host (default 127.0.0.1; 0.0.0.0 for other machines)")
        g.add_argument("--port", type=int_at_least(1), default=8000, help="HTTP port (default 8000)")
        g.add_argument("--name", default="bertfuse", help="Serve application name")
        g.add_argument("--ingress", choices=("auto", "proxy", "direct", "haproxy"),
                       default="auto",
                       help="auto (default): haproxy where bertfuse starts the local Ray on Linux "
                            "with Ray >= 2.55 and its HAProxy binary, else proxy; proxy: Serve's "
                            "HTTP proxy on --port; direct: clients post to each replica's own "
                            "port (URLs printed); haproxy: HAProxy on --port forwards to the "
                            "replicas' ports. direct and haproxy are switched on when Ray starts: "
                            "they need the local Ray (no --address)")
        g.add_argument("--access-log", action="store_true",
                       help="Serve's per-request log lines (off: each costs a file write)")
        g.add_argument("--metrics-host", metavar="HOST",
                       help="where the metrics and stats ports listen (HAProxy's, Ray's; "
                            "default the loopback only)")
        g.add_argument("--token-file", metavar="FILE",
                       help="require 'Authorization: Bearer TOKEN' (the file's one line) on "
                            "every route but the health probes (/healthz, /readyz, "
                            "/v2/health/*, /-/healthz), /-/routes included; default: the "
                            "environment's BERTFUSE_TOKEN, else no token. A file that others "
                            "may read or write is refused (chmod 600)")
        g.add_argument("--allow-readable-token-file", action="store_true",
                       help="accept a --token-file that group or others may read")

    def run(self, args: argparse.Namespace, console) -> int:
        """Deploys, prints where, then waits for Ctrl-C/SIGTERM (bertfuse.io.safety turns SIGTERM
        into an exception) and shuts down before returning 0. Ray prints its workers' errors on
        the driver's stdout (a Serve shutdown makes one): they go to stderr here, so that stdout
        holds only this command's lines (--json: one JSON object each)."""
        if args.max_wait_ms < 0 or args.max_wait_ms != args.max_wait_ms:
            raise BertfuseError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")
        out = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            return _serve(args, out)


def _serve(args: argparse.Namespace, out) -> int:
    # Every package serving needs, in one line where several are missing.
    require("ray", "onnxruntime", *(("tokenizers",) * bool(args.vocab)))

    def say(data: dict, text: str) -> None:  # --json: a report a line (cli/outcome.py)
        print(json.dumps(report("serve", data)) if args.json else text, file=out, flush=True)

    # Start-up on stderr, a line per stage (deploy's `status`); the first stage starts after
    # the options and model are checked, so a bad one is still the one error line.
    with stage_lines(args) as progress:
        served = _deploy(deploy, args, progress)
    stop = "signal"
    try:
        name = served.config.name  # the Open Inference Protocol's model name
        info = {"url": served.url, "infer": served.url + "v1/infer", "v2": served.url + "v2",
                "model": name, "v2_model": f"{served.url}v2/models/{name}",
                "device": served.device,
                "replicas": served.replicas, "max_batch": served.config.max_batch,
                "max_seq": served.config.max_seq, "outputs": list(served.config.outputs),
                "text": served.config.vocab is not None, "metrics": served.metrics_urls(),
                "ingress": served.config.ingress, "ingress_why": served.ingress_why,
                "urls": served.urls}
        share = ""
        if served.device == "cuda":
            info["gpus_per_replica"] = served.config.gpus_per_replica
            share = f" ({served.config.gpus_per_replica:g} GPU each)"
        if served.gpus is not None:  # --gpus: the plan, and each GPU's queue bound
            info["gpus"] = {**served.gpus.to_json(), "queue_per_gpu": served.gpus.per_gpu
                            * max_ongoing(served.config.max_batch)}
            share += (f" on {served.gpus.count} GPU(s) "
                      f"{','.join(g.id for g in served.gpus.gpus)}"
                      f"{', pinned to their NUMA nodes' if served.gpus.pinned else ''}")
        why = f": auto, {served.ingress_why}" if served.ingress_why else ""
        say(info, f"serving {args.model} on {served.replicas} {served.device} replica(s){share} "
                  f"at {describe(served)}, and as model {name!r} at {info['v2_model']} (Open "
                  f"Inference Protocol, {info['v2']}) ({served.config.ingress} ingress{why}; "
                  "Ctrl-C stops)")
        while True:  # until a signal raises here
            time.sleep(3600)
    except KeyboardInterrupt:
        stop = "Ctrl-C"
    except Terminated:
        stop = "SIGTERM"
    finally:  # a signal drains: in-flight requests are answered before Serve stops
        served.shutdown(drain_s=DRAIN_S if stop != "signal" else 0.0)
    say({"stopped": stop}, f"bertfuse serve: stopped ({stop}); Serve shut down")
    return 0


def _deploy(deploy: Callable[..., Any], args: argparse.Namespace,
            progress: Callable[[str], None]) -> Any:
    """deploy() with the command's options; its stages reported to `progress`."""
    return deploy(
        args.model, status=progress, replicas=args.replicas, max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms, max_seq=args.max_seq, vocab=args.vocab,
        batch_buckets=args.batch_buckets,
        lower_case=args.lower_case, device=args.device, address=args.address, host=args.host,
        port=args.port, outputs=args.outputs, name=args.name,
        cpus_per_replica=args.cpus_per_replica, gpus_per_replica=args.gpus_per_replica,
        warmup=args.warmup, allow_readable_token_file=args.allow_readable_token_file,
        access_log=args.access_log, ingress=args.ingress,
        **{k: v for k, v in (("metrics_host", args.metrics_host),
                             ("token_file", args.token_file),
                             ("kernels", args.kernels),
                             ("cpu_threads", args.cpu_threads),
                             ("gpus", args.gpus)) if v is not None})
