"""What `bertfuse serve` / `bertfuse.serve.deploy()` is asked for, checked before Ray starts:
keyword arguments become one validated `ServeConfig` (a ConfigError names the first bad
one), and the model and vocab are read once here so a bad file is one line, not a dead
replica. Once placed, a `ReplicaConfig` (replica_config.py) is what each replica is built
from. No Ray here."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from bertfuse.checks import check_int, check_text
from bertfuse.errors import BertfuseError
from bertfuse.gpu_plan import check_gpus
from bertfuse.runtime.request_checks import (ConfigError, check_canonical, model_facts,
                                             servable_model)
from bertfuse.serve.token import token_sha256
from bertfuse.io.sidecars import find_vocab
from bertfuse.runtime.kernel_choice import check_kernels_option
from bertfuse.text import WordPiece

DEVICES = ("auto", "cuda", "cpu")
INGRESSES = ("auto", "proxy", "direct", "haproxy")  # bertfuse/serve/ingress.py says what each is
# Replicas per GPU behind HAProxy when gpus_per_replica is left out: on an H200 four replicas
# of shenma-3l (fp16, b20 s64) served 32 clients 110% of an in-process SessionPool's seq/s;
# one replica's per-request Python caps it at 42% (docs/serving.md).
HAPROXY_GPUS_PER_REPLICA = 0.25

# The session's thread needs the GIL around each model call (staging inputs, outputs to
# NumPy, the future's result). Under load the event loop thread holds it (parsing, encoding)
# and, while it has work, lets go only every switch interval (CPython's default 5 ms): a
# finished call, and the next one queued behind it, could wait that long, the device idle.
# 0.5 ms bounds that wait: on an H200 one replica served 32 clients 26.5k seq/s with it and
# 20.5k at 5 ms (shenma-3l b20 s64); neutral on a 2-core CPU, whose model call is slow.
# BERTFUSE_SERVE_SWITCH_MS (set when Ray starts) picks another value, for A/B runs.
SWITCH_MS = "0.5"


def switch_interval_s() -> float:
    """The replicas' thread switch interval in seconds (checked before Ray starts too)."""
    text = os.environ.get("BERTFUSE_SERVE_SWITCH_MS", SWITCH_MS)
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1000:
        raise ConfigError(f"BERTFUSE_SERVE_SWITCH_MS must be a number of ms in (0, 1000], "
                          f"not {text!r}")
    return value / 1000


@dataclass(frozen=True)
class ServeConfig:
    """replicas None: one per GPU where the cluster has GPUs, else one CPU replica.
    max_seq None: the model's position table. address None: a local Ray started (and stopped)
    here; 'auto' or host:port: join that cluster. outputs None: every model output.
    batch_buckets None: the runtime's (1, 2, 4, ... up to max_batch); a batch runs padded to
    the smallest bucket that holds its rows, so requests of a fixed size want its multiples.
    ingress 'auto' and gpus_per_replica None are decided when deploy() starts (resolve()).
    metrics_host: where the metrics and stats ports listen (HAProxy's, Ray's). token_file:
    a file holding the bearer token every route but the health probes requires (without it,
    the environment's BERTFUSE_TOKEN; neither: no token). token_sha256 is no argument:
    check_config fills it with that token's digest (the token itself is never kept)."""

    model: str
    replicas: int | None = None
    max_batch: int = 32
    max_wait_ms: float = 2.0
    max_seq: int | None = None
    batch_buckets: Sequence[int] | None = None
    vocab: str | None = None
    lower_case: bool | None = None
    device: str = "auto"
    address: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    outputs: Sequence[str] | None = None
    name: str = "bertfuse"
    cpus_per_replica: float = 1.0
    gpus_per_replica: float | None = None
    warmup: bool = True
    access_log: bool = False
    ingress: str = "auto"
    metrics_host: str = "127.0.0.1"
    token_file: str | None = None
    allow_readable_token_file: bool = False  # else a file others may read is refused
    kernels: str = "auto"  # runtime.kernel_choice: the replicas' choice of contrib or bertfuse ops
    cpu_threads: int | None = None  # each replica's ORT intra-op threads (None: ORT's default)
    # gpus: whole GPUs of this host (N or 'all'), 1/gpus_per_replica replicas on each
    # (gpu_plan.py); None: replicas on as many GPUs as the cluster has
    gpus: int | str | None = None
    token_sha256: str | None = None  # filled by check_config (FILLED), not an argument


