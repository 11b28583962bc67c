"""What one Serve replica (app.BertfuseReplica) is built from: a `ReplicaConfig`, made by
`replica_config()` from a checked and resolved ServeConfig plus what placement chose (the
device, the replica count) and the deployment's statistics key. Every field is named and
typed, and checked against its annotation once, when it is made. Frozen plain data: Ray
ships it to each replica's worker with cloudpickle, by reference to this class (the workers
import bertfuse). No Ray here."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, fields

from bertfuse.gpu_plan import GpuPlan
from bertfuse.serve.config import INGRESSES, ServeConfig, max_ongoing

REPLICA_DEVICES = ("cuda", "cpu")  # placement's choice: never 'auto'


@dataclass(frozen=True)
class ReplicaConfig:
    """One replica's settings. device: 'cuda' or 'cpu'; ingress: the one in use (never
    'auto'); max_seq: the checked one (never None); outputs: the served outputs, in order;
    batch_buckets None: the runtime's; token_sha256 None: no token; run: this deployment's
    key for the statistics its replicas share (Ray's key-value store); max_ongoing_requests:
    the requests it takes at once (its queue's bound; a GPU's is this times its replicas);
    gpus: the plan of `gpus` (gpu_plan.py: the replica pins its threads to its GPU's NUMA
    node where the plan says), None where gpus was not given."""

    model: str
    name: str
    host: str
    device: str
    replicas: int
    max_batch: int
    max_seq: int
    max_wait_ms: float
    batch_buckets: tuple[int, ...] | None
    outputs: tuple[str, ...]
    vocab: str | None
    lower_case: bool | None
    kernels: str
    cpu_threads: int | None
    warmup: bool
    ingress: str
    token_sha256: str | None
    run: str
    max_ongoing_requests: int = 16
    gpus: GpuPlan | None = None

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(ReplicaConfig)
        for f in fields(self):
            value = getattr(self, f.name)
            if not _fits(value, hints[f.name]):
                raise TypeError(f"ReplicaConfig.{f.name} must be {f.type}, not {value!r}")
        if self.device not in REPLICA_DEVICES:
            raise ValueError(f"ReplicaConfig.device must be one of {REPLICA_DEVICES}, not "
                             f"{self.device!r} (placement resolves 'auto')")
        if self.ingress not in INGRESSES[1:]:
            raise ValueError(f"ReplicaConfig.ingress must be one of {INGRESSES[1:]}, not "
                             f"{self.ingress!r} (config.resolve decides 'auto')")
        if min(self.replicas, self.max_batch, self.max_seq) < 1 or not self.outputs \
                or not self.run:
            raise ValueError(f"ReplicaConfig needs replicas, max_batch and max_seq of 1 or more, "
                             f"outputs and a run key: {self!r}")


def _fits(value: object, hint: object) -> bool:
    """value is of the annotation `hint` (the few forms ReplicaConfig's fields use: a class,
    X | None, tuple[X, ...]); a bool is no int, an int is a float (the numeric tower)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if origin is tuple:
        return isinstance(value, tuple) and all(_fits(v, typing.get_args(hint)[0]) for v in value)
    if hint is type(None):
        return value is None
    if isinstance(value, bool):
        return hint is bool
    return isinstance(value, int if hint is int else (int, float) if hint is float else hint)


def replica_config(cfg: ServeConfig, device: str, replicas: int, run: str,
                   gpus: GpuPlan | None = None) -> ReplicaConfig:
    """A replica's settings from cfg (check_config's, then resolve's) and placement's device,
    replica count and GPU plan; run: the deployment's statistics key. check_config took any integral
    or real number (NumPy's too): here they become Python's int and float."""
    wait = cfg.max_wait_ms
    return ReplicaConfig(
        model=cfg.model, name=cfg.name, host=cfg.host, device=device, replicas=replicas,
        max_batch=int(cfg.max_batch), max_seq=int(cfg.max_seq),
        max_wait_ms=wait if type(wait) in (int, float) else float(wait),
        batch_buckets=None if cfg.batch_buckets is None else tuple(cfg.batch_buckets),
        outputs=tuple(cfg.outputs), vocab=cfg.vocab, lower_case=cfg.lower_case,
        kernels=cfg.kernels, cpu_threads=None if cfg.cpu_threads is None
        else int(cfg.cpu_threads), warmup=cfg.warmup, ingress=cfg.ingress,
        token_sha256=cfg.token_sha256, run=run,
        max_ongoing_requests=max_ongoing(int(cfg.max_batch)), gpus=gpus)
