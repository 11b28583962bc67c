"""Files from someone else cost bounded memory and time: every kind the user hands bertfuse
besides ONNX models and TensorFlow graphs (--load-inputs .npz/.json, vocab.txt,
tokenizer.json, bert_config.json) is refused in one line naming the file and the limit,
exit 2, before anything large is read or allocated.

Each case runs the real CLI in a child process and measures it: its own peak RSS (VmHWM,
written by the child as it exits: tests/support/peak_rss.py) and its wall time. The bombs are
small on disk (sparse files, a zip member of ~3 MB declaring 3 GiB, an edited .npy header), and the child runs
under RLIMIT_DATA, so code that would grow to gigabytes fails there with MemoryError
("out of memory ... --batch/--seq") instead of eating the machine; the asserted line and the
bounds are what fail on such code. The limits are io/limits.py's.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import bertfuse
from bertfuse.errors import BertfuseError
from bertfuse.io import limits
from support import peak_rss

GiB = 1 << 30
SRC = Path(bertfuse.__file__).resolve().parents[1]  # the tree under test, for the child
DATA_LIMIT = 1 * GiB  # RLIMIT_DATA of a child that imports no TensorFlow
TF_DATA_LIMIT = 3 * GiB // 2  # ... and of one that does (TensorFlow's own ~0.6 GB in it)
MAX_RSS_MB = 1536  # the bound each refusal must stay under
MAX_SECONDS = 60  # the same for wall time (the interpreter, TensorFlow's import included)
SPECIALS = "[PAD]\n" + "".join(f"[unused{i}]\n" for i in range(99)) + \
    "[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n"


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    rss_mb: float
    seconds: float

    def line(self) -> str:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in self.stderr, self.stderr[-2000:]
        return lines[0]


def run_cli(args: list, cwd: Path, data_limit: int = DATA_LIMIT, timeout: float = 180) -> Run:
    """`python -m bertfuse ARGS` in a child capped at `data_limit` bytes of data; its own
    peak RSS (VmHWM, tests/support/peak_rss.py)."""
    return run_python(["-m", "bertfuse", *map(str, args)], cwd, data_limit, timeout)


def run_python(args: list, cwd: Path, data_limit: int = DATA_LIMIT, timeout: float = 180
               ) -> Run:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", peak_rss.ENV: str(cwd / ".peak")}
    out, err = cwd / ".stdout", cwd / ".stderr"
    start = time.monotonic()
    with open(out, "wb") as fo, open(err, "wb") as fe:
        child = subprocess.Popen([sys.executable, *peak_rss.wrapped(args)], cwd=cwd,
                                 stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=env,
                                 preexec_fn=cap)
    timer = threading.Timer(timeout, child.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(child.pid, 0)
    finally:
        timer.cancel()
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - start
    run = Run(child.returncode, out.read_text(errors="replace"), err.read_text(errors="replace"),
              (peak_rss.peak_kb(cwd / ".peak") or usage.ru_maxrss) / 1024, seconds)
    for p in (out, err, cwd / ".peak"):
        p.unlink(missing_ok=True)
    return run


def assert_refused(run: Run, *needles: str) -> str:
    """Exit 2, one line holding every needle, within the memory and time bounds."""
    assert run.code == 2, (run.code, run.stderr[-2000:])
    line = run.line()
    for needle in needles:
        assert needle in line, (needle, line)
    assert "--batch" not in line and "out of memory" not in line, line
    assert run.rss_mb < MAX_RSS_MB, f"peak RSS {run.rss_mb:.0f} MB: {line}"
    assert run.seconds < MAX_SECONDS, f"{run.seconds:.1f} s: {line}"
    return line


# ---------------------------------------------------------------------- bombs, small on disk


def sparse(path: Path, size: int, head: bytes = b"") -> Path:
    """A file of `size` bytes that takes a page on disk: `head`, then a hole (NULs)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def npy_header(shape: tuple, dtype: str = "<i4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def deflated_zeros_member(path: Path, name: str, head: bytes, zeros: int) -> Path:
    """A zip with one deflated member: `head` then `zeros` NUL bytes, written without
    compressing them (one 16 MiB block of deflated zeros, repeated: each ends in a full flush,
    so the blocks are alike), its directory declaring the true size and CRC. Under 4 GiB, so
    no zip64."""
    chunk = 1 << 24
    assert zeros % chunk == 0 and len(head) + zeros < 0xFFFFFFFF
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = comp.compress(head) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(bytes(chunk)) + comp.flush(zlib.Z_FULL_FLUSH)
    last = comp.flush()
    crc = zlib.crc32(head)
    zero = bytes(chunk)
    for _ in range(zeros // chunk):
        crc = zlib.crc32(zero, crc)
    n = zeros // chunk
    size, csize, fname = len(head) + zeros, len(first) + n * len(block) + len(last), name.encode()
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, csize, size,
                        len(fname), 0) + fname
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc, csize,
                          size, len(fname), 0, 0, 0, 0, 0, 0) + fname
    with open(path, "wb") as f:
        f.write(local)
        f.write(first)
        for _ in range(n):
            f.write(block)
        f.write(last)
        where = f.tell()
        f.write(central)
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), where, 0))
    return path


