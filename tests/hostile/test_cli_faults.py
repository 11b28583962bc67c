"""Faults around serve's and score's edges that need no Ray: `bertfuse tokenize` given bytes
that are not UTF-8 on its command line, and a score part written to a full file system (a
file-size limit stands in for the full disk: the same failed write(2), EFBIG instead of
ENOSPC). Each is one line naming what failed, exit 2, nothing half-written left."""

from __future__ import annotations

import os
import subprocess
import sys

from bertfuse.converter.example_vocab import example_vocab
from support.paths import ROOT

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_tokenize_non_utf8_arguments_exit_2_with_one_line(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in example_vocab(300)))
    for argv, words in (([b"ab\xff"], "text 1 is not UTF-8"),
                        ([b"ok", b"--pair", b"\xc3"], "--pair 1 is not UTF-8")):
        ran = subprocess.run([sys.executable, "-m", "bertfuse", "tokenize", "--vocab",
                              str(vocab), *argv], capture_output=True, env=ENV, timeout=60)
        err = ran.stderr.decode(errors="replace").strip()
        assert ran.returncode == 2 and len(err.splitlines()) == 1 and words in err, err


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
import pyarrow as pa
from bertfuse.errors import BertfuseError
from bertfuse.score.output import _write
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    _write(Path(sys.argv[1]), pa.table({"x": list(range(100_000))}))
except BertfuseError as exc:
    print(exc)
    sys.exit(2)
"""


def test_a_full_disk_names_the_file_and_leaves_no_temp(tmp_path):
    part = tmp_path / "scores" / "part-00000.parquet"
    part.parent.mkdir()
    ran = subprocess.run([sys.executable, "-c", FULL_DISK, str(part)], capture_output=True,
                         text=True, env=ENV, timeout=60)
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert ran.stdout.startswith(f"{part}: cannot write it (") and "resume" in ran.stdout
    assert list(part.parent.iterdir()) == []  # neither the part nor its temp file