FILLED = ("token_sha256",)  # ServeConfig's fields check_config fills: no keyword sets them
ARGUMENTS = tuple(f for f in ServeConfig.__dataclass_fields__ if f not in FILLED)


def _check_number(name: str, value: Any, lo: float, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value < lo or (hi is not None and value > hi):
        span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{name} must be a number {span}, not {value!r}")
    return float(value)


def check_config(model: Any = None, **kwargs: Any) -> ServeConfig:
    """A ServeConfig from keywords, every field checked, the model read (its inputs, outputs
    and positions) and the vocab loaded against it."""
    unknown = sorted(set(kwargs) - set(ARGUMENTS))
    if unknown:
        known = [f for f in ARGUMENTS if f != "model"]
        raise ConfigError(f"unknown argument {unknown[0]!r}; arguments are {', '.join(known)}")
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigError(f"model must be the path of an .onnx file, not {model!r}")
    cfg = ServeConfig(model=os.path.abspath(os.fspath(model)), **kwargs)
    if cfg.replicas is not None:
        check_int("replicas", cfg.replicas, 1, error=ConfigError)
    check_int("max_batch", cfg.max_batch, 1, 4096, error=ConfigError)
    _check_number("max_wait_ms", cfg.max_wait_ms, 0, 10_000)
    _check_number("cpus_per_replica", cfg.cpus_per_replica, 0)
    if cfg.gpus_per_replica is not None \
            and _check_number("gpus_per_replica", cfg.gpus_per_replica, 0, 1) <= 0:
        raise ConfigError("gpus_per_replica must be above 0 (0.5: two replicas share a GPU)")
    check_int("port", cfg.port, 1, 65535, error=ConfigError)
    if cfg.cpu_threads is not None:
        check_int("cpu_threads", cfg.cpu_threads, 1, 1024, error=ConfigError)
    switch_interval_s()  # its environment variable, read by every replica
    if cfg.gpus is not None:
        _check_gpus_option(cfg)
    if cfg.device not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, not {cfg.device!r}")

    check_kernels_option(cfg.kernels)
    if cfg.ingress not in INGRESSES:
        raise ConfigError(f"ingress must be one of {', '.join(INGRESSES)}, not {cfg.ingress!r}")
    if cfg.ingress not in ("auto", "proxy") and cfg.address is not None:
        raise ConfigError(f"ingress {cfg.ingress!r} is switched on when Ray starts: it needs the "
                          "local Ray that bertfuse serve starts (leave out address)")
    for name in ("host", "name", "metrics_host"):
        check_text(name, getattr(cfg, name), error=ConfigError)
    for name in ("address", "vocab", "token_file"):
        if getattr(cfg, name) is not None:
            check_text(name, getattr(cfg, name), error=ConfigError)
    if cfg.lower_case is not None and not isinstance(cfg.lower_case, bool):
        raise ConfigError(f"lower_case must be True, False or None, not {cfg.lower_case!r}")
    buckets = cfg.batch_buckets
    if buckets is not None:
        if isinstance(buckets, str):
            buckets = [_bucket_int(b) for b in buckets.split(",") if b.strip()]
        if not isinstance(buckets, Sequence) or not buckets:
            raise ConfigError(f"batch_buckets must be a list of row counts, not {buckets!r}")
        buckets = tuple(sorted({check_int("each of batch_buckets", b, 1, cfg.max_batch,
                                          " (max_batch)", error=ConfigError) for b in buckets}))
    for flag in ("warmup", "access_log", "allow_readable_token_file"):
        if not isinstance(getattr(cfg, flag), bool):
            raise ConfigError(f"{flag} must be True or False, not {getattr(cfg, flag)!r}")
    facts = model_facts(servable_model(cfg.model))
    check_canonical(facts)
    outputs = _check_outputs(cfg.outputs, facts.outputs)
    positions = facts.max_positions
    max_seq = cfg.max_seq if cfg.max_seq is not None else (positions or 512)
    max_seq = check_int("max_seq", max_seq, 1, positions,
                        f" (the model's position table has {positions} rows)", error=ConfigError)

    vocab = cfg.vocab if cfg.vocab is not None else find_vocab(cfg.model)
    vocab = os.path.abspath(vocab) if vocab is not None else None
    if vocab is not None:
        WordPiece(vocab, lower_case=cfg.lower_case, max_length=max_seq, model=cfg.model)
    return ServeConfig(**{**asdict(cfg), "max_seq": max_seq, "outputs": outputs,
                          "batch_buckets": buckets,
                          "vocab": vocab, "token_sha256": token_sha256(
                              cfg.token_file, cfg.allow_readable_token_file)})


def _check_gpus_option(cfg: ServeConfig) -> None:
    try:
        check_gpus(cfg.gpus)
    except BertfuseError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.replicas is not None:
        raise ConfigError("give gpus or replicas, not both: gpus N places 1/gpus_per_replica "
                          "replicas on each of N GPUs")
    if cfg.device == "cpu":
        raise ConfigError("gpus places the replicas on GPUs; device 'cpu' runs on none (give "
                          "one of them)")
    if cfg.address is not None:
        raise ConfigError("gpus plans this host's GPUs, for the local Ray that bertfuse serve "
                          "starts; on a cluster (address) use replicas")


def replicas_per_gpu(share: float) -> int:
    """Replicas on each GPU at gpus_per_replica `share` (with gpus: it must divide one GPU
    into whole replicas: 1, 0.5, 0.25, ...)."""
    per = max(1, round(1 / share))
    if abs(per * share - 1) > 1e-6:
        raise ConfigError(f"gpus_per_replica {share:g} does not divide a GPU into whole "
                          "replicas; with gpus give 1, 0.5, 0.25, ...")
    return per


def max_ongoing(max_batch: int) -> int:
    """Requests one replica takes at once (Serve's max_ongoing_requests): queued at it,
    batched or running; Serve's router holds the rest until a replica has room. The bound
    of a GPU's queue is this times its replicas."""
    return max(4 * max_batch, 16)


def resolve(cfg: ServeConfig, ingress: str) -> ServeConfig:
    """cfg with ingress 'auto' replaced by `ingress` (ingress.auto_ingress's choice) and
    gpus_per_replica None by its default for that ingress; explicit values stay."""
    concrete = ingress if cfg.ingress == "auto" else cfg.ingress
    share = cfg.gpus_per_replica
    if share is None:
        share = HAPROXY_GPUS_PER_REPLICA if concrete == "haproxy" else 1.0
    return ServeConfig(**{**asdict(cfg), "ingress": concrete, "gpus_per_replica": share})


def _bucket_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"batch_buckets: {text.strip()!r} is not a row count") from None


def _check_outputs(outputs: Any, available: list[str]) -> list[str]:
    if outputs is None:
        return list(available)
    if isinstance(outputs, str):
        outputs = [o for o in outputs.split(",") if o]
    if not isinstance(outputs, Sequence) or not outputs \
            or not all(isinstance(o, str) for o in outputs):
        raise ConfigError(f"outputs must be a list of output names, not {outputs!r}")
    unknown = [o for o in outputs if o not in available]
    if unknown:
        raise ConfigError(f"the model has no output {unknown[0]!r}; it has "
                          f"{', '.join(available)}")
    return list(dict.fromkeys(outputs))