def test_zip_bomb_is_built_right(tmp_path):
    """The bomb builder's stream is a real deflated member (checked at a small size)."""
    bomb = deflated_zeros_member(tmp_path / "small.npz", "input_ids.npy",
                                 npy_header((2, 1 << 23)), 4 << 24)
    with np.load(bomb, allow_pickle=False) as z:
        a = z["input_ids"]
    assert a.shape == (2, 1 << 23) and not a.any()


# ------------------------------------------------------------------------ --load-inputs


def _verify(path: Path) -> list:
    """verify reads --load-inputs/--load-outputs before the model or TensorFlow."""
    return ["verify", "model.onnx", "--load-inputs", path, "--load-outputs", path]


def test_npz_zip_bomb_refused_from_its_directory(tmp_path):
    """3 MB on disk, 3 GiB once inflated: the zip directory's declared size is refused
    before a byte is decompressed (NumPy would allocate it all, then inflate into it)."""
    shape = (3 << 13, 1 << 15)  # 3 GiB of int32
    bomb = deflated_zeros_member(tmp_path / "bomb.npz", "input_ids.npy", npy_header(shape),
                                 3 * GiB)
    assert bomb.stat().st_size < 4 << 20
    assert_refused(run_cli(_verify(bomb), tmp_path), "--load-inputs", "bomb.npz", "3.0 GiB",
                   "over the 1.0 GiB limit")


def test_npy_header_declaring_2_40_ids_names_its_shape(tmp_path):
    """A member of 200 bytes whose .npy header declares [2^20, 2^20] int32 (4 TiB): refused
    from the header, naming the array, its shape and the limit (not an out-of-memory hint
    about --batch/--seq)."""
    bomb = tmp_path / "ids.npz"
    with zipfile.ZipFile(bomb, "w") as zf:
        zf.writestr("input_ids.npy", npy_header((1 << 20, 1 << 20)) + bytes(64))
    assert_refused(run_cli(_verify(bomb), tmp_path), "ids.npz", "'input_ids'",
                   "[1048576, 1048576]", "over the 1.0 GiB limit")


