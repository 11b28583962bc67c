"""Hostile input, every command and the runtime API: a clear refusal, never damage.

Each CLI case (tests/hostile_cases.py) runs `bertfuse.cli.main` in-process in a private
workspace (the current directory) with a private TMPDIR, and asserts: the exit code; exactly one
stderr line holding the case's needle (exit 2/3), none on success; no traceback; no file left
behind in the workspace or the temp dir; and every file that was there byte-identical after
(symlinks, fifos and directories included). Real processes cover what capsys cannot see: TF/ORT
C++ logs on fd 2, and SIGTERM/SIGHUP/SIGINT at the export, check and write stages. Inputs come
from conftest's session fixtures (one tiny checkpoint, converted once).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bertfuse.cli import main
from bertfuse.errors import BertfuseError
from bertfuse.runtime.pool import NestedCallError, SessionPool
from bertfuse.runtime.requests import ConfigError, RequestError
from bertfuse.runtime.session import ClosedError, Session
from hostile_cases import (ALL_CASES, BAD_FILES, CONSTRUCTORS, DROP, IDS, LIBRARY, MASK,
                           POOL_REPLICAS, REQUESTS, SEGS, WARMUPS, Case)

# onnxruntime (native code) may leave its 51-byte session id file `.ses` in TMPDIR; not ours.
ORT_TMP_FILES = {".ses"}


# ------------------------------------------------------------------------------ library


def _tamper(src: Path, dst: Path, name: str, value: float) -> None:
    model = onnx.load(str(src))
    for t in model.graph.initializer:
        if t.name == name:
            arr = numpy_helper.to_array(t).copy()
            arr[...] = value
            t.CopyFrom(numpy_helper.from_array(arr, name))
            break
    else:
        raise AssertionError(f"no initializer {name}")
    onnx.save(model, str(dst))


def _tamper_graph(src: Path, dst: Path, how: str, arg) -> None:
    """A structurally damaged copy: 'external' (the word table's bytes said to live at `arg`),
    'dims' (its dims no longer match its bytes), 'cycle' (a node reads a later node's output),
    'dup_output' (two nodes write one name)."""
    model = onnx.load(str(src))
    g = model.graph
    table = next(t for t in g.initializer if t.name == "embeddings_word")
    if how == "external":
        table.ClearField("raw_data")
        table.data_location = TensorProto.EXTERNAL
        table.external_data.add(key="location", value=arg)
    elif how == "dims":
        table.dims[:] = arg
    elif how == "cycle":
        g.node[1].input[0] = g.node[5].output[0]
    elif how == "dup_output":
        g.node[2].output[0] = g.node[4].output[0]
    onnx.save(model, str(dst))


def _toy_model(path: Path) -> None:
    """A valid ONNX model that is no BERT: Gather + Relu, output 'y'."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "input_ids"], ["g"]),
         helper.make_node("Relu", ["g"], ["y"])], "toy",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(np.random.default_rng(2).random((50, 8), np.float32), "emb")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.fixture(scope="session")
def hostile_lib(tmp_path_factory, ckpt_erf, frozen_pb, savedmodel_dir, convert_cached
                ) -> dict[str, Path]:
    """Every library input of the case table, made once (the conversion shared with other
    modules through convert_cached)."""
    from bertfuse.inspect.summary import dumps, summarize
    from bertfuse.modelio import load_model, save_model
    from bertfuse.runtime.weights import strip_weights

    fused = convert_cached(ckpt_erf)
    raw = convert_cached(ckpt_erf, "--no-fuse", "--no-verify")
    assert fused.exit_code == 0 and raw.exit_code == 0
    lib = tmp_path_factory.mktemp("hostile_lib")
    p = {name: lib / file for name, file in LIBRARY.items()}
    shutil.copytree(ckpt_erf.path, p["ckpt"])
    shutil.copy(fused.onnx_path, p["fused"])
    shutil.copy(raw.onnx_path, p["raw"])
    shutil.copy(frozen_pb.path, p["frozen"])
    shutil.copytree(savedmodel_dir.path, p["savedmodel"])
    p["summary"].write_text(dumps(summarize(str(p["fused"]))))
    model = load_model(str(p["fused"]))
    strip_weights(model)
    save_model(model, p["skel"])
    _tamper(p["fused"], p["nan"], "embeddings_word", np.nan)
    _tamper(p["fused"], p["inf"], "w/bert/pooler/dense/bias", np.inf)
    _toy_model(p["toy"])
    LIB_DIGEST.update(digest(lib))
    return p


LIB_DIGEST: dict[str, str] = {}  # the library as made, checked by the module's last test


# ---------------------------------------------------------------------------- workspace


def digest(root: Path) -> dict[str, str]:
    """Relative path -> content hash and mode (files), link target, or kind: every entry."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            full = Path(dirpath) / name
            st = os.lstat(full)
            rel = str(full.relative_to(root))
            if stat.S_ISREG(st.st_mode):
                out[rel] = f"{oct(st.st_mode)} {hashlib.sha256(full.read_bytes()).hexdigest()}"
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = "-> " + os.readlink(full)
            else:
                out[rel] = oct(stat.S_IFMT(st.st_mode))
    return out


class Workspace:
    """A case's private directory; library inputs are copied in on first mention."""

    def __init__(self, root: Path, lib: dict[str, Path]) -> None:
        self.root, self.lib = root, lib

    def fmt(self, token: str) -> str:
        return re.sub(r"\{([^{}]+)\}", lambda m: str(self.path(m.group(1))), token)

    def path(self, name: str) -> Path:
        if name == "w":
            return self.root
        if name == "out":
            return self.root / "out.onnx"
        if name in LIBRARY:
            dst = self.root / LIBRARY[name]
            if not os.path.lexists(dst):
                src = self.lib[name]
                (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
            return dst
        return self.root / name

    def resolve(self, name: str) -> Path:
        return Path(self.fmt(name)) if "{" in name else self.root / name

    def setup(self, steps: tuple[tuple, ...]) -> None:
        for op, name, *args in steps:
            path = self.resolve(name)
            if op == "file":
                data = args[0].encode() if isinstance(args[0], str) else args[0]
                path.write_bytes(data)
            elif op == "mkdir":
                path.mkdir()
            elif op == "fifo":
                os.mkfifo(path)
            elif op == "rm":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            elif op == "link":
                path.symlink_to(self.fmt(args[0]))
            elif op == "hard":
                os.link(self.fmt(args[0]), path)
            elif op == "trunc":
                path.write_bytes(Path(self.fmt(args[0])).read_bytes()[:args[1]])
            elif op == "copy":
                src = Path(self.fmt(args[0]))
                (shutil.copytree if src.is_dir() else shutil.copy)(src, path)
            elif op == "cfg":
                self._config(path, args[0])
            elif op == "meta":
                src, key, value = args
                model = onnx.load(self.fmt(src))
                props = [p for p in model.metadata_props if p.key != key]
                del model.metadata_props[:]
                model.metadata_props.extend(props)
                if value is not None:
                    model.metadata_props.add(key=key, value=value)
                onnx.save(model, str(path))
            elif op == "tamper":
                _tamper_graph(Path(self.fmt(args[0])), path, args[1], args[2])
            else:
                raise AssertionError(f"unknown set-up step {op}")

    def _config(self, path: Path, edit) -> None:
        if not isinstance(edit, dict):
            path.write_bytes(edit.encode() if isinstance(edit, str) else edit)
            return
        cfg = json.loads((self.lib["ckpt"] / "bert_config.json").read_text())
        for key, value in edit.items():
            if value is DROP:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        path.write_text(json.dumps(cfg))


@pytest.fixture
def ws(tmp_path, hostile_lib, monkeypatch) -> Workspace:
    root = tmp_path / "w"
    root.mkdir()
    monkeypatch.chdir(root)  # a relative or empty -o lands here, never in the repository
    return Workspace(root, hostile_lib)


@pytest.fixture
def private_tmp(tmp_path, hostile_lib, monkeypatch) -> Path:
    """TMPDIR for the case alone (env and tempfile's cache), outside the workspace."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def assert_clean_outcome(rc: int, out: str, err: str, code: int, needle: str | None) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err + out, err
    assert rc == code, f"exit {rc}, expected {code}; stderr:\n{err}"
    if code == 0:
        assert lines == [], err
    elif code == 1:  # parity/policy: the report says why; convert adds one stderr line
        assert len(lines) <= 1, err
        if needle:
            assert needle in err + out, (needle, err, out[-2000:])
    else:
        assert len(lines) == 1, f"expected one stderr line, got:\n{err}"
        if needle:
            assert needle in lines[0], (needle, lines[0])
    if code == 3:
        pytest.fail(f"internal error: {lines[0]}")


def assert_nothing_left(before: dict[str, str], after: dict[str, str], creates: set[str],
                        tmpdir: Path) -> None:
    changed = {k for k in before if after.get(k) != before[k]}
    assert not changed, f"changed or removed: {sorted(changed)}"
    added = {k for k in set(after) - set(before)
             if not any(k == c or k.startswith(c + os.sep) or c.startswith(k + os.sep)
                        for c in creates)}
    assert not added, f"left behind: {sorted(added)}"
    for c in creates:
        assert c in after, f"{c} was not written"
    left = {p.name for p in tmpdir.iterdir()} - ORT_TMP_FILES
    assert not left, f"left in TMPDIR: {sorted(left)}"


# ------------------------------------------------------------------------------ CLI table


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.name, marks=marks)


def _has_cuda() -> bool:
    from bertfuse.runtime.bench import _no_cuda

    return _no_cuda() is None


@pytest.mark.parametrize("case", [_param(c) for c in ALL_CASES])
def test_cli(case: Case, ws: Workspace, private_tmp: Path, capsys):
    if case.name == "bench-no-gpu" and _has_cuda():
        pytest.skip("a CUDA GPU is here")
    ws.setup(case.setup)
    argv = [ws.fmt(t) for t in case.argv]
    before = digest(ws.root)
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse or sys.exit escaping main(): not a clean refusal
        cap = capsys.readouterr()
        pytest.fail(f"main() raised SystemExit({exc.code}); stderr:\n{cap.err}")
    cap = capsys.readouterr()
    assert_clean_outcome(rc, cap.out, cap.err, case.code, case.needle)
    assert_nothing_left(before, digest(ws.root), set(case.creates), private_tmp)


def test_case_table_is_large_and_distinct():
    names = [c.name for c in ALL_CASES]
    assert len(names) == len(set(names))
    commands = {c.argv[0] for c in ALL_CASES}
    assert {"example", "convert", "optimize", "verify", "strip-weights", "inspect", "summarize",
            "diff", "draw", "bench"} <= commands
    assert len({repr((c.argv, c.setup)) for c in ALL_CASES}) == len(ALL_CASES)


# ------------------------------------------------------------- a fifo where a file belongs

FIFO_INPUTS = {
    "inspect": "inspect {p}",
    "summarize": "summarize {p}",
    "optimize": "optimize {p} -o {out}",
    "strip": "strip-weights {p} -o {out}",
    "diff": "diff {p} {fused}",
    "draw-before": "draw {fused} --before {p} -o {w}/d.dot",
    "verify": "verify {p} --against {ckpt}",
    "convert-config": "convert {ckpt} --config {p} -o {out}",
    "convert-source": "convert {p} -o {out}",
}


class _Unblocker(threading.Thread):
    """After `after` s, opens the fifo for writing and closes it, so a reader blocked on it
    sees end-of-file: a hang becomes a failed test instead of a stuck run."""

    def __init__(self, fifo: Path, after: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.fifo, self.after, self.stop, self.fired = fifo, after, threading.Event(), False

    def run(self) -> None:
        if self.stop.wait(self.after):
            return
        while not self.stop.is_set():
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
                self.fired = True
            except OSError:  # no reader (yet)
                pass
            time.sleep(0.05)


@pytest.mark.parametrize("argv", list(FIFO_INPUTS.values()), ids=list(FIFO_INPUTS))
def test_fifo_input_is_refused_not_waited_on(argv, ws, private_tmp, capsys):
    ws.setup((("fifo", "p"),))
    tokens = [ws.fmt(t) for t in argv.split(" ")]
    before = digest(ws.root)
    guard = _Unblocker(ws.root / "p")
    guard.start()
    try:
        rc = main(tokens)
    finally:
        guard.stop.set()
        guard.join()
    cap = capsys.readouterr()
    assert not guard.fired, "bertfuse blocked reading the fifo"
    assert_clean_outcome(rc, cap.out, cap.err, 2, str(ws.root / "p"))
    assert_nothing_left(before, digest(ws.root), set(), private_tmp)


# ------------------------------------------------------------ unreadable / unwritable paths

AS_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes through "
                                                        "chmod 000 (CI runs as root)")
PERMISSIONS = {
    "inspect-unreadable-model": ("inspect {fused}", "{fused}"),
    "optimize-unreadable-model": ("optimize {raw} -o {out}", "{raw}"),
    "convert-unreadable-config": ("convert {ckpt} --config {cfg.json} -o {out}", "{cfg.json}"),
    "convert-unreadable-shard": ("convert {ckpt} -o {out}", "{ckpt}/" +
                                 "bert_model.ckpt.data-00000-of-00001"),
    "strip-unwritable-dir": ("strip-weights {fused} -o {ro}/x.onnx", "{ro}"),
}


@AS_ROOT
@pytest.mark.parametrize("argv, locked", list(PERMISSIONS.values()), ids=list(PERMISSIONS))
def test_permission_denied_is_bad_input(argv, locked, ws, private_tmp, capsys):
    ws.setup((("cfg", "cfg.json", {}), ("mkdir", "ro")))
    tokens = [ws.fmt(t) for t in argv.split(" ")]
    target = Path(ws.fmt(locked))
    mode = target.stat().st_mode
    target.chmod(0o500 if target.is_dir() else 0)
    try:
        before = digest(ws.root)
        rc = main(tokens)
        cap = capsys.readouterr()
        assert_clean_outcome(rc, cap.out, cap.err, 2, None)
        assert_nothing_left(before, digest(ws.root), set(), private_tmp)
    finally:
        target.chmod(mode)


# --------------------------------------------------------------------- real processes

def _proc_env(tmpdir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return {**env, "TMPDIR": str(tmpdir), **extra}


# TF and ORT log from C++ straight to fd 2: one stderr line must hold there too.
PROCESS_CASES = {
    "convert-config-mismatch": ("convert {ckpt} --config {cfg.json} -o {out}",
                                (("cfg", "cfg.json", {"num_hidden_layers": 3}),), "layer_2"),
    "optimize-skeleton": ("optimize {skel} -o {out}", (), "ONNX Runtime cannot load"),
    "diff-numeric-skeleton": ("diff {skel} {fused} --numeric", (), "skel.onnx"),
}


@pytest.mark.parametrize("argv, setup, needle", list(PROCESS_CASES.values()),
                         ids=list(PROCESS_CASES))
def test_real_process_one_stderr_line(argv, setup, needle, ws, private_tmp):
    ws.setup(setup)
    tokens = [ws.fmt(t) for t in argv.split(" ")]
    before = digest(ws.root)
    proc = subprocess.run([sys.executable, "-m", "bertfuse.cli", *tokens], capture_output=True,
                          text=True, timeout=300, cwd=ws.root, env=_proc_env(private_tmp))
    assert_clean_outcome(proc.returncode, proc.stdout, proc.stderr, 2, needle)
    assert proc.stdout == ""
    assert_nothing_left(before, digest(ws.root), set(), private_tmp)


# (command, stage it is paused at, signal): SIGTERM, SIGHUP and SIGINT at each of the export,
# check and write stages.
SIGNAL_ARGV = {
    "convert": "convert {ckpt} -o {out} --batch 2 --seq 8",
    "optimize": "optimize {raw} -o {out}",
    "optimize-in-place": "optimize {raw} --in-place",
    "strip": "strip-weights {fused} -o {out}",
}
SIGNAL_CASES = [
    ("convert", "tf2onnx export", signal.SIGTERM),
    ("convert", "tf2onnx export", signal.SIGHUP),
    ("convert", "tf2onnx export", signal.SIGINT),
    ("optimize", "check-tmp", signal.SIGTERM),
    ("optimize", "check-tmp", signal.SIGHUP),
    ("optimize-in-place", "check-tmp", signal.SIGINT),
    ("optimize", "save-tmp", signal.SIGTERM),
    ("optimize-in-place", "save-tmp", signal.SIGHUP),
    ("strip", "save-tmp", signal.SIGINT),
]
STAGE_TEMP = {"check-tmp": "bertfuse-check-", "save-tmp": "."}  # name prefix, TMPDIR / beside


@pytest.mark.parametrize("command, stage, signo", SIGNAL_CASES,
                         ids=[f"{c}-{s.split()[-1]}-{g.name}" for c, s, g in SIGNAL_CASES])
def test_signal_at_stage_leaves_nothing(command, stage, signo, ws, private_tmp, tmp_path):
    tokens = [ws.fmt(t) for t in SIGNAL_ARGV[command].split(" ")]
    flag = tmp_path / "paused"
    before = digest(ws.root)
    proc = subprocess.Popen([sys.executable, "-m", "bertfuse.cli", *tokens], cwd=ws.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_proc_env(private_tmp, BERTFUSE_TEST_PAUSE=f"{stage}:{flag}"))
    try:
        deadline = time.monotonic() + 240
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), f"never reached {stage!r}: {proc.communicate(timeout=60)}"
        if stage in STAGE_TEMP:  # the stage's temporary exists when the signal comes
            where = private_tmp if stage == "check-tmp" else ws.root
            assert any(p.name.startswith(STAGE_TEMP[stage]) for p in where.iterdir()), stage
        proc.send_signal(signo)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    word = "interrupted" if signo == signal.SIGINT else "terminated"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 128 + signo, err
    assert lines == [f"bertfuse: {word}"], err
    assert_nothing_left(before, digest(ws.root), set(), private_tmp)


# ------------------------------------------------------------------ runtime API (CPU EP)

SMALL = {"max_batch": 4, "max_seq": 16, "batch_buckets": (1, 2, 4), "seq_buckets": (8, 16),
         "device": "cpu"}


@pytest.fixture(scope="module")
def served(hostile_lib):
    """One CPU session and its answer to the valid request."""
    s = Session(str(hostile_lib["fused"]), **SMALL)
    good = s.run(IDS, MASK, SEGS)
    yield s, good
    s.close()


def _one_line_error(exc: BaseException, needle: str) -> None:
    text = str(exc)
    assert "\n" not in text and needle in text, text


@pytest.mark.parametrize("kwargs, needle", [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS])
def test_runtime_refuses_bad_request(kwargs, needle, served):
    session, good = served
    sent = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in kwargs.items()}
    with pytest.raises(RequestError) as info:
        session.run(**kwargs)
    assert isinstance(info.value, BertfuseError) and isinstance(info.value, ValueError)
    _one_line_error(info.value, needle)
    for k, v in kwargs.items():  # the caller's arrays are not rewritten
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, sent[k])
    again = session.run(IDS, MASK, SEGS)  # and the session serves on, unchanged
    for name, value in good.items():
        np.testing.assert_array_equal(again[name], value)


def _model_arg(kind: str | None, ws: Workspace):
    if kind is None:
        return str(ws.path("fused"))
    if kind in ("none", "bytes"):
        return None if kind == "none" else b"\x08\x01"
    if kind in ("skel", "raw"):
        return str(ws.path(kind))
    setup, token, _ = BAD_FILES[kind]
    ws.setup(setup)
    return ws.fmt(token)


@pytest.mark.parametrize("kind, kwargs, needle", [c[1:] for c in CONSTRUCTORS],
                         ids=[c[0] for c in CONSTRUCTORS])
def test_runtime_refuses_bad_constructor(kind, kwargs, needle, ws, private_tmp):
    model = _model_arg(kind, ws)
    before = digest(ws.root)
    with pytest.raises(BertfuseError) as info:
        Session(model, **{**SMALL, **kwargs})
    _one_line_error(info.value, needle)
    assert_nothing_left(before, digest(ws.root), set(), private_tmp)


@pytest.mark.parametrize("buckets, needle", [w[1:] for w in WARMUPS], ids=[w[0] for w in WARMUPS])
def test_runtime_refuses_bad_warmup(buckets, needle, hostile_lib):
    with Session(str(hostile_lib["fused"]), **SMALL) as s:
        with pytest.raises(ConfigError) as info:
            s.warmup(buckets)
        _one_line_error(info.value, needle)
        assert not s._buckets  # nothing was made for a refused list


@pytest.mark.parametrize("replicas", POOL_REPLICAS, ids=[repr(r) for r in POOL_REPLICAS])
def test_pool_refuses_bad_replicas(replicas):
    threads = threading.active_count()
    with pytest.raises(ConfigError, match="replicas must be"):
        SessionPool(lambda: pytest.fail("a replica was built"), replicas=replicas)
    assert threading.active_count() == threads


class _Boom(ValueError):
    pass


@pytest.mark.parametrize("where", ["make", "prepare"])
def test_pool_build_failure_is_raised_and_stops_workers(where, hostile_lib):
    def boom(*_):
        raise _Boom(f"{where} failed")

    make = boom if where == "make" else (lambda: Session(str(hostile_lib["fused"]), **SMALL))
    threads = threading.active_count()
    with pytest.raises(_Boom, match=f"{where} failed"):
        SessionPool(make, replicas=2, prepare=boom if where == "prepare" else None)
    deadline = time.monotonic() + 30
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == threads  # no worker left waiting


@pytest.mark.parametrize("nested", ["run", "call", "submit"])
def test_pool_nested_call_raises_instead_of_deadlock(nested, hostile_lib):
    with SessionPool(lambda: Session(str(hostile_lib["fused"]), **SMALL), replicas=1) as pool:
        inner = {"run": lambda s: pool.run(IDS, MASK, SEGS),
                 "call": lambda s: pool.call(lambda r: 1),
                 "submit": lambda s: pool.submit(lambda r: 1)}[nested]
        with pytest.raises(NestedCallError, match="SessionPool job called"):
            pool.submit(inner).result(timeout=60)
        assert set(pool.run(IDS, MASK, SEGS)) == {"sequence_output", "pooled_output"}


def test_pool_device_outputs_refused_and_closed_pool(hostile_lib):
    pool = SessionPool(lambda: Session(str(hostile_lib["fused"]), **SMALL), replicas=1)
    with pytest.raises(ValueError, match="pool.call"):
        pool.run(IDS, MASK, SEGS, to_host=False)
    replica = pool.replicas[0]
    pool.close()
    pool.close()
    assert replica._closed
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(IDS, MASK, SEGS)


@pytest.mark.parametrize("call", ["run", "warmup", "warmup_list", "replay_call"])
def test_closed_session_refuses_calls(call, hostile_lib):
    with Session(str(hostile_lib["fused"]), **SMALL) as s:
        s.run(IDS, MASK, SEGS)
    s.close()  # idempotent after the with block closed it
    fn = {"run": lambda: s.run(IDS, MASK, SEGS), "warmup": lambda: s.warmup(),
          "warmup_list": lambda: s.warmup([(1, 8)]), "replay_call": lambda: s.replay_call(MASK)}
    with pytest.raises(ClosedError, match="closed"):
        fn[call]()


# ---------------------------------------------------------------------------- last

def test_library_inputs_untouched(hostile_lib):
    """The session's shared inputs are byte-identical after every case above."""
    assert LIB_DIGEST and digest(hostile_lib["ckpt"].parent) == LIB_DIGEST
