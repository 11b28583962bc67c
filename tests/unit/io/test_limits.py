"""io/limits.py: the chunked JSON depth scan agrees with json.loads's own nesting whatever
the chunk size (strings, escapes and brackets split across chunk ends), and the line reader
bounds what it is told to."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertfuse.errors import BertfuseError
from bertfuse.io import limits


def _nesting(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_nesting, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_nesting, value.values()), default=0)
    return 0


def _random_json(rng: np.random.Generator, depth: int = 0):
    kind = rng.integers(0, 5 if depth < 12 else 2)
    if kind == 0:  # strings full of what the scan must not count: brackets, quotes, escapes
        return "".join(rng.choice(list('[]{}"\\ab'), size=int(rng.integers(0, 8))))
    if kind == 1:
        return int(rng.integers(-5, 5))
    if kind == 2:
        return [_random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    return {"k" + "\\" * int(rng.integers(0, 3)) + str(i): _random_json(rng, depth + 1)
            for i in range(int(rng.integers(0, 4)))}


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_depth_scan_matches_the_parsed_nesting(monkeypatch, chunk):
    monkeypatch.setattr(limits, "_DEPTH_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    for _ in range(200):
        value = _random_json(rng)
        text = json.dumps(value, ensure_ascii=False)
        assert limits.json_depth(text.encode()) == _nesting(value), text


def test_deep_json_refused_before_parsing(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": "[[[[", "b": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(BertfuseError, match="nested too deeply"):
        limits.read_json(deep, limits.MAX_CONFIG_BYTES, "a config")
    ok = tmp_path / "ok.json"
    ok.write_text('{"a": "' + "[" * 1000 + '"}')  # brackets inside a string do not nest
    assert limits.read_json(ok, limits.MAX_CONFIG_BYTES, "a config") == {"a": "[" * 1000}


@pytest.mark.parametrize("block", [1, 2, 3, 5, 1 << 20])
def test_text_lines_across_blocks(tmp_path, monkeypatch, block):
    """Lines, line numbers and multi-byte characters come out the same whatever the block."""
    monkeypatch.setattr(limits, "_LINES_BLOCK", block)
    f = tmp_path / "v.txt"
    text = "[PAD]\r\n##é\n\nüber\nlast\r"
    f.write_bytes(text.encode())
    assert list(limits.text_lines(f, 100, "a vocab", 10, 10)) == \
        ["[PAD]", "##é", "", "über", "last"]
    f.write_bytes("a\nbé\nc\x00d\n".encode())
    with pytest.raises(BertfuseError, match="NUL byte on line 3"):
        list(limits.text_lines(f, 100, "a vocab", 10, 10))
    f.write_bytes(b"a\nb\nc\xffd\n")
    with pytest.raises(BertfuseError, match=r"line 3, byte 1\)"):
        list(limits.text_lines(f, 100, "a vocab", 10, 10))
    f.write_bytes(b"a\nb\n" + b"x" * 50)
    with pytest.raises(BertfuseError, match="line 3 is longer than 10 bytes"):
        list(limits.text_lines(f, 100, "a vocab", 10, 10))


def test_text_lines_bounds(tmp_path):
    f = tmp_path / "v.txt"
    f.write_bytes(b"a\r\nbb\n\nccc")
    assert list(limits.text_lines(f, 100, "a vocab", 3, 4)) == ["a", "bb", "", "ccc"]
    with pytest.raises(BertfuseError, match="over 3 lines"):
        list(limits.text_lines(f, 100, "a vocab", 3, 3))
    with pytest.raises(BertfuseError, match="line 4 is longer than 2 bytes"):
        list(limits.text_lines(f, 100, "a vocab", 2, 4))
    with pytest.raises(BertfuseError, match="over the 8 bytes limit"):
        list(limits.text_lines(f, 8, "a vocab", 3, 4))
    f.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(BertfuseError, match=r"not UTF-8 text \(line 2"):
        list(limits.text_lines(f, 100, "a vocab", 10, 10))
