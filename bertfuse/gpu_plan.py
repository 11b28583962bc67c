"""Which GPUs of this host `bertfuse serve --gpus` and `bertfuse score --gpus` use, and what
runs on each: a `GpuPlan`, made from a device list by pure functions. The readers of the
host (nvidia-smi, sysfs, the environment) sit apart and take their sources as arguments, so
tests hand them fake ones. No Ray here; serve/ and score/ turn a plan into Ray resources.

    --gpus N|all                          ─► check_gpus: N >= 1, or 'all'
    nvidia-smi's rows (index, uuid, bus)  ─► visible_gpus: the devices CUDA numbers 0..n-1
      + CUDA_VISIBLE_DEVICES (indices,       in this process, in that order (the variable
        UUIDs or their unique prefixes)      read as CUDA reads it: up to its first entry
                                             that names no device)
      + /sys/bus/pci/devices/BUS/numa_node   each one's NUMA node and that node's CPUs
    make_plan(count, visible, per_gpu)    ─► GpuPlan: the first `count` visible GPUs, each
                                             with per_gpu replicas (score: one actor)

One replica (or actor) is one process on one GPU with one CUDA context: Ray gives a replica
that asks for num_gpus > 0 its GPU by setting CUDA_VISIBLE_DEVICES in its process to that
one device (ray/_private/accelerators/nvidia_gpu.py,
set_current_process_visible_accelerator_ids), so inside it the device is CUDA's device 0.
Ray maps its GPU slots onto the CUDA_VISIBLE_DEVICES it started with, in order
(ray/_private/worker.py, get_accelerator_ids_for_accelerator_resource): a local Ray started
with num_gpus=count uses exactly the plan's GPUs, the first `count` visible.

Pinning: where the host has more than one NUMA node and every planned GPU's node is known,
a replica keeps its threads on its GPU's node (`pin_to_gpu`), so the page-locked staging
buffers it allocates are first touched, and so placed, there; on a host of one NUMA node (or
where sysfs does not say) nothing is pinned, and `pinned` says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from bertfuse.errors import BertfuseError

ALL = "all"
SMI_QUERY = ("--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader")


@dataclass(frozen=True)
class Gpu:
    """One device. id: as CUDA_VISIBLE_DEVICES names it to Ray (the host's index, or the
    UUID when the variable named UUIDs); numa_node None: not known (sysfs says -1 or
    nothing); cpus: that node's CPUs (empty where not known)."""

    index: int  # its host index (nvidia-smi's)
    uuid: str
    bus_id: str | None
    id: str
    numa_node: int | None = None
    cpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuPlan:
    """gpus: the GPUs used, in CUDA's order; per_gpu: replicas on each (score: 1 actor);
    numa_nodes: the host's; pinned: each replica's threads kept on its GPU's NUMA node."""

    gpus: tuple[Gpu, ...]
    per_gpu: int
    numa_nodes: int
    pinned: bool

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def replicas(self) -> int:
        return self.count * self.per_gpu

    def cpus_for(self, visible: str | None) -> tuple[int, ...]:
        """The CPUs a process whose CUDA_VISIBLE_DEVICES is `visible` (one device, as Ray
        sets it) keeps its threads on: () where nothing is pinned or the device is not in
        the plan."""
        if not self.pinned or not visible:
            return ()
        first = visible.split(",")[0].strip()
        for g in self.gpus:
            if first in (g.id, str(g.index), g.uuid):
                return g.cpus
        return ()

    def to_json(self) -> dict:
        """The report's `gpus`: count, per_gpu, numa_nodes, pinned, and each device."""
        return {"count": self.count, "per_gpu": self.per_gpu, "numa_nodes": self.numa_nodes,
                "pinned": self.pinned,
                "devices": [{k: v for k, v in asdict(g).items() if k != "cpus"}
                            | {"cpus": len(g.cpus)} for g in self.gpus]}


def check_gpus(value: object, name: str = "gpus") -> int | str:
    """A whole number of GPUs >= 1, or 'all' (a str of either is read)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == ALL:
            return ALL
        try:
            value = int(text)
        except ValueError:
            raise BertfuseError(f"{name} must be a whole number of GPUs (1 or more) or "
                                f"'all', not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BertfuseError(f"{name} must be a whole number of GPUs (1 or more) or 'all', "
                            f"not {value!r}")
    return value


def parse_smi(text: str) -> list[tuple[int, str, str]]:
    """nvidia-smi's `--query-gpu=index,uuid,pci.bus_id --format=csv,noheader` rows."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 and cells[0].isdigit():
            rows.append((int(cells[0]), cells[1], cells[2]))
    return rows


