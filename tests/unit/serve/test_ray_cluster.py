"""bertfuse/ray_cluster.py, shared by serve and score, without starting Ray: a stand-in `ray`
module records what ray.init was given and, like the real one, replaces SIGTERM's handler. The
real bring-up runs in test_serve.py and test_score.py."""

from __future__ import annotations

import signal
import socket
import sys
import types

import pytest

from bertfuse import ray_cluster
from bertfuse.errors import BertfuseError


class FakeRay(types.ModuleType):
    def __init__(self, running: bool = False, fail: Exception | None = None) -> None:
        super().__init__("ray")
        self.running, self.fail, self.inits, self.shutdowns = running, fail, [], 0

    def is_initialized(self) -> bool:
        return self.running

    def init(self, **kwargs) -> None:
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))  # as ray.init does in a driver
        self.inits.append(kwargs)
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
    assert ray_cluster.connect(None, logging_level=30) is True
    assert fake.inits == [{"address": "local", "include_dashboard": False, "log_to_driver": False,
                           "logging_level": 30}]
    assert signal.getsignal(signal.SIGTERM) is ours


def test_connect_joins_auto_without_a_probe(monkeypatch, ours):
    fake = _fake(monkeypatch)
    assert ray_cluster.connect("auto") is False
    assert fake.inits == [{"address": "auto", "log_to_driver": False}]


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
