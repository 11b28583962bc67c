"""Where a job's actors go on the Ray cluster: the device and how many, from the job's options
and the cluster's resources (a GPU each on CUDA; with `gpus`, one actor on each GPU of the
job's plan, gpu_plan.py). No Ray import: the caller hands its `ray` in."""

from __future__ import annotations

from typing import Any

from bertfuse.errors import BertfuseError
from bertfuse.score.spec import ScoreJob


def place_actors(job: ScoreJob, ray: Any) -> tuple[str, int]:
    """(device, actors): a GPU per actor where the cluster has GPUs, else CPU actors; with
    gpus' plan, an actor on each of its GPUs."""
    res = ray.cluster_resources()
    gpus, cpus = int(res.get("GPU", 0)), int(res.get("CPU", 0))
    if job.gpus is not None:
        if gpus < job.gpus.count:  # a Ray this process already ran, with fewer GPUs
            raise BertfuseError(f"gpus {job.gpus.count}: the Ray cluster has {gpus} GPUs")
        gpus = job.gpus.count
    device = job.device if job.device != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        raise BertfuseError("device cuda, but the Ray cluster has no GPU")
    actors = job.actors or (gpus if device == "cuda" else max(1, (cpus - 1) // 2))
    if device == "cuda" and actors > gpus:
        raise BertfuseError(f"{actors} actors need a GPU each; the Ray cluster has {gpus}")
    if actors + 1 > cpus:  # each actor holds a CPU; reading the input needs one more
        raise BertfuseError(f"{actors} actors need a CPU each and reading one more; the Ray "
                            f"cluster has {cpus} CPUs")
    return device, actors
