"""The torch.compile peer of `bertfuse bench` (bench/compiled_peer.py): a row like the other
peers, what it says where it cannot run, and every "x best peer" ratio taking it when it is the
fastest. Compiling and timing it needs a CUDA GPU (benchmarks/kernels/peer_check.sh)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from bertfuse.bench import compiled_peer, peers  # noqa: E402
from bertfuse.bench.forms import CONTRIB_DEFAULT, KERNELS_ROWS, format_comparison  # noqa: E402
from bertfuse.bench.padded import Result, format_table  # noqa: E402
from bertfuse.io.inputs import padded_request  # noqa: E402

W = "shenma-3l b20 s64"


def _rows(compiled_p50: float = 261.0, compiled_note: str = "") -> list[Result]:
    kernels = KERNELS_ROWS[0][0]
    return [Result(W, "ORT raw fp32", 2000.0, 2100.0, 10000.0, 0.0, 0.0),
            Result(W, CONTRIB_DEFAULT, 300.0, 360.0, 66667.0, 1.3e-2, 6e-4, gpu_us=230.0),
            Result(W, kernels, 212.0, 240.0, 94340.0, 1.1e-2, 5e-4, gpu_us=176.0),
            Result(W, peers.ORT_PEER, 330.0, 360.0, 60606.0, 4e-3, 3e-4),
            Result(W, peers.TORCH_PEER, 281.0, 300.0, 71174.0, 4e-3, 3e-4),
            Result(W, peers.COMPILED_PEER, compiled_p50, 270.0, 76628.0, 5e-3, 3e-4,
                   note=compiled_note),
            Result("base b1 s128", peers.COMPILED_PEER,
                   note="failed: torch.compile on CUDA needs triton (not installed)"),
            Result("base b1 s128", peers.TORCH_PEER, 656.0, 700.0, 1524.0, 4e-3, 3e-4)]


def test_the_fastest_peer_of_the_run_is_the_compiled_one_where_it_is_fastest():
    results = _rows()
    assert peers.COMPILED_PEER in peers.PEER_ROWS
    assert peers.best_peers(results) == {
        W: {"variant": peers.COMPILED_PEER, "p50_us": 261.0},
        "base b1 s128": {"variant": peers.TORCH_PEER, "p50_us": 656.0}}  # a failed row: no p50
    assert peers.best_peer(results, W) == 261.0
    table = [[c.strip() for c in ln.strip("|").split("|")]
             for ln in format_table(results).splitlines()[2:]]
    by_variant = {(r[0], r[1]): r for r in table}
    assert by_variant[(W, KERNELS_ROWS[0][0])][6] == "0.81"  # 212 / 261, not 212 / 281
    assert by_variant[(W, peers.TORCH_PEER)][6] == "1.08"
    assert by_variant[(W, peers.COMPILED_PEER)][6] == "1.00"
    comparison = [[c.strip() for c in ln.strip("|").split("|")]
                  for ln in format_comparison(results).splitlines()[2:]]
    rows = {r[1]: r for r in comparison if r[0] == W}
    assert rows[peers.COMPILED_PEER][10] == "1.00" and rows[KERNELS_ROWS[0][0]][10] == "0.81"
    assert ["base b1 s128", peers.COMPILED_PEER,
            "failed: torch.compile on CUDA needs triton (not installed)"] in comparison
    # slower than torch SDPA: the SDPA row stays the best
    assert peers.best_peers(_rows(compiled_p50=290.0))[W]["variant"] == peers.TORCH_PEER


def test_the_compiled_peer_says_why_it_cannot_run_here():
    """Without torch (this host), triton or CUDA, the row is a note naming what is missing,
    beside the other peers' rows; the rest of the run goes on."""
    feeds = padded_request(2, 8, 1000)
    got, ref, failed = peers.setup_peers({"bert_config": '{"hidden_size": 8}'}, feeds, ".")
    assert peers.COMPILED_PEER in failed and peers.COMPILED_PEER not in got
    why = compiled_peer.missing_compiler()
    if why:  # no torch, or torch without inductor's triton
        assert "torch" in why or "triton" in why
        with pytest.raises(RuntimeError, match=why.split("(")[0].strip()):
            compiled_peer.compiled_graph_call(lambda: pytest.fail("made before the check"))
    else:  # a CPU torch with triton: the peers refuse earlier, on CUDA
        assert "CUDA" in failed[peers.COMPILED_PEER]


def test_the_row_note_gives_the_mode_and_the_compile_time():
    text = compiled_peer.compile_note(84.24, 1)
    assert "mode=max-autotune-no-cudagraphs" in text and "compiled in 84.2 s, 1 dynamo graph)" \
        in text and text.endswith("its kernels in one CUDA graph")
    assert "2 dynamo graphs" in compiled_peer.compile_note(3.0, 2)
    assert "(compiled in 3.0 s)" in compiled_peer.compile_note(3.0, None)
    frozen = compiled_peer.compile_note(3.0, 1, "default", {"freezing": True})
    assert "mode=default, inductor freezing=True (compiled" in frozen
    assert np.isnan(peers.best_peer([Result(W, peers.COMPILED_PEER)], W))


def test_the_row_is_the_fastest_set_up_and_its_note_gives_every_one(monkeypatch):
    """best_compiled_call keeps the set-up whose replays time fastest (alternating rounds) and
    names the others' p50 and failures; every set-up failing is an error with the reason."""
    import time

    def made(mode: str = "", inductor: dict | None = None, pause: float = 0.0):
        def call() -> None:
            time.sleep(pause)
        return call, lambda: {"mode": mode, **(inductor or {})}, f"mode={mode}"

    pauses = {"slow": 0.003, "fast": 0.0}

    def fake_compile(make, mode, inductor):  # the set-up's own model, timed for real below
        make()
        if mode == "broken":
            raise RuntimeError("inductor: no kernel\nsecond line")
        return made(mode, inductor, pauses[mode])

    monkeypatch.setattr(compiled_peer, "missing_compiler", lambda: "")
    monkeypatch.setattr(compiled_peer, "compiled_graph_call", fake_compile)
    built: list[int] = []
    setups = (("a", "slow", {}), ("b", "fast", {"freezing": True}), ("c", "broken", {}))
    call, outputs, note = compiled_peer.best_compiled_call(lambda: built.append(1), setups,
                                                           iters=10)
    assert len(built) == 3  # each set-up compiles its own model
    assert outputs() == {"mode": "fast", "freezing": True}
    assert note.startswith("mode=fast; fastest of 3 set-ups (b): a ")
    assert "c failed (inductor: no kernel)" in note and "second line" not in note
    with pytest.raises(RuntimeError, match="failed in every set-up: inductor: no kernel"):
        compiled_peer.best_compiled_call(lambda: None, (("c", "broken", {}),))
    only = compiled_peer.best_compiled_call(lambda: None, (("b", "fast", {}),))
    assert only[2] == "mode=fast"  # one set-up: nothing to choose between, nothing timed
    left = compiled_peer.best_compiled_call(lambda: None, setups[1:], iters=4)[2]
    assert left.startswith("mode=fast; fastest of 2 set-ups (b): b ") and " us, c failed (" in left