def test_npz_limit_sums_its_members(tmp_path):
    """Two members each under the limit, over it together: refused from their headers."""
    bomb = tmp_path / "two.npz"
    half = (limits.MAX_ARRAYS_BYTES // 2 // 4 // 1024 + 1, 1024)
    with zipfile.ZipFile(bomb, "w") as zf:
        for name in ("input_ids", "input_mask"):
            zf.writestr(f"{name}.npy", npy_header(half))
    assert_refused(run_cli(_verify(bomb), tmp_path), "two.npz", "over the 1.0 GiB limit")


def test_npz_directory_of_70000_members_refused_from_its_end_record(tmp_path):
    """zipfile would make a ZipInfo of every directory entry (a 1 GB directory: 20 million,
    gigabytes, minutes) before the members could be counted: the zip64 end record's count
    is refused first."""
    bomb = tmp_path / "many.npz"
    with zipfile.ZipFile(bomb, "w") as zf:
        for i in range(70_000):
            zf.writestr(f"{i}.npy", b"")
    assert_refused(run_cli(_verify(bomb), tmp_path), "many.npz", "70,000 members",
                   "over the limit of 1,024 arrays")


def test_json_nested_100000_deep_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert_refused(run_cli(_verify(deep), tmp_path), "--load-inputs", "deep.json",
                   "nested too deeply", f"{limits.MAX_JSON_DEPTH}")


def test_json_inputs_size_checked_from_stat(tmp_path):
    big = sparse(tmp_path / "big.json", 2 * GiB, b'{"input_ids": [[')
    assert_refused(run_cli(_verify(big), tmp_path), "big.json",
                   "2.0 GiB, over the 32.0 MiB limit")


# ------------------------------------------------------------- vocab.txt and tokenizer.json


def _vocab_files(d: Path) -> dict[str, tuple[Path, str]]:
    """kind -> (the file, a needle of its refusal)."""
    d.mkdir()
    tok_dir = d / "nul_tokenizer"
    tok_dir.mkdir()
    deep_dir = d / "deep_tokenizer"
    deep_dir.mkdir()
    (deep_dir / "tokenizer.json").write_text('{"model": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (d / "nul.txt").write_bytes((SPECIALS + "bad\0token\n").encode())
    (d / "long.txt").write_text(SPECIALS + "x" * 100_000 + "\n")
    return {
        "sparse-2GB": (sparse(d / "vocab.txt", 2 * GiB, SPECIALS.encode()),
                       "over the 64.0 MiB limit"),
        "nul-byte": (d / "nul.txt", "NUL byte"),
        "long-line": (d / "long.txt", f"longer than {limits.MAX_VOCAB_LINE} bytes"),
        "tokenizer-json-2GB-of-NULs": (sparse(tok_dir / "tokenizer.json", 2 * GiB),
                                       "over the 32.0 MiB limit"),
        "tokenizer-json-deep": (deep_dir / "tokenizer.json", "nested too deeply"),
    }


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    return _vocab_files(tmp_path_factory.mktemp("vocabs") / "v")


@pytest.mark.parametrize("kind", ["sparse-2GB", "nul-byte", "long-line",
                                  "tokenizer-json-2GB-of-NULs", "tokenizer-json-deep"])
def test_vocab_refused_in_bounded_memory(vocab_files, kind, tmp_path):
    path, needle = vocab_files[kind]
    run = run_cli(["tokenize", "--vocab", path, "hello world"], tmp_path)
    assert_refused(run, str(path), needle)


def test_verify_text_file_and_its_vocab_bounded_before_the_model(vocab_files, tmp_path):
    """verify --text-file reads the text and its --vocab before the model or TensorFlow."""
    text = tmp_path / "t.txt"
    text.write_text("what is bert?\n")
    big_text = sparse(tmp_path / "big.txt", 2 * GiB, b"hello ")
    vocab, needle = vocab_files["sparse-2GB"]
    for args, name in ((["--text-file", big_text, "--vocab", vocab_files["nul-byte"][0]],
                        "big.txt"), (["--text-file", text, "--vocab", vocab], str(vocab))):
        run = run_cli(["verify", "model.onnx", "--against", "ckpt", *args], tmp_path)
        assert_refused(run, name, "over the 64.0 MiB limit")


def test_vocab_token_count_bounded_for_serve_and_score(tmp_path):
    """serve --vocab and score's vocab go through WordPiece (serve/config.py, score/spec.py),
    as tokenize and verify --text-file do: one reader, so one bound. Over the token limit
    with lines of two bytes is refused before any tokenizer is built."""
    from bertfuse.text import WordPiece

    many = tmp_path / "vocab.txt"
    with open(many, "w") as f:
        f.write(SPECIALS)
        f.write("a\n" * limits.MAX_VOCAB_TOKENS)
    start = time.monotonic()
    with pytest.raises(BertfuseError, match="over 1,048,576 lines"):
        WordPiece(many)
    assert time.monotonic() - start < 20


# serve's config check, run before Ray starts (no Ray here), with the one-line error the CLI
# would print.
SERVE_CHECK = """
import sys
from bertfuse.errors import BertfuseError
from bertfuse.serve.config import check_config
try:
    check_config(sys.argv[1], vocab=sys.argv[2])
except BertfuseError as exc:
    print(f"bertfuse: error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
"""


def test_serve_vocab_refused_by_the_same_reader(vocab_files, ckpt_erf, convert_cached,
                                                 tmp_path):
    """serve --vocab is read through WordPiece at the config check (before Ray starts): the
    sparse 2 GB vocab.txt is refused from its size, at once."""
    model = convert_cached(ckpt_erf).onnx_path
    path, needle = vocab_files["sparse-2GB"]
    assert_refused(run_python(["-c", SERVE_CHECK, model, path], tmp_path), str(path), needle)


# ---------------------------------------------------------------------- bert_config.json


@pytest.fixture(scope="module")
def big_config_ckpt(ckpt_erf, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("big_config") / "ckpt"
    shutil.copytree(ckpt_erf.path, d)
    cfg = json.loads((d / "bert_config.json").read_text())
    (d / "bert_config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1_000_000}))
    return d


def test_config_with_a_million_layers_refused_before_building(big_config_ckpt, tmp_path):
    """Checked against its bound before any shape is derived from it (was 8.5 GB, 187 s)."""
    run = run_cli(["convert", big_config_ckpt, "-o", tmp_path / "m.onnx"], tmp_path,
                  data_limit=TF_DATA_LIMIT)
    assert_refused(run, "bert_config.json", "num_hidden_layers 1000000",
                   "over the limit of 1,024")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("edit, needle", [
    ({"num_hidden_layers": 1_000_000}, "num_hidden_layers 1000000"),
    ({"vocab_size": 1e300}, "vocab_size"),
    ({"max_position_embeddings": 1 << 40}, "max_position_embeddings"),
    ({"hidden_size": True}, "hidden_size"),
    ({"embedding_size": 1 << 30}, "embedding_size"),
])
def test_config_values_bounded(tmp_path, edit, needle):
    """The bounds, at the reader (no TensorFlow): every size a positive integer under its
    limit, embedding_size (ALBERT, ELECTRA) included."""
    from bertfuse.converter.ckpt_layout import Layout, read_config

    cfg = {"vocab_size": 1000, "hidden_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 2, "intermediate_size": 512, **edit}
    path = tmp_path / "albert_config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(BertfuseError, match=needle) as err:
        read_config(str(path), Layout("albert", "bert", False))
    assert str(path) in str(err.value)


def test_config_file_size_and_depth_bounded(tmp_path):
    from bertfuse.converter.config import BertConfig

    big = sparse(tmp_path / "bert_config.json", 2 * GiB, b'{"vocab_size": 10')
    with pytest.raises(BertfuseError, match="over the 1.0 MiB limit"):
        BertConfig.from_json(big)
    deep = tmp_path / "deep.json"
    deep.write_text('{"vocab_size": ' + "[" * 100 + "]" * 100 + "}")
    with pytest.raises(BertfuseError, match="nested too deeply"):
        BertConfig.from_json(deep)
