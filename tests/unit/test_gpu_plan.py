"""The GPU plan of `serve --gpus` and `score --gpus` (bertfuse/gpu_plan.py) from fake device
lists: nvidia-smi's rows, CUDA_VISIBLE_DEVICES in its index and UUID forms, and a fake sysfs
for the NUMA nodes; then the plan's mapping into Ray resources for serve and score."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from bertfuse.errors import BertfuseError
from bertfuse.gpu_plan import (ALL, GpuPlan, check_gpus, host_plan, make_plan, numa_nodes,
                               parse_cpulist, parse_smi, pin_to_gpu, sysfs_bus_id,
                               visible_gpus)

SMI = """\
0, GPU-aaaa1111-0000-0000-0000-000000000000, 00000000:17:00.0
1, GPU-bbbb2222-0000-0000-0000-000000000000, 00000000:2A:00.0
2, GPU-cccc3333-0000-0000-0000-000000000000, 00000000:9B:00.0
3, GPU-cccc4444-0000-0000-0000-000000000000, 00000000:C3:00.0
"""
ROWS = parse_smi(SMI)


def fake_sysfs(root: Path, nodes: dict[int, str], gpu_nodes: dict[str, int]) -> str:
    """/sys as far as gpu_plan reads it: NUMA nodes' cpulists, each PCI device's numa_node."""
    for node, cpulist in nodes.items():
        d = root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    for bus, node in gpu_nodes.items():
        d = root / "bus/pci/devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    return str(root)


@pytest.fixture
def two_nodes(tmp_path) -> str:
    return fake_sysfs(tmp_path, {0: "0-3,8-11", 1: "4-7,12-15"},
                      {"0000:17:00.0": 0, "0000:2a:00.0": 0, "0000:9b:00.0": 1,
                       "0000:c3:00.0": 1})


@pytest.fixture
def one_node(tmp_path) -> str:
    return fake_sysfs(tmp_path, {0: "0-7"}, {"0000:17:00.0": -1, "0000:2a:00.0": -1})


def test_the_option_takes_a_whole_count_or_all():
    assert check_gpus("2") == 2 and check_gpus(" ALL ") == ALL and check_gpus(8) == 8
    for bad in ("0", "-1", "1.5", "two", "", 0, True, 2.0, None):
        with pytest.raises(BertfuseError, match="whole number of GPUs"):
            check_gpus(bad)


def test_smi_rows_and_sysfs_names():
    assert [r[0] for r in ROWS] == [0, 1, 2, 3]
    assert ROWS[1] == (1, "GPU-bbbb2222-0000-0000-0000-000000000000", "00000000:2A:00.0")
    assert parse_smi("No devices were found\n") == []
    assert sysfs_bus_id("00000000:2A:00.0") == "0000:2a:00.0"
    assert parse_cpulist("0-3,8-9,12\n") == (0, 1, 2, 3, 8, 9, 12)


def test_every_gpu_is_visible_without_the_variable(two_nodes):
    gpus = visible_gpus(ROWS, None, two_nodes)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    assert gpus[2].cpus == (4, 5, 6, 7, 12, 13, 14, 15)


def test_cuda_visible_devices_picks_and_orders(two_nodes):
    gpus = visible_gpus(ROWS, "3,1", two_nodes)
    assert [(g.index, g.id) for g in gpus] == [(3, "3"), (1, "1")]


def test_cuda_visible_devices_by_uuid_and_unique_prefix(two_nodes):
    gpus = visible_gpus(ROWS, "GPU-bbbb2222-0000-0000-0000-000000000000,GPU-cccc4", two_nodes)
    assert [(g.index, g.id) for g in gpus] == [
        (1, "GPU-bbbb2222-0000-0000-0000-000000000000"), (3, "GPU-cccc4")]


def test_cuda_visible_devices_is_read_up_to_its_first_bad_entry(two_nodes):
    assert [g.index for g in visible_gpus(ROWS, "2,7,0", two_nodes)] == [2]  # 7: no device
    assert [g.index for g in visible_gpus(ROWS, "0,GPU-cccc", two_nodes)] == [0]  # ambiguous
    assert [g.index for g in visible_gpus(ROWS, "1,1,2", two_nodes)] == [1]  # repeated
    assert visible_gpus(ROWS, "", two_nodes) == [] and visible_gpus(ROWS, "-1", two_nodes) == []


def test_a_mig_device_is_refused(two_nodes):
    with pytest.raises(BertfuseError, match="MIG"):
        visible_gpus(ROWS, "MIG-0123", two_nodes)


def test_fewer_than_visible_takes_the_first(two_nodes):
    plan = make_plan(2, visible_gpus(ROWS, None, two_nodes), 1, len(numa_nodes(two_nodes)))
    assert [g.index for g in plan.gpus] == [0, 1] and plan.count == 2 and plan.replicas == 2


def test_as_many_as_visible_and_all_take_every_one(two_nodes):
    visible = visible_gpus(ROWS, None, two_nodes)
    assert make_plan(4, visible).count == make_plan(ALL, visible).count == 4


def test_more_than_visible_is_refused_naming_the_count(two_nodes, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(BertfuseError, match=r"gpus 3: this host has 2 GPUs that CUDA sees "
                                            r"\(CUDA_VISIBLE_DEVICES='0,1'\)"):
        make_plan(3, visible_gpus(ROWS, "0,1", two_nodes))


def test_no_gpu_is_refused(tmp_path):
    with pytest.raises(BertfuseError, match="no GPU that CUDA sees"):
        make_plan(ALL, visible_gpus([], None, str(tmp_path)))


def test_two_numa_nodes_pin_each_gpu_to_its_own(two_nodes):
    plan = make_plan(ALL, visible_gpus(ROWS, None, two_nodes), 4, len(numa_nodes(two_nodes)))
    assert plan.pinned and plan.numa_nodes == 2 and plan.replicas == 16
    assert plan.cpus_for("2") == (4, 5, 6, 7, 12, 13, 14, 15)
    assert plan.cpus_for("0") == (0, 1, 2, 3, 8, 9, 10, 11)
    assert plan.cpus_for("GPU-bbbb2222-0000-0000-0000-000000000000") == plan.cpus_for("1")
    assert plan.cpus_for("5") == () and plan.cpus_for(None) == ()


def test_one_numa_node_pins_nothing(one_node):
    plan = make_plan(ALL, visible_gpus(ROWS[:2], None, one_node), 1, len(numa_nodes(one_node)))
    assert not plan.pinned and plan.cpus_for("0") == ()
    assert [g.numa_node for g in plan.gpus] == [None, None]  # sysfs's -1


def test_an_unknown_node_pins_nothing(two_nodes, tmp_path):
    sysfs = fake_sysfs(tmp_path / "other", {0: "0-3", 1: "4-7"}, {"0000:17:00.0": 0})
    plan = make_plan(2, visible_gpus(ROWS, None, sysfs), 1, 2)  # GPU 1: no numa_node file
    assert not plan.pinned


def test_the_report_form(two_nodes):
    plan = make_plan(1, visible_gpus(ROWS, "2", two_nodes), 4, 2)
    assert plan.to_json() == {"count": 1, "per_gpu": 4, "numa_nodes": 2, "pinned": True,
                              "devices": [{"index": 2, "uuid": ROWS[2][1],
                                           "bus_id": "00000000:9B:00.0", "id": "2",
                                           "numa_node": 1, "cpus": 8}]}


def test_host_plan_refusals(two_nodes, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert host_plan(None, "auto", None, rows=ROWS, sysfs=two_nodes) is None
    with pytest.raises(BertfuseError, match="device 'cpu'"):
        host_plan(1, "cpu", None, rows=ROWS, sysfs=two_nodes)
    with pytest.raises(BertfuseError, match="address"):
        host_plan(1, "auto", "auto", rows=ROWS, sysfs=two_nodes)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc3333,0")
    plan = host_plan("all", "cuda", None, 2, rows=ROWS, sysfs=two_nodes)
    assert [g.index for g in plan.gpus] == [2, 0] and plan.per_gpu == 2 and plan.pinned


def test_pinning_sets_this_process_affinity(two_nodes, monkeypatch):
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity here")
    mine = sorted(os.sched_getaffinity(0))
    fake = make_plan(1, visible_gpus(ROWS, None, two_nodes), 1, 2)
    # a plan whose GPU's node holds only this process's first CPU
    plan = GpuPlan((fake.gpus[0].__class__(**{**fake.gpus[0].__dict__, "cpus": (mine[0],)}),),
                   1, 2, True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    try:
        assert pin_to_gpu(plan) == (mine[0],)
        assert os.sched_getaffinity(0) == {mine[0]}
    finally:
        for thread in psutil.Process().threads():
            try:
                os.sched_setaffinity(thread.id, mine)
            except OSError:
                pass
    assert pin_to_gpu(None) == () and pin_to_gpu(make_plan(1, fake.gpus, 1, 1)) == ()


# -- the plan in Ray's terms ---------------------------------------------------------------------

def fake_ray(gpus: float, cpus: float) -> SimpleNamespace:
    return SimpleNamespace(cluster_resources=lambda: {"GPU": gpus, "CPU": cpus})


def test_serve_places_per_gpu_replicas_of_a_share_each(two_nodes, monkeypatch, tmp_path):
    from bertfuse.serve import api
    from bertfuse.serve.config import ServeConfig

    plan = make_plan(2, visible_gpus(ROWS, None, two_nodes), 4, 2)
    monkeypatch.setattr(api, "optional", lambda *a, **k: fake_ray(2, 16))
    cfg = ServeConfig(model="m.onnx", gpus=2, gpus_per_replica=0.25, cpus_per_replica=1.0)
    assert api._placement(cfg, plan) == ("cuda", 8, {"num_gpus": 0.25, "num_cpus": 1.0})
    # a Ray run before, with more GPUs than the plan: the plan's count holds
    monkeypatch.setattr(api, "optional", lambda *a, **k: fake_ray(8, 64))
    assert api._placement(cfg, plan)[1] == 8
    monkeypatch.setattr(api, "optional", lambda *a, **k: fake_ray(1, 64))
    with pytest.raises(BertfuseError, match="gpus 2: the Ray cluster has 1 GPUs"):
        api._placement(cfg, plan)
    monkeypatch.setattr(api, "optional", lambda *a, **k: fake_ray(2, 4))  # 8 need 8 CPUs
    with pytest.raises(BertfuseError, match="need 2 GPUs and 8 CPUs"):
        api._placement(cfg, plan)


def test_serve_whole_gpus_give_one_replica_each(two_nodes, monkeypatch):
    from bertfuse.serve import api
    from bertfuse.serve.config import ServeConfig, replicas_per_gpu

    assert replicas_per_gpu(1.0) == 1 and replicas_per_gpu(0.25) == 4
    plan = make_plan(ALL, visible_gpus(ROWS, None, two_nodes), replicas_per_gpu(1.0), 2)
    monkeypatch.setattr(api, "optional", lambda *a, **k: fake_ray(4, 16))
    cfg = ServeConfig(model="m.onnx", gpus="all", gpus_per_replica=1.0)
    assert api._placement(cfg, plan) == ("cuda", 4, {"num_gpus": 1.0, "num_cpus": 1.0})


def test_serve_refuses_a_share_that_does_not_divide_a_gpu():
    from bertfuse.runtime.request_checks import ConfigError
    from bertfuse.serve.config import replicas_per_gpu

    with pytest.raises(ConfigError, match="gpus_per_replica 0.3 does not divide"):
        replicas_per_gpu(0.3)


def test_score_places_an_actor_on_each_planned_gpu(two_nodes):
    from bertfuse.score.placement import place_actors

    plan = make_plan(2, visible_gpus(ROWS, None, two_nodes), 1, 2)
    job = SimpleNamespace(gpus=plan, device="auto", actors=None)
    assert place_actors(job, fake_ray(2, 16)) == ("cuda", 2)
    assert place_actors(job, fake_ray(8, 16)) == ("cuda", 2)  # a larger Ray: the plan's two
    with pytest.raises(BertfuseError, match="gpus 2: the Ray cluster has 1 GPUs"):
        place_actors(job, fake_ray(1, 16))
    with pytest.raises(BertfuseError, match="2 actors need a CPU each and reading one more"):
        place_actors(job, fake_ray(2, 2))
    without = SimpleNamespace(gpus=None, device="auto", actors=None)
    assert place_actors(without, fake_ray(4, 16)) == ("cuda", 4)  # unchanged without gpus
