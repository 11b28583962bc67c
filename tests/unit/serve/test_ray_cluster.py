"""bertfuse/ray_cluster.py, shared by serve and score, without starting Ray: a stand-in `ray`
module records what ray.init was given and, like the real one, replaces SIGTERM's handler. The
real bring-up runs in test_serve.py and test_score.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import types

import pytest

from bertfuse import ray_cluster
from bertfuse.errors import BertfuseError
from support.paths import ROOT
from support.processes import alive


class FakeRay(types.ModuleType):
    def __init__(self, running: bool = False, fail: Exception | None = None) -> None:
        super().__init__("ray")
        self.running, self.fail, self.inits, self.shutdowns = running, fail, [], 0

    def is_initialized(self) -> bool:
        return self.running

    def init(self, **kwargs) -> None:
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))  # as ray.init does in a driver
        self.inits.append({**kwargs, "single_machine": os.environ.get(
            ray_cluster.SINGLE_MACHINE_ENV)})
        if self.fail is not None:
            raise self.fail
        self.running = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.running = False


@pytest.fixture
def ours():
    """A handler of ours (the CLI's, say) on SIGTERM for the test; the old one put back after."""
    def handler(*a):
        pass
    saved = signal.signal(signal.SIGTERM, handler)
    yield handler
    signal.signal(signal.SIGTERM, saved)


def _fake(monkeypatch, **kw) -> FakeRay:
    fake = FakeRay(**kw)
    monkeypatch.setitem(sys.modules, "ray", fake)
    return fake


def test_connect_starts_a_local_ray_and_keeps_our_handler(monkeypatch, ours):
    fake = _fake(monkeypatch)
    try:
        assert ray_cluster.connect(None, logging_level=30) is True
    finally:
        ray_cluster.disconnect()  # and its watchdog
    # the node on the loopback: Ray's metrics and agent ports bind to the node's address
    assert fake.inits == [{"address": "local", "include_dashboard": False, "log_to_driver": False,
                           "logging_level": 30, "single_machine": "0"}]
    assert signal.getsignal(signal.SIGTERM) is ours
    assert ray_cluster.connect(None, metrics_host="0.0.0.0") is True
    ray_cluster.disconnect()
    assert fake.inits[-1]["single_machine"] is None  # asked for: Ray's own choice


def test_the_watchdog_stops_what_its_owner_left_when_the_owner_dies(tmp_path):
    """The owner (a child here) killed with -9: its child (a stand-in for a Ray process) is
    stopped and the leftover folder removed; an owner that closes its watchdog keeps both."""
    left = tmp_path / "scratch"
    for clean in (False, True):
        left.mkdir(exist_ok=True)
        code = ("import subprocess, sys, time\n"
                "from bertfuse import ray_cluster\n"
                f"w = ray_cluster.Watchdog(({str(left)!r},))\n"
                "c = subprocess.Popen(['sleep', '60'])\n"
                "print(c.pid, flush=True)\n"
                "time.sleep(2 * ray_cluster.WATCH_S + 0.5)\n"
                f"{'w.close()' if clean else ''}\n"
                "print('ready', flush=True)\n"
                "time.sleep(60)\n")
        owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 text=True, cwd=ROOT)
        child = int(owner.stdout.readline())
        assert owner.stdout.readline().strip() == "ready"
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 10
        while (alive({child}) or left.exists()) and not clean and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bool(alive({child})) is clean and left.exists() is clean
        if clean:
            os.kill(child, signal.SIGKILL)


def test_connect_joins_auto_without_a_probe(monkeypatch, ours):
    fake = _fake(monkeypatch)
    assert ray_cluster.connect("auto") is False
    assert fake.inits == [{"address": "auto", "log_to_driver": False, "single_machine": None}]


def test_unreachable_or_malformed_address_is_one_line_before_ray(monkeypatch, ours):
    fake = _fake(monkeypatch)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    with pytest.raises(BertfuseError, match=f"cannot reach a Ray cluster at 127.0.0.1:{port}"):
        ray_cluster.connect(f"127.0.0.1:{port}")
    with pytest.raises(BertfuseError, match="HOST:PORT, not 'head'"):
        ray_cluster.connect("head")
    assert fake.inits == []


def test_a_failed_init_is_one_line_and_restores_the_handler(monkeypatch, ours):
    _fake(monkeypatch, fail=ConnectionError("boom\nConnectionError: no GCS at ray://x:1"))
    with pytest.raises(BertfuseError, match="cannot join the Ray cluster at ray://x:1: "
                                            "ConnectionError: no GCS"):
        ray_cluster.connect("ray://x:1")
    assert signal.getsignal(signal.SIGTERM) is ours
    _fake(monkeypatch, fail=RuntimeError("no room"))
    with pytest.raises(BertfuseError, match="cannot start a local Ray: no room"):
        ray_cluster.connect(None)


def test_ray_for_shuts_down_only_what_it_started(monkeypatch, ours):
    fake = _fake(monkeypatch, running=True)
    with ray_cluster.ray_for(None) as mine:
        assert mine is False
    assert fake.inits == [] and fake.shutdowns == 0  # the caller's Ray: left running
    fake = _fake(monkeypatch)
    with pytest.raises(KeyError):
        with ray_cluster.ray_for(None) as mine:
            assert mine is True and fake.running
            raise KeyError("job failed")
    assert fake.shutdowns == 1 and not fake.running


def test_first_line_prefers_the_error_line():
    assert ray_cluster.first_line(RuntimeError("a\n  b\nValueError: c\n")) == "ValueError: c"
    assert ray_cluster.first_line(RuntimeError("\n just this \n")) == "just this"
    assert ray_cluster.first_line(RuntimeError("")) == "RuntimeError"