def read_smi() -> list[tuple[int, str, str]]:
    """This host's GPUs from nvidia-smi (every GPU: it ignores CUDA_VISIBLE_DEVICES); none
    without the tool or a driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        ran = subprocess.run([exe, *SMI_QUERY], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_smi(ran.stdout) if ran.returncode == 0 else []


def sysfs_bus_id(bus_id: str) -> str:
    """nvidia-smi's '00000000:17:00.0' as sysfs names it: '0000:17:00.0'."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def parse_cpulist(text: str) -> tuple[int, ...]:
    """sysfs's '0-3,8-11' -> (0, 1, 2, 3, 8, 9, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


def numa_nodes(sysfs: str = "/sys") -> dict[int, tuple[int, ...]]:
    """The host's NUMA nodes and their CPUs ({}: sysfs does not say)."""
    nodes = {}
    for d in sorted(Path(sysfs, "devices/system/node").glob("node[0-9]*")):
        try:
            nodes[int(d.name[4:])] = parse_cpulist((d / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    return nodes


def _numa_node(bus_id: str | None, sysfs: str) -> int | None:
    if not bus_id:
        return None
    try:
        node = int(Path(sysfs, "bus/pci/devices", sysfs_bus_id(bus_id), "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def visible_gpus(rows: list[tuple[int, str, str]], visible: str | None,
                 sysfs: str = "/sys") -> list[Gpu]:
    """The GPUs this process's CUDA sees, in its order: `rows` (nvidia-smi's) filtered and
    ordered by `visible` (CUDA_VISIBLE_DEVICES; None: every row). As CUDA does, the list is
    read up to its first entry that names no device (an index not on the host, a UUID
    prefix that matches none or several); '' or '-1' leaves none. A MIG device is refused:
    --gpus plans whole GPUs."""
    nodes = numa_nodes(sysfs)

    def gpu(row: tuple[int, str, str], id: str) -> Gpu:
        node = _numa_node(row[2], sysfs)
        return Gpu(row[0], row[1], row[2] or None, id, node, nodes.get(node, ()))

    if visible is None:
        return [gpu(r, str(r[0])) for r in sorted(rows)]
    found: list[Gpu] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.startswith("MIG-"):
            raise BertfuseError(f"CUDA_VISIBLE_DEVICES names a MIG device ({entry}): gpus "
                                "plans whole GPUs (leave gpus out and use gpus_per_replica)")
        if entry.isdigit():
            match = [r for r in rows if r[0] == int(entry)]
        elif entry.startswith("GPU-"):
            match = [r for r in rows if r[1].startswith(entry)]
        else:
            match = []
        if len(match) != 1 or any(g.index == match[0][0] for g in found):
            break
        found.append(gpu(match[0], entry))
    return found


def make_plan(count: int | str, visible: list[Gpu], per_gpu: int = 1,
              nodes: int = 1) -> GpuPlan:
    """The first `count` ('all': every one) of `visible` with per_gpu replicas each; pinned
    where `nodes` (the host's NUMA nodes) > 1 and every planned GPU's node and CPUs are
    known."""
    where = _where()
    if not visible:
        raise BertfuseError(f"gpus {count}: this host has no GPU that CUDA sees{where}")
    n = len(visible) if count == ALL else count
    if n > len(visible):
        raise BertfuseError(f"gpus {n}: this host has {len(visible)} GPU"
                            f"{'s' if len(visible) != 1 else ''} that CUDA sees{where}")
    chosen = tuple(visible[:n])
    pinned = nodes > 1 and all(g.numa_node is not None and g.cpus for g in chosen)
    return GpuPlan(chosen, per_gpu, nodes, pinned)


def _where() -> str:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f" (CUDA_VISIBLE_DEVICES={value!r})" if value is not None else " (nvidia-smi -L)"


def host_plan(gpus: object, device: str, address: str | None, per_gpu: int = 1,
              rows: list[tuple[int, str, str]] | None = None,
              sysfs: str = "/sys") -> GpuPlan | None:
    """The plan for the option `gpus` (None: no plan) on this host: refused with device
    'cpu', and on a cluster joined with an address (the plan is of this host's GPUs)."""
    if gpus is None:
        return None
    count = check_gpus(gpus)
    if device == "cpu":
        raise BertfuseError("gpus places the work on GPUs; device 'cpu' runs on none (give "
                            "one of them)")
    if address is not None:
        raise BertfuseError("gpus plans this host's GPUs, for the local Ray that bertfuse "
                            "starts; on a cluster (address) leave it out")
    found = visible_gpus(read_smi() if rows is None else rows,
                         os.environ.get("CUDA_VISIBLE_DEVICES"), sysfs)
    return make_plan(count, found, per_gpu, len(numa_nodes(sysfs)))


def pin_to_gpu(plan: GpuPlan | None) -> tuple[int, ...]:
    """Keeps every thread of this process (those started later inherit it) on the CPUs of
    its GPU's NUMA node, where the plan pins; the CPUs, or () where nothing was pinned."""
    cpus = plan.cpus_for(os.environ.get("CUDA_VISIBLE_DEVICES")) if plan else ()
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return ()
    for thread in psutil.Process().threads():  # the affinity of a Linux thread is its own
        try:
            os.sched_setaffinity(thread.id, cpus)
        except OSError:  # a thread that ended meanwhile
            continue
    return cpus
